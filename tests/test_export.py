"""`specfleet export`: one row per run with every parameter and metric as a column, through a
running coordinator and, with --stopped --data-dir, from a stopped one's file."""

import pandas as pd

from agent.api import AdminApi, AgentApi, channel
from coordinator.server import admin_credential
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.fleet import LINUX_BOX, SWEEP_YAML, make_run
from tests.processes import cli, start_coordinator, stop


def report_runs(address, data) -> list[pb.Run]:
    admin = AdminApi(channel(address), admin_credential(data))
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    resp = AgentApi(channel(address)).enrol(token, "exporter", LINUX_BOX, {}, ["mlx"])
    agent = AgentApi(channel(address), resp.credential)
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    job = agent.acquire_job(1).job
    runs = [
        make_run(
            job.job_id,
            method,
            depth,
            tps=tps,
            repeat=repeat,
            metrics={"acceptance_rate": 0.5 + depth / 10, "latency_p50_seconds": 0.004},
            params={"sampler.temperature": "0.0", "model.target": "/models/target"},
        )
        for repeat in range(2)
        for method, depth, tps in (("baseline", 0, 100.0 + repeat), ("draft", 2, 130.0 + repeat))
    ]
    runs[0].metrics.pop("acceptance_rate")  # a metric only some runs have: empty for the others
    for run in runs:
        agent.report_result(job.job_id, job.lease_id, run)
    agent.report_result(job.job_id, job.lease_id, runs[1])  # a retry must not become a second row
    agent.complete_job(job.job_id, job.lease_id, len(runs))
    return runs


def check(df: pd.DataFrame, runs: list[pb.Run]) -> None:
    assert len(df) == len(runs) and df["run_id"].is_unique
    assert set(df["run_id"]) == {r.run_id for r in runs}
    for column in (
        "engine",
        "method",
        "depth",
        "chip",
        "decode_tokens_per_second",
        "ttft_seconds",
        "peak_memory_bytes",
        "metric.acceptance_rate",
        "metric.latency_p50_seconds",
        "param.sampler.temperature",
        "param.model.target",
    ):
        assert column in df.columns, (column, list(df.columns))
    by_id = df.set_index("run_id")
    for run in runs:
        row = by_id.loc[run.run_id]
        assert (row["method"], row["depth"]) == (run.method, run.depth)
        assert row["decode_tokens_per_second"] == run.decode_tokens_per_second
        assert row["metric.latency_p50_seconds"] == 0.004
        assert row["param.model.target"] == "/models/target"
    assert by_id["metric.acceptance_rate"].isna().sum() == 1


def test_export_running_then_stopped(tmp_path):
    data = tmp_path / "coordinator"
    proc, endpoints = start_coordinator(data)
    address = endpoints["grpc"]
    admin = ["--coordinator", address, "--data-dir", str(data)]
    try:
        empty = cli("export", "--format", "csv", "--output", str(tmp_path / "none.csv"), *admin, check=False)
        assert empty.returncode != 0 and "holds no runs yet" in empty.stderr
        runs = report_runs(address, data)
        out = cli("export", "--format", "csv", "--output", str(tmp_path / "live.csv"), *admin).stdout
        assert out.strip() == f"wrote {len(runs)} runs to {tmp_path / 'live.csv'}"
        check(pd.read_csv(tmp_path / "live.csv"), runs)
        stopped = ["export", "--stopped", "--data-dir", str(data), "--format", "csv"]
        locked = cli(*stopped, "--output", str(tmp_path / "x.csv"), check=False)
        assert locked.returncode != 0 and "is the coordinator still running?" in locked.stderr, locked.stderr
    finally:
        assert stop(proc) == 0

    for fmt in ("csv", "parquet"):
        output = tmp_path / f"stopped.{fmt}"
        cli("export", "--stopped", "--data-dir", str(data), "--format", fmt, "--output", str(output))
        df = pd.read_csv(output) if fmt == "csv" else pd.read_parquet(output)
        check(df, runs)
    missing = cli("export", "--stopped", "--data-dir", str(tmp_path / "nowhere"), "--output", "x.csv", check=False)
    assert missing.returncode != 0 and "no coordinator database" in missing.stderr

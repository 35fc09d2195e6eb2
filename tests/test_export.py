"""`specfleet export`: one row per run, one column per run-record field, through a running
coordinator and, with --stopped --data-dir, from a stopped one's file; and the round trip of a
record the real protocol measured: worker -> spool -> upload -> store -> export, equal field
by field."""

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from agent.engines import make_engine
from agent.model_identity import identify
from agent.models import HashCache, resolve
from agent.protocol import run_job
from agent.spool import Spool
from agent.spool import read as spool_read
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from specfleet.record import JobSpec, RunRecord
from tests.support.fleet import LINUX_BOX, SWEEP_YAML
from tests.support.processes import cli, start_coordinator, stop

pytestmark = [pytest.mark.process, pytest.mark.engine]


def measure_and_upload(address, data, tiny_models, tmp_path) -> list[RunRecord]:
    """Runs measured by the real protocol on the tiny MLX pair, spooled, then uploaded."""
    admin = AdminApi(channel(address), admin_credential(data))
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    resp = AgentApi(channel(address)).enrol(token, "exporter", LINUX_BOX, {}, ["mlx"])
    agent = AgentApi(channel(address), resp.credential)
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    job = agent.acquire_job(1).job
    paths = {"target": tiny_models.mlx_target, "draft": tiny_models.mlx_draft}
    spec = JobSpec.from_json(job.spec_json).with_models(**{role: str(p) for role, p in paths.items()})
    hashes = HashCache(tmp_path / "hashes.json")
    identities = {
        role: identify(m, hashes.digest(m)) for role, m in ((r, resolve(str(p), [])) for r, p in paths.items())
    }
    spool = Spool(tmp_path / "spool")
    records = []

    def put(record):
        records.append(record)
        spool.put(job.job_id, job.lease_id, record)

    n = run_job(spec, make_engine("mlx"), put, job.job_id, job.attempt, identities["target"], identities["draft"])
    items = [spool_read(path) for path in spool.paths()]
    assert n == len(records) == len(items) == 2 * 2 * 2  # prompts x repeats (2, the design's rows) x arms
    for item in items:
        assert not agent.report_result(item.job_id, item.lease_id, item.record_json).duplicate
        spool.ack(item)
    assert agent.report_result(job.job_id, job.lease_id, items[1].record_json).duplicate  # a retry: no second row
    agent.complete_job(job.job_id, job.lease_id, len(records))
    return records


def check_round_trip(path, records: list[RunRecord]) -> None:
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == len(records) and len({r["run_id"] for r in rows}) == len(rows)
    by_id = {r["run_id"]: r for r in rows}
    for record in records:
        row = by_id[record.run_id]
        assert RunRecord.from_row(row) == record  # every field, nested parts and lists included
        assert (
            row["chip"] == LINUX_BOX.chip and row["lease_id"].startswith("lease-") and len(row["record_sha256"]) == 64
        )
    assert {r.method for r in records} == {"baseline", "draft"}
    draft = next(r for r in records if r.method == "draft")
    assert draft.target.reference == "target" and draft.draft.digest and draft.acceptance_by_position  # a name, no path


def check_csv(path, records: list[RunRecord]) -> None:
    df = pd.read_csv(path)
    assert set(df["run_id"]) == {r.run_id for r in records}
    assert set(RunRecord.columns()) <= set(df.columns)
    by_id = df.set_index("run_id")
    for r in records:
        assert by_id.loc[r.run_id, "decode_tokens_per_second"] == r.decode_tokens_per_second
        assert json.loads(by_id.loc[r.run_id, "acceptance_by_position"]) == list(r.acceptance_by_position)
        assert "/" not in by_id.loc[r.run_id, "target_reference"]


def test_export_running_then_stopped_and_records_round_trip(tmp_path, tiny_models):
    data = tmp_path / "coordinator"
    # The job is measured here without heartbeats: a lease of an hour, not 60 s, so a slow spell
    # of the machine cannot expire it before its runs are reported.
    proc, endpoints = start_coordinator(data, "--lease-seconds", "3600")
    address = endpoints["grpc"]
    admin = ["--coordinator", address, "--data-dir", str(data)]
    try:
        empty = cli("export", "--format", "csv", "--output", str(tmp_path / "none.csv"), *admin, check=False)
        assert empty.returncode != 0 and "holds no runs yet" in empty.stderr
        records = measure_and_upload(address, data, tiny_models, tmp_path)
        out = cli("export", "--format", "parquet", "--output", str(tmp_path / "live.parquet"), *admin).stdout
        assert out.strip() == f"wrote {len(records)} runs to {tmp_path / 'live.parquet'}"
        check_round_trip(tmp_path / "live.parquet", records)
        cli("export", "--format", "csv", "--output", str(tmp_path / "live.csv"), *admin)
        check_csv(tmp_path / "live.csv", records)
        stopped = ["export", "--stopped", "--data-dir", str(data), "--format", "csv"]
        locked = cli(*stopped, "--output", str(tmp_path / "x.csv"), check=False)
        assert locked.returncode != 0 and "is the coordinator still running?" in locked.stderr, locked.stderr
    finally:
        assert stop(proc) == 0

    cli("export", "--stopped", "--data-dir", str(data), "--format", "parquet", "--output", str(tmp_path / "s.parquet"))
    check_round_trip(tmp_path / "s.parquet", records)
    cli("export", "--stopped", "--data-dir", str(data), "--format", "csv", "--output", str(tmp_path / "s.csv"))
    check_csv(tmp_path / "s.csv", records)
    missing = cli("export", "--stopped", "--data-dir", str(tmp_path / "nowhere"), "--output", "x.csv", check=False)
    assert missing.returncode != 0 and "no coordinator database" in missing.stderr


def test_export_refuses_negative_or_absurd_arguments_by_name(tmp_path):
    import grpc
    import pytest

    from tests.support.fleet import admin_for
    from tests.support.fleet import start_coordinator as start_in_process

    coordinator = start_in_process(tmp_path / "coordinator")
    try:
        admin = admin_for(coordinator)
        for request, field in (
            (pb.ExportRequest(table="runs", limit=-1), "limit"),
            (pb.ExportRequest(table="runs", after_seq=-5), "after_seq"),
            (pb.ExportRequest(table="runs; DROP TABLE runs"), "table"),
        ):
            with pytest.raises(grpc.RpcError) as e:
                admin.Export(request)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith(field)
        assert admin.Export(pb.ExportRequest(table="runs", limit=2**31 - 1)).rows == 0  # capped, not refused
    finally:
        coordinator.stop()


def test_export_pages_travel_compressed_and_read_back_whole(tmp_path):
    """An Export page is Arrow IPC with zstd-compressed buffers: a page of 2,000 synthetic runs
    is several times smaller on the wire than the table it reads back as (the dashboard's first
    sync of 1M runs held 62 MB pages twice over: bench/README.md), and the table is the store's
    rows, in order."""
    import duckdb

    from coordinator.store import DB_FILENAME
    from specfleet.client import arrow_from_ipc
    from tests.support.fleet import admin_for
    from tests.support.fleet import start_coordinator as start_in_process
    from tests.support.synthetic import seed

    seed(tmp_path / "c", 4000)
    coordinator = start_in_process(tmp_path / "c")
    try:
        page = admin_for(coordinator).Export(pb.ExportRequest(table="runs", limit=2000))
    finally:
        coordinator.stop()
    table = arrow_from_ipc(page.arrow_ipc)
    assert table.num_rows == page.rows == 2000
    assert len(page.arrow_ipc) * 3 < table.nbytes, (len(page.arrow_ipc), table.nbytes)
    with duckdb.connect(str(tmp_path / "c" / DB_FILENAME), read_only=True) as con:
        stored = con.execute("SELECT run_id, seq FROM runs ORDER BY seq LIMIT 2000").fetchall()
    assert list(zip(table.column("run_id").to_pylist(), table.column("seq").to_pylist())) == stored
    assert page.last_seq == stored[-1][1]

"""The fleet end to end: coordinator and agent as separate processes on loopback, driven
through the CLI, real engines on the tiny models, rows checked in DuckDB."""

import json
import stat
import urllib.request

import pytest
import yaml

from coordinator.store import open_readonly
from tests.processes import cli, spawn, start_coordinator, stop, wait_for_sweep

pytestmark = pytest.mark.slow

METHODS = {"draft": [2], "ngram": [3]}
PROMPTS_IN_CODE_SET = 2
REPEATS = 2


def sweep_file(tmp_path, tiny_models):
    doc = {
        "name": "e2e",
        "models": {
            "mlx": {"target": str(tiny_models.mlx_target), "draft": str(tiny_models.mlx_draft)},
            "llama.cpp": {"target": str(tiny_models.gguf_target), "draft": str(tiny_models.gguf_draft)},
        },
        "engines": ["mlx", "llama.cpp"],
        "prompt_sets": ["code"],
        "methods": METHODS,
        "max_new_tokens": 24,
        "warmup": 1,
        "repeats": REPEATS,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_sweep_lands_in_duckdb_and_survives_a_restart(tmp_path, tiny_models):
    data, agent_dir = tmp_path / "coordinator", tmp_path / "agent"
    coordinator, endpoints = start_coordinator(data)
    address = endpoints["grpc"]
    admin = ["--coordinator", address, "--data-dir", str(data)]
    agent = None
    try:
        token = cli("token", "create", "--ttl", "60", *admin).stdout.strip()
        out = cli(
            "agent",
            "enrol",
            "--coordinator",
            address,
            "--token",
            token,
            "--name",
            "e2e-agent",
            "--label",
            "room=ci",
            "--config-dir",
            str(agent_dir),
        ).stdout
        assert "enrolled e2e-agent" in out
        assert stat.S_IMODE((agent_dir / "agent.json").stat().st_mode) == 0o600
        # The token was for one use only.
        again = cli(
            "agent",
            "enrol",
            "--coordinator",
            address,
            "--token",
            token,
            "--name",
            "other",
            "--config-dir",
            str(tmp_path / "other"),
            check=False,
        )
        assert again.returncode != 0 and "already used" in again.stderr

        agent = spawn("agent", "run", "--config-dir", str(agent_dir), log=tmp_path / "agent.log")
        submitted = cli("sweep", "submit", str(sweep_file(tmp_path, tiny_models)), *admin).stdout
        sweep_id = submitted.split()[1].rstrip(":")
        status = wait_for_sweep(address, data, sweep_id)
        assert "done" in status and "failed 0" in status, status + (tmp_path / "agent.log").read_text()

        agents = cli("agents", "list", *admin).stdout
        assert "e2e-agent" in agents
        metrics = urllib.request.urlopen(f"http://{endpoints['metrics']}/metrics", timeout=10).read().decode()
        assert 'specfleet_jobs{state="done"} 2.0' in metrics
        assert "specfleet_latest_decode_tokens_per_second{" in metrics
    finally:
        if agent is not None:
            assert stop(agent) == 0, (tmp_path / "agent.log").read_text()
        assert stop(coordinator) == 0

    con = open_readonly(data)
    runs = con.execute(
        "SELECT engine, method, depth, prompt_id, decode_tokens_per_second, generated_tokens,"
        " lossless, params, metrics FROM runs"
    ).fetchall()
    jobs = con.execute("SELECT state, attempt FROM jobs").fetchall()
    prompt_lengths = con.execute("SELECT DISTINCT engine, prompt_tokens FROM runs ORDER BY ALL").fetchall()
    con.close()
    arms = 1 + sum(len(d) for d in METHODS.values())
    assert len(runs) == 2 * arms * PROMPTS_IN_CODE_SET * REPEATS
    assert {(r[0], r[1], r[2]) for r in runs} == {
        (e, m, d) for e in ("mlx", "llama.cpp") for m, d in [("baseline", 0), ("draft", 2), ("ngram", 3)]
    }
    assert all(r[4] > 0 and r[5] == 24 and r[6] is True for r in runs)
    for r in runs:
        metrics = json.loads(r[8])
        if r[1] != "baseline":
            assert 0 <= metrics["tokens_accepted"] <= metrics["tokens_drafted"]
            assert metrics["rounds"] + metrics["tokens_accepted"] + 1 == r[5]
    params = json.loads(runs[0][7])
    assert float(params["load_seconds"]) > 0 and params["prompt_set"] == "code"
    assert jobs == [("done", 1), ("done", 1)]
    # Both engines prefilled exactly the code set's fixed length, whatever their tokenizers made of the text.
    assert prompt_lengths == [("llama.cpp", 128), ("mlx", 128)]

    # Restart on the same data dir: everything is still there and served.
    coordinator, endpoints = start_coordinator(data)
    try:
        status = cli("sweep", "status", sweep_id, "--coordinator", endpoints["grpc"], "--data-dir", str(data)).stdout
        assert f"{len(runs)} runs" in status and "2/2 jobs finished" in status
        out = tmp_path / "runs.parquet"
        cli(
            "export",
            "--format",
            "parquet",
            "--output",
            str(out),
            "--coordinator",
            endpoints["grpc"],
            "--data-dir",
            str(data),
        )
        import pandas as pd

        exported = pd.read_parquet(out)
        assert len(exported) == len(runs) and "param.load_seconds" in exported.columns
    finally:
        stop(coordinator)

"""The fleet end to end: coordinator and agent as separate processes on loopback, driven
through the CLI, real engines on the tiny models, rows checked in DuckDB."""

import stat
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from coordinator.store import open_readonly
from specfleet import speedup
from tests.support.processes import cli, spawn, start_coordinator, stop, wait_for_sweep

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]

METHODS = {"draft": [2], "ngram": [3]}
PROMPTS = 1  # the first of the code set: every property below holds per prompt
REPEATS = 2  # rounded up to 6 to complete the Williams design of 3 arms
DEPTH = 128  # tokens of documents before the prompt at the deeper context
CONTEXTS = [0, DEPTH]


def sweep_file(tmp_path, tiny_models):
    doc = {
        "name": "e2e",
        "models": {
            "mlx": {"target": str(tiny_models.mlx_target), "draft": str(tiny_models.mlx_draft)},
            "llama.cpp": {"target": str(tiny_models.gguf_target), "draft": str(tiny_models.gguf_draft)},
        },
        "engines": ["mlx", "llama.cpp"],
        "prompt_sets": ["code"],
        "prompts": PROMPTS,
        "context_tokens": CONTEXTS,
        "methods": METHODS,
        "max_new_tokens": 24,
        "warmup": 1,
        "repeats": REPEATS,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_sweep_lands_in_duckdb_and_survives_a_restart(tmp_path, tiny_models):
    """The path a user takes through the CLI, which the demo (tests/test_demo.py) runs for them:
    a one-use token and a 0600 credential, `sweep submit` rounding repeats up to a Williams design,
    both engines at context depths 0 and DEPTH (the documents' token counts and prompt-set digests
    checked per run), every stored row's accounting (rounds, acceptance, load time, names not
    paths), /metrics' speedups equal to the one definition's on the stored runs, and a restarted
    coordinator serving and exporting the same runs."""
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
        assert "repeats rounded up from 2 to 6 to complete the Williams design of 3 arms" in submitted
        status = wait_for_sweep(address, data, sweep_id)
        assert "done" in status and "failed 0" in status, status + (tmp_path / "agent.log").read_text()

        agents = cli("agents", "list", *admin).stdout
        assert "e2e-agent" in agents
        metrics = urllib.request.urlopen(f"http://{endpoints['metrics']}/metrics", timeout=10).read().decode()
        assert 'specfleet_jobs{state="done"} 4.0' in metrics
    finally:
        if agent is not None:
            assert stop(agent) == 0, (tmp_path / "agent.log").read_text()
        assert stop(coordinator) == 0

    con = open_readonly(data)
    # /metrics' speedups are the one definition's on the stored runs (specfleet/speedup.py), whatever
    # the load: runs judged not nominal on a busy machine enter no pair, on both sides alike.
    expected = speedup.speedups(con)
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    scraped = {
        (s.labels["comparable"], s.labels["engine"], s.labels["method"], int(s.labels["depth"])): s.value
        for s in families["specfleet_speedup_ratio"].samples
    }
    assert scraped.keys() == set(zip(expected.comparable, expected.engine, expected.method, expected.depth))
    for r in expected.itertuples():
        assert scraped[r.comparable, r.engine, r.method, r.depth] == pytest.approx(r.speedup), r
    runs = con.execute(
        "SELECT engine, method, depth, prompt_id, decode_tokens_per_second, generated_tokens, lossless,"
        " tokens_accepted, tokens_drafted, rounds, load_seconds, prompt_set, context_tokens, prompt_tokens,"
        " prompt_set_digest, target_reference, arm_order FROM runs"
    ).df()
    jobs = con.execute("SELECT state, attempt FROM jobs").fetchall()
    con.close()
    arms = 1 + sum(len(d) for d in METHODS.values())
    assert len(runs) == 2 * len(CONTEXTS) * arms * PROMPTS * 6
    assert set(zip(runs.engine, runs.method, runs.depth)) == {
        (e, m, d) for e in ("mlx", "llama.cpp") for m, d in [("baseline", 0), ("draft", 2), ("ngram", 3)]
    }
    assert (runs.decode_tokens_per_second > 0).all() and (runs.generated_tokens == 24).all() and runs.lossless.all()
    spec = runs[runs.method != "baseline"]
    assert ((0 <= spec.tokens_accepted) & (spec.tokens_accepted <= spec.tokens_drafted)).all()
    assert (spec.rounds + spec.tokens_accepted + 1 == spec.generated_tokens).all()
    assert (runs.load_seconds > 0).all() and set(runs.prompt_set) == {"code"} and set(runs.arm_order) == {"williams"}
    assert set(runs.target_reference) == {tiny_models.mlx_target.name, tiny_models.gguf_target.name}  # names, no paths
    assert jobs == [("done", 1)] * 4
    # Context depth is a cell dimension: DEPTH tokens of distinct documents before each prompt (BOS
    # counted once), on both engines; the two depths read different text, so their digests differ,
    # and both engines read the same text at each depth.
    lengths = runs.groupby(["engine", "prompt_id", "context_tokens"]).prompt_tokens.unique().map(list)
    for engine in ("mlx", "llama.cpp"):
        for pid in runs.prompt_id.unique():
            (plain,), (deep,) = lengths[(engine, pid, 0)], lengths[(engine, pid, DEPTH)]
            assert deep - plain == DEPTH - 1, (engine, pid, plain, deep)
    digests = runs.groupby("context_tokens").prompt_set_digest.nunique()
    assert (digests == 1).all() and runs.prompt_set_digest.nunique() == 2

    # Restart on the same data dir: everything is still there and served.
    coordinator, endpoints = start_coordinator(data)
    try:
        status = cli("sweep", "status", sweep_id, "--coordinator", endpoints["grpc"], "--data-dir", str(data)).stdout
        assert f"{len(runs)} runs" in status and "4/4 jobs finished" in status
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
        assert len(exported) == len(runs) and "load_seconds" in exported.columns
    finally:
        stop(coordinator)

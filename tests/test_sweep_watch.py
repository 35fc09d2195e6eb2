"""`specfleet sweep status --watch`: a real small sweep (coordinator and agent as separate
processes, real engines on the tiny models) watched through a pipe, line by line; the terminal
view drawn by rich into a buffer; the ETA's arithmetic on hand-worked cases."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import duckdb
import pytest
import yaml
from rich.console import Console

from cli.watch import Bars, eta_text, watch
from coordinator.progress import AgentOnSweep, JobProgress, eta_seconds, expected_runs, sweep_progress
from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.record import Arm, JobSpec, Prompt, Sampler, VerifyCost
from tests.support.processes import ROOT, cli, spawn, start_coordinator, stop

SWEEP_LINE = re.compile(
    r"^sweep (sw-\w+) watched: (running|done|cancelled), (\d+)/2 jobs finished( \(\d+ failed\))?, "
    r"(\d+)/(\d+) runs stored(, ETA (unknown|\d+s|\d+m\d\ds|\d+h\d\dm))?$"
)
AGENT_LINE = re.compile(
    r"^  (sw-\w+) agent watcher on (job-\w+): (.+), (arm \S+( K=\d+)?|first run not stored), (\d+)/(\d+) runs$"
)
FAILURE_LINE = re.compile(r"^  (sw-\w+) failed (job-\w+): (.+)$")


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.engine
def test_watch_piped_prints_a_line_per_change_of_a_real_sweep(tmp_path, tiny_models):
    """One MLX cell that runs (2 arms x 2 repeats x 1 prompt = 4 runs) and one llama.cpp cell
    whose model is missing on the agent (refused, with its reason): the watch's lines tell both."""
    data, agent_dir = tmp_path / "coordinator", tmp_path / "agent"
    coordinator, endpoints = start_coordinator(data)
    admin = ["--coordinator", endpoints["grpc"], "--data-dir", str(data)]
    agent = None
    try:
        token = cli("token", "create", "--ttl", "60", *admin).stdout.strip()
        cli("agent", "enrol", "--coordinator", endpoints["grpc"], "--token", token, "--name", "watcher",
            "--config-dir", str(agent_dir))  # fmt: skip
        sweep = {
            "name": "watched",
            "models": {
                "mlx": {"target": str(tiny_models.mlx_target), "draft": str(tiny_models.mlx_draft)},
                "llama.cpp": {"target": str(tmp_path / "missing.gguf"), "draft": str(tiny_models.gguf_draft)},
            },
            "engines": ["mlx", "llama.cpp"],
            "prompt_sets": ["qa"],
            "prompts": 1,
            "methods": {"draft": [2]},
            "max_new_tokens": 8,
            "warmup": 1,
            "repeats": 2,
        }
        (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
        sweep_id = cli("sweep", "submit", str(tmp_path / "sweep.yaml"), *admin).stdout.split()[1].rstrip(":")
        # The watch starts before the agent: it sees the sweep run, however fast the agent is.
        watch = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "sweep", "status", "--watch", sweep_id, "--interval", "0.2",
             *admin],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        first = watch.stdout.readline()  # its first poll has printed: the sweep is still queued (no agent yet)
        agent = spawn("agent", "run", "--config-dir", str(agent_dir), log=tmp_path / "agent.log")
        try:
            stdout, stderr = watch.communicate(timeout=120)
            stdout = first + stdout
        finally:
            watch.kill()
        watched = subprocess.CompletedProcess(watch.args, watch.returncode, stdout, stderr)
    finally:
        if agent is not None:
            stop(agent)
        stop(coordinator)
    lines = watched.stdout.splitlines()
    assert watched.returncode == 1, watched.stdout + watched.stderr  # a job failed
    assert "\x1b" not in watched.stdout  # piped: no escape codes, no spinner

    sweeps = [SWEEP_LINE.match(line) for line in lines if line.startswith("sweep ")]
    agents = [AGENT_LINE.match(line) for line in lines if line.startswith("  ") and " agent " in line]
    failures = [FAILURE_LINE.match(line) for line in lines if " failed job-" in line]
    assert len(sweeps) + len(agents) + len(failures) == len(lines) and all(sweeps + agents + failures), lines
    assert {m.group(1) for m in sweeps + agents + failures} == {sweep_id}
    # One line per change: no sweep line repeats the one before it; counts only grow.
    texts = [m.group(0) for m in sweeps]
    assert all(a != b for a, b in zip(texts, texts[1:])), texts
    runs, expected = [int(m.group(5)) for m in sweeps], [int(m.group(6)) for m in sweeps]
    assert runs == sorted(runs), texts
    # 4 runs a cell; once the llama.cpp cell is refused, only the MLX cell's 4 are to come.
    assert expected == sorted(expected, reverse=True) and set(expected) <= {8, 4}, texts
    assert lines[-1] == f"sweep {sweep_id} watched: done, 2/2 jobs finished (1 failed), 4/4 runs stored"
    assert any(m.group(7) and m.group(8) != "unknown" for m in sweeps[:-1]), "no ETA was ever estimated"
    # The agent on each cell it took (the llama.cpp one until it refused it), with the arm of
    # its latest run once one was stored.
    cells = {m.group(3): m.group(4) for m in agents}
    mlx, gguf = f"mlx {tiny_models.mlx_target.name} qa, context 0", "llama.cpp missing.gguf qa, context 0"
    assert set(cells) <= {mlx, gguf} and mlx in cells, lines
    assert {m.group(4) for m in agents if m.group(3) == mlx} & {"arm baseline", "arm draft K=2"}, lines
    # The refused cell's reason, printed once.
    assert len(failures) == 1 and "missing.gguf" in failures[0].group(3), lines

    con = open_readonly(data)
    (stored,) = con.execute("SELECT count(*) FROM runs").fetchone()
    con.close()
    assert stored == 4  # the coordinator's runs_expected was right


def status(runs: int, agents: list[pb.AgentProgress], failures=(), state="running") -> pb.SweepStatus:
    return pb.SweepStatus(
        sweep_id="sw-1", name="night", state=state, jobs_total=3, jobs_done=1, jobs_failed=len(failures),
        runs=runs, runs_expected=24, eta_seconds=125.0, agents=agents, failures=list(failures),
    )  # fmt: skip


def test_watch_on_a_terminal_draws_bars_in_place():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160, color_system=None)
    mac = pb.AgentProgress(
        agent_id="ag-1", name="studio", job_id="job-1", cell="mlx tiny code, context 0", arm="draft K=2",
        runs=3, runs_expected=8,
    )  # fmt: skip
    statuses = iter(
        [
            [status(10, [mac])],
            [status(12, [], failures=["job-2: refused: no such model"])],
            [status(24, [], failures=["job-2: refused: no such model"], state="done")],
        ]
    )
    slept = []
    final = watch(lambda: next(statuses), console, 5.0, sleep=slept.append)
    assert final[0].state == "done" and slept == [5.0, 5.0]
    out = buffer.getvalue()
    assert "\x1b[2K" in out or "\x1b[1A" in out  # rich redraws the lines in place
    assert "sweep night (running)" in out and "10/24" in out and "ETA 2m05s" in out
    assert "studio: mlx tiny code, context 0" in out and "3/8" in out and "draft K=2" in out
    assert out.count("sw-1 failed job-2: refused: no such model") == 1  # printed once, above the bars
    assert "sweep night (done)" in out and "24/24" in out


def test_bars_drop_an_agent_that_left_the_sweep():
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    mac = pb.AgentProgress(agent_id="ag-1", name="studio", job_id="job-1", cell="c", runs=0, runs_expected=8)
    with Bars(console) as bars:
        bars.update([status(0, [mac])])
        assert len(bars.progress.tasks) == 2
        bars.update([status(8, [])])
        assert [t.description for t in bars.progress.tasks] == ["sweep night (running)"]


def test_expected_runs_count_prompts_arms_rounded_repeats_and_verify_cost():
    assert expected_runs(prompts=2, arms=3, repeats=2, verify_contexts=0) == 2 * 3 * 6  # a Williams design of 6 rows
    assert expected_runs(prompts=2, arms=3, repeats=2, verify_contexts=2) == 38
    assert expected_runs(prompts=1, arms=2, repeats=3, verify_contexts=0) == 8  # 3 repeats rounded up to 4
    assert expected_runs(prompts=2, arms=0, repeats=3, verify_contexts=1) == 1  # a verify-cost job


def job(agent: str, state: str, runs: int, pace: float | None, cell: str = "a", expected: int = 10) -> JobProgress:
    return JobProgress(f"job-{agent}-{state}-{runs}", agent, state, cell, runs, expected, pace)


def test_eta_is_the_longest_agent_of_runs_left_times_pace():
    # Agent 1: 6 runs left at 2 s, then a queued job of its cell (whose pace is 2 s): 12 + 20 s.
    # Agent 2: 9 runs left at 4 s = 36 s. Done jobs count for nothing but their pace.
    jobs = [job("1", "leased", 4, 2.0), job("1", "queued", 0, None), job("2", "leased", 1, 4.0, cell="b")]
    assert eta_seconds(jobs) == 36.0
    assert eta_seconds([*jobs, job("2", "done", 10, 1.0, cell="b")]) == 36.0 + 0  # its own pace stays 4 s
    # A queued job of a cell nobody ran yet takes the sweep's median pace (3 s): 10 x 3 = 30 s more.
    assert eta_seconds([*jobs, job("2", "queued", 0, None, cell="c")]) == 36.0 + 30.0
    assert eta_seconds([job("1", "queued", 0, None)]) is None  # nothing timed yet
    assert eta_seconds([job("1", "done", 10, 2.0), job("1", "failed", 0, None)]) == 0.0


def test_eta_text():
    assert [eta_text(s) for s in (-1.0, 12.4, 185, 3725)] == ["ETA unknown", "ETA 12s", "ETA 3m05s", "ETA 1h02m"]


def test_sweep_progress_reads_the_stored_job_specs():
    """sweep_progress on a DuckDB holding real job specs (JobSpec.to_json) and runs: counts from
    the spec's prompts, arms, repeats and verify-cost depths; the leased job's agent, cell and arm."""
    cell = JobSpec(
        engine="mlx", model={"target": "/models/Qwen3.5-9B"}, prompt_set="code", prompt_category="code",
        prompt_set_digest="ab" * 32, prompts=(Prompt("p1", "x"), Prompt("p2", "y")),
        arms=(Arm("baseline"), Arm("draft", 2), Arm("ngram", 3)), context_tokens=512, repeats=2,
        sampler=Sampler(temperature=0.7), verify_cost=VerifyCost(context_tokens=(128, 512)),
    )  # fmt: skip
    con = duckdb.connect()
    con.execute("CREATE TABLE agents (agent_id VARCHAR, name VARCHAR)")
    con.execute("CREATE TABLE jobs (job_id VARCHAR, sweep_id VARCHAR, agent_id VARCHAR, spec JSON, state VARCHAR,"
                " lease_id VARCHAR)")  # fmt: skip
    con.execute("CREATE TABLE runs (job_id VARCHAR, lease_id VARCHAR, sweep_id VARCHAR, started_at_unix_seconds"
                " DOUBLE, wall_seconds DOUBLE, method VARCHAR, depth INTEGER)")  # fmt: skip
    con.execute("INSERT INTO agents VALUES ('ag-1', 'studio'), ('ag-2', 'air')")
    con.execute("INSERT INTO jobs VALUES ('job-1', 'sw-1', 'ag-1', ?, 'leased', 'l1'), ('job-2', 'sw-1', 'ag-2', ?,"
                " 'queued', NULL)", [cell.to_json(), cell.to_json()])  # fmt: skip
    for t, method, depth in ((100.0, "baseline", 0), (103.0, "draft", 2), (106.0, "ngram", 3)):
        con.execute("INSERT INTO runs VALUES ('job-1', 'l1', 'sw-1', ?, 1.0, ?, ?)", [t, method, depth])
    con.execute("INSERT INTO runs VALUES ('job-1', 'old-lease', 'sw-1', 1.0, 1.0, 'baseline', 0)")  # a lost attempt
    # job-2 lost its lease after two runs (5 s apart) and is queued again: it starts afresh.
    for t in (10.0, 15.0):
        con.execute("INSERT INTO runs VALUES ('job-2', 'l2', 'sw-1', ?, 1.0, 'baseline', 0)", [t])
    con.execute("UPDATE jobs SET lease_id = 'l2' WHERE job_id = 'job-2'")
    (got,) = sweep_progress(con, ["sw-1"]).values()
    per_job = 2 * 3 * 6 + 2
    assert got.runs_expected == 2 * per_job
    # job-1: 35 runs left at 3 s; job-2: all 38 left at its lost attempt's 5 s.
    assert got.eta_seconds == 38 * 5.0
    assert got.agents == [AgentOnSweep("ag-1", "studio", "job-1", "mlx Qwen3.5-9B code, context 512, T=0.7",
                                       "ngram K=3", 3, per_job)]  # fmt: skip

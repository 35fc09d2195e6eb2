"""No server outlives its job. A real agent runs real workers that start the real llama-server on
the tiny models; after a normal end, a worker killed with SIGKILL, a deadline, a cancelled sweep,
a stopped agent and an agent killed with SIGKILL, no server is left. A job whose server refuses
its flags fails alone, with llama-server's reason, and the agent goes on to the next job.

The servers are found through /proc by a marker in their environment (inherited from this test
through the agent and its workers), so that other llama-servers on the machine do not count."""

import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.engines.llama_server import PROJECT_BUILD
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.support.agents import Running, identity_for, submit, sweep
from tests.support.fleet import admin_for, start_coordinator
from tests.support.processes import needs_llama_server, spawn, stop, wait_until

pytestmark = [
    pytest.mark.process,
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes through /proc"),
    needs_llama_server,
]
MARKER = "SPECFLEET_CLEANUP_TEST"


def marked(marker: str) -> dict[int, str]:
    """Live processes (zombies excluded) whose environment carries MARKER=marker: pid -> argv[0]."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARKER}={marker}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if "\nState:\tZ" in (entry / "status").read_text():
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


class Watch:
    """Every marked llama-server seen while it runs, sampled on a thread."""

    def __init__(self, marker: str):
        self.marker, self.seen, self.stop = marker, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            self.servers()
            time.sleep(0.05)

    def servers(self) -> dict[int, str]:
        """The marked llama-servers alive now (and remembered as seen)."""
        found = {pid: exe for pid, exe in marked(self.marker).items() if exe.endswith("llama-server")}
        self.seen.update(found)
        return found

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def server_job(coordinator, name, target, arms, *, engine="llama-server", server=None, **spec) -> tuple[str, str]:
    """A sweep of one job, submitted as a llama.cpp cell and rewritten into a server cell (the
    sweep file's own vocabulary for server arms is not this test's business): (sweep, job)."""
    sweep_id = submit(
        coordinator,
        {"name": name, "models": {"llama.cpp": {"target": str(target)}}, "engines": ["llama.cpp"],
         "prompt_sets": ["code"], "prompts": 1, "max_attempts": 1, "warmup": 0, "repeats": 1,
         "max_new_tokens": 8},
    )  # fmt: skip
    with coordinator.store.tx() as con:
        job_id, text = con.execute("SELECT job_id, spec FROM jobs WHERE sweep_id = ?", [sweep_id]).fetchone()
        rewritten = {**json.loads(text), "engine": engine, "arms": arms, "server": server or {"flags": ["-c", "2048"]}}
        con.execute("UPDATE jobs SET spec = ? WHERE job_id = ?", [json.dumps({**rewritten, **spec}), job_id])
    return sweep_id, job_id


def failure(coordinator, sweep_id) -> str:
    s = sweep(coordinator, sweep_id)
    assert (s.jobs_failed, s.jobs_done) == (1, 0), s
    return s.failures[0]


@pytest.fixture
def agent_with_marker(tmp_path, monkeypatch, tiny_models):
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    coordinator = start_coordinator(tmp_path / "coordinator")
    config = tmp_path / "agent"
    identity_for(coordinator, config)
    try:
        yield coordinator, config, marker
    finally:
        coordinator.stop()


def test_no_server_outlives_a_job_however_it_ends(agent_with_marker, tiny_models):
    coordinator, config, marker = agent_with_marker
    model = tiny_models.gguf_mtp_hybrid
    arms = [{"method": "baseline"}, {"method": "draft-mtp", "depth": 2}]
    long_job = {"repeats": 400, "max_new_tokens": 64}
    refused, _ = server_job(
        coordinator, "refused-flag", model, [{"method": "baseline"}, {"method": "ngram-mod", "depth": 8,
                                             "flags": ["--spec-ngram-mod-n-max", "5000"]}],
    )  # fmt: skip
    done, _ = server_job(coordinator, "done", model, arms)
    killed, killed_job = server_job(coordinator, "killed", model, arms, **long_job)
    # A server that is the worker's grandchild: PR_SET_PDEATHSIG does not reach it, the group kill does.
    wrapped = {
        "system": "sh-wrapped llama-server",
        "command": f"sh -c '{PROJECT_BUILD} -m {{model}} --port {{port}}; exit 0'",
    }
    grandchild, grandchild_job = server_job(
        coordinator, "grandchild", model, [{"method": "baseline"}], engine="openai", server=wrapped, **long_job
    )
    late, _ = server_job(coordinator, "late", model, arms, deadline_seconds=4, **long_job)
    cancelled, cancelled_job = server_job(coordinator, "cancelled", model, arms, **long_job)

    agent = Agent(AgentConfig.load(config, {"model_dirs": [model.parent]}))
    with Watch(marker) as watch, Running(agent):

        def kill_worker_of(job_id):
            pid_file = config / "jobs" / job_id / "worker.pid"
            wait_until(lambda: agent.state.job_id == job_id and watch.servers(), f"{job_id}'s server", 120)
            os.kill(int(pid_file.read_text()), signal.SIGKILL)

        kill_worker_of(killed_job)
        kill_worker_of(grandchild_job)
        wait_until(lambda: agent.state.job_id == cancelled_job and watch.servers(), "the cancelled job's server", 120)
        admin_for(coordinator).CancelSweep(pb.CancelSweepRequest(sweep_id=cancelled))
        wait_until(lambda: agent.state.job_id == "" and sweep(coordinator, cancelled).state == "cancelled", "cancel")
        wait_until(lambda: not watch.servers(), "every server to be gone", 10)
        assert not marked(marker), marked(marker)  # no worker, no server, nothing
        assert not agent.stop.is_set()

    assert len(watch.seen) >= 6, watch.seen  # every job started servers (the refused one too: it exits)
    assert sweep(coordinator, done).jobs_done == 1 and sweep(coordinator, done).runs == 4  # 2 arms, 2 repeats
    reason = failure(coordinator, refused)
    assert "worker exited with status 1" in reason and "ngram n-max must be between 0 and 1024" in reason, reason
    assert "worker killed by SIGKILL" in failure(coordinator, killed)
    assert "worker killed by SIGKILL" in failure(coordinator, grandchild)
    assert "worker exceeded the job's deadline and was killed" in failure(coordinator, late)


def test_no_server_outlives_an_agent_that_stops_mid_job(agent_with_marker, tiny_models):
    coordinator, config, marker = agent_with_marker
    _, job_id = server_job(
        coordinator, "stopped", tiny_models.gguf_mtp_hybrid, [{"method": "baseline"}], repeats=400, max_new_tokens=64
    )
    agent = Agent(AgentConfig.load(config, {"model_dirs": [tiny_models.gguf_mtp_hybrid.parent]}))
    with Watch(marker) as watch:
        with Running(agent):
            wait_until(lambda: agent.state.job_id == job_id and watch.servers(), "the job's server", 120)
        wait_until(lambda: not marked(marker), "the worker and its server to be gone", 10)
    assert watch.seen


def test_no_server_outlives_an_agent_killed_with_sigkill(agent_with_marker, tiny_models, tmp_path):
    """kill -9 of the agent: its worker's orphan watchdog takes the worker's process group down."""
    coordinator, config, marker = agent_with_marker
    server_job(
        coordinator, "orphaned", tiny_models.gguf_mtp_hybrid, [{"method": "baseline"}], repeats=400, max_new_tokens=64
    )
    model_dir = str(tiny_models.gguf_mtp_hybrid.parent)
    agent = spawn("agent", "run", "--config-dir", str(config), "--model-dir", model_dir, log=tmp_path / "agent.log")
    try:
        with Watch(marker) as watch:
            wait_until(lambda: watch.servers(), "the job's server", 120)
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=10)
            wait_until(lambda: not marked(marker), "the orphaned worker and its server to be gone", 10)
        assert watch.seen
    finally:
        stop(agent, signal.SIGKILL)

"""A worker that crashes, is killed (as by the out-of-memory killer) or runs past its job's
deadline fails only its own job, with the reason at the coordinator; the agent goes on to the
next job. Real worker processes, real engines, tiny models."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.worker import ORPHANED_EXIT_STATUS
from tests.support.agents import Running, identity_for, submit, sweep
from tests.support.fleet import start_coordinator
from tests.support.processes import gone, spawn, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]


def test_crash_kill_and_deadline_fail_only_their_jobs(tmp_path, tiny_models):
    coordinator = start_coordinator(tmp_path / "coordinator")
    try:
        models = tmp_path / "models"
        models.mkdir()
        (models / "garbage.gguf").write_bytes(b"GGUF but not really" * 100)
        # Weights whose header reads but whose data is not there: the worker crashes loading them.
        broken = models / "broken-mlx"
        shutil.copytree(tiny_models.mlx_target, broken)
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:4096])
        config = tmp_path / "agent"
        identity_for(coordinator, config)

        def cell(name, engine, target, **extra):
            return submit(
                coordinator,
                {"name": name, "models": {engine: {"target": str(target)}}, "engines": [engine],
                 "prompt_sets": ["code"], "prompts": 2, "max_attempts": 1, "warmup": 0, **extra},
            )  # fmt: skip

        crash = cell("crash", "mlx", broken)
        refused = cell("refused", "llama.cpp", models / "garbage.gguf")  # unreadable: never reaches a worker
        killed = cell("killed", "mlx", tiny_models.mlx_target, repeats=200, max_new_tokens=64)
        late = cell("late", "mlx", tiny_models.mlx_target, repeats=200, max_new_tokens=64)
        good = cell("good", "llama.cpp", tiny_models.gguf_target, repeats=1, max_new_tokens=8)
        with coordinator.store.tx() as con:  # a deadline shorter than the sweep file allows
            job_id, spec = con.execute("SELECT job_id, spec FROM jobs WHERE sweep_id = ?", [late]).fetchone()
            con.execute("UPDATE jobs SET spec = ? WHERE job_id = ?", [json.dumps({**json.loads(spec),
                        "deadline_seconds": 3}), job_id])  # fmt: skip

        agent = Agent(
            AgentConfig.load(config, {"model_dirs": [models, tiny_models.mlx_target.parent.parent], "metrics_port": 0})
        )

        def scrape():
            return urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10).read().decode()

        with Running(agent) as agent:
            # The out-of-memory killer sends SIGKILL; so do we, to the worker of the second job.
            with coordinator.store.tx() as con:
                killed_job = con.execute("SELECT job_id FROM jobs WHERE sweep_id = ?", [killed]).fetchone()[0]
            pid_file = config / "jobs" / killed_job / "worker.pid"
            pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the second job's worker", 60))
            assert 'specfleet_agent_busy{engine="mlx"} 1.0' in scrape()
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: sweep(coordinator, good).jobs_done == 1, "the good job after the failures", 120)
            assert agent.state.job_id == "" and not agent.stop.is_set()
            metrics = scrape()
            assert 'specfleet_agent_jobs_total{outcome="failed"} 3.0' in metrics
            assert 'specfleet_agent_jobs_total{outcome="refused"} 1.0' in metrics
            assert 'specfleet_agent_jobs_total{outcome="done"} 1.0' in metrics
            assert "specfleet_agent_busy{" not in metrics and "specfleet_agent_spool_depth 0.0" in metrics
            uploaded = float(re.search(r"^specfleet_agent_runs_uploaded_total (\S+)$", metrics, re.M).group(1))
            assert uploaded >= 2 and "specfleet_agent_last_upload_timestamp_seconds 0.0" not in metrics

        def failure(sweep_id):
            s = sweep(coordinator, sweep_id)
            assert (s.jobs_failed, s.jobs_done) == (1, 0), s
            return s.failures[0]

        assert "worker exited with status 1" in failure(crash), failure(crash)
        assert "garbage.gguf is not a valid GGUF file" in failure(refused)
        assert "worker killed by SIGKILL (out of memory, or killed by another process)" in failure(killed)
        assert "worker exceeded the job's deadline and was killed" in failure(late)
        assert sweep(coordinator, good).runs == 2  # baseline on the code set's two prompts, one repeat
        with coordinator.store.tx() as con:
            row = con.execute(
                "SELECT target_digest, target_reference, target_architecture, target_quantisation, env_nominal"
                " FROM runs WHERE sweep_id = ?",
                [good],
            ).fetchone()
        file_digest = hashlib.sha256(tiny_models.gguf_target.read_bytes()).hexdigest()
        combined = hashlib.sha256(f"{tiny_models.gguf_target.name}:{file_digest}\n".encode()).hexdigest()
        assert row[:4] == (combined, tiny_models.gguf_target.name, "llama", "F32")  # a name, never the path
        assert row[4] in (True, False, None)
    finally:
        coordinator.stop()


def test_a_worker_whose_agent_died_before_it_started_stops_at_once(tmp_path):
    """The agent's end of the worker's pipe is closed before the worker runs: the worker stops
    within a second, though its main thread is stuck reading a job file no one writes."""
    job_file = tmp_path / "job.json"
    os.mkfifo(job_file)
    read_end, write_end = os.pipe()
    os.close(write_end)  # the agent is gone
    worker = subprocess.Popen(
        [sys.executable, "-m", "agent.worker", str(job_file), str(tmp_path / "spool"), str(read_end)],
        pass_fds=(read_end,),
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(read_end)
    try:
        assert worker.wait(timeout=5) == ORPHANED_EXIT_STATUS
        assert "the agent that started this worker is gone" in worker.stderr.read()
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes through /proc")
def test_a_worker_stops_within_two_seconds_of_its_agent_killed_right_after_starting_it(tmp_path, tiny_models):
    coordinator = start_coordinator(tmp_path / "coordinator")
    agent = None
    try:
        config = tmp_path / "agent"
        identity_for(coordinator, config)
        submit(
            coordinator,
            {"name": "orphan", "models": {"mlx": {"target": str(tiny_models.mlx_target)}}, "engines": ["mlx"],
             "prompt_sets": ["code"], "prompts": 2, "repeats": 200, "max_new_tokens": 64, "warmup": 0},
        )  # fmt: skip
        agent = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / "agent.log")
        pid_file = wait_until(lambda: next((config / "jobs").glob("*/worker.pid"), None), "a worker", 60)
        os.kill(agent.pid, signal.SIGKILL)  # right after it started the worker
        killed_at = time.monotonic()
        agent.wait(timeout=10)
        worker = int(wait_until(pid_file.read_text, "the worker's pid"))
        wait_until(lambda: gone(worker), "the orphaned worker to stop", 10)
        assert time.monotonic() - killed_at < 2.0, (tmp_path / "agent.log").read_text()
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        coordinator.stop()

"""Nothing lost, nothing counted twice: stop the coordinator mid-job, kill -9 the agent while it
measures and retries uploads, restart both. Every run measured is in DuckDB exactly once and
the interrupted job is requeued and finished. Real processes on loopback, tiny models."""

import signal
import time

import pytest
import yaml

from agent.credentials import AgentIdentity
from agent.spool import Spool
from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.ports import free_port
from tests.support.processes import gone, spawn, start_coordinator, stop, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]
PROMPTS, ARMS, REPEATS = 2, 2, 10
# The waits are bounds for a machine busy with the rest of the suite (make test runs three files at once).


def test_kill_9_and_coordinator_downtime_lose_nothing_and_count_nothing_twice(tmp_path, tiny_models):
    """One scripted sequence, checked exactly, that the random kill drill (tests/test_kill_drill.py)
    only checks by its invariants: the coordinator down while the worker measures into the spool,
    the agent killed -9 with its worker, the agent back before the coordinator; then the lost
    attempt keeps what it measured, the requeued attempt runs the whole cell, and the job says why
    (agent restarted while holding the lease)."""
    data, config = tmp_path / "coordinator", tmp_path / "agent"
    port = free_port()
    address = f"127.0.0.1:{port}"
    coordinator, _ = start_coordinator(data, "--port", str(port))
    agent = None
    try:
        admin = AdminApi(channel(address), admin_credential(data))
        token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
        resp = AgentApi(channel(address)).enrol(token, "durable", pb.Fingerprint(hostname="d"), {}, ["mlx"])
        AgentIdentity(address, resp.agent_id, "durable", resp.credential, resp.heartbeat_interval_seconds).save(config)
        doc = {
            "name": "durability",
            "models": {"mlx": {"target": str(tiny_models.mlx_target)}},
            "engines": ["mlx"],
            "prompt_sets": ["code"],
            "prompts": 2,
            "methods": {"ngram": [3]},
            "max_new_tokens": 128,
            "warmup": 0,
            "repeats": REPEATS,
        }
        sweep_id = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc))).sweep_id
        agent = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / "agent.log")
        status = lambda: admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))  # noqa: E731
        wait_until(lambda: status().runs >= 2, "the first runs to be stored", 180)

        # Coordinator down mid-job: the worker goes on measuring into the spool.
        assert stop(coordinator) == 0
        spool = Spool(config / "spool")
        wait_until(lambda: spool.depth() >= 3, "runs to pile up in the spool", 120)
        # kill -9 the agent while it measures and retries its uploads; its worker stops too.
        job_dir = next((config / "jobs").iterdir())
        worker = int((job_dir / "worker.pid").read_text())
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        wait_until(lambda: gone(worker), "the orphaned worker to stop", 10)
        pending = spool.depth()
        assert pending >= 3

        # The agent comes back first, with no coordinator to talk to: it keeps everything.
        agent = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / "agent.log")
        time.sleep(2)
        assert spool.depth() >= pending and agent.poll() is None
        coordinator, _ = start_coordinator(data, "--port", str(port))
        admin = AdminApi(channel(address), admin_credential(data))
        final = wait_until(lambda: (s := status()).state != "running" and s, "the sweep to finish", 300)
        assert (final.jobs_done, final.jobs_failed) == (1, 0), (final, (tmp_path / "agent.log").read_text())
        assert stop(agent) == 0
        agent = None
        assert stop(coordinator) == 0
    finally:
        if agent is not None:
            stop(agent, signal.SIGKILL)
        stop(coordinator)

    con = open_readonly(data)
    runs = con.execute("SELECT run_id, attempt FROM runs").fetchall()
    job = con.execute("SELECT state, attempt, reason FROM jobs").fetchone()
    con.close()
    stored = [r[0] for r in runs]
    measured = spool.measured()
    assert len(stored) == len(set(stored)), "a run was stored twice"
    assert sorted(stored) == sorted(measured), "a measured run is missing from DuckDB (or one came from nowhere)"
    assert spool.depth() == 0 and not list(spool.refused.iterdir())
    by_attempt = {}
    for _, attempt in runs:
        by_attempt[attempt] = by_attempt.get(attempt, 0) + 1
    # The interrupted attempt kept what it measured; the requeued one ran the whole cell.
    assert job[0] == "done" and job[1] == 2 and "agent restarted while holding the lease" in job[2]
    assert by_attempt[2] == PROMPTS * ARMS * REPEATS and 3 <= by_attempt[1] < PROMPTS * ARMS * REPEATS

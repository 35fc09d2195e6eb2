"""A Wi-Fi drop, a slow link and a sleeping Mac cost no runs: a real coordinator and agent as
separate processes on loopback, the agent reaching the coordinator through the tests' own
fault-injecting proxy (tests/support/netfault.py), the tiny GGUF measured by llama.cpp.

The drop holds every connection open without forwarding for DROP_SECONDS mid-job, longer than
the lease (shortened to LEASE_SECONDS so that the drop outlasts it several times over): the
coordinator expires the lease, the agent measures on, and once the link is back its heartbeat or
its runs re-claim the lease (coordinator/scheduler.py reclaim): nothing is parked, nothing runs
twice. Then every chunk is delayed by SLOW_SECONDS until the job has ended: uploads, heartbeats
and the job's end travel through the slow link, and the lease holds."""

import os
import signal
import time

import pytest
import yaml

from agent.credentials import AgentIdentity
from agent.spool import Spool
from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import KEEPALIVE_SECONDS, KEEPALIVE_TIMEOUT_SECONDS, AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.netfault import FaultProxy
from tests.support.processes import spawn, start_coordinator, stop, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]

DROP_SECONDS = 60.0  # the drop
LEASE_SECONDS = 6.0  # the drop outlasts it ten times
SLOW_SECONDS = 0.5  # added to every chunk after the drop


def sweep_doc(name: str, gguf, repeats: int, tokens: int = 32) -> str:
    return yaml.safe_dump(
        {
            "name": name,
            "models": {"llama.cpp": {"target": str(gguf)}},
            "engines": ["llama.cpp"],
            "prompt_sets": ["qa"],
            "prompts": 2,
            "methods": {"ngram": [3]},
            "max_new_tokens": tokens,
            "warmup": 0,
            "repeats": repeats,
        }
    )


def enrol(admin, coordinator_address: str, agent_address: str, config, name: str) -> None:
    """Enrol an agent with the coordinator, its identity saying to reach it at `agent_address`."""
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    resp = AgentApi(channel(coordinator_address)).enrol(token, name, pb.Fingerprint(hostname=name), {}, ["llama.cpp"])
    AgentIdentity(agent_address, resp.agent_id, name, resp.credential, resp.heartbeat_interval_seconds).save(config)


def stored_state(data):
    """After the coordinator stopped: (run ids stored, jobs' (state, attempt), attempts' rows, clock flags)."""
    con = open_readonly(data)
    try:
        runs = [r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()]
        jobs = con.execute("SELECT state, attempt FROM jobs ORDER BY created_at").fetchall()
        attempts = con.execute("SELECT attempt, outcome, reclaims FROM attempts ORDER BY started_at").fetchall()
        flags = con.execute("SELECT count(*) FROM runs WHERE clock_flag IS NOT NULL").fetchone()[0]
    finally:
        con.close()
    return runs, jobs, attempts, flags


@pytest.mark.timeout(420)
def test_a_60_s_drop_parks_nothing_reruns_nothing_and_a_slow_link_carries(tmp_path, tiny_models):
    data, config = tmp_path / "coordinator", tmp_path / "agent"
    coordinator, endpoints = start_coordinator(data, "--lease-seconds", str(LEASE_SECONDS))
    proxy = FaultProxy(int(endpoints["grpc"].rsplit(":", 1)[1])).start()
    agent = None
    log = tmp_path / "agent.log"
    try:
        admin = AdminApi(channel(endpoints["grpc"]), admin_credential(data))  # the admin's link is not faulty
        enrol(admin, endpoints["grpc"], proxy.address, config, "on-wifi")
        sweep_id = admin.SubmitSweep(
            pb.SubmitSweepRequest(yaml=sweep_doc("drop", tiny_models.gguf_target, 8, tokens=128))
        ).sweep_id
        status = lambda: admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))  # noqa: E731
        agent = spawn("agent", "run", "--config-dir", str(config), log=log)
        spool = Spool(config / "spool")
        wait_until(lambda: status().runs >= 1, "the first run to be stored", 180)

        proxy.hold()
        dropped = time.monotonic()
        time.sleep(2.0)  # what had passed the proxy already is stored; nothing more may be
        stored_before, measured_before = status().runs, len(spool.measured())
        # The coordinator hears nothing: it expires the lease and queues the job again.
        wait_until(lambda: status().jobs_queued == 1, "the lease to expire during the drop", DROP_SECONDS - 5)
        time.sleep(max(0.0, dropped + DROP_SECONDS - time.monotonic()))
        during = status()
        measured_during = len(spool.measured()) - measured_before
        reconnects = [t - dropped for t in proxy.accepted if t > dropped]

        proxy.delay(SLOW_SECONDS)
        proxy.release()
        slowed = time.monotonic()
        final = wait_until(lambda: (s := status()).state != "running" and s, "the sweep to end on the slow link", 240)
        slow_phase = time.monotonic() - slowed
        assert (final.jobs_done, final.jobs_failed) == (1, 0), log.read_text()[-4000:]
        assert stop(agent) == 0
        agent = None
    finally:
        proxy.close()
        if agent is not None:
            stop(agent)
        assert stop(coordinator) == 0

    runs, jobs, attempts, flags = stored_state(data)
    measured = spool.measured()
    print(
        f"drop {DROP_SECONDS:g} s: {stored_before} stored before, {measured_during} measured during it, "
        f"{during.runs} stored during it; slow link: the job ended {slow_phase:.1f} s after the drop, "
        f"{len(runs)} of {len(measured)} stored; new connections {[round(t, 1) for t in reconnects]} s into the drop"
    )
    assert measured_during > 0, "the agent measured nothing during the drop"
    assert during.runs == stored_before, "a run got through a held link"
    assert sorted(runs) == sorted(measured) and len(runs) == len(set(runs))  # nothing lost, nothing twice
    assert not list(spool.refused.iterdir()), "a run was parked"
    assert jobs == [("done", 1)]  # never re-run
    assert attempts == [(1, "done", 1)]  # one attempt, its lease lapsed once and re-claimed once
    assert flags == 0
    # The hung connection was given up within the keepalive's bound, and a new one opened.
    assert reconnects and reconnects[0] <= KEEPALIVE_SECONDS + KEEPALIVE_TIMEOUT_SECONDS + 3, reconnects


def _signal_agent(agent, config, sig) -> None:
    os.kill(agent.pid, sig)
    for pid_file in (config / "jobs").glob("*/worker.pid"):
        try:
            os.killpg(int(pid_file.read_text()), sig)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(300)
def test_a_sleeping_mac_loses_nothing_stores_nothing_twice_and_takes_new_work(tmp_path, tiny_models):
    """The agent and its worker stopped (SIGSTOP) for three leases, then woken (SIGCONT), as a
    Mac that sleeps mid-job: the job ends, every run measured is stored once, the agent takes the
    next sweep, and no run's times are flagged for the clock's jump."""
    data, config = tmp_path / "coordinator", tmp_path / "agent"
    coordinator, endpoints = start_coordinator(data, "--lease-seconds", str(LEASE_SECONDS))
    agent = None
    log = tmp_path / "agent.log"
    try:
        admin = AdminApi(channel(endpoints["grpc"]), admin_credential(data))
        enrol(admin, endpoints["grpc"], endpoints["grpc"], config, "sleepy")
        first = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=sweep_doc("sleep", tiny_models.gguf_target, 6))).sweep_id
        status = lambda sweep: admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep))  # noqa: E731
        agent = spawn("agent", "run", "--config-dir", str(config), log=log)
        wait_until(lambda: status(first).runs >= 1, "the first run to be stored", 180)
        _signal_agent(agent, config, signal.SIGSTOP)
        wait_until(lambda: status(first).jobs_queued == 1, "the lease to expire while asleep", 30)
        time.sleep(2 * LEASE_SECONDS)
        _signal_agent(agent, config, signal.SIGCONT)
        final = wait_until(lambda: (s := status(first)).state != "running" and s, "the sweep to end", 180)
        assert (final.jobs_done, final.jobs_failed) == (1, 0), log.read_text()[-4000:]
        second = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=sweep_doc("awake", tiny_models.gguf_target, 1))).sweep_id
        after = wait_until(lambda: (s := status(second)).state != "running" and s, "new work to be done", 180)
        assert (after.jobs_done, after.jobs_failed) == (1, 0), log.read_text()[-4000:]
        assert stop(agent) == 0
        agent = None
    finally:
        if agent is not None:
            _signal_agent(agent, config, signal.SIGCONT)
            stop(agent)
        assert stop(coordinator) == 0
    runs, jobs, attempts, flags = stored_state(data)
    spool = Spool(config / "spool")
    assert sorted(runs) == sorted(spool.measured()) and len(runs) == len(set(runs))
    assert not list(spool.refused.iterdir()), "a run was parked"
    assert jobs == [("done", 1), ("done", 1)]  # the slept-through job went on under its lease
    assert attempts[0] == (1, "done", 1)
    assert flags == 0  # the jump on wake flags nothing
    assert "clock" not in (config / "status.json").read_text()

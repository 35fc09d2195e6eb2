"""Clocks (issue 31, item 5): every run is stored with the coordinator's receive time beside the
agent's times, a run whose agent times cannot be right on the coordinator's clock (it ended after
the coordinator received it, or started before its sweep existed, by more than the bound) is
flagged, and an agent whose clock is off by more than the bound (doctor's check) holds its jobs."""

import time

import pytest

from agent import doctor, poll
from agent.config import AgentConfig
from agent.daemon import Agent
from coordinator.ingest import CLOCK_BOUND_SECONDS
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.support.agents import identity_for
from tests.support.fleet import SWEEP_YAML, admin_for, enrol, make_run

TEN_MINUTES = 600.0


def test_runs_carry_the_receive_time_and_impossible_agent_times_are_flagged(coordinator):
    agent = enrol(coordinator, "clocks")
    admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    job = agent.acquire_job(1).job
    with coordinator.store.reader() as con:
        (sweep_created,) = con.execute("SELECT created_at FROM sweeps").fetchone()
    sent = {
        "right": time.time() - 1.0,  # started a second ago on a clock that agrees
        "ahead": time.time() + TEN_MINUTES,  # ten minutes ahead: it "ends" after it was received
        "behind": sweep_created - TEN_MINUTES,  # ten minutes behind: it "started" before its sweep
    }
    before = time.time()
    run_ids = {}
    for name, started in sent.items():
        run = make_run(job.job_id, started_at_unix_seconds=started, run_id=f"run-{name}")
        run_ids[f"run-{name}"] = name
        agent.report_result(job.job_id, job.lease_id, run)
    after = time.time()
    with coordinator.store.reader() as con:
        stored = con.execute("SELECT run_id, started_at_unix_seconds, received_at, clock_flag FROM runs").fetchall()
    assert len(stored) == 3
    flags = {}
    for run_id, started, received, flag in stored:
        name = run_ids[run_id]
        assert started == pytest.approx(sent[name])  # the agent's time is kept as it sent it
        assert before <= received <= after  # ... beside the coordinator's
        flags[name] = flag
    assert flags["right"] is None
    assert "after the coordinator received it: the agent's clock is ahead" in flags["ahead"]
    assert "before its sweep existed: the agent's clock is behind" in flags["behind"]
    assert f"bound {CLOCK_BOUND_SECONDS:g} s" in flags["ahead"] and CLOCK_BOUND_SECONDS < TEN_MINUTES


@pytest.mark.process  # the agent's engines are looked for (llama-server --version)
@pytest.mark.parametrize("skew", [TEN_MINUTES, -TEN_MINUTES, 0.0], ids=["ahead", "behind", "right"])
def test_an_agent_whose_clock_is_off_holds_its_jobs(coordinator, tmp_path, skew):
    agent = Agent(
        AgentConfig.load(tmp_path / "agent", {"allow_battery": True}), identity_for(coordinator, tmp_path / "agent")
    )
    try:
        assert agent.clock_hold() == ""  # the real clock of this machine: the coordinator's own
        monotonic = [0.0]
        agent.clock_hold = doctor.clock_hold(agent.api, lambda: time.time() + skew, lambda: monotonic[0])
        held = poll.holding_back(agent)
        assert held is (skew != 0.0)
        if skew:
            assert agent.state.not_starting.startswith(f"this clock is {skew:+.0f}")
            assert "off the coordinator's (at most 30 s)" in agent.status_line()
            assert "network time" in agent.state.not_starting
        # Measured again at every ask while it holds: a clock set right releases the jobs at once.
        agent.clock_hold = doctor.clock_hold(agent.api, time.time, lambda: monotonic[0])
        assert poll.holding_back(agent) is False and agent.state.not_starting == ""
    finally:
        agent.api.close()

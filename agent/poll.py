"""The poll loop: the agent's main loop. It asks the coordinator for a job (a long poll) and runs
each one it gets (agent/runner.py), one at a time, until the agent stops or is told to drain.
While the machine is on battery or in low-power mode, or a machine check of `agent doctor` fails
(another process on the CPU, thermal, disk: agent/doctor.py machine_checks), it asks for nothing
and says why in its status, which the next heartbeat (sent at once) carries to the coordinator.

Retry policy (ACQUIRE): for as long as it takes, backing off to 30 s; a stop ends the wait.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from agent import environment, retry, runner

if TYPE_CHECKING:
    from agent.parts import AgentParts as Agent

log = logging.getLogger("specfleet.agent")

ACQUIRE = retry.Budget(0.5, 30.0, float("inf"))
POLL_WAIT_SECONDS = 20.0
POWER_RECHECK_SECONDS = 15.0
FIRST_BEAT_WAIT_SECONDS = 10.0  # how often an agent holding back (on battery) looks again


def holding_back(agent: Agent) -> bool:
    """Whether the machine is in no state to start a job (battery, low-power mode, or a failed
    check of `agent doctor`'s on what the machine is doing now: agent.doctor_hold, None with `agent
    run --ignore-doctor`, or a clock off the coordinator's: agent.clock_hold, whatever the flags);
    the reason goes into the status, and at once to the coordinator with a heartbeat."""
    reason = None if agent.config.allow_battery else environment.refusal_reason(agent.sample_environment())
    if reason is None and agent.doctor_hold is not None:
        reason = agent.doctor_hold() or None
    if reason is None:
        reason = agent.clock_hold() or None
    with agent.lock:
        changed = (reason or "") != agent.state.not_starting
        agent.state.not_starting = reason or ""
        if reason:
            agent.state.status = f"not starting jobs: {reason}"
    agent.metrics.not_starting.set(1 if reason else 0)
    if changed:
        if reason:
            log.warning("not starting jobs: %s", reason)
        else:
            log.info("the machine is back to normal: taking jobs again")
        agent.beat.set()
    return reason is not None


def loop(agent: Agent) -> None:
    """Acquire and run jobs until the agent stops (InterruptedError when stopped mid-call). The
    first waits for the first heartbeat's answer (at most FIRST_BEAT_WAIT_SECONDS): it says which
    record schema the coordinator reads, before any job is taken."""
    deadline = time.monotonic() + FIRST_BEAT_WAIT_SECONDS
    while not agent.heard.is_set() and not agent.stop.is_set() and time.monotonic() < deadline:
        agent.heard.wait(0.2)
    while not agent.stop.is_set():
        if agent.state.draining:
            log.info("coordinator asked this agent to drain; exiting")
            return
        if holding_back(agent):
            agent.stop.wait(POWER_RECHECK_SECONDS)
            continue
        waiting = agent.uploader.waiting_for()  # jobs it is given are refused, saying so (agent/runner.py)
        with agent.lock:
            agent.state.status = waiting or "waiting for a job"
        resp = retry.call(lambda: agent.api.acquire_job(POLL_WAIT_SECONDS, agent.stop), ACQUIRE, "acquire", agent.stop)
        agent.uploader.coordinator_reads(resp.max_record_schema)  # the very coordinator that hands the job
        if resp.has_job:
            runner.run_job(agent, resp.job)

"""The heartbeat loop: extends the current job's lease, carries the agent's status, and hears
the coordinator's answers (a lease that is gone stops the worker; a drain order ends the agent
after its job; the newest record schema it reads, which releases runs held for an upgrade).

Retry policy (HEARTBEAT): a beat is retried for 20 s at most; the next beat is due anyway, and
a coordinator that stays away lets the lease lapse, which is how it learns the agent is gone.
The interval is the coordinator's (given at enrolment), and never more than a third of the
lease it last answered a beat with (a coordinator restarted with shorter leases keeps them),
less a random 0-20%, so that a fleet started together never beats together and no beat is later
than the coordinator asked.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from agent import retry

if TYPE_CHECKING:
    from agent.parts import AgentParts as Agent

log = logging.getLogger("specfleet.agent")

HEARTBEAT = retry.Budget(0.5, 5.0, 20.0)
JITTER = 0.2  # the share of the interval a wait may be shortened by
BEATS_PER_LEASE = 3  # beats within a lease, at least: two may be lost before it lapses
BEAT_CHECK_SECONDS = 0.2  # how often a wait looks for an early beat (status changed) or a stop


def next_wait(interval_seconds: float, jitter: Callable[[float, float], float] = random.uniform) -> float:
    """Seconds until the next beat: the interval less up to JITTER of it."""
    return interval_seconds * jitter(1.0 - JITTER, 1.0)


def interval(enrolled_seconds: float, lease_seconds: float) -> float:
    """Seconds between beats: the enrolment's interval, at most a third of the lease (0: none known)."""
    return min(enrolled_seconds, lease_seconds / BEATS_PER_LEASE) if lease_seconds > 0 else enrolled_seconds


def _wait_for_beat(agent: Agent, lease_seconds: float) -> None:
    deadline = time.monotonic() + next_wait(interval(agent.identity.heartbeat_interval_seconds, lease_seconds))
    while not agent.stop.is_set() and not agent.beat.is_set() and time.monotonic() < deadline:
        agent.beat.wait(BEAT_CHECK_SECONDS)
    agent.beat.clear()


def loop(agent: Agent) -> None:
    """The heartbeat thread, until the agent stops; anything it does not expect stops the agent."""
    try:
        _beat_until_stopped(agent)
    except Exception as e:  # a bug: say so, with the traceback, rather than let the lease lapse silently
        log.exception("heartbeat failed")
        agent.die(f"heartbeat failed: {type(e).__name__}: {e}")


def _beat_until_stopped(agent: Agent) -> None:
    fingerprint = agent.fingerprint  # sent once, at start; then only the lease and status travel
    lease_seconds = 0.0  # the lease the coordinator last answered with: what a beat extends it to
    while not agent.stop.is_set():
        with agent.lock:
            job_runner = agent.job_runner  # the job beaten for: asked, never reached into
        job_id, lease_id = job_runner.ids if job_runner is not None else ("", "")
        status = agent.status_line()
        try:
            resp = retry.call(
                lambda: agent.api.heartbeat(job_id, lease_id, status, fingerprint), HEARTBEAT, "heartbeat", agent.stop
            )
            fingerprint = None
            if resp.lease_valid:
                lease_seconds = resp.lease_expires_in_seconds
            agent.uploader.coordinator_reads(resp.max_record_schema)
            agent.heard.set()
            with agent.lock:
                agent.state.last_contact = time.time()
                agent.state.draining = resp.drain
                lost = job_runner is not None and job_runner is agent.job_runner and not resp.lease_valid
            if lost:
                log.warning("lease on %s is gone; stopping its worker", job_id)
                job_runner.lease_gone()
        except retry.FatalApiError as e:
            agent.die(str(e))
        except (grpc.RpcError, InterruptedError) as e:
            log.warning("heartbeat failed: %s", e)
        agent.write_status()
        _wait_for_beat(agent, lease_seconds)

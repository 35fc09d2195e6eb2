"""The one place that decides what is retryable, and how a call is retried within its budget.

Authentication and permission errors stop the agent: retrying them only hides a revoked or
wrong credential. An unreachable coordinator (UNAVAILABLE, DEADLINE_EXCEEDED) is no call's
fault: it is retried, with exponential backoff and jitter so that a fleet that lost its
coordinator does not come back in lock-step, until the budget's time is spent (never, for
uploads). A coordinator that answers with a retryable error (RESOURCE_EXHAUSTED, ABORTED,
INTERNAL, UNKNOWN) refuses this very request: such refusals are counted, and at the budget's
`max_refusals` the call gives up with the last error, so that one bad request (a record too
large to take) is never retried forever. DEADLINE_EXCEEDED is either: a call given an `answers`
probe asks the coordinator (a short Ping) whether it answers other calls; if it does, the
coordinator hangs on this very request (a record it cannot store), which counts as a refusal
and, at `max_refusals`, gives up with Unanswered; if it does not, the network is cut, retried as
UNAVAILABLE is. Every budget is data, written beside the loop that
uses it (agent/heartbeat.py, poll.py, runner.py, upload.py); enrolment's is here.

Time comes from a `Clock`, so that tests drive retries without sleeping.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

log = logging.getLogger("specfleet.agent")

UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
RETRYABLE = UNREACHABLE | {
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
}
FATAL = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


PROBE_SECONDS = 5.0  # how long the `answers` probe waits for the coordinator's Ping


class FatalApiError(Exception):
    """The coordinator refuses this agent: stop rather than loop."""


class Unanswered(grpc.RpcError):
    """A call that timed out (DEADLINE_EXCEEDED) `times` times while the coordinator answered
    other calls: it hangs on this request, which is no network cut."""

    def __init__(self, error: grpc.RpcError, times: int):
        super().__init__(error.details())
        self.error, self.times = error, times

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return (
            f"{self.error.details()}; unanswered {self.times} times while the coordinator answered a Ping: "
            "it hangs on this request"
        )

    def trailing_metadata(self):
        return ()


def answers(api) -> Callable[[], bool]:
    """The `answers` probe of call() for an AgentApi: whether the coordinator answers a Ping."""

    def probe() -> bool:
        try:
            api.ping(PROBE_SECONDS)
        except grpc.RpcError:
            return False
        return True

    return probe


@dataclass(frozen=True)
class Budget:
    first_delay_seconds: float
    max_delay_seconds: float
    give_up_after_seconds: float  # inf: for as long as the coordinator is unreachable
    max_refusals: float = math.inf  # retryable answers of a reachable coordinator before giving up


ENROL = Budget(1.0, 30.0, 300.0)  # `specfleet agent enrol`


def _sleep(seconds: float, stop: threading.Event | None) -> bool:
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)


@dataclass(frozen=True)
class Clock:
    """`now()` in monotonic seconds; `sleep(seconds, stop)` returns True when `stop` was set
    (the agent is stopping); `jitter(low, high)` draws a factor for each delay."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float, threading.Event | None], bool] = _sleep
    jitter: Callable[[float, float], float] = random.uniform


REAL_TIME = Clock()


def call(
    fn,
    budget: Budget,
    what: str,
    stop: threading.Event | None = None,
    clock: Clock = REAL_TIME,
    answers: Callable[[], bool] | None = None,
):
    """Run fn() until it succeeds, a non-retryable error occurs, or the budget is spent (then
    the last error is raised). FatalApiError for a refused credential; InterruptedError when
    `stop` is set while waiting to retry. `answers()`: whether the coordinator answers other
    calls, asked after a DEADLINE_EXCEEDED (a yes counts as a refusal); Unanswered when such a
    timeout is the refusal that spends max_refusals."""
    start = clock.now()
    delay = budget.first_delay_seconds
    refusals = unanswered = 0
    while True:
        try:
            return fn()
        except grpc.RpcError as e:
            code = e.code()
            if code in FATAL:
                raise FatalApiError(f"{what}: {code.name}: {e.details()}") from None
            if code not in RETRYABLE:
                raise
            hung = code == grpc.StatusCode.DEADLINE_EXCEEDED and answers is not None and answers()
            unanswered += hung
            refusals += code not in UNREACHABLE or hung
            if refusals >= budget.max_refusals and hung:
                raise Unanswered(e, unanswered) from None
            if refusals >= budget.max_refusals or clock.now() - start + delay > budget.give_up_after_seconds:
                raise
            if hung:
                log.warning("%s: no answer in time though the coordinator answers a Ping", what)
            log.warning("%s: %s (%s); retrying in %.1fs", what, code.name, e.details(), delay)
        if clock.sleep(delay * clock.jitter(0.5, 1.0), stop):
            raise InterruptedError(f"{what}: agent stopping")
        delay = min(delay * 2, budget.max_delay_seconds)


def refusal(error: grpc.RpcError, budget: Budget) -> str:
    """Why a call was given up, for a log line or a job's failure: the code, the coordinator's
    words, and how often it refused when the budget ran out on refusals."""
    code = error.code()
    reason = f"{code.name}: {error.details()}"
    if code in RETRYABLE and code not in UNREACHABLE:
        reason += f" (refused {budget.max_refusals:g} times)"
    return reason

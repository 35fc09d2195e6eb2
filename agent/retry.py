"""The one place that decides what is retryable, and how a call is retried within its budget.

Authentication and permission errors stop the agent: retrying them only hides a revoked or
wrong credential. An unreachable coordinator (UNAVAILABLE, DEADLINE_EXCEEDED) is no call's
fault: it is retried, with exponential backoff and jitter so that a fleet that lost its
coordinator does not come back in lock-step, until the budget's time is spent (never, for
uploads). A coordinator that answers with a retryable error (RESOURCE_EXHAUSTED, ABORTED,
INTERNAL, UNKNOWN) refuses this very request: such refusals are counted, and at the budget's
`max_refusals` the call gives up with the last error, so that one bad request (a record too
large to take) is never retried forever. Every budget is data, written beside the loop that
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


class FatalApiError(Exception):
    """The coordinator refuses this agent: stop rather than loop."""


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


def call(fn, budget: Budget, what: str, stop: threading.Event | None = None, clock: Clock = REAL_TIME):
    """Run fn() until it succeeds, a non-retryable error occurs, or the budget is spent (then
    the last error is raised). FatalApiError for a refused credential; InterruptedError when
    `stop` is set while waiting to retry."""
    start = clock.now()
    delay = budget.first_delay_seconds
    refusals = 0
    while True:
        try:
            return fn()
        except grpc.RpcError as e:
            code = e.code()
            if code in FATAL:
                raise FatalApiError(f"{what}: {code.name}: {e.details()}") from None
            if code not in RETRYABLE:
                raise
            refusals += code not in UNREACHABLE
            if refusals >= budget.max_refusals or clock.now() - start + delay > budget.give_up_after_seconds:
                raise
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

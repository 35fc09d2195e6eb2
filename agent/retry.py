"""The one place that decides what is retryable, and how long to keep trying.

Authentication and permission errors stop the agent: retrying them only hides a revoked or
wrong credential. Unavailability and timeouts are retried with exponential backoff and jitter,
so a fleet that lost its coordinator does not come back in lock-step.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass

import grpc

log = logging.getLogger("specfleet.agent")

RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
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
    give_up_after_seconds: float  # inf: until it works (uploads, enrolment)


UPLOAD = Budget(0.5, 60.0, float("inf"))
ENROL = Budget(1.0, 30.0, 300.0)
HEARTBEAT = Budget(0.5, 5.0, 20.0)
JOB_STATE = Budget(0.5, 30.0, float("inf"))  # acquire, complete, fail


def call(fn, budget: Budget, what: str, stop: threading.Event | None = None):
    """Run fn() until it succeeds, a non-retryable error occurs, or the budget is spent."""
    start = time.monotonic()
    delay = budget.first_delay_seconds
    while True:
        try:
            return fn()
        except grpc.RpcError as e:
            code = e.code()
            if code in FATAL:
                raise FatalApiError(f"{what}: {code.name}: {e.details()}") from None
            if code not in RETRYABLE or time.monotonic() - start + delay > budget.give_up_after_seconds:
                raise
            log.warning("%s: %s (%s); retrying in %.1fs", what, code.name, e.details(), delay)
        if stop is not None and stop.wait(delay * random.uniform(0.5, 1.0)):
            raise InterruptedError(f"{what}: agent stopping")
        elif stop is None:
            time.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, budget.max_delay_seconds)

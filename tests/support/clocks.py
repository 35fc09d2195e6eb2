"""A fake clock: time that moves only when a test says so, or when something sleeps on it."""

from __future__ import annotations

from types import SimpleNamespace


class FakeClock:
    """Called, it is the time now (a `clock=` argument: coordinator/scheduler.py and the like);
    as_time_module() stands in for a module's `time` (monkeypatch.setattr(module, "time", ...))."""

    def __init__(self, now: float = 1_000_000.0):
        self.now, self.sleeps = now, []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def as_time_module(self) -> SimpleNamespace:
        return SimpleNamespace(time=self, monotonic=self, perf_counter=self, sleep=self.sleep)

    def retry_clock(self):
        """This clock as agent/retry.py's Clock: sleeping moves it (and answers whether `stop` is
        set); the jitter is the top of its range, so that waits are exact."""
        from agent import retry

        def sleep(seconds, stop):
            self.sleep(seconds)
            return stop is not None and stop.is_set()

        return retry.Clock(now=self, sleep=sleep, jitter=lambda low, high: high)

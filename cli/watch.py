"""`specfleet sweep status --watch` (and the demo's progress): a sweep's progress until it ends.

The coordinator is asked every POLL_SECONDS (GetSweep, or ListSweeps for every running sweep);
what it answers is shown two ways. On a terminal, rich progress bars redrawn in place: one per
sweep (runs stored of runs expected, jobs finished, ETA) and one per agent working on it (its
cell, the arm of its latest stored run, the job's runs); failures are printed above the bars as
they happen, with their reasons. Piped, one line per change: a sweep's counts, an agent's job or
arm, each new failure, a sweep's end. The ETA is the coordinator's (coordinator/progress.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from protos.specfleet.v1 import fleet_pb2 as pb

POLL_SECONDS = 2.0


def eta_text(seconds: float) -> str:
    """The ETA in words: "ETA 1h02m", "ETA 3m05s", "ETA 12s", or "ETA unknown" (negative)."""
    if seconds < 0:
        return "ETA unknown"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"ETA {hours}h{minutes:02d}m"
    return f"ETA {minutes}m{secs:02d}s" if minutes else f"ETA {secs}s"


def sweep_line(s: pb.SweepStatus) -> str:
    finished = s.jobs_done + s.jobs_failed
    eta = f", {eta_text(s.eta_seconds)}" if s.state == "running" else ""
    failed = f" ({s.jobs_failed} failed)" if s.jobs_failed else ""
    return (
        f"sweep {s.sweep_id} {s.name}: {s.state}, {finished}/{s.jobs_total} jobs finished{failed}, "
        f"{s.runs}/{s.runs_expected} runs stored{eta}"
    )


def agent_line(s: pb.SweepStatus, a: pb.AgentProgress) -> str:
    return (
        f"  {s.sweep_id} agent {a.name} on {a.job_id}: {a.cell}, {f'arm {a.arm}' if a.arm else 'first run not stored'}"
        f", {a.runs}/{a.runs_expected} runs"
    )


def failure_line(s: pb.SweepStatus, failure: str) -> str:
    return f"  {s.sweep_id} failed {failure}"


class Lines:
    """Piped output: a line for each thing that changed since the last update."""

    def __init__(self, console: Console):
        self.console = console
        self.shown: dict[tuple, str] = {}  # what was last printed for a sweep or an agent on it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _print(self, key: tuple, line: str, state: str | None = None) -> None:
        value = line if state is None else state
        if self.shown.get(key) != value:
            self.shown[key] = value
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def update(self, statuses: list[pb.SweepStatus]) -> None:
        for s in statuses:  # a sweep's new failures first: its last line is the state it ended in
            for failure in s.failures:
                self._print(("failure", s.sweep_id, failure), failure_line(s, failure))
            self._print(("sweep", s.sweep_id), sweep_line(s))
            for a in s.agents:  # a line when the agent's job or arm changes, not at each run
                self._print(("agent", s.sweep_id, a.agent_id), agent_line(s, a), f"{a.job_id} {a.arm}")


class Bars:
    """Terminal output: rich progress bars, redrawn in place."""

    def __init__(self, console: Console):
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
        )
        self.tasks: dict[tuple, TaskID] = {}
        self.failures: set[tuple[str, str]] = set()

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()
        return False

    def _task(self, key: tuple, description: str, completed: int, total: int, detail: str) -> None:
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(description, total=total, detail=detail)
        self.progress.update(
            self.tasks[key], description=description, completed=min(completed, total), total=total, detail=detail
        )

    def update(self, statuses: list[pb.SweepStatus]) -> None:
        working = set()
        for s in statuses:
            finished = s.jobs_done + s.jobs_failed
            eta = f", {eta_text(s.eta_seconds)}" if s.state == "running" else ""
            self._task(
                ("sweep", s.sweep_id),
                f"sweep {s.name} ({s.state})",
                s.runs,
                s.runs_expected,
                f"runs; {finished}/{s.jobs_total} jobs finished, {s.jobs_failed} failed{eta}",
            )
            for a in s.agents:
                key = ("agent", s.sweep_id, a.agent_id)
                working.add(key)
                self._task(key, f"  {a.name}: {a.cell}", a.runs, a.runs_expected, a.arm or "first run not stored")
            for failure in s.failures:
                if (s.sweep_id, failure) not in self.failures:
                    self.failures.add((s.sweep_id, failure))
                    self.progress.console.print(failure_line(s, failure), markup=False, highlight=False)
        for key in [k for k in self.tasks if k[0] == "agent" and k not in working]:
            self.progress.remove_task(self.tasks.pop(key))
        self.progress.refresh()


def watch(
    fetch: Callable[[], list[pb.SweepStatus]],
    console: Console,
    interval_seconds: float = POLL_SECONDS,
    check: Callable[[], None] = lambda: None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[pb.SweepStatus]:
    """Show `fetch()`'s sweeps until none is running (bars on a terminal, lines otherwise);
    return their last statuses. `check` runs between polls and may raise to stop watching."""
    with Bars(console) if console.is_terminal else Lines(console) as view:
        while True:
            statuses = fetch()
            view.update(statuses)
            if all(s.state != "running" for s in statuses):
                return statuses
            check()
            sleep(interval_seconds)

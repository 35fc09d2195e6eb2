"""Work that follows a mirror's sync: figures and counts computed from what the sync added, so
that a page reads them instead of computing them at its first render.

`attach(mirror, *tasks)`: every `task(seqs)` (seqs: Mirror.sync's tables and sequences) runs
after each sync of `mirror`. After the mirror's first sync they run before sync() returns: a
dashboard's start, whose pages open on them done as they open on the first sync's tables. After
a later sync they run on one worker thread of the mirror's, so that no page's rerun waits for
them; a page that needs a result the worker has not written yet computes it itself, as it would
without the task, and syncs arriving while the worker is busy are taken together. A task's error
is logged and leaves its results as they were (the pages then compute them). `wait(mirror)`: until
the worker has done the last sync's work (tests and benches).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dashboard.mirror import Mirror

log = logging.getLogger(__name__)
Task = Callable[[dict[str, int]], None]


class _Worker:
    """Mirror.after_sync's entry for attach: the tasks, and the thread that runs them after
    every sync but the first."""

    def __init__(self, tasks: tuple[Task, ...]):
        self.tasks = tasks
        self.first = True
        self.pending: dict[str, int] | None = None
        self.busy = False
        self.changed = threading.Condition()
        self.thread: threading.Thread | None = None

    def __call__(self, seqs: dict[str, int]) -> None:
        if self.first:
            self.first = False
            self._run(seqs)
            return
        with self.changed:
            self.pending = seqs
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="specfleet-after-sync", daemon=True)
                self.thread.start()
            self.changed.notify_all()

    def _run(self, seqs: dict[str, int]) -> None:
        for task in self.tasks:
            try:
                task(seqs)
            except Exception:
                log.exception("after a sync, %s failed: the pages compute what it would have", task)

    def _loop(self) -> None:
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.pending is not None)
                seqs, self.pending, self.busy = self.pending, None, True
            try:
                self._run(seqs)
            finally:
                with self.changed:
                    self.busy = False
                    self.changed.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.pending is None and not self.busy, timeout)


def attach(mirror: Mirror, *tasks: Task) -> None:
    """Run `tasks` after every sync of `mirror` (the module docstring)."""
    mirror.after_sync.append(_Worker(tasks))


def wait(mirror: Mirror, timeout: float | None = 600) -> bool:
    """Until every task attached to `mirror` has run after its last sync; False on timeout."""
    return all(w.wait(timeout) for w in mirror.after_sync if isinstance(w, _Worker))

"""The lake store's upkeep, run by each coordinator on a schedule (`--lake-upkeep-seconds`):
DuckLake's `ducklake_flush_inlined_data` (rows inlined in the catalog into Parquet files),
`ducklake_merge_adjacent_files` (small files into larger ones), `ducklake_expire_snapshots` and
`ducklake_cleanup_old_files` (snapshots, and files only they reference, older than KEEP_SECONDS).
None of them removes a row that the newest snapshot holds.

So that it never stops the coordinator: each pass runs in a thread of its own on a DuckDB of its
own attached to the lake (never the store's connection, whose writers go on meanwhile), and each
call is bounded: PostgreSQL's lock_timeout (LOCK_SECONDS) and statement_timeout (CALL_SECONDS) on
that attachment's catalog connection, and an interrupt of the DuckDB call at CALL_SECONDS (a wait
inside DuckDB). A call that fails (a timeout, a commit that lost to another coordinator's) is
logged, the others still run, and the next pass tries again.

Measured (tests/test_lake.py): ducklake_flush_inlined_data drops the superseded inlined-data tables
in the catalog (DROP TABLE: an ACCESS EXCLUSIVE lock), which waits for every other catalog session
that has read that table and is still in a transaction, as the other coordinators' stores are:
unbounded, that was the wait without end (docs/scale.md §7). Bounded, it fails after
LOCK_SECONDS and is retried at the next pass; it succeeds when no other coordinator holds it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, replace
from urllib.parse import quote

from coordinator import lake

log = logging.getLogger("specfleet.coordinator")

CALL_SECONDS = 120.0  # the bound on each call
# PostgreSQL's lock_timeout: a call waiting for another coordinator's lock gives up this soon, so
# that its queued request (an ACCESS EXCLUSIVE one queues the others' reads behind it) stalls
# nobody for longer.
LOCK_SECONDS = 2.0
KEEP_SECONDS = 3600  # snapshots younger than this stay (readers of an older snapshot keep their files)
CALLS = (
    "CALL ducklake_flush_inlined_data('lake')",
    "CALL ducklake_merge_adjacent_files('lake')",
    f"CALL ducklake_expire_snapshots('lake', older_than => now() - INTERVAL {KEEP_SECONDS} SECOND)",
    f"CALL ducklake_cleanup_old_files('lake', older_than => now() - INTERVAL {KEEP_SECONDS} SECOND)",
)


class UpkeepFailed(RuntimeError):
    """The lake could not be attached for a pass: named, with why."""


@dataclass(frozen=True)
class Pass:
    took: dict[str, float]  # call -> seconds, of those that succeeded
    failed: dict[str, str]  # call -> why, of those that failed or outlasted their bound


def bounded(url: lake.LakeUrl, seconds: float, lock_seconds: float = LOCK_SECONDS) -> lake.LakeUrl:
    """The lake's URL with PostgreSQL's statement and lock timeouts on its catalog connection."""
    options = quote(f"-c statement_timeout={int(seconds * 1000)} -c lock_timeout={int(lock_seconds * 1000)}", safe="")
    joiner = "&" if "?" in url.postgres else "?"
    return replace(url, postgres=f"{url.postgres}{joiner}options={options}")


def name_of(call: str) -> str:
    return call.split("(", 1)[0].removeprefix("CALL ")


def run_once(url: lake.LakeUrl, call_seconds: float = CALL_SECONDS) -> Pass:
    """One pass: each of CALLS, one after another, each bounded; one that fails does not keep the
    others from running. UpkeepFailed when the lake cannot be attached."""
    try:
        con = lake.connect(bounded(url, call_seconds))
    except Exception as e:  # the attachment reads the newest snapshot: it waits on locks too
        raise UpkeepFailed(f"attaching the lake failed: {_line(e)}") from e
    took, failed = {}, {}
    try:
        for call in CALLS:
            timer = threading.Timer(call_seconds, con.interrupt)
            timer.start()
            started = time.monotonic()
            try:
                con.execute(call)
                took[name_of(call)] = time.monotonic() - started
            except Exception as e:  # duckdb's errors, an interrupt among them
                failed[name_of(call)] = f"failed after {time.monotonic() - started:.1f} s: {_line(e)}"
            finally:
                timer.cancel()
    finally:
        con.close()
    return Pass(took, failed)


def _line(e: BaseException, keep: int = 160) -> str:
    """The error on one line: its start and its end (where PostgreSQL's own reason is)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 2 * keep else f"{text[:keep]} ... {text[-keep:]}"


class Upkeep:
    """run_once every `interval_seconds` (each wait jittered by up to a tenth, so that the
    coordinators of one lake drift apart) in a daemon thread, until stop()."""

    def __init__(self, url: lake.LakeUrl, interval_seconds: float, call_seconds: float = CALL_SECONDS):
        self.url = url
        self.interval_seconds = interval_seconds
        self.call_seconds = call_seconds
        self.passes = 0  # completed (some of their calls may have failed)
        self.failures = 0  # passes that could not attach, or had a call fail
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lake-upkeep", daemon=True)

    def start(self) -> Upkeep:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_seconds * random.uniform(0.9, 1.0)):
            try:
                done = run_once(self.url, self.call_seconds)
            except Exception as e:
                self.failures += 1
                log.warning("lake upkeep: %s; the next pass tries again", e)
                continue
            self.passes += 1
            self.failures += bool(done.failed)
            log.info("lake upkeep: %s", ", ".join(f"{name} {s:.2f} s" for name, s in done.took.items()) or "nothing")
            for name, why in done.failed.items():
                log.warning("lake upkeep: %s %s; the next pass tries again", name, why)

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the call in progress (each is bounded by call_seconds)."""
        self._stopping.set()
        if self._thread.ident is not None:
            self._thread.join(timeout if timeout is not None else self.call_seconds + 5)

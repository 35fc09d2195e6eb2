"""The upload loop: empties the spool, oldest record first, whenever it holds anything.

Retry policy (UPLOAD): while the coordinator is unreachable a record is retried for as long as
it takes (nothing measured is lost to an outage); a coordinator that answers a record with a
retryable error (RESOURCE_EXHAUSTED for a record past its message limit) is given five tries,
8-15 s in all (a coordinator shedding load should answer UNAVAILABLE, which never counts).
A record is parked (moved aside with its reason, agent/spool.py) when the coordinator refuses
it for good (INVALID_ARGUMENT, FAILED_PRECONDITION for a lease that is gone), when its tries are
spent, or when it cannot be read here; every park is logged and remembered, so that the job it
belongs to fails naming it and the heartbeat's status reports it. No record blocks the ones
behind it. Anything else that goes wrong stops the agent with the file named (UploadFailed):
the uploader never dies silently.

A record of a newer schema than the coordinator reads (it says which at enrolment, in every
heartbeat answer, and in the refusal of such a record) is held: it stays in `pending/`, is
neither sent nor parked, and the uploader's own `flush()` waits, sending the other records,
until a heartbeat says the coordinator reads it (it was upgraded); then it goes up. The wait
holds no lock: a job's end flushes with `wait_for_held=False` and ends the job "held" with the
count (agent/runner.py), so a held record never keeps a job from ending. The log says so once
per record, and the status and `specfleet_agent_runs_held` say how many are held and why.
While the coordinator reads an older schema than this agent writes, `waiting_for()` says so:
the agent refuses the jobs it is given (agent/runner.py) rather than measure runs it cannot store.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client import Gauge

from agent import retry, spool
from agent.metrics import AgentMetrics
from specfleet import record
from specfleet.client import AgentApi

log = logging.getLogger("specfleet.agent")

UPLOAD = retry.Budget(0.5, 60.0, float("inf"), max_refusals=5)
IDLE_CHECK_SECONDS = 1.0  # how often an idle uploader looks at the spool unasked
HELD_CHECK_SECONDS = 1.0  # how often a flush holding records looks whether the coordinator reads them now
# The trailing metadata of a record refused as too new: the newest schema the coordinator reads
# (coordinator/service.py READABLE_SCHEMA_KEY).
READABLE_SCHEMA_KEY = "specfleet-max-record-schema"


class UploadFailed(Exception):
    """Something the uploader does not expect went wrong with a spool file (named)."""


@dataclass(frozen=True)
class Parked:
    run_id: str
    job_id: str  # "" when the file could not be read far enough to tell
    reason: str


def record_schema(record_json: str) -> int | None:
    """The schema a spooled record names; None when it names none (the coordinator judges it)."""
    try:
        schema = json.loads(record_json).get("schema")
    except (ValueError, AttributeError):
        return None
    return schema if isinstance(schema, int) and not isinstance(schema, bool) else None


def readable_schema(error: grpc.RpcError) -> int | None:
    """The newest schema a coordinator reads, from its refusal of a record too new; None when
    the refusal is of another kind."""
    for key, value in getattr(error, "trailing_metadata", lambda: None)() or ():
        if key == READABLE_SCHEMA_KEY and value.isdigit():
            return int(value)
    return None


class Uploader:
    def __init__(self, api: AgentApi, records: spool.Spool, stop: threading.Event, metrics: AgentMetrics):
        self.api, self.spool, self.stop, self.metrics = api, records, stop, metrics
        self.parked: list[Parked] = []  # every park since start, in order
        self.last_upload = 0.0  # unix seconds of the last acknowledgement; 0: never
        self.wake = threading.Event()  # set to look at the spool now
        self._lock = threading.Lock()  # the uploader thread and the job runner both flush
        # The newest record schema the coordinator reads, as it last said (0: it has not said).
        self.coordinator_schema = 0
        self.record_schema = record.SCHEMA_VERSION  # the schema this agent's worker writes
        self.held: dict[str, int] = {}  # run id -> record schema, of the records held at the last pass
        self._held_jobs: dict[str, str] = {}  # run id -> job id, of every record ever held
        self._told_held: set[str] = set()  # held records already logged
        Gauge(
            "specfleet_agent_runs_held",
            "Runs held in the spool because the coordinator does not read their record schema yet",
            registry=metrics.registry,
        ).set_function(lambda: len(self.held))

    def coordinator_reads(self, schema: int) -> None:
        """The coordinator said the newest record schema it reads (0: it says nothing, an older
        coordinator; what it said before stands)."""
        if schema and schema != self.coordinator_schema:
            self.coordinator_schema = schema
            if any(held <= schema for held in self.held.values()):
                log.info("the coordinator reads record schema %d now: uploading the runs held for it", schema)
                self.wake.set()

    def waiting_for(self) -> str:
        """Why this agent takes no job now: the coordinator reads an older record schema than it
        writes; "" when it reads this agent's (or has not said)."""
        if 0 < self.coordinator_schema < self.record_schema:
            return (
                f"waiting for the coordinator to read record schema {self.record_schema} "
                f"(it reads up to {self.coordinator_schema}): upgrade the coordinator"
            )
        return ""

    def held_for(self, job_id: str) -> int:
        """How many of the job's runs are held now."""
        return sum(1 for run_id in dict(self.held) if self._held_jobs.get(run_id) == job_id)

    def held_reason(self) -> str:
        """Why runs are held, for the status; "" when none is."""
        held = dict(self.held)
        if not held:
            return ""
        runs = "run" if len(held) == 1 else "runs"
        return (
            f"{len(held)} {runs} held: record schema {max(held.values())} is newer than the coordinator reads "
            f"({self.coordinator_schema}); they go up when it is upgraded"
        )

    def flush(self, wait_for_held: bool = True) -> int:
        """Upload every pending record, parking those that will never go; returns the uploads.
        While records are held for a coordinator upgrade it waits (unless `wait_for_held` is
        False), uploading what else comes, until they went up; the wait holds no lock. Raises
        InterruptedError (stopping), FatalApiError (credential refused), UploadFailed."""
        done = 0
        while True:
            with self._lock:
                held: dict[str, int] = {}
                for path in self.spool.paths():
                    done += self._upload(path, held)
                self.held = held
            if not held or not wait_for_held:
                return done
            if self.stop.wait(HELD_CHECK_SECONDS):
                raise InterruptedError("agent stopping with runs held")

    def _upload(self, path: Path, held: dict[str, int]) -> int:
        try:
            item = spool.read(path)
        except spool.Unreadable as e:
            self._park(path, e.job_id, f"unreadable: {e.reason}")
            return 0
        schema = record_schema(item.record_json)
        if schema is not None and 0 < self.coordinator_schema < schema:
            self._hold(item, schema, held)
            return 0
        try:
            retry.call(
                lambda: self.api.report_result(item.job_id, item.lease_id, item.record_json),
                UPLOAD,
                f"upload {item.run_id}",
                self.stop,
                answers=retry.answers(self.api),  # a record the coordinator hangs on is refused, not a cut
            )
        except grpc.RpcError as e:
            if (readable := readable_schema(e)) is not None and schema is not None:
                self.coordinator_schema = readable
                self._hold(item, schema, held)
            else:
                self._park(path, item.job_id, retry.refusal(e, UPLOAD))
            return 0
        except (InterruptedError, retry.FatalApiError):
            raise
        except Exception as e:
            raise UploadFailed(f"uploading {path}: {type(e).__name__}: {e}") from e
        self.spool.ack(item)
        self.last_upload = time.time()
        self.metrics.runs_uploaded.inc()
        self.metrics.last_upload.set(self.last_upload)
        return 1

    def _hold(self, item: spool.Spooled, schema: int, held: dict[str, int]) -> None:
        held[item.run_id] = schema
        self._held_jobs[item.run_id] = item.job_id
        if item.run_id not in self._told_held:
            self._told_held.add(item.run_id)
            log.warning(
                "run %s held in the spool: its record schema %d is newer than the coordinator reads (%d); "
                "it is uploaded once the coordinator is upgraded",
                item.run_id,
                schema,
                self.coordinator_schema,
            )

    def _park(self, path: Path, job_id: str, reason: str) -> None:
        try:
            kept = self.spool.park(path, reason)
        except OSError as e:
            raise UploadFailed(f"parking {path} ({reason}): {e}") from e
        log.error("run %s parked in %s: %s", path.stem, kept, reason)
        self.parked.append(Parked(path.stem, job_id, reason))

    def parked_since(self, mark: int, job_id: str) -> list[Parked]:
        """The runs parked since `mark` (a length of `parked`) that are the job's, or no one's known."""
        return [p for p in self.parked[mark:] if p.job_id in (job_id, "")]

    def loop(self, die: Callable[[str], None]) -> None:
        """The uploader thread: flush whenever woken (or every second); `die(reason)` stops the agent."""
        while not self.stop.is_set():
            self.wake.wait(timeout=IDLE_CHECK_SECONDS)
            self.wake.clear()
            try:
                self.flush()
            except InterruptedError:
                return
            except (retry.FatalApiError, UploadFailed) as e:
                return die(str(e))
            except Exception as e:  # a bug: say so, with the traceback, and stop the agent
                log.exception("uploader failed")
                return die(f"uploader failed: {type(e).__name__}: {e}")

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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent import retry, spool
from agent.api import AgentApi
from agent.metrics import AgentMetrics

log = logging.getLogger("specfleet.agent")

UPLOAD = retry.Budget(0.5, 60.0, float("inf"), max_refusals=5)
IDLE_CHECK_SECONDS = 1.0  # how often an idle uploader looks at the spool unasked


class UploadFailed(Exception):
    """Something the uploader does not expect went wrong with a spool file (named)."""


@dataclass(frozen=True)
class Parked:
    run_id: str
    job_id: str  # "" when the file could not be read far enough to tell
    reason: str


class Uploader:
    def __init__(self, api: AgentApi, records: spool.Spool, stop: threading.Event, metrics: AgentMetrics):
        self.api, self.spool, self.stop, self.metrics = api, records, stop, metrics
        self.parked: list[Parked] = []  # every park since start, in order
        self.last_upload = 0.0  # unix seconds of the last acknowledgement; 0: never
        self.wake = threading.Event()  # set to look at the spool now
        self._lock = threading.Lock()  # the uploader thread and the job runner both flush

    def flush(self) -> int:
        """Upload every pending record, parking those that will never go; returns the uploads.
        Raises InterruptedError (stopping), FatalApiError (credential refused), UploadFailed."""
        with self._lock:
            done = 0
            for path in self.spool.paths():
                done += self._upload(path)
            return done

    def _upload(self, path: Path) -> int:
        try:
            item = spool.read(path)
        except spool.Unreadable as e:
            self._park(path, e.job_id, f"unreadable: {e.reason}")
            return 0
        try:
            retry.call(
                lambda: self.api.report_result(item.job_id, item.lease_id, item.record_json),
                UPLOAD,
                f"upload {item.run_id}",
                self.stop,
            )
        except grpc.RpcError as e:
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

"""Ingestion of runs: validate every record, store once per run id, refuse stale leases.

A run arrives as a `RunRecord` in JSON (specfleet/record.py); the record's own constructor
validates every field. It is stored as one column per leaf field (`RunRecord.row()`) beside
the coordinator's columns, with the SHA-256 of the record as uploaded. A run id uploaded again
is a retry when its SHA-256 is the stored one (acknowledged as a duplicate) and refused when it
differs: one id names one run. Each batch of new runs is added to the /metrics figures
(coordinator/figures.py) as it is stored.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

import duckdb

from coordinator import figures
from coordinator.scheduler import Scheduler, SchedulerError
from coordinator.store import placeholders
from specfleet.record import InvalidRecord, RunRecord

MAX_RECORD_BYTES = 256 * 1024
log = logging.getLogger(__name__)


class InvalidRun(ValueError):
    pass


def parse(record_json: str) -> RunRecord:
    """The record of one upload; InvalidRun naming what is wrong with it."""
    if len(record_json) > MAX_RECORD_BYTES:
        raise InvalidRun(f"run record is {len(record_json)} bytes; at most {MAX_RECORD_BYTES}")
    try:
        return RunRecord.from_json(record_json)
    except InvalidRecord as e:
        raise InvalidRun(str(e)) from None


@dataclass(frozen=True)
class Report:
    """One ReportResult call: who sent it, for which job and lease, and the record as JSON."""

    agent_id: str
    job_id: str
    lease_id: str
    record_json: str


# The coordinator's columns, then the record's: the table's column names (migration 002).
COORDINATOR_COLUMNS = ("lease_id", "sweep_id", "agent_id", "chip", "record_sha256", "ingested_at")
RUN_COLUMNS = (*RunRecord.columns(), *COORDINATOR_COLUMNS, "seq")


def ingest(scheduler: Scheduler, agent_id: str, job_id: str, lease_id: str, record_json: str) -> tuple[bool, int]:
    """Store one run; return (duplicate, ingest sequence). Idempotent on run_id."""
    (result,) = ingest_many(scheduler, [Report(agent_id, job_id, lease_id, record_json)])
    if isinstance(result, Exception):
        raise result
    return result


def ingest_many(scheduler: Scheduler, reports: list[Report]) -> list[tuple[bool, int] | Exception]:
    """Store many runs in one transaction; per report (duplicate, ingest sequence), or the
    InvalidRun / SchedulerError that refused it. A refused report does not affect the others."""
    results: list[tuple[bool, int] | Exception | None] = [None] * len(reports)
    records: list[RunRecord | None] = [None] * len(reports)
    digests = [hashlib.sha256(r.record_json.encode()).hexdigest() for r in reports]
    for i, r in enumerate(reports):
        try:
            records[i] = parse(r.record_json)
            if records[i].job_id != r.job_id:
                raise InvalidRun(f"record job_id {records[i].job_id!r} differs from the request's job_id {r.job_id!r}")
        except InvalidRun as e:
            results[i] = e
    todo = [i for i, res in enumerate(results) if res is None]
    if not todo:
        return results
    now = time.time()
    stored = {}  # run id -> (seq, agent id, record sha256) of the runs in this batch that are stored
    # One statement inserts the new runs: it commits on its own, and the store's lock keeps
    # every other writer out between the leases' check and the insert.
    with scheduler.store.autocommit() as con:
        rows = {}  # run id -> (report index, column values): the copy of each run to insert
        for i in todo:
            r = reports[i]
            run = records[i]
            if run.run_id in rows:  # the same run twice in one batch: the second is a retry (below)
                continue
            try:
                lease = scheduler.lease(con, r.agent_id, r.job_id, r.lease_id)
            except SchedulerError as e:
                results[i] = e  # unless the run is stored already: then a retry (below)
                continue
            values = run.row()
            values.update(
                lease_id=r.lease_id,
                sweep_id=lease.sweep_id,
                agent_id=r.agent_id,
                chip=lease.chip,
                record_sha256=digests[i],
                ingested_at=now,
            )
            rows[run.run_id] = (i, [values[c] for c in RUN_COLUMNS[:-1]])
        if rows:
            columns = [list(column) for column in zip(*(v for _, v in rows.values()))]
            run_ids = columns[0]
            try:  # one list parameter per column: DuckDB reads the rows without calling back into Python
                inserted = con.execute(INSERT_BATCH + " RETURNING run_id, seq", columns).fetchall()
            except duckdb.ConstraintException:  # a retry of a stored run: the statement stored
                inserted = con.execute(  # nothing; insert the others (checking costs 2-3 ms)
                    INSERT_BATCH + f" WHERE b.run_id NOT IN (SELECT run_id FROM runs WHERE run_id IN"
                    f" {placeholders(run_ids)}) RETURNING run_id, seq",
                    columns + run_ids,
                ).fetchall()
            for run_id, seq in inserted:
                i = rows[run_id][0]
                results[i] = (False, seq)
                stored[run_id] = (seq, reports[i].agent_id, digests[i])
            if inserted:
                _update_figures(con, min(s for _, s in inserted), max(s for _, s in inserted))
        earlier = list({records[i].run_id for i in todo} - stored.keys())  # retries, refusals
        if earlier:
            stored.update(
                (run_id, (seq, agent_id, sha256))
                for run_id, seq, agent_id, sha256 in con.execute(
                    f"SELECT run_id, seq, agent_id, record_sha256 FROM runs WHERE run_id IN {placeholders(earlier)}",
                    earlier,
                ).fetchall()
            )
    for i in todo:
        r, run_id = reports[i], records[i].run_id
        if isinstance(results[i], tuple) or run_id not in stored:
            continue  # stored now, or refused
        seq, owner, sha256 = stored[run_id]
        if owner != r.agent_id:
            results[i] = InvalidRun(f"run id {run_id} was already stored by another agent")
        elif sha256 and sha256 != digests[i]:  # '' : a schema-1 run, stored before digests were kept
            results[i] = InvalidRun(
                f"run id {run_id} was already stored with other content (sha256 {sha256[:16]}..., this upload "
                f"{digests[i][:16]}...); a run id names one run: a new measurement needs a new id"
            )
        else:
            results[i] = (True, seq)  # a retry: acknowledged, never stored twice
    return results


def _update_figures(con, lo: int, hi: int) -> None:
    """Add the batch to the /metrics figures (coordinator/figures.py) in a transaction of its
    own, after the runs' insert committed: should it fail, the runs stay stored, the figures
    lag, and the next start rebuilds them from runs (figures.ensure)."""
    try:
        con.execute("BEGIN")
        figures.update(con, lo, hi)
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        log.exception("the /metrics figures missed runs %d..%d; they are rebuilt at the next start", lo, hi)


# One list parameter per column; DuckDB takes each list's type from its Python values (casts
# written into the statement cost 2 ms a batch to bind) and the insert casts to the table's.
BATCH_SELECT = "SELECT " + ", ".join(f"unnest(?) AS {name}" for name in RUN_COLUMNS[:-1])  # all but seq
INSERT_BATCH = f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) SELECT *, nextval('ingest_seq') FROM ({BATCH_SELECT}) b"

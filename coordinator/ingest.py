"""Ingestion of runs: validate every record, store once per run id, refuse stale leases.

A run arrives as a `RunRecord` in JSON (specfleet/record.py); the record's own constructor
validates every field. It is stored as one column per leaf field (`RunRecord.row()`) beside
the coordinator's columns, with the SHA-256 of the record as uploaded. A run id uploaded again
is a retry when its SHA-256 is the stored one (acknowledged as a duplicate) and refused when it
differs: one id names one run. Ingest stores runs only: the /metrics figures
(coordinator/figures.py) catch up with them when a scrape is due (Store.catch_up_figures), in
one update for all the runs since the last, not once per batch (an update costs several
statements over the touched prompts' runs, and agents upload one run at a time).

Bad input never costs another record its place: every record is validated (its "schema"
present, every string sendable as UTF-8) before it joins a shared batch, and a batch whose
insert fails for its data is inserted again record by record, so that only the offending
record is refused (InvalidRun). A record of a newer schema than this coordinator reads is
NewerRun: the agent holds it until the coordinator is upgraded. A write the store itself
refuses (disk full, read-only file) is StoreUnavailable for every record of the batch: retried.

Every new run is stored with the coordinator's receive time beside the agent's times, and a
clock flag when those cannot be right on the coordinator's clock (clock_flag): the agent's clock
was off by more than CLOCK_BOUND_SECONDS, at which agents hold their jobs (agent/doctor.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass

import duckdb

from coordinator.scheduler import Scheduler, SchedulerError
from coordinator.store import placeholders, store_fault
from specfleet import record as record_module
from specfleet.record import InvalidRecord, NewerSchema, RunRecord

MAX_RECORD_BYTES = 256 * 1024
log = logging.getLogger(__name__)


class InvalidRun(ValueError):
    pass


class NewerRun(ValueError):
    """A record of a schema newer than this coordinator reads: not wrong, too new. `readable`
    is the newest schema this coordinator reads."""

    def __init__(self, message: str, readable: int):
        super().__init__(message)
        self.readable = readable


def readable_schema() -> int:
    """The newest run-record schema this coordinator reads (sent at enrolment and heartbeats)."""
    return record_module.SCHEMA_VERSION


def unsendable(value, where: str = "record") -> list[str]:
    """The fields of a parsed JSON value holding a string that is not valid UTF-8 (a lone
    surrogate, which JSON's \\ud800 escape can carry): DuckDB cannot store them."""
    if isinstance(value, str):
        return [] if _utf8(value) else [where]
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            name = key if where == "record" else f"{where}.{key}"
            found += unsendable(item, name) if _utf8(key) else [f"a key of {where}"]
        return found
    if isinstance(value, list):
        return [name for i, item in enumerate(value) for name in unsendable(item, f"{where}[{i}]")]
    return []


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse(record_json: str) -> RunRecord:
    """The record of one upload; InvalidRun naming what is wrong with it (every field that is
    not UTF-8), NewerRun for a record of a newer schema than this coordinator reads."""
    if len(record_json) > MAX_RECORD_BYTES:
        raise InvalidRun(f"run record is {len(record_json)} bytes; at most {MAX_RECORD_BYTES}")
    try:
        data = json.loads(record_json)
    except ValueError as e:
        raise InvalidRun(f"run record is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidRun(f"run record is a JSON {type(data).__name__}, not an object")
    bad = unsendable(data)
    if bad:
        raise InvalidRun(f"{', '.join(bad)}: not valid UTF-8 (a lone surrogate)")
    if "schema" not in data:
        raise InvalidRun("schema: is required (every record names its schema version)")
    try:
        return RunRecord.from_dict(data)
    except NewerSchema:
        readable = readable_schema()
        raise NewerRun(
            f"run record schema {data['schema']} is newer than this coordinator reads (schema {readable}): "
            "the agent holds it until the coordinator is upgraded",
            readable,
        ) from None
    except InvalidRecord as e:
        raise InvalidRun(str(e)) from None


@dataclass(frozen=True)
class Report:
    """One ReportResult call: who sent it, for which job and lease, and the record as JSON."""

    agent_id: str
    job_id: str
    lease_id: str
    record_json: str
    received_at: float = 0.0  # the coordinator's clock when the upload arrived; 0: when it is stored


# The coordinator's columns, then the record's: the table's column names (migration 002).
COORDINATOR_COLUMNS = ("lease_id", "sweep_id", "agent_id", "chip", "record_sha256", "ingested_at")
RUN_COLUMNS = (*RunRecord.columns(), *COORDINATOR_COLUMNS, "seq")
# The coordinator's clock beside the agent's (migration 013), stored with every new run: when the
# run was received, and why its agent times cannot be right (NULL when they can be).
CLOCK_COLUMNS = ("received_at", "clock_flag")
# The machine of the run's agent (migration 018: the salted hash of its hardware, or the agent
# itself when it reported none), stamped on every new run: what figures count as machines.
MACHINE_COLUMNS = ("machine_id",)
# The agent's clock may be this far off the coordinator's before a run's times are impossible:
# the bound at which `agent doctor`'s clock check fails and the agent holds its jobs
# (agent/doctor.py CLOCK_FAIL_SECONDS).
CLOCK_BOUND_SECONDS = 30.0


def clock_flag(run: RunRecord, received_at: float, sweep_created_at: float | None) -> str | None:
    """Why the run's times, on its agent's clock, cannot be right on the coordinator's: it ended
    after the coordinator received it, or started before its sweep existed, by more than
    CLOCK_BOUND_SECONDS. None when they can be."""
    ahead = run.started_at_unix_seconds + run.wall_seconds - received_at
    if ahead > CLOCK_BOUND_SECONDS:
        return (
            f"ended {ahead:.0f} s after the coordinator received it: the agent's clock is ahead "
            f"(bound {CLOCK_BOUND_SECONDS:g} s)"
        )
    if sweep_created_at is not None:
        behind = sweep_created_at - run.started_at_unix_seconds
        if behind > CLOCK_BOUND_SECONDS:
            return (
                f"started {behind:.0f} s before its sweep existed: the agent's clock is behind "
                f"(bound {CLOCK_BOUND_SECONDS:g} s)"
            )
    return None


_sweep_created: dict[str, float] = {}  # sweep id -> created_at: never changes once a sweep exists


def _sweep_created_at(con, sweep_id: str) -> float | None:
    if sweep_id not in _sweep_created:
        row = con.execute("SELECT created_at FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchone()
        if row is None:
            return None
        _sweep_created[sweep_id] = row[0]
    return _sweep_created[sweep_id]


def ingest(scheduler: Scheduler, agent_id: str, job_id: str, lease_id: str, record_json: str) -> tuple[bool, int]:
    """Store one run; return (duplicate, ingest sequence). Idempotent on run_id."""
    (result,) = ingest_many(scheduler, [Report(agent_id, job_id, lease_id, record_json)])
    if isinstance(result, Exception):
        raise result
    return result


def ingest_many(scheduler: Scheduler, reports: list[Report]) -> list[tuple[bool, int] | Exception]:
    """Store many runs in one transaction; per report (duplicate, ingest sequence), or the
    InvalidRun / NewerRun / SchedulerError that refused it. A refused report does not affect the
    others; StoreUnavailable (raised) when the store refuses the batch's write."""
    results: list[tuple[bool, int] | Exception | None] = [None] * len(reports)
    records = _parse_all(reports, results)
    digests = [hashlib.sha256(r.record_json.encode()).hexdigest() for r in reports]
    todo = [i for i, res in enumerate(results) if res is None]
    if not todo:
        return results
    _reclaim_lapsed(scheduler, [reports[i] for i in todo])
    # One statement inserts the new runs: it commits on its own, and the store's lock keeps
    # every other writer out between the leases' check and the insert.
    with scheduler.store.autocommit() as con:
        batch = _Batch(reports, records, digests, results)
        rows = _rows(scheduler, con, batch, todo)
        stored = _insert_rows(scheduler, con, batch, rows) if rows else {}
        earlier = list({records[i].run_id for i in todo} - stored.keys())  # retries, refusals
        if earlier:
            stored.update(
                (run_id, (seq, agent_id, sha256))
                for run_id, seq, agent_id, sha256 in con.execute(
                    f"SELECT run_id, seq, agent_id, record_sha256 FROM runs WHERE run_id IN {placeholders(earlier)}",
                    earlier,
                ).fetchall()
            )
    _settle_held(scheduler, [reports[i] for i in todo if isinstance(results[i], tuple)])
    _answer_retries(batch, todo, stored)
    return results


@dataclass
class _Batch:
    """One ingest_many call's reports, their parsed records and digests (by report index), and
    the answers given so far (None: not yet)."""

    reports: list[Report]
    records: list[RunRecord | None]
    digests: list[str]
    results: list


def _parse_all(reports: list[Report], results: list) -> list[RunRecord | None]:
    """Each report's record; None where it was refused, its InvalidRun or NewerRun in `results`."""
    records: list[RunRecord | None] = [None] * len(reports)
    for i, r in enumerate(reports):
        try:
            records[i] = parse(r.record_json)
            if records[i].job_id != r.job_id:
                raise InvalidRun(f"record job_id {records[i].job_id!r} differs from the request's job_id {r.job_id!r}")
        except (InvalidRun, NewerRun) as e:
            results[i] = e
    return records


def _rows(scheduler: Scheduler, con, batch: _Batch, todo: list[int]) -> dict[str, tuple[int, list]]:
    """Run id -> (report index, column values in INSERTED_COLUMNS order) of each run whose lease
    holds (a report refused by its lease gets the SchedulerError, unless the run proves stored
    already: then a retry); the first copy of a run sent twice in the batch."""
    now = time.time()
    rows = {}
    created: dict[str, float | None] = {}  # sweep id -> its creation time (clock_flag)
    machines: dict[str, str] = {}  # agent id -> its machine (one look-up per agent of the batch)
    for i in todo:
        r, run = batch.reports[i], batch.records[i]
        if run.run_id in rows:  # the same run twice in one batch: the second is a retry
            continue
        try:
            lease = scheduler.lease(con, r.agent_id, r.job_id, r.lease_id)
        except SchedulerError as e:
            batch.results[i] = e
            continue
        values = run.row()
        values.update(
            lease_id=r.lease_id,
            sweep_id=lease.sweep_id,
            agent_id=r.agent_id,
            chip=lease.chip,
            record_sha256=batch.digests[i],
            ingested_at=now,
        )
        received = r.received_at or now
        if lease.sweep_id not in created:  # one look-up per sweep of the batch
            created[lease.sweep_id] = _sweep_created_at(con, lease.sweep_id)
        flag = clock_flag(run, received, created[lease.sweep_id])
        if flag:
            log.warning("run %s of agent %s: %s", run.run_id, r.agent_id, flag)
        if r.agent_id not in machines:
            machines[r.agent_id] = _machine_of(con, r.agent_id)
        rows[run.run_id] = (i, [values[c] for c in RUN_COLUMNS[:-1]] + [received, flag, machines[r.agent_id]])
    return rows


def _insert_rows(scheduler: Scheduler, con, batch: _Batch, rows: dict) -> dict[str, tuple[int, str, str]]:
    """Insert the rows in one statement (one by one when the batch's data fails it, so that only
    the offender is refused); run id -> (seq, agent id, record sha256) of each stored now."""
    unique = scheduler.store.unique_keys
    try:
        inserted = _insert(con, [v for _, v in rows.values()], unique)
    except duckdb.Error as e:
        if store_fault(e):
            raise
        log.warning("a batch of %d runs failed (%s); storing them one by one", len(rows), e)
        inserted = []
        for i, values in rows.values():
            try:
                inserted += _insert(con, [values], unique)
            except duckdb.Error as one:
                if store_fault(one):
                    raise
                run_id = batch.records[i].run_id
                batch.results[i] = InvalidRun(f"run {run_id} cannot be stored: {str(one).splitlines()[0]}")
    if inserted:
        scheduler.store.wrote()
    stored = {}
    for run_id, seq in inserted:
        i = rows[run_id][0]
        batch.results[i] = (False, seq)
        stored[run_id] = (seq, batch.reports[i].agent_id, batch.digests[i])
    return stored


def _answer_retries(batch: _Batch, todo: list[int], stored: dict[str, tuple[int, str, str]]) -> None:
    """A report of a run stored before (not now) is a retry, acknowledged with its seq, when the
    same agent stored the same content; refused otherwise."""
    for i in todo:
        r, run_id = batch.reports[i], batch.records[i].run_id
        if isinstance(batch.results[i], tuple) or run_id not in stored:
            continue  # stored now, or refused
        seq, owner, sha256 = stored[run_id]
        if owner != r.agent_id:
            batch.results[i] = InvalidRun(f"run id {run_id} was already stored by another agent")
        elif sha256 and sha256 != batch.digests[i]:  # '' : a schema-1 run, stored before digests were kept
            batch.results[i] = InvalidRun(
                f"run id {run_id} was already stored with other content (sha256 {sha256[:16]}..., this upload "
                f"{batch.digests[i][:16]}...); a run id names one run: a new measurement needs a new id"
            )
        else:
            batch.results[i] = (True, seq)  # a retry: acknowledged, never stored twice


def _reclaim_lapsed(scheduler: Scheduler, reports: list[Report]) -> None:
    """A lease that lapsed while its agent was out of reach is re-claimed by its runs, unless
    another attempt of the job began (Scheduler.reclaim): they are then refused as stale."""
    for key in {(r.agent_id, r.job_id, r.lease_id) for r in reports}:
        if not scheduler.live(*key):
            scheduler.reclaim(*key)


def _settle_held(scheduler: Scheduler, stored: list[Report]) -> None:
    """A held job whose runs have all arrived now is done (Scheduler.settle_held)."""
    scheduler.settle_held({r.lease_id for r in stored if not scheduler.live(r.agent_id, r.job_id, r.lease_id)})


def _machine_of(con, agent_id: str) -> str:
    row = con.execute("SELECT machine_id FROM agents WHERE agent_id = ?", [agent_id]).fetchone()
    return row[0] if row and row[0] else agent_id


def _insert(con, rows: list[list], unique_keys: bool = True) -> list[tuple[str, int]]:
    """Insert rows (column values in INSERTED_COLUMNS order); (run id, seq) of each stored.
    A run id stored already is skipped (a retry). Without unique_keys (a lake table has no key
    to refuse a duplicate: coordinator/lake.py) the stored run ids are always left out first."""
    columns = [list(column) for column in zip(*rows)]
    run_ids = columns[0]
    if unique_keys:
        try:  # one list parameter per column: DuckDB reads the rows without calling back into Python
            return con.execute(INSERT_BATCH + " RETURNING run_id, seq", columns).fetchall()
        except duckdb.ConstraintException:  # a retry of a stored run: the statement stored nothing
            pass
        return con.execute(  # insert the others (checking costs 2-3 ms)
            INSERT_BATCH + f" WHERE b.run_id NOT IN (SELECT run_id FROM runs WHERE run_id IN"
            f" {placeholders(run_ids)}) RETURNING run_id, seq",
            columns + run_ids,
        ).fetchall()
    # A DuckLake insert returns nothing (no RETURNING): the new run ids are those not stored before.
    stored = f"SELECT run_id FROM runs WHERE run_id IN {placeholders(run_ids)}"
    fresh = set(run_ids) - {run_id for (run_id,) in con.execute(stored, run_ids).fetchall()}
    if not fresh:
        return []
    con.execute(INSERT_BATCH, [[c for c, run_id in zip(column, run_ids) if run_id in fresh] for column in columns])
    fresh = list(fresh)
    return con.execute(f"SELECT run_id, seq FROM runs WHERE run_id IN {placeholders(fresh)}", fresh).fetchall()


# One list parameter per column; DuckDB takes each list's type from its Python values (casts
# written into the statement cost 2 ms a batch to bind) and the insert casts to the table's.
INSERTED_COLUMNS = (*RUN_COLUMNS[:-1], *CLOCK_COLUMNS, *MACHINE_COLUMNS)  # all but seq
BATCH_SELECT = "SELECT " + ", ".join(f"unnest(?) AS {name}" for name in INSERTED_COLUMNS)
INSERT_BATCH = (
    f"INSERT INTO runs ({', '.join(INSERTED_COLUMNS)}, seq) SELECT *, nextval('ingest_seq') FROM ({BATCH_SELECT}) b"
)

"""Ingestion of runs: validate every figure, store once per run id, refuse stale leases."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass

import duckdb

from agent.engines import ENGINES
from agent.engines.base import MAX_DEPTH, METHODS, REFERENCE_METHODS, SPECULATIVE_METHODS, VERIFY_COST
from coordinator.scheduler import Scheduler, SchedulerError
from coordinator.store import placeholders

MAX_MAP_ENTRIES = 256
MAX_STRING_CHARS = 4096
MAX_ID_CHARS = 128
MAX_TOKENS = 10_000_000
MAX_SECONDS = 7 * 86400.0
MAX_TOKENS_PER_SECOND = 10_000_000.0
MAX_MEMORY_BYTES = 2**50
MAX_METRIC = 1e15  # metrics are counts, seconds, rates and ratios in base units: never negative
# Metric and parameter names become export columns (metric.<key>, param.<key>).
KEY_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class InvalidRun(ValueError):
    pass


def validate(run) -> None:
    """Raise InvalidRun naming every field that is missing, non-finite, out of range or too large."""
    problems = []

    def bounded(name, value, lo, hi):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
            problems.append(f"{name} = {value!r} is not a finite value in [{lo}, {hi}]")

    def short(name, value, lo=1, hi=MAX_ID_CHARS):
        if not (lo <= len(value) <= hi):
            problems.append(f"{name} must be {lo}-{hi} characters, got {len(value)}")

    short("run_id", run.run_id)
    short("prompt_id", run.prompt_id)
    if run.engine not in ENGINES:
        problems.append(f"engine {run.engine!r} is not one of {', '.join(ENGINES)}")
    if run.method not in (*METHODS, *REFERENCE_METHODS, VERIFY_COST):
        problems.append(f"method {run.method!r} is unknown")
    if run.method in SPECULATIVE_METHODS:
        bounded(f"depth (of {run.method})", run.depth, 1, MAX_DEPTH)
    else:
        bounded(f"depth (of {run.method or 'a run without a method'})", run.depth, 0, 0)
    for name in ("prompt_tokens", "generated_tokens"):
        bounded(name, getattr(run, name), 0, MAX_TOKENS)
    bounded("repeat", run.repeat, 0, 100_000)
    bounded("position", run.position, 0, 1000)
    for name in ("prefill_seconds", "ttft_seconds", "decode_seconds", "wall_seconds"):
        bounded(name, getattr(run, name), 0, MAX_SECONDS)
    for name in ("decode_tokens_per_second", "prefill_tokens_per_second"):
        bounded(name, getattr(run, name), 0, MAX_TOKENS_PER_SECOND)
    bounded("peak_memory_bytes", run.peak_memory_bytes, 0, MAX_MEMORY_BYTES)
    bounded("started_at_unix_seconds", run.started_at_unix_seconds, 0, 2**33)
    if run.output_sha256 and not SHA256_RE.match(run.output_sha256):
        problems.append(f"output_sha256 {run.output_sha256[:80]!r} is not 64 lowercase hex digits (or empty)")
    for field in ("metrics", "params"):
        mapping = getattr(run, field)
        if len(mapping) > MAX_MAP_ENTRIES:
            problems.append(f"{field} holds {len(mapping)} entries; at most {MAX_MAP_ENTRIES} are allowed")
            continue
        for key in mapping:
            if not KEY_RE.match(key):
                problems.append(f"{field} key {key[:40]!r} must be 1-128 characters of letters, digits, _ . : / -")
    if len(run.metrics) <= MAX_MAP_ENTRIES:
        for key, value in run.metrics.items():
            hi = 1.0 if "acceptance" in key else MAX_METRIC  # acceptance rates are shares of drafted tokens
            bounded(f"metrics[{key[:40]!r}]", value, 0, hi)
        drafted, accepted = run.metrics.get("tokens_drafted"), run.metrics.get("tokens_accepted")
        if drafted is not None and accepted is not None and accepted > drafted:
            problems.append(f"metrics: tokens_accepted ({accepted}) exceeds tokens_drafted ({drafted})")
    if len(run.params) <= MAX_MAP_ENTRIES:
        for key, value in run.params.items():
            if len(value) > MAX_STRING_CHARS:
                problems.append(f"params[{key[:40]!r}] is {len(value)} characters; at most {MAX_STRING_CHARS}")
    short("job_id", run.job_id, hi=MAX_STRING_CHARS)
    if problems:
        raise InvalidRun("; ".join(problems))


@dataclass(frozen=True)
class Report:
    """One ReportResult call: who sent it, for which job and lease, and the run."""

    agent_id: str
    job_id: str
    lease_id: str
    run: object  # pb.Run


RUN_COLUMNS = (
    "run_id job_id lease_id sweep_id agent_id chip engine method depth prompt_id repeat position prompt_tokens"
    " generated_tokens prefill_seconds ttft_seconds decode_seconds wall_seconds decode_tokens_per_second"
    " prefill_tokens_per_second peak_memory_bytes output_sha256 lossless metrics params started_at ingested_at seq"
).split()


def ingest(scheduler: Scheduler, agent_id: str, job_id: str, lease_id: str, run) -> tuple[bool, int]:
    """Store one run; return (duplicate, ingest sequence). Idempotent on run_id."""
    (result,) = ingest_many(scheduler, [Report(agent_id, job_id, lease_id, run)])
    if isinstance(result, Exception):
        raise result
    return result


def ingest_many(scheduler: Scheduler, reports: list[Report]) -> list[tuple[bool, int] | Exception]:
    """Store many runs in one transaction; per report (duplicate, ingest sequence), or the
    InvalidRun / SchedulerError that refused it. A refused report does not affect the others."""
    results: list[tuple[bool, int] | Exception | None] = [None] * len(reports)
    for i, r in enumerate(reports):
        try:
            validate(r.run)
            if r.run.job_id != r.job_id:
                raise InvalidRun(f"run.job_id {r.run.job_id!r} differs from the request's job_id {r.job_id!r}")
        except InvalidRun as e:
            results[i] = e
    todo = [i for i, res in enumerate(results) if res is None]
    if not todo:
        return results
    now = time.time()
    stored = {}  # run id -> (seq, agent id) of the runs in this batch that are stored
    # One statement inserts the new runs: it commits on its own, and the store's lock keeps
    # every other writer out between the leases' check and the insert.
    with scheduler.store.autocommit() as con:
        rows = {}  # run id -> (report index, column values): the copy of each run to insert
        for i in todo:
            r = reports[i]
            run = r.run
            if run.run_id in rows:  # the same run twice in one batch: the second is a retry
                continue
            try:
                lease = scheduler.lease(con, r.agent_id, r.job_id, r.lease_id)
            except SchedulerError as e:
                results[i] = e  # unless the run is stored already: then a retry (below)
                continue
            rows[run.run_id] = (i, [
                run.run_id, r.job_id, r.lease_id, lease.sweep_id, r.agent_id, lease.chip, run.engine, run.method,
                run.depth, run.prompt_id, run.repeat, run.position, run.prompt_tokens, run.generated_tokens,
                run.prefill_seconds, run.ttft_seconds, run.decode_seconds, run.wall_seconds,
                run.decode_tokens_per_second, run.prefill_tokens_per_second, run.peak_memory_bytes,
                run.output_sha256, run.lossless if run.has_lossless else None, json.dumps(dict(run.metrics)),
                json.dumps(dict(run.params)), run.started_at_unix_seconds, now,
            ])  # fmt: skip
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
                stored[run_id] = (seq, reports[i].agent_id)
        earlier = list({reports[i].run.run_id for i in todo} - stored.keys())  # retries, refusals
        if earlier:
            stored.update(
                (run_id, (seq, agent_id))
                for run_id, seq, agent_id in con.execute(
                    f"SELECT run_id, seq, agent_id FROM runs WHERE run_id IN {placeholders(earlier)}", earlier
                ).fetchall()
            )
    for i in todo:
        r = reports[i]
        if isinstance(results[i], tuple) or r.run.run_id not in stored:
            continue  # stored now, or refused
        seq, owner = stored[r.run.run_id]  # a retry: acknowledged, never stored twice
        results[i] = (
            (True, seq)
            if owner == r.agent_id
            else InvalidRun(f"run id {r.run.run_id} was already stored by another agent")
        )
    return results


# One list parameter per column; DuckDB takes each list's type from its Python values (casts
# written into the statement cost 2 ms a batch to bind) and the insert casts to the table's.
BATCH_SELECT = "SELECT " + ", ".join(f"unnest(?) AS {name}" for name in RUN_COLUMNS[:-1])  # all but seq
INSERT_BATCH = f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) SELECT *, nextval('ingest_seq') FROM ({BATCH_SELECT}) b"

"""Ingestion of runs: validate every figure, store once per run id, refuse stale leases."""

from __future__ import annotations

import json
import math
import time

from agent.engines import ENGINES
from agent.engines.base import MAX_DEPTH, METHODS, REFERENCE_METHODS, VERIFY_COST
from coordinator.scheduler import Scheduler
from coordinator.store import next_seq

MAX_MAP_ENTRIES = 256
MAX_STRING_CHARS = 4096
MAX_TOKENS = 10_000_000
MAX_SECONDS = 7 * 86400.0
MAX_TOKENS_PER_SECOND = 10_000_000.0
MAX_MEMORY_BYTES = 2**50


class InvalidRun(ValueError):
    pass


def validate(run) -> None:
    """Raise InvalidRun naming the first field that is missing, non-finite or out of range."""
    problems = []

    def bounded(name, value, lo, hi):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
            problems.append(f"{name} = {value!r} is not a finite value in [{lo}, {hi}]")

    if not run.run_id or len(run.run_id) > 128:
        problems.append("run_id must be 1-128 characters")
    if run.engine not in ENGINES:
        problems.append(f"engine {run.engine!r} is not one of {', '.join(ENGINES)}")
    if run.method not in (*METHODS, *REFERENCE_METHODS, VERIFY_COST):
        problems.append(f"method {run.method!r} is unknown")
    bounded("depth", run.depth, 0, MAX_DEPTH)
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
    if len(run.metrics) > MAX_MAP_ENTRIES or len(run.params) > MAX_MAP_ENTRIES:
        problems.append(f"metrics and params may hold at most {MAX_MAP_ENTRIES} entries each")
    for key, value in run.metrics.items():
        if not math.isfinite(value):
            problems.append(f"metrics[{key!r}] = {value!r} is not finite")
    for mapping in (run.metrics, run.params):
        for key in mapping:
            if len(key) > 128:
                problems.append(f"key {key[:40]!r}... is longer than 128 characters")
    for key, value in run.params.items():
        if len(value) > MAX_STRING_CHARS:
            problems.append(f"params[{key!r}] is longer than {MAX_STRING_CHARS} characters")
    for name in ("job_id", "prompt_id", "output_sha256"):
        if len(getattr(run, name)) > MAX_STRING_CHARS:
            problems.append(f"{name} is longer than {MAX_STRING_CHARS} characters")
    if problems:
        raise InvalidRun("; ".join(problems))


def ingest(scheduler: Scheduler, agent_id: str, job_id: str, lease_id: str, run) -> tuple[bool, int]:
    """Store one run; return (duplicate, ingest sequence). Idempotent on run_id."""
    validate(run)
    if run.job_id != job_id:
        raise InvalidRun(f"run.job_id {run.job_id!r} differs from the request's job_id {job_id!r}")
    with scheduler.store.tx() as con:
        existing = con.execute("SELECT seq, agent_id FROM runs WHERE run_id = ?", [run.run_id]).fetchone()
        if existing is not None:
            if existing[1] != agent_id:
                raise InvalidRun(f"run id {run.run_id} was already stored by another agent")
            return True, existing[0]
        scheduler.check_lease(con, agent_id, job_id, lease_id)
        sweep_id, chip = con.execute(
            "SELECT j.sweep_id, a.chip FROM jobs j JOIN agents a USING (agent_id) WHERE j.job_id = ?", [job_id]
        ).fetchone()
        seq = next_seq(con)
        con.execute(
            f"INSERT INTO runs VALUES ({', '.join(['?'] * 28)})",
            [
                run.run_id,
                job_id,
                lease_id,
                sweep_id,
                agent_id,
                chip,
                run.engine,
                run.method,
                run.depth,
                run.prompt_id,
                run.repeat,
                run.position,
                run.prompt_tokens,
                run.generated_tokens,
                run.prefill_seconds,
                run.ttft_seconds,
                run.decode_seconds,
                run.wall_seconds,
                run.decode_tokens_per_second,
                run.prefill_tokens_per_second,
                run.peak_memory_bytes,
                run.output_sha256,
                run.lossless if run.has_lossless else None,
                json.dumps(dict(run.metrics)),
                json.dumps(dict(run.params)),
                run.started_at_unix_seconds,
                time.time(),
                seq,
            ],
        )
    return False, seq

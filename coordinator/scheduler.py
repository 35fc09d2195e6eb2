"""Jobs and their leases: one table of allowed transitions, one function that applies them.

A job is one cell of a sweep on one agent. It is handed out with a lease; heartbeats extend
it; an expired lease puts the job back in the queue with its attempt count, until the
sweep's maximum, after which the job fails with the reason.
"""

from __future__ import annotations

import enum
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from coordinator.store import Store, next_seq
from coordinator.sweeps import Sweep, agent_can_run, agent_matches

LEASE_SECONDS = 60.0
HEARTBEAT_INTERVAL_SECONDS = 10.0
MAX_WAIT_SECONDS = 30.0


class JobState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = {JobState.DONE, JobState.FAILED, JobState.CANCELLED}
ALLOWED = {
    JobState.QUEUED: {JobState.LEASED, JobState.CANCELLED, JobState.FAILED},
    JobState.LEASED: {JobState.QUEUED, JobState.DONE, JobState.FAILED, JobState.CANCELLED},
}


class SchedulerError(Exception):
    """A request that does not fit the job's state: stale lease, unknown job, ..."""


def lease_problem(agent_id: str, job_id: str, lease_id: str, row) -> SchedulerError | None:
    """Why `lease_id` on `job_id` is not `agent_id`'s live lease, given the job's (agent_id,
    state, lease_id) row or None; None when it is."""
    if row is None:
        return SchedulerError(f"unknown job {job_id}")
    owner, state, current_lease = row
    if owner != agent_id:
        return SchedulerError(f"job {job_id} belongs to another agent")
    if state != JobState.LEASED.value or current_lease != lease_id:
        return SchedulerError(f"lease {lease_id} on job {job_id} is no longer valid (job is {state})")
    return None


class NoMatchingAgents(SchedulerError):
    pass


@dataclass(frozen=True)
class Beat:
    """One heartbeat: the agent, the job and lease it holds (empty when idle), its status."""

    agent_id: str
    job_id: str = ""
    lease_id: str = ""
    status: str = ""
    fingerprint: dict | None = None


@dataclass(frozen=True)
class LeasedJob:
    job_id: str
    lease_id: str
    sweep_id: str
    attempt: int
    spec: dict


def transition(con, job_id: str, to: JobState, now: float, **columns) -> None:
    """Move a job to `to` inside the caller's transaction, refusing transitions not in ALLOWED."""
    row = con.execute("SELECT state FROM jobs WHERE job_id = ?", [job_id]).fetchone()
    if row is None:
        raise SchedulerError(f"unknown job {job_id}")
    current = JobState(row[0])
    if to not in ALLOWED.get(current, set()):
        raise SchedulerError(f"job {job_id} is {current.value}; it cannot become {to.value}")
    sets = ", ".join(f"{k} = ?" for k in columns)
    con.execute(
        f"UPDATE jobs SET state = ?, updated_at = ?, seq = ?{', ' + sets if sets else ''} WHERE job_id = ?",
        [to.value, now, next_seq(con), *columns.values(), job_id],
    )


class Scheduler:
    def __init__(self, store: Store, clock=time.time, lease_seconds: float = LEASE_SECONDS):
        self.store = store
        self.clock = clock
        self.lease_seconds = lease_seconds
        self._work = threading.Condition()
        # Called with the ids of agents that may have a job now (the server's long-polls listen).
        self.listeners: list[Callable[[set[str]], None]] = []
        # Agents that may have a queued job or hold a lease: a superset, changed only inside a
        # transaction. Idle agents long-poll all the time; this spares their polls the database.
        with store.tx() as con:
            self._may_have_work = {
                agent_id
                for (agent_id,) in con.execute(
                    "SELECT DISTINCT agent_id FROM jobs WHERE state IN ('queued', 'leased')"
                ).fetchall()
            }

    # ------------------------------------------------------------------ sweeps

    def submit(self, sweep: Sweep, yaml_text: str) -> tuple[str, int]:
        now = self.clock()
        sweep_id = "sw-" + uuid.uuid4().hex[:12]
        with self.store.tx() as con:
            agents = con.execute(
                "SELECT agent_id, name, chip, memory_bytes, labels, engines FROM agents WHERE state IN ('idle', 'busy')"
            ).fetchall()
            jobs = []
            cells = sweep.cells()
            for agent_id, name, chip, memory_bytes, labels, engines in agents:
                info = {
                    "name": name,
                    "chip": chip,
                    "memory_bytes": memory_bytes,
                    "labels": json.loads(labels),
                    "engines": json.loads(engines),
                }
                if not agent_matches(sweep.target, info):
                    continue
                jobs.extend((agent_id, cell) for cell in cells if agent_can_run(cell, info))
            if not jobs:
                needs = [
                    f"{e} with {m['memory_gb']} GB of memory" if "memory_gb" in m else e
                    for e, m in sweep.models.items()
                ]
                raise NoMatchingAgents(
                    f"sweep {sweep.name!r}: no enrolled agent matches its target and has one of its engines "
                    f"({', '.join(needs)}); nothing was stored"
                )
            con.execute(
                "INSERT INTO sweeps VALUES (?, ?, ?, 'running', ?, ?)",
                [sweep_id, sweep.name, yaml_text, now, next_seq(con)],
            )
            for agent_id, cell in jobs:
                con.execute(
                    "INSERT INTO jobs (job_id, sweep_id, agent_id, spec, state, max_attempts, created_at,"
                    " updated_at, seq) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
                    [
                        "job-" + uuid.uuid4().hex[:12],
                        sweep_id,
                        agent_id,
                        json.dumps(cell),
                        sweep.max_attempts,
                        now,
                        now,
                        next_seq(con),
                    ],
                )
            self._may_have_work.update(agent_id for agent_id, _ in jobs)
        self._wake({agent_id for agent_id, _ in jobs})
        return sweep_id, len(jobs)

    def cancel(self, sweep_id: str) -> int:
        now = self.clock()
        with self.store.tx() as con:
            if con.execute("SELECT 1 FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchone() is None:
                raise SchedulerError(f"unknown sweep {sweep_id}")
            open_jobs = con.execute(
                "SELECT job_id, agent_id, state FROM jobs WHERE sweep_id = ? AND state IN ('queued', 'leased')",
                [sweep_id],
            ).fetchall()
            for job_id, agent_id, state in open_jobs:
                transition(con, job_id, JobState.CANCELLED, now, lease_id=None, reason="sweep cancelled")
                if state == JobState.LEASED.value:
                    self._release_agent(con, agent_id)
            con.execute("UPDATE sweeps SET state = 'cancelled', seq = ? WHERE sweep_id = ?", [next_seq(con), sweep_id])
        return len(open_jobs)

    # ------------------------------------------------------------------ leases

    def acquire(self, agent_id: str, wait_seconds: float = 0.0) -> LeasedJob | None:
        """Lease the agent's next queued job, waiting up to wait_seconds for one to appear."""
        deadline = time.monotonic() + min(max(wait_seconds, 0.0), MAX_WAIT_SECONDS)
        while True:
            job = self.try_acquire(agent_id)
            remaining = deadline - time.monotonic()
            if job is not None or remaining <= 0:
                return job
            with self._work:
                self._work.wait(timeout=min(remaining, 1.0))

    def try_acquire(self, agent_id: str) -> LeasedJob | None:
        """Lease the agent's next queued job now, or return None."""
        if agent_id not in self._may_have_work:
            return None
        now = self.clock()
        with self.store.tx() as con:
            state = con.execute("SELECT state FROM agents WHERE agent_id = ?", [agent_id]).fetchone()
            if state is None or state[0] in ("draining", "revoked"):
                return None
            # An agent asks for work only when it holds none: a lease it still has was lost
            # with a restart, so that attempt is over.
            for (job_id,) in con.execute(
                "SELECT job_id FROM jobs WHERE agent_id = ? AND state = 'leased'", [agent_id]
            ).fetchall():
                self._end_attempt(con, job_id, now, "agent restarted while holding the lease")
            row = con.execute(
                "SELECT j.job_id, j.sweep_id, j.attempt, j.spec FROM jobs j JOIN sweeps s USING (sweep_id)"
                " WHERE j.agent_id = ? AND j.state = 'queued' AND s.state = 'running'"
                " ORDER BY j.created_at, j.job_id LIMIT 1",
                [agent_id],
            ).fetchone()
            if row is None:
                self._may_have_work.discard(agent_id)  # it held no lease past this point either
                return None
            job_id, sweep_id, attempt, spec = row
            lease_id = "lease-" + uuid.uuid4().hex[:12]
            transition(
                con,
                job_id,
                JobState.LEASED,
                now,
                lease_id=lease_id,
                lease_expires_at=now + self.lease_seconds,
                attempt=attempt + 1,
            )
            con.execute(
                "UPDATE agents SET state = 'busy', current_job_id = ?, seq = ? WHERE agent_id = ?",
                [job_id, next_seq(con), agent_id],
            )
        return LeasedJob(job_id, lease_id, sweep_id, attempt + 1, json.loads(spec))

    def check_lease(self, con, agent_id: str, job_id: str, lease_id: str) -> None:
        row = con.execute("SELECT agent_id, state, lease_id FROM jobs WHERE job_id = ?", [job_id]).fetchone()
        if (problem := lease_problem(agent_id, job_id, lease_id, row)) is not None:
            raise problem

    def heartbeats(self, beats: list[Beat]) -> list[tuple[str, float | None]]:
        """Record many agents' heartbeats in one transaction (the server batches them).

        For each: the agent's state (it learns that it is draining) and, when it named a job,
        the seconds until its extended lease expires, or None if that lease is gone."""
        now = self.clock()
        latest = {b.agent_id: b for b in beats}  # one row per agent, its latest status
        with self.store.tx() as con:
            for b in beats:
                if b.fingerprint:
                    fp = b.fingerprint
                    con.execute(
                        "UPDATE agents SET fingerprint = ?, chip = ?, memory_bytes = ? WHERE agent_id = ?",
                        [json.dumps(fp), fp.get("chip", ""), int(fp.get("memoryBytes", 0)), b.agent_id],
                    )
            seqs = sorted(
                r[0] for r in con.execute("SELECT nextval('ingest_seq') FROM range(?)", [len(latest)]).fetchall()
            )
            touched = pa.table(
                {
                    "agent_id": list(latest),
                    "status": [b.status[:512] for b in latest.values()],
                    "seq": seqs,
                }
            )
            con.register("heartbeat_batch", touched)
            try:
                con.execute(
                    "UPDATE agents SET last_seen = ?, status = h.status, seq = h.seq FROM heartbeat_batch h"
                    " WHERE agents.agent_id = h.agent_id",
                    [now],
                )
                states = dict(
                    con.execute(
                        "SELECT agent_id, state FROM agents WHERE agent_id IN (SELECT agent_id FROM heartbeat_batch)"
                    ).fetchall()
                )
            finally:
                con.unregister("heartbeat_batch")
            job_ids = [b.job_id for b in beats if b.job_id]
            leases = {}
            if job_ids:
                leases = {
                    r[0]: r[1:]
                    for r in con.execute(
                        "SELECT job_id, agent_id, state, lease_id FROM jobs WHERE job_id IN (SELECT unnest(?))",
                        [job_ids],
                    ).fetchall()
                }
            live = [
                bool(b.job_id) and lease_problem(b.agent_id, b.job_id, b.lease_id, leases.get(b.job_id)) is None
                for b in beats
            ]
            if any(live):
                con.execute(
                    "UPDATE jobs SET lease_expires_at = ? WHERE job_id IN (SELECT unnest(?))",
                    [now + self.lease_seconds, [b.job_id for b, ok in zip(beats, live) if ok]],
                )
        return [(states.get(b.agent_id, ""), self.lease_seconds if ok else None) for b, ok in zip(beats, live)]

    def heartbeat(self, agent_id: str, job_id: str, lease_id: str) -> float | None:
        """Extend the lease; return seconds until it expires, or None if it is gone."""
        now = self.clock()
        with self.store.tx() as con:
            try:
                self.check_lease(con, agent_id, job_id, lease_id)
            except SchedulerError:
                return None
            con.execute("UPDATE jobs SET lease_expires_at = ? WHERE job_id = ?", [now + self.lease_seconds, job_id])
        return self.lease_seconds

    def complete(self, agent_id: str, job_id: str, lease_id: str, run_count: int) -> None:
        now = self.clock()
        with self.store.tx() as con:
            self.check_lease(con, agent_id, job_id, lease_id)
            stored = con.execute("SELECT count(*) FROM runs WHERE lease_id = ?", [lease_id]).fetchone()[0]
            if stored != run_count:
                raise SchedulerError(
                    f"job {job_id}: agent reports {run_count} runs but {stored} are stored; upload them first"
                )
            transition(con, job_id, JobState.DONE, now)
            self._may_have_work.add(agent_id)  # its next job, if any
            self._release_agent(con, agent_id)
            self._close_sweep_if_done(con, job_id)
        self._wake({agent_id})

    def fail(self, agent_id: str, job_id: str, lease_id: str, reason: str, retry: bool) -> bool:
        """Fail the attempt; requeue when `retry` and attempts remain. Returns whether it will retry."""
        now = self.clock()
        with self.store.tx() as con:
            self.check_lease(con, agent_id, job_id, lease_id)
            will_retry = self._end_attempt(con, job_id, now, reason, retry=retry)
            self._may_have_work.add(agent_id)
            self._release_agent(con, agent_id)
        self._wake({agent_id})
        return will_retry

    def expire_leases(self) -> int:
        """Requeue (or fail) every job whose lease has run out; called periodically."""
        now = self.clock()
        with self.store.tx() as con:
            expired = con.execute(
                "SELECT job_id, agent_id FROM jobs WHERE state = 'leased' AND lease_expires_at <= ?", [now]
            ).fetchall()
            for job_id, agent_id in expired:
                self._end_attempt(con, job_id, now, "lease expired without a heartbeat")
                self._may_have_work.add(agent_id)
                self._release_agent(con, agent_id)
        if expired:
            self._wake({agent_id for _, agent_id in expired})
        return len(expired)

    # ------------------------------------------------------------------ helpers

    def _end_attempt(self, con, job_id: str, now: float, reason: str, retry: bool = True) -> bool:
        attempt, max_attempts = con.execute(
            "SELECT attempt, max_attempts FROM jobs WHERE job_id = ?", [job_id]
        ).fetchone()
        if retry and attempt < max_attempts:
            transition(
                con,
                job_id,
                JobState.QUEUED,
                now,
                lease_id=None,
                lease_expires_at=None,
                reason=f"attempt {attempt}: {reason}",
            )
            return True
        transition(
            con,
            job_id,
            JobState.FAILED,
            now,
            lease_id=None,
            lease_expires_at=None,
            reason=f"attempt {attempt} of {max_attempts}: {reason}",
        )
        self._close_sweep_if_done(con, job_id)
        return False

    def _release_agent(self, con, agent_id: str) -> None:
        con.execute(
            "UPDATE agents SET state = CASE WHEN state = 'busy' THEN 'idle' ELSE state END,"
            " current_job_id = NULL, seq = ? WHERE agent_id = ?",
            [next_seq(con), agent_id],
        )

    def _close_sweep_if_done(self, con, job_id: str) -> None:
        sweep_id = con.execute("SELECT sweep_id FROM jobs WHERE job_id = ?", [job_id]).fetchone()[0]
        open_jobs = con.execute(
            "SELECT count(*) FROM jobs WHERE sweep_id = ? AND state IN ('queued', 'leased')", [sweep_id]
        ).fetchone()[0]
        if open_jobs == 0:
            con.execute(
                "UPDATE sweeps SET state = 'done', seq = ? WHERE sweep_id = ? AND state = 'running'",
                [next_seq(con), sweep_id],
            )

    def _wake(self, agent_ids: set[str]) -> None:
        with self._work:
            self._work.notify_all()
        for listener in self.listeners:
            listener(agent_ids)

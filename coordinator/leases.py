"""Leases: handing a job out (acquire), checking, extending, re-claiming and expiring its lease,
and writing the heartbeats that extend them. A part of coordinator/scheduler.py's Scheduler
(a mixin: the live leases, the store and the transaction are the Scheduler's).

Live leases are mirrored in memory from the jobs table, so that heartbeats extend them and
reports check them without a transaction; which leases exist changes only under the store's
lock, once the transaction that changed the table has committed (Scheduler.transaction). A lease
that lapsed while no other attempt of its job began is re-claimed by its agent (`reclaim`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from coordinator.states import AGENTS, AgentState, JobState, StateError, transition
from coordinator.store import next_seq, placeholders

MAX_WAIT_SECONDS = 30.0

# A request that does not fit a job's state: stale lease, unknown job, a transition refused.
SchedulerError = StateError


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


@dataclass(frozen=True)
class Beat:
    """One heartbeat: the agent, the job and lease it holds (empty when idle), its status."""

    agent_id: str
    job_id: str = ""
    lease_id: str = ""
    status: str = ""
    fingerprint: dict | None = None


@dataclass
class Lease:
    """A live lease, as the scheduler keeps it in memory (the jobs table holds the same)."""

    agent_id: str
    lease_id: str
    sweep_id: str
    chip: str  # the agent's chip when it took the job: every run of the job is stored with it
    expires_at: float


@dataclass(frozen=True)
class LeasedJob:
    job_id: str
    lease_id: str
    sweep_id: str
    attempt: int
    spec: dict


class Leases:
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

    def may_have_work(self, agent_id: str) -> bool:
        """False when the agent surely has no queued job (no database needed to tell)."""
        return self.shared or agent_id in self._may_have_work

    def try_acquire(self, agent_id: str) -> LeasedJob | None:
        """Lease the agent's next queued job now, or return None."""
        if not self.may_have_work(agent_id):
            return None
        now = self.clock()
        with self.transaction() as con:
            agent = con.execute("SELECT state, chip FROM agents WHERE agent_id = ?", [agent_id]).fetchone()
            if agent is None or agent[0] in (AgentState.DRAINING, AgentState.REVOKED):
                return None
            # An agent asks for work only when it holds none: a lease it still has was lost
            # with a restart, so that attempt is over.
            for (job_id,) in con.execute(
                "SELECT job_id FROM jobs WHERE agent_id = ? AND state = 'leased'", [agent_id]
            ).fetchall():
                self._end_attempt(con, job_id, now, "agent restarted while holding the lease", outcome="abandoned")
            if agent[0] == AgentState.BUSY:
                self._release_agent(con, agent_id)
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
            expires_at = now + self.lease_seconds
            self._transition(
                con, job_id, JobState.LEASED, now, lease_id=lease_id, lease_expires_at=expires_at, attempt=attempt + 1
            )
            con.execute(
                "INSERT INTO attempts (lease_id, job_id, attempt, agent_id, started_at, seq)"
                " VALUES (?, ?, ?, ?, ?, nextval('ingest_seq'))",
                [lease_id, job_id, attempt + 1, agent_id, now],
            )
            self._lease_changes.append((job_id, Lease(agent_id, lease_id, sweep_id, agent[1], expires_at)))
            transition(con, AGENTS, agent_id, AgentState.BUSY, current_job_id=job_id)
        return LeasedJob(job_id, lease_id, sweep_id, attempt + 1, json.loads(spec))

    def lease(self, con, agent_id: str, job_id: str, lease_id: str) -> Lease:
        """`agent_id`'s live lease `lease_id` on `job_id` (or the lease of its attempt that ended
        held, whose runs are still to come), or SchedulerError saying why it is not (naming the
        job's state, read from the table when the lease is gone)."""
        if self.shared:  # another coordinator may have changed it: the jobs table says
            lease = self._table_lease(con, agent_id, job_id, lease_id)
            if lease is not None:
                return lease
        else:
            with self._lock:
                lease = self._leases.get(job_id)
            if lease is not None and lease.agent_id == agent_id and lease.lease_id == lease_id:
                return lease
        held = con.execute(
            "SELECT j.sweep_id, ag.chip FROM attempts a JOIN jobs j USING (job_id) JOIN agents ag"
            " ON ag.agent_id = a.agent_id WHERE a.lease_id = ? AND a.job_id = ? AND a.agent_id = ?"
            " AND a.outcome = 'held' AND j.state = 'held'",
            [lease_id, job_id, agent_id],
        ).fetchone()
        if held is not None:
            return Lease(agent_id, lease_id, held[0], held[1], float("inf"))
        if lease is not None:
            row = (lease.agent_id, JobState.LEASED.value, lease.lease_id)
        else:
            row = con.execute("SELECT agent_id, state, lease_id FROM jobs WHERE job_id = ?", [job_id]).fetchone()
        raise lease_problem(agent_id, job_id, lease_id, row) or SchedulerError(
            f"lease {lease_id} on job {job_id} is no longer valid"  # being expired by the reaper
        )

    def _table_lease(self, con, agent_id: str, job_id: str, lease_id: str) -> Lease | None:
        """The lease as the jobs table holds it (shared lake), None unless it is the agent's live
        one: taken into memory, so that this coordinator's heartbeats extend it, whichever
        coordinator leased it."""
        row = con.execute(
            "SELECT j.agent_id, j.state, j.lease_id, j.sweep_id, a.chip, j.lease_expires_at"
            " FROM jobs j JOIN agents a USING (agent_id) WHERE j.job_id = ?",
            [job_id],
        ).fetchone()
        if row is None or lease_problem(agent_id, job_id, lease_id, row[:3]) is not None:
            return None
        with self._lock:
            lease = self._leases.get(job_id)
            if lease is None or lease.lease_id != lease_id:
                lease = self._leases[job_id] = Lease(agent_id, lease_id, row[3], row[4], row[5])
        return lease

    def live(self, agent_id: str, job_id: str, lease_id: str) -> bool:
        """Whether `lease_id` on `job_id` is `agent_id`'s live lease (in memory: no database)."""
        with self._lock:
            lease = self._leases.get(job_id)
        return lease is not None and lease.agent_id == agent_id and lease.lease_id == lease_id

    def reclaim(self, agent_id: str, job_id: str, lease_id: str) -> float | None:
        """Lease `job_id` to `agent_id` again under `lease_id`, which lapsed while no other
        attempt of the job began (see the module's docstring); the seconds until it expires, or
        None when it cannot be re-claimed (or is live: nothing to do)."""
        if self.live(agent_id, job_id, lease_id):
            return self.lease_seconds
        with self.transaction() as con:
            lease = self._reclaim(con, agent_id, job_id, lease_id, self.clock())
        return None if lease is None else self.lease_seconds

    def _reclaim(self, con, agent_id: str, job_id: str, lease_id: str, now: float) -> Lease | None:
        row = con.execute(
            "SELECT j.sweep_id, ag.chip, ag.state FROM attempts a JOIN jobs j USING (job_id)"
            " JOIN agents ag ON ag.agent_id = a.agent_id JOIN sweeps s ON s.sweep_id = j.sweep_id"
            " WHERE a.lease_id = ? AND a.job_id = ? AND a.agent_id = ? AND a.outcome = 'expired'"
            " AND j.state = 'queued' AND j.attempt = a.attempt AND s.state = 'running'"
            " AND ag.current_job_id IS NULL AND ag.state NOT IN ('revoked')",
            [lease_id, job_id, agent_id],
        ).fetchone()
        if row is None:
            return None
        sweep_id, chip, agent_state = row
        expires_at = now + self.lease_seconds
        self._transition(con, job_id, JobState.LEASED, now, lease_id=lease_id, lease_expires_at=expires_at)
        con.execute(
            "UPDATE attempts SET ended_at = NULL, outcome = NULL, reason = '', reclaims = reclaims + 1,"
            " last_beat_at = ?, seq = nextval('ingest_seq') WHERE lease_id = ?",
            [now, lease_id],
        )
        if agent_state in (AgentState.IDLE, AgentState.ENROLLED):
            transition(con, AGENTS, agent_id, AgentState.BUSY, current_job_id=job_id)
        else:  # draining: it finishes the job it holds
            con.execute(
                "UPDATE agents SET current_job_id = ?, seq = ? WHERE agent_id = ?", [job_id, next_seq(con), agent_id]
            )
        lease = Lease(agent_id, lease_id, sweep_id, chip, expires_at)
        self._lease_changes.append((job_id, lease))
        return lease

    def _held_lease(self, con, agent_id: str, job_id: str, lease_id: str, now: float) -> Lease:
        """The agent's live lease, or the one it re-claims now; SchedulerError (lease()'s) if neither."""
        try:
            return self.lease(con, agent_id, job_id, lease_id)
        except SchedulerError:
            if (lease := self._reclaim(con, agent_id, job_id, lease_id, now)) is not None:
                return lease
            raise

    def extend_lease(self, agent_id: str, job_id: str, lease_id: str) -> float | None:
        """A heartbeat naming a job: extend the agent's live lease (in memory; the table gets
        the new expiry from record_beats). The seconds until it expires, or None if it is gone
        or not the agent's."""
        with self._lock:
            lease = self._leases.get(job_id)
        if lease is None and self.shared:  # leased by another coordinator, perhaps
            with self.store.reader() as con:
                lease = self._table_lease(con, agent_id, job_id, lease_id)
        with self._lock:
            if lease is None or lease.agent_id != agent_id or lease.lease_id != lease_id:
                return None
            lease.expires_at = self.clock() + self.lease_seconds
            self._extended.add(job_id)
        return self.lease_seconds

    def record_beats(self, beats: list[Beat]) -> None:
        """Write heartbeats kept in memory: each agent's last contact and latest status (and
        fingerprint, when it sent one), and every lease expiry extended since the last write.
        An agent heard from for the first time since it enrolled becomes idle.

        The store's lock is held from reading the pending extensions to writing them: no
        transaction, the lease reaper's included, changes which leases exist meanwhile, so an
        expiry lands only on the lease it extended, and one already ended is dropped."""
        now = self.clock()
        latest = {b.agent_id: b for b in beats}  # one row per agent, its latest status
        with self.store.lock:
            with self._lock:
                extended = {
                    job_id: (lease.lease_id, lease.expires_at)
                    for job_id in self._extended
                    if (lease := self._leases.get(job_id)) is not None
                }
                self._extended.clear()
            if latest or extended:
                self._write_beats(now, beats, latest, extended)

    def _write_beats(self, now: float, beats: list[Beat], latest: dict[str, Beat], extended: dict) -> None:
        first_contact = []
        try:
            with self.store.autocommit() as con:  # each fact stands on its own
                for b in beats:
                    if b.fingerprint:
                        fp = b.fingerprint
                        con.execute(
                            "UPDATE agents SET fingerprint = ?, chip = ?, memory_bytes = ? WHERE agent_id = ?",
                            [json.dumps(fp), fp.get("chip", ""), int(fp.get("memoryBytes", 0)), b.agent_id],
                        )
                if latest:  # lists as parameters, as ingest passes its batches
                    con.execute(  # named: DuckDB 1.5 binds the FROM clause's ? before the SET's
                        "UPDATE agents SET last_seen = $now, status = h.status, seq = nextval('ingest_seq')"
                        " FROM (SELECT unnest($ids) AS agent_id, unnest($statuses) AS status) h"
                        " WHERE agents.agent_id = h.agent_id",
                        {"now": now, "ids": list(latest), "statuses": [b.status for b in latest.values()]},
                    )
                    first_contact = con.execute(
                        "SELECT agent_id FROM agents WHERE state = 'enrolled'"
                        f" AND agent_id IN {placeholders(list(latest))}",
                        list(latest),
                    ).fetchall()
                if extended:
                    con.execute(
                        "UPDATE jobs SET lease_expires_at = e.expires_at"
                        " FROM (SELECT unnest(?) AS job_id, unnest(?) AS lease_id, unnest(?) AS expires_at) e"
                        " WHERE jobs.job_id = e.job_id AND jobs.state = 'leased' AND jobs.lease_id = e.lease_id",
                        [list(extended), [lease for lease, _ in extended.values()], [t for _, t in extended.values()]],
                    )
                    leases = [lease for lease, _ in extended.values()]
                    con.execute(
                        f"UPDATE attempts SET last_beat_at = ? WHERE lease_id IN {placeholders(leases)}", [now, *leases]
                    )
        except BaseException:
            with self._lock:  # the next write tries again
                self._extended.update(job_id for job_id in extended if job_id in self._leases)
            raise
        if first_contact:
            with self.store.tx() as con:
                for (agent_id,) in first_contact:
                    transition(con, AGENTS, agent_id, AgentState.IDLE)

    def expire_leases(self) -> int:
        """Requeue (or fail) every job whose lease has run out; called periodically."""
        if self.shared:
            return self._expire_table_leases()
        now = self.clock()
        with self.store.lock:
            with self._lock:  # from now on no heartbeat extends them
                expired = {job_id: lease for job_id, lease in self._leases.items() if lease.expires_at <= now}
                for job_id in expired:
                    del self._leases[job_id]
            if not expired:
                return 0
            try:
                with self.transaction() as con:
                    for job_id, lease in expired.items():
                        self._end_attempt(con, job_id, now, "lease expired without a heartbeat", outcome="expired")
                        self._may_have_work.add(lease.agent_id)
                        self._release_agent(con, lease.agent_id)
            except BaseException:
                with self._lock:  # the next pass tries again
                    self._leases.update(expired)
                raise
        self._wake({lease.agent_id for lease in expired.values()})
        return len(expired)

    def _expire_table_leases(self) -> int:
        """expire_leases on a shared lake: the leases the jobs table holds as run out, whichever
        coordinator leased them, less those this one extended since its last write of them."""
        now = self.clock()
        with self.store.lock:
            with self._lock:
                fresh = {j for j in self._extended if (lease := self._leases.get(j)) and lease.expires_at > now}
            with self.transaction() as con:
                expired = [
                    (job_id, agent_id)
                    for job_id, agent_id in con.execute(
                        "SELECT job_id, agent_id FROM jobs WHERE state = 'leased' AND lease_expires_at <= ?", [now]
                    ).fetchall()
                    if job_id not in fresh
                ]
                for job_id, agent_id in expired:
                    self._end_attempt(con, job_id, now, "lease expired without a heartbeat", outcome="expired")
                    self._release_agent(con, agent_id)
        self._wake({agent_id for _, agent_id in expired})
        return len(expired)

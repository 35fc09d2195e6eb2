"""Jobs and their leases, and the agents' and sweeps' states that follow them.

A job is one cell of a sweep on one agent. It is handed out with a lease; heartbeats extend
it; an expired lease puts the job back in the queue with its attempt count, until the
sweep's maximum, after which the job fails with the reason. A job the agent refuses is
refused, with the agent's reason, and never retried. Every change of a job's, an agent's or a
sweep's state goes through coordinator/states.py's `transition` inside a transaction; leases
in memory and wake-ups change once it committed.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from coordinator import coverage
from coordinator.states import (
    AGENTS,
    JOBS,
    SWEEPS,
    AgentState,
    JobState,
    StateError,
    SweepState,
    transition,
)
from coordinator.store import Store, next_seq, placeholders
from specfleet.server_arms import fingerprint_builds
from specfleet.sweeps import Sweep, agent_can_run, agent_matches

LEASE_SECONDS = 60.0
HEARTBEAT_INTERVAL_SECONDS = 10.0
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


class NoMatchingAgents(SchedulerError):
    pass


def llama_server_builds(fingerprint: str | None) -> set[str]:
    """The llama-server builds an agent's stored fingerprint reports (server_arms.fingerprint_builds)."""
    versions = json.loads(fingerprint or "{}").get("engineVersions") or {}
    return set(fingerprint_builds(versions))


def missing_builds(sweep: Sweep, cells: list, jobs: list, fleet_builds: dict[str, set[str]]) -> None:
    """NoMatchingAgents naming every llama-server build the sweep's arms pin that no agent it
    targets can run (none has it, or none that has it has the engine and the memory), as an
    unknown engine is refused: nothing is stored."""
    pinned = list(dict.fromkeys(c.server.build for c in cells if c.server is not None and c.server.build))
    given = {cell.server.build for _, cell in jobs if cell.server is not None}
    missing = [b for b in pinned if b not in given]
    if not missing:
        return
    have = "; ".join(f"{b} on {', '.join(sorted(names))}" for b, names in sorted(fleet_builds.items())) or "none"
    raise NoMatchingAgents(
        f"sweep {sweep.name!r}: no enrolled agent matching its target can run llama-server build(s) "
        f"{', '.join(missing)} that its arms pin (arms[].server_build); the builds its agents report: {have} "
        "(an agent lists its binaries in settings.json's llama_server_builds); nothing was stored"
    )


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


class Scheduler:
    def __init__(self, store: Store, clock=time.time, lease_seconds: float = LEASE_SECONDS):
        self.store = store
        self.clock = clock
        self.lease_seconds = lease_seconds
        self._work = threading.Condition()
        # Called with the ids of agents that may have a job now (the server's long-polls listen).
        self.listeners: list[Callable[[set[str]], None]] = []
        # Live leases, mirrored from the jobs table so that heartbeats extend them and reports
        # check them without a transaction. Which leases exist changes only under the store's
        # lock, once the transaction that changed the table has committed (_tx); extended
        # expiries reach the table with the next write of heartbeats (record_beats).
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._extended: set[str] = set()  # job ids whose new expiry the table does not hold yet
        self._lease_changes: list[tuple[str, Lease | None]] = []  # made by the open transaction
        # Agents that may have a queued job or hold a lease: a superset, changed only inside a
        # transaction. Idle agents long-poll all the time; this spares their polls the database.
        with store.tx() as con:
            self._may_have_work = {
                agent_id
                for (agent_id,) in con.execute(
                    "SELECT DISTINCT agent_id FROM jobs WHERE state IN ('queued', 'leased')"
                ).fetchall()
            }
            for job_id, *lease in con.execute(
                "SELECT j.job_id, j.agent_id, j.lease_id, j.sweep_id, a.chip, j.lease_expires_at"
                " FROM jobs j JOIN agents a USING (agent_id) WHERE j.state = 'leased'"
            ).fetchall():
                self._leases[job_id] = Lease(*lease)

    @contextlib.contextmanager
    def transaction(self):
        """A transaction of the store, whose lease changes take effect once it committed."""
        with self.store.lock:
            self._lease_changes = []
            with self.store.tx() as con:
                yield con
            with self._lock:
                for job_id, lease in self._lease_changes:
                    if lease is None:
                        self._leases.pop(job_id, None)
                        self._extended.discard(job_id)
                    else:
                        self._leases[job_id] = lease

    def _transition(self, con, job_id: str, to: JobState, now: float, **columns) -> None:
        """Move a job to `to` inside the caller's transaction (states.JOBS says which moves
        are allowed); a lease it held ends once the transaction committed."""
        if transition(con, JOBS, job_id, to, updated_at=now, **columns) == JobState.LEASED:
            self._lease_changes.append((job_id, None))

    # ------------------------------------------------------------------ sweeps

    def submit(self, sweep: Sweep, yaml_text: str) -> tuple[str, int]:
        now = self.clock()
        sweep_id = "sw-" + uuid.uuid4().hex[:12]
        with self.store.tx() as con:
            agents = con.execute(
                "SELECT agent_id, name, chip, memory_bytes, labels, engines, fingerprint FROM agents"
                " WHERE state IN ('enrolled', 'idle', 'busy')"
            ).fetchall()
            jobs, matched = [], []  # matched: the agents the target selects (coverage.uncovered)
            cells = sweep.cells()
            fleet_builds: dict[str, set[str]] = {}  # llama-server build -> the matching agents that have it
            for agent_id, name, chip, memory_bytes, labels, engines, fingerprint in agents:
                info = {
                    "name": name,
                    "chip": chip,
                    "memory_bytes": memory_bytes,
                    "labels": json.loads(labels),
                    "engines": json.loads(engines),
                    "llama_server_builds": llama_server_builds(fingerprint),
                }
                if not agent_matches(sweep.target, info):
                    continue
                matched.append(info)
                for build in info["llama_server_builds"]:
                    fleet_builds.setdefault(build, set()).add(name)
                jobs.extend((agent_id, cell) for cell in cells if agent_can_run(cell, info))
            missing_builds(sweep, cells, jobs, fleet_builds)
            if not jobs:
                needs = [
                    f"{e} with {m['memory_gb']:g} GB of memory" if "memory_gb" in m else e
                    for e, pairs in sweep.models.items()
                    for m in pairs
                ]
                raise NoMatchingAgents(
                    f"sweep {sweep.name!r}: no enrolled agent matches its target and has one of its engines "
                    f"({', '.join(needs)}); nothing was stored"
                )
            con.execute(
                "INSERT INTO sweeps (sweep_id, name, yaml, state, created_at, seq, uncovered)"
                " VALUES (?, ?, ?, 'running', ?, ?, ?)",
                [sweep_id, sweep.name, yaml_text, now, next_seq(con), coverage.uncovered(cells, matched)],
            )
            for agent_id, cell in jobs:
                con.execute(
                    "INSERT INTO jobs (job_id, sweep_id, agent_id, spec, state, max_attempts, created_at,"
                    " updated_at, seq) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
                    [
                        "job-" + uuid.uuid4().hex[:12],
                        sweep_id,
                        agent_id,
                        cell.to_json(),
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
        with self.transaction() as con:
            transition(con, SWEEPS, sweep_id, SweepState.CANCELLED)  # unknown, done or cancelled: refused
            open_jobs = con.execute(
                "SELECT job_id, agent_id, state FROM jobs WHERE sweep_id = ? AND state IN ('queued', 'leased')",
                [sweep_id],
            ).fetchall()
            for job_id, agent_id, state in open_jobs:
                self._transition(con, job_id, JobState.CANCELLED, now, lease_id=None, reason="sweep cancelled")
                if state == JobState.LEASED.value:
                    self._release_agent(con, agent_id)
        return len(open_jobs)

    def end_agent_jobs(self, con, agent_id: str, reason: str) -> int:
        """Cancel every open job of the agent inside the caller's transaction (the agent was
        revoked: no one else can run them), closing the sweeps left with no open job."""
        now = self.clock()
        open_jobs = con.execute(
            "SELECT job_id FROM jobs WHERE agent_id = ? AND state IN ('queued', 'leased')", [agent_id]
        ).fetchall()
        for (job_id,) in open_jobs:
            self._transition(con, job_id, JobState.CANCELLED, now, lease_id=None, lease_expires_at=None, reason=reason)
            self._close_sweep_if_done(con, job_id)
        self._release_agent(con, agent_id)
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

    def may_have_work(self, agent_id: str) -> bool:
        """False when the agent surely has no queued job (no database needed to tell)."""
        return agent_id in self._may_have_work

    def try_acquire(self, agent_id: str) -> LeasedJob | None:
        """Lease the agent's next queued job now, or return None."""
        if agent_id not in self._may_have_work:
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
                self._end_attempt(con, job_id, now, "agent restarted while holding the lease")
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
            self._lease_changes.append((job_id, Lease(agent_id, lease_id, sweep_id, agent[1], expires_at)))
            transition(con, AGENTS, agent_id, AgentState.BUSY, current_job_id=job_id)
        return LeasedJob(job_id, lease_id, sweep_id, attempt + 1, json.loads(spec))

    def lease(self, con, agent_id: str, job_id: str, lease_id: str) -> Lease:
        """`agent_id`'s live lease `lease_id` on `job_id`, or SchedulerError saying why it is not
        (naming the job's state, read from the table when the lease is gone)."""
        with self._lock:
            lease = self._leases.get(job_id)
        if lease is not None and lease.agent_id == agent_id and lease.lease_id == lease_id:
            return lease
        if lease is not None:
            row = (lease.agent_id, JobState.LEASED.value, lease.lease_id)
        else:
            row = con.execute("SELECT agent_id, state, lease_id FROM jobs WHERE job_id = ?", [job_id]).fetchone()
        raise lease_problem(agent_id, job_id, lease_id, row) or SchedulerError(
            f"lease {lease_id} on job {job_id} is no longer valid"  # being expired by the reaper
        )

    def extend_lease(self, agent_id: str, job_id: str, lease_id: str) -> float | None:
        """A heartbeat naming a job: extend the agent's live lease (in memory; the table gets
        the new expiry from record_beats). The seconds until it expires, or None if it is gone
        or not the agent's."""
        with self._lock:
            lease = self._leases.get(job_id)
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
                    con.execute(
                        "UPDATE agents SET last_seen = ?, status = h.status, seq = nextval('ingest_seq')"
                        " FROM (SELECT unnest(?) AS agent_id, unnest(?) AS status) h"
                        " WHERE agents.agent_id = h.agent_id",
                        [now, list(latest), [b.status for b in latest.values()]],
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
        except BaseException:
            with self._lock:  # the next write tries again
                self._extended.update(job_id for job_id in extended if job_id in self._leases)
            raise
        if first_contact:
            with self.store.tx() as con:
                for (agent_id,) in first_contact:
                    transition(con, AGENTS, agent_id, AgentState.IDLE)

    def complete(self, agent_id: str, job_id: str, lease_id: str, run_count: int) -> None:
        now = self.clock()
        with self.transaction() as con:
            self.lease(con, agent_id, job_id, lease_id)
            stored = con.execute("SELECT count(*) FROM runs WHERE lease_id = ?", [lease_id]).fetchone()[0]
            if stored != run_count:
                raise SchedulerError(
                    f"job {job_id}: agent reports {run_count} runs but {stored} are stored; upload them first"
                )
            self._transition(con, job_id, JobState.DONE, now)
            self._may_have_work.add(agent_id)  # its next job, if any
            self._release_agent(con, agent_id)
            self._close_sweep_if_done(con, job_id)
        self._wake({agent_id})

    def fail(self, agent_id: str, job_id: str, lease_id: str, reason: str, retry: bool) -> bool:
        """Fail the attempt; requeue when `retry` and attempts remain. Returns whether it will retry."""
        now = self.clock()
        with self.transaction() as con:
            self.lease(con, agent_id, job_id, lease_id)
            will_retry = self._end_attempt(con, job_id, now, reason, retry=retry)
            self._may_have_work.add(agent_id)
            self._release_agent(con, agent_id)
        self._wake({agent_id})
        return will_retry

    def refuse(self, agent_id: str, job_id: str, lease_id: str, reason: str) -> None:
        """The agent refused the job (it will not run it: an engine it lacks, a model it cannot
        hold): the job is refused with the reason, never retried, and counts as no failure."""
        now = self.clock()
        with self.transaction() as con:
            self.lease(con, agent_id, job_id, lease_id)
            attempt, max_attempts = con.execute(
                "SELECT attempt, max_attempts FROM jobs WHERE job_id = ?", [job_id]
            ).fetchone()
            self._transition(
                con,
                job_id,
                JobState.REFUSED,
                now,
                lease_id=None,
                lease_expires_at=None,
                reason=f"attempt {attempt} of {max_attempts}: refused: {reason}",  # as failures are worded
            )
            self._close_sweep_if_done(con, job_id)
            self._may_have_work.add(agent_id)
            self._release_agent(con, agent_id)
        self._wake({agent_id})

    def expire_leases(self) -> int:
        """Requeue (or fail) every job whose lease has run out; called periodically."""
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
                        self._end_attempt(con, job_id, now, "lease expired without a heartbeat")
                        self._may_have_work.add(lease.agent_id)
                        self._release_agent(con, lease.agent_id)
            except BaseException:
                with self._lock:  # the next pass tries again
                    self._leases.update(expired)
                raise
        self._wake({lease.agent_id for lease in expired.values()})
        return len(expired)

    # ------------------------------------------------------------------ helpers

    def _end_attempt(self, con, job_id: str, now: float, reason: str, retry: bool = True) -> bool:
        attempt, max_attempts = con.execute(
            "SELECT attempt, max_attempts FROM jobs WHERE job_id = ?", [job_id]
        ).fetchone()
        if retry and attempt < max_attempts:
            self._transition(
                con,
                job_id,
                JobState.QUEUED,
                now,
                lease_id=None,
                lease_expires_at=None,
                reason=f"attempt {attempt}: {reason}",
            )
            return True
        self._transition(
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
        """The agent holds no job now: busy becomes idle; draining and revoked stay as they are."""
        state = con.execute("SELECT state FROM agents WHERE agent_id = ?", [agent_id]).fetchone()[0]
        if state == AgentState.BUSY:
            transition(con, AGENTS, agent_id, AgentState.IDLE, current_job_id=None)
        else:
            con.execute(
                "UPDATE agents SET current_job_id = NULL, seq = ? WHERE agent_id = ?", [next_seq(con), agent_id]
            )

    def _close_sweep_if_done(self, con, job_id: str) -> None:
        """A running sweep whose jobs have all ended is done."""
        sweep_id, state = con.execute(
            "SELECT s.sweep_id, s.state FROM jobs j JOIN sweeps s USING (sweep_id) WHERE j.job_id = ?", [job_id]
        ).fetchone()
        open_jobs = con.execute(
            "SELECT count(*) FROM jobs WHERE sweep_id = ? AND state IN ('queued', 'leased')", [sweep_id]
        ).fetchone()[0]
        if open_jobs == 0 and state == SweepState.RUNNING:
            transition(con, SWEEPS, sweep_id, SweepState.DONE)

    def _wake(self, agent_ids: set[str]) -> None:
        with self._work:
            self._work.notify_all()
        for listener in self.listeners:
            listener(agent_ids)

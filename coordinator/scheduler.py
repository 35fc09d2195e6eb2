"""Jobs and their leases, and the agents' and sweeps' states that follow them.

A job is one cell of a sweep on one agent. It is handed out with a lease; heartbeats extend
it; an expired lease puts the job back in the queue with its attempt count, until the
sweep's maximum, after which the job fails with the reason. A job the agent refuses is
refused, with the agent's reason, and never retried.

Every attempt is a row of `attempts` (migration 020): its lease, agent, start, last extension,
end, outcome and reason. A lease that lapsed only because its agent could not be heard (a Wi-Fi
drop, a sleeping Mac) is re-claimed by the agent's next heartbeat, upload or job end naming it,
as long as no other attempt of the job has begun (the job is still queued at that attempt, and
the agent holds no other job): the job is leased again under the same lease and attempt, so the
runs measured meanwhile are stored and nothing runs twice (`reclaim`). Every change of a job's, an agent's or a
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

    def _transition(self, con, job_id: str, to: JobState, now: float, outcome: str = "", **columns) -> None:
        """Move a job to `to` inside the caller's transaction (states.JOBS says which moves
        are allowed); a lease it held ends once the transaction committed, and its attempt
        ends with `outcome` (the new state's name unless given) and the job's new reason."""
        (lease_id,) = con.execute("SELECT lease_id FROM jobs WHERE job_id = ?", [job_id]).fetchone() or (None,)
        if transition(con, JOBS, job_id, to, updated_at=now, **columns) == JobState.LEASED:
            self._lease_changes.append((job_id, None))
            con.execute(
                "UPDATE attempts SET ended_at = ?, outcome = ?, reason = ?, seq = nextval('ingest_seq')"
                " WHERE lease_id = ?",
                [now, outcome or to.value, columns.get("reason", ""), lease_id],
            )

    # ------------------------------------------------------------------ sweeps

    def submit(self, sweep: Sweep, yaml_text: str) -> tuple[str, int]:
        now = self.clock()
        sweep_id = "sw-" + uuid.uuid4().hex[:12]
        with self.store.tx() as con:
            agents = con.execute(
                "SELECT agent_id, name, chip, memory_bytes, labels, engines, fingerprint FROM agents"
                " WHERE state IN ('enrolled', 'idle', 'busy')"
            ).fetchall()
            jobs = []
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

    def complete(self, agent_id: str, job_id: str, lease_id: str, run_count: int, held_runs: int = 0) -> None:
        """The job's end with every run stored, or (`held_runs` > 0) with that many of its runs
        held by the agent for a coordinator upgrade: then it ends held, and becomes done once
        they are stored (settle_held)."""
        now = self.clock()
        with self.transaction() as con:
            self._held_lease(con, agent_id, job_id, lease_id, now)
            stored = con.execute("SELECT count(*) FROM runs WHERE lease_id = ?", [lease_id]).fetchone()[0]
            if not 0 <= held_runs <= run_count or stored != run_count - held_runs:
                held = f" ({held_runs} held)" if held_runs else ""
                raise SchedulerError(
                    f"job {job_id}: agent reports {run_count} runs{held} but {stored} are stored; upload them first"
                )
            con.execute(
                "UPDATE attempts SET runs_reported = ?, runs_held = ? WHERE lease_id = ?",
                [run_count, held_runs, lease_id],
            )
            if held_runs:
                self._transition(
                    con,
                    job_id,
                    JobState.HELD,
                    now,
                    lease_id=None,
                    lease_expires_at=None,
                    reason=f"{held_runs} of its {run_count} runs held by the agent: their record schema is newer "
                    "than this coordinator reads; they are stored once it is upgraded",
                )
            else:
                self._transition(con, job_id, JobState.DONE, now)
            self._may_have_work.add(agent_id)  # its next job, if any
            self._release_agent(con, agent_id)
            self._close_sweep_if_done(con, job_id)
        self._wake({agent_id})

    def settle_held(self, lease_ids: set[str]) -> None:
        """Held jobs among `lease_ids`'s whose held runs are all stored now become done."""
        if not lease_ids:
            return
        ids = sorted(lease_ids)
        now = self.clock()
        with self.transaction() as con:
            for (job_id,) in con.execute(
                "SELECT a.job_id FROM attempts a JOIN jobs j USING (job_id) WHERE a.outcome = 'held'"
                f" AND j.state = 'held' AND a.lease_id IN {placeholders(ids)}"
                " AND (SELECT count(*) FROM runs r WHERE r.lease_id = a.lease_id) >= a.runs_reported",
                ids,
            ).fetchall():
                self._transition(con, job_id, JobState.DONE, now, reason="")

    def fail(self, agent_id: str, job_id: str, lease_id: str, reason: str, retry: bool) -> bool:
        """Fail the attempt; requeue when `retry` and attempts remain. Returns whether it will retry."""
        now = self.clock()
        with self.transaction() as con:
            self._held_lease(con, agent_id, job_id, lease_id, now)
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
            self._held_lease(con, agent_id, job_id, lease_id, now)
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
                        self._end_attempt(con, job_id, now, "lease expired without a heartbeat", outcome="expired")
                        self._may_have_work.add(lease.agent_id)
                        self._release_agent(con, lease.agent_id)
            except BaseException:
                with self._lock:  # the next pass tries again
                    self._leases.update(expired)
                raise
        self._wake({lease.agent_id for lease in expired.values()})
        return len(expired)

    # ------------------------------------------------------------------ helpers

    def _end_attempt(self, con, job_id: str, now: float, reason: str, retry: bool = True, outcome: str = "") -> bool:
        attempt, max_attempts = con.execute(
            "SELECT attempt, max_attempts FROM jobs WHERE job_id = ?", [job_id]
        ).fetchone()
        if retry and attempt < max_attempts:
            self._transition(
                con,
                job_id,
                JobState.QUEUED,
                now,
                outcome or "failed",
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
            outcome or "failed",
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

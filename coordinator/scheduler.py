"""Jobs and their leases, and the agents' and sweeps' states that follow them: the Scheduler,
in three parts (submission and cancellation here, coordinator/leases.py, coordinator/job_ends.py).

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

from coordinator import coverage
from coordinator.job_ends import JobEnds
from coordinator.leases import (  # noqa: F401  (the scheduler's names, where its callers import them)
    MAX_WAIT_SECONDS,
    Beat,
    Lease,
    LeasedJob,
    Leases,
    SchedulerError,
    lease_problem,
)
from coordinator.states import (
    JOBS,
    SWEEPS,
    JobState,
    SweepState,
    transition,
)
from coordinator.store import Store, next_seq
from specfleet.server_arms import fingerprint_builds
from specfleet.sweeps import Sweep, agent_can_run, agent_matches

LEASE_SECONDS = 60.0
HEARTBEAT_INTERVAL_SECONDS = 10.0


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


class Scheduler(Leases, JobEnds):
    """Submission and cancellation here; leases (coordinator/leases.py) and job ends
    (coordinator/job_ends.py) in parts of their own, sharing this state."""

    def __init__(self, store: Store, clock=time.time, lease_seconds: float = LEASE_SECONDS):
        self.store = store
        self.clock = clock
        self.lease_seconds = lease_seconds
        # On a lake that other coordinators write too (coordinator/lake.py), what this process
        # keeps in memory may be stale: every lease is checked in the jobs table, expiries are
        # read from it, and every agent may have work (a sweep submitted elsewhere).
        self.shared = store.lake is not None
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

    def _wake(self, agent_ids: set[str]) -> None:
        with self._work:
            self._work.notify_all()
        for listener in self.listeners:
            listener(agent_ids)

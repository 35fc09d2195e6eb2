"""Job ends: a job completed (or held), failed (requeued while attempts remain) or refused,
and what follows (its agent released, its sweep closed when no job of it is open). A part of
coordinator/scheduler.py's Scheduler (a mixin)."""

from __future__ import annotations

from coordinator.leases import SchedulerError
from coordinator.states import AGENTS, SWEEPS, AgentState, JobState, SweepState, transition
from coordinator.store import next_seq, placeholders


class JobEnds:
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

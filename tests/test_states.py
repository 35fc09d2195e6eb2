"""The state machines of jobs, agents and sweeps (coordinator/states.py), against a real
DuckDB file with a fake clock: every move outside the tables is refused by name, revoked is
final, a refused job is refused and not failed."""

import itertools

import pytest

from coordinator import agents, auth
from coordinator.scheduler import Beat, Scheduler
from coordinator.states import (
    AGENTS,
    JOBS,
    SWEEPS,
    AgentState,
    JobState,
    StateError,
    SweepState,
    UnknownEntity,
    transition,
)
from coordinator.store import Store
from specfleet.sweeps import parse_sweep
from tests.support.clocks import FakeClock as Clock
from tests.support.fleet import SWEEP_YAML


@pytest.fixture
def scheduler_one_agent(tmp_path):
    store = Store(tmp_path)
    clock = Clock()
    scheduler = Scheduler(store, clock=clock, lease_seconds=30)
    token, _ = auth.create_token(store, 60, 5, now=clock.now)
    fp = {"chip": "Apple M4 Pro", "memoryBytes": str(48 * 2**30)}
    a1, _ = agents.enrol(store, token, "mac-1", fp, {}, ["mlx"], now=clock.now)
    yield scheduler, clock, a1
    store.close()


def state_of(scheduler, table, key, entity_id):
    with scheduler.store.tx() as con:
        return con.execute(f"SELECT state FROM {table} WHERE {key} = ?", [entity_id]).fetchone()[0]


def agent(scheduler, agent_id):
    with scheduler.store.tx() as con:
        return con.execute("SELECT state, current_job_id FROM agents WHERE agent_id = ?", [agent_id]).fetchone()


@pytest.mark.parametrize("machine", [JOBS, AGENTS, SWEEPS], ids=lambda m: m.entity)
def test_every_move_outside_the_table_is_refused_naming_entity_state_and_move(scheduler_one_agent, machine):
    """For every pair of states: a row put in the first and moved to the second moves exactly
    when the table allows it, and is refused otherwise with the entity, its state and the move."""
    scheduler, _, a1 = scheduler_one_agent
    sweep_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    with scheduler.store.tx() as con:
        entity_id = con.execute(f"SELECT {machine.key} FROM {machine.table} LIMIT 1").fetchone()[0]
    for current, to in itertools.product(machine.states, repeat=2):
        with scheduler.store.tx() as con:
            con.execute(f"UPDATE {machine.table} SET state = ? WHERE {machine.key} = ?", [current.value, entity_id])
            if machine.can(current, to):
                assert transition(con, machine, entity_id, to) == current
                sql = f"SELECT state FROM {machine.table} WHERE {machine.key} = ?"
                assert con.execute(sql, [entity_id]).fetchone()[0] == to
            else:
                with pytest.raises(StateError) as e:
                    transition(con, machine, entity_id, to)
                assert f"{machine.entity} {entity_id} is {current.value}" in str(e.value)
                assert f"it cannot become {to.value}" in str(e.value)
    with scheduler.store.tx() as con, pytest.raises(UnknownEntity, match=f"unknown {machine.entity} nope"):
        transition(con, machine, "nope", next(iter(machine.states)))


def test_final_states():
    assert JOBS.final() == {JobState.DONE, JobState.FAILED, JobState.REFUSED, JobState.CANCELLED}
    assert AGENTS.final() == {AgentState.REVOKED}
    assert SWEEPS.final() == {SweepState.DONE, SweepState.CANCELLED}


def test_an_agent_is_enrolled_until_heard_from_then_idle_busy_idle(scheduler_one_agent):
    scheduler, clock, a1 = scheduler_one_agent
    assert agent(scheduler, a1) == ("enrolled", None)
    scheduler.record_beats([Beat(a1, status="waiting for a job")])
    assert agent(scheduler, a1) == ("idle", None)
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    assert agent(scheduler, a1) == ("busy", job.job_id)
    scheduler.complete(a1, job.job_id, job.lease_id, 0)
    assert agent(scheduler, a1) == ("idle", None)


def test_an_agent_restarted_with_a_lease_is_idle_again_when_no_job_is_left(scheduler_one_agent):
    scheduler, _, a1 = scheduler_one_agent
    text = SWEEP_YAML.replace("max_attempts: 2", "max_attempts: 1")
    scheduler.submit(parse_sweep(text), text)
    job = scheduler.acquire(a1)
    assert scheduler.acquire(a1) is None  # asks again: its lease was lost with a restart, its last attempt
    assert state_of(scheduler, "jobs", "job_id", job.job_id) == "failed"
    assert agent(scheduler, a1) == ("idle", None)


def test_drain_finishes_the_job_takes_no_other_and_undrain_takes_jobs_again(scheduler_one_agent):
    scheduler, _, a1 = scheduler_one_agent
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    assert agents.set_state(scheduler, a1, "draining") == AgentState.DRAINING
    assert agent(scheduler, a1) == ("draining", job.job_id)
    with pytest.raises(StateError, match=f"agent {a1} is draining; it cannot become draining"):
        agents.set_state(scheduler, a1, "draining")
    assert agents.set_state(scheduler, a1, "idle") == AgentState.BUSY  # undrained while it holds its job
    agents.set_state(scheduler, a1, "draining")
    scheduler.complete(a1, job.job_id, job.lease_id, 0)
    assert agent(scheduler, a1) == ("draining", None)
    assert scheduler.acquire(a1) is None
    assert agents.set_state(scheduler, a1, "idle") == AgentState.IDLE
    assert scheduler.acquire(a1) is not None
    with pytest.raises(StateError, match=f"agent {a1} is busy; only a draining agent can be undrained"):
        agents.set_state(scheduler, a1, "idle")
    with pytest.raises(ValueError, match="state: cannot set an agent to 'offline'"):
        agents.set_state(scheduler, a1, "offline")
    with pytest.raises(UnknownEntity, match="unknown agent ag-nosuchagent"):
        agents.set_state(scheduler, "ag-nosuchagent", "draining")


@pytest.mark.parametrize("before", [[], ["draining"], ["draining", "idle"]], ids=["idle", "draining", "undrained"])
def test_revoked_is_final_whatever_came_before_and_after(scheduler_one_agent, before):
    """Every admin call after a revocation is refused, the row stays revoked, the credential
    stays refused, also read afresh from the file (a restart)."""
    scheduler, clock, a1 = scheduler_one_agent
    sweep_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    for state in before:
        agents.set_state(scheduler, a1, state)
    assert agents.set_state(scheduler, a1, "revoked") == AgentState.REVOKED
    for state in ("draining", "idle", "revoked", "draining", "idle"):
        with pytest.raises(StateError, match=f"agent {a1} is revoked \\(final\\); it cannot become"):
            agents.set_state(scheduler, a1, state)
    assert agent(scheduler, a1) == ("revoked", None)
    # Its open job is cancelled (no one else can run it), its lease gone, the sweep done.
    assert state_of(scheduler, "jobs", "job_id", job.job_id) == "cancelled"
    assert scheduler.extend_lease(a1, job.job_id, job.lease_id) is None
    assert state_of(scheduler, "sweeps", "sweep_id", sweep_id) == "done"
    # Nothing the agent does brings it back either.
    scheduler.record_beats([Beat(a1, status="still here")])
    assert scheduler.acquire(a1) is None
    assert agent(scheduler, a1) == ("revoked", None)
    path = scheduler.store.path
    scheduler.store.close()
    scheduler.store = Store(path.parent)
    again = Scheduler(scheduler.store, clock=clock, lease_seconds=30)
    with pytest.raises(StateError, match="revoked \\(final\\)"):
        agents.set_state(again, a1, "draining")
    (row,) = auth._agent_rows(scheduler.store, [a1])
    with pytest.raises(auth.AuthError, match="has been revoked"):
        auth._check_agent(f"sfa.{a1}.secret", lambda _: (auth.hash_secret("secret"), row[1]))


def test_a_refused_job_is_refused_with_its_reason_never_retried_and_closes_the_sweep(scheduler_one_agent):
    scheduler, _, a1 = scheduler_one_agent
    sweep_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)  # max_attempts: 2
    job = scheduler.acquire(a1)
    scheduler.refuse(a1, job.job_id, job.lease_id, "engine 'vllm' is not one this agent runs")
    with scheduler.store.tx() as con:
        state, reason = con.execute("SELECT state, reason FROM jobs").fetchone()
    assert (state, reason) == ("refused", "attempt 1 of 2: refused: engine 'vllm' is not one this agent runs")
    assert scheduler.acquire(a1) is None
    assert agent(scheduler, a1) == ("idle", None)
    assert state_of(scheduler, "sweeps", "sweep_id", sweep_id) == "done"
    with pytest.raises(StateError, match="no longer valid \\(job is refused\\)"):
        scheduler.refuse(a1, job.job_id, job.lease_id, "again")


def test_a_sweep_is_cancelled_once_and_never_after_it_is_done(scheduler_one_agent):
    scheduler, _, a1 = scheduler_one_agent
    sweep_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    assert scheduler.cancel(sweep_id) == 1
    with pytest.raises(StateError, match=f"sweep {sweep_id} is cancelled \\(final\\); it cannot become cancelled"):
        scheduler.cancel(sweep_id)
    done_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    scheduler.complete(a1, job.job_id, job.lease_id, 0)
    with pytest.raises(StateError, match=f"sweep {done_id} is done \\(final\\); it cannot become cancelled"):
        scheduler.cancel(done_id)
    with pytest.raises(UnknownEntity, match="unknown sweep sw-unknown"):
        scheduler.cancel("sw-unknown")


def test_migration_4_makes_refused_failures_refused(tmp_path):
    """Jobs stored as failed with a refusal's reason before migration 4 become refused."""
    import duckdb

    from coordinator.store import migrate, migrations

    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE)")
    for version, sql in migrations()[:3]:
        con.execute(sql)
        con.execute("INSERT INTO schema_migrations VALUES (?, 0)", [version])
    for job_id, state, reason in [
        ("job-refused", "failed", "attempt 1 of 2: refused: unknown engine"),
        ("job-failed", "failed", "attempt 2 of 2: worker killed by SIGKILL"),
        ("job-done", "done", ""),
    ]:
        con.execute(
            "INSERT INTO jobs (job_id, sweep_id, agent_id, spec, state, max_attempts, reason, created_at,"
            " updated_at, seq) VALUES (?, 'sw', 'ag', '{}', ?, 2, ?, 0, 0, 0)",
            [job_id, state, reason],
        )
    migrate(con)
    rows = dict(con.execute("SELECT job_id, state FROM jobs").fetchall())
    assert rows == {"job-refused": "refused", "job-failed": "failed", "job-done": "done"}
    seqs = dict(con.execute("SELECT job_id, seq FROM jobs").fetchall())
    assert seqs["job-refused"] > 0 and seqs["job-failed"] == 0  # mirrors fetch the changed row only
    con.close()

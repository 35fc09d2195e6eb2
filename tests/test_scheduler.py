"""The job state machine against a real DuckDB file, with a fake clock."""

import json

import pytest

from coordinator import agents, auth
from coordinator.ingest import ingest
from coordinator.scheduler import Beat, NoMatchingAgents, Scheduler, SchedulerError
from coordinator.store import Store, migrations, open_readonly
from specfleet.sweeps import parse_sweep
from tests.support.clocks import FakeClock
from tests.support.fleet import SWEEP_YAML, make_run


@pytest.fixture
def scheduler_two_agents(tmp_path):
    store = Store(tmp_path)
    clock = FakeClock()
    scheduler = Scheduler(store, clock=clock, lease_seconds=30)
    token, _ = auth.create_token(store, 60, 5, now=clock.now)
    fp = {"chip": "Apple M4 Pro", "memoryBytes": str(48 * 2**30)}
    a1, _ = agents.enrol(store, token, "mac-1", fp, {}, ["mlx"], now=clock.now)
    a2, _ = agents.enrol(store, token, "mac-2", fp, {}, ["llama.cpp"], now=clock.now)
    yield scheduler, clock, a1, a2
    store.close()


def job_state(scheduler, job_id):
    with scheduler.store.tx() as con:
        return con.execute("SELECT state, attempt, reason FROM jobs WHERE job_id = ?", [job_id]).fetchone()


def test_submit_creates_one_job_per_cell_per_matching_agent(scheduler_two_agents):
    scheduler, _, a1, a2 = scheduler_two_agents
    sweep_id, jobs = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    assert jobs == 1  # engines: [mlx], one sampler, one prompt set; only mac-1 has mlx
    assert scheduler.acquire(a2) is None
    job = scheduler.acquire(a1)
    assert job.sweep_id == sweep_id and job.attempt == 1
    assert [a["method"] for a in job.spec["arms"]] == ["baseline", "draft"]


def test_no_matching_agent_stores_nothing(scheduler_two_agents):
    scheduler, *_ = scheduler_two_agents
    text = SWEEP_YAML + "target: {chip_families: [M1]}\n"
    with pytest.raises(NoMatchingAgents):
        scheduler.submit(parse_sweep(text), text)
    with scheduler.store.tx() as con:
        assert con.execute("SELECT count(*) FROM sweeps").fetchone()[0] == 0


def test_one_job_at_a_time_and_heartbeat_extends_the_lease(scheduler_two_agents):
    scheduler, clock, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    clock.now += 25
    assert scheduler.extend_lease(a1, job.job_id, job.lease_id) == 30
    clock.now += 25  # 50 s after acquire, 25 after the heartbeat: still leased
    assert scheduler.expire_leases() == 0
    assert job_state(scheduler, job.job_id)[0] == "leased"


def test_expired_lease_requeues_then_fails_at_max_attempts(scheduler_two_agents):
    scheduler, clock, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)  # max_attempts: 2
    job = scheduler.acquire(a1)
    clock.now += 31
    assert scheduler.expire_leases() == 1
    state, attempt, reason = job_state(scheduler, job.job_id)
    assert (state, attempt) == ("queued", 1) and "lease expired" in reason
    again = scheduler.acquire(a1)
    assert again.job_id == job.job_id and again.attempt == 2 and again.lease_id != job.lease_id
    clock.now += 31
    scheduler.expire_leases()
    state, attempt, reason = job_state(scheduler, job.job_id)
    assert state == "failed" and "attempt 2 of 2" in reason
    with scheduler.store.tx() as con:
        assert con.execute("SELECT state FROM sweeps").fetchone()[0] == "done"


def test_late_result_after_requeue_is_refused(scheduler_two_agents):
    scheduler, clock, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    old = scheduler.acquire(a1)
    clock.now += 31
    scheduler.expire_leases()
    new = scheduler.acquire(a1)
    with pytest.raises(SchedulerError, match="no longer valid"):
        ingest(scheduler, a1, old.job_id, old.lease_id, make_run(old.job_id))
    dup, _ = ingest(scheduler, a1, new.job_id, new.lease_id, run := make_run(new.job_id))
    assert not dup
    assert ingest(scheduler, a1, new.job_id, new.lease_id, run)[0] is True  # a retry is acknowledged once


def test_complete_requires_every_run_stored_and_closes_the_sweep(scheduler_two_agents):
    scheduler, _, a1, _ = scheduler_two_agents
    sweep_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    ingest(scheduler, a1, job.job_id, job.lease_id, make_run(job.job_id))
    with pytest.raises(SchedulerError, match="2 runs but 1"):
        scheduler.complete(a1, job.job_id, job.lease_id, 2)
    scheduler.complete(a1, job.job_id, job.lease_id, 1)
    assert job_state(scheduler, job.job_id)[0] == "done"
    with scheduler.store.tx() as con:
        assert con.execute("SELECT state FROM sweeps WHERE sweep_id = ?", [sweep_id]).fetchone()[0] == "done"
        assert con.execute("SELECT state FROM agents WHERE agent_id = ?", [a1]).fetchone()[0] == "idle"
    with pytest.raises(SchedulerError):
        scheduler.complete(a1, job.job_id, job.lease_id, 1)  # done is terminal


def test_cancel_ends_open_jobs_and_frees_the_agent(scheduler_two_agents):
    scheduler, _, a1, _ = scheduler_two_agents
    sweep_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    assert scheduler.cancel(sweep_id) == 1
    assert job_state(scheduler, job.job_id)[0] == "cancelled"
    assert scheduler.extend_lease(a1, job.job_id, job.lease_id) is None
    with pytest.raises(SchedulerError):
        scheduler.cancel("sw-unknown")


def test_refused_job_is_refused_without_retry_and_crash_retries(scheduler_two_agents):
    scheduler, _, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    assert scheduler.fail(a1, job.job_id, job.lease_id, "worker killed by SIGKILL", retry=True) is True
    job = scheduler.acquire(a1)
    scheduler.refuse(a1, job.job_id, job.lease_id, "unknown engine")
    assert job_state(scheduler, job.job_id) == ("refused", 2, "attempt 2 of 2: refused: unknown engine")


def test_restart_keeps_everything(tmp_path, scheduler_two_agents):
    scheduler, _, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    ingest(scheduler, a1, job.job_id, job.lease_id, make_run(job.job_id))
    path = scheduler.store.path
    scheduler.store.close()
    reopened = Store(path.parent)
    with reopened.tx() as con:
        counts = [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("agents", "sweeps", "jobs", "runs")]
    reopened.close()
    assert counts == [2, 1, 1, 1]
    ro = open_readonly(path.parent)
    assert ro.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == migrations()[-1][0]
    ro.close()
    scheduler.store = Store(path.parent)  # let the fixture close something open


def test_a_job_goes_only_to_agents_with_the_engine_and_the_memory_for_the_model(scheduler_two_agents):
    scheduler, clock, a1, a2 = scheduler_two_agents
    token, _ = auth.create_token(scheduler.store, 60, 1, now=clock.now)
    big, _ = agents.enrol(
        scheduler.store,
        token,
        "studio",
        {"chip": "Apple M3 Ultra", "memoryBytes": str(192 * 2**30)},
        {},
        ["mlx"],
        now=clock.now,
    )
    text = SWEEP_YAML.replace(
        "{target: /models/target, draft: /models/draft}", "{target: /t, draft: /d, memory_gb: 64}"
    )
    sweep = parse_sweep(text)
    assert sweep.models["mlx"][0]["memory_gb"] == 64  # the engine's one model pair
    _, jobs = scheduler.submit(sweep, text)
    assert jobs == 1  # mac-1 has mlx but 48 GB; mac-2 has no mlx; the studio has both
    assert scheduler.acquire(a1) is None and scheduler.acquire(a2) is None
    spec = scheduler.acquire(big).spec
    assert spec["model"] == {"target": "/t", "draft": "/d"} and spec["memory_gb"] == 64

    too_big = text.replace("memory_gb: 64", "memory_gb: 256")
    with pytest.raises(NoMatchingAgents, match="mlx with 256 GB of memory"):
        scheduler.submit(parse_sweep(too_big), too_big)


def test_a_batch_of_reports_refuses_only_the_bad_ones(scheduler_two_agents):
    from coordinator.ingest import InvalidRun, Report, ingest_many

    scheduler, _, a1, a2 = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    good = make_run(job.job_id)
    results = ingest_many(
        scheduler,
        [
            Report(a1, job.job_id, job.lease_id, good),
            Report(a1, job.job_id, job.lease_id, good),  # a retry inside the same batch
            Report(a1, job.job_id, job.lease_id, make_run(job.job_id, decode_tokens_per_second=float("nan"))),
            Report(a1, job.job_id, "lease-stale", make_run(job.job_id)),
            Report(a2, job.job_id, job.lease_id, make_run(job.job_id)),
        ],
    )
    assert results[0][0] is False and results[1] == (True, results[0][1])
    assert isinstance(results[2], InvalidRun) and "decode_tokens_per_second" in str(results[2])
    assert isinstance(results[3], SchedulerError) and "no longer valid" in str(results[3])
    assert isinstance(results[4], SchedulerError) and "belongs to another agent" in str(results[4])
    later = ingest_many(
        scheduler,
        [
            Report(a1, job.job_id, job.lease_id, good),  # a retry in a later batch
            Report(a1, job.job_id, "lease-stale", good),  # a retry after the lease ended: still acknowledged
            Report(a2, job.job_id, "lease-stale", good),  # the same run id from another agent
            Report(a1, job.job_id, job.lease_id, make_run(job.job_id)),  # a new run beside the retries
        ],
    )
    assert later[:2] == [(True, results[0][1])] * 2
    assert isinstance(later[2], InvalidRun) and "already stored by another agent" in str(later[2])
    assert later[3][0] is False and later[3][1] > results[0][1]
    scheduler.complete(a1, job.job_id, job.lease_id, 2)
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    next_job = scheduler.acquire(a1)
    after = ingest_many(
        scheduler,
        [
            Report(a1, job.job_id, job.lease_id, make_run(job.job_id)),  # a new run for a finished job
            Report(a1, "job-unknown", job.lease_id, make_run("job-unknown")),
            Report(a1, next_job.job_id, next_job.lease_id, make_run(next_job.job_id)),
        ],
    )
    assert isinstance(after[0], SchedulerError) and "no longer valid (job is done)" in str(after[0])
    assert isinstance(after[1], SchedulerError) and "unknown job job-unknown" in str(after[1])
    assert after[2][0] is False
    with scheduler.store.tx() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3


def test_a_restarted_scheduler_hands_out_the_queued_jobs(scheduler_two_agents):
    scheduler, clock, a1, a2 = scheduler_two_agents
    sweep_id, _ = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    with scheduler.store.tx() as con:
        queued = con.execute("SELECT job_id, agent_id FROM jobs WHERE state = 'queued'").fetchall()
    again = Scheduler(scheduler.store, clock=clock, lease_seconds=30)  # what a coordinator restart builds
    assert again.acquire(a2) is None  # the queued job is mac-1's (mlx) after the restart too
    job = again.acquire(a1)
    assert queued == [(job.job_id, a1)]  # the very job queued before the restart, to the agent it was made for
    assert (job.sweep_id, job.attempt) == (sweep_id, 1)
    assert [a["method"] for a in job.spec["arms"]] == ["baseline", "draft"]
    assert job_state(again, job.job_id)[:2] == ("leased", 1)


def test_heartbeats_extend_only_live_leases_and_the_table_gets_the_expiry_when_written(scheduler_two_agents):
    scheduler, clock, a1, a2 = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    start = clock.now
    clock.now += 20
    beats = [
        Beat(a1, job.job_id, job.lease_id, "running"),
        Beat(a1, job.job_id, "lease-old", "running"),
        Beat(a2, status="idle"),
        Beat(a2, job.job_id, job.lease_id),  # not a2's job
    ]
    assert [scheduler.extend_lease(b.agent_id, b.job_id, b.lease_id) for b in beats] == [30, None, None, None]
    clock.now += 20  # 40 s after the lease began, 20 after the heartbeat
    assert scheduler.expire_leases() == 0
    scheduler.record_beats(beats)
    with scheduler.store.tx() as con:
        rows = dict(con.execute("SELECT name, status FROM agents").fetchall())
        expires = con.execute("SELECT lease_expires_at FROM jobs WHERE job_id = ?", [job.job_id]).fetchone()[0]
    assert rows == {"mac-1": "running", "mac-2": ""}  # an agent's latest beat in the batch wins
    assert expires == start + 50
    again = Scheduler(scheduler.store, clock=clock, lease_seconds=30)  # a restart reads the written expiry
    clock.now = start + 49
    assert again.expire_leases() == 0
    clock.now = start + 50
    assert again.expire_leases() == 1


def test_a_rolled_back_transaction_leaves_the_lease_live(scheduler_two_agents, monkeypatch):
    """Leases live in memory too: a transaction that fails after moving the job must leave
    both the table and the lease as they were."""
    scheduler, _, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    with pytest.raises(SchedulerError, match="agent reports 3 runs but 0 are stored"):
        scheduler.complete(a1, job.job_id, job.lease_id, 3)

    def disk_full(con, job_id):
        raise OSError("disk full")

    monkeypatch.setattr(scheduler, "_close_sweep_if_done", disk_full)  # after the job became done
    with pytest.raises(OSError):
        scheduler.complete(a1, job.job_id, job.lease_id, 0)
    assert job_state(scheduler, job.job_id)[0] == "leased"
    assert scheduler.extend_lease(a1, job.job_id, job.lease_id) == 30
    monkeypatch.undo()
    scheduler.complete(a1, job.job_id, job.lease_id, 0)
    assert scheduler.extend_lease(a1, job.job_id, job.lease_id) is None
    with pytest.raises(SchedulerError, match="no longer valid \\(job is done\\)"):
        scheduler.complete(a1, job.job_id, job.lease_id, 0)


def test_heartbeats_are_answered_from_memory_then_written_in_chunks(scheduler_two_agents, tmp_path):
    """A heartbeat costs no transaction: the servicer extends the lease in memory, keeps the
    latest beat per agent, and flush_beats writes them, FLUSH_CHUNK agents per write."""
    import asyncio

    from coordinator import service
    from coordinator.batching import Database
    from coordinator.metrics import Metrics
    from protos.specfleet.v1 import fleet_pb2 as pb

    scheduler, clock, a1, a2 = scheduler_two_agents
    token, _ = auth.create_token(scheduler.store, 60, 300, now=clock.now)
    fp = {"chip": "Apple M4 Pro", "memoryBytes": str(48 * 2**30)}
    ids = [a1, a2] + [
        agents.enrol(scheduler.store, token, f"idle-{i}", fp, {}, ["mlx"], now=clock.now)[0] for i in range(250)
    ]
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    db = Database()
    servicer = service.AgentServicer(scheduler, Metrics(scheduler), db)
    transactions = []
    record_beats = scheduler.record_beats
    scheduler.record_beats = lambda beats: transactions.append(len(beats)) or record_beats(beats)
    clock.now += 100

    async def beat_then_flush():
        for agent_id in ids:
            held = (job.job_id, job.lease_id) if agent_id == a1 else ("", "")
            request = pb.HeartbeatRequest(job_id=held[0], lease_id=held[1], status=f"beat {agent_id[-4:]}")
            assert servicer.beat(agent_id, request).lease_valid == (agent_id == a1)
        # a fingerprint outlives the later beats that carry none
        servicer.beat(a2, pb.HeartbeatRequest(fingerprint=pb.Fingerprint(chip="Apple M5")))
        servicer.beat(a2, pb.HeartbeatRequest(status=f"beat {a2[-4:]}"))
        assert transactions == []  # nothing written per call
        await servicer.flush_beats()

    try:
        asyncio.run(beat_then_flush())
    finally:
        db.close()
    assert transactions == [100, 100, 52]
    with scheduler.store.tx() as con:
        rows = con.execute("SELECT agent_id, last_seen, status FROM agents").fetchall()
        expires = con.execute("SELECT lease_expires_at FROM jobs WHERE job_id = ?", [job.job_id]).fetchone()[0]
    assert len(rows) == 252 and all(seen == clock.now and status == f"beat {a[-4:]}" for a, seen, status in rows)
    assert expires == clock.now + 30
    with scheduler.store.tx() as con:
        assert con.execute("SELECT chip FROM agents WHERE agent_id = ?", [a2]).fetchone()[0] == "Apple M5"


def test_heartbeats_written_while_the_reaper_expires_an_extended_lease_are_all_kept(scheduler_two_agents, monkeypatch):
    """The reaper takes an expired lease out of memory, then ends its attempt in a transaction.
    A write of heartbeats in between (the flusher's thread) once met the extension still pending
    for that lease, raised KeyError and lost every agent's beat in the batch."""
    import threading

    scheduler, clock, a1, a2 = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    assert scheduler.extend_lease(a1, job.job_id, job.lease_id) == 30  # pending: the table lacks it
    clock.now += 31
    errors, writers = [], []
    end_attempt = scheduler._end_attempt

    def heartbeats_written_meanwhile(*args, **kwargs):
        def write():
            try:
                scheduler.record_beats([Beat(a1, status="still here"), Beat(a2, status="idle and well")])
            except Exception as e:
                errors.append(e)

        writers.append(threading.Thread(target=write))
        writers[-1].start()
        writers[-1].join(timeout=1)  # long enough to fail, if it fails; else it waits for the reaper
        return end_attempt(*args, **kwargs)

    monkeypatch.setattr(scheduler, "_end_attempt", heartbeats_written_meanwhile)
    assert scheduler.expire_leases() == 1
    writers[0].join(timeout=10)
    assert errors == [] and not writers[0].is_alive()
    with scheduler.store.tx() as con:
        rows = dict(con.execute("SELECT agent_id, status FROM agents").fetchall())
        seen = con.execute("SELECT min(last_seen) FROM agents").fetchone()[0]
        assert con.execute("SELECT state, lease_expires_at FROM jobs").fetchone() == ("queued", None)
    assert rows == {a1: "still here", a2: "idle and well"} and seen == clock.now


def test_a_failed_write_of_heartbeats_keeps_them_for_the_next(scheduler_two_agents, monkeypatch):
    """No batch of heartbeats is lost: a write that fails leaves them for the next flush,
    unless a newer beat of the same agent came meanwhile."""
    import asyncio

    from coordinator import service
    from coordinator.batching import Database
    from coordinator.metrics import Metrics
    from protos.specfleet.v1 import fleet_pb2 as pb

    scheduler, clock, a1, a2 = scheduler_two_agents
    db = Database()
    servicer = service.AgentServicer(scheduler, Metrics(scheduler), db)
    record_beats = scheduler.record_beats

    def disk_full(beats):
        servicer.beat(a2, pb.HeartbeatRequest(status="newer"))  # arrives while the write fails
        raise OSError("disk full")

    async def flush_twice():
        servicer.beat(a1, pb.HeartbeatRequest(status="first"))
        servicer.beat(a2, pb.HeartbeatRequest(status="older"))
        monkeypatch.setattr(scheduler, "record_beats", disk_full)
        with pytest.raises(OSError):
            await servicer.flush_beats()
        monkeypatch.setattr(scheduler, "record_beats", record_beats)
        await servicer.flush_beats()

    try:
        asyncio.run(flush_twice())
    finally:
        db.close()
    with scheduler.store.tx() as con:
        assert dict(con.execute("SELECT agent_id, status FROM agents").fetchall()) == {a1: "first", a2: "newer"}


PINNED_YAML = """
name: pinned
engines: [llama-server]
models: {llama-server: {target: t.gguf}}
prompt_sets: [code]
arms:
  - {spec_type: ngram-mod, depths: [8], server_build: b9330}
  - {spec_type: ngram-mod, depths: [8], server_build: b9500}
"""


def test_a_pinned_build_goes_only_to_agents_that_report_it_and_an_unknown_build_is_refused(tmp_path):
    store = Store(tmp_path)
    clock = FakeClock()
    scheduler = Scheduler(store, clock=clock)
    token, _ = auth.create_token(store, 60, 5, now=clock.now)
    fp = {"chip": "Apple M1 Max", "memoryBytes": str(32 * 2**30)}
    both = {**fp, "engineVersions": {"llama-server@b9330": "b9330-328874d", "llama-server@b9500": "b9500-0c1e570"}}
    older = {**fp, "engineVersions": {"llama-server@b9330": "b9330-328874d", "llama-server.build": "9330"}}
    a_both, _ = agents.enrol(store, token, "mac-both", both, {}, ["llama-server"], now=clock.now)
    a_old, _ = agents.enrol(store, token, "mac-old", older, {}, ["llama-server"], now=clock.now)
    agents.enrol(store, token, "mac-none", fp, {}, ["llama-server"], now=clock.now)
    _, jobs = scheduler.submit(parse_sweep(PINNED_YAML), PINNED_YAML)
    assert jobs == 3  # b9330 on both agents that have it, b9500 on the one
    with store.tx() as con:
        rows = con.execute("SELECT a.name, j.spec FROM jobs j JOIN agents a USING (agent_id)").fetchall()
    pinned = sorted((name, json.loads(spec)["server"]["build"]) for name, spec in rows)
    assert pinned == [("mac-both", "b9330"), ("mac-both", "b9500"), ("mac-old", "b9330")]
    for _, spec in rows:  # each cell: its own baseline and the arm, the build on the cell
        assert [(a["method"], a["build"]) for a in json.loads(spec)["arms"]] == [("baseline", ""), ("ngram-mod", "")]
    assert scheduler.acquire(a_old).spec["server"]["build"] == "b9330"
    assert scheduler.acquire(a_both) is not None

    text = PINNED_YAML.replace("b9500", "b9999")
    with pytest.raises(NoMatchingAgents) as refused:
        scheduler.submit(parse_sweep(text), text)
    message = str(refused.value)
    assert "can run llama-server build(s) b9999 that its arms pin" in message, message
    assert "b9330 on mac-both, mac-old; b9500 on mac-both" in message and "nothing was stored" in message
    with store.tx() as con:
        assert con.execute("SELECT count(*) FROM sweeps").fetchone()[0] == 1
    store.close()


def attempts_of(scheduler, job_id):
    with scheduler.store.tx() as con:
        return con.execute(
            "SELECT attempt, outcome, reclaims FROM attempts WHERE job_id = ? ORDER BY started_at, attempt", [job_id]
        ).fetchall()


def test_a_lapsed_lease_is_reclaimed_when_no_other_attempt_began_and_its_runs_count(scheduler_two_agents):
    scheduler, clock, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    clock.now += 31  # the agent was out of reach for longer than its lease
    assert scheduler.expire_leases() == 1
    assert job_state(scheduler, job.job_id)[:2] == ("queued", 1)
    assert attempts_of(scheduler, job.job_id) == [(1, "expired", 0)]
    assert scheduler.reclaim("ag-someone-else", job.job_id, job.lease_id) is None  # not its lease
    assert scheduler.reclaim(a1, job.job_id, job.lease_id) == 30  # its heartbeat is back
    assert job_state(scheduler, job.job_id)[:2] == ("leased", 1) and scheduler.live(a1, job.job_id, job.lease_id)
    dup, _ = ingest(scheduler, a1, job.job_id, job.lease_id, make_run(job.job_id))
    assert not dup
    scheduler.complete(a1, job.job_id, job.lease_id, 1)
    assert job_state(scheduler, job.job_id)[:2] == ("done", 1)
    assert attempts_of(scheduler, job.job_id) == [(1, "done", 1)]


def test_a_lapsed_lease_is_reclaimed_by_its_runs_or_its_end_alone(scheduler_two_agents):
    scheduler, clock, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    job = scheduler.acquire(a1)
    clock.now += 31
    scheduler.expire_leases()
    assert ingest(scheduler, a1, job.job_id, job.lease_id, make_run(job.job_id))[0] is False  # a run, first
    clock.now += 31
    scheduler.expire_leases()
    scheduler.complete(a1, job.job_id, job.lease_id, 1)  # the job's end, first
    assert job_state(scheduler, job.job_id)[:2] == ("done", 1)
    assert attempts_of(scheduler, job.job_id) == [(1, "done", 2)]


def test_a_lapsed_lease_stays_lost_once_another_attempt_began(scheduler_two_agents):
    scheduler, clock, a1, _ = scheduler_two_agents
    scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    old = scheduler.acquire(a1)
    clock.now += 31
    scheduler.expire_leases()
    new = scheduler.acquire(a1)  # the agent restarted and took the job again
    assert scheduler.reclaim(a1, old.job_id, old.lease_id) is None
    with pytest.raises(SchedulerError, match="no longer valid"):
        scheduler.complete(a1, old.job_id, old.lease_id, 0)
    assert job_state(scheduler, new.job_id)[:2] == ("leased", 2)
    assert attempts_of(scheduler, old.job_id) == [(1, "expired", 0), (2, None, 0)]

"""The lake store (coordinator/lake.py): duckdb and its extension packages at one version, the
migrations' dialect, and two coordinators' stores on one DuckLake whose catalog is a real
PostgreSQL cluster (tests/support/postgres.py) racing for one job and one run."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from importlib import metadata
from urllib.parse import urlsplit

import duckdb
import grpc
import pytest

from coordinator import agents, auth, lake, upkeep
from coordinator.ingest import ingest
from coordinator.scheduler import Scheduler, SchedulerError
from coordinator.store import Store, StoreConflict, migrations, schema_version
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AgentApi, channel, target
from specfleet.sweeps import parse_sweep
from tests.support import postgres
from tests.support.fleet import LINUX_BOX, SWEEP_YAML, admin_for, make_run, start_coordinator


def test_duckdb_and_its_extension_packages_are_at_one_version():
    for name, (package, _) in lake.EXTENSIONS.items():
        assert metadata.version(package.replace("_", "-")) == duckdb.__version__, name
        assert lake.extension_file(name).is_file()


def test_a_package_at_another_version_is_named(monkeypatch):
    real = metadata.version
    other = "duckdb-extension-ducklake"
    monkeypatch.setattr(metadata, "version", lambda dist: "0.0.1" if dist == other else real(dist))
    with pytest.raises(lake.ExtensionMismatch, match=r"duckdb is .* but duckdb-extension-ducklake is 0\.0\.1"):
        lake.extension_file("ducklake")


def test_dialect_drops_key_constraints_and_the_sequence():
    sql = lake.dialect(
        "CREATE SEQUENCE ingest_seq START 1;\nCREATE TABLE t (k VARCHAR PRIMARY KEY, s BIGINT NOT NULL UNIQUE,"
        " a INT, b INT, PRIMARY KEY (a, b));\nALTER TABLE t ADD COLUMN u VARCHAR[] DEFAULT [];"
    )
    assert "ADD COLUMN u VARCHAR[]; UPDATE t SET u = [];" in sql
    assert "PRIMARY" not in sql and "UNIQUE" not in sql and "SEQUENCE" not in sql
    assert f"CREATE TABLE {lake.COUNTER_TABLE}" in sql and "s BIGINT NOT NULL," in sql


@pytest.mark.parametrize(
    "text, problem",
    [
        ("postgres://x/y", "expected 'file' or ducklake"),
        ("ducklake:postgres://u@h:1/db", "no data_path"),
        ("ducklake:postgres://u@h:1/?data_path=/x", "host and a database"),
    ],
)
def test_a_bad_store_is_named(text, problem):
    with pytest.raises(ValueError, match=problem):
        lake.LakeUrl.parse(text)


@pytest.fixture(scope="module")
def cluster():
    if postgres.bin_dir() is None:
        pytest.skip("no PostgreSQL server: scripts/setup.sh installs it")
    with postgres.cluster() as c:
        yield c


@pytest.fixture
def two_stores(cluster, tmp_path, request):
    database = "lake_" + request.node.name.split("[")[0][5:40]
    cluster.create_database(database)
    url = lake.LakeUrl.parse(cluster.store(tmp_path / "lake-data", database))
    first = Store(tmp_path / "a", url)
    second = Store(tmp_path / "b", url)  # a coordinator started on a lake another one wrote
    yield first, second
    first.close()
    second.close()


def enrolled_job(store: Store) -> tuple[Scheduler, str, str]:
    scheduler = Scheduler(store, lease_seconds=30)
    token, _ = auth.create_token(store, 60, 5)
    agent_id, _ = agents.enrol(store, token, "mac-1", {"chip": "Apple M4 Pro", "memoryBytes": "1"}, {}, ["mlx"])
    sweep_id, jobs = scheduler.submit(parse_sweep(SWEEP_YAML), SWEEP_YAML)
    assert jobs == 1
    return scheduler, agent_id, sweep_id


@pytest.mark.process
def test_the_lake_is_migrated_once_and_shared(two_stores):
    first, second = two_stores
    with first.reader() as con:
        assert schema_version(con) == migrations()[-1][0]
    with first.tx() as con:
        con.execute("INSERT INTO sweeps VALUES ('s1', 'n', 'y', 'running', 0, nextval('ingest_seq'), [])")
    with second.tx() as con:
        assert con.execute("SELECT sweep_id, seq FROM sweeps").fetchall() == [("s1", 1)]
        assert con.execute("SELECT nextval('ingest_seq')").fetchone()[0] == 2  # the counter moved on


@pytest.mark.process
def test_a_transaction_that_lost_the_race_conflicts_and_changes_nothing(two_stores):
    first, second = two_stores
    enrolled_job(first)
    lease = "UPDATE jobs SET state = 'leased', lease_id = ?, seq = nextval('ingest_seq') WHERE state = 'queued'"
    with pytest.raises(StoreConflict):
        with first.tx() as con:
            assert con.execute(lease, ["lease-a"]).fetchone()[0] == 1
            with second.tx() as other:  # began after, commits first
                assert other.execute(lease, ["lease-b"]).fetchone()[0] == 1
    with first.reader() as con:
        assert con.execute("SELECT lease_id FROM jobs").fetchall() == [("lease-b",)]


@pytest.mark.process
def test_two_coordinators_racing_for_one_job_leave_one_live_lease(two_stores):
    first, second = two_stores
    scheduler_a, agent_id, _ = enrolled_job(first)
    scheduler_b = Scheduler(second, lease_seconds=30)
    both_began = threading.Barrier(2, timeout=30)
    conflicts = []
    for store in (first, second):  # each one's first transaction waits until the other's began
        take, first_time = store._take_counter, [True]

        def waiting(take=take, first_time=first_time):
            take()
            if first_time and first_time.pop():
                both_began.wait()

        store._take_counter = waiting
        retrying = store.retrying

        def counting(fn, *args, retrying=retrying):
            def once():
                try:
                    return fn(*args)
                except StoreConflict:
                    conflicts.append(1)
                    raise

            return retrying(once)

        store.retrying = counting
    leased = {}
    threads = [
        threading.Thread(target=lambda s=s, st=st: leased.__setitem__(st, st.retrying(s.try_acquire, agent_id)))
        for s, st in ((scheduler_a, first), (scheduler_b, second))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert conflicts, "both transactions began on one snapshot: one must have lost"
    with first.reader() as con:
        ((job_id, lease_id, attempt),) = con.execute("SELECT job_id, lease_id, attempt FROM jobs").fetchall()
        assert attempt == 2  # the loser ran again, saw the agent's lease and took its place
    live = [job for job in leased.values() if job.lease_id == lease_id]
    assert len(live) == 1 and live[0].job_id == job_id
    dead = next(job for job in leased.values() if job.lease_id != lease_id)
    for scheduler, store in ((scheduler_a, first), (scheduler_b, second)):  # refused by both coordinators
        with store.tx() as con, pytest.raises(SchedulerError, match="no longer valid"):
            scheduler.lease(con, agent_id, job_id, dead.lease_id)
        with store.tx() as con:
            assert scheduler.lease(con, agent_id, job_id, lease_id).lease_id == lease_id


@pytest.mark.process
def test_one_run_sent_to_two_coordinators_is_stored_once(two_stores):
    first, second = two_stores
    scheduler_a, agent_id, _ = enrolled_job(first)
    job = scheduler_a.try_acquire(agent_id)
    scheduler_b = Scheduler(second, lease_seconds=30)
    run = make_run(job.job_id)
    results = {}
    threads = [
        threading.Thread(
            target=lambda s=s: results.__setitem__(
                s, s.store.retrying(ingest, s, agent_id, job.job_id, job.lease_id, run)
            )
        )
        for s in (scheduler_a, scheduler_b)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(duplicate for duplicate, _ in results.values()) == [False, True]
    assert len({seq for _, seq in results.values()}) == 1
    with second.reader() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_a_list_of_addresses_is_one_pick_first_target():
    assert target("127.0.0.1:1") == ("127.0.0.1:1", [])
    address, options = target("127.0.0.1:1, localhost:2")
    assert address == "ipv4:127.0.0.1:1,127.0.0.1:2" and ("grpc.lb_policy_name", "pick_first") in options
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        target("127.0.0.1:1,nowhere")


@pytest.mark.process
def test_an_agent_given_both_coordinators_moves_to_the_next_when_one_is_gone(cluster, tmp_path):
    store = cluster.store(tmp_path / "lake-data", "postgres")
    first = start_coordinator(tmp_path / "one", store=store, name="one")
    second = start_coordinator(tmp_path / "two", store=store, name="two")
    running = [first, second]
    try:
        both = f"127.0.0.1:{first.port},127.0.0.1:{second.port}"
        token = admin_for(second).CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
        enrolled = AgentApi(channel(both)).enrol(token, "mac-1", LINUX_BOX, {}, ["mlx"])  # served by the first
        api = AgentApi(channel(both), enrolled.credential)
        assert api.ping().agent_id == enrolled.agent_id
        running.remove(first)
        first.stop(0)
        deadline = time.monotonic() + 30
        while True:  # the channel sees the connection close, then connects to the next address
            try:
                assert api.ping(timeout=5).agent_id == enrolled.agent_id
                break
            except grpc.RpcError as e:
                assert time.monotonic() < deadline, e
                time.sleep(0.2)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{second.metrics_port}/metrics").read().decode()
        assert 'specfleet_coordinator_info{coordinator="two",store="lake"} 1.0' in metrics
    finally:
        for coordinator in running:
            coordinator.stop(0)


@pytest.mark.process
@pytest.mark.timeout(300)  # the bug this guards against was a wait without end
def test_upkeep_beside_a_second_coordinator_finishes_and_keeps_every_row(two_stores, tmp_path):
    first, second = two_stores
    for _ in range(12):  # small commits: their rows are inlined in the catalog
        auth.create_token(first, 60, 1)
    auth.create_token(second, 60, 1)
    with second.tx() as con:  # the other coordinator in the middle of a transaction meanwhile
        before = con.execute("SELECT count(*) FROM tokens").fetchone()[0]
        done = upkeep.run_once(first.lake, call_seconds=120)
    assert set(done.took) == {upkeep.name_of(call) for call in upkeep.CALLS}, done.failed
    assert list((tmp_path / "lake-data").rglob("*.parquet"))  # the inlined rows went to a file
    auth.create_token(second, 60, 1)  # both stores go on writing and read every row
    for store in (first, second):
        with store.reader() as con:
            assert con.execute("SELECT count(*) FROM tokens").fetchone()[0] == before + 1 == 14

    # The coordinator's own schedule: a pass runs in its thread, and stop() ends it.
    scheduled = upkeep.Upkeep(first.lake, interval_seconds=0.2).start()
    deadline = time.monotonic() + 240
    while scheduled.passes + scheduled.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    scheduled.stop()
    assert scheduled.passes >= 1 and scheduled.failures == 0


@pytest.mark.process
@pytest.mark.timeout(300)
def test_an_upkeep_call_waiting_on_a_lock_is_cut_at_its_bound(two_stores, cluster):
    first, _ = two_stores
    auth.create_token(first, 60, 1)
    database = urlsplit(first.lake.postgres).path.strip("/")
    holder = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    holder.load_extension(str(lake.loadable("postgres")))
    holder.execute(f"ATTACH '{cluster.url(database)}' AS pg (TYPE postgres)")
    holder.execute("BEGIN")  # another session keeps snapshots from being written (not read) until it commits
    holder.execute("CALL postgres_execute('pg', 'LOCK TABLE ducklake_snapshot IN EXCLUSIVE MODE')")
    try:
        done = upkeep.run_once(first.lake, call_seconds=120)  # each call waits LOCK_SECONDS, not 120 s
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert "ducklake_flush_inlined_data" in done.failed  # it must commit a snapshot: it waited, and gave up
    for why in done.failed.values():  # PostgreSQL's lock timeout, or DuckDB's interrupt
        assert re.match(r"failed after [0-9.]+ s: .*(lock timeout|statement timeout|Interrupted)", why), why
    done = upkeep.run_once(first.lake, call_seconds=120)  # the next pass goes through
    assert {"ducklake_merge_adjacent_files", "ducklake_expire_snapshots"} <= set(done.took), done.failed
    with first.reader() as con:
        assert con.execute("SELECT count(*) FROM tokens").fetchone()[0] == 1

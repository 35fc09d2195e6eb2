"""The /metrics figures kept at ingest (coordinator/figures.py) equal the figures computed from
the runs table (specfleet/speedup.py), batch by batch, through lost and failed attempts, runs
that arrive before their baseline, degraded, lossy and zero-speed runs."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator import agents, auth, figures
from coordinator.ingest import Report, ingest_many
from coordinator.metrics import Metrics, ResultFigures
from coordinator.scheduler import Scheduler
from coordinator.store import Store
from specfleet import speedup
from specfleet.sweeps import parse_sweep
from tests.support.clocks import FakeClock as Clock
from tests.support.fleet import make_run

SWEEP = """
name: figures
models:
  mlx: {target: /models/target, draft: /models/draft}
engines: [mlx]
prompt_sets: [code, qa]
prompts: 3
methods: {draft: [2, 4]}
max_new_tokens: 16
repeats: 3
max_attempts: 3
"""
ARMS = (("baseline", 0), ("draft", 2), ("draft", 4))


@pytest.fixture
def scheduled_machines(tmp_path):
    store = Store(tmp_path)
    clock = Clock()
    scheduler = Scheduler(store, clock=clock, lease_seconds=30)
    token, _ = auth.create_token(store, 60, 5, now=clock.now)
    machines = []
    for i, chip in enumerate(("Apple M4 Pro", "Apple M4 Pro", "Apple M1 Max")):
        fp = {"chip": chip, "memoryBytes": str(48 * 2**30)}
        machines.append(agents.enrol(store, token, f"mac-{i}", fp, {}, ["mlx"], now=clock.now)[0])
    for _ in range(3):
        scheduler.submit(parse_sweep(SWEEP), SWEEP)
    yield scheduler, clock, machines
    store.close()


def job_runs(rng: random.Random, job, machine_level: float) -> list[str]:
    """Every run of a job (3 arms x 3 prompts x 3 repeats, and a verify-cost run), some of them
    degraded, lossy, at zero speed or of another comparable group."""
    out = []
    for p in range(3):
        for repeat in range(3):
            for method, depth in ARMS:
                tps = 100 * machine_level * (1 + 0.3 * depth / 4) * math.exp(rng.gauss(0, 0.1))
                extra = {"prompt_id": f"p{p}", "repeat": repeat, "attempt": job.attempt}
                roll = rng.random()
                if roll < 0.08:
                    extra["env_nominal"] = False
                elif roll < 0.12:
                    tps = 0.0
                elif roll < 0.16 and method != "baseline":
                    extra["lossless"] = False
                elif roll < 0.22:
                    extra["max_new_tokens"] = 64  # another comparable group
                elif roll < 0.5:
                    extra["env_nominal"] = True
                out.append(make_run(job.job_id, method, depth, tps=tps, **extra))
    out.append(make_run(job.job_id, "verify-cost", 0, tps=0.0, verify_cost_seconds=[0.01, 0.012]))
    rng.shuffle(out)  # arms arrive before their baselines, pairs span batches
    return out


def ingest_in_batches(rng: random.Random, scheduler, machine: str, job, runs: list[str]) -> None:
    runs = list(runs)
    while runs:
        n = rng.randint(1, 12)
        batch, runs = runs[:n], runs[n:]
        results = ingest_many(scheduler, [Report(machine, job.job_id, job.lease_id, r) for r in batch])
        assert all(isinstance(r, tuple) for r in results), results
        scheduler.store.catch_up_figures()  # as a scrape does: the figures follow the runs batch by batch


def from_runs(con) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The figures as specfleet/speedup.py computes them from the whole runs table (stalls included)."""
    arms = con.execute(
        f"SELECT {speedup.COMPARABLE_ID} AS comparable, chip, engine, any_value(target_reference), method, depth,"
        f" median(decode_tokens_per_second) FROM runs WHERE method != 'verify-cost'"
        " AND env_nominal IS DISTINCT FROM false AND decode_tokens_per_second > 0"
        " GROUP BY comparable, chip, engine, method, depth ORDER BY ALL"
    ).df()
    return speedup.speedups(con), speedup.groups(con), arms


def kept(con) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return figures.speedups(con), figures.groups(con), pd.DataFrame(figures.arms(con))


def assert_same(con) -> None:
    expected, got = from_runs(con), kept(con)
    assert len(expected[0]) > 0
    pd.testing.assert_frame_equal(got[0], expected[0], check_dtype=False, rtol=1e-12)
    pd.testing.assert_frame_equal(got[1], expected[1], check_dtype=False)
    arms, expected_arms = got[2], expected[2]
    assert arms.iloc[:, :6].values.tolist() == expected_arms.iloc[:, :6].values.tolist()
    assert arms.iloc[:, 6].tolist() == pytest.approx(expected_arms.iloc[:, 6].tolist(), rel=1e-12)


def test_figures_equal_the_runs_tables_through_a_fleets_history(scheduled_machines):
    scheduler, clock, machines = scheduled_machines
    rng = random.Random(20261201)
    levels = {m: 0.5 + i for i, m in enumerate(machines)}
    rounds = 0
    while True:
        leased = [(m, scheduler.acquire(m)) for m in machines]
        leased = [(m, j) for m, j in leased if j is not None]
        if not leased:
            break
        for machine, job in leased:
            runs = job_runs(rng, job, levels[machine])
            fate = rng.random()
            if fate < 0.25 and job.attempt < 3:  # half its runs, then the lease is lost: they stop counting
                ingest_in_batches(rng, scheduler, machine, job, runs[: len(runs) // 2])
                continue
            if fate < 0.35:  # some runs, then the job fails for good: none of them counts
                ingest_in_batches(rng, scheduler, machine, job, runs[: len(runs) // 3])
                scheduler.fail(machine, job.job_id, job.lease_id, "engine crashed", retry=False)
                continue
            ingest_in_batches(rng, scheduler, machine, job, runs)
            scheduler.complete(machine, job.job_id, job.lease_id, len(runs))
        clock.now += 31  # the leases not completed expire: their jobs go back to the queue
        scheduler.expire_leases()
        rounds += 1
        with scheduler.store.reader() as con:
            assert_same(con)
    assert rounds >= 3
    with scheduler.store.tx() as con:
        states = dict(con.execute("SELECT state, count(*) FROM jobs GROUP BY ALL").fetchall())
        lost = con.execute("SELECT count(*) FROM jobs WHERE attempt > 1").fetchone()[0]
    assert states.get("done", 0) > 0 and states.get("failed", 0) > 0 and lost > 0, (states, lost)


def test_a_rebuild_from_runs_gives_the_same_figures(scheduled_machines):
    scheduler, _, machines = scheduled_machines
    rng = random.Random(7)
    for machine in machines:
        job = scheduler.acquire(machine)
        ingest_in_batches(rng, scheduler, machine, job, job_runs(rng, job, 1.0))
    with scheduler.store.reader() as con:
        before = kept(con)
    with scheduler.store.autocommit() as con:
        assert not figures.ensure(con)  # up to date: nothing to do
        con.execute("UPDATE figure_state SET definition = 'an older definition'")
        assert figures.ensure(con)
    with scheduler.store.reader() as con:
        after = kept(con)
        assert_same(con)
    pd.testing.assert_frame_equal(after[0], before[0], rtol=1e-12)
    pd.testing.assert_frame_equal(after[1], before[1])


def test_runs_stored_behind_the_figures_back_are_caught_up_at_the_next_open(scheduled_machines, tmp_path):
    scheduler, _, machines = scheduled_machines
    rng = random.Random(3)
    job = scheduler.acquire(machines[0])
    runs = job_runs(rng, job, 1.0)
    ingest_in_batches(rng, scheduler, machines[0], job, runs[:10])
    with scheduler.store.tx() as con:  # a copy of the stored runs under other ids, figures not told
        con.execute(
            "INSERT INTO runs SELECT * REPLACE (uuid()::VARCHAR AS run_id, nextval('ingest_seq') AS seq) FROM runs"
        )
    scheduler.store.close()
    reopened = Store(tmp_path)
    try:
        with reopened.reader() as con:
            assert_same(con)
            assert con.execute("SELECT sum(runs) FROM figure_groups").fetchone()[0] == 2 * sum(
                json.loads(r)["method"] != "verify-cost" for r in runs[:10]
            )
    finally:
        reopened.close()
        scheduler.store = Store(tmp_path)  # for the fixture to close


def test_a_scrape_shows_the_kept_figures_and_follows_new_runs(scheduled_machines):
    scheduler, _, machines = scheduled_machines
    # One collector, recomputing whenever a run or a job changed: a scrape after new runs must not
    # show the figures cached before.
    metrics = Metrics(scheduler, results_every=0)
    rng = random.Random(11)
    for round_ in range(2):
        for machine in machines:
            job = scheduler.acquire(machine)
            runs = job_runs(rng, job, 1.0 + round_)
            ingest_in_batches(rng, scheduler, machine, job, runs)
            scheduler.complete(machine, job.job_id, job.lease_id, len(runs))
        for _ in range(2):  # the second scrape answers from the collector's cache: the same figures
            assert_scrape_equals_the_table(scheduler, metrics)


def assert_scrape_equals_the_table(scheduler, metrics: Metrics) -> None:
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    with scheduler.store.reader() as con:
        speedups, groups, arms = from_runs(con)
    shown = {
        (s.labels["comparable"], s.labels["chip"], s.labels["method"], s.labels["depth"]): s.value
        for s in families["specfleet_speedup_ratio"].samples
    }
    expected = {(r.comparable, r.chip, r.method, str(r.depth)): r.speedup for r in speedups.itertuples()}
    assert shown.keys() == expected.keys() and len(shown) >= 4
    assert list(shown.values()) == pytest.approx([expected[k] for k in shown], rel=1e-12)
    tps = {
        (s.labels["comparable"], s.labels["chip"], s.labels["method"], s.labels["depth"]): s.value
        for s in families["specfleet_decode_tokens_per_second"].samples
    }
    assert tps == pytest.approx({(r[0], r[1], r[4], str(r[5])): r[6] for r in arms.itertuples(index=False)})
    info = {s.labels["comparable"] for s in families["specfleet_comparable_group_info"].samples}
    assert info == set(groups["comparable"])


def test_the_result_figures_are_formatted_at_most_every_interval(scheduled_machines):
    scheduler, _, machines = scheduled_machines
    clock = Clock()
    results = ResultFigures(scheduler.store, every=5, clock=clock)
    rng = random.Random(5)
    job = scheduler.acquire(machines[0])
    runs = job_runs(rng, job, 1.0)
    ingest_in_batches(rng, scheduler, machines[0], job, runs[:20])
    first = results.text()
    ingest_in_batches(rng, scheduler, machines[0], job, runs[20:])
    clock.now += 4
    assert results.text() is first  # within the interval: the text formatted before
    clock.now += 1
    second = results.text()
    assert second != first  # past it, and runs came: formatted again
    clock.now += 60
    assert results.text() is second  # nothing changed since: nothing formatted

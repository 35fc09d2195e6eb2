"""The Compare page's figures kept per group (dashboard/group_figures.py) equal the page's own
computation on the group's runs: the group the page opens on after the first sync, a group once a
page has shown it, after a sync that brings late runs into kept groups, and after one that
replaces a job's attempt (its runs stop counting); a group whose runs or jobs changed reads as
not stored until it is computed again, and a group no page has shown is not computed at all.
A synthetic fleet (tests/support/synthetic.py) behind a real coordinator, stopped, changed in its
own store and started again between syncs. Also the worker that runs such work after a sync
(dashboard/after_sync.py)."""

from __future__ import annotations

import logging
import threading

import pandas as pd
import pytest

from coordinator.store import Store
from dashboard import after_sync, data, group_figures, queries
from dashboard.mirror import Mirror
from specfleet.data_dir import admin_credential
from tests.support.fleet import start_coordinator
from tests.support.synthetic import RUNS_PER_JOB, _cells, seed
from tests.test_dashboard_precomputed import Direct, admin

JOBS = 3  # three cells; each seeded again later on other machines: the same groups, more runs


def computed(mirror, groups) -> dict:
    """Per group, every figure as stored (None: not computed, or due)."""
    return {g: {n: group_figures.stored(mirror, g, n) for n in group_figures.NAMES} for g in groups}


def shown(mirror, g) -> dict:
    """Every figure of group g as a page reads it (stored, else computed and stored)."""
    return {n: group_figures.read(mirror, g, n) for n in group_figures.NAMES}


def live(mirror, groups) -> dict:
    """Per group, every figure as the page computes it from the runs (dashboard/data.py's queries)."""
    out = {}
    for g in groups:
        db, f = Direct(mirror), queries.Filters(comparable=g)
        values = queries.unit_values(db, f)
        table = queries.chip_components(db, f, values)
        out[g] = {
            "speedups": queries.speedups(db, f, queries.groups(db, f)),
            "decode_speed": queries.decode_speed(db, f),
            "chip_components": table,
            "chip_levels": queries.chip_levels(db, f, values),
            "chip_pairs": queries.chip_pairs(db, f, values, table),
        }
    return out


def assert_equal(kept: dict, fresh: dict) -> None:
    assert kept.keys() == fresh.keys()
    for g, figures in kept.items():
        for name, frame in figures.items():
            assert frame is not None, (g, name)
            pd.testing.assert_frame_equal(frame, fresh[g][name], check_dtype=False, obj=f"{g} {name}")


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    """What the mirror held after each of three syncs, beside the page's own computation."""
    data_dir = tmp_path_factory.mktemp("group-figures")
    seed(data_dir, JOBS * RUNS_PER_JOB)
    seed(data_dir, JOBS * RUNS_PER_JOB, start_job=len(_cells()), redraw=True)  # a second machine in each group
    coordinator = start_coordinator(data_dir)
    mirror = queries.open_mirror(f"127.0.0.1:{coordinator.port}", admin_credential(data_dir))
    group_figures.attach(mirror)
    after_sync.attach(mirror, lambda seqs: group_figures.refresh(mirror))
    seen = {}
    try:
        mirror.sync()  # the first: refreshed before it returns
        groups = list(queries.groups(mirror, queries.Filters())["comparable"])  # the page opens on the first
        seen["first"] = (computed(mirror, groups), live(mirror, groups))
        seen["second shown"] = (shown(mirror, groups[1]), computed(mirror, groups))

        def restart(change) -> None:
            nonlocal coordinator
            coordinator.stop()
            change()
            coordinator = start_coordinator(data_dir)
            mirror.admin = admin(coordinator)
            mirror.sync()  # a later sync: the worker's
            assert after_sync.wait(mirror)

        restart(lambda: seed(data_dir, JOBS * RUNS_PER_JOB, start_job=2 * len(_cells()), redraw=True))
        seen["late runs, within REFIT_SECONDS"] = computed(mirror, groups)
        group_figures.REFIT_SECONDS, refit = 0.0, group_figures.REFIT_SECONDS
        try:
            seen["refreshed"] = group_figures.refresh(mirror)
            seen["not shown, after late runs"] = computed(mirror, groups)[groups[2]]
            seen["third shown"] = shown(mirror, groups[2])
            seen["late runs"] = (computed(mirror, groups), live(mirror, groups))
            job = mirror.query("SELECT job_id FROM runs WHERE comparable = $g LIMIT 1", {"g": groups[0]})["job_id"][0]

            def replace_attempt() -> None:
                store = Store(data_dir)
                try:
                    with store.tx() as con:
                        con.execute("UPDATE jobs SET attempt = 2, seq = nextval('ingest_seq') WHERE job_id = ?", [job])
                finally:
                    store.close()

            restart(replace_attempt)
            seen["attempt replaced"] = (computed(mirror, groups), live(mirror, groups))
        finally:
            group_figures.REFIT_SECONDS = refit
        yield groups, seen
    finally:
        coordinator.stop()
        mirror.close()


def test_the_first_sync_computes_the_group_the_page_opens_on(synced):
    groups, seen = synced
    kept, fresh = seen["first"]
    assert len(groups) == JOBS
    assert_equal({groups[0]: kept[groups[0]]}, {groups[0]: fresh[groups[0]]})
    assert kept[groups[0]]["chip_components"]["sd"].notna().any() and len(kept[groups[0]]["speedups"])
    assert all(frame is None for g in groups[1:] for frame in kept[g].values())  # no page showed them


def test_a_group_a_page_shows_is_computed_as_the_page_does_and_kept(synced):
    groups, seen = synced
    fresh = seen["first"][1]
    read, kept = seen["second shown"]
    assert_equal({groups[1]: read}, {groups[1]: fresh[groups[1]]})
    assert_equal({groups[1]: kept[groups[1]]}, {groups[1]: fresh[groups[1]]})  # stored
    assert all(frame is None for frame in kept[groups[2]].values())


def test_late_runs_wait_for_a_refit_then_kept_groups_read_as_the_page_computes_them(synced):
    groups, seen = synced
    waiting = seen["late runs, within REFIT_SECONDS"]
    assert all(frame is None for g in groups for frame in waiting[g].values())  # due: the page computes them
    assert seen["refreshed"] == 2  # the group the page opens on and the one shown; not the third
    assert all(frame is None for frame in seen["not shown, after late runs"].values())
    kept, fresh = seen["late runs"]
    assert_equal({g: seen["third shown"] for g in groups[2:]}, {g: fresh[g] for g in groups[2:]})
    assert_equal(kept, fresh)
    before = seen["first"][1]
    assert all(kept[g]["speedups"]["pairs"].sum() > before[g]["speedups"]["pairs"].sum() for g in groups)


def test_a_replaced_attempt_recomputes_its_group_without_its_runs(synced):
    groups, seen = synced
    kept, fresh = seen["attempt replaced"]
    assert_equal(kept, fresh)
    before = seen["late runs"][0]
    pairs = lambda figures: figures["speedups"]["pairs"].sum()  # noqa: E731
    assert pairs(kept[groups[0]]) < pairs(before[groups[0]])  # its runs no longer count
    for g in groups[1:]:
        pd.testing.assert_frame_equal(kept[g]["speedups"], before[g]["speedups"])


def test_a_filter_narrower_than_a_group_is_computed_by_the_page():
    v = data.Version("unused:1", "")
    assert data._of_group(v, data.Filters(comparable="g", method=("mtp",)), "speedups") is None
    assert data._of_group(v, data.Filters(), "speedups") is None


# ---------------------------------------------------------------- the worker after a sync


def test_after_the_first_sync_work_runs_on_the_worker_and_an_error_is_logged(tmp_path, caplog):
    mirror = Mirror(admin=None, path=tmp_path / "mirror.duckdb")
    ran, busy, release = [], threading.Event(), threading.Event()

    def task(seqs):
        ran.append((threading.current_thread().name, seqs["runs"]))
        if seqs["runs"] == 2:
            busy.set()
            release.wait(10)  # busy while syncs 3 and 4 arrive: they are taken together

    def broken(seqs):
        raise RuntimeError("a task's own error")

    after_sync.attach(mirror, broken, task)
    (worker,) = mirror.after_sync
    with caplog.at_level(logging.ERROR, logger="dashboard.after_sync"):
        worker({"runs": 1})
        assert ran == [(threading.current_thread().name, 1)]  # the first sync: before it returns
        worker({"runs": 2})
        assert busy.wait(10) and not after_sync.wait(mirror, timeout=0.2)
        worker({"runs": 3})
        worker({"runs": 4})
        release.set()
        assert after_sync.wait(mirror, timeout=10)
    assert [r for _, r in ran] == [1, 2, 4]
    assert {name for name, _ in ran[1:]} == {"specfleet-after-sync"}
    assert caplog.text.count("RuntimeError: a task's own error") == 3  # after syncs 1, 2 and 4
    mirror.close()

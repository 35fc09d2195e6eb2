"""The figures the mirror counts as runs arrive (dashboard/queries.py SELECTION_CELLS, GROUP_CELLS)
equal the queries over every run, also after a sync that brings late runs into groups the
mirror held already: a synthetic fleet (tests/support/synthetic.py) behind a real coordinator,
stopped, given more jobs of the same cells in its own store, started again and synced."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboard import claims, queries
from specfleet.client import AdminApi, channel
from specfleet.data_dir import admin_credential
from tests.support.fleet import start_coordinator
from tests.support.synthetic import RUNS_PER_JOB, _cells, seed

JOBS = 9  # nine jobs span the nine systems


class Direct:
    """The mirror as a query sees it, not as a Mirror: the queries read its runs, not its counts."""

    def __init__(self, mirror):
        self.query, self.cursor = mirror.query, mirror.cursor


def admin(coordinator) -> AdminApi:
    return AdminApi(channel(f"127.0.0.1:{coordinator.port}"), admin_credential(coordinator.config.data_dir))


@pytest.fixture(scope="module")
def synced_twice(tmp_path_factory):
    """What the mirror showed after its first sync and after the later one, both ways."""
    data_dir = tmp_path_factory.mktemp("precomputed")
    seed(data_dir, JOBS * RUNS_PER_JOB)
    coordinator = start_coordinator(data_dir)
    mirror = queries.open_mirror(f"127.0.0.1:{coordinator.port}", admin_credential(data_dir))
    ledger = queries.load_claims()
    seen = []
    try:
        first = mirror.sync()["runs"]
        seen.append(_compare(mirror, first, ledger, first))
        coordinator.stop()
        seed(data_dir, JOBS * RUNS_PER_JOB, start_job=len(_cells()))  # the same cells again: the same groups
        coordinator = start_coordinator(data_dir)
        mirror.admin = admin(coordinator)
        seen.append(_compare(mirror, mirror.sync()["runs"], ledger, first))
        yield seen
    finally:
        coordinator.stop()
        mirror.close()


def _compare(mirror, last: int, ledger, short: int) -> dict:
    method = queries.filter_options(mirror)["method"][0]
    filters = [queries.Filters(), queries.Filters(method=(method,)), queries.Filters(system=("llama-server",))]
    sweep = mirror.query("SELECT any_value(sweep_id) AS s FROM runs")["s"][0]
    view = queries.SweepView(mirror, sweep)
    with mirror.cursor() as con, view.cursor() as of_sweep:
        out = {
            "groups": [(queries.groups(mirror, f), queries.groups(Direct(mirror), f)) for f in filters],
            "options": (queries.filter_options(mirror), queries.filter_options(Direct(mirror))),
            "settings": [
                (queries.version_per_prompt(mirror, f, several=True), queries.version_per_prompt(Direct(mirror), f))
                for f in filters
            ],
            # each group's setting and version as counted, against the runs' own
            "misnamed": int(
                mirror.query(
                    f"SELECT count(*) AS n FROM runs r JOIN group_cells g USING (comparable)"
                    f" WHERE g.setting != {queries.SETTING_ID.replace('CAST(', 'CAST(r.')}"
                    f" OR g.version != {queries.VERSION_LABEL.replace('CAST(', 'CAST(r.')}"
                )["n"][0]
            ),
            "counted": queries.selections_of(ledger, con, (0, last), cells=True),
            "scanned": queries.selections_of(ledger, con, (0, last)),
            "one by one": {c.id: claims.selection(c, con, (0, last)) for c in ledger},
            # a range short of the last run is not read from the counts, which hold every run
            "short": queries.selections_of(ledger, con, (0, short), cells=True),
            "short one by one": {c.id: claims.selection(c, con, (0, short)) for c in ledger},
            "sweep": queries.selections(view, ledger),
            "sweep one by one": {c.id: claims.selection(c, of_sweep) for c in ledger},
            "cells": int(mirror.query("SELECT sum(n) AS n FROM selection_cells")["n"][0]),
            "runs": int(mirror.query("SELECT count(*) AS n FROM runs WHERE method != 'verify-cost'")["n"][0]),
        }
    view.close()
    return out


def test_the_later_sync_adds_runs_to_groups_the_mirror_held(synced_twice):
    first, second = synced_twice
    before, after = first["groups"][0][0], second["groups"][0][0]
    assert set(before["comparable"]) == set(after["comparable"])  # no new group: the same ones grew
    grown = before.set_index("comparable")["runs"] < after.set_index("comparable")["runs"]
    assert grown.all() and second["runs"] > first["runs"]


@pytest.mark.parametrize("sync", [0, 1])
def test_the_counted_groups_and_filters_equal_those_of_every_run(synced_twice, sync):
    for counted, direct in synced_twice[sync]["groups"]:
        assert len(counted) and (counted["runs"] > 0).all()
        pd.testing.assert_frame_equal(counted, direct)
    counted, direct = synced_twice[sync]["options"]
    assert counted == direct and all(counted[k] for k in ("model", "system", "method", "sampler"))


@pytest.mark.parametrize("sync", [0, 1])
def test_the_counted_selections_equal_each_claims_own_scan(synced_twice, sync):
    seen = synced_twice[sync]
    assert seen["counted"] == seen["scanned"] == seen["one by one"]
    assert any(s["selected"] for s in seen["counted"].values()) and any(s["excluded"] for s in seen["counted"].values())
    assert seen["cells"] == seen["runs"]


def test_a_shorter_range_or_one_sweep_is_counted_on_its_runs(synced_twice):
    first, seen = synced_twice
    assert seen["short"] == seen["short one by one"] == first["counted"] != seen["counted"]
    assert seen["sweep"] == seen["sweep one by one"]
    assert any(s["selected"] for s in seen["sweep"].values())


@pytest.mark.parametrize("sync", [0, 1])
def test_the_versions_page_reads_the_settings_of_several_versions_alone(synced_twice, sync):
    """The synthetic fleet measured each setting under one version: no setting to read, and the
    counted settings and versions are the runs' own."""
    seen = synced_twice[sync]
    assert seen["misnamed"] == 0
    for several, every in seen["settings"]:
        assert len(every) and several.empty
        pd.testing.assert_frame_equal(queries.version_settings(several), queries.version_settings(every))


def test_the_versions_of_a_planted_regression_read_from_the_counts_equal_those_of_every_run(tmp_path):
    """tests/support/versions.py's fleet (one setting under two versions) added to a mirror as
    pages of new rows, its runs in two pages (the later one adds runs to groups held): the
    narrowed Versions figures equal those of every run."""
    from tests.support.versions import Db, per_prompt, stored_runs

    runs, jobs = stored_runs(per_prompt(5))
    mirror = queries.open_mirror("127.0.0.1:1", "unused", path=tmp_path / "mirror.duckdb")
    try:
        mirror._add("jobs", "job_id", jobs, 1)
        half = len(runs) // 2
        for page in (runs.iloc[:half], runs.iloc[half:]):
            mirror._add("runs", "run_id", page.reset_index(drop=True), int(page["seq"].max()))
        every = Db(runs, jobs)
        got, expected = (queries.version_changes(db, queries.Filters()) for db in (mirror, every))
        assert len(got) and (got["change"] == "regression").any()
        pd.testing.assert_frame_equal(got, expected)
        pd.testing.assert_frame_equal(
            queries.version_settings(queries.version_per_prompt(mirror, queries.Filters(), several=True)),
            queries.version_settings(queries.version_per_prompt(every, queries.Filters())),
        )
    finally:
        mirror.close()

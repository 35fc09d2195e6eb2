"""/metrics per change between versions (coordinator/version_figures.py through coordinator/metrics.py):
on a fleet with an 8% decode regression planted between two llama.cpp commits on one chip and
none on another (tests/test_versions.py's), the coordinator's store shows exactly that one
regression, with the dashboard's ratios and setting ids."""

from __future__ import annotations

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator import version_figures
from coordinator.metrics import ResultFigures
from coordinator.store import Store
from specfleet import versions
from tests.support.versions import HIT, NEW, OLD, PLANTED, SPARED, Db, per_prompt, stored_runs


def store_of(tmp_path, fleet: pd.DataFrame) -> Store:
    """A coordinator's store holding the fleet's runs and their jobs (done at attempt 1), its
    figures built as at open."""
    runs, jobs = stored_runs(fleet)
    store = Store(tmp_path)
    with store.tx() as con:
        con.register("_runs", runs)
        con.execute("INSERT INTO runs BY NAME SELECT * FROM _runs")
        con.register("_jobs", jobs)
        con.execute(
            "INSERT INTO jobs BY NAME SELECT job_id, 'sw' AS sweep_id, split_part(job_id, '-', 2) AS agent_id,"
            " '{}' AS spec, state, attempt, 3 AS max_attempts, 0.0 AS created_at, 0.0 AS updated_at,"
            " row_number() OVER () AS seq FROM _jobs"
        )
    store.close()
    return Store(tmp_path)  # its open builds the figures (figures.ensure)


def scrape(store: Store) -> dict:
    text = ResultFigures(store, every=0).text().decode()
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("specfleet_version")}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    fleet = per_prompt(5)
    store = store_of(tmp_path_factory.mktemp("versions"), fleet)
    yield store, fleet
    store.close()


def test_metrics_show_exactly_the_planted_regression(planted):
    store, _ = planted
    families = scrape(store)
    regressions = [s for s in families["specfleet_version_regressions"].samples if s.value > 0]
    assert [(s.labels["chip"], s.labels["old_version"], s.labels["new_version"]) for s in regressions] == [
        (HIT, OLD, NEW)
    ]
    assert regressions[0].value == 2  # decode tok/s of the baseline and of mtp K=2
    assert regressions[0].labels["engine"] == "llama.cpp"
    assert {s.labels["chip"] for s in families["specfleet_version_regressions"].samples} == {HIT, SPARED}
    assert all(s.value == 0 for s in families["specfleet_version_gains"].samples)
    called = {
        (s.labels["chip"], s.labels["figure"], s.labels["method"]): s.value
        for s in families["specfleet_version_change"].samples
    }
    assert sorted(k for k, v in called.items() if v == -1) == [
        (HIT, "decode_tokens_per_second", "baseline"),
        (HIT, "decode_tokens_per_second", "mtp"),
    ]
    assert all(v == 0 for (chip, figure, _), v in called.items() if chip == SPARED and figure != "acceptance")
    ratio = {
        (s.name, s.labels["chip"], s.labels["figure"], s.labels["method"]): s.value
        for name in (
            "specfleet_version_change_ratio",
            "specfleet_version_change_ratio_low",
            "specfleet_version_change_ratio_high",
        )
        for s in families[name].samples
    }
    key = (HIT, "decode_tokens_per_second", "baseline")
    low, high = (
        ratio[("specfleet_version_change_ratio_low", *key)],
        ratio[("specfleet_version_change_ratio_high", *key)],
    )
    assert low <= PLANTED <= high and high < 1 / (1 + versions.TOLERANCE)


def test_the_same_changes_as_the_dashboards_versions_page(planted):
    """The coordinator's rows equal dashboard/queries.py version_changes' on the same runs:
    one computation (specfleet/versions.py), one setting id."""
    from dashboard import queries

    store, fleet = planted
    assert versions.SETTING_SQL == queries.SETTING_ID and versions.VERSION_SQL == queries.VERSION_LABEL
    with store.reader() as con:
        mine = version_figures.changes(con)
    theirs = queries.version_changes(Db(*stored_runs(fleet)), queries.Filters())
    keys = [*versions.KEYS, "old", "new"]
    cols = [*keys, "ratio", "ci_low", "ci_high", "change", "machines", "prompts"]
    pd.testing.assert_frame_equal(
        mine[cols].sort_values(keys).reset_index(drop=True),
        theirs[cols].sort_values(keys).reset_index(drop=True),
        check_dtype=False,
    )


def test_no_series_without_two_versions(tmp_path):
    fleet = per_prompt(6)
    store = store_of(tmp_path, fleet[fleet["version"] == OLD])
    try:
        families = scrape(store)
        assert families and all(not f.samples for f in families.values())
        with store.reader() as con:
            assert version_figures.per_prompt(con).empty
    finally:
        store.close()

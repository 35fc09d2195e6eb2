"""Every dashboard page within the mirror's memory limit on a large fleet, by queries that
aggregate in DuckDB or read few columns, never by materialising the runs.

At a million runs the mirror's 256 MB limit (dashboard/mirror.py MEMORY_LIMIT) stopped the Runs
page: its table's outlier window carried every column of every run (issue 36). Here the same
synthetic fleet at 100k runs, and the limit scaled down with it to 64 MB (not to a tenth: DuckDB's
own working set, a sorted block and a row group being built, does not shrink with the fleet): the
old shape of that query runs out of memory at this limit, every page renders within it.
bench/dashboard.py measures the full size."""

from __future__ import annotations

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import data
from specfleet import speedup
from tests.support.dashboard import APP
from tests.support.fleet import admin_for, start_coordinator
from tests.support.synthetic import seed

RUNS = 100_000
SCALED_LIMIT = "64MB"
PAGES = ("fleet", "sweeps", "compare", "versions", "questions", "runs", "imported")


@pytest.fixture(scope="module")
def large_fleet(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("large")
    seed(data_dir, RUNS)
    coordinator = start_coordinator(data_dir)
    yield coordinator, admin_for(coordinator)._metadata[0][1].removeprefix("Bearer ")
    coordinator.stop()


def test_every_page_renders_within_the_scaled_memory_limit(large_fleet, monkeypatch):
    coordinator, token = large_fleet
    address = f"127.0.0.1:{coordinator.port}"
    monkeypatch.setenv("SPECFLEET_COORDINATOR", address)
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", token)
    at = AppTest.from_file(APP, default_timeout=300).run()  # the first sync, under the mirror's own limit
    assert not at.exception, at.exception
    mirror = data.mirror(address, token)  # the one the app's runs share (st.cache_resource)
    mirror.con.execute(f"SET memory_limit = '{SCALED_LIMIT}'")
    assert mirror.query("SELECT count(*) AS n FROM runs")["n"][0] >= RUNS  # whole jobs: a few more

    # The old Runs table: the outlier window over every column of every run, then the latest 1000.
    old = f"SELECT * FROM {speedup.flagged_sql('runs')} ORDER BY seq DESC LIMIT 1000"
    with pytest.raises(duckdb.OutOfMemoryException):
        mirror.cursor().execute(old).fetchall()

    for page in PAGES:
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, [e.message for e in at.exception])
    at.switch_page("views/runs.py").run()
    assert len(at.dataframe[0].value) == 1000  # the latest runs, each with its flags

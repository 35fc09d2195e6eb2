"""The Imported page and its queries (dashboard/imported.py) on a real coordinator's read path:
imported figures listed with their provenance and set beside the fleet's, each row with its
source, never combined with a run."""

import pytest
from streamlit.testing.v1 import AppTest

from cli.importers import llama_bench, mtplx
from dashboard import imported, mirror
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.support.captured import CAPTURED, MTPLX_RUN
from tests.support.fleet import SWEEP_YAML, admin_for, enrol, make_run, start_coordinator

PAGE = "../dashboard/views/imported.py"


@pytest.fixture(scope="module")
def imported_fleet(tmp_path_factory):
    """A coordinator with one paired cell of fleet runs and six imported figures."""
    coordinator = start_coordinator(tmp_path_factory.mktemp("coordinator"))
    admin = admin_for(coordinator)
    agent = enrol(coordinator, "m1")
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    job = agent.acquire_job(1).job
    for run in (make_run(job.job_id, "baseline", tps=100.0), make_run(job.job_id, "draft", 2, tps=150.0)):
        agent.report_result(job.job_id, job.lease_id, run)
    agent.complete_job(job.job_id, job.lease_id, 2)
    results = llama_bench.parse(CAPTURED / "llama-bench-cpu-target.json") + mtplx.parse(MTPLX_RUN)
    request = pb.ImportResultsRequest(results=[r.to_proto() for r in results], machine_note="lab mac")
    assert admin.ImportResults(request).stored == 7
    yield coordinator, admin
    coordinator.stop()


def test_rows_and_beside(imported_fleet):
    _, admin = imported_fleet
    m = mirror.Mirror(admin)
    m.sync()
    rows = imported.rows(m)
    assert len(rows) == 7 and set(rows["machine_note"]) == {"lab mac"}
    assert list(imported.rows(m, "mtplx tune")["draft_depth"]) == [0, 1, 2, 3]
    side = imported.beside(m)
    assert (side["source"] == imported.IMPORTED).sum() == 7
    fleet_rows = side[side["source"] == imported.FLEET]
    # The fleet's two runs stay two groups (baseline, draft), each its own median; no imported
    # figure joins them.
    assert sorted(zip(fleet_rows["method"], fleet_rows["tokens_per_second"], fleet_rows["figures"])) == [
        ("baseline", 100.0, 1),
        ("draft", 150.0, 1),
    ]


def test_page_shows_imported_figures_marked_unpaired(imported_fleet, monkeypatch):
    coordinator, _ = imported_fleet
    from specfleet.data_dir import admin_credential

    monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", admin_credential(coordinator.config.data_dir))
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception, at.exception
    assert "unpaired" in at.warning[0].value and "never pooled" in at.warning[0].value
    table = at.dataframe[0].value
    assert len(table) == 7 and set(table["tool"]) == {"llama-bench", "mtplx bench", "mtplx tune"}
    assert "7 imported figure(s) from 3 file(s)" in at.caption[0].value

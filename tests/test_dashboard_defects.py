"""A run whose greedy output differed from the baseline's is an engine defect: the Compare page
says so on its chip, system (and engine), method and depth, and the run never enters a speedup."""

import pytest
from streamlit.testing.v1 import AppTest

from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.data_dir import admin_credential
from tests.support.dashboard import APP, MLX_27B, PATHS, fingerprint, record, report, sweep_yaml
from tests.support.fleet import admin_for, enrol, start_coordinator


@pytest.fixture
def lossy_fleet(tmp_path, monkeypatch):
    coordinator = start_coordinator(tmp_path / "coordinator")
    agent = enrol(coordinator, "mini", fingerprint("mini", "Apple M4 Pro", 20, 48, 273), engines=["mlx"])
    admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=sweep_yaml("mini", "mlx", PATHS[MLX_27B])))
    job = agent.acquire_job(30).job
    records = []
    for prompt in ("code-01", "code-02"):
        common = dict(target=MLX_27B, prompt_id=prompt, lossless=True, lossless_check="greedy reference")
        records.append(record(job.job_id, "baseline", 0, 100.0, **common))
        lossy = prompt == "code-02"  # the second prompt's ngram run changed the output
        records.append(record(job.job_id, "ngram", 3, 300.0 if lossy else 150.0, **{**common, "lossless": not lossy}))
    report(agent, job, records)
    agent.complete_job(job.job_id, job.lease_id, len(records))
    monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", admin_credential(coordinator.config.data_dir))
    yield coordinator
    coordinator.stop()


def test_a_lossy_run_is_shown_as_an_engine_defect_and_left_out(lossy_fleet):
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    (defect,) = [e.value for e in at.error]
    assert defect.startswith("Engine defect on Apple M4 Pro · specfleet mlx · ngram K=3: 1 run(s) changed the output")
    assert "greedy reference" in defect and "left out of every speedup" in defect
    shown = [d.value for d in at.dataframe if {"ci_low", "method", "depth"} <= set(d.value.columns)][0]
    ngram = shown[shown["method"] == "ngram"].iloc[0]
    assert ngram["speedup"] == pytest.approx(1.5) and ngram["pairs"] == 1  # the lossy 3x pair is not in it

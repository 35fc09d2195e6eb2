"""The dashboard page against a live coordinator holding results, read through its API."""

import pytest
from streamlit.testing.v1 import AppTest

from protos.specfleet.v1 import fleet_pb2 as pb
from tests.fleet import SWEEP_YAML, admin_for, enrol, make_run, start_coordinator

M4 = pb.Fingerprint(hostname="mini", os="macos", chip="Apple M4 Pro", gpu_cores=20, memory_bytes=48 * 2**30)
M1 = pb.Fingerprint(hostname="mbp", os="macos", chip="Apple M1 Max", gpu_cores=24, memory_bytes=32 * 2**30)


@pytest.fixture
def seeded(tmp_path, monkeypatch):
    coordinator = start_coordinator(tmp_path)
    admin = admin_for(coordinator)
    for name, fp, base, spec in (("mini", M4, 50.0, 80.0), ("mbp", M1, 25.0, 20.0)):
        agent = enrol(coordinator, name, fp, engines=["mlx"])
        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML + f"target: {{agents: [{name}]}}\n"))
        job = agent.acquire_job(1).job
        runs = [make_run(job.job_id, "baseline", 0, base + r, repeat=r) for r in range(3)]
        runs += [
            make_run(job.job_id, "draft", 2, spec + r, repeat=r, metrics={"acceptance_rate": 0.6}) for r in range(3)
        ]
        runs.append(
            make_run(
                job.job_id,
                "verify-cost",
                0,
                0.0,
                prompt_tokens=256,
                generated_tokens=0,
                decode_seconds=0.0,
                wall_seconds=0.1,
                prompt_id="context-256",
                metrics={"rows_1_seconds": 0.01, "rows_1_ratio": 1.0, "rows_2_seconds": 0.011, "rows_2_ratio": 1.1},
            )
        )
        for run in runs:
            agent.report_result(job.job_id, job.lease_id, run)
        agent.complete_job(job.job_id, job.lease_id, len(runs))
    monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", admin._metadata[0][1].removeprefix("Bearer "))
    yield coordinator
    coordinator.stop()


def test_overview_lists_agents_and_results(seeded):
    at = AppTest.from_file("../dashboard/app.py", default_timeout=60).run()
    assert not at.exception, at.exception
    agents = at.dataframe[0].value
    assert sorted(agents["name"]) == ["mbp", "mini"]
    assert set(agents["chip"]) == {"Apple M4 Pro", "Apple M1 Max"}
    summary = at.dataframe[1].value.set_index(["chip", "method"])
    assert summary.loc[("Apple M4 Pro", "draft"), "speedup"] == pytest.approx(81 / 51, rel=1e-3)
    assert summary.loc[("Apple M1 Max", "draft"), "speedup"] == pytest.approx(21 / 26, rel=1e-3)
    assert summary.loc[("Apple M1 Max", "baseline"), "decode_tokens_per_second"] == pytest.approx(26.0)
    assert "verify-cost" not in summary.index.get_level_values("method")
    runs = at.dataframe[2].value
    assert len(runs) == 14  # 12 generations and one verify-cost run per machine
    assert len(at.get("vega_lite_chart")) == 2  # decode speed per arm, and the verify-cost curve


def test_empty_coordinator_says_what_to_do(tmp_path, monkeypatch):
    coordinator = start_coordinator(tmp_path)
    try:
        admin = admin_for(coordinator)
        monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
        monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", admin._metadata[0][1].removeprefix("Bearer "))
        at = AppTest.from_file("../dashboard/app.py", default_timeout=60).run()
        assert not at.exception
        texts = " ".join(i.value for i in at.info)
        assert "No agent has enrolled yet" in texts and "No results yet" in texts
    finally:
        coordinator.stop()

"""The spool's crash windows: a kill between the coordinator's acknowledgement and the local
delete re-uploads the run and the coordinator counts it once; a kill while writing leaves no
half record; a run the coordinator will never take, and a file that is no record, are kept aside
untouched with their reasons."""

import os

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.spool import Spool, Unreadable, read
from tests.support.agents import identity_for, submit
from tests.support.fleet import run_record, start_coordinator
from tests.support.poison_worker import poisoned


@pytest.mark.process  # the agent reads its llama-server builds' versions (`llama-server --version`)
def test_kill_after_ack_before_delete_is_counted_once(tmp_path, tiny_models):
    coordinator = start_coordinator(tmp_path / "coordinator")
    try:
        config = tmp_path / "agent"
        identity_for(coordinator, config)
        submit(
            coordinator,
            {"name": "spool", "models": {"mlx": {"target": str(tiny_models.mlx_target)}}, "engines": ["mlx"],
             "prompt_sets": ["code"], "prompts": 2},
        )  # fmt: skip
        agent = Agent(AgentConfig.load(config))
        job = agent.api.acquire_job(1.0).job
        spool = Spool(config / "spool")
        runs = [run_record(job.job_id) for _ in range(3)]
        for run in runs:
            spool.put(job.job_id, job.lease_id, run)
        # The first upload reached the coordinator, then the agent died before deleting the file.
        assert agent.api.report_result(job.job_id, job.lease_id, runs[0].to_json()).duplicate is False
        # A crash in the middle of a write leaves only a temporary file, which is not a record.
        (spool.pending / ".half-written.tmp").write_text('{"schema": 2, "record": "{')

        restarted = Agent(AgentConfig.load(config))
        assert restarted.upload_pending() == 3 and spool.depth() == 0
        with coordinator.store.tx() as con:
            stored = con.execute("SELECT run_id FROM runs").fetchall()
        assert sorted(r[0] for r in stored) == sorted(r.run_id for r in runs)
        assert spool.measured() == [r.run_id for r in runs]

        # A run whose lease is gone is refused for good: moved aside with the reason, never dropped.
        stale = run_record(job.job_id)
        spool_text = spool.put(job.job_id, "lease-that-never-was", stale).read_text()
        assert restarted.upload_pending() == 0 and spool.depth() == 0
        kept = (spool.refused / f"{stale.run_id}.reason").read_text()
        assert "FAILED_PRECONDITION" in kept and "no longer valid" in kept
        assert (spool.refused / f"{stale.run_id}.json").read_text() == spool_text  # untouched
        assert os.stat(spool.journal).st_size > 0
    finally:
        coordinator.stop()


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("not-json", "not JSON"),
        ("surrogate", "record cannot be sent as UTF-8 (a lone surrogate)"),
        ("no-lease", "lease_id is missing"),
        ("unknown-field", "unknown field(s) 'priority'"),
    ],
)
def test_a_file_that_is_no_record_is_unreadable_with_its_reason_and_parks_untouched(tmp_path, kind, reason):
    spool = Spool(tmp_path / "spool")
    run_id, text = poisoned(kind, {"job_id": "job-1", "lease_id": "lease-1", "attempt": 1})
    path = spool.pending / f"{run_id}.json"
    path.write_text(text)
    with pytest.raises(Unreadable) as raised:
        read(path)
    assert reason in raised.value.reason and str(path) in str(raised.value)
    assert raised.value.job_id == ("" if kind == "not-json" else "job-1")
    assert spool.paths() == [path]
    kept = spool.park(path, raised.value.reason)
    assert kept.read_text() == text and kept.with_suffix(".reason").read_text() == raised.value.reason + "\n"
    assert spool.paths() == [] and spool.depth() == 0


def test_a_spooled_record_reads_back_as_it_was_put(tmp_path):
    spool = Spool(tmp_path / "spool")
    run = run_record("job-1")
    item = read(spool.put("job-1", "lease-1", run))
    assert (item.job_id, item.lease_id, item.run_id) == ("job-1", "lease-1", run.run_id)
    assert item.record_json == run.to_json()

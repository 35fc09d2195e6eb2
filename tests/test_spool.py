"""The spool's crash windows: a kill between the coordinator's acknowledgement and the local
delete re-uploads the run and the coordinator counts it once; a kill while writing leaves no
half record; a run the coordinator will never take is kept aside with its reason."""

import os

from agent.daemon import Agent
from agent.spool import Spool
from tests.fleet import run_record, start_coordinator
from tests.test_agent_daemon import identity_for, submit


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
        agent = Agent(config)
        job = agent.api.acquire_job(1.0).job
        spool = Spool(config / "spool")
        runs = [run_record(job.job_id) for _ in range(3)]
        for run in runs:
            spool.put(job.job_id, job.lease_id, run)
        # The first upload reached the coordinator, then the agent died before deleting the file.
        assert agent.api.report_result(job.job_id, job.lease_id, runs[0].to_json()).duplicate is False
        # A crash in the middle of a write leaves only a temporary file, which is not a record.
        (spool.pending / ".half-written.tmp").write_text('{"schema": 2, "record": "{')

        restarted = Agent(config)
        assert restarted.upload_pending() == 3 and spool.depth() == 0
        with coordinator.store.tx() as con:
            stored = con.execute("SELECT run_id FROM runs").fetchall()
        assert sorted(r[0] for r in stored) == sorted(r.run_id for r in runs)
        assert spool.measured() == [r.run_id for r in runs]

        # A run whose lease is gone is refused for good: moved aside with the reason, never dropped.
        stale = run_record(job.job_id)
        spool.put(job.job_id, "lease-that-never-was", stale)
        assert restarted.upload_pending() == 0 and spool.depth() == 0
        kept = (spool.refused / f"{stale.run_id}.json").read_text()
        assert "FAILED_PRECONDITION" in kept and "no longer valid" in kept
        assert os.stat(spool.journal).st_size > 0
    finally:
        coordinator.stop()

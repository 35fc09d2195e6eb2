"""`specfleet agent spool list|retry`: parked records are listed with their reasons and put back
in the upload queue once their cause is gone; a record whose reason still holds is refused by
name and stays parked."""

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.spool import Spool
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.support.agents import identity_for
from tests.support.fleet import SWEEP_YAML, admin_for, run_record, start_coordinator
from tests.support.poison_worker import poisoned
from tests.support.processes import cli

pytestmark = [pytest.mark.process]

OLD_REFUSAL = "INVALID_ARGUMENT: schema: record schema 3 is not 2"  # what a coordinator before item 25.3 said


def test_parked_runs_are_listed_and_retried_once_their_cause_is_gone(tmp_path):
    coordinator = start_coordinator(tmp_path / "coordinator")
    try:
        config = tmp_path / "agent"
        identity_for(coordinator, config)
        admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
        agent = Agent(AgentConfig.load(config))
        job = agent.api.acquire_job(1.0).job
        spool = Spool(config / "spool")
        good = run_record(job.job_id)
        spool.park(spool.put(job.job_id, job.lease_id, good), OLD_REFUSAL)  # refused by a coordinator since upgraded
        broken, text = poisoned("not-json", {"job_id": job.job_id, "lease_id": job.lease_id, "attempt": 1})
        (spool.pending / f"{broken}.json").write_text(text)
        assert agent.upload_pending() == 0  # parks the file that is no record
        assert spool.depth() == 0

        listed = cli("agent", "spool", "list", "--config-dir", str(config)).stdout
        assert good.run_id in listed and OLD_REFUSAL in listed
        assert broken in listed and "unreadable: not JSON" in listed and "2 parked, 0 pending" in listed

        retried = cli("agent", "spool", "retry", "--all", "--config-dir", str(config), check=False)
        assert retried.returncode == 1
        assert f"not re-queued: {broken}: still refused: not JSON" in retried.stdout
        assert "1 re-queued for upload, 1 not" in retried.stdout
        assert [p.run_id for p in spool.parked()] == [broken] and spool.depth() == 1

        unknown = cli("agent", "spool", "retry", "no-such-run", "--config-dir", str(config), check=False)
        assert unknown.returncode == 1 and "no parked record 'no-such-run'" in unknown.stdout

        assert agent.upload_pending() == 1 and spool.depth() == 0  # the re-queued run goes up
        with coordinator.store.tx() as con:
            assert con.execute("SELECT run_id FROM runs").fetchall() == [(good.run_id,)]
        agent.api.close()
    finally:
        coordinator.stop()

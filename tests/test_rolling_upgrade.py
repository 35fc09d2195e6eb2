"""Rolling upgrades: an agent whose run records are newer than its coordinator reads holds them
in its spool (neither sent nor parked) and uploads them once the coordinator is upgraded.

The coordinator says the newest record schema it reads at enrolment, in every heartbeat
answer, and in its refusal of a record too new (FAILED_PRECONDITION naming both versions).
A coordinator "not yet upgraded" is this checkout with its SCHEMA_VERSION one lower, in its
own process only (tests/support/record_schema_seam.py); the agent, its worker and the upgraded
coordinator are this checkout as it is.
"""

import json
import os
import subprocess
import sys
import threading
import time

import grpc
import pytest
import yaml

from agent.credentials import AgentIdentity
from agent.daemon import Agent
from agent.spool import Spool
from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet import record
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.agents import identity_for
from tests.support.fleet import SWEEP_YAML, admin_for, run_record, start_coordinator
from tests.support.ports import free_port
from tests.support.processes import ROOT, spawn, stop, wait_until
from tests.support.processes import start_coordinator as start_coordinator_process

pytestmark = [pytest.mark.process, pytest.mark.engine]

NOW = record.SCHEMA_VERSION  # this checkout's record schema: the agent's, and the upgraded coordinator's


def test_a_record_too_new_is_refused_as_such_and_held_then_sent_after_the_upgrade(tmp_path, monkeypatch):
    coordinator = start_coordinator(tmp_path / "coordinator")
    stop_flush = threading.Event()
    try:
        config = tmp_path / "agent"
        identity_for(coordinator, config)
        admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
        agent = Agent(config)
        job = agent.api.acquire_job(1.0).job
        run = run_record(job.job_id)  # schema NOW, built before the coordinator goes back a version
        Spool(config / "spool").put(job.job_id, job.lease_id, run)

        monkeypatch.setattr(record, "SCHEMA_VERSION", NOW - 1)  # the coordinator reads up to NOW - 1
        assert agent.api.heartbeat().max_record_schema == NOW - 1
        with pytest.raises(grpc.RpcError) as refused:
            agent.api.report_result(job.job_id, job.lease_id, run.to_json())
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"schema {NOW} is newer than this coordinator reads (schema {NOW - 1})" in refused.value.details()

        # The uploader has not been told the coordinator's version: the refusal tells it, and it holds.
        agent.uploader.stop = stop_flush
        flushed = []
        flusher = threading.Thread(target=lambda: flushed.append(agent.uploader.flush()), daemon=True)
        flusher.start()
        wait_until(lambda: agent.uploader.held, "the run to be held", 10)
        assert agent.uploader.held == {run.run_id: NOW} and agent.uploader.coordinator_schema == NOW - 1
        assert agent.spool.depth() == 1 and not list(agent.spool.refused.iterdir()) and not agent.uploader.parked
        assert agent.metrics.registry.get_sample_value("specfleet_agent_runs_held") == 1
        assert f"1 run held: record schema {NOW} is newer than the coordinator reads ({NOW - 1})" in (
            agent.status_line()
        )
        time.sleep(1.5)  # held, and the flush waits: nothing is sent meanwhile
        assert flusher.is_alive() and agent.spool.depth() == 1

        monkeypatch.setattr(record, "SCHEMA_VERSION", NOW)  # upgraded: its next heartbeat answer says so
        agent.uploader.coordinator_reads(agent.api.heartbeat().max_record_schema)
        flusher.join(timeout=10)
        assert flushed == [1] and agent.spool.depth() == 0 and not agent.uploader.held
        with coordinator.store.tx() as con:
            assert con.execute("SELECT run_id, schema FROM runs").fetchall() == [(run.run_id, NOW)]
        agent.api.close()
    finally:
        stop_flush.set()
        coordinator.stop()


def start_old_coordinator(data, port: int) -> subprocess.Popen:
    """A coordinator process that reads records up to NOW - 1 (tests/support/record_schema_seam.py)."""
    data.mkdir(parents=True, exist_ok=True)
    (data / "coordinator.json").unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.record_schema_seam", "coordinator", "serve", "--data-dir", str(data),
         "--port", str(port), "--metrics-port", "0"],
        stdout=open(data / "coordinator.log", "a"), stderr=subprocess.STDOUT, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "SPECFLEET_TEST_RECORD_SCHEMA": str(NOW - 1)},
    )  # fmt: skip
    wait_until(lambda: (data / "coordinator.json").exists() or proc.poll() is not None, "the coordinator", 60)
    assert proc.poll() is None, (data / "coordinator.log").read_text()
    return proc


@pytest.mark.slow
def test_runs_newer_than_the_coordinator_are_held_and_arrive_after_its_upgrade(tmp_path, tiny_models):
    data, config = tmp_path / "coordinator", tmp_path / "agent"
    port = free_port()
    address = f"127.0.0.1:{port}"
    coordinator = start_old_coordinator(data, port)
    agent = None
    try:
        admin = AdminApi(channel(address), admin_credential(data))
        token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
        resp = AgentApi(channel(address)).enrol(token, "newer", pb.Fingerprint(hostname="n"), {}, ["mlx"])
        assert resp.max_record_schema == NOW - 1  # said at enrolment
        AgentIdentity(address, resp.agent_id, "newer", resp.credential, resp.heartbeat_interval_seconds).save(config)
        doc = {
            "name": "rolling-upgrade",
            "models": {"mlx": {"target": str(tiny_models.mlx_target)}},
            "engines": ["mlx"],
            "prompt_sets": ["code"],
            "prompts": 2,
            "methods": {"ngram": [3]},
            "max_new_tokens": 16,
            "warmup": 0,
            "repeats": 1,
        }
        sweep_id = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc))).sweep_id
        agent = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / "agent.log")
        spool = Spool(config / "spool")

        def held_all():
            status = json.loads((config / "status.json").read_text()) if (config / "status.json").exists() else {}
            measured = len(spool.measured())
            worker_done = any(p.read_text().strip() for p in (config / "jobs").glob("*/worker.out"))
            return worker_done and measured and status.get("held_runs") == measured == spool.depth() and status

        status = wait_until(held_all, "every run of the job to be held", 180)
        assert f"record schema {NOW} is newer than the coordinator reads ({NOW - 1})" in status["held_reason"]
        assert not list(spool.refused.iterdir()), "a run was parked"
        sweep = admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))
        assert (sweep.runs, sweep.jobs_running) == (0, 1)  # nothing stored; the job still leased to the agent
        assert "held in the spool" in (tmp_path / "agent.log").read_text()
        told = lambda: "held" in admin.ListAgents(pb.ListAgentsRequest()).agents[0].status  # noqa: E731
        wait_until(told, "the heartbeat's status to tell the coordinator why", 20)
        held = len(spool.measured())

        # The upgrade: the same data directory and port, this checkout's record schema.
        assert stop(coordinator) == 0
        coordinator, _ = start_coordinator_process(data, "--port", str(port))
        admin = AdminApi(channel(address), admin_credential(data))
        status = lambda: admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))  # noqa: E731
        final = wait_until(lambda: (s := status()).state != "running" and s, "the sweep to finish", 90)
        assert (final.jobs_done, final.jobs_failed, final.runs) == (1, 0, held), (tmp_path / "agent.log").read_text()
        assert stop(agent) == 0
        agent = None
        assert stop(coordinator) == 0
    finally:
        if agent is not None:
            stop(agent)
        stop(coordinator)
    con = open_readonly(data)
    stored = con.execute("SELECT run_id, schema FROM runs").fetchall()
    con.close()
    assert sorted(stored) == sorted((run_id, NOW) for run_id in spool.measured())  # nothing lost, nothing twice
    assert spool.depth() == 0 and not list(spool.refused.iterdir())

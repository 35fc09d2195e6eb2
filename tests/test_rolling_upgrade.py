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

from agent.config import AgentConfig
from agent.credentials import AgentIdentity
from agent.daemon import Agent
from agent.spool import Spool
from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet import record
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.agents import Running, identity_for
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
        agent = Agent(AgentConfig.load(config))
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


def test_a_job_whose_runs_are_held_ends_held_and_is_done_once_they_arrive(tmp_path, monkeypatch, capsys):
    """A record held for any reason (here: the coordinator went back a version mid-job) never
    keeps its job from ending: the job ends "held" with the count, its sweep ends and says so,
    and once the runs arrive (the coordinator upgraded) the job is done."""
    coordinator = start_coordinator(tmp_path / "coordinator")
    try:
        config = tmp_path / "agent"
        identity_for(coordinator, config)
        admin = admin_for(coordinator)
        sweep_id = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML)).sweep_id
        agent = Agent(AgentConfig.load(config))
        job = agent.api.acquire_job(1.0).job
        runs = [run_record(job.job_id) for _ in range(2)]
        for run in runs:
            agent.spool.put(job.job_id, job.lease_id, run)
        monkeypatch.setattr(record, "SCHEMA_VERSION", NOW - 1)
        agent.uploader.coordinator_reads(agent.api.heartbeat().max_record_schema)
        started = time.monotonic()
        assert agent.uploader.flush(wait_for_held=False) == 0 and time.monotonic() - started < 5  # no wait
        assert agent.uploader.held_for(job.job_id) == 2 and agent.uploader.held_for("another-job") == 0
        agent.api.complete_job(job.job_id, job.lease_id, 2, agent.uploader.held_for(job.job_id))
        status = admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))
        assert (status.state, status.jobs_held, status.runs_held, status.jobs_done, status.runs) == ("done", 1, 2, 0, 0)
        from cli.main import print_sweep

        print_sweep(status)
        assert "held 1 (2 runs held by their agents)" in capsys.readouterr().out
        # Another job of the same agent is not kept from ending either.
        other = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML)).sweep_id
        second = agent.api.acquire_job(1.0).job
        agent.api.complete_job(second.job_id, second.lease_id, 0)
        assert admin.GetSweep(pb.GetSweepRequest(sweep_id=other)).state == "done"

        monkeypatch.setattr(record, "SCHEMA_VERSION", NOW)  # upgraded: the held runs go up, the job is done
        agent.uploader.coordinator_reads(agent.api.heartbeat().max_record_schema)
        assert agent.uploader.flush() == 2 and not agent.uploader.held
        status = admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))
        assert (status.jobs_held, status.jobs_done, status.runs) == (0, 1, 2)
        agent.api.close()
    finally:
        coordinator.stop()


def test_an_agent_whose_records_are_too_new_takes_no_job_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "SCHEMA_VERSION", NOW - 1)  # the coordinator reads up to NOW - 1
    coordinator = start_coordinator(tmp_path / "coordinator")
    try:
        config = tmp_path / "agent"
        identity_for(coordinator, config)
        admin = admin_for(coordinator)
        sweeps = [admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML)).sweep_id for _ in range(2)]
        agent = Agent(AgentConfig.load(config))
        agent.uploader.record_schema = NOW  # the agent writes NOW
        waiting = f"waiting for the coordinator to read record schema {NOW} (it reads up to {NOW - 1})"
        with Running(agent):
            ended = lambda: all(admin.GetSweep(pb.GetSweepRequest(sweep_id=s)).state == "done" for s in sweeps)  # noqa: E731
            wait_until(ended, "both sweeps to end", 30)
            told = lambda: waiting in admin.ListAgents(pb.ListAgentsRequest()).agents[0].status  # noqa: E731
            wait_until(told, "agents list to say why the agent takes no job", 20)
            assert waiting in json.loads((config / "status.json").read_text())["status"]
        for sweep_id in sweeps:
            status = admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))
            assert (status.jobs_refused, status.runs) == (1, 0)
            assert waiting in status.failures[0]
        assert agent.spool.measured() == []  # nothing measured that could not be stored
    finally:
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
def test_the_skew_drill_sweeps_end_while_the_coordinator_is_old_and_work_resumes_after_its_upgrade(
    tmp_path, tiny_models
):
    """A newer agent, an older coordinator: the agent takes no job (it refuses each it is given,
    saying why), so both sweeps end; nothing is measured that could not be stored; after the
    coordinator's upgrade it takes new work and every run it measures is stored once."""
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
        submit = lambda: admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc))).sweep_id  # noqa: E731
        skewed = [submit(), submit()]
        agent = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / "agent.log")
        status = lambda sweep_id: admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))  # noqa: E731
        waiting = f"waiting for the coordinator to read record schema {NOW}"
        for sweep_id in skewed:
            ended = wait_until(lambda: (s := status(sweep_id)).state != "running" and s, "the sweep to end", 90)  # noqa: B023
            assert (ended.state, ended.jobs_refused, ended.runs) == ("done", 1, 0)
            assert waiting in ended.failures[0]
        told = lambda: waiting in admin.ListAgents(pb.ListAgentsRequest()).agents[0].status  # noqa: E731
        wait_until(told, "agents list to say why the agent takes no job", 20)
        spool = Spool(config / "spool")
        assert spool.measured() == []

        # The upgrade: the same data directory and port, this checkout's record schema.
        assert stop(coordinator) == 0
        coordinator, _ = start_coordinator_process(data, "--port", str(port))
        admin = AdminApi(channel(address), admin_credential(data))
        fresh = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc))).sweep_id
        final = wait_until(lambda: (s := status(fresh)).state != "running" and s, "the new sweep to finish", 120)
        assert (final.jobs_done, final.jobs_failed) == (1, 0), (tmp_path / "agent.log").read_text()[-3000:]
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
    assert stored and sorted(stored) == sorted((run_id, NOW) for run_id in spool.measured())  # nothing lost or twice
    assert spool.depth() == 0 and not list(spool.refused.iterdir())

"""One stream's bad records never refuse anyone's good ones: every record is validated (UTF-8
included, its schema named) before it joins a shared batch, and a batch whose insert fails for
one record's data is stored again record by record, refusing only that record."""

import json
import threading

import duckdb
import grpc
import pytest

from coordinator import ingest
from coordinator.ingest import InvalidRun, Report, ingest_many
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.fleet import LINUX_BOX, SWEEP_YAML, admin_for, enrol, make_run, run_id, start_coordinator
from tests.support.processes import start_coordinator as start_coordinator_process
from tests.support.processes import stop

pytestmark = [pytest.mark.process]

SURROGATE = {"prompt_id": "code-\ud800"}  # json.dumps writes it as the escape "\ud800": valid JSON, not UTF-8


def leased_job(coordinator):
    api = enrol(coordinator)
    admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    return api, api.acquire_job(1.0).job


def stored_ids(coordinator) -> set[str]:
    with coordinator.store.tx() as con:
        return {r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()}


def test_bad_records_are_refused_naming_the_field_before_they_share_a_batch(tmp_path):
    coordinator = start_coordinator(tmp_path / "coordinator")
    try:
        api, job = leased_job(coordinator)
        good = [make_run(job.job_id) for _ in range(3)]
        no_schema = json.loads(make_run(job.job_id))
        del no_schema["schema"]
        batch = [good[0], make_run(job.job_id, **SURROGATE), good[1], json.dumps(no_schema), good[2]]
        results = ingest_many(coordinator.scheduler, [Report(api.agent_id, job.job_id, job.lease_id, r) for r in batch])
        assert [isinstance(r, tuple) for r in results] == [True, False, True, False, True]
        assert isinstance(results[1], InvalidRun) and str(results[1]) == "prompt_id: not valid UTF-8 (a lone surrogate)"
        assert isinstance(results[3], InvalidRun) and str(results[3]).startswith("schema: is required")
        assert stored_ids(coordinator) == {run_id(r) for r in good}
    finally:
        coordinator.stop()


def test_a_batch_one_record_fails_is_stored_record_by_record(tmp_path, monkeypatch):
    coordinator = start_coordinator(tmp_path / "coordinator")
    try:
        api, job = leased_job(coordinator)
        records = [make_run(job.job_id) for _ in range(5)]
        offender = run_id(records[2])
        insert = ingest._insert

        def failing_insert(con, rows, *unique_keys):  # DuckDB refusing one row's data fails the whole statement
            if any(row[0] == offender for row in rows):
                raise duckdb.ConversionException(f"Could not convert the value of run {offender}")
            return insert(con, rows, *unique_keys)

        monkeypatch.setattr(ingest, "_insert", failing_insert)
        results = ingest_many(
            coordinator.scheduler, [Report(api.agent_id, job.job_id, job.lease_id, r) for r in records]
        )
        assert [isinstance(r, tuple) for r in results] == [True, True, False, True, True]
        assert isinstance(results[2], InvalidRun) and f"run {offender} cannot be stored" in str(results[2])
        assert stored_ids(coordinator) == {run_id(r) for i, r in enumerate(records) if i != 2}
    finally:
        coordinator.stop()


def test_two_agents_one_hostile_every_good_record_is_stored(tmp_path):
    """A real coordinator process; a good agent streams its runs while another streams poison."""
    data = tmp_path / "coordinator"
    proc, endpoints = start_coordinator_process(data)
    try:
        address = endpoints["grpc"]
        admin = AdminApi(channel(address), admin_credential(data))
        agents = []
        for name in ("good", "hostile"):
            token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
            resp = AgentApi(channel(address)).enrol(token, name, LINUX_BOX, {}, ["mlx"])
            agents.append(AgentApi(channel(address), resp.credential))
        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
        (good, good_job), (hostile, hostile_job) = [(a, a.acquire_job(1.0).job) for a in agents]
        sent = [make_run(good_job.job_id) for _ in range(100)]
        done, refusals, errors = threading.Event(), [], []

        def poison():
            while not done.is_set():
                try:
                    hostile.report_result(
                        hostile_job.job_id, hostile_job.lease_id, make_run(hostile_job.job_id, **SURROGATE)
                    )
                except grpc.RpcError as e:
                    refusals.append((e.code(), e.details()))

        def upload():
            try:
                for record in sent:
                    assert good.report_result(good_job.job_id, good_job.lease_id, record).duplicate is False
            except Exception as e:  # noqa: BLE001 - the assertion below names it
                errors.append(e)
            finally:
                done.set()

        threads = [threading.Thread(target=poison), threading.Thread(target=upload)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors[0]
        assert len(refusals) >= 10  # the poison really was interleaved with the good runs
        assert set(refusals) == {(grpc.StatusCode.INVALID_ARGUMENT, "prompt_id: not valid UTF-8 (a lone surrogate)")}
        exported = admin.Export(pb.ExportRequest(table="runs"))
        assert exported.rows == len(sent)
        for api in agents:
            api.close()
    finally:
        assert stop(proc) == 0

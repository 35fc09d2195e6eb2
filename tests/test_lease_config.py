"""Leases that cannot fail by configuration: the coordinator refuses, in one line, a lease too
short for its heartbeats; an agent beats at a third of the lease the coordinator answers with,
whatever interval it was enrolled with, so a 5-second lease holds through a long job."""

import pytest
import yaml

from agent.credentials import AgentIdentity
from agent.heartbeat import interval
from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.processes import cli, spawn, start_coordinator, stop, wait_until


@pytest.mark.process
def test_a_lease_shorter_than_three_heartbeats_is_refused_at_start_in_one_line(tmp_path):
    done = cli("coordinator", "serve", "--data-dir", str(tmp_path), "--port", "0", "--lease-seconds", "2", check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: a lease of 2 s is too short: agents beat 3 times a lease, at most every 1 s, "
        "so a lease is at least 3 s (--lease-seconds)"
    ]
    assert not (tmp_path / "coordinator.json").exists()


def test_the_interval_is_a_third_of_the_lease_at_most():
    assert interval(10.0, 5.0) == pytest.approx(5.0 / 3)
    assert interval(10.0, 60.0) == 10.0
    assert interval(10.0, 0.0) == 10.0  # no lease answered yet: the enrolment's


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.engine
def test_a_five_second_lease_holds_through_a_long_job(tmp_path, tiny_models):
    data, config = tmp_path / "coordinator", tmp_path / "agent"
    coordinator, endpoints = start_coordinator(data, "--lease-seconds", "5")
    agent = None
    try:
        address = endpoints["grpc"]
        admin = AdminApi(channel(address), admin_credential(data))
        token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
        resp = AgentApi(channel(address)).enrol(token, "short-lease", pb.Fingerprint(hostname="s"), {}, ["mlx"])
        assert (resp.lease_seconds, resp.heartbeat_interval_seconds) == (5.0, pytest.approx(5.0 / 3))
        # Enrolled with a coordinator of the default lease: it was told to beat every 10 s.
        AgentIdentity(address, resp.agent_id, "short-lease", resp.credential, 10.0).save(config)
        doc = {
            "name": "short-lease",
            "models": {"mlx": {"target": str(tiny_models.mlx_target)}},
            "engines": ["mlx"],
            "prompt_sets": ["code"],
            "prompts": 2,
            "methods": {"ngram": [3]},
            "max_new_tokens": 192,
            "warmup": 0,
            "repeats": 4,
        }
        sweep_id = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc))).sweep_id
        agent = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / "agent.log")
        status = lambda: admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))  # noqa: E731
        final = wait_until(lambda: (s := status()).state != "running" and s, "the sweep to finish", 300)
        assert (final.jobs_done, final.jobs_failed) == (1, 0), (tmp_path / "agent.log").read_text()
        assert stop(agent) == 0
        agent = None
    finally:
        if agent is not None:
            stop(agent)
        assert stop(coordinator) == 0
    con = open_readonly(data)
    attempt, lasted = con.execute(
        "SELECT max(j.attempt), max(j.updated_at) - min(r.started_at_unix_seconds)"
        " FROM jobs j JOIN runs r USING (job_id)"
    ).fetchone()
    con.close()
    assert attempt == 1  # never expired and requeued
    assert lasted > 3 * 5, f"the job lasted {lasted:.1f} s: too short to show a 5 s lease holding"
    assert "lease expired" not in (data / "coordinator.log").read_text()

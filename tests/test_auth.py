"""Credentials over real gRPC on loopback: each bad one refused with the right status."""

import grpc
import pytest

from agent.api import AdminApi, AgentApi, channel
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.fleet import LINUX_BOX, SWEEP_YAML, admin_for, enrol, make_run, start_coordinator


@pytest.fixture
def coordinator(tmp_path):
    c = start_coordinator(tmp_path)
    yield c
    c.stop()


def code_of(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code()


def address(c):
    return f"127.0.0.1:{c.port}"


def test_agent_calls_need_a_valid_credential(coordinator):
    agent = enrol(coordinator)
    assert not agent.acquire_job(0).has_job
    missing = AgentApi(channel(address(coordinator)))
    assert code_of(lambda: missing.acquire_job(0)) == grpc.StatusCode.UNAUTHENTICATED
    wrong = AgentApi(channel(address(coordinator)), f"sfa.{agent.agent_id}.not-the-secret")
    assert code_of(lambda: wrong.heartbeat()) == grpc.StatusCode.UNAUTHENTICATED
    garbage = AgentApi(channel(address(coordinator)), "nonsense")
    assert code_of(lambda: garbage.heartbeat()) == grpc.StatusCode.UNAUTHENTICATED


def test_revoked_agent_is_refused(coordinator):
    agent = enrol(coordinator)
    admin_for(coordinator).SetAgentState(pb.SetAgentStateRequest(agent_id=agent.agent_id, state="revoked"))
    assert code_of(lambda: agent.heartbeat()) == grpc.StatusCode.PERMISSION_DENIED


def test_enrolment_tokens_expire_and_run_out(coordinator):
    admin = admin_for(coordinator)
    client = AgentApi(channel(address(coordinator)))
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    client.enrol(token, "first", LINUX_BOX, {}, ["mlx"])
    assert code_of(lambda: client.enrol(token, "second", LINUX_BOX, {}, ["mlx"])) == grpc.StatusCode.PERMISSION_DENIED
    assert (
        code_of(lambda: client.enrol("sft.unknown", "third", LINUX_BOX, {}, ["mlx"])) == grpc.StatusCode.UNAUTHENTICATED
    )
    short = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=0.01, max_uses=5)).token
    import time

    time.sleep(0.05)
    assert code_of(lambda: client.enrol(short, "fourth", LINUX_BOX, {}, ["mlx"])) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=-5))) == grpc.StatusCode.INVALID_ARGUMENT


def test_admin_calls_need_the_admin_credential(coordinator):
    agent_cred_admin = AdminApi(channel(address(coordinator)), "sfadm.wrong")
    assert code_of(lambda: agent_cred_admin.ListAgents(pb.ListAgentsRequest())) == grpc.StatusCode.PERMISSION_DENIED
    # An agent credential is not an admin credential either.
    token = admin_for(coordinator).CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    cred = AgentApi(channel(address(coordinator))).enrol(token, "m", LINUX_BOX, {}, ["mlx"]).credential
    as_agent = AdminApi(channel(address(coordinator)), cred)
    assert code_of(lambda: as_agent.ListSweeps(pb.ListSweepsRequest())) == grpc.StatusCode.PERMISSION_DENIED


def test_agent_cannot_report_for_another_agents_lease(coordinator):
    mine, other = enrol(coordinator, "mine"), enrol(coordinator, "other")
    admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML + "target: {agents: [mine]}\n"))
    job = mine.acquire_job(1).job
    assert (
        code_of(lambda: other.report_result(job.job_id, job.lease_id, make_run(job.job_id)))
        == grpc.StatusCode.FAILED_PRECONDITION
    )
    assert not mine.report_result(job.job_id, job.lease_id, make_run(job.job_id)).duplicate


def test_bad_figures_are_refused_with_the_field_named(coordinator):
    agent = enrol(coordinator)
    admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    job = agent.acquire_job(1).job
    for bad, field in [
        (dict(decode_tokens_per_second=float("nan")), "decode_tokens_per_second"),
        (dict(prefill_seconds=-1.0), "prefill_seconds"),
        (dict(engine="vllm"), "engine"),
        (dict(metrics={"acceptance_rate": float("inf")}), "acceptance_rate"),
    ]:
        with pytest.raises(grpc.RpcError) as e:
            agent.report_result(job.job_id, job.lease_id, make_run(job.job_id, **bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details()
    huge = make_run(job.job_id, params={"blob": "x" * (5 * 1024 * 1024)})
    assert code_of(lambda: agent.report_result(job.job_id, job.lease_id, huge)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    with coordinator.store.tx() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0

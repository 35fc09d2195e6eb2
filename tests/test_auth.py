"""Credentials over real gRPC on loopback: each bad one refused with the right status."""

import grpc
import pytest

from coordinator import agents, auth
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from tests.support.clocks import FakeClock
from tests.support.fleet import LINUX_BOX, SWEEP_YAML, admin_for, enrol, make_run, start_coordinator


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


def test_enrolment_tokens_expire_and_run_out(coordinator, monkeypatch):
    clock = FakeClock()  # the coordinator's token clock, so that expiry never waits on the real one
    for module in (auth, agents):
        monkeypatch.setattr(module, "time", clock.as_time_module())
    admin = admin_for(coordinator)
    client = AgentApi(channel(address(coordinator)))
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    client.enrol(token, "first", LINUX_BOX, {}, ["mlx"])
    assert code_of(lambda: client.enrol(token, "second", LINUX_BOX, {}, ["mlx"])) == grpc.StatusCode.PERMISSION_DENIED
    assert (
        code_of(lambda: client.enrol("sft.unknown", "third", LINUX_BOX, {}, ["mlx"])) == grpc.StatusCode.UNAUTHENTICATED
    )
    short = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=5)).token
    clock.advance(59.9)
    client.enrol(short, "fourth", LINUX_BOX, {}, ["mlx"])  # not yet expired
    clock.advance(0.1)
    assert code_of(lambda: client.enrol(short, "fifth", LINUX_BOX, {}, ["mlx"])) == grpc.StatusCode.UNAUTHENTICATED
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
        (dict(inter_token_latency_p50_seconds=float("inf")), "inter_token_latency_p50_seconds: must be finite"),
        (dict(acceptance_by_position=[1.5]), "acceptance_by_position holds a share outside [0, 1]"),
        (dict(rounds=-1), "rounds = -1 is not in"),
        (dict(env_reasons=["ok", 3]), "env_reasons[1]: must be a string"),
        (dict(drafted_by_position=list(range(2000))), "drafted_by_position: holds 2000 items; at most 1024"),
        (dict(tokens_drafted=4, tokens_accepted=5), "tokens_accepted (5) exceeds tokens_drafted (4)"),
        (dict(acceptance_reason="x" * 5000), "acceptance_reason must be 0-4096 characters, got 5000"),
        (dict(note="an unknown field"), "note: unknown field"),
        (dict(depth=3), "depth of baseline must be 0, got 3"),
        (dict(method="draft", depth=0), "depth = 0 is not in [1, 64]"),
        (dict(method="medusa"), "method 'medusa' is unknown"),
        (dict(generated_tokens=-1), "generated_tokens = -1"),
        (dict(peak_memory_bytes=2**60), "peak_memory_bytes"),
        (dict(output_sha256="not-a-hash"), "output_sha256 'not-a-hash' is not 64 lowercase hex digits"),
        (dict(run_id=""), "run_id must be 1-128 characters, got 0"),
        (dict(prompt_id="p" * 200), "prompt_id must be 1-128 characters, got 200"),
        (dict(target={"reference": "/Users/me/models/x.gguf"}), "is a path: a model is named by its file name"),
        (dict(schema=1), "unknown field in a schema 1 record"),  # it has fields schema 1 did not
    ]:
        with pytest.raises(grpc.RpcError) as e:
            agent.report_result(job.job_id, job.lease_id, make_run(job.job_id, **bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details(), e.value.details()
    other = make_run("job-other")
    with pytest.raises(grpc.RpcError) as e:
        agent.report_result(job.job_id, job.lease_id, other)
    assert "record job_id 'job-other' differs from the request's job_id" in e.value.details()
    # Every problem of one run is named at once.
    with pytest.raises(grpc.RpcError) as e:
        agent.report_result(job.job_id, job.lease_id, make_run(job.job_id, engine="vllm", wall_seconds=-2.0))
    assert "engine: must be one of mlx, llama.cpp, llama-server, openai, got 'vllm'" in e.value.details()
    assert "wall_seconds = -2.0" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        agent.report_result(job.job_id, job.lease_id, "{not json")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "run record is not JSON" in e.value.details()
    big = make_run(job.job_id, acceptance_reason="x" * 300_000)
    with pytest.raises(grpc.RpcError) as e:
        agent.report_result(job.job_id, job.lease_id, big)
    assert e.value.details() == f"record_json: {len(big)} characters; at most 262144"
    huge = make_run(job.job_id, acceptance_reason="x" * (5 * 1024 * 1024))
    assert code_of(lambda: agent.report_result(job.job_id, job.lease_id, huge)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    with coordinator.store.tx() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_idle_heartbeats_are_written_in_batches_and_drain_is_seen_at_once(coordinator):
    import time

    agent = enrol(coordinator)
    assert not agent.heartbeat(status="idle and well").drain
    deadline = time.monotonic() + 10
    while True:
        with coordinator.store.tx() as con:
            status = con.execute("SELECT status FROM agents WHERE agent_id = ?", [agent.agent_id]).fetchone()[0]
        if status == "idle and well":
            break
        assert time.monotonic() < deadline, f"the heartbeat's status never reached the database ({status!r})"
        time.sleep(0.1)
    admin_for(coordinator).SetAgentState(pb.SetAgentStateRequest(agent_id=agent.agent_id, state="draining"))
    assert agent.heartbeat().drain
    assert not agent.acquire_job(0).has_job


def test_a_revoked_agent_stays_revoked_whatever_an_admin_asks_and_after_a_restart(tmp_path):
    """Revoked is final: drain, undrain and revoke again are refused, naming the agent, its state
    and the move, and the credential stays refused for every call, also after a restart."""
    coordinator = start_coordinator(tmp_path)
    try:
        agent = enrol(coordinator)
        admin = admin_for(coordinator)
        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
        job = agent.acquire_job(1).job
        admin.SetAgentState(pb.SetAgentStateRequest(agent_id=agent.agent_id, state="revoked"))
        for state in ("draining", "idle", "revoked"):
            with pytest.raises(grpc.RpcError) as e:
                admin.SetAgentState(pb.SetAgentStateRequest(agent_id=agent.agent_id, state=state))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, state
            assert f"agent {agent.agent_id} is revoked (final); it cannot become {state}" in e.value.details()
        calls = [
            lambda: agent.heartbeat(job.job_id, job.lease_id),
            lambda: agent.report_result(job.job_id, job.lease_id, make_run(job.job_id)),
            lambda: agent.complete_job(job.job_id, job.lease_id, 0),
            lambda: agent.fail_job(job.job_id, job.lease_id, "no"),
            lambda: agent.acquire_job(0),
        ]
        assert [code_of(call) for call in calls] == [grpc.StatusCode.PERMISSION_DENIED] * len(calls)
        with coordinator.store.tx() as con:
            # Its open job ended with the revocation, so that the sweep is not left waiting for it.
            assert con.execute("SELECT state, reason FROM jobs").fetchone() == ("cancelled", "agent revoked")
            assert con.execute("SELECT state FROM sweeps").fetchone()[0] == "done"
    finally:
        coordinator.stop()
    coordinator = start_coordinator(tmp_path)
    try:
        again = AgentApi(channel(address(coordinator)), agent._metadata[0][1].removeprefix("Bearer "))
        with pytest.raises(grpc.RpcError) as e:
            admin_for(coordinator).SetAgentState(pb.SetAgentStateRequest(agent_id=agent.agent_id, state="draining"))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert code_of(lambda: again.heartbeat()) == grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: again.complete_job(job.job_id, job.lease_id, 0)) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        coordinator.stop()


def _tables(coordinator) -> dict:
    """Every row of every table the services write, after the heartbeats kept are written."""
    coordinator._on_loop(coordinator.agent_service.flush_beats())
    with coordinator.store.tx() as con:
        return {
            table: sorted(map(str, con.execute(f"SELECT * FROM {table}").fetchall()))
            for table in ("agents", "tokens", "sweeps", "jobs", "runs", "admin_credentials")
        }


MB = 1024 * 1024


def test_every_field_of_every_request_is_bounded_and_the_error_names_it(coordinator):
    """A table of requests each with one field out of bounds: each is refused with
    INVALID_ARGUMENT naming the field, and nothing stored before changes."""
    agent = enrol(coordinator)
    admin = admin_for(coordinator)
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    job = agent.acquire_job(1).job
    assert agent.heartbeat(job.job_id, job.lease_id, status="before").lease_valid
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=100)).token
    newcomer = AgentApi(channel(address(coordinator)))

    def fp(**fields):
        out = pb.Fingerprint()
        out.CopyFrom(LINUX_BOX)
        for name, value in fields.items():
            target = getattr(out, name)
            if isinstance(value, dict):
                target.update(value)
            elif isinstance(value, list):
                target.extend(value)
            else:
                setattr(out, name, value)
        return out

    def beat(status="", fingerprint=None, job_id=job.job_id, lease_id=job.lease_id):
        return lambda: agent.heartbeat(job_id, lease_id, status, fingerprint)

    def enrol_as(name="newcomer", fingerprint=LINUX_BOX, labels=None, engines=("mlx",), with_token=token):
        return lambda: newcomer.enrol(with_token, name, fingerprint, labels or {}, list(engines))

    def acquire(wait_seconds):  # the client's own deadline would follow a NaN
        request = pb.AcquireJobRequest(wait_seconds=wait_seconds)
        return lambda: agent._stub.AcquireJob(request, metadata=agent._metadata, timeout=10)

    cases = [
        (beat(status="s" * (3 * MB)), "status"),
        (beat(fingerprint=fp(chip="c" * MB)), "fingerprint.chip"),
        (beat(fingerprint=fp(hostname="h" * 300)), "fingerprint.hostname"),
        (beat(fingerprint=fp(os="o" * 100)), "fingerprint.os"),
        (beat(fingerprint=fp(os_version="v" * 100)), "fingerprint.os_version"),
        (beat(fingerprint=fp(model_identifier="m" * 100)), "fingerprint.model_identifier"),
        (beat(fingerprint=fp(gpus=["g"] * 17)), "fingerprint.gpus"),
        (beat(fingerprint=fp(gpus=["ok", "g" * 200])), "fingerprint.gpus[1]"),
        (beat(fingerprint=fp(engine_versions={f"e{i}": "1" for i in range(40)})), "fingerprint.engine_versions"),
        (beat(fingerprint=fp(engine_versions={"mlx": "1" * 200})), "fingerprint.engine_versions['mlx']"),
        (beat(fingerprint=fp(engine_versions={"k" * 100: "1"})), "fingerprint.engine_versions key"),
        (beat(fingerprint=fp(unavailable=["u"] * 40)), "fingerprint.unavailable"),
        (beat(fingerprint=fp(unavailable=["u" * 100])), "fingerprint.unavailable[0]"),
        (beat(fingerprint=fp(memory_bytes=-1)), "fingerprint.memory_bytes"),
        (beat(fingerprint=fp(memory_bandwidth_bytes_per_second=float("nan"))), "fingerprint.memory_bandwidth"),
        (beat(fingerprint=fp(gpu_cores=-3)), "fingerprint.gpu_cores"),
        (beat(fingerprint=fp(performance_cores=10**6)), "fingerprint.performance_cores"),
        (beat(fingerprint=fp(efficiency_cores=-1)), "fingerprint.efficiency_cores"),
        (beat(fingerprint=fp(cpu_cores=-1)), "fingerprint.cpu_cores"),
        (beat(job_id="j" * 100), "job_id"),
        (beat(lease_id="l" * 100), "lease_id"),
        (enrol_as(name="n" * 65), "name"),
        (enrol_as(name=""), "name"),
        (enrol_as(labels={f"k{i}": "v" for i in range(33)}), "labels"),
        (enrol_as(labels={"k" * 65: "v"}), "labels key"),
        (enrol_as(labels={"site": "v" * 257}), "labels['site']"),
        (enrol_as(engines=["mlx"] * 17), "engines"),
        (enrol_as(engines=["e" * 40]), "engines[0]"),
        (enrol_as(with_token="t" * 1000), "token"),
        (enrol_as(fingerprint=fp(chip="c" * MB)), "fingerprint.chip"),
        (acquire(float("nan")), "wait_seconds"),
        (acquire(-1), "wait_seconds"),
        (acquire(7200), "wait_seconds"),
        (lambda: agent.report_result("j" * 100, job.lease_id, make_run(job.job_id)), "job_id"),
        (lambda: agent.report_result(job.job_id, "l" * 100, make_run(job.job_id)), "lease_id"),
        (lambda: agent.report_result(job.job_id, job.lease_id, "r" * 300_000), "record_json"),
        (lambda: agent.complete_job(job.job_id, job.lease_id, -1), "run_count"),
        (lambda: agent.complete_job("j" * 100, job.lease_id, 0), "job_id"),
        (lambda: agent.complete_job(job.job_id, "l" * 100, 0), "lease_id"),
        (lambda: agent.fail_job(job.job_id, job.lease_id, "r" * 5000), "reason"),
        (lambda: agent.fail_job("j" * 100, job.lease_id, "r"), "job_id"),
        (lambda: agent.fail_job(job.job_id, "l" * 100, "r"), "lease_id"),
        (lambda: admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, note="n" * 300)), "note"),
        (lambda: admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=float("nan"))), "ttl_seconds"),
        (lambda: admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=-2)), "max_uses"),
        (lambda: admin.SubmitSweep(pb.SubmitSweepRequest(yaml="#" * (2 * MB))), "yaml"),
        (lambda: admin.GetSweep(pb.GetSweepRequest(sweep_id="s" * 100)), "sweep_id"),
        (lambda: admin.CancelSweep(pb.CancelSweepRequest(sweep_id="s" * 100)), "sweep_id"),
        (lambda: admin.SetAgentState(pb.SetAgentStateRequest(agent_id="a" * 100, state="draining")), "agent_id"),
        (lambda: admin.SetAgentState(pb.SetAgentStateRequest(agent_id=agent.agent_id, state="d" * 100)), "state"),
        (lambda: admin.Export(pb.ExportRequest(table="t" * 100)), "table"),
        (lambda: admin.Export(pb.ExportRequest(table="runs", after_seq=-1)), "after_seq"),
        (lambda: admin.Export(pb.ExportRequest(table="runs", limit=-1)), "limit"),
    ]
    for call, field in cases:
        before = _tables(coordinator)
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, e.value.code(), e.value.details())
        assert e.value.details().startswith(field), (field, e.value.details())
        assert _tables(coordinator) == before, field
    with coordinator.store.tx() as con:
        assert con.execute("SELECT status, chip FROM agents").fetchone() == ("before", "Test CPU")
    assert agent.heartbeat(job.job_id, job.lease_id, status="after").lease_valid  # the agent carries on


def test_the_bounds_table_covers_every_field_of_every_request():
    from coordinator import limits

    assert limits.unbounded() == []
    assert {"EnrolRequest", "HeartbeatRequest", "Fingerprint", "ExportRequest"} <= set(limits.messages())
    fields = {f"{name}.{field.name}" for name, message in limits.messages().items() for field in message.fields}
    assert set(limits.LIMITS) <= fields  # no bound names a field the proto does not have

"""No record wedges an agent. A real coordinator and an agent whose worker (tests/support/poison_worker.py)
spools two good runs and a poisoned one: a record too big for the coordinator (RESOURCE_EXHAUSTED,
retried within its budget), a record it refuses as invalid, spool files the agent cannot read
(not JSON, a lone surrogate, no lease_id, an unknown field), at start and during a job. Each is
moved aside with its reason, the job fails naming it, and the agent goes on to the next job."""

import json
import logging
import threading

import pytest

from agent import runner, upload
from agent.config import AgentConfig
from agent.daemon import Agent
from agent.metrics import AgentMetrics
from agent.retry import Budget
from agent.runner import parked_reason
from agent.spool import Spool
from agent.upload import Parked, Uploader
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.support.agents import Running, identity_for, submit, sweep
from tests.support.fleet import admin_for, run_record
from tests.support.poison_worker import poisoned
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.engine]

UNREADABLE = ("not-json", "surrogate", "no-lease", "unknown-field")
REASONS = {
    "not-json": "not JSON",
    "surrogate": "surrogate",
    "no-lease": "lease_id",
    "unknown-field": "priority",
}


@pytest.fixture
def poisoning(monkeypatch):
    """The agent's workers are tests/support/poison_worker.py; retries of a record are quick."""
    monkeypatch.setattr(runner, "WORKER_MODULE", "tests.support.poison_worker")
    monkeypatch.setattr(upload, "UPLOAD", Budget(0.01, 0.05, float("inf"), max_refusals=3))
    return monkeypatch


def one_job(coordinator, tiny_models, name) -> str:
    return submit(
        coordinator,
        {"name": name, "models": {"llama.cpp": {"target": str(tiny_models.gguf_target)}}, "engines": ["llama.cpp"],
         "prompt_sets": ["code"], "prompts": 2, "max_attempts": 1},
    )  # fmt: skip


def agent_for(coordinator, tmp_path, tiny_models) -> Agent:
    config = tmp_path / "agent"
    identity_for(coordinator, config)
    return Agent(AgentConfig.load(config, {"model_dirs": [tiny_models.gguf_target.parent]}))


def failure_of(coordinator, sweep_id) -> str:
    s = wait_until(lambda: (s := sweep(coordinator, sweep_id)).state != "running" and s, f"sweep {sweep_id} to end")
    assert (s.jobs_failed, s.jobs_done, s.runs) == (1, 0, 2), s
    return s.failures[0]


def parked(spool: Spool) -> dict[str, str]:
    """Run id -> the reason kept beside each record moved aside."""
    return {p.stem: p.read_text() for p in spool.refused.glob("*.reason")}


def the_next_job_is_done(coordinator, tiny_models, agent, poisoning):
    poisoning.delenv("SPECFLEET_POISON")
    clean = one_job(coordinator, tiny_models, "clean")
    wait_until(lambda: sweep(coordinator, clean).jobs_done == 1, "the next job to be done")
    assert not agent.stop.is_set() and agent.spool.depth() == 0


def test_a_5_mib_record_is_parked_after_its_retries_and_its_job_fails_naming_it(
    tmp_path, coordinator, tiny_models, poisoning
):
    poisoning.setenv("SPECFLEET_POISON", "big")
    agent = agent_for(coordinator, tmp_path, tiny_models)
    sweep_id = one_job(coordinator, tiny_models, "big")
    with Running(agent):
        reason = failure_of(coordinator, sweep_id)
        (run_id, kept), *others = parked(agent.spool).items()
        assert not others and "RESOURCE_EXHAUSTED" in kept and "3 times" in kept, kept
        assert f"1 of its 3 runs parked: {run_id}: RESOURCE_EXHAUSTED" in reason, reason
        assert (agent.spool.refused / f"{run_id}.json").stat().st_size > 5 * 2**20  # kept whole
        status = lambda: admin_for(coordinator).ListAgents(pb.ListAgentsRequest()).agents[0].status
        wait_until(lambda: f"1 run parked, last {run_id}: RESOURCE_EXHAUSTED" in status(), "the heartbeat to say so")
        the_next_job_is_done(coordinator, tiny_models, agent, poisoning)


def test_a_run_refused_as_invalid_fails_its_job_and_the_agent_goes_on(tmp_path, coordinator, tiny_models, poisoning):
    poisoning.setenv("SPECFLEET_POISON", "invalid")
    agent = agent_for(coordinator, tmp_path, tiny_models)
    sweep_id = one_job(coordinator, tiny_models, "invalid")
    with Running(agent):
        reason = failure_of(coordinator, sweep_id)
        ((run_id, kept),) = parked(agent.spool).items()
        assert "INVALID_ARGUMENT" in kept and "colour" in kept, kept
        assert f"1 of its 3 runs parked: {run_id}: INVALID_ARGUMENT" in reason, reason
        the_next_job_is_done(coordinator, tiny_models, agent, poisoning)


def test_unreadable_spool_files_at_start_are_moved_aside_with_their_reasons(
    tmp_path, coordinator, tiny_models, poisoning, caplog
):
    agent = agent_for(coordinator, tmp_path, tiny_models)
    earlier = {"job_id": "job-of-an-earlier-life", "lease_id": "its-lease", "attempt": 1}
    names = {}
    for kind in UNREADABLE:
        run_id, text = poisoned(kind, earlier)
        (agent.spool.pending / f"{run_id}.json").write_text(text)
        names[run_id] = kind
    poisoning.setenv("SPECFLEET_POISON", "")
    with caplog.at_level(logging.WARNING, logger="specfleet.agent"), Running(agent):
        the_next_job_is_done(coordinator, tiny_models, agent, poisoning)
    kept = parked(agent.spool)
    assert sorted(kept) == sorted(names)
    for run_id, kind in names.items():
        assert REASONS[kind] in kept[run_id], (kind, kept[run_id])
        assert f"{run_id}.json" in caplog.text  # the log names the file


def test_unreadable_spool_files_during_a_job_fail_it_and_the_agent_goes_on(
    tmp_path, coordinator, tiny_models, poisoning
):
    poisoning.setenv("SPECFLEET_POISON", ",".join(UNREADABLE))
    agent = agent_for(coordinator, tmp_path, tiny_models)
    sweep_id = one_job(coordinator, tiny_models, "unreadable")
    with Running(agent):
        s = wait_until(lambda: (s := sweep(coordinator, sweep_id)).state != "running" and s, "the job to end")
        assert (s.jobs_failed, s.jobs_done, s.runs) == (1, 0, 2), s
        kept = parked(agent.spool)
        assert len(kept) == 4 and all(any(REASONS[k] in r for r in kept.values()) for k in UNREADABLE), kept
        assert "4 of its 6 runs parked: " in s.failures[0], s.failures[0]
        for run_id in kept:
            assert run_id in s.failures[0]
        the_next_job_is_done(coordinator, tiny_models, agent, poisoning)


def test_poison_worker_records_are_what_they_claim(tmp_path):
    """The stand-in's records: the big one is a valid record past 5 MiB, the others as named."""
    job = {"job_id": "j", "lease_id": "l", "attempt": 1}
    big = json.loads(poisoned("big", job)[1])
    assert len(big["record"]) > 5 * 2**20 and json.loads(big["record"])["job_id"] == "j"
    assert "\ud800" in json.loads(poisoned("surrogate", job)[1])["record"]


class BrokenApi:
    """An AgentApi whose upload fails in a way no one expects."""

    def report_result(self, job_id, lease_id, record_json):
        raise ValueError("protobuf said no")


def test_an_unexpected_upload_error_stops_the_agent_naming_the_file_and_keeps_the_record(tmp_path):
    records = Spool(tmp_path / "spool")
    path = records.put("job-1", "lease-1", run_record("job-1"))
    uploader = Uploader(BrokenApi(), records, threading.Event(), AgentMetrics(records.depth))
    reasons = []
    uploader.wake.set()
    uploader.loop(reasons.append)  # returns once it has stopped the agent
    assert reasons == [f"uploading {path}: ValueError: protobuf said no"]
    assert records.paths() == [path] and not uploader.parked


def test_a_job_s_failure_names_its_parked_runs_within_the_coordinator_s_bound():
    many = [Parked(f"run-{i:03d}", "job-1", "RESOURCE_EXHAUSTED: " + "x" * 500) for i in range(40)]
    reason = parked_reason(many, 50)
    assert reason.startswith("40 of its 50 runs parked: run-000: RESOURCE_EXHAUSTED: xxx")
    assert len(reason) <= runner.FAILURE_REASON_CHARS and reason.endswith(" more")
    assert parked_reason(many[:1], 3) == f"1 of its 3 runs parked: run-000: {many[0].reason[:300]}"

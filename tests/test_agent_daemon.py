"""The agent daemon against an in-process coordinator: jobs it will not run are refused with a
reason that reaches `sweep status`; on battery it takes no job and says why, in its status,
to the coordinator and on its /metrics."""

import json
import shutil
import time
import urllib.request

import pytest

from agent import poll
from agent.config import AgentConfig
from agent.daemon import Agent
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.data_dir import admin_credential
from tests.support.agents import Running, identity_for, submit, sweep
from tests.support.fleet import admin_for
from tests.support.processes import cli, wait_until

pytestmark = [pytest.mark.process, pytest.mark.engine]


def test_unknown_engine_method_outside_path_and_too_big_are_refused_with_reasons(tmp_path, coordinator, tiny_models):
    models = tmp_path / "models"
    models.mkdir()
    huge = models / "huge.gguf"
    with open(huge, "wb") as f:
        f.write(b"GGUF")  # a GGUF by its magic, so that its size is what refuses it
        f.truncate(4 * 2**40)  # sparse: 4 TiB on paper, nothing on disk
    config = tmp_path / "agent"
    identity_for(coordinator, config)
    sweep_id = submit(
        coordinator,
        {
            "name": "refusals",
            "models": {"mlx": {"target": str(tiny_models.mlx_target)}, "llama.cpp": {"target": str(huge)}},
            "engines": ["mlx", "llama.cpp"],
            "prompt_sets": ["code", "conversation"],
            "prompts": 2,
            "max_attempts": 3,
        },
    )
    # Two jobs as a newer coordinator might send them: an engine and a method this agent does not know.
    with coordinator.store.tx() as con:
        jobs = con.execute(
            "SELECT job_id, spec FROM jobs WHERE sweep_id = ? ORDER BY created_at", [sweep_id]
        ).fetchall()
        specs = {job_id: json.loads(spec) for job_id, spec in jobs}
        chat = {s["engine"]: j for j, s in specs.items() if s["prompt_set"] == "conversation"}
        specs[chat["mlx"]]["engine"] = "vllm"
        specs[chat["llama.cpp"]]["arms"].append({"method": "medusa", "depth": 2})
        for job_id in (chat["mlx"], chat["llama.cpp"]):
            con.execute("UPDATE jobs SET spec = ? WHERE job_id = ?", [json.dumps(specs[job_id]), job_id])

    shutil.copy(tiny_models.gguf_target, models / "target.gguf")
    too_long = submit(
        coordinator,
        {
            "name": "too-long",
            "models": {"llama.cpp": {"target": str(models / "target.gguf")}},
            "engines": ["llama.cpp"],
            "prompt_sets": ["code"],
            "prompts": 2,
            "context_tokens": [8192],
        },
    )

    with Running(Agent(AgentConfig.load(config, {"model_dirs": [models]}))) as agent:
        wait_until(lambda: sweep(coordinator, sweep_id).jobs_failed == 4, "four refusals")
        wait_until(lambda: sweep(coordinator, too_long).jobs_failed == 1, "the refusal of a context too long")
        assert agent.metrics.jobs.labels("refused")._value.get() == 5
        assert sweep(coordinator, sweep_id).jobs_refused == 4  # apart from crashes, and in jobs_failed
        assert not (config / "jobs").exists()  # no worker was ever started
    (reason,) = sweep(coordinator, too_long).failures
    assert "refused: context of 8192 tokens and 128 new tokens is longer than target.gguf's own context length" in (
        reason
    ), reason

    status = cli(
        "sweep", "status", sweep_id, "--coordinator", f"127.0.0.1:{coordinator.port}",
        "--admin-token", admin_credential(coordinator.config.data_dir),
    ).stdout  # fmt: skip
    assert "4/4 jobs finished" in status and "failed 4" in status, status
    failures = "\n".join(sweep(coordinator, sweep_id).failures)
    assert "attempt 1 of 3: refused: engine 'vllm' is not one this agent runs" in failures  # never retried
    assert "refused: method(s) 'medusa' unknown to engine llama.cpp" in failures
    assert f"refused: model path {tiny_models.mlx_target} is outside this agent's model directories" in failures
    assert "refused: model too big for this machine: " + str(huge) in failures
    for line in failures.splitlines():
        assert line.split(": ", 1)[1] in status  # each reason, as `sweep status` prints it


def test_on_battery_no_job_starts_and_the_reason_is_everywhere(tmp_path, coordinator, monkeypatch):
    monkeypatch.setattr(poll, "POWER_RECHECK_SECONDS", 0.3)
    power = {"power_source": "battery"}
    config = tmp_path / "agent"
    identity_for(coordinator, config)
    sweep_id = submit(
        coordinator,
        {"name": "battery", "models": {"mlx": {"target": str(tmp_path / "outside")}}, "engines": ["mlx"],
         "prompt_sets": ["code"], "prompts": 2},
    )  # fmt: skip
    agent = Agent(AgentConfig.load(config, {"metrics_port": 0}), sample_environment=lambda: dict(power))
    with Running(agent):
        wait_until(lambda: agent.state.not_starting, "the agent to hold back")
        agents = wait_until(
            lambda: [a for a in admin_for(coordinator).ListAgents(pb.ListAgentsRequest()).agents
                     if a.status.startswith("not starting jobs: on battery power")],
            "the heartbeat to carry the reason",
        )  # fmt: skip
        assert agents[0].name == "agent-under-test"
        # Enrolled with a made-up fingerprint; the agent sent this machine's own at start.
        assert agents[0].fingerprint.chip == agent.fingerprint.chip != "Test CPU"
        out = wait_until(
            lambda: (
                (o := cli("agent", "status", "--config-dir", str(config), check=False).stdout)
                and "not starting jobs: on battery power" in o
                and o
            ),
            "`agent status` to show the reason",
        )
        assert "spool depth: 0" in out and "last contact:" in out and "never" not in out
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10).read().decode()
        assert "specfleet_agent_not_starting_jobs 1.0" in metrics and "specfleet_agent_spool_depth 0.0" in metrics
        time.sleep(1.0)
        assert sweep(coordinator, sweep_id).jobs_queued == 1  # never acquired on battery

        power["power_source"] = "ac"  # plugged in: the job is taken (and refused: its model is not here)
        wait_until(lambda: sweep(coordinator, sweep_id).jobs_failed == 1, "the job to be taken on AC")
        assert "does not exist on this agent" in sweep(coordinator, sweep_id).failures[0]
        assert agent.state.not_starting == ""
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10).read().decode()
        assert "specfleet_agent_not_starting_jobs 0.0" in metrics
        assert 'specfleet_agent_jobs_total{outcome="refused"} 1.0' in metrics


def test_allow_battery_takes_jobs_anyway(tmp_path, coordinator):
    config = tmp_path / "agent"
    identity_for(coordinator, config)
    sweep_id = submit(
        coordinator,
        {"name": "battery-ok", "models": {"mlx": {"target": str(tmp_path / "gone")}}, "engines": ["mlx"],
         "prompt_sets": ["code"], "prompts": 2},
    )  # fmt: skip
    agent = Agent(
        AgentConfig.load(config, {"allow_battery": True}), sample_environment=lambda: {"power_source": "battery"}
    )
    with Running(agent):
        wait_until(lambda: sweep(coordinator, sweep_id).jobs_failed == 1, "the job to be taken")
        # Taken on battery and refused for its model (not held back for the power source), and the
        # agent never said it was not starting jobs.
        assert "does not exist on this agent" in sweep(coordinator, sweep_id).failures[0]
        assert agent.state.not_starting == ""
        listed = admin_for(coordinator).ListAgents(pb.ListAgentsRequest()).agents
        assert [a.status for a in listed if a.status.startswith("not starting jobs")] == []

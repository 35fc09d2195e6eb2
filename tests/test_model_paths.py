"""One model, two machines, two paths: two agents whose copies of the same GGUF sit in different
directories (a ~/models folder on one, a cache of another user on the other) report one model,
named by its file name and content digest, and their runs form one comparable group."""

import shutil
import urllib.request

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from specfleet import speedup
from tests.support.agents import Running, identity_for, submit, sweep
from tests.support.fleet import ANY_LOAD
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.engine]


def test_two_agents_with_one_model_at_different_paths_show_one_model(tmp_path, coordinator, tiny_models):
    agents = []
    for name, where in (("mini", "home/alice/models"), ("studio", "Users/bob/.cache/llama")):
        directory = tmp_path / where
        directory.mkdir(parents=True)
        shutil.copy(tiny_models.gguf_target, directory / tiny_models.gguf_target.name)
        config = tmp_path / name
        identity_for(coordinator, config, name=name)
        agents.append((name, directory, config))
    sweeps = [
        submit(
            coordinator,
            {
                "name": f"paths-{name}",
                "target": {"agents": [name]},
                "models": {"llama.cpp": {"target": str(directory / tiny_models.gguf_target.name)}},
                "engines": ["llama.cpp"],
                "prompt_sets": ["code"],
                "prompts": 2,
                "methods": {"ngram": [3]},
                "max_new_tokens": 8,
                "warmup": 0,
                "repeats": 2,
            },
        )
        for name, directory, _ in agents
    ]
    running = [Running(Agent(AgentConfig.load(config, {"model_dirs": [directory]}))) for _, directory, config in agents]
    for r in running:
        r.__enter__()
    try:
        wait_until(lambda: all(sweep(coordinator, s).jobs_done == 1 for s in sweeps), "both sweeps", 120)
    finally:
        for r in running:
            r.__exit__(None, None, None)

    with coordinator.store.tx() as con:
        models = con.execute(
            "SELECT DISTINCT target_reference, target_digest, target_architecture FROM runs"
        ).fetchall()
        machines = con.execute("SELECT count(DISTINCT agent_id) FROM runs").fetchone()[0]
        groups = speedup.groups(con)
        figures = speedup.speedups(con, ANY_LOAD)  # pairs whatever the load
    assert models == [(tiny_models.gguf_target.name, models[0][1], "llama")] and len(models[0][1]) == 64
    assert machines == 2
    assert len(groups) == 1 and groups.runs[0] == 2 * 2 * 2 * 2  # 2 machines x 2 prompts x 2 repeats x 2 arms
    assert len(figures) == 1 and figures.machines[0] == 2  # one figure from both machines: one model
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{coordinator.metrics_port}/metrics", timeout=10).read().decode()
    info = [line for line in metrics.splitlines() if line.startswith("specfleet_comparable_group_info{")]
    assert len(info) == 1 and f'model="{tiny_models.gguf_target.name}"' in info[0], info
    assert str(tmp_path) not in metrics  # no path anywhere

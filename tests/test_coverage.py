"""A sweep's cells that no enrolled agent can run are named, never silently dropped (issue 40):
coordinator/coverage.py's lines, in `sweep submit`'s answer and in the sweep's status, through a
real coordinator on loopback."""

from coordinator import coverage
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.sweeps import parse_sweep
from tests.support.fleet import admin_for, enrol, start_coordinator

TWO_ENGINES = """
name: two-engines
models:
  mlx: {target: /models/target, draft: /models/draft}
  llama.cpp: {target: /models/target.gguf, draft: /models/draft.gguf}
engines: [mlx, llama.cpp]
prompt_sets: [code, qa, math]
prompts: 2
methods: {draft: [2]}
max_new_tokens: 16
repeats: 1
"""


def agent(engines, memory_gb=16):
    return {"name": "a", "engines": list(engines), "memory_bytes": memory_gb * 2**30, "llama_server_builds": set()}


def test_cells_no_agent_can_run_are_counted_by_reason():
    cells = parse_sweep(TWO_ENGINES).cells()
    by_engine = {e: sum(c.engine == e for c in cells) for e in ("mlx", "llama.cpp")}
    assert by_engine == {"mlx": 3, "llama.cpp": 3}  # one cell per prompt set and engine
    assert coverage.uncovered(cells, [agent(["mlx", "llama.cpp"])]) == []
    assert coverage.uncovered(cells, [agent(["mlx"])]) == ["3 cells: no agent has llama.cpp"]
    assert coverage.uncovered(cells, []) == ["3 cells: no agent has mlx", "3 cells: no agent has llama.cpp"]
    one = [c for c in cells if c.engine == "llama.cpp"][:1]
    assert coverage.uncovered(one, [agent(["mlx"])]) == ["1 cell: no agent has llama.cpp"]


def test_cells_too_big_for_every_agent_say_the_memory():
    text = TWO_ENGINES.replace(
        "{target: /models/target.gguf, draft: /models/draft.gguf}", "{target: /m.gguf, draft: /d.gguf, memory_gb: 64}"
    )
    cells = parse_sweep(text).cells()
    lines = coverage.uncovered(cells, [agent(["mlx", "llama.cpp"], memory_gb=16)])
    assert lines == ["3 cells: no agent with llama.cpp has the 64 GB of memory its model needs"]


def test_submit_and_status_list_the_cells_no_agent_can_run(tmp_path):
    coordinator = start_coordinator(tmp_path)
    try:
        enrol(coordinator, "mlx-only", engines=("mlx",))
        admin = admin_for(coordinator)
        resp = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=TWO_ENGINES))
        assert resp.jobs == 3 and list(resp.uncovered) == ["3 cells: no agent has llama.cpp"]
        status = admin.GetSweep(pb.GetSweepRequest(sweep_id=resp.sweep_id))
        assert list(status.uncovered) == ["3 cells: no agent has llama.cpp"]
        enrol(coordinator, "both", engines=("mlx", "llama.cpp"))
        covered = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=TWO_ENGINES))
        assert covered.jobs == 9 and list(covered.uncovered) == []
        listed = {s.sweep_id: list(s.uncovered) for s in admin.ListSweeps(pb.ListSweepsRequest()).sweeps}
        assert listed == {resp.sweep_id: ["3 cells: no agent has llama.cpp"], covered.sweep_id: []}
    finally:
        coordinator.stop()

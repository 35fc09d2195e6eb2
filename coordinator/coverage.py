"""The cells of a sweep that no enrolled agent can run, and why: said at submission, in the
sweep's status and on the dashboard's Sweeps page, never silently dropped.

A sweep becomes one job per cell and agent that matches its target and can run the cell
(specfleet.sweeps.agent_can_run: the engine, a pinned llama-server build, the memory). A cell
no such agent can run gets no job at all; where no cell gets one the sweep is refused
(scheduler.NoMatchingAgents), and where only some do, those cells are listed here, grouped by
reason, as "3 cells: no agent has llama.cpp". The lines are computed once, at submission, from
the agents the coordinator then knew, and stored with the sweep (migration 016): an agent enrolled
later gets no job of the sweep either.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from specfleet.sweeps import agent_can_run


def reason(cell, agents: list[dict[str, Any]]) -> str:
    """Why none of `agents` (their engines, llama-server builds and memory) can run `cell`."""
    have_engine = [a for a in agents if cell.engine in a["engines"]]
    if not have_engine:
        return f"no agent has {cell.engine}"
    build = cell.server.build if cell.server is not None else ""
    if build:
        have_build = [a for a in have_engine if build in a.get("llama_server_builds", ())]
        if not have_build:
            return f"no agent with {cell.engine} has llama-server build {build}"
    return f"no agent with {cell.engine} has the {cell.memory_gb:g} GB of memory its model needs"


def uncovered(cells: list, agents: list[dict[str, Any]]) -> list[str]:
    """One line per reason, the count of cells first ("3 cells: no agent has llama.cpp"), in the
    order the reasons first occur among the cells; [] where every cell has an agent. `agents`
    are the enrolled agents the sweep's target matches."""
    counts = Counter(reason(cell, agents) for cell in cells if not any(agent_can_run(cell, a) for a in agents))
    return [f"{n} cell{'' if n == 1 else 's'}: {why}" for why, n in counts.items()]

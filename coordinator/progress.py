"""A sweep's progress beyond its job counts: runs expected, each working agent's cell and the arm
of its latest stored run, and an ETA from the runs' own pace.

The pace of a job is the median time between the starts of its consecutive stored runs (warm-ups
and cool-downs included, as they take the agent's time), or its runs' median wall time while it
has one run only; a job without runs takes the pace of the same cell on other agents, else the
sweep's. Each agent runs its jobs one at a time, so its time left is the sum over its open jobs
of runs left times pace; the sweep's ETA is the longest of its agents'. Pure functions but
`sweep_progress`, which reads the store.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from specfleet.design import rounded_repeats

OPEN_STATES = ("queued", "leased")


def expected_runs(spec: dict) -> int:
    """The runs a job's worker stores when it completes: every prompt x arm x repeat (repeats
    rounded up as agent/protocol.py runs them), and one verify-cost run per context depth."""
    arms = len(spec.get("arms", ()))
    runs = len(spec.get("prompts", ())) * arms * rounded_repeats(spec.get("repeats", 3), arms) if arms else 0
    if spec.get("verify_cost"):
        runs += len(spec["verify_cost"].get("context_tokens", ()))
    return runs


def cell_label(spec: dict) -> str:
    """A cell in a few words: engine, target model's name, prompt set, context, a sampled temperature."""
    target = Path(spec.get("model", {}).get("target", "?")).name
    label = f"{spec.get('engine', '?')} {target} {spec.get('prompt_set', '?')}, context {spec.get('context_tokens', 0)}"
    temperature = spec.get("sampler", {}).get("temperature", 0.0)
    return label + (f", T={temperature:g}" if temperature else "")


def arm_label(method: str, depth: int) -> str:
    return f"{method} K={depth}" if depth else method


@dataclass(frozen=True)
class JobProgress:
    """One job of a sweep as the ETA sees it."""

    job_id: str
    agent_id: str
    state: str
    cell: str  # the job's spec as stored: equal for the same cell on every agent
    runs: int  # stored by its current (or, once ended, its last) attempt
    runs_expected: int
    pace_seconds: float | None  # its own; None before its first run


def eta_seconds(jobs: list[JobProgress]) -> float | None:
    """Seconds until every open job is done (0 when none is open); None when an open job has no
    pace of its own, of its cell's or of the sweep's."""
    by_cell: dict[str, list[float]] = {}
    for j in jobs:
        if j.pace_seconds is not None:
            by_cell.setdefault(j.cell, []).append(j.pace_seconds)
    paces = [p for cell in by_cell.values() for p in cell]
    sweep_pace = statistics.median(paces) if paces else None
    left: dict[str, float] = {}
    for j in jobs:
        if j.state not in OPEN_STATES:
            continue
        pace = j.pace_seconds
        if pace is None:
            pace = statistics.median(by_cell[j.cell]) if j.cell in by_cell else sweep_pace
        if pace is None:
            return None
        left[j.agent_id] = left.get(j.agent_id, 0.0) + max(j.runs_expected - j.runs, 0) * pace
    return max(left.values(), default=0.0)


@dataclass(frozen=True)
class AgentOnSweep:
    agent_id: str
    name: str
    job_id: str
    cell: str  # cell_label
    arm: str  # arm_label of its latest stored run; "" before its first
    runs: int
    runs_expected: int


@dataclass(frozen=True)
class SweepProgress:
    runs_expected: int  # of its open and done jobs, and what its failed or cancelled ones stored
    eta_seconds: float | None
    agents: list[AgentOnSweep]


def sweep_progress(con, sweep_ids: list[str]) -> dict[str, SweepProgress]:
    """Each sweep's progress, read in the caller's transaction `con`."""
    if not sweep_ids:
        return {}
    jobs = con.execute(
        "WITH r AS (SELECT job_id, lease_id, started_at_unix_seconds AS t, wall_seconds, method, depth,"
        "   t - lag(t) OVER (PARTITION BY job_id, lease_id ORDER BY t) AS gap"
        "   FROM runs WHERE sweep_id IN (SELECT unnest(?))),"
        " per_attempt AS (SELECT job_id, lease_id, count(*) AS runs, median(gap) AS gap, median(wall_seconds) AS wall,"
        "   arg_max(method, t) AS method, arg_max(depth, t) AS depth FROM r GROUP BY job_id, lease_id)"
        " SELECT j.sweep_id, j.job_id, j.agent_id, a.name, j.state, j.spec,"
        "   coalesce(p.runs, 0), coalesce(p.gap, p.wall), p.method, p.depth"
        " FROM jobs j JOIN agents a USING (agent_id)"
        " LEFT JOIN per_attempt p ON p.job_id = j.job_id AND p.lease_id = j.lease_id"
        " WHERE j.sweep_id IN (SELECT unnest(?)) ORDER BY a.name, j.job_id",
        [sweep_ids, sweep_ids],
    ).fetchall()
    per_sweep: dict[str, list[tuple[JobProgress, AgentOnSweep | None]]] = {s: [] for s in sweep_ids}
    for sweep_id, job_id, agent_id, name, state, spec_text, runs, pace, method, depth in jobs:
        spec = json.loads(spec_text)
        job = JobProgress(job_id, agent_id, state, spec_text, runs, expected_runs(spec), pace)
        working = None
        if state == "leased":
            arm = arm_label(method, depth) if method is not None else ""
            working = AgentOnSweep(agent_id, name, job_id, cell_label(spec), arm, runs, job.runs_expected)
        per_sweep[sweep_id].append((job, working))
    return {
        sweep_id: SweepProgress(
            runs_expected=sum(j.runs_expected if j.state in (*OPEN_STATES, "done") else j.runs for j, _ in rows),
            eta_seconds=eta_seconds([j for j, _ in rows]),
            agents=[w for _, w in rows if w is not None],
        )
        for sweep_id, rows in per_sweep.items()
    }

"""A sweep's progress beyond its job counts: runs expected, each working agent's cell and the arm
of its latest stored run, and an ETA from the runs' own pace.

The pace of a job is the median time between the starts of its consecutive stored runs (warm-ups
and cool-downs included, as they take the agent's time), or its runs' median wall time while it
has one run only; a job without runs takes the pace of the same cell on other agents, else the
sweep's. Each agent runs its jobs one at a time, so its time left is the sum over its open jobs
of runs left times pace; the sweep's ETA is the longest of its agents'. Only running sweeps
need this: an ended sweep expects no more runs than it stored. Pure functions but
`sweep_progress`, which reads the store.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from specfleet.design import rounded_repeats

OPEN_STATES = ("queued", "leased")


def expected_runs(prompts: int, arms: int, repeats: int, verify_contexts: int) -> int:
    """The runs a job's worker stores when it completes: every prompt x arm x repeat (repeats
    rounded up as agent/protocol.py runs them), and one verify-cost run per context depth."""
    return (prompts * arms * rounded_repeats(repeats, arms) if arms else 0) + verify_contexts


def cell_label(engine: str, target: str, prompt_set: str, context_tokens: int, temperature: float) -> str:
    """A cell in a few words: engine, target model's name, prompt set, context, a sampled temperature."""
    label = f"{engine} {Path(target).name} {prompt_set}, context {context_tokens}"
    return label + (f", T={temperature:g}" if temperature else "")


def arm_label(method: str, depth: int) -> str:
    return f"{method} K={depth}" if depth else method


@dataclass(frozen=True)
class JobProgress:
    """One job of a sweep as the ETA sees it."""

    job_id: str
    agent_id: str
    state: str
    cell: str  # a digest of the job's spec: equal for the same cell on every agent
    runs: int  # stored by its current (once ended, its last) attempt; 0 while queued
    runs_expected: int
    pace_seconds: float | None  # its own (a lost attempt's too); None before its first run


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


# Each job of the sweeps with what its spec says (read by DuckDB: a spec holds its prompts and
# context documents, long texts) and its current attempt's runs: how many, their pace, the arm
# of the latest.
_JOBS_SQL = """
WITH r AS (
    SELECT job_id, lease_id, started_at_unix_seconds AS t, wall_seconds, method, depth,
           t - lag(t) OVER (PARTITION BY job_id, lease_id ORDER BY t) AS gap
    FROM runs WHERE sweep_id IN (SELECT unnest(?))),
per_attempt AS (
    SELECT job_id, lease_id, count(*) AS runs, median(gap) AS gap, median(wall_seconds) AS wall,
           arg_max(method, t) AS method, arg_max(depth, t) AS depth
    FROM r GROUP BY job_id, lease_id)
SELECT j.sweep_id, j.job_id, j.agent_id, a.name, j.state, md5(CAST(j.spec AS VARCHAR)),
       coalesce(json_array_length(j.spec, '$.prompts'), 0), coalesce(json_array_length(j.spec, '$.arms'), 0),
       coalesce(CAST(j.spec ->> '$.repeats' AS INTEGER), 3),
       coalesce(json_array_length(j.spec, '$.verify_cost.context_tokens'), 0),
       j.spec ->> '$.engine', j.spec ->> '$.model.target', j.spec ->> '$.prompt_set',
       coalesce(CAST(j.spec ->> '$.context_tokens' AS INTEGER), 0),
       coalesce(CAST(j.spec ->> '$.sampler.temperature' AS DOUBLE), 0.0),
       coalesce(p.runs, 0), coalesce(p.gap, p.wall), p.method, p.depth
FROM jobs j JOIN agents a USING (agent_id)
LEFT JOIN per_attempt p ON p.job_id = j.job_id AND p.lease_id = j.lease_id
WHERE j.sweep_id IN (SELECT unnest(?)) ORDER BY a.name, j.job_id
"""


def sweep_progress(con, sweep_ids: list[str]) -> dict[str, SweepProgress]:
    """The progress of each (running) sweep, read in the caller's transaction `con`."""
    if not sweep_ids:
        return {}
    per_sweep: dict[str, list[tuple[JobProgress, AgentOnSweep | None]]] = {s: [] for s in sweep_ids}
    for row in con.execute(_JOBS_SQL, [sweep_ids, sweep_ids]).fetchall():
        sweep_id, job_id, agent_id, name, state, cell, prompts, arms, repeats, contexts = row[:10]
        engine, target, prompt_set, context_tokens, temperature, runs, pace, method, depth = row[10:]
        expected = expected_runs(prompts, arms, repeats, contexts)
        if state == "queued":  # back in the queue after a lost lease: its next attempt starts afresh
            runs = 0
        job = JobProgress(job_id, agent_id, state, cell, runs, expected, pace)
        working = None
        if state == "leased":
            label = cell_label(engine or "?", target or "?", prompt_set or "?", context_tokens, temperature)
            arm = arm_label(method, depth) if method is not None else ""
            working = AgentOnSweep(agent_id, name, job_id, label, arm, runs, expected)
        per_sweep[sweep_id].append((job, working))
    return {
        sweep_id: SweepProgress(
            runs_expected=sum(j.runs_expected if j.state in (*OPEN_STATES, "done") else j.runs for j, _ in rows),
            eta_seconds=eta_seconds([j for j, _ in rows]),
            agents=[w for _, w in rows if w is not None],
        )
        for sweep_id, rows in per_sweep.items()
    }

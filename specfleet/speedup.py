"""The one definition of speedup, in SQL, for every surface that shows one.

The demo's summary, the dashboard and the coordinator's /metrics all call `speedups()` on a
DuckDB relation of stored runs (the coordinator's table, the dashboard's mirror, an exported
Arrow table), so the same runs give the same figure everywhere. docs/speedup.md says it in
words:

1. Pool only comparable runs: equal on every checked key (specfleet/record.py CHECKED_KEYS).
   Each comparable group has a `comparable` id, the first 12 hex digits of the MD5 of its keys.
2. Only runs of a job's current attempt count (the `jobs` table's attempt, of a job leased or
   done): runs of an attempt whose lease was lost, or of a failed job, stay stored and visible
   but never enter a figure. Pair an arm's run with the baseline run of the same attempt (job
   and lease), prompt, repeat and checked keys: ratio = arm decode tok/s / baseline decode
   tok/s. A claim whose source ran its baseline on other files (dashboard/claims.yaml
   baseline_models: the bug report's non-MTP GGUF) pairs across weights instead: the same
   machine's baseline of those files, prompt and repeat, equal on every other checked key.
   Verify-cost runs are never speedups. A pair is left out when either run was not
   nominal (env_nominal false), when the arm's output differed from its reference with a clear
   margin (lossless false: a defect, shown as such), or when either speed is 0. A run that
   diverged at a near-tie (divergence "near-tie", lossless None: agent/divergence.py) stays in,
   labelled. No run is removed for being slow or fast: every pair enters (issue 37).
3. Combine on the log scale, in the order of replication: the median log ratio over a prompt's
   repeats (robust by construction: a stall in either arm of a minority of repeats moves it by
   at most the repeats' own spread; bench/verdicts.py section stalls), then the mean over a
   machine's prompts, then over machines; the speedup is its exponential. Every figure carries
   the machines, the fewest prompts on any machine, and the pairs behind it.
4. Stalls are a figure of their own, never cut from the others (`flagged_sql`, `stall_counts_sql`):
   a run whose decode speed is under 1 / STALL_FACTOR of the median of its arm's repeats on the
   prompt in one attempt (at least STALL_MIN_REPEATS of them) is a stall; every surface shows the
   stall rate per arm beside the figure (llama.cpp's "STUCK speculative loop" is one: a ledger
   claim on it, dashboard/claims.yaml).
"""

from __future__ import annotations

import pandas as pd

from specfleet.record import CHECKED_KEYS, VERIFY_COST, differences

_KEYS = ", ".join(CHECKED_KEYS)
_A_KEYS = ", ".join(f"a.{k}" for k in CHECKED_KEYS)
# A comparable group's id: from its checked keys' values, the same wherever it is computed.
COMPARABLE_ID = (
    "left(md5(concat_ws('|', " + ", ".join(f"coalesce(CAST({k} AS VARCHAR), '')" for k in CHECKED_KEYS) + ")), 12)"
)


def _same(keys) -> str:
    return " AND ".join(f"a.{k} IS NOT DISTINCT FROM b.{k}" for k in keys)


_SAME_KEYS = _same(CHECKED_KEYS)
# The weights: what a baseline of other files (a claim's baseline_models) differs in, and nothing else.
WEIGHT_KEYS = ("target_digest", "draft_digest")
_SAME_BUT_WEIGHTS = _same(k for k in CHECKED_KEYS if k not in WEIGHT_KEYS)
# Step 2's pair: the baseline of the same attempt, prompt and repeat, equal on every checked key;
# or, across weights, the same machine's baseline of the same prompt and repeat, equal on every
# checked key but the weights (another job: the source's baseline on other files).
_SAME_ATTEMPT = f"b.job_id = a.job_id AND b.lease_id = a.lease_id AND {_SAME_KEYS}"
_SAME_MACHINE = (
    f"b.machine_id = a.machine_id AND b.target_digest IS DISTINCT FROM a.target_digest AND {_SAME_BUT_WEIGHTS}"
)


def counts_sql(run: str, jobs: str = "jobs") -> str:
    """SQL condition: the run aliased `run` may enter a figure, being of its job's current
    attempt, the job leased or done. `jobs` is a relation with job_id, attempt and state."""
    return (
        f"EXISTS (SELECT 1 FROM {jobs} j WHERE j.job_id = {run}.job_id AND j.attempt = {run}.attempt"
        " AND j.state IN ('leased', 'done'))"
    )


def valid_sql(source: str, jobs: str = "jobs") -> str:
    """The runs of `source` that may enter a figure: of an attempt that counts (counts_sql)."""
    return f"(SELECT r.* FROM {source} r WHERE {counts_sql('r', jobs)})"


# Stalls (issue 26: one repeat at 11.6 tok/s among others near 95; llama.cpp's STUCK speculative
# loop): a run whose decode speed is under 1 / STALL_FACTOR of the median of its arm's repeats on the
# same prompt in the same attempt and comparable group (at least STALL_MIN_REPEATS of them). Counted
# and shown as the stall rate per arm; never removed (issue 37: removal was symmetric, the effect
# not). Normal noise (2% s.d.) never halves a run (tests/test_honest_failures.py).
STALL_FACTOR = 2.0
STALL_MIN_REPEATS = 3
_REPEATS_OF_ARM = f"PARTITION BY job_id, lease_id, method, depth, prompt_id, {_KEYS}"


def flagged_sql(source: str) -> str:
    """The runs of `source` with a boolean column `stall`, judged among the runs of their arm's
    repeats on the prompt in one attempt and comparable group that have a positive speed
    (verify-cost runs and runs at zero speed never are: no figure counts them anyway)."""
    tps, part = "decode_tokens_per_second", _REPEATS_OF_ARM
    positive = f"CASE WHEN {tps} > 0 THEN {tps} END"
    return f"""(
    SELECT * EXCLUDE (_median, _repeats),
           coalesce(method != '{VERIFY_COST}' AND _repeats >= {STALL_MIN_REPEATS}
            AND {positive} * {STALL_FACTOR} < _median, false) AS stall
    FROM (SELECT *, median({positive}) OVER ({part}) AS _median, count({positive}) OVER ({part}) AS _repeats
          FROM {source}))"""


def stall_counts_sql(source: str, comparable: str = COMPARABLE_ID) -> str:
    """Per comparable group, chip and arm: the generation runs with a positive speed, the stalls
    among them and their rate (stall_rate, 0..1), and the near-tie runs (kept): what the figures
    show beside them. `comparable` as groups_sql takes it."""
    return f"""
    SELECT {comparable} AS comparable, chip, method, depth,
           count(*) FILTER (WHERE decode_tokens_per_second > 0) AS judged_runs,
           count(*) FILTER (WHERE stall) AS stalled_runs,
           count(*) FILTER (WHERE stall) / nullif(count(*) FILTER (WHERE decode_tokens_per_second > 0), 0)
             AS stall_rate,
           count(*) FILTER (WHERE divergence = 'near-tie') AS near_tie_runs
    FROM {flagged_sql(source)} WHERE method != '{VERIFY_COST}'
    GROUP BY ALL HAVING stalled_runs > 0 OR near_tie_runs > 0
    """


def pairs_sql(source: str, jobs: str | None = "jobs", across_weights: bool = False) -> str:
    """One row per pair (step 2) of the runs of `source`: its comparable group (the arm's),
    checked keys, names, chip, machine, arm, prompt, repeat, job and attempt, and its log ratio.
    With `jobs`, only runs that count (counts_sql) pair; without, every attempt's
    (coordinator/figures.py applies counts_sql later). `across_weights`: each arm run pairs with
    the baseline of other weights in `source` instead (a claim's baseline_models)."""
    valid = valid_sql(source, jobs) if jobs else source
    same = _SAME_MACHINE if across_weights else _SAME_ATTEMPT
    return f"""
    SELECT {COMPARABLE_ID.replace("CAST(", "CAST(a.")} AS comparable, {_A_KEYS},
           a.target_reference, a.draft_reference, a.prompt_set, a.chip, a.machine_id,
           a.method, a.depth, a.prompt_id, a.repeat, a.job_id, a.attempt,
           ln(a.decode_tokens_per_second / b.decode_tokens_per_second) AS log_ratio
    FROM {valid} a JOIN {valid} b
      ON b.prompt_id = a.prompt_id AND b.repeat = a.repeat AND b.method = 'baseline' AND {same}
    WHERE a.method NOT IN ('baseline', '{VERIFY_COST}')
      AND a.decode_tokens_per_second > 0 AND b.decode_tokens_per_second > 0
      AND a.env_nominal IS DISTINCT FROM false AND b.env_nominal IS DISTINCT FROM false
      AND a.lossless IS DISTINCT FROM false
    """


def per_prompt_sql(source: str, jobs: str = "jobs", across_weights: bool = False) -> str:
    """One row per comparable group, chip, machine, arm and prompt: the median log ratio over the
    prompt's repeats (step 3). What intervals are over (machines crossed with prompts).
    `across_weights` as pairs_sql takes it."""
    return f"""
    SELECT comparable, any_value(target_reference) AS target_reference,
           any_value(draft_reference) AS draft_reference, any_value(prompt_set) AS prompt_set,
           any_value(engine) AS engine, chip, machine_id, method, depth, prompt_id,
           median(log_ratio) AS log_ratio, count(*) AS repeats
    FROM ({pairs_sql(source, jobs, across_weights)}) GROUP BY comparable, chip, machine_id, method, depth, prompt_id
    """


def speedup_sql(source: str, jobs: str = "jobs") -> str:
    """One row per comparable group, chip and arm: the speedup and what stands behind it."""
    return f"""
    WITH per_machine AS (
        SELECT comparable, any_value(target_reference) AS target_reference,
               any_value(draft_reference) AS draft_reference, any_value(prompt_set) AS prompt_set,
               any_value(engine) AS engine, chip, machine_id, method, depth,
               avg(log_ratio) AS log_ratio, count(*) AS prompts, sum(repeats) AS pairs
        FROM ({per_prompt_sql(source, jobs)}) GROUP BY comparable, chip, machine_id, method, depth
    )
    SELECT comparable, any_value(engine) AS engine, any_value(target_reference) AS target_reference,
           any_value(draft_reference) AS draft_reference, any_value(prompt_set) AS prompt_set,
           chip, method, depth, exp(avg(log_ratio)) AS speedup, count(*) AS machines,
           min(prompts) AS prompts, sum(pairs) AS pairs
    FROM per_machine GROUP BY comparable, chip, method, depth
    ORDER BY comparable, chip, method, depth
    """


def groups_sql(source: str, comparable: str = COMPARABLE_ID) -> str:
    """One row per comparable group of generation runs: its id, checked keys, what it names
    (models, prompt set) and its run count, most runs first. `comparable`: the id's SQL, or the
    name of a column of `source` that holds it already (the dashboard's mirror)."""
    return f"""
    SELECT {comparable} AS comparable, {_KEYS},
           any_value(target_reference) AS target_reference, any_value(draft_reference) AS draft_reference,
           any_value(prompt_set) AS prompt_set, count(*) AS runs
    FROM {source} WHERE method != '{VERIFY_COST}'
    GROUP BY ALL ORDER BY runs DESC, comparable
    """


def speedups(con, source: str = "runs", jobs: str = "jobs") -> pd.DataFrame:
    """speedup_sql on a DuckDB connection; `source` and `jobs` are relations of the caller's,
    never user input."""
    return con.execute(speedup_sql(source, jobs)).df()


def groups(con, source: str = "runs") -> pd.DataFrame:
    return con.execute(groups_sql(source)).df()


def what_differs(groups: pd.DataFrame) -> list[str]:
    """The checked keys whose values differ between the given comparable groups (rows with the
    CHECKED_KEYS columns), in CHECKED_KEYS order."""
    rows = groups.to_dict("records")
    differing = {k for row in rows[1:] for k in differences(rows[0], row)}
    return [k for k in CHECKED_KEYS if k in differing]

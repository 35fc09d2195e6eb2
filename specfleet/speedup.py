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
   tok/s. Verify-cost runs are never speedups. A pair is left out when either run was not
   nominal (env_nominal false), when the arm's output differed from its reference with a clear
   margin (lossless false: a defect, shown as such), or when either speed is 0. A run that
   diverged at a near-tie (divergence "near-tie", lossless None: agent/divergence.py) stays in,
   labelled. Outlier runs are left out before pairing (`flagged_sql`): beyond OUTLIER_MADS
   median absolute deviations of their arm's repeats on the prompt, in one attempt, and further
   than OUTLIER_MIN_DEVIATION of the median; every surface shows their count beside the figure
   (`outlier_counts_sql`).
3. Combine on the log scale, in the order of replication: the mean log ratio over a prompt's
   repeats, then over a machine's prompts, then over machines; the speedup is its exponential
   (a geometric mean of geometric means). Every figure carries the machines, the fewest
   prompts on any machine, and the pairs behind it.
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


_SAME_KEYS = " AND ".join(f"a.{k} IS NOT DISTINCT FROM b.{k}" for k in CHECKED_KEYS)


def counts_sql(run: str, jobs: str = "jobs") -> str:
    """SQL condition: the run aliased `run` may enter a figure, being of its job's current
    attempt, the job leased or done. `jobs` is a relation with job_id, attempt and state."""
    return (
        f"EXISTS (SELECT 1 FROM {jobs} j WHERE j.job_id = {run}.job_id AND j.attempt = {run}.attempt"
        " AND j.state IN ('leased', 'done'))"
    )


def valid_sql(source: str, jobs: str = "jobs") -> str:
    """The runs of `source` that may enter a figure: of an attempt that counts (counts_sql), and
    no outlier (inliers_sql, judged among every run of `source`)."""
    return f"(SELECT r.* FROM {inliers_sql(source)} r WHERE {counts_sql('r', jobs)})"


# Outlier runs (issue 26: one repeat at 11.6 tok/s among others near 95): a run whose decode speed
# is more than OUTLIER_MADS MADs from the median of its arm's repeats on the same prompt in the same
# attempt and comparable group (at least OUTLIER_MIN_REPEATS of them), and more than
# OUTLIER_MIN_DEVIATION of that median away: the MAD of three repeats is one gap, so without the
# floor normal noise (2% s.d.) would flag about one run in seven; with it, none
# (tests/test_honest_failures.py).
OUTLIER_MADS = 3.0
OUTLIER_MIN_DEVIATION = 0.25
OUTLIER_MIN_REPEATS = 3
_REPEATS_OF_ARM = f"PARTITION BY job_id, lease_id, method, depth, prompt_id, {_KEYS}"


def flagged_sql(source: str) -> str:
    """The runs of `source` with a boolean column `outlier`, judged among the runs of their arm's
    repeats on the prompt in one attempt and comparable group that have a positive speed (verify-cost runs and runs at
    zero speed never are: no figure counts them anyway)."""
    tps, part = "decode_tokens_per_second", _REPEATS_OF_ARM
    positive = f"CASE WHEN {tps} > 0 THEN {tps} END"
    return f"""(
    SELECT * EXCLUDE (_median, _repeats, _deviation),
           coalesce(method != '{VERIFY_COST}' AND _repeats >= {OUTLIER_MIN_REPEATS}
            AND _deviation > {OUTLIER_MIN_DEVIATION} * _median
            AND _deviation > {OUTLIER_MADS} * median(_deviation) OVER ({part}), false) AS outlier
    FROM (SELECT *, abs({positive} - _median) AS _deviation
          FROM (SELECT *, median({positive}) OVER ({part}) AS _median, count({positive}) OVER ({part}) AS _repeats
                FROM {source})))"""


def inliers_sql(source: str) -> str:
    """`source` without its outlier runs (flagged_sql), in its own columns."""
    return f"(SELECT * EXCLUDE (outlier) FROM {flagged_sql(source)} WHERE NOT outlier)"


def outlier_counts_sql(source: str, comparable: str = COMPARABLE_ID) -> str:
    """Outlier runs per comparable group, chip and arm, and the near-tie runs beside them (kept):
    what the figures show with their counts. `comparable` as groups_sql takes it."""
    return f"""
    SELECT {comparable} AS comparable, chip, method, depth,
           count(*) FILTER (WHERE outlier) AS outlier_runs,
           count(*) FILTER (WHERE divergence = 'near-tie' AND NOT outlier) AS near_tie_runs
    FROM {flagged_sql(source)} WHERE method != '{VERIFY_COST}'
    GROUP BY ALL HAVING outlier_runs > 0 OR near_tie_runs > 0
    """


def pairs_sql(source: str, jobs: str | None = "jobs") -> str:
    """One row per pair (step 2) of the runs of `source`: its comparable group, checked keys,
    names, chip, machine, arm, prompt, repeat, job and attempt, and its log ratio. Outlier runs
    are judged among every run of `source` and left out first; with `jobs`, only runs that count
    (counts_sql) pair; without, every attempt's (coordinator/figures.py applies counts_sql later)."""
    valid = valid_sql(source, jobs) if jobs else inliers_sql(source)
    return f"""
    SELECT {COMPARABLE_ID.replace("CAST(", "CAST(a.")} AS comparable, {_A_KEYS},
           a.target_reference, a.draft_reference, a.prompt_set, a.chip, a.agent_id,
           a.method, a.depth, a.prompt_id, a.repeat, a.job_id, a.attempt,
           ln(a.decode_tokens_per_second / b.decode_tokens_per_second) AS log_ratio
    FROM {valid} a JOIN {valid} b
      ON b.job_id = a.job_id AND b.lease_id = a.lease_id AND b.prompt_id = a.prompt_id
     AND b.repeat = a.repeat AND b.method = 'baseline' AND {_SAME_KEYS}
    WHERE a.method NOT IN ('baseline', '{VERIFY_COST}')
      AND a.decode_tokens_per_second > 0 AND b.decode_tokens_per_second > 0
      AND a.env_nominal IS DISTINCT FROM false AND b.env_nominal IS DISTINCT FROM false
      AND a.lossless IS DISTINCT FROM false
    """


def per_prompt_sql(source: str, jobs: str = "jobs") -> str:
    """One row per comparable group, chip, machine, arm and prompt: the mean log ratio over the
    prompt's repeats. What intervals resample (machines, then prompts)."""
    return f"""
    SELECT comparable, any_value(target_reference) AS target_reference,
           any_value(draft_reference) AS draft_reference, any_value(prompt_set) AS prompt_set,
           any_value(engine) AS engine, chip, agent_id, method, depth, prompt_id,
           avg(log_ratio) AS log_ratio, count(*) AS repeats
    FROM ({pairs_sql(source, jobs)}) GROUP BY comparable, chip, agent_id, method, depth, prompt_id
    """


def speedup_sql(source: str, jobs: str = "jobs") -> str:
    """One row per comparable group, chip and arm: the speedup and what stands behind it."""
    return f"""
    WITH per_machine AS (
        SELECT comparable, any_value(target_reference) AS target_reference,
               any_value(draft_reference) AS draft_reference, any_value(prompt_set) AS prompt_set,
               any_value(engine) AS engine, chip, agent_id, method, depth,
               avg(log_ratio) AS log_ratio, count(*) AS prompts, sum(repeats) AS pairs
        FROM ({per_prompt_sql(source, jobs)}) GROUP BY comparable, chip, agent_id, method, depth
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

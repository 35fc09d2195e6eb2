"""The /metrics figures, kept in tables of their own, so that a scrape never scans runs.

Derived tables in the coordinator's file, each a function of `runs` alone:

- figure_groups: one row per comparable group of generation runs (specfleet/speedup.py
  groups_sql): its id, checked keys, what it names and its run count.
- figure_arms: per comparable group, chip, engine, arm, prompt, job and attempt: the
  nominal-or-unknown generation runs with a positive decode speed and their decode tok/s (a
  list), for the median.
- figure_pairs: per comparable group, chip, machine, arm, prompt, job and attempt: the pairs'
  log ratios (a list) and their number (speedup.pairs_sql; no names: figure_groups names the
  group). specfleet/speedup.py's combination (the median over a prompt's repeats, then the mean
  over prompts, then machines) is exact on these lists; the jobs table says at scrape time which
  job and attempt still count (speedup.counts_sql).
- figure_stalls: per comparable group, chip, arm, prompt, job and attempt: the runs judged and
  the stalls among them (speedup.flagged_sql), the stall rate /metrics shows beside the speedup.

Whether a run is a stall depends on its arm's other repeats on the prompt, which may arrive
later: so `update` recomputes the rows of every prompt of an attempt (job, attempt, prompt) that
a range of runs touched, from that prompt's runs. `catch_up` updates with every run stored since
the last update, in one transaction of its own: a scrape asks for it when its figures are due
(coordinator/metrics.py), never the ingest of each batch (an update is several statements over
the touched prompts' runs, and agents upload a run at a time). `ensure`
rebuilds everything from runs when the tables are missing, their definition changed (a checked key
added: every comparable id changes) or runs holds rows they have not seen. `speedups`, `groups`,
`arms` and `stalls` read them: tests/test_figures.py checks that they equal specfleet/speedup.py's
figures computed from runs, batch by batch.
"""

from __future__ import annotations

import hashlib

import duckdb
import pandas as pd

from specfleet import speedup
from specfleet.record import CHECKED_KEYS, VERIFY_COST

_KEY_COLUMNS = ", ".join(CHECKED_KEYS)
# figure_groups takes its checked keys' types from runs (_schema).
SCHEMA = """
CREATE TABLE figure_groups (
    comparable VARCHAR, {keys}, target_reference VARCHAR, draft_reference VARCHAR,
    prompt_set VARCHAR, runs BIGINT);
CREATE TABLE figure_arms (
    comparable VARCHAR, chip VARCHAR, engine VARCHAR, method VARCHAR, depth INTEGER,
    prompt_id VARCHAR, job_id VARCHAR, attempt INTEGER, target_reference VARCHAR, runs BIGINT, tps DOUBLE[]);
CREATE TABLE figure_pairs (
    comparable VARCHAR, chip VARCHAR, machine_id VARCHAR, method VARCHAR, depth INTEGER,
    prompt_id VARCHAR, job_id VARCHAR, attempt INTEGER, log_ratios DOUBLE[], pairs BIGINT);
CREATE TABLE figure_stalls (
    comparable VARCHAR, chip VARCHAR, method VARCHAR, depth INTEGER,
    prompt_id VARCHAR, job_id VARCHAR, attempt INTEGER, runs BIGINT, stalls BIGINT);
CREATE TABLE figure_state (definition VARCHAR, last_seq BIGINT);
"""
TABLES = ("figure_groups", "figure_arms", "figure_pairs", "figure_stalls", "figure_state")
_PER_PROMPT = ("figure_arms", "figure_pairs", "figure_stalls")  # recomputed per touched prompt

_BATCH = "runs WHERE seq BETWEEN $lo AND $hi"
_GENERATION = f"method != '{VERIFY_COST}'"
# The prompts of an attempt that the batch touched, and every run stored of them: collected once
# per update into a temporary table (one scan of runs), which the per-prompt steps read.
_TOUCHED = f"(SELECT DISTINCT job_id, attempt, prompt_id FROM {_BATCH} AND {_GENERATION})"
_COLLECT = (
    "CREATE OR REPLACE TEMP TABLE figure_prompt_runs AS"
    f" SELECT r.* FROM runs r SEMI JOIN {_TOUCHED} t USING (job_id, attempt, prompt_id)"
)
_PROMPT_RUNS = "figure_prompt_runs"
_TOUCHED_PROMPTS = f"(SELECT DISTINCT job_id, attempt, prompt_id FROM {_PROMPT_RUNS} WHERE {_GENERATION})"

# MERGE, not INSERT ... ON CONFLICT: a DuckLake table has no key to conflict on (coordinator/lake.py).
_GROUPS = f"""
MERGE INTO figure_groups g USING (
    SELECT {speedup.COMPARABLE_ID} AS comparable, {_KEY_COLUMNS}, any_value(target_reference) AS target_reference,
           any_value(draft_reference) AS draft_reference, any_value(prompt_set) AS prompt_set, count(*) AS runs
    FROM {_BATCH} AND {_GENERATION} GROUP BY ALL) b ON g.comparable = b.comparable
WHEN MATCHED THEN UPDATE SET runs = g.runs + b.runs
WHEN NOT MATCHED THEN INSERT BY NAME
"""
_FORGET = "DELETE FROM {table} f USING " + _TOUCHED_PROMPTS + " t"
_FORGET += " WHERE f.job_id = t.job_id AND f.attempt = t.attempt AND f.prompt_id = t.prompt_id"
_ARMS = f"""
INSERT INTO figure_arms
SELECT {speedup.COMPARABLE_ID} AS comparable, chip, engine, method, depth, prompt_id, job_id, attempt,
       any_value(target_reference), count(*), list(decode_tokens_per_second)
FROM {_PROMPT_RUNS}
WHERE {_GENERATION} AND env_nominal IS DISTINCT FROM false AND decode_tokens_per_second > 0
GROUP BY comparable, chip, engine, method, depth, prompt_id, job_id, attempt
"""
_PAIRS = f"""
INSERT INTO figure_pairs
SELECT comparable, chip, machine_id, method, depth, prompt_id, job_id, attempt, list(log_ratio), count(*)
FROM ({speedup.pairs_sql(_PROMPT_RUNS, jobs=None)})
GROUP BY comparable, chip, machine_id, method, depth, prompt_id, job_id, attempt
"""
_STALLS = f"""
INSERT INTO figure_stalls
SELECT {speedup.COMPARABLE_ID} AS comparable, chip, method, depth, prompt_id, job_id, attempt,
       count(*) FILTER (WHERE decode_tokens_per_second > 0), count(*) FILTER (WHERE stall)
FROM {speedup.flagged_sql(_PROMPT_RUNS)} WHERE {_GENERATION}
GROUP BY comparable, chip, method, depth, prompt_id, job_id, attempt
"""
_BATCH_STEPS = (_GROUPS, _COLLECT)  # of the batch's sequence numbers
_PROMPT_STEPS = (*(_FORGET.format(table=t) for t in _PER_PROMPT), _ARMS, _PAIRS, _STALLS)
DEFINITION = hashlib.sha256("".join((SCHEMA, *_BATCH_STEPS, *_PROMPT_STEPS)).encode()).hexdigest()[:16]


def update(con: duckdb.DuckDBPyConnection, lo: int, hi: int) -> None:
    """Add the runs with sequence numbers lo..hi to every figure table (in the caller's
    transaction)."""
    for sql in _BATCH_STEPS:
        con.execute(sql, {"lo": lo, "hi": hi})
    for sql in _PROMPT_STEPS:
        con.execute(sql)
    con.execute("DROP TABLE figure_prompt_runs")
    con.execute("UPDATE figure_state SET last_seq = greatest(last_seq, ?)", [hi])


def catch_up(con: duckdb.DuckDBPyConnection) -> None:
    """update() with every run stored since the tables' last update, if any (in the caller's
    transaction)."""
    last, top = con.execute(
        "SELECT (SELECT last_seq FROM figure_state), (SELECT coalesce(max(seq), 0) FROM runs)"
    ).fetchone()
    if top > last:
        update(con, last + 1, top)


def _schema(con: duckdb.DuckDBPyConnection) -> str:
    columns = "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'runs'"
    types = dict(con.execute(columns).fetchall())
    return SCHEMA.format(keys=", ".join(f"{k} {types[k]}" for k in CHECKED_KEYS))


def ensure(con: duckdb.DuckDBPyConnection) -> bool:
    """Rebuild the tables from runs when they are missing, their definition changed or runs
    holds rows past the last one they saw; one transaction. Returns whether it rebuilt."""
    try:
        state = con.execute("SELECT definition, last_seq FROM figure_state").fetchall()
    except duckdb.CatalogException:
        state = []
    last = con.execute("SELECT coalesce(max(seq), 0) FROM runs").fetchone()[0]
    if state == [(DEFINITION, last)]:
        return False
    con.execute("BEGIN")
    try:
        for table in TABLES:
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(_schema(con))
        con.execute("INSERT INTO figure_state VALUES (?, 0)", [DEFINITION])
        update(con, 0, last)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return True


# specfleet/speedup.py's combination on the sums: per prompt (its repeats, over the valid
# attempts), per machine (its prompts), per arm (its machines). The names come from the group.
SPEEDUPS_SQL = f"""
WITH per_prompt AS (
    SELECT comparable, chip, machine_id, method, depth, list_median(flatten(list(log_ratios))) AS log_ratio,
           sum(pairs) AS pairs
    FROM figure_pairs p WHERE {speedup.counts_sql("p")}
    GROUP BY comparable, chip, machine_id, method, depth, prompt_id),
per_machine AS (
    SELECT comparable, chip, method, depth, avg(log_ratio) AS log_ratio, count(*) AS prompts, sum(pairs) AS pairs
    FROM per_prompt GROUP BY comparable, chip, machine_id, method, depth),
per_arm AS (
    SELECT comparable, chip, method, depth, exp(avg(log_ratio)) AS speedup, count(*) AS machines,
           min(prompts) AS prompts, sum(pairs) AS pairs
    FROM per_machine GROUP BY comparable, chip, method, depth)
SELECT a.comparable, g.engine, g.target_reference, g.draft_reference, g.prompt_set, a.chip, a.method, a.depth,
       a.speedup, a.machines, a.prompts, a.pairs
FROM per_arm a JOIN figure_groups g USING (comparable) ORDER BY a.comparable, a.chip, a.method, a.depth
"""


def speedups(con) -> pd.DataFrame:
    """speedup.speedups(con) (the same rows and columns; the models and prompt set as their
    group names them), from figure_pairs, figure_groups and jobs."""
    return con.execute(SPEEDUPS_SQL).df()


def groups(con) -> pd.DataFrame:
    """speedup.groups(con) (the same rows and columns), from figure_groups."""
    return con.execute("SELECT * FROM figure_groups ORDER BY runs DESC, comparable").df()


def arms(con) -> list[tuple]:
    """(comparable, chip, engine, target reference, method, depth, median decode tok/s) per arm:
    over its nominal-or-unknown generation runs with a positive speed, stalls included (the
    median shrugs a minority of them off)."""
    return con.execute(
        "SELECT comparable, chip, engine, any_value(target_reference), method, depth,"
        " list_median(flatten(list(tps))) FROM figure_arms GROUP BY comparable, chip, engine, method, depth"
        " ORDER BY ALL"
    ).fetchall()


# Stalls per arm, of the attempts that count: what /metrics shows beside the speedup.
STALLS_SQL = f"""
SELECT o.comparable, o.chip, g.engine, g.target_reference, o.method, o.depth, sum(o.stalls) AS stalls,
       sum(o.stalls) / nullif(sum(o.runs), 0) AS stall_rate
FROM figure_stalls o JOIN figure_groups g USING (comparable) WHERE {speedup.counts_sql("o")}
GROUP BY ALL ORDER BY ALL
"""


def stalls(con) -> list[tuple]:
    """(comparable, chip, engine, target reference, method, depth, stalls, stall rate) per arm,
    over the attempts that count (speedup.stall_counts_sql over those runs)."""
    return con.execute(STALLS_SQL).fetchall()

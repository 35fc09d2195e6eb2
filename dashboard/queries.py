"""The dashboard's queries, pure: DuckDB and pandas over a mirror of the coordinator, no Streamlit.

Every function takes `db` first: what it reads, anything with `query(sql, params) -> DataFrame`
and `cursor() -> DuckDBPyConnection` (a connection of its own, for the claims' temporary views
and downloads read in batches): a dashboard.mirror.Mirror, or a SweepView of one narrowed to a
sweep's runs (cli/report.py). dashboard/data.py wraps each in Streamlit's caches for the pages,
under the same name; `specfleet report` calls them on a mirror of its own.

Runs are read from the mirror's typed columns (specfleet/record.py RunRecord, one column per
field) and `LABELS`, computed once per run as it arrives: what every page names a run by (the
system it measured, dashboard/claims/claim.py system_label; its comparable group; its models as
reference@digest; its sampler; its environment state). Filtering and aggregation run in
DuckDB; SQL never carries user input as text: filters travel as bound parameters. Speedups are
specfleet/speedup.py's (through specfleet/stats.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import threading
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dashboard import claims as ledger
from dashboard.mirror import Mirror
from specfleet import settings as declared
from specfleet import speedup, stats, variance, versions
from specfleet.client import AdminApi, channel
from specfleet.record import CHECKED_KEYS, VERIFY_COST
from specfleet.sweeps import SweepError, parse_sweep


def model_label(prefix: str) -> str:
    """SQL: a model named by its reference and the first 12 hex digits of its digest
    ("target.gguf@571b2644b2e8"), never by a path; '' when the run has no such model.
    `prefix` is "target" or "draft", optionally qualified ("g.target")."""
    ref, digest = f"{prefix}_reference", f"{prefix}_digest"
    return f"CASE WHEN {ref} = '' THEN '' WHEN {digest} = '' THEN {ref} ELSE {ref} || '@' || left({digest}, 12) END"


# SQL: "greedy" or "T=0.7 top_p=0.9 top_k=20 seed=1", generated from the declaration's sampler rows
# (specfleet/settings.py sampler_label_sql, Sampler.label() in Python): every sampler key that is not
# its default, so that no two samplers share a label.
sampler_label = declared.sampler_label_sql


NOMINAL = "CASE env_nominal WHEN true THEN 'nominal' WHEN false THEN 'degraded' ELSE 'unknown' END"
# A run's flags at a glance: an output that differed from its reference (lossy: a defect, in no
# figure), one that diverged at a near-tie (kept in the figures), client and server timings more
# than 5% apart, a stateful drafter that inherited state from earlier requests, collapsed
# acceptance, a stall among its arm's repeats (specfleet.speedup.flagged_sql: counted, kept in the
# figures), a drafter that cannot draft within max_new_tokens. '' when none. On a relation with
# the `stall` column (_runs_source's: the mirror's stall_flag, RUN_FLAGS).
FLAGS = (
    "concat_ws(', ', CASE WHEN lossless IS NOT DISTINCT FROM false THEN 'lossy' END,"
    " CASE WHEN divergence = 'near-tie' THEN 'near-tie' END,"
    " CASE WHEN timings_disagree THEN 'timings disagree' END, CASE WHEN drafter_warm THEN 'warm drafter' END,"
    " CASE WHEN acceptance_collapsed THEN 'acceptance collapsed' END, CASE WHEN stall THEN 'stall' END,"
    " CASE WHEN drafter_warning != '' THEN 'cannot draft' END)"
)
# Each flag of FLAGS and the condition that sets it: what the Runs page counts, without
# building the flags' text for every run.
FLAG_CONDITIONS = {
    "lossy": "lossless IS NOT DISTINCT FROM false",
    "near-tie": "divergence = 'near-tie'",
    "timings disagree": "timings_disagree",
    "warm drafter": "drafter_warm",
    "acceptance collapsed": "acceptance_collapsed",
    "stall": "stall",
    "cannot draft": "drafter_warning != ''",
}
FLAG_NAMES = tuple(FLAG_CONDITIONS)
# What the pages name a run by, computed once per run as it arrives in the mirror (Mirror's
# `derived`): the system it measured (system_label "llama-server", "MTPLX (openai)", "specfleet
# mlx"; system_method with the method: "llama-server draft-mtp"), its comparable group, its
# models as reference@digest, its sampler, its environment state, its acceptance rate. Every
# query reads them as columns of the mirror's `runs`.
LABELS = (
    f"{speedup.COMPARABLE_ID} AS comparable, {ledger.system_label_sql()} AS system_label,"
    f" {ledger.system_label_sql()} || ' ' || method AS system_method, {model_label('target')} AS model,"
    f" {model_label('draft')} AS draft_model, {sampler_label()} AS sampler, {NOMINAL} AS nominal,"
    " tokens_accepted / nullif(tokens_drafted, 0) AS acceptance_rate, NULL::BOOLEAN AS stall_flag"
)
DOWNLOAD_BATCH = 50_000
# Filter field -> the column of runs (LABELS) it selects on.
FILTER_COLUMNS = {
    "model": "model",
    "system": "system_label",
    "engine": "engine",
    "method": "method",
    "sampler": "sampler",
    "prompt_set": "prompt_set",
}
FILTER_FIELDS = tuple(FILTER_COLUMNS)


@dataclass(frozen=True)
class Filters:
    """Selected values per field (system: system_label values); an empty tuple selects
    everything. `comparable`: one comparable group's id (specfleet.speedup.COMPARABLE_ID), or
    '' for every group."""

    model: tuple[str, ...] = ()
    system: tuple[str, ...] = ()
    engine: tuple[str, ...] = ()
    method: tuple[str, ...] = ()
    sampler: tuple[str, ...] = ()
    prompt_set: tuple[str, ...] = ()
    comparable: str = ""


def selected(f: Filters, generation: bool = True, table: str = "runs") -> tuple[str, dict]:
    """A parenthesised relation of the runs `f` selects, and its named parameters. A method
    filter keeps the baselines (every speedup needs them); `generation` leaves out verify-cost
    runs, which are never speedups. `table`: runs, or a table of counts with the columns the
    filters read (group_cells)."""
    where, params = [], {}
    for name in ("model", "system", "engine", "sampler", "prompt_set"):
        if getattr(f, name):
            where.append(f"list_contains(${name}::VARCHAR[], {FILTER_COLUMNS[name]})")
            params[name] = list(getattr(f, name))
    if f.method:
        where.append("(list_contains($method::VARCHAR[], method) OR method = 'baseline')")
        params["method"] = list(f.method)
    if f.comparable:
        where.append("comparable = $comparable")
        params["comparable"] = f.comparable
    if generation:
        where.append(f"method != '{VERIFY_COST}'")
    return f"(SELECT * FROM {table} WHERE {' AND '.join(where) or 'true'})", params


# Per job, engine, system and target model: the last run stored. What a claim's results are
# keyed on (_claim_key): they are recomputed only when runs they could select, or their jobs,
# changed.
RUN_SYSTEMS = [
    "CREATE TABLE IF NOT EXISTS run_systems (job_id VARCHAR, engine VARCHAR, system VARCHAR,"
    " target_reference VARCHAR, last_seq BIGINT, PRIMARY KEY (job_id, engine, system, target_reference))",
    "INSERT INTO run_systems SELECT job_id, engine, system, target_reference, max(seq) FROM _batch GROUP BY ALL"
    " ON CONFLICT DO UPDATE SET last_seq = greatest(last_seq, excluded.last_seq)",
]


# Each run's stall flag (specfleet.speedup.flagged_sql), stored in the mirror's stall_flag as
# its runs arrive: judged again, on every page of new runs, for every run of the jobs the page
# holds runs of (a flag's partition never spans two jobs), so that no page computes the window
# over a million runs (the Runs page took 9.9 s cold at 1M, most of it in that window).
RUN_FLAGS = [
    "UPDATE runs SET stall_flag = f.stall FROM (SELECT seq, stall FROM"
    f" {speedup.flagged_sql('(SELECT * FROM runs WHERE job_id IN (SELECT job_id FROM _batch))')}) f"
    " WHERE runs.seq = f.seq"
]


# What the claims' conditions read of a run (dashboard/claims/selection.py conditions), and per value of
# them the generation runs: counted as runs arrive, so that every claim's selection of every run
# so far reads a few thousand rows, not a million (queries.selections_of; a condition on another
# column reads the runs instead).
SELECTION_COLUMNS = (
    "engine", "system", "method", "depth", "chip", "target_reference", "target_digest", "target_quantisation",
    "target_architecture", "prompt_category", "prompt_set", "context_tokens", "engine_version", "server_version",
    *(f"sampler_{s.key}" for s in declared.SAMPLER), *sorted(ledger.DECLARED_CONDITIONS),
)  # fmt: skip
_CELLS = ", ".join(SELECTION_COLUMNS)
SELECTION_CELLS = [
    f"CREATE TABLE IF NOT EXISTS selection_cells AS SELECT {_CELLS}, 0::BIGINT AS n FROM _batch LIMIT 0",
    f"CREATE OR REPLACE TABLE selection_cells AS SELECT {_CELLS}, sum(n)::BIGINT AS n FROM (SELECT * FROM"
    f" selection_cells UNION ALL BY NAME SELECT {_CELLS}, count(*) AS n FROM _batch WHERE method != '{VERIFY_COST}'"
    " GROUP BY ALL) GROUP BY ALL",
]


# A setting's id and a version's label: specfleet/versions.py's SQL (from the declaration's checked
# keys), the same text the coordinator's /metrics names them by.
SETTING_ID, VERSION_LABEL = versions.SETTING_SQL, versions.VERSION_SQL
# Per comparable group (its checked keys, so its setting and version too), what names it and
# what the filters select on, chip and machine: the generation runs, counted as runs arrive (the
# page's, with the labels the mirror derives from them: LABELS), so that the group selector, the
# filters and the Versions page's choice of settings read a few thousand rows, not a million
# (groups(), filter_options(), version_per_prompt()).
GROUP_COLUMNS = ("comparable", *CHECKED_KEYS, "target_reference", "draft_reference", "prompt_set", "model")
GROUP_COLUMNS += ("draft_model", "system_label", "method", "sampler", "chip", "machine_id")
_COUNTED = ", ".join(GROUP_COLUMNS) + f", {SETTING_ID} AS setting, {VERSION_LABEL} AS version"
GROUP_COLUMNS += ("setting", "version")
GROUP_CELLS = [
    f"CREATE TABLE IF NOT EXISTS group_cells AS SELECT {_COUNTED}, 0::BIGINT AS n, 0::BIGINT AS first_seq"
    " FROM runs LIMIT 0",
    f"CREATE OR REPLACE TABLE group_cells AS SELECT {', '.join(GROUP_COLUMNS)}, sum(n)::BIGINT AS n,"
    f" min(first_seq) AS first_seq FROM (SELECT * FROM group_cells UNION ALL BY NAME SELECT {_COUNTED},"
    f" count(*) AS n, min(seq) AS first_seq FROM (SELECT *, {LABELS} FROM _batch) WHERE method != '{VERIFY_COST}'"
    " GROUP BY ALL) GROUP BY ALL",
]


def open_mirror(address: str, token: str, path=None) -> Mirror:
    """A mirror of the coordinator at `address` with the labels the queries read (LABELS), the
    claims' keys (RUN_SYSTEMS) and the runs' stall flags (RUN_FLAGS); not synced yet. The
    dashboard keeps one per process; a report opens its own."""
    summaries = {"runs": [*RUN_SYSTEMS, *RUN_FLAGS, *SELECTION_CELLS, *GROUP_CELLS]}
    return Mirror(AdminApi(channel(address), token), derived={"runs": LABELS}, summaries=summaries, path=path)


class SweepView:
    """A mirror narrowed to one sweep's runs, for the queries: every connection it hands out
    (query's, cursor()) has a temporary view `runs` of that sweep's runs in front of the
    mirror's table, so every query, the claims' included, reads the sweep alone while the
    mirror keeps every run (nothing is deleted from it). Agents, sweeps and jobs stay whole.
    The sweep id travels as a bound parameter, never as SQL text."""

    def __init__(self, mirror: Mirror, sweep_id: str):
        self.mirror, self.sweep_id = mirror, sweep_id
        self._lock = threading.Lock()
        self._con = self.cursor()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        con = self.mirror.cursor()
        catalog = con.execute("SELECT current_database()").fetchone()[0].replace('"', '""')
        con.execute("CREATE TEMP TABLE _sweep AS SELECT ?::VARCHAR AS sweep_id", [self.sweep_id])
        con.execute(
            f'CREATE TEMP VIEW runs AS SELECT * FROM "{catalog}".main.runs'
            " WHERE sweep_id = (SELECT sweep_id FROM _sweep)"
        )
        return con

    def query(self, sql: str, params: list | dict | None = None) -> pd.DataFrame:
        """A pandas DataFrame; an empty one when the table has not arrived yet (Mirror.query)."""
        with self._lock:
            try:
                return self._con.execute(sql, params or []).df()
            except duckdb.CatalogException:
                return pd.DataFrame()

    def close(self) -> None:
        with self._lock:
            self._con.close()


# ---------------------------------------------------------------- fleet and sweeps


def agents(db) -> pd.DataFrame:
    return db.query(
        "SELECT name, chip, try_cast(fingerprint->>'gpuCores' AS INTEGER) AS gpu_cores,"
        " round(memory_bytes / 2^30, 1) AS memory_gib, fingerprint->>'osVersion' AS os_version,"
        " fingerprint->>'modelIdentifier' AS model_identifier,"
        " round(try_cast(fingerprint->>'memoryBandwidthBytesPerSecond' AS DOUBLE) / 1e9, 1) AS bandwidth_gb_per_s,"
        " state, status, current_job_id, to_timestamp(last_seen) AS last_seen, agent_id"
        " FROM agents ORDER BY name",
    )


def chips(db) -> list[str]:
    """Every chip the fleet has seen, sorted: the domain of the one chip->colour mapping."""
    seen = set(db.query("SELECT DISTINCT chip FROM agents").get("chip", []))
    seen |= set(db.query("SELECT DISTINCT chip FROM runs").get("chip", []))
    return sorted(seen)


def sweeps(db) -> pd.DataFrame:
    """Progress per sweep: jobs (one per cell and machine) by state, runs, failures with reasons.
    A job an agent refused (coordinator/states.py: refused, with its reason) is finished, as is
    one held (its runs held by its agent for a coordinator upgrade)."""
    out = db.query(
        "SELECT s.sweep_id, s.name, s.state, to_timestamp(s.created_at) AS created_at,"
        " count(j.job_id) AS jobs,"
        " count(j.job_id) FILTER (WHERE j.state = 'queued') AS queued,"
        " count(j.job_id) FILTER (WHERE j.state = 'leased') AS in_flight,"
        " count(j.job_id) FILTER (WHERE j.state = 'done') AS done,"
        " count(j.job_id) FILTER (WHERE j.state = 'failed') AS failed,"
        " count(j.job_id) FILTER (WHERE j.state = 'refused') AS refused,"
        " count(j.job_id) FILTER (WHERE j.state = 'cancelled') AS cancelled,"
        " count(j.job_id) FILTER (WHERE j.state = 'held') AS held,"
        " s.uncovered"  # cells no agent could run (coordinator/coverage.py)
        " FROM sweeps s LEFT JOIN jobs j USING (sweep_id) GROUP BY ALL ORDER BY created_at DESC",
    )
    if out.empty:
        return out
    runs = db.query("SELECT sweep_id, count(*) AS runs FROM runs GROUP BY ALL")
    out = out.merge(runs, on="sweep_id", how="left") if not runs.empty else out.assign(runs=0)
    out["runs"] = out["runs"].fillna(0).astype(int)
    finished = out["done"] + out["failed"] + out["refused"] + out["cancelled"] + out["held"]
    out["progress"] = (finished / out["jobs"].where(out["jobs"] > 0)).fillna(0)
    return out


def failures(db) -> pd.DataFrame:
    """Jobs that failed or that their agent refused, with the state and the reason."""
    return db.query(
        "SELECT j.sweep_id, j.job_id, a.name AS agent, j.state, j.attempt, j.reason,"
        " to_timestamp(j.updated_at) AS failed_at FROM jobs j LEFT JOIN agents a USING (agent_id)"
        " WHERE j.state IN ('failed', 'refused') ORDER BY j.updated_at DESC",
    )


# ---------------------------------------------------------------- runs


def run_count(db) -> int:
    """Generation runs mirrored (verify-cost steps apart)."""
    df = db.query(f"SELECT count(*) AS n FROM runs WHERE method != '{VERIFY_COST}'")
    return int(df["n"][0]) if not df.empty else 0


def filter_options(db) -> dict[str, list[str]]:
    """Per filter field, the values of the generation runs (read from the mirror's group_cells,
    which holds each of them, where it has them: GROUP_CELLS)."""
    table = "group_cells" if _has_table(db, "group_cells") else "runs"
    out = {}
    for field, column in FILTER_COLUMNS.items():
        df = db.query(
            f"SELECT DISTINCT {column} AS value FROM {table}"
            f" WHERE method != '{VERIFY_COST}' AND {column} != '' ORDER BY 1",
        )
        out[field] = df["value"].tolist() if not df.empty else []
    return out


RUNS_SHOWN = 1000  # the Runs page's table: the latest runs of the selection; downloads hold all


def _runs_source(f: Filters, chips: tuple[str, ...], states: tuple[str, ...]) -> tuple[str, dict]:
    """selected(f) with verify-cost runs, narrowed to the chips and environment states given, and
    each run's `stall` flag, judged among all its arm's repeats before narrowing (stored as the
    runs arrived: RUN_FLAGS)."""
    source, params = selected(f, generation=False)
    where = []
    if chips:
        where.append("list_contains($chips::VARCHAR[], chip)")
        params["chips"] = list(chips)
    if states:
        where.append("list_contains($states::VARCHAR[], nominal)")
        params["states"] = list(states)
    narrowed = f"(SELECT * FROM {source} WHERE {' AND '.join(where) or 'true'})"
    return f"(SELECT * EXCLUDE (stall_flag), stall_flag AS stall FROM {narrowed})", params


def _runs_sql(source: str) -> str:
    names = "nominal, system_method, model, draft_model, sampler, comparable, prompt_id, text_sample, divergence"
    speeds = "decode_tokens_per_second, server_decode_tokens_per_second, server_version, server_command"
    return (
        f"SELECT {names}, {FLAGS} AS flags, {speedup.counts_sql('s')} AS counts,"
        f" to_timestamp(started_at_unix_seconds) AS started_at, {speeds},"
        f" * EXCLUDE ({names}, {speeds}) REPLACE (to_timestamp(ingested_at) AS ingested_at)"
        f" FROM {source} s"
    )


def runs_table(
    db, f: Filters, chips: tuple[str, ...] = (), states: tuple[str, ...] = (), limit: int = RUNS_SHOWN
) -> pd.DataFrame:
    """The latest `limit` runs the filters, chips and environment states select (verify-cost
    runs too), in the order they were stored: every typed column, the names it goes by first
    (the system and method it measured, its flags), then its decode tok/s beside the server's
    own and the server's version and command, times as timestamps. `counts` says whether the
    run may enter a figure: runs of a lost attempt or a failed job are shown, never counted.
    Which runs is a top-N over one column, then those runs whole: one query of both carried every
    column of every run of the selection into `counts`' join (out of memory at a million runs)."""
    source, params = _runs_source(f, chips, states)
    latest = db.query(f"SELECT seq FROM {source} ORDER BY seq DESC LIMIT $limit", {**params, "limit": limit})
    seqs = latest["seq"].tolist() if not latest.empty else []
    shown = f"(SELECT * FROM {source} WHERE list_contains($seqs, seq))"
    return db.query(f"{_runs_sql(shown)} ORDER BY seq", {**params, "seqs": seqs})


def runs_summary(db, f: Filters, chips: tuple[str, ...] = (), states: tuple[str, ...] = ()) -> dict:
    """What the Runs page says of the whole selection: runs, machines, chips (and every chip of
    the filters, for the chip selector), runs per environment state, runs per flag."""
    source, params = _runs_source(f, chips, states)
    flags = ", ".join(f'count(*) FILTER (WHERE {sql}) AS "{flag}"' for flag, sql in FLAG_CONDITIONS.items())
    row = db.query(
        f"SELECT count(*) AS runs, count(DISTINCT machine_id) AS machines, count(DISTINCT chip) AS chips, {flags},"
        " count(*) FILTER (WHERE nominal = 'nominal') AS nominal, count(*) FILTER (WHERE nominal = 'unknown')"
        f" AS unknown, count(*) FILTER (WHERE nominal = 'degraded') AS degraded FROM {source}",
        params,
    )
    out = {k: int(x) for k, x in row.iloc[0].items()} if not row.empty else {}
    every, every_params = selected(f, generation=False)
    listed = db.query(f"SELECT DISTINCT chip FROM {every} ORDER BY 1", every_params)
    out["chip_options"] = listed["chip"].tolist() if not listed.empty else []
    return out


def runs_download(db, f: Filters, chips: tuple[str, ...], states: tuple[str, ...], fmt: str) -> bytes:
    """Every run of the selection (not only those shown) as CSV or Parquet, the Runs table's
    columns, read in batches so a million runs never sit in memory as rows. List columns
    (acceptance by position, verify cost, environment reasons) are lists in Parquet and
    "[a, b]" in CSV."""
    source, params = _runs_source(f, chips, states)
    out = io.BytesIO()
    with contextlib.closing(db.cursor()) as con:
        reader = con.sql(f"{_runs_sql(source)} ORDER BY seq", params=params).to_arrow_reader(DOWNLOAD_BATCH)
        if fmt == "parquet":
            with pq.ParquetWriter(out, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
            return out.getvalue()
        header = True
        for batch in reader:
            frame = batch.to_pandas()
            for col in frame.columns:
                if frame[col].dtype == object and frame[col].map(lambda x: isinstance(x, np.ndarray)).any():
                    frame[col] = frame[col].map(lambda x: x.tolist() if isinstance(x, np.ndarray) else x)
            frame.to_csv(out, index=False, header=header)
            header = False
    return out.getvalue()


def nominal_counts(db, f: Filters) -> dict[str, int]:
    source, params = selected(f)
    df = db.query(f"SELECT nominal, count(*) AS n FROM {source} GROUP BY ALL", params)
    return dict(zip(df["nominal"], df["n"].astype(int))) if not df.empty else {}


def collapsed_acceptance(db, f: Filters) -> pd.DataFrame:
    """Runs the agent flagged for collapsed acceptance (acceptance_collapsed, with its reason),
    per chip, engine, method and model. They stay in every figure: the collapse is the
    finding, and usually a broken model conversion."""
    source, params = selected(f)
    df = db.query(
        "SELECT chip, engine, method, model, count(*) AS runs, arg_min(acceptance_reason, seq) AS reason"
        f" FROM {source} WHERE acceptance_collapsed GROUP BY ALL ORDER BY chip, engine, method",
        params,
    )
    return df if not df.empty else pd.DataFrame(columns=["chip", "engine", "method", "model", "runs", "reason"])


def lossy_runs(db, f: Filters) -> pd.DataFrame:
    """Runs whose output differed from their reference (lossless false: the greedy baseline's,
    or on llama.cpp the same-seed baseline's), per chip, system, method and depth: an engine
    defect, never a figure (specfleet/speedup.py leaves them out of every speedup)."""
    source, params = selected(f)
    df = db.query(
        "SELECT chip, system_label, engine, method, depth, any_value(lossless_check) AS checked_against,"
        " count(*) AS runs FROM " + source + " WHERE lossless IS NOT DISTINCT FROM false"
        " GROUP BY chip, system_label, engine, method, depth ORDER BY ALL",
        params,
    )
    columns = ["chip", "system_label", "engine", "method", "depth", "checked_against", "runs"]
    return df if not df.empty else pd.DataFrame(columns=columns)


def _flagged(db, f: Filters, flag: str) -> pd.DataFrame:
    """Runs with `flag` (a boolean column of the record, never user input) true, per chip,
    system, method and depth, with the medians of the client's and the server's decode tok/s."""
    source, params = selected(f)
    df = db.query(
        "SELECT chip, system_method, method, depth, count(*) AS runs, count(DISTINCT machine_id) AS machines,"
        " median(decode_tokens_per_second) AS client_tokens_per_second,"
        " median(server_decode_tokens_per_second) AS server_tokens_per_second"
        f" FROM {source} WHERE {flag} GROUP BY ALL ORDER BY ALL",
        params,
    )
    columns = ["chip", "system_method", "method", "depth", "runs", "machines"]
    columns += ["client_tokens_per_second", "server_tokens_per_second"]
    return df if not df.empty else pd.DataFrame(columns=columns)


def timings_disagree(db, f: Filters) -> pd.DataFrame:
    """Server runs whose decode tok/s as the client timed it and as the server reported it
    differ by more than 5% (timings_disagree), per chip, system, method and depth. They stay in
    the figures, which are the client's; the page says so."""
    return _flagged(db, f, "timings_disagree")


def warm_drafters(db, f: Filters) -> pd.DataFrame:
    """Runs whose stateful drafter (ngram-mod's table, ngram-cache) inherited state from
    earlier requests (drafter_warm true), per chip, system, method and depth: a fresh server's
    acceptance and speed may be lower. They stay in the figures; the page says so."""
    return _flagged(db, f, "drafter_warm")


def server_figures(db, f: Filters) -> pd.DataFrame:
    """Server runs (llama-server, OpenAI-compatible servers) per chip, system, arm and server
    build: the server's version and command line, the median decode tok/s as the client timed
    it beside the server's own, and the runs whose timings disagree or whose drafter was warm,
    with the machines, prompts and runs behind them."""
    source, params = selected(f)
    return db.query(
        "SELECT chip, system_method, depth, server_version, any_value(server_command) AS server_command,"
        " count(DISTINCT server_command) AS commands,"
        " median(decode_tokens_per_second) AS client_tokens_per_second,"
        " median(server_decode_tokens_per_second) AS server_tokens_per_second,"
        " count(*) FILTER (WHERE timings_disagree) AS timings_disagree_runs,"
        " count(*) FILTER (WHERE drafter_warm) AS warm_drafter_runs,"
        " count(DISTINCT machine_id) AS machines, count(DISTINCT prompt_id) AS prompts, count(*) AS runs"
        f" FROM {source} WHERE system != '{ledger.OURS}' AND nominal != 'degraded'"
        " GROUP BY chip, system_method, depth, server_version ORDER BY ALL",
        params,
    )


# ---------------------------------------------------------------- comparable groups


# The checked keys the group label names in its own words; the others follow the declaration.
LABELLED_KEYS = frozenset({"engine", "engine_version", "system", "target_digest", "draft_digest", "prompt_set_digest",
                           "context_tokens", *(s.name for s in declared.SAMPLER)})  # fmt: skip


def group_label(g) -> str:
    """How the selector names a comparable group: the system it measured (system_label),
    models, prompt set, context, sampler, then every other checked setting set to other than its
    default (specfleet/settings.py describe: power mode, threads, ...)."""
    draft = "no draft" if declared.is_missing(g.draft_model) or not g.draft_model else f"draft {g.draft_model}"
    values = g._asdict() if hasattr(g, "_asdict") else dict(g)
    rest = declared.describe(values, LABELLED_KEYS)
    return (
        f"{g.system_label} · {g.model} · {draft} · {g.prompt_set} · context {g.context_tokens} · {g.sampler}"
        + (f" · {rest}" if rest else "")
        + f" · group {g.comparable}"
    )


def groups(db, f: Filters) -> pd.DataFrame:
    """The comparable groups (specfleet.speedup.groups) of the runs `f` selects, whichever
    group `f` names, most runs first; with the names the selector shows and the chips."""
    if _has_table(db, "group_cells"):  # counted as the runs arrived (GROUP_CELLS)
        source, params = selected(dataclasses.replace(f, comparable=""), table="group_cells")
        keys = ", ".join(CHECKED_KEYS)
        named = ", ".join(f"arg_min({c}, first_seq) AS {c}" for c in ("target_reference", "draft_reference"))
        named += ", arg_min(prompt_set, first_seq) AS prompt_set"
        grouped = (
            f"SELECT comparable, {keys}, {named}, sum(n)::BIGINT AS runs FROM {source}"
            f" GROUP BY comparable, {keys} ORDER BY runs DESC, comparable"
        )
    else:
        source, params = selected(dataclasses.replace(f, comparable=""))
        grouped = speedup.groups_sql(source, comparable="comparable")  # the mirror's column: no md5 of every run
    df = db.query(
        f"SELECT g.comparable, {ledger.system_label_sql('g.')} AS system_label, g.engine,"
        f" {model_label('g.target')} AS model, {model_label('g.draft')} AS draft_model,"
        f" g.prompt_set, g.context_tokens, {sampler_label('g.')} AS sampler, g.runs, m.machines, m.chips,"
        " g.* EXCLUDE (comparable, engine, prompt_set, context_tokens, runs)"
        f" FROM ({grouped}) g JOIN (SELECT comparable, count(DISTINCT machine_id) AS machines,"
        f" string_agg(DISTINCT chip, ', ' ORDER BY chip) AS chips FROM {source} GROUP BY ALL) m USING (comparable)"
        " ORDER BY g.runs DESC, g.comparable",
        params,
    )
    if not df.empty:
        df.insert(1, "label", [group_label(g) for g in df.itertuples()])
    return df


def _has_table(db, name: str) -> bool:
    """Whether `db` is a whole mirror (not a SweepView of one sweep) holding table `name`."""
    if not isinstance(db, Mirror):
        return False
    return not db.query("SELECT 1 FROM duckdb_tables() WHERE table_name = $name", {"name": name}).empty


def _group_keys(db, comparable: str) -> tuple[str, dict]:
    """SQL condition: a verify-cost run of the group's target model, engine and engine version
    (its context depth and sampler are its own); true without a group."""
    if not comparable:
        return "true", {}
    return (
        "EXISTS (SELECT 1 FROM runs g WHERE g.comparable = $comparable AND g.target_digest = r.target_digest"
        " AND g.engine = r.engine AND g.engine_version = r.engine_version)"
    ), {"comparable": comparable}


# ---------------------------------------------------------------- comparisons


def speedups(db, f: Filters, named: pd.DataFrame | None = None) -> pd.DataFrame:
    """specfleet.speedup's speedup per comparable group, chip and arm, with its 95% interval,
    machines, prompts, pairs and the pairs left out for a run that was not nominal; stalled runs
    (specfleet.speedup.flagged_sql) are kept and counted in `stalled_runs` and `stall_rate`, runs
    that diverged at a near-tie kept and counted in `near_tie_runs`. `named`:
    groups(db, f) when the caller has it already."""
    source, params = selected(f)
    out = stats.speedups(db.query, source, params)
    if out.empty:
        return out
    keys = ["comparable", "chip", "method", "depth"]
    counts = db.query(speedup.stall_counts_sql(source, comparable="comparable"), params)
    counts = counts.drop(columns="judged_runs")
    if counts.empty:
        out = out.assign(stalled_runs=0, stall_rate=0.0, near_tie_runs=0)
    else:
        out = out.merge(counts, on=keys, how="left")
    for name in ("stalled_runs", "near_tie_runs"):
        out[name] = out[name].fillna(0).astype(int)
    out["stall_rate"] = out["stall_rate"].fillna(0.0).astype(float)
    named = groups(db, f) if named is None else named
    names = named[["comparable", "system_label", "model", "draft_model"]]  # reference@digest, never a path
    out = out.merge(names, on="comparable", how="left").drop(columns=["target_reference", "draft_reference"])
    first = ["comparable", "system_label", "engine", "model", "draft_model"]
    return out[first + [c for c in out.columns if c not in first]]


def decode_speed(db, f: Filters) -> pd.DataFrame:
    """Median decode tok/s per chip, engine and arm, with its interval, machines, prompts, runs;
    stalls (specfleet.speedup.flagged_sql) included."""
    source, params = selected(f)
    values = db.query(
        "SELECT chip, engine, method || CASE WHEN depth > 0 THEN ' K=' || depth ELSE '' END AS arm, machine_id,"
        f" prompt_id, decode_tokens_per_second, nominal = 'degraded' AS degraded FROM {source}",
        params,
    )
    return stats.summarise(values, by=("chip", "engine", "arm"), column="decode_tokens_per_second")


ENERGY_PARTS = ("cpu", "gpu", "ane", "dram")  # IOReport's split (specfleet/record.py energy_*_joules)


def energy(db, f: Filters) -> pd.DataFrame:
    """Median tokens per joule (1 / joules_per_token) per chip, engine and arm, with its
    interval, machines, prompts and runs, beside the median decode tok/s of the same runs and
    the counters they read (energy_source: nvml, rapl, ioreport), and on Macs the median share of
    the energy that IOReport put on the CPU, GPU, Neural Engine and DRAM (empty elsewhere). Only
    runs that recorded their energy: a machine with no readable counter records none, never an
    estimate; stalls included."""
    source, params = selected(f)
    shares = "".join(f" energy_{p}_joules / energy_joules AS {p}_share," for p in ENERGY_PARTS)
    values = db.query(
        "SELECT chip, engine, method || CASE WHEN depth > 0 THEN ' K=' || depth ELSE '' END AS arm, machine_id,"
        f" prompt_id, 1 / joules_per_token AS tokens_per_joule, decode_tokens_per_second, energy_source,{shares}"
        f" nominal = 'degraded' AS degraded FROM {source} WHERE joules_per_token > 0",
        params,
    )
    if values.empty:
        return values
    out = stats.summarise(values, by=("chip", "engine", "arm"), column="tokens_per_joule")
    kept = values[~values["degraded"]]
    beside = kept.groupby(["chip", "engine", "arm"], as_index=False).agg(
        decode_tokens_per_second=("decode_tokens_per_second", "median"),
        energy_source=("energy_source", lambda s: ", ".join(sorted(set(s)))),
        **{f"{p}_share": (f"{p}_share", "median") for p in ENERGY_PARTS},
    )
    out = out.rename(columns={"median": "tokens_per_joule"}).merge(beside, on=["chip", "engine", "arm"], how="left")
    first = ["chip", "engine", "arm", "tokens_per_joule", "ci_low", "ci_high", "decode_tokens_per_second"]
    return out[first + [c for c in out.columns if c not in first]]


def acceptance_by_position(db, f: Filters) -> pd.DataFrame:
    """Median share accepted at each draft position (acceptance_by_position), per chip and arm;
    positions nothing was proposed at are left out."""
    source, params = selected(f)
    return db.query(
        "SELECT chip, engine, method, depth, position, median(share) AS acceptance,"
        " count(DISTINCT machine_id) AS machines, count(DISTINCT prompt_id) AS prompts, count(*) AS runs"
        " FROM (SELECT chip, engine, method, depth, machine_id, prompt_id, drafted_by_position AS drafted,"
        " unnest(acceptance_by_position) AS share, generate_subscripts(acceptance_by_position, 1) AS position"
        f" FROM {source} WHERE method != 'baseline' AND nominal != 'degraded')"
        " WHERE len(drafted) = 0 OR drafted[position] > 0"
        " GROUP BY ALL ORDER BY chip, engine, method, depth, position",
        params,
    )


def draft_verify(db, f: Filters) -> pd.DataFrame:
    """Median draft and verify milliseconds per generated token, per chip and arm. Reference
    arms (the libraries' own loops) report no rounds: nothing to split."""
    source, params = selected(f)
    agg = db.query(
        "SELECT chip, engine || ' · ' || method || ' K=' || depth AS arm,"
        " median(draft_seconds / generated_tokens * 1e3) AS draft, median(verify_seconds / generated_tokens * 1e3)"
        " AS verify, count(DISTINCT machine_id) AS machines, count(DISTINCT prompt_id) AS prompts, count(*) AS runs"
        f" FROM {source} WHERE method != 'baseline' AND nominal != 'degraded' AND generated_tokens > 0"
        " AND draft_seconds + verify_seconds > 0 GROUP BY ALL ORDER BY ALL",
        params,
    )
    if agg.empty:
        return agg
    return agg.melt(
        id_vars=["chip", "arm", "machines", "prompts", "runs"],
        value_vars=["draft", "verify"],
        var_name="phase",
        value_name="ms",
    )


def verify_cost(db, f: Filters) -> pd.DataFrame:
    """T(M)/T(1) per chip, engine and context depth (verify_cost_seconds, context_tokens):
    the median over machines of each machine's latest curve. With a group chosen, the curves
    of its target model, engine and engine version."""
    where, params = [f"r.method = '{VERIFY_COST}'", "r.nominal != 'degraded'"], {}
    for name in ("model", "engine"):
        if getattr(f, name):
            where.append(f"list_contains(${name}::VARCHAR[], r.{name})")
            params[name] = list(getattr(f, name))
    group, group_params = _group_keys(db, f.comparable)
    where.append(group)
    params |= group_params
    return db.query(
        "WITH curves AS (SELECT chip, engine, machine_id, context_tokens, arg_max(verify_cost_seconds, seq) AS t"
        f" FROM runs r WHERE {' AND '.join(where)} GROUP BY ALL),"
        " points AS (SELECT chip, engine, machine_id, context_tokens, t, unnest(range(1, len(t) + 1)) AS m FROM curves)"
        " SELECT chip, engine, context_tokens, m AS rows, median(t[m] / t[1]) AS ratio,"
        " count(DISTINCT machine_id) AS machines FROM points WHERE t[1] > 0 GROUP BY ALL ORDER BY ALL",
        params,
    )


def roofline(db, f: Filters) -> pd.DataFrame:
    """Share of the memory-bandwidth roofline of baseline decoding: decode tok/s x bytes read per
    token (the target's size, target_bytes) / the chip's bandwidth. `share` is NaN and `why`
    says what is missing when the runs record no model size or the machine no bandwidth."""
    source, params = selected(f)
    df = db.query(
        "SELECT r.chip, r.engine, r.model, median(r.decode_tokens_per_second) AS decode_tokens_per_second,"
        " median(nullif(r.target_bytes, 0)) AS bytes_per_token, median(a.bandwidth) / 1e9 AS bandwidth_gb_per_s,"
        " count(DISTINCT r.machine_id) AS machines, count(DISTINCT r.prompt_id) AS prompts, count(*) AS runs"
        f" FROM {source} r LEFT JOIN (SELECT agent_id, nullif(try_cast(fingerprint->>'memoryBandwidthBytesPerSecond'"
        " AS DOUBLE), 0) AS bandwidth FROM agents) a USING (agent_id)"
        " WHERE r.method = 'baseline' AND r.nominal != 'degraded' GROUP BY ALL ORDER BY ALL",
        params,
    )
    if df.empty:
        return df
    df["why"] = np.where(
        df["bytes_per_token"].isna(),
        "model size not recorded (target_bytes)",
        np.where(df["bandwidth_gb_per_s"].isna(), "memory bandwidth unknown for this machine", ""),
    )
    share = df["decode_tokens_per_second"] * df["bytes_per_token"] / (df["bandwidth_gb_per_s"] * 1e9)
    df.insert(5, "share", share.where(df["why"] == "").astype(float))
    return df


# ---------------------------------------------------------------- versions

SETTING_COLUMNS = ["setting", "system_label", "engine", "model", "draft_model", "prompt_set", "context_tokens"]
SETTING_COLUMNS += ["sampler", "versions"]


def version_per_prompt(db, f: Filters, several: bool = False) -> pd.DataFrame:
    """specfleet/versions.py's input: per setting, version, chip, arm, machine and prompt, the
    mean log decode tok/s over the prompt's repeats, the acceptance (versions.ACCEPTANCE_SQL), the
    repeats and the first ingest sequence; with what names the setting. Only runs that may
    enter a figure (specfleet.speedup: the job's current attempt, nominal or unknown, never
    lossy, a speed above 0); `f.comparable` is ignored (a group holds one version). With
    `several`, only the runs of settings that the runs `f` selects hold under two or more
    versions, all that version_settings and version_changes read: found in the mirror's
    group_cells (GROUP_CELLS) where it has them, and the runs narrowed to their groups."""
    f = dataclasses.replace(f, comparable="")
    source, params = selected(f)
    if several and _has_table(db, "group_cells"):
        cells, _ = selected(f, table="group_cells")
        groups = db.query(
            f"SELECT DISTINCT comparable FROM {cells} WHERE setting IN (SELECT setting FROM {cells}"
            " GROUP BY setting HAVING count(DISTINCT version) >= 2)",
            params,
        )
        params = {**params, "several": groups["comparable"].tolist() if not groups.empty else []}
        source = f"(SELECT * FROM {source} WHERE list_contains($several::VARCHAR[], comparable))"
    return db.query(
        f"SELECT {SETTING_ID} AS setting, {VERSION_LABEL} AS version, chip, method, depth, machine_id, prompt_id,"
        f" avg(ln(decode_tokens_per_second)) AS log_tps, {versions.ACCEPTANCE_SQL},"
        " count(*) AS repeats, min(seq) AS first_seq, any_value(system_label) AS system_label,"
        " any_value(engine) AS engine, any_value(model) AS model, any_value(draft_model) AS draft_model,"
        " any_value(prompt_set) AS prompt_set, any_value(context_tokens) AS context_tokens,"
        f" any_value(sampler) AS sampler FROM {speedup.valid_sql(source)} WHERE decode_tokens_per_second > 0"
        " AND env_nominal IS DISTINCT FROM false AND lossless IS DISTINCT FROM false"
        " GROUP BY setting, version, chip, method, depth, machine_id, prompt_id",
        params,
    )


def version_settings(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """One row per setting measured under two or more versions: what names it, and its
    versions in the order they were first measured."""
    if per_prompt.empty:
        return pd.DataFrame(columns=SETTING_COLUMNS)
    out = []
    for _, g in per_prompt.groupby("setting", sort=True):
        seen = versions.order(g)
        if len(seen) >= 2:
            first = g.iloc[0]
            out.append({c: first[c] for c in SETTING_COLUMNS[:-1]} | {"versions": " → ".join(seen)})
    return pd.DataFrame(out, columns=SETTING_COLUMNS)


def version_changes(db, f: Filters, tolerance: float = versions.TOLERANCE) -> pd.DataFrame:
    """specfleet/versions.py's changes between consecutive versions of every setting measured
    under several (decode tok/s per arm, speedup, acceptance), per chip, with what names the
    setting: ratio new / old, its interval, the change called (regression, gain, unchanged,
    inconclusive) with tolerance `tolerance`."""
    per_prompt = version_per_prompt(db, f, several=True)
    settings = version_settings(per_prompt)
    if settings.empty:
        return pd.DataFrame(columns=[*versions.COLUMNS, *SETTING_COLUMNS[1:-1]])
    kept = per_prompt[per_prompt["setting"].isin(settings["setting"])]
    out = versions.changes(kept, tolerance)
    return out.merge(settings.drop(columns=["versions"]), on="setting", how="left")


# ---------------------------------------------------------------- the chip apart from the unit


def unit_values(db, f: Filters) -> pd.DataFrame:
    """specfleet/variance.py's input, per comparable group: one row per figure (decode tok/s of
    every arm; the speedup of each speculative arm, its log decode tok/s less the baseline's on
    the same machine and prompt), chip, arm, machine and prompt, `value` the mean over the
    prompt's repeats of the log figure. The runs that may enter a figure, as version_per_prompt."""
    source, params = selected(f)
    per_prompt = db.query(
        "SELECT comparable AS setting, '' AS version, chip, method, depth, machine_id, prompt_id,"
        " avg(ln(decode_tokens_per_second)) AS log_tps, NULL::DOUBLE AS log_acceptance, count(*) AS repeats"
        f" FROM {speedup.valid_sql(source)} WHERE decode_tokens_per_second > 0"
        " AND env_nominal IS DISTINCT FROM false AND lossless IS DISTINCT FROM false"
        " GROUP BY setting, chip, method, depth, machine_id, prompt_id",
        params,
    )
    cols = [*UNIT_FIGURE, "chip", "machine_id", "prompt_id", "value"]
    if per_prompt.empty:
        return pd.DataFrame(columns=cols)
    out = versions.figures(per_prompt)
    out = out[out["figure"].isin([versions.DECODE, versions.SPEEDUP])].rename(columns={"setting": "comparable"})
    return out[cols].reset_index(drop=True)


# What names one figure of the chip apart from the unit: unit_values' rows of one figure and arm.
UNIT_FIGURE = ("comparable", "figure", "method", "depth")


def chip_components(db, f: Filters, values: pd.DataFrame | None = None) -> pd.DataFrame:
    """specfleet/variance.py's components (chip, machine within chip, prompt, residual) of every
    figure and arm of each comparable group; `values`: unit_values(db, f) when the caller has it."""
    values = unit_values(db, f) if values is None else values
    return variance.by_figure(values, UNIT_FIGURE)


def chip_levels(db, f: Filters, values: pd.DataFrame | None = None) -> pd.DataFrame:
    """specfleet/variance.py's levels of every figure and arm of each comparable group: per chip
    its figure and machines, highest first; `values`: unit_values(db, f) when the caller has it."""
    values = unit_values(db, f) if values is None else values
    return variance.levels(values, UNIT_FIGURE)


def chip_pairs(db, f: Filters, values: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every pair of chips of every figure and arm: the ratio of their figures with its
    interval, against the unit-to-unit spread of the components' machine term."""
    values = unit_values(db, f) if values is None else values
    table = chip_components(db, f, values) if table is None else table
    return variance.pairs_by_figure(values, table, UNIT_FIGURE)


# ---------------------------------------------------------------- claims


def ledger_path() -> str:
    """The claims ledger: dashboard/claims.yaml, or SPECFLEET_CLAIMS to use another file."""
    return os.environ.get("SPECFLEET_CLAIMS") or str(ledger.LEDGER)


def load_claims(path: str | None = None) -> list[ledger.Claim]:
    """The checked ledger (ledger_path() by default); raises ClaimError naming faulty fields."""
    return ledger.load_claims(path or ledger_path())


def claim_sweeps(claims: list[ledger.Claim]) -> dict[str, tuple[str, list[str]]]:
    """Per claim id, the sweep file that would test it and what the coordinator's sweep
    parser refuses in it ([] when it would take it)."""
    out = {}
    for claim in claims:
        text = ledger.sweep_yaml(claim)
        try:
            parse_sweep(text)
            out[claim.id] = (text, [])
        except SweepError as e:
            out[claim.id] = (text, list(e.problems))
    return out


def claim_rows(db, claim: ledger.Claim) -> pd.DataFrame:
    """One claim's rows (dashboard/claims/evaluation.py evaluate), before the false-discovery step, on a
    connection of its own closed after use (the claims' temporary views and table), in one
    transaction: every query of the claim sees the same runs while the mirror syncs."""
    with contextlib.closing(db.cursor()) as con:
        con.execute("BEGIN")
        try:
            return ledger.evaluate(claim, con)
        finally:
            con.execute("ROLLBACK")


def adjusted(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The claims' rows after the false-discovery step across the whole ledger."""
    if not frames:
        return pd.DataFrame(columns=ledger.VERDICT_COLUMNS)
    return ledger.adjust(pd.concat(frames, ignore_index=True))


def verdicts(db, claims: list[ledger.Claim]) -> pd.DataFrame:
    """One row per claim, comparable group and chip (and depth), after the false-discovery
    step across the whole ledger (verdict: the raw one; adjusted_verdict: the one that stands)."""
    return adjusted([claim_rows(db, c) for c in claims])


def selections(db, claims: list[ledger.Claim]) -> dict[str, dict]:
    """Per claim id, the runs its conditions select and what each condition left out."""
    with contextlib.closing(db.cursor()) as con:
        return selections_of(claims, con, cells=isinstance(db, Mirror))


def selections_of(
    claims: list[ledger.Claim],
    con: duckdb.DuckDBPyConnection,
    seqs: tuple[int, int] | None = None,
    cells: bool = False,
) -> dict[str, dict]:
    """dashboard/claims/selection.py selection() of every claim at once, in one query instead of one scan
    of the runs per claim (35 scans of a million runs took seconds). With `cells` (`con` on a
    whole mirror, not a SweepView), for every run so far it reads the mirror's selection_cells
    (SELECTION_CELLS: the runs counted per value of what conditions read), a query per claim,
    where they hold exactly the runs up to seqs' end; else the runs, SCAN_CHUNK claims a scan.
    `seqs` as selection() takes it."""
    if not claims or not ledger.has_runs(con):
        return {c.id: ledger.selection(c, con, seqs) for c in claims}
    if cells and (seqs is None or seqs[0] == 0):
        with contextlib.closing(con.cursor()) as cur:
            try:
                cur.execute("BEGIN")  # the cells and the sequence they count up to, as of one commit
                (upto,) = cur.execute("SELECT last_seq FROM _mirror WHERE tbl = 'runs'").fetchone()
                if seqs is None or upto == seqs[1]:
                    cur.execute("CREATE TEMP VIEW runs AS SELECT * FROM main.selection_cells")
                    return {k: x for c in claims for k, x in _selections([c], cur, None, "n").items()}
            except (duckdb.CatalogException, duckdb.BinderException, TypeError):
                pass  # a mirror without cells, or a condition on a column they do not hold
            finally:
                cur.execute("ROLLBACK")
    # DuckDB plans a query of many claims' aggregates in time growing faster than their number
    chunks = [claims[i : i + SCAN_CHUNK] for i in range(0, len(claims), SCAN_CHUNK)]
    return {k: x for chunk in chunks for k, x in _selections(chunk, con, seqs).items()}


SCAN_CHUNK = 8  # claims counted in one scan of the runs (selections_of)


def _selections(claims, con, seqs: tuple[int, int] | None, weight: str | None = None) -> dict[str, dict]:
    """selections_of on `con`'s runs (each run counted `weight` times: a column of cells, or once),
    grouped per target model and system, so that the lists of models and systems are those of
    the rows with runs selected; each claim's parameters renamed apart ($c3_engine)."""

    def count(cond: str) -> str:
        if weight is None:
            return f"count(*) FILTER (WHERE {cond})"
        return f"coalesce(sum({weight}) FILTER (WHERE {cond}), 0)"

    columns, params, names = [], {}, []
    for i, claim in enumerate(claims):
        conds, own = ledger.conditions(claim)
        sql = [ledger.PARAM.sub(lambda m, i=i: f"$c{i}_{m[1]}", s) for _, s in conds]
        params |= {f"c{i}_{k}": v for k, v in own.items()}
        every = " AND ".join(f"coalesce({s}, false)" for s in sql)
        columns += [
            count(every),
            count(f"{every} AND method = $c{i}_method"),
            count(f"engine = $c{i}_engine AND system = $c{i}_system AND method = $c{i}_method"),
            *(count(f"NOT coalesce({s}, false)") for s in sql),
        ]
        names.append([name for name, _ in conds])
    where = "seq > $lo AND seq <= $hi" if seqs else "true"
    if seqs:
        params |= dict(zip(("lo", "hi"), seqs))
    rows = con.execute(
        f"SELECT target_reference, {ledger.system_label_sql()}, {count('true')}, {', '.join(columns)}"
        f" FROM (SELECT * FROM runs WHERE method != '{VERIFY_COST}') WHERE {where} GROUP BY ALL",
        params,
    ).fetchall()
    counts = np.array([r[2:] for r in rows], dtype=np.int64).reshape(len(rows), len(columns) + 1)
    totals = counts.sum(axis=0)
    out, at = {}, 1
    for claim, conds in zip(claims, names):
        chosen = [r for r, n in zip(rows, counts[:, at]) if n]
        fails = totals[at + 3 : at + 3 + len(conds)]
        out[claim.id] = dict(
            fleet=int(totals[0]),
            selected=int(totals[at]),
            arm=int(totals[at + 1]),
            models=sorted({r[0] for r in chosen}),
            systems=sorted({r[1] for r in chosen}),
            of_system=int(totals[at + 2]),
            excluded={name: int(n) for name, n in zip(conds, fails) if n},
        )
        at += 3 + len(conds)
    return out


def systems(db) -> pd.DataFrame:
    """Per engine, system and target model: the last run stored and the last change of its jobs."""
    return db.query(
        "SELECT engine, system, lower(trim(target_reference)) AS model, max(r.last_seq) AS runs,"
        " coalesce(max(j.seq), 0) AS jobs FROM run_systems r LEFT JOIN jobs j USING (job_id) GROUP BY ALL",
    )


def claim_key(claim: ledger.Claim, systems: pd.DataFrame) -> tuple:
    """What a claim's rows depend on: the last run and job change among the runs of its engine
    and system (of its models, when it names them), and the same for our loop beside it."""

    def of(c: ledger.Claim | None) -> tuple[int, int]:
        if c is None or systems.empty:
            return (0, 0)
        rows = systems[(systems["engine"] == c.engine) & (systems["system"] == c.system)]
        if c.conditions.get("models"):
            rows = rows[rows["model"].isin([m.strip().lower() for m in c.conditions["models"]])]
        return (int(rows["runs"].max()), int(rows["jobs"].max())) if len(rows) else (0, 0)

    return of(claim), of(ledger.our_loop(claim))

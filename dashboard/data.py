"""Data access for the pages: one cached mirror per process, parameterised cached queries.

Pages call these functions and arrange what they return. Runs are read from the mirror's typed
columns (specfleet/record.py RunRecord, one column per field) and `LABELS`, computed once per
run as it arrives: what every page names a run by (the system it measured, dashboard/claims.py
system_label; its comparable group; its models as reference@digest; its sampler; its
environment state). Filtering and aggregation run in DuckDB; SQL never carries user input as
text: filters travel as bound parameters. Each query's cache is keyed on the sequences of the
tables it reads (Version, cached_on); the claims' rows on the runs each claim could select.
Speedups are specfleet/speedup.py's (through dashboard/stats.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import threading
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import streamlit as st

from agent.api import AdminApi, channel
from coordinator.sweeps import SweepError, parse_sweep
from dashboard import claims as ledger
from dashboard import stats
from dashboard.mirror import Mirror
from specfleet import speedup
from specfleet.record import VERIFY_COST

REFRESH_SECONDS = 5


def model_label(prefix: str) -> str:
    """SQL: a model named by its reference and the first 12 hex digits of its digest
    ("target.gguf@571b2644b2e8"), never by a path; '' when the run has no such model.
    `prefix` is "target" or "draft", optionally qualified ("g.target")."""
    ref, digest = f"{prefix}_reference", f"{prefix}_digest"
    return f"CASE WHEN {ref} = '' THEN '' WHEN {digest} = '' THEN {ref} ELSE {ref} || '@' || left({digest}, 12) END"


def sampler_label(prefix: str = "") -> str:
    """SQL: "greedy" or "T=0.7 top_p=0.9 top_k=20 seed=1": every checked sampler key that is
    not its default, so that no two samplers share a label."""
    s = f"{prefix}sampler_"
    rest = f"' top_p=' || printf('%g', {s}top_p) || ' top_k=' || {s}top_k || ' seed=' || {s}seed"
    return (
        f"CASE WHEN {s}temperature != 0 THEN 'T=' || printf('%g', {s}temperature) || {rest}"
        f" WHEN {s}top_p != 1 OR {s}top_k != 0 OR {s}seed != 0 THEN 'greedy' || {rest} ELSE 'greedy' END"
    )


NOMINAL = "CASE env_nominal WHEN true THEN 'nominal' WHEN false THEN 'degraded' ELSE 'unknown' END"
# A run's flags at a glance: an output that differed from its reference (lossy: a defect, in no
# figure), client and server timings more than 5% apart, a stateful drafter that inherited
# state from earlier requests, collapsed acceptance. '' when none.
FLAGS = (
    "concat_ws(', ', CASE WHEN lossless IS NOT DISTINCT FROM false THEN 'lossy' END,"
    " CASE WHEN timings_disagree THEN 'timings disagree' END, CASE WHEN drafter_warm THEN 'warm drafter' END,"
    " CASE WHEN acceptance_collapsed THEN 'acceptance collapsed' END)"
)
FLAG_NAMES = ("lossy", "timings disagree", "warm drafter", "acceptance collapsed")
# What the pages name a run by, computed once per run as it arrives in the mirror (Mirror's
# `derived`): the system it measured (system_label "llama-server", "MTPLX (openai)", "specfleet
# mlx"; system_method with the method: "llama-server draft-mtp"), its comparable group, its
# models as reference@digest, its sampler, its environment state, its acceptance rate. Every
# query reads them as columns of the mirror's `runs`.
LABELS = (
    f"{speedup.COMPARABLE_ID} AS comparable, {ledger.system_label_sql()} AS system_label,"
    f" {ledger.system_label_sql()} || ' ' || method AS system_method, {model_label('target')} AS model,"
    f" {model_label('draft')} AS draft_model, {sampler_label()} AS sampler, {NOMINAL} AS nominal,"
    " tokens_accepted / nullif(tokens_drafted, 0) AS acceptance_rate"
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


def selected(f: Filters, generation: bool = True) -> tuple[str, dict]:
    """A parenthesised relation of the runs `f` selects, and its named parameters. A method
    filter keeps the baselines (every speedup needs them); `generation` leaves out verify-cost
    runs, which are never speedups."""
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
    return f"(SELECT * FROM runs WHERE {' AND '.join(where) or 'true'})", params


def coordinator() -> tuple[str, str]:
    return os.environ.get("SPECFLEET_COORDINATOR", "127.0.0.1:50551"), os.environ.get("SPECFLEET_ADMIN_TOKEN", "")


# Per job, engine, system and target model: the last run stored. What a claim's results are
# keyed on (_claim_key): they are recomputed only when runs they could select, or their jobs,
# changed.
RUN_SYSTEMS = [
    "CREATE TABLE IF NOT EXISTS run_systems (job_id VARCHAR, engine VARCHAR, system VARCHAR,"
    " target_reference VARCHAR, last_seq BIGINT, PRIMARY KEY (job_id, engine, system, target_reference))",
    "INSERT INTO run_systems SELECT job_id, engine, system, target_reference, max(seq) FROM _batch GROUP BY ALL"
    " ON CONFLICT DO UPDATE SET last_seq = greatest(last_seq, excluded.last_seq)",
]


@st.cache_resource
def mirror(address: str, token: str) -> Mirror:
    return Mirror(AdminApi(channel(address), token), derived={"runs": LABELS}, summaries={"runs": RUN_SYSTEMS})


@st.cache_data(ttl=REFRESH_SECONDS)
def synced(address: str, token: str) -> dict[str, int]:
    """Sync at most every REFRESH_SECONDS: each table's highest mirrored sequence."""
    return mirror(address, token).sync()


@dataclass(frozen=True)
class Version:
    """What the queries below take as their first argument: the coordinator and each mirrored
    table's sequence. A query's cache is keyed on the tables it reads (cached_on), so it reruns
    exactly when one of them changed: an agent's heartbeat reruns no figure of runs."""

    address: str
    token: str
    agents: int = 0
    sweeps: int = 0
    jobs: int = 0
    runs: int = 0
    imported_results: int = 0


def version() -> Version:
    address, token = coordinator()
    return Version(address, token, **synced(address, token))


CACHE_ENTRIES = 64  # per query function: versions and filters a dashboard goes through


def cached_on(*tables: str):
    """st.cache_data keyed on the coordinator and the named tables' sequences of the Version
    argument (and the other arguments as usual); no time limit, a bounded number of entries."""
    key = lambda v: (v.address, v.token, *(getattr(v, t) for t in tables))  # noqa: E731
    return st.cache_data(hash_funcs={Version: key}, max_entries=CACHE_ENTRIES)


on_runs = cached_on("runs", "jobs")  # a run counts only on its job's current attempt
on_fleet = cached_on("agents", "sweeps", "jobs", "runs")


def _q(v: Version, sql: str, params: dict | list | None = None) -> pd.DataFrame:
    return mirror(v.address, v.token).query(sql, params)


def _query(v: Version):
    return lambda sql, params=None: _q(v, sql, params)


# ---------------------------------------------------------------- fleet and sweeps


@on_fleet
def agents(v: Version) -> pd.DataFrame:
    return _q(
        v,
        "SELECT name, chip, try_cast(fingerprint->>'gpuCores' AS INTEGER) AS gpu_cores,"
        " round(memory_bytes / 2^30, 1) AS memory_gib, fingerprint->>'osVersion' AS os_version,"
        " fingerprint->>'modelIdentifier' AS model_identifier,"
        " round(try_cast(fingerprint->>'memoryBandwidthBytesPerSecond' AS DOUBLE) / 1e9, 1) AS bandwidth_gb_per_s,"
        " state, status, current_job_id, to_timestamp(last_seen) AS last_seen, agent_id"
        " FROM agents ORDER BY name",
    )


@on_fleet
def chips(v: Version) -> list[str]:
    """Every chip the fleet has seen, sorted: the domain of the one chip->colour mapping."""
    seen = set(_q(v, "SELECT DISTINCT chip FROM agents").get("chip", []))
    seen |= set(_q(v, "SELECT DISTINCT chip FROM runs").get("chip", []))
    return sorted(seen)


@on_fleet
def sweeps(v: Version) -> pd.DataFrame:
    """Progress per sweep: jobs (one per cell and machine) by state, runs, failures with reasons.
    A job an agent refused (coordinator/states.py: refused, with its reason) is finished."""
    out = _q(
        v,
        "SELECT s.sweep_id, s.name, s.state, to_timestamp(s.created_at) AS created_at,"
        " count(j.job_id) AS jobs,"
        " count(j.job_id) FILTER (WHERE j.state = 'queued') AS queued,"
        " count(j.job_id) FILTER (WHERE j.state = 'leased') AS in_flight,"
        " count(j.job_id) FILTER (WHERE j.state = 'done') AS done,"
        " count(j.job_id) FILTER (WHERE j.state = 'failed') AS failed,"
        " count(j.job_id) FILTER (WHERE j.state = 'refused') AS refused,"
        " count(j.job_id) FILTER (WHERE j.state = 'cancelled') AS cancelled"
        " FROM sweeps s LEFT JOIN jobs j USING (sweep_id) GROUP BY ALL ORDER BY created_at DESC",
    )
    if out.empty:
        return out
    runs = _q(v, "SELECT sweep_id, count(*) AS runs FROM runs GROUP BY ALL")
    out = out.merge(runs, on="sweep_id", how="left") if not runs.empty else out.assign(runs=0)
    out["runs"] = out["runs"].fillna(0).astype(int)
    finished = out["done"] + out["failed"] + out["refused"] + out["cancelled"]
    out["progress"] = (finished / out["jobs"].where(out["jobs"] > 0)).fillna(0)
    return out


@on_fleet
def failures(v: Version) -> pd.DataFrame:
    """Jobs that failed or that their agent refused, with the state and the reason."""
    return _q(
        v,
        "SELECT j.sweep_id, j.job_id, a.name AS agent, j.state, j.attempt, j.reason,"
        " to_timestamp(j.updated_at) AS failed_at FROM jobs j LEFT JOIN agents a USING (agent_id)"
        " WHERE j.state IN ('failed', 'refused') ORDER BY j.updated_at DESC",
    )


# ---------------------------------------------------------------- runs


@on_runs
def run_count(v: Version) -> int:
    """Generation runs mirrored (verify-cost steps apart)."""
    df = _q(v, f"SELECT count(*) AS n FROM runs WHERE method != '{VERIFY_COST}'")
    return int(df["n"][0]) if not df.empty else 0


@on_runs
def filter_options(v: Version) -> dict[str, list[str]]:
    out = {}
    for field, column in FILTER_COLUMNS.items():
        df = _q(
            v,
            f"SELECT DISTINCT {column} AS value FROM runs"
            f" WHERE method != '{VERIFY_COST}' AND {column} != '' ORDER BY 1",
        )
        out[field] = df["value"].tolist() if not df.empty else []
    return out


RUNS_SHOWN = 1000  # the Runs page's table: the latest runs of the selection; downloads hold all


def _runs_source(f: Filters, chips: tuple[str, ...], states: tuple[str, ...]) -> tuple[str, dict]:
    """selected(f) with verify-cost runs, narrowed to the chips and environment states given."""
    source, params = selected(f, generation=False)
    where = []
    if chips:
        where.append("list_contains($chips::VARCHAR[], chip)")
        params["chips"] = list(chips)
    if states:
        where.append("list_contains($states::VARCHAR[], nominal)")
        params["states"] = list(states)
    return f"(SELECT * FROM {source} WHERE {' AND '.join(where) or 'true'})", params


def _runs_sql(source: str) -> str:
    names = "nominal, system_method, model, draft_model, sampler, comparable"
    speeds = "decode_tokens_per_second, server_decode_tokens_per_second, server_version, server_command"
    return (
        f"SELECT {names}, {FLAGS} AS flags, {speedup.counts_sql('s')} AS counts,"
        f" to_timestamp(started_at_unix_seconds) AS started_at, {speeds},"
        f" * EXCLUDE ({names}, {speeds}) REPLACE (to_timestamp(ingested_at) AS ingested_at)"
        f" FROM {source} s"
    )


@on_runs
def runs_table(
    v: Version, f: Filters, chips: tuple[str, ...] = (), states: tuple[str, ...] = (), limit: int = RUNS_SHOWN
) -> pd.DataFrame:
    """The latest `limit` runs the filters, chips and environment states select (verify-cost
    runs too), in the order they were stored: every typed column, the names it goes by first
    (the system and method it measured, its flags), then its decode tok/s beside the server's
    own and the server's version and command, times as timestamps. `counts` says whether the
    run may enter a figure: runs of a lost attempt or a failed job are shown, never counted."""
    source, params = _runs_source(f, chips, states)
    sql = f"SELECT * FROM ({_runs_sql(source)} ORDER BY seq DESC LIMIT $limit) ORDER BY seq"
    return _q(v, sql, {**params, "limit": limit})


@on_runs
def runs_summary(v: Version, f: Filters, chips: tuple[str, ...] = (), states: tuple[str, ...] = ()) -> dict:
    """What the Runs page says of the whole selection: runs, machines, chips (and every chip of
    the filters, for the chip selector), runs per environment state, runs per flag."""
    source, params = _runs_source(f, chips, states)
    flags = ", ".join(f"count(*) FILTER (WHERE contains(flags, '{flag}')) AS \"{flag}\"" for flag in FLAG_NAMES)
    row = _q(
        v,
        f"SELECT count(*) AS runs, count(DISTINCT agent_id) AS machines, count(DISTINCT chip) AS chips, {flags},"
        " count(*) FILTER (WHERE nominal = 'nominal') AS nominal, count(*) FILTER (WHERE nominal = 'unknown')"
        f" AS unknown, count(*) FILTER (WHERE nominal = 'degraded') AS degraded"
        f" FROM (SELECT *, {FLAGS} AS flags FROM {source})",
        params,
    )
    out = {k: int(x) for k, x in row.iloc[0].items()} if not row.empty else {}
    every, every_params = selected(f, generation=False)
    listed = _q(v, f"SELECT DISTINCT chip FROM {every} ORDER BY 1", every_params)
    out["chip_options"] = listed["chip"].tolist() if not listed.empty else []
    return out


def runs_download(v: Version, f: Filters, chips: tuple[str, ...], states: tuple[str, ...], fmt: str) -> bytes:
    """Every run of the selection (not only those shown) as CSV or Parquet, the Runs table's
    columns, read in batches so a million runs never sit in memory as rows. List columns
    (acceptance by position, verify cost, environment reasons) are lists in Parquet and
    "[a, b]" in CSV."""
    source, params = _runs_source(f, chips, states)
    out = io.BytesIO()
    with _evaluation(v.address, v.token) as con:
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


@on_runs
def nominal_counts(v: Version, f: Filters) -> dict[str, int]:
    source, params = selected(f)
    df = _q(v, f"SELECT nominal, count(*) AS n FROM {source} GROUP BY ALL", params)
    return dict(zip(df["nominal"], df["n"].astype(int))) if not df.empty else {}


@on_runs
def collapsed_acceptance(v: Version, f: Filters) -> pd.DataFrame:
    """Runs the agent flagged for collapsed acceptance (acceptance_collapsed, with its reason),
    per chip, engine, method and model. They stay in every figure: the collapse is the
    finding, and usually a broken model conversion."""
    source, params = selected(f)
    df = _q(
        v,
        "SELECT chip, engine, method, model, count(*) AS runs, arg_min(acceptance_reason, seq) AS reason"
        f" FROM {source} WHERE acceptance_collapsed GROUP BY ALL ORDER BY chip, engine, method",
        params,
    )
    return df if not df.empty else pd.DataFrame(columns=["chip", "engine", "method", "model", "runs", "reason"])


def lossy_runs(v: Version, f: Filters) -> pd.DataFrame:
    """Runs whose output differed from their reference (lossless false: the greedy baseline's,
    or on llama.cpp the same-seed baseline's), per chip, system, method and depth: an engine
    defect, never a figure (specfleet/speedup.py leaves them out of every speedup)."""
    source, params = selected(f)
    df = _q(
        v,
        "SELECT chip, system_label, engine, method, depth, any_value(lossless_check) AS checked_against,"
        " count(*) AS runs FROM " + source + " WHERE lossless IS NOT DISTINCT FROM false"
        " GROUP BY chip, system_label, engine, method, depth ORDER BY ALL",
        params,
    )
    columns = ["chip", "system_label", "engine", "method", "depth", "checked_against", "runs"]
    return df if not df.empty else pd.DataFrame(columns=columns)


def _flagged(v: Version, f: Filters, flag: str) -> pd.DataFrame:
    """Runs with `flag` (a boolean column of the record, never user input) true, per chip,
    system, method and depth, with the medians of the client's and the server's decode tok/s."""
    source, params = selected(f)
    df = _q(
        v,
        "SELECT chip, system_method, method, depth, count(*) AS runs, count(DISTINCT agent_id) AS machines,"
        " median(decode_tokens_per_second) AS client_tokens_per_second,"
        " median(server_decode_tokens_per_second) AS server_tokens_per_second"
        f" FROM {source} WHERE {flag} GROUP BY ALL ORDER BY ALL",
        params,
    )
    columns = ["chip", "system_method", "method", "depth", "runs", "machines"]
    columns += ["client_tokens_per_second", "server_tokens_per_second"]
    return df if not df.empty else pd.DataFrame(columns=columns)


@on_runs
def timings_disagree(v: Version, f: Filters) -> pd.DataFrame:
    """Server runs whose decode tok/s as the client timed it and as the server reported it
    differ by more than 5% (timings_disagree), per chip, system, method and depth. They stay in
    the figures, which are the client's; the page says so."""
    return _flagged(v, f, "timings_disagree")


@on_runs
def warm_drafters(v: Version, f: Filters) -> pd.DataFrame:
    """Runs whose stateful drafter (ngram-mod's table, ngram-cache) inherited state from
    earlier requests (drafter_warm true), per chip, system, method and depth: a fresh server's
    acceptance and speed may be lower. They stay in the figures; the page says so."""
    return _flagged(v, f, "drafter_warm")


@on_runs
def server_figures(v: Version, f: Filters) -> pd.DataFrame:
    """Server runs (llama-server, OpenAI-compatible servers) per chip, system, arm and server
    build: the server's version and command line, the median decode tok/s as the client timed
    it beside the server's own, and the runs whose timings disagree or whose drafter was warm,
    with the machines, prompts and runs behind them."""
    source, params = selected(f)
    return _q(
        v,
        "SELECT chip, system_method, depth, server_version, any_value(server_command) AS server_command,"
        " count(DISTINCT server_command) AS commands,"
        " median(decode_tokens_per_second) AS client_tokens_per_second,"
        " median(server_decode_tokens_per_second) AS server_tokens_per_second,"
        " count(*) FILTER (WHERE timings_disagree) AS timings_disagree_runs,"
        " count(*) FILTER (WHERE drafter_warm) AS warm_drafter_runs,"
        " count(DISTINCT agent_id) AS machines, count(DISTINCT prompt_id) AS prompts, count(*) AS runs"
        f" FROM {source} WHERE system != '{ledger.OURS}' AND nominal != 'degraded'"
        " GROUP BY chip, system_method, depth, server_version ORDER BY ALL",
        params,
    )


# ---------------------------------------------------------------- comparable groups


def group_label(g) -> str:
    """How the selector names a comparable group: the system it measured (system_label),
    models, prompt set, context, sampler."""
    draft = f"draft {g.draft_model}" if g.draft_model else "no draft"
    return (
        f"{g.system_label} · {g.model} · {draft} · {g.prompt_set} · context {g.context_tokens} · {g.sampler}"
        f" · group {g.comparable}"
    )


@on_runs
def groups(v: Version, f: Filters) -> pd.DataFrame:
    """The comparable groups (specfleet.speedup.groups) of the runs `f` selects, whichever
    group `f` names, most runs first; with the names the selector shows and the chips."""
    source, params = selected(dataclasses.replace(f, comparable=""))
    grouped = speedup.groups_sql(source, comparable="comparable")  # the mirror's column: no md5 of every run
    df = _q(
        v,
        f"SELECT g.comparable, {ledger.system_label_sql('g.')} AS system_label, g.engine,"
        f" {model_label('g.target')} AS model, {model_label('g.draft')} AS draft_model,"
        f" g.prompt_set, g.context_tokens, {sampler_label('g.')} AS sampler, g.runs, m.machines, m.chips,"
        " g.* EXCLUDE (comparable, engine, prompt_set, context_tokens, runs)"
        f" FROM ({grouped}) g JOIN (SELECT comparable, count(DISTINCT agent_id) AS machines,"
        f" string_agg(DISTINCT chip, ', ' ORDER BY chip) AS chips FROM {source} GROUP BY ALL) m USING (comparable)"
        " ORDER BY g.runs DESC, g.comparable",
        params,
    )
    if not df.empty:
        df.insert(1, "label", [group_label(g) for g in df.itertuples()])
    return df


def _group_keys(v: Version, comparable: str) -> tuple[str, dict]:
    """SQL condition: a verify-cost run of the group's target model, engine and engine version
    (its context depth and sampler are its own); true without a group."""
    if not comparable:
        return "true", {}
    return (
        "EXISTS (SELECT 1 FROM runs g WHERE g.comparable = $comparable AND g.target_digest = r.target_digest"
        " AND g.engine = r.engine AND g.engine_version = r.engine_version)"
    ), {"comparable": comparable}


# ---------------------------------------------------------------- comparisons


@on_runs
def speedups(v: Version, f: Filters) -> pd.DataFrame:
    """specfleet.speedup's speedup per comparable group, chip and arm, with its 95% interval,
    machines, prompts, pairs and the pairs left out for a run that was not nominal."""
    source, params = selected(f)
    out = stats.speedups(_query(v), source, params)
    if out.empty:
        return out
    names = groups(v, f)[["comparable", "system_label", "model", "draft_model"]]  # reference@digest, never a path
    out = out.merge(names, on="comparable", how="left").drop(columns=["target_reference", "draft_reference"])
    first = ["comparable", "system_label", "engine", "model", "draft_model"]
    return out[first + [c for c in out.columns if c not in first]]


@on_runs
def decode_speed(v: Version, f: Filters) -> pd.DataFrame:
    """Median decode tok/s per chip, engine and arm, with its interval, machines, prompts, runs."""
    source, params = selected(f)
    values = _q(
        v,
        "SELECT chip, engine, method || CASE WHEN depth > 0 THEN ' K=' || depth ELSE '' END AS arm, agent_id,"
        f" prompt_id, decode_tokens_per_second, nominal = 'degraded' AS degraded FROM {source}",
        params,
    )
    return stats.summarise(values, by=("chip", "engine", "arm"), column="decode_tokens_per_second")


@on_runs
def energy(v: Version, f: Filters) -> pd.DataFrame:
    """Median tokens per joule (1 / joules_per_token) per chip, engine and arm, with its
    interval, machines, prompts and runs, beside the median decode tok/s of the same runs and
    the counters they read (energy_source: nvml, rapl, ioreport). Only runs that recorded their
    energy: a machine with no readable counter records none, never an estimate."""
    source, params = selected(f)
    values = _q(
        v,
        "SELECT chip, engine, method || CASE WHEN depth > 0 THEN ' K=' || depth ELSE '' END AS arm, agent_id,"
        " prompt_id, 1 / joules_per_token AS tokens_per_joule, decode_tokens_per_second, energy_source,"
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
    )
    out = out.rename(columns={"median": "tokens_per_joule"}).merge(beside, on=["chip", "engine", "arm"], how="left")
    first = ["chip", "engine", "arm", "tokens_per_joule", "ci_low", "ci_high", "decode_tokens_per_second"]
    return out[first + [c for c in out.columns if c not in first]]


@on_runs
def acceptance_by_position(v: Version, f: Filters) -> pd.DataFrame:
    """Median share accepted at each draft position (acceptance_by_position), per chip and arm;
    positions nothing was proposed at are left out."""
    source, params = selected(f)
    return _q(
        v,
        "SELECT chip, engine, method, depth, position, median(share) AS acceptance,"
        " count(DISTINCT agent_id) AS machines, count(DISTINCT prompt_id) AS prompts, count(*) AS runs"
        " FROM (SELECT chip, engine, method, depth, agent_id, prompt_id, drafted_by_position AS drafted,"
        " unnest(acceptance_by_position) AS share, generate_subscripts(acceptance_by_position, 1) AS position"
        f" FROM {source} WHERE method != 'baseline' AND nominal != 'degraded')"
        " WHERE len(drafted) = 0 OR drafted[position] > 0"
        " GROUP BY ALL ORDER BY chip, engine, method, depth, position",
        params,
    )


@on_runs
def draft_verify(v: Version, f: Filters) -> pd.DataFrame:
    """Median draft and verify milliseconds per generated token, per chip and arm. Reference
    arms (the libraries' own loops) report no rounds: nothing to split."""
    source, params = selected(f)
    agg = _q(
        v,
        "SELECT chip, engine || ' · ' || method || ' K=' || depth AS arm,"
        " median(draft_seconds / generated_tokens * 1e3) AS draft, median(verify_seconds / generated_tokens * 1e3)"
        " AS verify, count(DISTINCT agent_id) AS machines, count(DISTINCT prompt_id) AS prompts, count(*) AS runs"
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


@on_runs
def verify_cost(v: Version, f: Filters) -> pd.DataFrame:
    """T(M)/T(1) per chip, engine and context depth (verify_cost_seconds, context_tokens):
    the median over machines of each machine's latest curve. With a group chosen, the curves
    of its target model, engine and engine version."""
    where, params = [f"r.method = '{VERIFY_COST}'", "r.nominal != 'degraded'"], {}
    for name in ("model", "engine"):
        if getattr(f, name):
            where.append(f"list_contains(${name}::VARCHAR[], r.{name})")
            params[name] = list(getattr(f, name))
    group, group_params = _group_keys(v, f.comparable)
    where.append(group)
    params |= group_params
    return _q(
        v,
        "WITH curves AS (SELECT chip, engine, agent_id, context_tokens, arg_max(verify_cost_seconds, seq) AS t"
        f" FROM runs r WHERE {' AND '.join(where)} GROUP BY ALL),"
        " points AS (SELECT chip, engine, agent_id, context_tokens, t, unnest(range(1, len(t) + 1)) AS m FROM curves)"
        " SELECT chip, engine, context_tokens, m AS rows, median(t[m] / t[1]) AS ratio,"
        " count(DISTINCT agent_id) AS machines FROM points WHERE t[1] > 0 GROUP BY ALL ORDER BY ALL",
        params,
    )


@on_runs
def roofline(v: Version, f: Filters) -> pd.DataFrame:
    """Share of the memory-bandwidth roofline of baseline decoding: decode tok/s x bytes read per
    token (the target's size, target_bytes) / the chip's bandwidth. `share` is NaN and `why`
    says what is missing when the runs record no model size or the machine no bandwidth."""
    source, params = selected(f)
    df = _q(
        v,
        "SELECT r.chip, r.engine, r.model, median(r.decode_tokens_per_second) AS decode_tokens_per_second,"
        " median(nullif(r.target_bytes, 0)) AS bytes_per_token, median(a.bandwidth) / 1e9 AS bandwidth_gb_per_s,"
        " count(DISTINCT r.agent_id) AS machines, count(DISTINCT r.prompt_id) AS prompts, count(*) AS runs"
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


# ---------------------------------------------------------------- claims


def ledger_path() -> str:
    """The claims ledger: dashboard/claims.yaml, or SPECFLEET_CLAIMS to use another file."""
    return os.environ.get("SPECFLEET_CLAIMS") or str(ledger.LEDGER)


@st.cache_data(max_entries=CACHE_ENTRIES)
def _claims(path: str, mtime: float) -> list[ledger.Claim]:
    return ledger.load_claims(path)


def claims() -> list[ledger.Claim]:
    """The checked ledger, reread when the file changes; raises ClaimError naming faulty fields."""
    path = ledger_path()
    return _claims(path, os.path.getmtime(path))


def verdicts(v: Version) -> pd.DataFrame:
    """One row per claim, comparable group and chip (and depth), after the false-discovery
    step across the whole ledger (verdict: the raw one; adjusted_verdict: the one that
    stands). Each claim's rows are recomputed only when the ledger changed or runs it could
    select (of its engine, system and models, and of our loop beside it) or their jobs did."""
    path = ledger_path()
    mtime = os.path.getmtime(path)
    systems = _systems(v)
    keys = tuple(_key_with_fleet(c, systems, v) for c in _claims(path, mtime))
    return _adjusted(v.address, v.token, path, mtime, keys)


@st.cache_data(max_entries=CACHE_ENTRIES)
def _adjusted(address: str, token: str, path: str, mtime: float, keys: tuple) -> pd.DataFrame:
    """Every claim's rows (each cached on its key), then the false-discovery step over them."""
    frames = [_claim_rows(address, token, c.id, path, mtime, k) for c, k in zip(_claims(path, mtime), keys)]
    if not frames:
        return pd.DataFrame(columns=ledger.VERDICT_COLUMNS)
    return ledger.adjust(pd.concat(frames, ignore_index=True))


def claim_sweeps() -> dict[str, tuple[str, list[str]]]:
    """Per claim id, the sweep file that would test it and what the coordinator's sweep
    parser refuses in it ([] when it would take it); reread when the ledger changes."""
    path = ledger_path()
    return _claim_sweeps(path, os.path.getmtime(path))


@st.cache_data(max_entries=CACHE_ENTRIES)
def _claim_sweeps(path: str, mtime: float) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for claim in _claims(path, mtime):
        text = ledger.sweep_yaml(claim)
        try:
            parse_sweep(text)
            out[claim.id] = (text, [])
        except SweepError as e:
            out[claim.id] = (text, list(e.problems))
    return out


def _evaluation(address: str, token: str):
    """A connection of its own on the mirror, closed after use: for the claims' temporary
    tables, a download read in batches."""
    return contextlib.closing(mirror(address, token).cursor())


@on_runs
def _systems(v: Version) -> pd.DataFrame:
    """Per engine, system and target model: the last run stored and the last change of its jobs."""
    return _q(
        v,
        "SELECT engine, system, lower(trim(target_reference)) AS model, max(r.last_seq) AS runs,"
        " coalesce(max(j.seq), 0) AS jobs FROM run_systems r LEFT JOIN jobs j USING (job_id) GROUP BY ALL",
    )


def _claim_key(claim: ledger.Claim, systems: pd.DataFrame) -> tuple:
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


def _key_with_fleet(claim: ledger.Claim, systems: pd.DataFrame, v: Version) -> tuple:
    """_claim_key, and for a claim with no run of its own system yet the runs' sequence too:
    its row says what the fleet's runs left out, which every new run changes. (A claim with
    runs of its system but none inside its conditions counts the others as of its last change.)"""
    key = _claim_key(claim, systems)
    return key if key[0] != (0, 0) else (*key, v.runs)


@st.cache_data(max_entries=4 * CACHE_ENTRIES)
def _claim_rows(address: str, token: str, claim_id: str, path: str, mtime: float, key: tuple) -> pd.DataFrame:
    (claim,) = [c for c in _claims(path, mtime) if c.id == claim_id]
    with _evaluation(address, token) as con:
        return ledger.evaluate(claim, con)


@st.cache_resource
def _selection_state(address: str, token: str) -> dict:
    """Per claim id: (ledger mtime, the runs' sequence its selection counts up to, selection)."""
    return {"lock": threading.Lock()}


def selections(v: Version) -> dict[str, dict]:
    """Per claim id, the runs its conditions select and what each condition left out. Runs
    never change once stored: each claim's counts are carried forward and only the runs
    stored since are counted (claims.selection with seqs, merge_selections)."""
    path = ledger_path()
    mtime = os.path.getmtime(path)
    state = _selection_state(v.address, v.token)
    out = {}
    with state["lock"], _evaluation(v.address, v.token) as con:
        for c in _claims(path, mtime):
            seen, upto, sel = state.get(c.id, (None, 0, None))
            if seen != mtime:
                upto, sel = 0, None
            if sel is None or upto < v.runs:
                new = ledger.selection(c, con, (upto, v.runs))
                sel = new if sel is None else ledger.merge_selections(sel, new)
                state[c.id] = (mtime, v.runs, sel)
            out[c.id] = sel
    return out

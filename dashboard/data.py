"""Data access for the pages: one cached mirror per process, parameterised cached queries.

Pages call these functions and arrange what they return. SQL never carries user input as
text: filters travel as bound list parameters. Statistics come from dashboard/stats.py.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from agent.api import AdminApi, channel
from coordinator.export import flatten
from dashboard import claims as ledger
from dashboard import stats
from dashboard.mirror import Mirror

REFRESH_SECONDS = 5
# Parameters the agent may write that give the bytes read per decoded token (the model's
# weights); without one, the roofline share is "not available" rather than a guess.
MODEL_BYTES_PARAMS = ("model.bytes_per_token", "model.target.bytes")


@dataclass(frozen=True)
class Filters:
    """Selected values per field; an empty tuple selects everything."""

    model: tuple[str, ...] = ()
    engine: tuple[str, ...] = ()
    method: tuple[str, ...] = ()
    sampler: tuple[str, ...] = ()
    prompt_set: tuple[str, ...] = ()


def coordinator() -> tuple[str, str]:
    return os.environ.get("SPECFLEET_COORDINATOR", "127.0.0.1:50551"), os.environ.get("SPECFLEET_ADMIN_TOKEN", "")


@st.cache_resource
def mirror(address: str, token: str) -> Mirror:
    return Mirror(AdminApi(channel(address), token))


@st.cache_data(ttl=REFRESH_SECONDS)
def synced(address: str, token: str) -> int:
    """Sync at most every REFRESH_SECONDS. The result (the mirror's sequence) and the
    coordinator key every query's cache, so a query reruns exactly when the data changed."""
    return mirror(address, token).sync()


def version() -> tuple[str, str, int]:
    """What the queries below take as their first argument."""
    address, token = coordinator()
    return address, token, synced(address, token)


def _q(v: tuple[str, str, int], sql: str, params: list | None = None) -> pd.DataFrame:
    return mirror(*v[:2]).query(sql, params)


# ---------------------------------------------------------------- fleet and sweeps


@st.cache_data(ttl=REFRESH_SECONDS)
def agents(v: tuple[str, str, int]) -> pd.DataFrame:
    return _q(
        v,
        "SELECT name, chip, try_cast(fingerprint->>'gpuCores' AS INTEGER) AS gpu_cores,"
        " round(memory_bytes / 2^30, 1) AS memory_gib, fingerprint->>'osVersion' AS os_version,"
        " fingerprint->>'modelIdentifier' AS model_identifier,"
        " round(try_cast(fingerprint->>'memoryBandwidthBytesPerSecond' AS DOUBLE) / 1e9, 1) AS bandwidth_gb_per_s,"
        " state, status, current_job_id, to_timestamp(last_seen) AS last_seen, agent_id"
        " FROM agents ORDER BY name",
    )


@st.cache_data(ttl=REFRESH_SECONDS)
def chips(v: tuple[str, str, int]) -> list[str]:
    """Every chip the fleet has seen, sorted: the domain of the one chip->colour mapping."""
    seen = set(_q(v, "SELECT DISTINCT chip FROM agents").get("chip", []))
    seen |= set(_q(v, "SELECT DISTINCT chip FROM runs").get("chip", []))
    return sorted(seen)


@st.cache_data(ttl=REFRESH_SECONDS)
def sweeps(v: tuple[str, str, int]) -> pd.DataFrame:
    """Progress per sweep: jobs (one per cell and machine) by state, runs, failures with reasons."""
    out = _q(
        v,
        "SELECT s.sweep_id, s.name, s.state, to_timestamp(s.created_at) AS created_at,"
        " count(j.job_id) AS jobs,"
        " count(j.job_id) FILTER (WHERE j.state = 'queued') AS queued,"
        " count(j.job_id) FILTER (WHERE j.state = 'leased') AS in_flight,"
        " count(j.job_id) FILTER (WHERE j.state = 'done') AS done,"
        " count(j.job_id) FILTER (WHERE j.state = 'failed') AS failed,"
        " count(j.job_id) FILTER (WHERE j.state = 'cancelled') AS cancelled"
        " FROM sweeps s LEFT JOIN jobs j USING (sweep_id) GROUP BY ALL ORDER BY created_at DESC",
    )
    if out.empty:
        return out
    runs = _q(v, "SELECT sweep_id, count(*) AS runs FROM runs GROUP BY ALL")
    out = out.merge(runs, on="sweep_id", how="left") if not runs.empty else out.assign(runs=0)
    out["runs"] = out["runs"].fillna(0).astype(int)
    out["progress"] = ((out["done"] + out["failed"] + out["cancelled"]) / out["jobs"].where(out["jobs"] > 0)).fillna(0)
    return out


@st.cache_data(ttl=REFRESH_SECONDS)
def failures(v: tuple[str, str, int]) -> pd.DataFrame:
    return _q(
        v,
        "SELECT j.sweep_id, j.job_id, a.name AS agent, j.attempt, j.reason, to_timestamp(j.updated_at) AS failed_at"
        " FROM jobs j LEFT JOIN agents a USING (agent_id) WHERE j.state = 'failed' ORDER BY j.updated_at DESC",
    )


# ---------------------------------------------------------------- runs


def _model_bytes(params: dict) -> float:
    """Bytes read per decoded token, from the first of MODEL_BYTES_PARAMS that is a number."""
    for key in MODEL_BYTES_PARAMS:
        try:
            value = float(params.get(key, ""))
        except ValueError:
            continue
        if value > 0:
            return value
    return float("nan")


def _with_params(df: pd.DataFrame) -> pd.DataFrame:
    """Columns every page filters or computes on, read from the params and metrics JSON."""
    params = df["params"].map(lambda p: json.loads(p) if p else {})
    metrics = df["metrics"].map(lambda m: json.loads(m) if m else {})
    df = df.assign(
        model=params.map(lambda p: p.get("model.target", "")),
        model_family=params.map(lambda p: p.get("model.family", "")),
        quantisation=params.map(lambda p: p.get("model.quantisation", "")),
        sampler=params.map(lambda p: p.get("sampler", "")),
        prompt_set=params.map(lambda p: p.get("prompt_set", "")),
        nominal=params.map(stats.nominal_state),
        acceptance_collapsed=params.map(lambda p: p.get("acceptance.collapsed") == "true"),
        acceptance_reason=params.map(lambda p: p.get("acceptance.reason", "")),
        model_bytes=params.map(_model_bytes),
        acceptance_rate=metrics.map(lambda m: m.get("acceptance_rate", float("nan"))),
        draft_seconds=metrics.map(lambda m: m.get("draft_seconds", float("nan"))),
        verify_seconds=metrics.map(lambda m: m.get("verify_seconds", float("nan"))),
    )
    return df


@st.cache_data(ttl=REFRESH_SECONDS)
def all_runs(v: tuple[str, str, int]) -> pd.DataFrame:
    """Every generation run (verify-cost steps apart) with its parsed parameters."""
    df = _q(v, "SELECT * FROM runs WHERE method != 'verify-cost' ORDER BY seq")
    return _with_params(df) if not df.empty else df


@st.cache_data(ttl=REFRESH_SECONDS)
def filter_options(v: tuple[str, str, int]) -> dict[str, list[str]]:
    runs = all_runs(v)
    fields = ("model", "engine", "method", "sampler", "prompt_set")
    return {f: sorted(x for x in runs[f].unique() if x) if not runs.empty else [] for f in fields}


def _filtered(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    runs = all_runs(v)
    if runs.empty:
        return runs
    keep = pd.Series(True, index=runs.index)
    for name in ("model", "engine", "sampler", "prompt_set"):
        if getattr(f, name):
            keep &= runs[name].isin(getattr(f, name))
    if f.method:  # the baseline stays: every speedup needs it
        keep &= runs["method"].isin((*f.method, "baseline"))
    return runs[keep]


@st.cache_data(ttl=REFRESH_SECONDS)
def runs_table(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    """Every run with every parameter and metric as a column, for the Runs page and downloads."""
    keys = ("model", "engine", "method", "sampler", "prompt_set")
    df = _q(v, "SELECT * FROM runs ORDER BY seq")
    if df.empty:
        return df
    parsed = _with_params(df)
    keep = pd.Series(True, index=df.index)
    for name in keys:
        if getattr(f, name):
            keep &= parsed[name].isin(getattr(f, name))
    out = flatten(df[keep])
    out.insert(0, "nominal", parsed.loc[keep, "nominal"])
    for col in ("started_at", "ingested_at"):
        out[col] = pd.to_datetime(out[col], unit="s", utc=True)
    return out.reset_index(drop=True)


def downloads(runs: pd.DataFrame) -> tuple[bytes, bytes]:
    """The runs as CSV and as Parquet, for the download buttons."""
    parquet = io.BytesIO()
    runs.to_parquet(parquet, index=False)
    return runs.to_csv(index=False).encode(), parquet.getvalue()


def nominal_counts(v: tuple[str, str, int], f: Filters) -> dict[str, int]:
    runs = _filtered(v, f)
    return runs["nominal"].value_counts().to_dict() if not runs.empty else {}


def collapsed_acceptance(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    """Runs the agent flagged for collapsed acceptance (agent/summary.py), per chip, engine,
    method and model, with one of their reasons. They stay in every figure: the collapse is
    the finding, and usually a broken model conversion."""
    runs = _filtered(v, f)
    if runs.empty or not runs["acceptance_collapsed"].any():
        return pd.DataFrame(columns=["chip", "engine", "method", "model", "runs", "reason"])
    flagged = runs[runs["acceptance_collapsed"]]
    return (
        flagged.groupby(["chip", "engine", "method", "model"], as_index=False)
        .agg(runs=("run_id", "count"), reason=("acceptance_reason", "first"))
        .sort_values(["chip", "engine", "method"])
    )


# ---------------------------------------------------------------- comparisons


@st.cache_data(ttl=REFRESH_SECONDS)
def speedups(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    """Median paired speedup per chip, engine, method and depth, with interval, machines, runs."""
    pairs = stats.paired_ratios(_filtered(v, f))
    return stats.summarise(pairs, by=("chip", "engine", "method", "depth"))


@st.cache_data(ttl=REFRESH_SECONDS)
def decode_speed(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    runs = _filtered(v, f)
    if runs.empty:
        return stats.summarise(runs)
    values = runs.assign(degraded=runs["nominal"].eq("degraded"))
    values["arm"] = values["method"] + values["depth"].map(lambda d: f" K={d}" if d else "")
    return stats.summarise(values, by=("chip", "engine", "arm"), column="decode_tokens_per_second")


@st.cache_data(ttl=REFRESH_SECONDS)
def acceptance_by_position(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    runs = _filtered(v, f)
    rows = []
    for r in runs[runs["method"] != "baseline"].itertuples() if not runs.empty else []:
        if r.nominal == "degraded":
            continue
        for key, value in json.loads(r.metrics).items():
            if key.startswith("acceptance_at_position_"):
                position = int(key.rsplit("_", 1)[1])
                rows.append(
                    dict(
                        chip=r.chip,
                        engine=r.engine,
                        method=r.method,
                        depth=r.depth,
                        position=position,
                        agent_id=r.agent_id,
                        acceptance=value,
                    )
                )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return (
        df.groupby(["chip", "engine", "method", "depth", "position"])
        .agg(acceptance=("acceptance", "median"), machines=("agent_id", "nunique"), runs=("acceptance", "size"))
        .reset_index()
    )


@st.cache_data(ttl=REFRESH_SECONDS)
def draft_verify(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    """Median draft and verify milliseconds per generated token, per chip and arm."""
    runs = _filtered(v, f)
    if runs.empty:
        return runs
    spec = runs[(runs["method"] != "baseline") & runs["draft_seconds"].notna() & (runs["nominal"] != "degraded")]
    # reference arms (the libraries' own loops) report no rounds: nothing to split
    spec = spec[(spec["generated_tokens"] > 0) & (spec["draft_seconds"] + spec["verify_seconds"] > 0)]
    if spec.empty:
        return spec
    spec = spec.assign(
        arm=spec["engine"] + " · " + spec["method"] + " K=" + spec["depth"].astype(str),
        draft=spec["draft_seconds"] / spec["generated_tokens"] * 1e3,
        verify=spec["verify_seconds"] / spec["generated_tokens"] * 1e3,
    )
    agg = spec.groupby(["chip", "arm"]).agg(
        draft=("draft", "median"), verify=("verify", "median"), machines=("agent_id", "nunique"), runs=("draft", "size")
    )
    return agg.reset_index().melt(
        id_vars=["chip", "arm", "machines", "runs"], value_vars=["draft", "verify"], var_name="phase", value_name="ms"
    )


@st.cache_data(ttl=REFRESH_SECONDS)
def verify_cost(v: tuple[str, str, int]) -> pd.DataFrame:
    """T(M)/T(1) per chip, engine and context depth: median over the chip's machines."""
    curves = _q(
        v,
        "SELECT chip, engine, agent_id, prompt_tokens AS context_tokens, arg_max(metrics, seq) AS metrics"
        " FROM runs WHERE method = 'verify-cost' GROUP BY ALL ORDER BY ALL",
    )
    rows = []
    for c in curves.itertuples():
        for key, value in json.loads(c.metrics).items():
            if key.endswith("_ratio"):
                rows.append(
                    dict(
                        chip=c.chip,
                        engine=c.engine,
                        agent_id=c.agent_id,
                        context_tokens=c.context_tokens,
                        rows=int(key.split("_")[1]),
                        ratio=value,
                    )
                )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return (
        df.groupby(["chip", "engine", "context_tokens", "rows"])
        .agg(ratio=("ratio", "median"), machines=("agent_id", "nunique"))
        .reset_index()
    )


@st.cache_data(ttl=REFRESH_SECONDS)
def roofline(v: tuple[str, str, int], f: Filters) -> pd.DataFrame:
    """Share of the memory-bandwidth roofline of baseline decoding: decode tok/s x bytes read per
    token / the chip's bandwidth. `share` is NaN and `why` says what is missing when the run has
    no model size or the machine no bandwidth reading."""
    runs = _filtered(v, f)
    if runs.empty:
        return runs
    base = runs[(runs["method"] == "baseline") & (runs["nominal"] != "degraded")]
    bw = agents(v)[["agent_id", "bandwidth_gb_per_s"]]
    base = base.merge(bw, on="agent_id", how="left")
    rows = []
    for (chip, engine, model), g in base.groupby(["chip", "engine", "model"]):
        tps = g["decode_tokens_per_second"].median()
        bytes_per_token = g["model_bytes"].median()
        bandwidth = g["bandwidth_gb_per_s"].median() * 1e9
        why = ""
        if pd.isna(bytes_per_token):
            why = "model size not reported (params model.target.bytes)"
        elif pd.isna(bandwidth):
            why = "memory bandwidth unknown for this machine"
        share = tps * bytes_per_token / bandwidth if not why else float("nan")
        rows.append(
            dict(
                chip=chip,
                engine=engine,
                model=model,
                decode_tokens_per_second=tps,
                bytes_per_token=bytes_per_token,
                bandwidth_gb_per_s=bandwidth / 1e9,
                share=share,
                machines=g["agent_id"].nunique(),
                runs=len(g),
                why=why,
            )
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- claims


def ledger_path() -> str:
    """The claims ledger: dashboard/claims.yaml, or SPECFLEET_CLAIMS to use another file."""
    return os.environ.get("SPECFLEET_CLAIMS") or str(ledger.LEDGER)


@st.cache_data(ttl=REFRESH_SECONDS)
def _claims(path: str, mtime: float) -> list[ledger.Claim]:
    return ledger.load_claims(path)


def claims() -> list[ledger.Claim]:
    """The checked ledger, reread when the file changes; raises ClaimError naming faulty fields."""
    path = ledger_path()
    return _claims(path, os.path.getmtime(path))


def verdicts(v: tuple[str, str, int]) -> pd.DataFrame:
    """One row per claim and chip; recomputed when the data or the ledger changes."""
    path = ledger_path()
    return _verdicts(v, path, os.path.getmtime(path))


@st.cache_data(ttl=REFRESH_SECONDS)
def _verdicts(v: tuple[str, str, int], path: str, mtime: float) -> pd.DataFrame:
    runs = all_runs(v)
    frames = [ledger.evaluate(c, runs) for c in _claims(path, mtime)]
    return pd.concat(frames, ignore_index=True)

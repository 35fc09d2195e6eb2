"""Data access for the pages: one cached mirror per process, parameterised cached queries."""

from __future__ import annotations

import json
import os

import pandas as pd
import streamlit as st

from agent.api import AdminApi, channel
from dashboard.mirror import Mirror

REFRESH_SECONDS = 5


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


@st.cache_data(ttl=REFRESH_SECONDS)
def agents(v: tuple[str, str, int]) -> pd.DataFrame:
    return mirror(*v[:2]).query(
        "SELECT name, chip, round(memory_bytes / 2^30, 1) AS memory_gib, state, status, current_job_id,"
        " to_timestamp(last_seen) AS last_seen FROM agents ORDER BY name"
    )


@st.cache_data(ttl=REFRESH_SECONDS)
def runs(v: tuple[str, str, int]) -> pd.DataFrame:
    return mirror(*v[:2]).query(
        "SELECT chip, engine, method, depth, prompt_id, repeat, position, prompt_tokens, generated_tokens,"
        " decode_tokens_per_second, prefill_tokens_per_second, ttft_seconds, peak_memory_bytes, lossless,"
        " try_cast(metrics->>'acceptance_rate' AS DOUBLE) AS acceptance_rate,"
        " sweep_id, job_id, agent_id, run_id, to_timestamp(started_at) AS started_at"
        " FROM runs ORDER BY seq"
    )


@st.cache_data(ttl=REFRESH_SECONDS)
def arm_summary(v: tuple[str, str, int]) -> pd.DataFrame:
    """Median decode tokens/s per chip, engine and arm, and its ratio to the same job's baseline."""
    return mirror(*v[:2]).query(
        """
        WITH arms AS (
            SELECT job_id, chip, engine, method, depth, median(decode_tokens_per_second) AS tps, count(*) AS n
            FROM runs WHERE method != 'verify-cost' GROUP BY ALL
        )
        SELECT a.chip, a.engine, a.method, a.depth, round(median(a.tps), 2) AS decode_tokens_per_second,
               round(median(a.tps / b.tps), 3) AS speedup, sum(a.n) AS runs
        FROM arms a JOIN arms b ON a.job_id = b.job_id AND b.method = 'baseline'
        GROUP BY ALL ORDER BY ALL
        """
    )


@st.cache_data(ttl=REFRESH_SECONDS)
def verify_cost(v: tuple[str, str, int]) -> pd.DataFrame:
    """T(M)/T(1) per chip, engine and context depth, from the latest verify-cost run of each."""
    curves = mirror(*v[:2]).query(
        "SELECT chip, engine, prompt_tokens AS context_tokens, arg_max(metrics, seq) AS metrics"
        " FROM runs WHERE method = 'verify-cost' GROUP BY ALL ORDER BY ALL"
    )
    rows = []
    for c in curves.itertuples():
        for key, value in json.loads(c.metrics).items():
            if key.endswith("_ratio"):
                rows.append(
                    {
                        "chip": c.chip,
                        "engine": c.engine,
                        "context_tokens": c.context_tokens,
                        "rows": int(key.split("_")[1]),
                        "ratio": value,
                    }
                )
    return pd.DataFrame(rows)

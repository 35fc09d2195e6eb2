"""Widgets shared by pages: the filter bar, the comparable-group selector, the sentence
about degraded runs, and the warnings about server runs' timings and warm drafters."""

from __future__ import annotations

import dataclasses

import pandas as pd
import streamlit as st

from dashboard import data
from specfleet import speedup
from specfleet.record import CHECKED_KEYS

LABELS = {
    "model": "model",
    "system": "system",
    "engine": "engine",
    "method": "method",
    "sampler": "sampler",
    "prompt_set": "prompt set",
}


def present(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` as a table shows it: a column with no value in any row (NULL, NaN, pandas' NA or "")
    dropped, and missing values blank: text columns hold "" for them, and a numeric column with
    gaps becomes its values as text (Streamlit draws a missing cell as the word "None")."""
    missing = frame.isna() | frame.apply(lambda c: c.map(lambda x: isinstance(x, str) and x == ""))
    kept = frame.loc[:, ~missing.all()]
    out = kept.copy()
    for name in kept.columns:
        gaps = missing[name]
        if not gaps.any() or pd.api.types.is_datetime64_any_dtype(kept[name]):
            continue
        out[name] = [
            ("" if gap else (f"{x:g}" if isinstance(x, float) else str(x))) for x, gap in zip(kept[name], gaps)
        ]
    return out


def filters(v, key: str) -> data.Filters:
    """Multiselects in the sidebar for model, system (system_label), engine, method, sampler and
    prompt set."""
    options = data.filter_options(v)
    chosen = {}
    with st.sidebar:
        st.subheader("Filters")
        for field, label in LABELS.items():
            chosen[field] = tuple(
                st.multiselect(label, options.get(field, []), key=f"{key}-{field}", placeholder="all")
            )
    return data.Filters(**chosen)


def comparable_group(v, f: data.Filters, key: str) -> tuple[data.Filters, pd.DataFrame]:
    """A selector of the comparable groups the filters leave, opening on the one with most
    runs; says what differs between them. Returns the filters narrowed to the chosen group
    (unchanged when there is none) and every group."""
    groups = data.groups(v, f)
    if groups.empty:
        return f, groups
    labels = dict(zip(groups["comparable"], groups["label"]))
    chosen = st.selectbox(
        "comparable group",
        list(labels),
        format_func=lambda g: labels.get(g, g),
        key=key,
        help=f"Runs are pooled only when equal on every checked key: {', '.join(CHECKED_KEYS)}."
        " Every figure below uses the chosen group only.",
    )
    system = groups.loc[groups["comparable"] == chosen, "system_label"]
    if len(system):
        st.caption(f"System under test: **{system.iloc[0]}**. Groups of two systems are never pooled.")
    differs = speedup.what_differs(groups)
    if differs:
        st.caption(
            f"{len(groups)} comparable groups in these filters, never pooled: they differ in {', '.join(differs)}."
            " Every figure below is the chosen group's."
        )
        with st.expander("What differs between the groups"):
            st.dataframe(groups[["comparable", "label", "chips", *differs]], hide_index=True)
    return dataclasses.replace(f, comparable=chosen), groups


def server_flags(v, f: data.Filters) -> None:
    """Say, as lossy runs are said, which server runs' timings disagree and which drafters
    were warm; both stay in the figures."""
    for r in data.timings_disagree(v, f).itertuples():
        st.warning(
            f"Timings disagree on {r.chip} · {r.system_method}{' K=' + str(r.depth) if r.depth else ''}:"
            f" {r.runs} run(s) whose decode tok/s as the client timed it and as the server reports it differ by"
            f" more than 5% (medians {r.client_tokens_per_second:.3g} and {r.server_tokens_per_second:.3g} tok/s)."
            " Figures here are the client's."
        )
    for r in data.warm_drafters(v, f).itertuples():
        st.warning(
            f"Warm drafter on {r.chip} · {r.system_method}{' K=' + str(r.depth) if r.depth else ''}: {r.runs} run(s)"
            " started with drafter state inherited from earlier requests (drafter_warm); a fresh server's"
            " acceptance and speed may be lower. They stay in the figures."
        )


def nominal_note(counts: dict[str, int]) -> None:
    """Say, never hide, which runs were left out and which had no reading."""
    if counts.get("degraded"):
        st.warning(
            f"{counts['degraded']} run(s) flagged thermally or power degraded (env_nominal = false) are excluded"
            " from every figure here; the Runs page lists them."
        )
    if counts.get("unknown"):
        st.caption(
            f"{counts['unknown']} run(s) carry no environment reading (env_nominal unknown): counted as nominal."
        )

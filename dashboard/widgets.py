"""Widgets shared by pages: the filter bar, the comparable-group selector, and the sentence
about degraded runs."""

from __future__ import annotations

import dataclasses

import pandas as pd
import streamlit as st

from dashboard import data
from specfleet import speedup
from specfleet.record import CHECKED_KEYS

LABELS = {"model": "model", "engine": "engine", "method": "method", "sampler": "sampler", "prompt_set": "prompt set"}


def filters(v, key: str) -> data.Filters:
    """Multiselects in the sidebar for model, engine, method, sampler and prompt set."""
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
    differs = speedup.what_differs(groups)
    if differs:
        st.caption(
            f"{len(groups)} comparable groups in these filters, never pooled: they differ in {', '.join(differs)}."
            " Every figure below is the chosen group's."
        )
        with st.expander("What differs between the groups"):
            st.dataframe(groups[["comparable", "label", "chips", *differs]], hide_index=True)
    return dataclasses.replace(f, comparable=chosen), groups


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

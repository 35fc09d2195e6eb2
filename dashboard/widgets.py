"""Widgets shared by pages: the filter bar, and the sentence about degraded runs."""

from __future__ import annotations

import streamlit as st

from dashboard import data

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


def nominal_note(counts: dict[str, int]) -> None:
    """Say, never hide, which runs were left out and which had no reading."""
    if counts.get("degraded"):
        st.warning(
            f"{counts['degraded']} run(s) flagged thermally or power degraded (env.nominal = false) are excluded"
            " from every figure here; the Runs page lists them."
        )
    if counts.get("unknown"):
        st.caption(
            f"{counts['unknown']} run(s) carry no env.nominal reading (agents before the thermal check):"
            " counted as nominal."
        )

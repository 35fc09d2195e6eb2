"""Overview: the fleet's agents, and every result with a plot of decode speed per arm."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import data


def render() -> None:
    st.title("specfleet")
    sync = data.version()

    st.header("Agents")
    agents = data.agents(sync)
    if agents.empty:
        st.info("No agent has enrolled yet: `specfleet token create`, then `specfleet agent enrol` on a Mac.")
    else:
        st.dataframe(agents, hide_index=True)

    st.header("Results")
    summary = data.arm_summary(sync)
    if summary.empty:
        st.info("No results yet: submit a sweep with `specfleet sweep submit FILE`.")
        return
    summary["arm"] = summary["method"] + summary["depth"].map(lambda d: f" K={d}" if d else "")
    chart = (
        alt.Chart(summary)
        .mark_bar()
        .encode(
            x=alt.X("arm:N", title=None),
            y=alt.Y("decode_tokens_per_second:Q", title="decode tokens/s (median)"),
            color=alt.Color("chip:N", title="chip"),
            xOffset="chip:N",
            column=alt.Column("engine:N", title="engine"),
            tooltip=["chip", "engine", "arm", "decode_tokens_per_second", "speedup", "runs"],
        )
        .properties(width=260, height=260)
    )
    st.altair_chart(chart)
    st.subheader("Median per arm")
    st.dataframe(summary.drop(columns=["arm"]), hide_index=True)
    st.subheader("Runs")
    st.dataframe(data.runs(sync), hide_index=True)

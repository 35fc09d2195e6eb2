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
    summary["arm"] = (
        summary["engine"] + " · " + summary["method"] + summary["depth"].map(lambda d: f" K={d}" if d else "")
    )
    chart = (
        alt.Chart(summary)
        .mark_bar()
        .encode(
            x=alt.X("arm:N", title=None, axis=alt.Axis(labelAngle=-30, labelOverlap=False, labelLimit=240)),
            y=alt.Y("decode_tokens_per_second:Q", title="decode tokens/s (median)"),
            color=alt.Color("chip:N", title="chip"),
            xOffset="chip:N",
            tooltip=["chip", "engine", "arm", "decode_tokens_per_second", "speedup", "runs"],
        )
        .properties(height=300)
    )
    st.altair_chart(chart)

    curves = data.verify_cost(sync)
    if not curves.empty:
        st.subheader("Verify cost: forward time for M query rows over one row")
        st.caption("Speculation with depth K can only pay where T(K+1)/T(1) stays well below K+1.")
        curves["series"] = (
            curves["chip"] + " · " + curves["engine"] + " · " + curves["context_tokens"].map(lambda c: f"{c} ctx")
        )
        st.altair_chart(
            alt.Chart(curves)
            .mark_line(point=True)
            .encode(
                x=alt.X("rows:O", title="query rows M", axis=alt.Axis(labelAngle=0)),
                y=alt.Y("ratio:Q", title="T(M) / T(1)"),
                color=alt.Color("series:N", title=None),
                tooltip=["chip", "engine", "context_tokens", "rows", "ratio"],
            )
            .properties(width=560, height=260)
        )
    st.subheader("Median per arm")
    st.dataframe(summary.drop(columns=["arm"]), hide_index=True)
    st.subheader("Runs")
    st.dataframe(data.runs(sync), hide_index=True)

"""Compare: chips side by side, every figure with the machines and runs behind it."""

import streamlit as st

from dashboard import data, plots, widgets


def chart_section(frame, chart, empty: str | None, details: str = "Figures, machines and runs") -> None:
    """A chart of `frame` with its table folded beneath, or a note saying why there is none."""
    if frame.empty:
        if empty:
            st.info(empty)
        return
    st.altair_chart(chart(frame, chips))
    with st.expander(details):
        st.dataframe(frame, hide_index=True)


st.title("Compare chips")
v = data.version()
f = widgets.filters(v, "compare")
chips = data.chips(v)
speedups = data.speedups(v, f)
if data.all_runs(v).empty:
    st.info("No results yet: submit a sweep with `specfleet sweep submit FILE`.")
    st.stop()
widgets.nominal_note(data.nominal_counts(v, f))
if len(f.model) != 1 and data.filter_options(v)["model"][1:]:
    st.caption("Several models are pooled below; choose one model in the filters to compare like with like.")

st.header("Speedup over the baseline against draft depth")
st.caption(
    "Median of paired ratios (arm over baseline, same prompt and repeat on one machine); bands are 95%"
    " bootstrap intervals over machines and runs. Below the dashed line speculation loses."
)
if speedups.empty:
    st.info("No arm with a baseline in these filters.")
else:
    st.altair_chart(plots.speedup_vs_depth(speedups, chips))
    st.dataframe(speedups, hide_index=True)

st.header("Decode tokens/s per chip and method")
chart_section(data.decode_speed(v, f), plots.decode_speed, None)

st.header("Acceptance by draft position")
for r in data.collapsed_acceptance(v, f).itertuples():
    st.warning(f"Acceptance collapsed on {r.chip} · {r.engine} · {r.method} · {r.model}: {r.runs} run(s). {r.reason}")
chart_section(
    data.acceptance_by_position(v, f),
    plots.acceptance_by_position,
    "No speculative run with acceptance by position in these filters.",
)

st.header("Draft versus verify time")
chart_section(
    data.draft_verify(v, f), plots.draft_verify, "No speculative run with draft and verify times in these filters."
)

st.header("Verify cost: T(M)/T(1) per chip")
st.caption("Forward time for M query rows over one row. Depth K can only pay where T(K+1)/T(1) stays well below K+1.")
chart_section(
    data.verify_cost(v),
    plots.verify_cost,
    "No verify-cost run yet: add `verify_cost:` to a sweep.",
    "Figures and machines",
)

st.header("Share of the memory-bandwidth roofline")
st.caption("Baseline decode tok/s × bytes read per token (the model's size) / the chip's memory bandwidth.")
roof = data.roofline(v, f)
if roof.empty:
    st.info("No baseline run in these filters.")
else:
    missing = roof[roof["why"] != ""]
    if not roof.dropna(subset=["share"]).empty:
        st.altair_chart(plots.roofline(roof, chips))
    for r in missing.itertuples():
        st.warning(f"Roofline share not available for {r.chip} · {r.engine} · {r.model}: {r.why}.")
    st.dataframe(roof, hide_index=True, column_config={"share": st.column_config.NumberColumn(format="percent")})

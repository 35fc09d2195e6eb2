"""Compare: chips side by side inside one comparable group (one system: the system under test is
a checked key), every figure with the machines, prompts and pairs or runs behind it. Runs that
differ in a checked key are never pooled. Server runs show the server's own figures, version
and command beside the client's; disagreeing timings and warm drafters are flagged."""

import pandas as pd
import streamlit as st

from dashboard import data, plots, widgets
from specfleet import variance, versions


def chart_section(frame, chart, empty: str | None, details: str = "Figures, machines, prompts and runs") -> None:
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
if not data.run_count(v):
    st.info("No results yet: submit a sweep with `specfleet sweep submit FILE`.")
    st.stop()
f, groups = widgets.comparable_group(v, f, "compare-group")
if groups.empty:
    st.info("No run in these filters.")
    st.stop()
widgets.nominal_note(data.nominal_counts(v, f))

st.header("Speedup over the baseline against draft depth")
st.caption(
    "specfleet's one speedup: arm over baseline decode tok/s on the same attempt, prompt and repeat,"
    " as a geometric mean over repeats, then prompts, then machines. Bands are the 95% interval the verdicts"
    " use (t over machine means). Below the dashed line speculation loses."
)
speedups = data.speedups(v, f)
for r in data.lossy_runs(v, f).itertuples():
    st.error(
        f"Engine defect on {r.chip} · {r.system_label} · {r.method} K={r.depth}: {r.runs} run(s) changed the output"
        f" against the {r.checked_against}; they are left out of every speedup."
    )
widgets.server_flags(v, f)
for column, what in (
    (
        "stalled_runs",
        "stalled run(s) (under half the median speed of their arm's repeats on the prompt), kept in the figures",
    ),
    ("near_tie_runs", "run(s) diverged at a near-tie (batch numerics flip two nearly tied tokens): kept, labelled"),
):
    if column in speedups and speedups[column].sum():
        st.warning(f"{int(speedups[column].sum())} {what}.")
if speedups.empty:
    st.info("No arm with a baseline in this group.")
else:
    st.altair_chart(plots.speedup_vs_depth(speedups, chips))
    st.dataframe(speedups, hide_index=True)

st.header("Decode tokens/s per chip and method")
chart_section(data.decode_speed(v, f), plots.decode_speed, None)

st.header("The chip apart from the unit")
st.caption(
    "Variance components of log decode speed and log speedup (statsmodels MixedLM, REML): chip, machine within"
    " chip, prompt and residual, as the typical difference they make (a standard deviation on the log scale,"
    " exp(s) − 1), with 95% Satterthwaite intervals. 'Units differ by' is the machine-within-chip term, one for"
    " every chip of the group; 'chips by' the chip term. The difference of two chips (pooled t over machine means)"
    " exceeds the unit-to-unit spread when its whole interval lies beyond the range of 95% of the differences"
    " between two units of one chip (±1.96·√2·s_machine). docs/variance.md."
)
unit_table = data.chip_components(v, f)
if unit_table.empty:
    st.info("No figure with machines and prompts in this group.")
unit_pairs = data.chip_pairs(v, f)
NO_LEVELS = pd.DataFrame(columns=["chip", "value", "machines"])
levels_of = dict(iter(data.chip_levels(v, f).groupby(list(data.UNIT_FIGURE), sort=False)))
pairs_of = dict(iter(unit_pairs.groupby(list(data.UNIT_FIGURE), sort=False)))
for key, table in unit_table.groupby(list(data.UNIT_FIGURE), sort=False):
    comparable, figure, method, depth = key
    st.subheader(f"{figure} · {method}{f' K={depth}' if depth else ''}")
    unit = "x" if figure == versions.SPEEDUP else " tok/s"
    levels, pairs = levels_of.get(key, NO_LEVELS), pairs_of.get(key, unit_pairs.iloc[:0])
    lines = [
        variance.sentence(r.chip, f"{r.value:.3g}{unit} ({r.machines} machine(s))", table) for r in levels.itertuples()
    ]
    st.markdown("\n".join(f"- {line}" for line in lines))
    ranked = list(levels["chip"])
    for lower, higher in zip(ranked[1:], ranked):
        row = pairs[(pairs["chip_a"] == min(lower, higher)) & (pairs["chip_b"] == max(lower, higher))]
        if len(row):
            st.caption(variance.pair_sentence(next(row.itertuples()), over=higher))
if not unit_table.empty:
    with st.expander("Components, intervals and every pair of chips"):
        st.dataframe(unit_table, hide_index=True)
        st.dataframe(unit_pairs, hide_index=True)

st.header("Tokens per joule beside tokens per second")
spent = data.energy(v, f)
if spent.empty:
    st.caption(
        "No run here recorded the energy it drew: its machine had no readable counter (NVML on NVIDIA, RAPL on"
        " Linux CPUs, IOReport on macOS; agent/energy.py). None is estimated."
    )
else:
    st.caption(
        "Median tokens per joule of generation (the counter's energy over the run), beside decode tok/s; on Macs"
        " the shares of it on the CPU, GPU, Neural Engine and DRAM (IOReport)."
    )
    st.dataframe(spent, hide_index=True)

servers = data.server_figures(v, f)
if not servers.empty:
    st.header("The server's own figures beside the client's")
    st.caption(
        "Server runs are measured as a client sees them (streamed tokens timed as they arrive); beside them, the"
        " decode tok/s the server itself reports (llama-server's timings), its version and its command line."
        " Runs more than 5% apart are flagged above."
    )
    st.dataframe(servers, hide_index=True)

st.header("Acceptance by draft position")
for r in data.collapsed_acceptance(v, f).itertuples():
    st.warning(f"Acceptance collapsed on {r.chip} · {r.engine} · {r.method} · {r.model}: {r.runs} run(s). {r.reason}")
chart_section(
    data.acceptance_by_position(v, f),
    plots.acceptance_by_position,
    "No speculative run with acceptance by position in this group.",
)

st.header("Draft versus verify time")
chart_section(
    data.draft_verify(v, f), plots.draft_verify, "No speculative run with draft and verify times in this group."
)

st.header("Verify cost: T(M)/T(1) per chip")
st.caption(
    "Forward time for M query rows over one row, for this group's target model, engine and engine version,"
    " at each context depth measured. Depth K can only pay where T(K+1)/T(1) stays well below K+1."
)
chart_section(
    data.verify_cost(v, f),
    plots.verify_cost,
    "No verify-cost run for this group's model yet: add `verify_cost:` to a sweep.",
    "Figures and machines",
)

st.header("Share of the memory-bandwidth roofline")
st.caption("Baseline decode tok/s × bytes read per token (the model's size) / the chip's memory bandwidth.")
roof = data.roofline(v, f)
if roof.empty:
    st.info("No baseline run in this group.")
else:
    missing = roof[roof["why"] != ""]
    if not roof.dropna(subset=["share"]).empty:
        st.altair_chart(plots.roofline(roof, chips))
    for r in missing.itertuples():
        st.warning(f"Roofline share not available for {r.chip} · {r.engine} · {r.model}: {r.why}.")
    st.dataframe(roof, hide_index=True, column_config={"share": st.column_config.NumberColumn(format="percent")})

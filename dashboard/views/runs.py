"""Runs: every run with every recorded field (the typed run record) and the names it goes by (the
system and method it measured, its flags), server runs' own figures, version and command beside
the client's; CSV and Parquet downloads."""

import streamlit as st

from dashboard import data, widgets

st.title("Runs")
v = data.version()
f = widgets.filters(v, "runs")
runs = data.runs_table(v, f)
if runs.empty:
    st.info("No results yet: submit a sweep with `specfleet sweep submit FILE`.")
    st.stop()

chips = st.multiselect("chip", sorted(runs["chip"].unique()), placeholder="all", key="runs-chip")
states = st.multiselect("environment", ["nominal", "unknown", "degraded"], placeholder="all", key="runs-nominal")
if chips:
    runs = runs[runs["chip"].isin(chips)]
if states:
    runs = runs[runs["nominal"].isin(states)]
widgets.nominal_note(runs["nominal"].value_counts().to_dict())
flagged = {
    "lossy": "changed the output against their reference: engine defects, in no speedup",
    "timings disagree": "were timed more than 5% apart by the client and by the server (timings_disagree)",
    "warm drafter": "started with drafter state inherited from earlier requests (drafter_warm)",
}
for flag, said in flagged.items():
    n = int(runs["flags"].str.contains(flag, regex=False).sum())
    if n:
        st.warning(f"{n} run(s) {said}: flagged `{flag}` in the flags column.")
st.caption(f"{len(runs)} run(s) on {runs['agent_id'].nunique()} machine(s), {runs['chip'].nunique()} chip(s).")
st.dataframe(runs, hide_index=True)

csv, parquet = data.downloads(runs)
c1, c2 = st.columns(2)
c1.download_button("Download CSV", csv, file_name="runs.csv", mime="text/csv")
c2.download_button("Download Parquet", parquet, file_name="runs.parquet", mime="application/vnd.apache.parquet")

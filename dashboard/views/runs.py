"""Runs: every run with every recorded field (the typed run record) and the names it goes by (the
system and method it measured, its flags), server runs' own figures, version and command beside
the client's; the latest runs of the selection in the table, every one of them in the CSV and
Parquet downloads."""

import streamlit as st

from dashboard import data, widgets

SAMPLES_SHOWN = 50  # text samples on the page; every run's is in the table and the downloads

st.title("Runs")
v = data.version()
f = widgets.filters(v, "runs")
every = data.runs_summary(v, f)
if not every.get("runs"):
    st.info("No results yet: submit a sweep with `specfleet sweep submit FILE`.")
    st.stop()

chips = tuple(st.multiselect("chip", every["chip_options"], placeholder="all", key="runs-chip"))
states = tuple(st.multiselect("environment", ["nominal", "unknown", "degraded"], placeholder="all", key="runs-nominal"))
summary = data.runs_summary(v, f, chips, states)
widgets.nominal_note({k: summary[k] for k in ("nominal", "unknown", "degraded") if summary[k]})
flagged = {
    "lossy": "changed the output against their reference: engine defects, in no speedup",
    "near-tie": "diverged at a near-tie (the target's top two tokens closer than batch numerics move them):"
    " kept in the speedups, labelled",
    "stall": "stalled (under half the median speed of their arm's repeats on the prompt): counted, kept in the figures",
    "cannot draft": "ran a drafter whose settings cannot draft within max_new_tokens (drafter_warning)",
    "timings disagree": "were timed more than 5% apart by the client and by the server (timings_disagree)",
    "warm drafter": "started with drafter state inherited from earlier requests (drafter_warm)",
}
for flag, said in flagged.items():
    if summary[flag]:
        st.warning(f"{summary[flag]} run(s) {said}: flagged `{flag}` in the flags column.")
shown = data.runs_table(v, f, chips, states)
latest = f"; the table shows the latest {len(shown)}, the downloads all" if len(shown) < summary["runs"] else ""
st.caption(f"{summary['runs']} run(s) on {summary['machines']} machine(s), {summary['chips']} chip(s){latest}.")
st.dataframe(shown, hide_index=True)

samples = shown[shown["text_sample"].fillna("") != ""] if "text_sample" in shown else shown.iloc[0:0]
if not samples.empty:
    first = samples.drop_duplicates(["system_method", "prompt_id"])
    with st.expander(f"Text samples: the first 512 characters of the output, per prompt and arm ({len(first)})"):
        for r in first.head(SAMPLES_SHOWN).itertuples():
            said = {"near-tie": " · diverged at a near-tie", "defect": " · diverged: a defect"}.get(r.divergence, "")
            st.caption(f"{r.system_method} · {r.model} · {r.prompt_id} · repeat {r.repeat}{said}")
            st.text(r.text_sample)


def download(fmt: str):
    return lambda: data.runs_download(v, f, chips, states, fmt)


c1, c2 = st.columns(2)
c1.download_button("Download CSV", download("csv"), file_name="runs.csv", mime="text/csv")
c2.download_button(
    "Download Parquet", download("parquet"), file_name="runs.parquet", mime="application/vnd.apache.parquet"
)

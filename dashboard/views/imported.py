"""Imported: figures people measured with llama-bench or MTPLX and imported with `specfleet
import`, with their provenance, beside the fleet's. Marked imported and unpaired: they are in
no speedup and no verdict."""

import streamlit as st

from dashboard import data, imported

st.title("Imported results")
v = data.version()
rows = imported.imported_results(v)
if rows.empty:
    st.info(
        "Nothing imported yet: `specfleet import llama-bench results.json` (json, jsonl, csv or sql) or "
        "`specfleet import mtplx RUN_DIR` (a `mtplx bench run` directory)."
    )
    st.stop()

st.warning(
    "Imported figures are unpaired: each was measured by its own tool on its own machine, with no baseline "
    "run beside it in the same thermal window. They are shown for reading only and never pooled into the "
    "fleet's speedups or the claims' verdicts."
)
tools = st.multiselect("tool", sorted(rows["tool"].unique()), placeholder="all", key="imported-tool")
if tools:
    rows = rows[rows["tool"].isin(tools)]
st.caption(
    f"{len(rows)} imported figure(s) from {rows['source_file'].nunique()} file(s), "
    f"imported by {', '.join(sorted(rows['imported_by'].unique()))}."
)
st.dataframe(rows, hide_index=True)

st.subheader("Beside the fleet's figures")
side = imported.side_by_side(v)
st.dataframe(side, hide_index=True)
st.bar_chart(side, x="model", y="tokens_per_second", color="source", stack=False)

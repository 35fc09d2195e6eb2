"""Sweeps: progress per sweep (cells done, failed or refused with reasons, in flight)."""

import streamlit as st

from dashboard import data

st.title("Sweeps")
v = data.version()
sweeps = data.sweeps(v)
if sweeps.empty:
    st.info("No sweep yet: `specfleet sweep submit sweep.yaml` (see the README for the file).")
    st.stop()

failures = data.failures(v)
for s in sweeps.itertuples():
    st.subheader(f"{s.name} · {s.state}")
    st.progress(
        float(s.progress),
        text=f"{s.done} of {s.jobs} cells done · {s.failed} failed · {s.refused} refused · "
        f"{s.in_flight} in flight · {s.queued} queued · {s.cancelled} cancelled · {s.runs} runs",
    )
    for line in s.uncovered if s.uncovered is not None else ():
        st.warning(f"Not run: {line}")
    mine = failures[failures["sweep_id"] == s.sweep_id] if not failures.empty else failures
    if not mine.empty:
        st.error(f"{len(mine)} cell(s) failed in {s.name}:")
        st.dataframe(mine.drop(columns=["sweep_id"]), hide_index=True)
st.subheader("All sweeps")
st.dataframe(sweeps, hide_index=True, column_config={"progress": st.column_config.ProgressColumn("progress")})

"""Fleet: every agent with its chip, GPU bin, memory, macOS, state, current job and last contact;
a reading no agent has (a Linux box has no GPU bin or model identifier) is no column, one that
some agents lack is a blank cell."""

import streamlit as st

from dashboard import data, widgets

st.title("Fleet")
v = data.version()
agents = data.agents(v)
if agents.empty:
    st.info("No agent has enrolled yet: `specfleet token create`, then `specfleet agent enrol` on a Mac.")
    st.stop()

busy = int((agents["state"] == "busy").sum())
c1, c2, c3 = st.columns(3)
c1.metric("agents", len(agents))
c2.metric("chips", agents["chip"].nunique())
c3.metric("busy now", busy)
st.dataframe(
    widgets.present(agents.drop(columns=["agent_id"])),
    hide_index=True,
    column_config={
        "gpu_cores": st.column_config.NumberColumn("GPU cores (bin)"),
        "memory_gib": st.column_config.NumberColumn("memory (GiB)"),
        "os_version": "OS version",
        "model_identifier": "model",
        "bandwidth_gb_per_s": st.column_config.NumberColumn("bandwidth (GB/s)"),
        "current_job_id": "current job",
        "last_seen": st.column_config.DatetimeColumn("last seen", format="YYYY-MM-DD HH:mm:ss"),
    },
)
st.subheader("Machines per chip")
st.dataframe(
    agents.groupby(["chip", "gpu_cores"], dropna=False).size().rename("machines").reset_index(), hide_index=True
)

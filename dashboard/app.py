"""The specfleet dashboard: `specfleet dashboard` (or `streamlit run dashboard/app.py`)."""

import streamlit as st

from dashboard.pages import overview

st.set_page_config(page_title="specfleet", layout="wide")
st.navigation([st.Page(overview.render, title="Overview", url_path="overview", default=True)]).run()

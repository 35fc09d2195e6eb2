"""The specfleet dashboard: `specfleet dashboard` (or `streamlit run dashboard/app.py`).

Each page under views/ only arranges widgets and charts; data comes from dashboard/data.py.
Every page has its own address (/fleet, /sweeps, ...); `/` is a hidden page that switches to
the Fleet page (Streamlit serves its default page at `/` only, so a default Fleet page left
/fleet a "Page not found"). A coordinator that cannot be reached or refuses the credential is
said in one line (data.CoordinatorUnavailable) and the page tries again by itself, every
RETRY_SECONDS, until it can read it."""

import streamlit as st

from dashboard import data

RETRY_SECONDS = 3.0

st.set_page_config(page_title="specfleet", layout="wide")
fleet = st.Page("views/fleet.py", title="Fleet", url_path="fleet")
pages = [
    fleet,
    st.Page("views/sweeps.py", title="Sweeps", url_path="sweeps"),
    st.Page("views/compare.py", title="Compare", url_path="compare"),
    st.Page("views/versions.py", title="Versions", url_path="versions"),
    st.Page("views/questions.py", title="Questions", url_path="questions"),
    st.Page("views/runs.py", title="Runs", url_path="runs"),
    st.Page("views/imported.py", title="Imported", url_path="imported"),
]
home = st.Page(lambda: st.switch_page(fleet), title="Fleet", url_path="", default=True, visibility="hidden")
page = st.navigation([home, *pages])


@st.fragment(run_every=RETRY_SECONDS)
def retry() -> None:
    """Every RETRY_SECONDS while the coordinator is unavailable: the whole page again once it is not."""
    try:
        data.version()
    except data.CoordinatorUnavailable:
        return
    st.rerun(scope="app")


try:
    page.run()
except data.CoordinatorUnavailable as e:
    st.error(str(e), icon=":material/cloud_off:")
    retry()

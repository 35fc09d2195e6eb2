"""The specfleet dashboard: `specfleet dashboard` (or `streamlit run dashboard/app.py`).

Each page under views/ only arranges widgets and charts; data comes from dashboard/data.py."""

import streamlit as st

st.set_page_config(page_title="specfleet", layout="wide")
st.navigation(
    [
        st.Page("views/fleet.py", title="Fleet", url_path="fleet", default=True),
        st.Page("views/sweeps.py", title="Sweeps", url_path="sweeps"),
        st.Page("views/compare.py", title="Compare", url_path="compare"),
        st.Page("views/versions.py", title="Versions", url_path="versions"),
        st.Page("views/questions.py", title="Questions", url_path="questions"),
        st.Page("views/runs.py", title="Runs", url_path="runs"),
        st.Page("views/imported.py", title="Imported", url_path="imported"),
    ]
).run()

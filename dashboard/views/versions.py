"""Versions: what changed between versions of an engine or system (llama.cpp commit, mlx and
mlx-lm versions, a server's build), per chip, on every setting measured under two or more of
them. Ratios new / old of decode tok/s per arm, of the speedup and of the acceptance rate,
paired by machine where the same machines ran both, with the verdicts' interval; a regression
or gain is called only when the whole interval lies beyond the tolerance (specfleet/versions.py)."""

import streamlit as st

from dashboard import data, plots, widgets
from specfleet import versions

st.title("Versions")
v = data.version()
f = widgets.filters(v, "versions")
chips = data.chips(v)
if not data.run_count(v):
    st.info("No results yet: submit a sweep with `specfleet sweep submit FILE`.")
    st.stop()
settings = data.version_settings(v, f)
if settings.empty:
    st.info(
        "No setting in these filters was measured under two versions of its engine or system. Run the same sweep"
        " after upgrading llama.cpp, mlx or a server (a llama-server per arm: pin its binary in the sweep)."
    )
    st.stop()
tolerance = st.slider("Tolerance (%)", 1.0, 10.0, versions.TOLERANCE * 100, 0.5, key="versions-tolerance") / 100
st.caption(
    "Ratio of each figure between consecutive versions (in the order they were first measured), per chip. Paired:"
    " each machine that ran both versions is compared with itself, prompt by prompt, and the interval is the"
    " verdicts' (t over machine means, 95%); machines that ran one version only are left out (counted). With no"
    " machine in common the interval is Welch's t over machine means (wider). A regression or gain is called only"
    f" when the whole interval lies beyond ±{tolerance:.1%} (after the false-discovery step over every row shown);"
    " unchanged when it lies inside. Conbench and Bencher call a change on statistical distance alone; here it must"
    " also exceed the tolerance. Acceptance is judged as the mean of the runs' rates, prompt by prompt; beside it,"
    " pooled_old and pooled_new are accepted / drafted over all of each version's runs (the ratio llama-server"
    " reports), shown and not judged."
)
st.dataframe(settings, hide_index=True)
rows = data.version_changes(v, f, tolerance)
called = versions.summary(rows)
if called.empty:
    st.success("No regression and no gain beyond the tolerance.")
for r in called.itertuples():
    say = st.error if r.change == versions.REGRESSION else st.success
    say(
        f"{r.change.capitalize()} on {r.chip}: {r.old} → {r.new} (setting {r.setting}): {r.figures};"
        f" ratios {r.lowest_ratio:.3f}–{r.highest_ratio:.3f}."
    )
for setting in settings.itertuples():
    shown = rows[rows["setting"] == setting.setting]
    if shown.empty:
        continue
    st.header(f"{setting.system_label} · {setting.model} · {setting.prompt_set} · {setting.sampler}")
    st.caption(f"Setting {setting.setting}: {setting.versions}")
    st.altair_chart(plots.version_changes(shown, chips))
    with st.expander("Ratios, intervals, machines and why"):
        st.dataframe(shown, hide_index=True)

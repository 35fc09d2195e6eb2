"""Questions: every claim of the ledger settled per comparable group and chip from the fleet's runs."""

import streamlit as st

from coordinator.sweeps import SweepError, parse_sweep
from dashboard import claims as ledger
from dashboard import data, stats

BADGE = {
    stats.REPRODUCED: ":green-badge[reproduced]",
    stats.CONTRADICTED: ":red-badge[contradicted]",
    stats.NOT_ENOUGH: ":gray-badge[not enough data]",
}

st.title("Open questions")
st.caption(
    "Each claim from the field is checked per comparable group and chip against the fleet's measurements:"
    " reproduced, contradicted, or not enough data, with the measured figure (specfleet's one speedup for"
    " ratios), its 95% interval and the machines, prompts and pairs behind it. Runs that differ in a checked"
    f" key are never pooled. Add a claim by adding a record to {data.ledger_path()}."
)
try:
    claims = data.claims()
except ledger.ClaimError as e:
    st.error(f"The claims ledger {data.ledger_path()} has mistakes:\n\n" + "\n".join(f"- {p}" for p in e.problems))
    st.stop()
v = data.version()
verdicts = data.verdicts(v)
counts = verdicts["verdict"].value_counts()
c1, c2, c3 = st.columns(3)
c1.metric("reproduced", int(counts.get(stats.REPRODUCED, 0)))
c2.metric("contradicted", int(counts.get(stats.CONTRADICTED, 0)))
c3.metric("not enough data", int(counts.get(stats.NOT_ENOUGH, 0)))
st.dataframe(verdicts, hide_index=True)

for claim in claims:
    st.subheader(claim.statement)
    st.caption(f"`{claim.id}` · {claim.source['file']}, {claim.source['section']}: “{claim.source.get('quote', '')}”")
    c = claim.conditions
    st.markdown(
        f"expected **{claim.expected}** · metric {claim.metric} · {c['engine']} · {c['method']}"
        f" · depth {', '.join(map(str, claim.depths))} · model {c.get('model_family') or 'any'}"
        f" {c.get('quantisation') or ''} · chip {c.get('chip') or 'any'} · sampler {c.get('sampler') or 'any'}"
    )
    mine = verdicts[verdicts["claim"] == claim.id]
    groups = sorted(set(mine["group"]) - {""})
    if len(groups) > 1:
        st.caption(
            f"{len(groups)} comparable groups match, settled apart and never pooled; each row names its values"
            " of the checked keys in which they differ."
        )
    unit = "run(s)" if claim.metric in ("acceptance_rate", "runs") else "pair(s)"
    for r in mine.itertuples():
        figure = "" if r.runs == 0 or r.figure != r.figure else f" · **{r.figure:.3g}**"
        interval = "" if r.ci_low != r.ci_low else f" [{r.ci_low:.3g}, {r.ci_high:.3g}]"
        excluded = f" · {r.excluded_runs} degraded {unit} excluded" if r.excluded_runs else ""
        group = f" · group {r.group} ({r.differs})" if r.differs else ""
        st.markdown(
            f"**{r.chip}**: {BADGE[r.verdict]}{figure}{interval} · {r.machines} machine(s), {r.prompts} prompt(s),"
            f" {r.runs} {unit}{excluded}{group} · {r.why}"
        )
    if claim.note:
        st.caption(claim.note)
    with st.expander("Sweep that would test it"):
        text = ledger.sweep_yaml(claim)
        try:
            parse_sweep(text)
        except SweepError as e:
            st.warning("The coordinator refuses this sweep today: " + "; ".join(e.problems))
        st.code(text, language="yaml")
        st.download_button("Download sweep file", text, file_name=f"claim-{claim.id}.yaml", key=f"sweep-{claim.id}")

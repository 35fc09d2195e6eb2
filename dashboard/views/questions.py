"""Questions: every claim of the ledger settled per comparable group and chip from the fleet's runs of
the system it names; our loop of the same method on the same weights beside it, never as it."""

import re

import streamlit as st

from dashboard import claims as ledger
from dashboard import data
from specfleet import inference

BADGE = {
    inference.REPRODUCED: ":green-badge[reproduced]",
    inference.CONTRADICTED: ":red-badge[contradicted]",
    inference.INCONCLUSIVE: ":gray-badge[inconclusive]",
}
# An inconclusive verdict the data could not have settled (too few machines or runs, no run
# of the system, no interval) is told apart from one whose interval reaches across the band.
NOT_ENOUGH = ":gray-badge[inconclusive: not enough data]"
# "inconclusive: 1 of 3 machines" (or prompts, runs): the rule's minimum, not yet reached
SHORT = re.compile(r"^inconclusive: (\d+ of \d+ (?:machines|prompts|runs))")


def badge(verdict: str, tested: bool, why: str = "") -> str:
    if verdict != inference.INCONCLUSIVE or tested:
        return BADGE[verdict]
    short = SHORT.match(why)
    return f":gray-badge[inconclusive: {short.group(1)}]" if short else NOT_ENOUGH


st.title("Open questions")
st.caption(
    "Each claim from the field is checked per comparable group and chip against the fleet's measurements:"
    " reproduced when the 95% interval (t over machine means) lies inside the claim's tolerance band,"
    " contradicted when it lies wholly outside, inconclusive otherwise. A verdict needs at least"
    f" {ledger.MIN_MACHINES_NAMED_CHIP} machines of a chip and {ledger.MIN_PROMPTS} prompts on each (the fewest"
    " whose simulated wrong-verdict rate stays at 2.5%); with fewer, the figure is shown and the verdict reads"
    " 'inconclusive: N of M machines'. Acceptance rates are judged the same way. Every verdict then goes through"
    " the false-discovery step across the whole ledger"
    f" (Benjamini-Hochberg, q {ledger.FDR_Q:g}): the verdict that stands is shown beside the raw one."
    " Conditions select runs exactly (system, model reference, quantisation, sampler, prompts); runs that differ"
    " in a checked key are never pooled. A claim about MTPLX, OptiQ or llama-server is settled by runs of that"
    " system only; our own loop of the same method on the same weights is shown beside it, never as the verdict."
    " A server arm's runs and their baselines are measured in one server state (warm or fresh, a checked key);"
    " runs whose warm-up reached its cap without two runs within 5% are counted and flagged (⚠)."
    f" Add a claim by adding a record to {data.ledger_path()}."
)
try:
    claims = data.claims()
except ledger.ClaimError as e:
    st.error(f"The claims ledger {data.ledger_path()} has mistakes:\n\n" + "\n".join(f"- {p}" for p in e.problems))
    st.stop()
v = data.version()
verdicts = data.verdicts(v)
selections = data.selections(v)
sweeps = data.claim_sweeps()
counts = verdicts["adjusted_verdict"].value_counts()
c1, c2, c3 = st.columns(3)
c1.metric("reproduced", int(counts.get(inference.REPRODUCED, 0)))
c2.metric("contradicted", int(counts.get(inference.CONTRADICTED, 0)))
c3.metric("inconclusive", int(counts.get(inference.INCONCLUSIVE, 0)))
st.dataframe(verdicts.drop(columns=["tested"]), hide_index=True)

for claim in claims:
    st.subheader(claim.statement)
    st.caption(f"`{claim.id}` · {claim.source['file']}, {claim.source['section']}: “{claim.source.get('quote', '')}”")
    c = claim.conditions
    model = ", ".join(c.get("models") or []) or (
        "digest " + ", ".join(d[:12] for d in c["digests"]) if c.get("digests") else "any"
    )
    st.markdown(
        f"expected **{claim.expected}** · metric {claim.metric} · system **{claim.label}**"
        f" · depth {', '.join(map(str, claim.depths)) or 'any'} · model {model} {c.get('quantisation') or ''}"
        f" · chip {c.get('chip') or 'any'} · sampler {c.get('sampler') or 'any'}"
    )
    st.caption(ledger.selection_text(selections.get(claim.id, {"selected": 0, "fleet": 0, "excluded": {}})))
    mine = verdicts[verdicts["claim"] == claim.id]
    groups = sorted(set(mine["group"]) - {""})
    if len(groups) > 1:
        st.caption(
            f"{len(groups)} comparable groups match, settled apart and never pooled; each row names its values"
            " of the checked keys in which they differ."
        )
    unit = "run(s)" if claim.metric in ("acceptance_rate", *ledger.SPEEDS, "runs") else "pair(s)"
    for r in mine.itertuples():
        figure = "" if r.runs == 0 or r.figure != r.figure else f" · **{r.figure:.3g}**"
        interval = "" if r.ci_low != r.ci_low else f" [{r.ci_low:.3g}, {r.ci_high:.3g}]"
        excluded = f" · {r.excluded_runs} degraded {unit} excluded" if r.excluded_runs else ""
        # Runs whose warm-up reached the sweep's cap unsteady (warmup_converged false): counted, flagged.
        unsteady = f" · ⚠ {r.unsteady_runs} run(s) after a warm-up that never steadied" if r.unsteady_runs else ""
        group = f" · group {r.group} ({r.differs})" if r.differs else ""
        stands = badge(r.adjusted_verdict, r.tested, r.why)
        if r.adjusted_verdict != r.verdict:
            stands = f"{BADGE[r.verdict]} alone, {stands} after the false-discovery step"
        adjusted = "" if r.adjusted_p != r.adjusted_p else f" · adjusted p {r.adjusted_p:.2g}"
        st.markdown(
            f"**{r.chip}**: {stands}{figure}{interval} · {r.machines} machine(s), {r.prompts} prompt(s),"
            f" {r.runs} {unit}{excluded}{unsteady}{group}{adjusted} · {r.why}"
        )
    if len(mine) and mine["beside"].iloc[0]:
        st.caption(f"Beside the verdict, never as it: {mine['beside'].iloc[0]}")
    for other in ledger.conflicting(claim, claims):  # the seeds hold them against each other: side by side
        theirs = verdicts[verdicts["claim"] == other.id]
        said = "; ".join(
            f"{r.chip}: {badge(r.adjusted_verdict, r.tested, r.why)}"
            + ("" if r.figure != r.figure else f" {r.figure:.3g}")
            for r in theirs.itertuples()
        )
        st.markdown(f"Held against `{other.id}` ({other.expected}): {other.statement} · {said or 'no verdict yet'}")
    if claim.note:
        st.caption(claim.note)
    with st.expander("Sweep that would test it"):
        text, problems = sweeps[claim.id]
        if problems:
            st.warning("The coordinator refuses this sweep today: " + "; ".join(problems))
        st.code(text, language="yaml")
        st.download_button("Download sweep file", text, file_name=f"claim-{claim.id}.yaml", key=f"sweep-{claim.id}")

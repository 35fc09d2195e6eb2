"""The claims ledger: load and check the records, settle each claim per comparable group and
chip from fleet runs, and write the sweep that would test it. No Streamlit here; the
Questions page arranges it.

A claim names the system it is about as runs record it (specfleet/record.py: `engine`,
`system`, `method`), and only runs of that system settle it. Our in-process loops are engine
mlx or llama.cpp, system "specfleet"; llama.cpp's own server is engine llama-server, system
"llama-server", method its --spec-type (depth: --spec-draft-n-max, or an n-gram type's own
maximum); an OpenAI-compatible server is engine openai, system its name ("MTPLX", "OptiQ",
"oMLX", ...), method what its command does. So an MTPLX claim is settled by openai runs of
system MTPLX only, a draft-mtp claim by llama-server runs of method draft-mtp only. Our loop of
the same method on the same weights (`OUR_LOOP`: llama-server draft-mtp -> llama.cpp mtp, an
MLX server's mtp -> mlx mtp, ...) is evaluated on the claim's other conditions and shown
beside its verdict ("our loop, same weights"), never as it. The ledger refuses a system,
engine and method that no run can record.

Selection is exact: the system, the models by recorded reference (Hugging Face id or file
name) or digest, the recorded quantisation and architecture (equal once normalised: lower
case, punctuation dropped, an HF "...ForCausalLM" suffix dropped), the sampler, the prompt
category and set, the context depth and the draft depth. Nothing is matched by substring. The
selected runs are split by comparable group (specfleet/record.py CHECKED_KEYS, the system
among them) and chip and never pooled.

Verdicts are specfleet/inference.py's: a ratio's interval (t over machine means of
specfleet.speedup.per_prompt_sql's rows) against the claim's tolerance band, best depth by a
confidence set, and the false-discovery step over every claim's decisions (`evaluate_all`).

`sweep_yaml` writes the sweep that tests a claim on its own system (llama-server arms with the
source's server flags, an OpenAI-compatible server's command templates), with our loop of the
same method as a second engine of the same file where there is one.

The package: claim.py (what a claim is, the ledger's vocabulary, the system labels),
schema.py (reading and checking dashboard/claims.yaml), selection.py (the SQL that selects a
claim's runs), evaluation.py (verdicts), sweeps.py (the sweep that would test a claim).
"""

from dashboard.claims.claim import (
    DECLARED_CONDITIONS,
    FDR_Q,
    MAC_FAMILIES,
    MIN_MACHINES_FLEET,
    MIN_MACHINES_NAMED_CHIP,
    MIN_PROMPTS,
    OUR_LOOP,
    OURS,
    SPEEDS,
    Claim,
    Rule,
    _as_list,
    conflicting,
    our_loop,
    system_label,
    system_label_sql,
    system_method_label,
)
from dashboard.claims.evaluation import VERDICT_COLUMNS, _finite, adjust, beside, evaluate, evaluate_all
from dashboard.claims.schema import LEDGER, ClaimError, load_claims, parse_claims
from dashboard.claims.selection import (
    PARAM,
    conditions,
    conditions_sql,
    has_runs,
    matching_runs,
    merge_selections,
    normalise,
    selection,
    selection_text,
)
from dashboard.claims.sweeps import sweep_depths, sweep_yaml

__all__ = [
    "PARAM",
    "DECLARED_CONDITIONS",
    "FDR_Q",
    "LEDGER",
    "MAC_FAMILIES",
    "MIN_MACHINES_FLEET",
    "MIN_MACHINES_NAMED_CHIP",
    "MIN_PROMPTS",
    "OURS",
    "OUR_LOOP",
    "SPEEDS",
    "VERDICT_COLUMNS",
    "Claim",
    "ClaimError",
    "Rule",
    "_as_list",
    "_finite",
    "adjust",
    "beside",
    "conditions",
    "conditions_sql",
    "conflicting",
    "evaluate",
    "evaluate_all",
    "has_runs",
    "load_claims",
    "matching_runs",
    "merge_selections",
    "normalise",
    "our_loop",
    "parse_claims",
    "selection",
    "selection_text",
    "sweep_depths",
    "sweep_yaml",
    "system_label",
    "system_label_sql",
    "system_method_label",
]

"""What a claim is: its record (Claim, Rule), the ledger's vocabulary (metrics, rules, the
conditions a claim may name, the systems), how the pages name a system, and our loop of the same
method beside another system's claim."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from specfleet import inference
from specfleet import settings as declared

METRICS = (
    "speedup",
    "prefill_ratio",
    "acceptance_rate",
    "tokens_per_second",
    "server_tokens_per_second",
    "stall_rate",
    "best_depth",
    "runs",
)
# Metrics of the arm's runs paired with baselines (specfleet/speedup.py pairs_sql).
RATIO_METRICS = ("speedup", "prefill_ratio", "best_depth")
# Metrics judged on the arm's runs alone (a mean on its own scale, never a ratio to the baseline):
# each run's value as SQL, and which runs have one.
RUN_VALUES = {
    "acceptance_rate": ("tokens_accepted / tokens_drafted", "tokens_drafted > 0"),
    "tokens_per_second": ("decode_tokens_per_second", "decode_tokens_per_second > 0"),
    # the server's own clock (llama-server's final `timings`), for a source that quotes the server's log
    "server_tokens_per_second": ("server_decode_tokens_per_second", "server_decode_tokens_per_second > 0"),
    # a run that stalled (specfleet/speedup.py flagged_sql: under half its arm's median on the prompt)
    "stall_rate": ("CASE WHEN stall THEN 1.0 ELSE 0.0 END", "decode_tokens_per_second > 0"),
}
RULE_FIELDS = {
    "range": ("low", "high"),
    "above": ("threshold",),
    "below": ("threshold",),
    "best_depth_in": ("low", "high"),
    "none_measured": (),
}
# Absolute speeds, judged on the log scale (machines differ by a factor): the client's and the server's clock.
SPEEDS = ("tokens_per_second", "server_tokens_per_second")
RULE_METRICS = {"best_depth_in": ("best_depth",), "none_measured": ("runs",)}
# Conditions with a shape of their own, checked and selected below; every other declared setting a
# claim may select on (specfleet/settings.py, `condition`) is a value or a list of values matched exactly.
OWN_CONDITIONS = {
    "engine",
    "system",
    "method",
    "models",
    "baseline_models",
    "digests",
    "quantisation",
    "architecture",
    "chip",
    "depth",
    "sampler",
    "prompt_category",
    "prompt_set",
    "context_tokens",
    "version",  # a range, exact versions or a change between versions (specfleet/versions.py)
}
DECLARED_CONDITIONS = {s.name: s for s in declared.CONDITIONS if s.name not in OWN_CONDITIONS}
# The system under test as runs record it (RunRecord.system): our in-process loops, llama.cpp's
# own server, or for engine openai the OpenAI-compatible server's own name.
OURS = "specfleet"
LLAMA_SERVER = "llama-server"
# Our in-process loop of the same method as a server's runs, on the same weights: (engine,
# method) of the server's runs -> (engine, method) of ours. The OpenAI-compatible servers the
# seeds name (MTPLX, OptiQ, oMLX, mlx_lm.server) are MLX servers. Shown beside a claim's
# verdict, never as it.
OUR_LOOP = {
    ("llama-server", "draft-mtp"): ("llama.cpp", "mtp"),
    ("llama-server", "draft-simple"): ("llama.cpp", "draft"),
    ("llama-server", "ngram-mod"): ("llama.cpp", "ngram-mod"),
    ("llama-server", "ngram-map-k4v"): ("llama.cpp", "ngram-map-k4v"),
    ("openai", "mtp"): ("mlx", "mtp"),
    ("openai", "draft"): ("mlx", "draft"),
}
# How a generated sweep starts an OpenAI-compatible server: its baseline's command template and
# its arms' per method ({model}, {depth}, {port}). OptiQ names no depth flag in the seeds, so its
# arm runs OptiQ's own depth, and no ledger claim may name a depth of it (the ledger refuses a
# command without {depth} for a claim of a depth). A claim about a server not here gives
# sweep.command and sweep.arm_command.
SERVER_PRESETS = {
    "MTPLX": {
        "baseline": "mtplx serve --model {model} --port {port}",
        "mtp": "mtplx serve --model {model} --mtp --depth {depth} --port {port}",
    },
    "OptiQ": {
        "baseline": "optiq serve --model {model} --port {port}",
        "mtp": "optiq serve --model {model} --mtp --port {port}",
    },
}
SAMPLER_KEYS = tuple(s.key for s in declared.SAMPLER)
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,79}$")
SWEEP_REPEATS = 5
MAC_FAMILIES = ("M1", "M2", "M3", "M4", "M5")  # "Apple*" claims target every Mac of the fleet
# Machines (per chip) and prompts (on each machine) a verdict needs: the smallest counts whose
# simulated wrong-verdict rate stays at the nominal 2.5% and whose crossed interval holds coverage
# 0.93-0.97 (bench/verdicts.py, sections `rules` and `crossed`; docs/verdicts.md). A claim about a
# named chip and one about any Mac are both settled per chip; "any Mac" was simulated with
# heavier-tailed and machine-dominated spreads as well. One machine is never enough: its interval
# is about that machine (wrong verdicts 21-42%); nor are two: the machine part's one degree of
# freedom (coverage 0.91-0.96, 3.7% wrong at the edge). A record may ask for more
# (verdict.min_machines, verdict.min_prompts), never fewer.
MIN_MACHINES_NAMED_CHIP = inference.MIN_MACHINES  # 3: worst wrong-verdict rate 0.022 (2 machines: 0.037, 1: 0.21)
MIN_MACHINES_FLEET = inference.MIN_MACHINES  # 3: worst 0.025 over three spreads (2 machines: 0.037, 1: 0.42)
MIN_PROMPTS = inference.MIN_PROMPTS  # 5: coverage 0.946-0.972 from 3 machines (2-3 prompts: 0.85-0.92)
FDR_Q = inference.FDR_Q


@dataclass(frozen=True)
class Rule:
    """A claim's verdict rule: its tolerance band (ratios; depths for best_depth_in) and the
    fewest machines and runs (pairs, for a ratio) a verdict needs."""

    rule: str
    band_low: float
    band_high: float
    min_machines: int
    min_runs: int = 1
    min_prompts: int = MIN_PROMPTS


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    source: dict[str, str]
    conditions: dict[str, Any]
    metric: str
    expected: str
    rule: Rule
    sweep: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    conflicts: tuple[str, ...] = ()  # ids of ledger claims the seeds hold against this one: shown side by side

    @property
    def engine(self) -> str:
        return self.conditions["engine"]

    @property
    def method(self) -> str:
        return self.conditions["method"]

    @property
    def system(self) -> str:
        """The system under test as its runs record it (RunRecord.system)."""
        return self.conditions["system"]

    @property
    def label(self) -> str:
        """The system and method the claim is about, as the pages name a run's:
        "llama-server draft-mtp", "MTPLX (openai) mtp", "specfleet llama.cpp mtp"."""
        return system_method_label(self.system, self.engine, self.method)

    @property
    def baseline_models(self) -> list[str]:
        """The files the source ran its baseline on where they are not the arm's (the bug
        report's non-MTP GGUF); [] for the arm's own file, in the arm's own job."""
        return _as_list(self.conditions.get("baseline_models"))

    @property
    def depths(self) -> list[int]:
        """The claim's draft depths; [] for a claim of runs at any depth."""
        return _as_list(self.conditions.get("depth"))


def system_label(system: str, engine: str) -> str:
    """How the pages name the system a run measured: "specfleet mlx" (our loop, by engine),
    "llama-server", "MTPLX (openai)". system_label_sql is the same in SQL."""
    if system == OURS:
        return f"{OURS} {engine}"
    return system if system == engine else f"{system} ({engine})"


def system_method_label(system: str, engine: str, method: str) -> str:
    return f"{system_label(system, engine)} {method}"


def system_label_sql(prefix: str = "") -> str:
    """SQL: system_label of a run's typed columns (`prefix` qualifies them: "g.")."""
    system, engine = f"{prefix}system", f"{prefix}engine"
    return (
        f"CASE WHEN {system} = '{OURS}' THEN {system} || ' ' || {engine} WHEN {system} = {engine} THEN {system}"
        f" ELSE {system} || ' (' || {engine} || ')' END"
    )


def our_loop(claim: Claim) -> Claim | None:
    """The claim on our in-process loop of the same method and the same weights (OUR_LOOP),
    for a claim about another system: what is shown beside its verdict. None for a claim
    about our loops, a method we have no loop of, or llama-server's depth 0 (the drafter loaded
    and n_max 0: our loops have no such arm). A speed on a server's clock is our loop's own
    tok/s: an in-process loop has no other clock."""
    if claim.system == OURS or (claim.engine, claim.method) not in OUR_LOOP or 0 in claim.depths:
        return None
    engine, method = OUR_LOOP[(claim.engine, claim.method)]
    metric = "tokens_per_second" if claim.metric == "server_tokens_per_second" else claim.metric
    conditions = {**claim.conditions, "engine": engine, "method": method, "system": OURS}
    conditions.pop("baseline_models", None)  # our loop's baseline is the same weights without drafting
    return replace(claim, conditions=conditions, metric=metric)


def _as_list(value) -> list:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def conflicting(claim: Claim, ledger: list[Claim]) -> list[Claim]:
    """The ledger's claims held against `claim`, whichever of the two records names the other:
    the Questions page shows their verdicts side by side."""
    return [c for c in ledger if c.id != claim.id and (c.id in claim.conflicts or claim.id in c.conflicts)]

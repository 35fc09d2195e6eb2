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
same method as a second engine of the same file where there is one."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import yaml

from specfleet import inference, server_arms, speedup, versions
from specfleet import settings as declared
from specfleet.record import (
    ARCHITECTURE_SUFFIX,
    CHECKED_KEYS,
    ENGINE_METHODS,
    ENGINES,
    IN_PROCESS_ENGINES,
    MAX_DEPTH,
    PROMPT_CATEGORIES,
    SERVER_SPEC_TYPES,
    VERIFY_COST,
    architecture_family,
    is_method,
    is_speculative,
    least_depth,
)
from specfleet.schemas import setting_problem

LEDGER = Path(__file__).with_name("claims.yaml")
METRICS = ("speedup", "prefill_ratio", "acceptance_rate", "tokens_per_second", "stall_rate", "best_depth", "runs")
# Metrics judged on the arm's runs alone (a mean on its own scale, never a ratio to the baseline):
# each run's value as SQL, and which runs have one.
RUN_VALUES = {
    "acceptance_rate": ("tokens_accepted / tokens_drafted", "tokens_drafted > 0"),
    "tokens_per_second": ("decode_tokens_per_second", "decode_tokens_per_second > 0"),
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
RULE_METRICS = {"best_depth_in": ("best_depth",), "none_measured": ("runs",)}
CLAIM_KEYS = {"id", "statement", "source", "conditions", "metric", "expected", "verdict", "sweep", "note", "conflicts"}
# Conditions with a shape of their own, checked and selected below; every other declared setting a
# claim may select on (specfleet/settings.py, `condition`) is a value or a list of values matched exactly.
OWN_CONDITIONS = {
    "engine",
    "system",
    "method",
    "models",
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
CONDITION_KEYS = OWN_CONDITIONS | set(DECLARED_CONDITIONS)
SWEEP_FIELDS = ("target", "draft", "flags", "command", "arm_command", "max_new_tokens")
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
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SWEEP_REPEATS = 5
MAC_FAMILIES = ("M1", "M2", "M3", "M4", "M5")  # "Apple*" claims target every Mac of the fleet
# Machines (per chip) and prompts (on each machine) a verdict needs: the smallest counts whose
# simulated wrong-verdict rate stays at the nominal 2.5% (bench/verdicts.py, sections `rules` and
# `prompts`; docs/verdicts.md). A claim about a named chip and one about any Mac are both settled
# per chip; "any Mac" was simulated with heavier-tailed and machine-dominated spreads as well.
# One machine is never enough: its interval is about that machine (wrong verdicts 15-42%). A
# record may ask for more (verdict.min_machines, verdict.min_prompts), never fewer.
MIN_MACHINES_NAMED_CHIP = inference.MIN_MACHINES  # 2: worst wrong-verdict rate 0.025 (1 machine: 0.21)
MIN_MACHINES_FLEET = inference.MIN_MACHINES  # 2: worst 0.025 over three spreads (1 machine: 0.42)
MIN_PROMPTS = inference.MIN_PROMPTS  # 5
FDR_Q = inference.FDR_Q


class ClaimError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("invalid claims ledger: " + "; ".join(problems))
        self.problems = problems


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
    and n_max 0: our loops have no such arm)."""
    if claim.system == OURS or (claim.engine, claim.method) not in OUR_LOOP or 0 in claim.depths:
        return None
    engine, method = OUR_LOOP[(claim.engine, claim.method)]
    return replace(claim, conditions={**claim.conditions, "engine": engine, "method": method, "system": OURS})


def _as_list(value) -> list:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _band(v: dict) -> tuple[float, float]:
    if v["rule"] == "above":
        return float(v["threshold"]), math.inf
    if v["rule"] == "below":
        return 0.0, float(v["threshold"])
    if v["rule"] == "none_measured":
        return 0.0, 0.0
    return float(v["low"]), float(v["high"])


def _check(i: int, rec: Any, problems: list[str]) -> Claim | None:
    where = f"claims[{i}]"
    if not isinstance(rec, dict):
        problems.append(f"{where}: must be a mapping of claim fields")
        return None
    if isinstance(rec.get("id"), str):
        where = f"claims[{i}] ({rec['id']})"
    before = len(problems)

    def fail(name: str, why: str) -> None:
        problems.append(f"{where}.{name}: {why}")

    for key in sorted(set(rec) - CLAIM_KEYS, key=str):
        fail(key, f"unknown field (allowed: {', '.join(sorted(CLAIM_KEYS))})")
    if not isinstance(rec.get("id"), str) or not ID_RE.match(rec["id"]):
        fail("id", "is required: lower-case letters, digits, '_', '.', '-'")
    for name in ("statement", "metric"):
        if not isinstance(rec.get(name), str) or not rec[name].strip():
            fail(name, "is required: a non-empty string")
    if not isinstance(rec.get("expected"), (str, int, float)) or isinstance(rec.get("expected"), bool):
        fail("expected", "is required: the figure or range as the source gives it")
    source = rec.get("source")
    if not isinstance(source, dict) or not all(isinstance(source.get(k), str) for k in ("file", "section")):
        fail("source", "is required: a mapping with file and section (and quote)")
    if isinstance(rec.get("metric"), str) and rec["metric"] not in METRICS:
        fail("metric", f"unknown metric {rec['metric']!r} (known: {', '.join(METRICS)})")

    cond = rec.get("conditions")
    if not isinstance(cond, dict):
        fail("conditions", "is required: a mapping of engine, system, method, models, chip, depth, sampler")
        cond = {}
    for key in sorted(set(cond) - CONDITION_KEYS, key=str):
        hint = {
            "model_family": " (models are named by exact reference: use models or digests)",
            "implementation": " (the system under test is `system`, as runs record it, with its engine and method)",
        }.get(key, "")
        fail(f"conditions.{key}", f"unknown field (allowed: {', '.join(sorted(CONDITION_KEYS))}){hint}")
    engine = cond.get("engine")
    if engine not in ENGINES:
        fail("conditions.engine", f"is required: one of {', '.join(ENGINES)}")
    system = _check_system(engine, cond.get("system"), fail)
    method = cond.get("method")
    if engine in ENGINES and (
        not isinstance(method, str) or method in ("baseline", VERIFY_COST) or not is_method(engine, method)
    ):
        known = ", ".join(m for m in ENGINE_METHODS[engine] if m != "baseline")
        lists = " or a comma list of them" if engine == LLAMA_SERVER else ""
        fail("conditions.method", f"is required: a method engine {engine} runs ({known}){lists}, got {method!r}")
    for name in ("quantisation", "architecture", "chip", "prompt_set"):
        if cond.get(name) is not None and (not isinstance(cond[name], str) or not cond[name].strip()):
            fail(f"conditions.{name}", "must be a non-empty string or null")
    if cond.get("version") is not None and (why := versions.condition_problem(cond["version"])):
        fail("conditions.version", why)
    elif versions.is_change(cond.get("version")) and rec.get("metric") not in versions.CHANGE_FIGURES:
        fail("metric", f"a change between versions is settled on {' or '.join(versions.CHANGE_FIGURES)}")
    chip = cond.get("chip")
    if isinstance(chip, str) and "*" in chip[:-1]:
        fail("conditions.chip", "an exact chip name, or a prefix ending in '*' (Apple*)")
    models = cond.get("models")
    if models is not None and (
        not isinstance(models, list) or not models or not all(isinstance(m, str) and m.strip() for m in models)
    ):
        fail("conditions.models", "must be a list of exact model references (Hugging Face ids or file names)")
    elif models and any("/" in m and m.count("/") > 1 or m.startswith(("/", "~", ".")) for m in models):
        fail("conditions.models", "a reference is a Hugging Face id (org/name) or a file name, never a path")
    digests = cond.get("digests")
    if digests is not None and (
        not isinstance(digests, list)
        or not digests
        or not all(isinstance(d, str) and SHA256_RE.match(d) for d in digests)
    ):
        fail("conditions.digests", "must be a list of SHA-256 digests (64 lower-case hex digits)")
    categories = _as_list(cond.get("prompt_category"))
    if not all(c in PROMPT_CATEGORIES for c in categories):
        fail("conditions.prompt_category", f"must be one of {', '.join(PROMPT_CATEGORIES)} or a list of them")
    contexts = _as_list(cond.get("context_tokens"))
    if not all(_is_int(c) and c >= 0 for c in contexts):
        fail("conditions.context_tokens", "must be a token count >= 0 or a list of them")
    depths = _as_list(cond.get("depth"))
    if (depths or rec.get("metric") != "runs") and (
        not depths or not all(_is_int(d) and 0 <= d <= MAX_DEPTH for d in depths)
    ):
        fail(
            "conditions.depth",
            f"is required: a draft depth 0-{MAX_DEPTH} or a list of them (a claim of metric runs may leave it out)",
        )
    elif isinstance(method, str) and is_speculative(method) and 0 in depths and least_depth(engine, method) > 0:
        fail("conditions.depth", f"a {method} run records a depth 1-{MAX_DEPTH}: depth 0 selects none")
    for name, setting in DECLARED_CONDITIONS.items():
        values = _as_list(cond.get(name))
        why = next(
            (
                setting_problem(setting, v) or "must not be null"
                for v in values
                if v is None or setting_problem(setting, v)
            ),
            None,
        )
        if why:
            fail(f"conditions.{name}", why)
    sampler = cond.get("sampler", {})
    if not isinstance(sampler, dict):
        fail("conditions.sampler", f"must be a mapping of {', '.join(SAMPLER_KEYS)}")
        sampler = {}
    for key, value in sampler.items():
        if key not in SAMPLER_KEYS:
            fail(f"conditions.sampler.{key}", f"unknown field (allowed: {', '.join(SAMPLER_KEYS)})")
        elif not _is_number(value):
            fail(f"conditions.sampler.{key}", f"must be a number, got {value!r}")

    v = rec.get("verdict")
    rule = None
    if not isinstance(v, dict) or v.get("rule") not in RULE_FIELDS:
        fail("verdict.rule", f"is required: one of {', '.join(RULE_FIELDS)}")
    else:
        allowed = {"rule", "low", "high", "threshold", "min_machines", "min_runs", "min_prompts"}
        for key in sorted(set(v) - allowed, key=str):
            fail(f"verdict.{key}", "unknown field")
        for name in RULE_FIELDS[v["rule"]]:
            if not _is_number(v.get(name)):
                fail(f"verdict.{name}", f"is required for rule {v['rule']}: a number")
        if v["rule"] in RULE_METRICS and rec.get("metric") not in RULE_METRICS[v["rule"]]:
            fail("verdict.rule", f"{v['rule']} needs metric {' or '.join(RULE_METRICS[v['rule']])}")
        if v["rule"] not in RULE_METRICS and rec.get("metric") in ("best_depth", "runs"):
            fail("verdict.rule", f"metric {rec['metric']} needs rule best_depth_in or none_measured")
        low, high = v.get("low"), v.get("high")
        if _is_number(low) and _is_number(high):
            if v["rule"] == "range" and not 0 <= low < high:
                fail("verdict.low", f"must lie in [0, verdict.high) ({high})")
            if v["rule"] == "best_depth_in" and low > high:
                fail("verdict.low", f"must not exceed verdict.high ({high})")
        if v["rule"] in ("above", "below") and _is_number(v.get("threshold")):
            if v["threshold"] < 0 or (v["rule"] == "below" and v["threshold"] == 0):
                fail("verdict.threshold", "must be a ratio > 0")
        named_chip = isinstance(chip, str) and not chip.endswith("*")
        least = {
            "min_machines": MIN_MACHINES_NAMED_CHIP if named_chip else MIN_MACHINES_FLEET,
            "min_prompts": MIN_PROMPTS,
            "min_runs": 1,
        }
        for name, floor in least.items():
            if name in v and (not _is_int(v[name]) or v[name] < floor):
                why = (
                    "must be a positive integer"
                    if floor == 1
                    else (
                        f"must be an integer >= {floor}: fewer gives wrong verdicts more often than the nominal 2.5%"
                        " (bench/verdicts.py)"
                    )
                )
                fail(f"verdict.{name}", why)
        if len(problems) == before:
            rule = Rule(v["rule"], *_band(v), **{name: v.get(name, floor) for name, floor in least.items()})
    sweep = rec.get("sweep", {})
    if not isinstance(sweep, dict):
        fail("sweep", f"must be a mapping of {', '.join(SWEEP_FIELDS)}")
        sweep = {}
    _check_sweep(sweep, engine, system, method, fail, depths)
    if rec.get("note") is not None and not isinstance(rec["note"], str):
        fail("note", "must be a string")
    conflicts = rec.get("conflicts", [])
    if not isinstance(conflicts, list) or not all(isinstance(x, str) and ID_RE.match(x) for x in conflicts):
        fail("conflicts", "must be a list of claim ids (the claims the seeds hold against this one)")
        conflicts = []
    if len(problems) != before or rule is None:
        return None
    return Claim(
        id=rec["id"],
        statement=rec["statement"].strip(),
        source=source,
        conditions={**cond, "system": system, "sampler": sampler},
        metric=rec["metric"],
        expected=str(rec["expected"]),
        rule=rule,
        sweep=sweep,
        note=(rec.get("note") or "").strip(),
        conflicts=tuple(conflicts),
    )


def _check_system(engine, system, fail) -> str | None:
    """The claim's system, as runs of its engine record it: our in-process engines' runs are
    "specfleet", llama-server's "llama-server" (both may be left out), an OpenAI-compatible
    server's its own name (required)."""
    if system is not None and (not isinstance(system, str) or not system.strip()):
        fail("conditions.system", "must be the system's name as its runs record it")
        return None
    if engine in IN_PROCESS_ENGINES:
        if system not in (None, OURS):
            fail(
                "conditions.system",
                f"engine {engine} runs specfleet's own in-process loops, system {OURS!r}, never {system!r}"
                " (a claim about another system names the engine its runs record: llama-server or openai)",
            )
        return OURS
    if engine == LLAMA_SERVER:
        if system not in (None, LLAMA_SERVER):
            fail("conditions.system", f"engine llama-server's runs are system 'llama-server', never {system!r}")
        return LLAMA_SERVER
    if engine == "openai":
        if system is None:
            fail(
                "conditions.system",
                "is required for engine openai: the OpenAI-compatible server's name as its runs record it"
                " (MTPLX, OptiQ, oMLX, mlx_lm.server, ...)",
            )
        elif system in (OURS, LLAMA_SERVER):
            fail("conditions.system", f"{system!r} is not an OpenAI-compatible server's name (engine openai)")
        return system
    return None


def _check_sweep(sweep: dict, engine, system, method, fail, depths=()) -> None:
    """The claim's sweep fields: model paths, llama-server flags, an OpenAI-compatible
    server's command templates (required where SERVER_PRESETS has none, and setting the claim's
    depth: a command without {depth} would run the server's own depth under the claim's K),
    max_new_tokens."""
    for key in sorted(set(sweep) - set(SWEEP_FIELDS), key=str):
        fail(f"sweep.{key}", f"unknown field (allowed: {', '.join(SWEEP_FIELDS)})")
    for key in ("target", "draft", "flags", "command", "arm_command"):
        if key in sweep and (not isinstance(sweep[key], str) or not sweep[key].strip()):
            fail(f"sweep.{key}", "must be a non-empty string")
    tokens = sweep.get("max_new_tokens", 1)
    if not _is_int(tokens) or not 1 <= tokens <= 16384:
        fail("sweep.max_new_tokens", "must be a token count 1-16384")
    if "flags" in sweep and engine != LLAMA_SERVER:
        fail("sweep.flags", "llama-server's flags apply to engine llama-server (openai: sweep.command, arm_command)")
    for key in ("command", "arm_command"):
        if key in sweep and engine != "openai":
            fail(f"sweep.{key}", "an OpenAI-compatible server's command template applies to engine openai")
    if engine == "openai" and isinstance(system, str) and isinstance(method, str):
        preset = SERVER_PRESETS.get(system, {})
        known = ", ".join(SERVER_PRESETS)
        if "command" not in sweep and "baseline" not in preset:
            fail("sweep.command", f"is required: no command is known for {system} (known: {known}); a template")
        if "arm_command" not in sweep and method not in preset:
            fail("sweep.arm_command", f"is required: no {method} command is known for {system}; a template")
        arm = sweep.get("arm_command") or preset.get(method)
        if depths and isinstance(arm, str) and "{depth}" not in arm:
            fail(
                "conditions.depth",
                f"{system}'s {method} command sets no depth ({arm!r} has no {{depth}}): its runs would record K"
                f" while {system} runs its own depth; give sweep.arm_command with {{depth}}, or list the claim in"
                " docs/claims.md until the server's depth option is known",
            )


def parse_claims(text: str) -> list[Claim]:
    """Parse and check a ledger; raise ClaimError naming every faulty field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ClaimError([f"file: not valid YAML ({str(e).splitlines()[0]})"]) from None
    if not isinstance(doc, list):
        raise ClaimError(["file: must be a list of claim records"])
    problems: list[str] = []
    claims = [c for i, rec in enumerate(doc) if (c := _check(i, rec, problems)) is not None]
    seen: set[str] = set()
    for c in claims:
        if c.id in seen:
            problems.append(f"claims ({c.id}).id: used twice")
        seen.add(c.id)
    for c in claims:  # conflicts name claims of the same ledger, never the claim itself
        for other in c.conflicts:
            if other not in seen or other == c.id:
                problems.append(f"claims ({c.id}).conflicts: {other!r} is not another claim of this ledger")
    if problems:
        raise ClaimError(problems)
    return claims


def load_claims(path: Path = LEDGER) -> list[Claim]:
    return parse_claims(Path(path).read_text())


# ---------------------------------------------------------------- selecting runs

# What evaluate() reads of a run; the nullable flags are cast so that a DataFrame built from
# Python values reads as the mirror's typed columns do.
_COLUMNS = (
    *CHECKED_KEYS,
    "job_id",
    "attempt",
    "lease_id",
    "machine_id",
    "chip",
    "method",
    "depth",
    "prompt_id",
    "repeat",
    "prompt_set",
    "prompt_category",
    "target_reference",
    "draft_reference",
    "target_architecture",
    "target_quantisation",
    "target_parameters",
    "decode_tokens_per_second",
    "prefill_tokens_per_second",
    "tokens_drafted",
    "tokens_accepted",
)
_SELECT = ", ".join(_COLUMNS) + ", CAST(env_nominal AS BOOLEAN) AS env_nominal, CAST(lossless AS BOOLEAN) AS lossless"


def _warmup_converged(con: duckdb.DuckDBPyConnection) -> str:
    """SQL: a run's warmup_converged (settings, record schema 4), NULL where the runs predate it."""
    names = {d[0] for d in con.execute("SELECT * FROM runs LIMIT 0").description}
    known = "CAST(warmup_converged AS BOOLEAN)" if "warmup_converged" in names else "CAST(NULL AS BOOLEAN)"
    return f"{known} AS warmup_converged"


def _comparable(con: duckdb.DuckDBPyConnection) -> str:
    """SQL: a run's comparable group: the mirror's column (computed once as the run arrived),
    or computed here for runs without one (a test's frames)."""
    names = {d[0] for d in con.execute("SELECT * FROM runs LIMIT 0").description}
    return "comparable" if "comparable" in names else f"{speedup.COMPARABLE_ID} AS comparable"


def normalise(text: str) -> str:
    """A recorded value in one spelling: lower case, punctuation dropped ("Q4_K_M" -> "q4km")."""
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def _norm_sql(expr: str) -> str:
    return f"regexp_replace(lower(coalesce({expr}, '')), '[^a-z0-9]', '', 'g')"


# The recorded architecture in specfleet.record.architecture_family's spelling, in SQL.
_ARCHITECTURE = _norm_sql(f"regexp_replace(v, '{ARCHITECTURE_SUFFIX}', '')")


def _spelled(column: str, normalised: str, param: str) -> str:
    """SQL condition: the run's `column` is one of the fleet's values of it whose `normalised`
    spelling (an expression of v) equals $param. The spelling is computed once per distinct
    value, not once per run (a million runs hold a handful of quantisations)."""
    return f"{column} IN (SELECT v FROM (SELECT DISTINCT {column} AS v FROM runs) WHERE {normalised} = ${param})"


def conditions(claim: Claim) -> tuple[list[tuple[str, str]], dict]:
    """The claim's conditions as (name, SQL condition on a run's typed columns), each an exact
    match, with their named parameters. Baselines of the same system, models, chips and
    sampler are selected with the arm; a claim of any depth has no depth condition."""
    c = claim.conditions
    out = [
        ("engine", "engine = $engine"),
        ("system", "system = $system"),
        ("method", "method IN ('baseline', $method)"),
    ]
    params: dict[str, Any] = {"engine": c["engine"], "system": claim.system, "method": c["method"]}
    if claim.depths:
        out.append(("depth", "(method = 'baseline' OR list_contains($depths::INTEGER[], depth))"))
        params["depths"] = claim.depths
    chip = c.get("chip")
    if chip and chip.endswith("*"):
        out.append(("chip", "starts_with(chip, $chip)"))
        params["chip"] = chip[:-1]
    elif chip:
        out.append(("chip", "chip = $chip"))
        params["chip"] = chip
    for name, setting in DECLARED_CONDITIONS.items():
        if c.get(name) is not None:
            out.append((name, f"list_contains(${name}::{declared.sql_type(setting)}[], {name})"))
            params[name] = _as_list(c[name])
    if c.get("models"):
        out.append(("models", "list_contains($models::VARCHAR[], lower(trim(target_reference)))"))
        params["models"] = [m.strip().lower() for m in c["models"]]
    if c.get("digests"):
        out.append(("digests", "list_contains($digests::VARCHAR[], target_digest)"))
        params["digests"] = list(c["digests"])
    if c.get("quantisation"):
        out.append(("quantisation", _spelled("target_quantisation", _norm_sql("v"), "quantisation")))
        params["quantisation"] = normalise(c["quantisation"])
    if c.get("architecture"):
        out.append(("architecture", _spelled("target_architecture", _ARCHITECTURE, "architecture")))
        params["architecture"] = architecture_family(c["architecture"])
    for key, value in c.get("sampler", {}).items():
        out.append((f"sampler.{key}", f"abs(sampler_{key} - $sampler_{key}) < 1e-9"))
        params[f"sampler_{key}"] = float(value)
    if c.get("prompt_category") is not None:
        out.append(("prompt_category", "list_contains($categories::VARCHAR[], prompt_category)"))
        params["categories"] = _as_list(c["prompt_category"])
    if c.get("prompt_set"):
        out.append(("prompt_set", "prompt_set = $prompt_set"))
        params["prompt_set"] = c["prompt_set"]
    if c.get("context_tokens") is not None:
        out.append(("context_tokens", "list_contains($contexts::INTEGER[], context_tokens)"))
        params["contexts"] = _as_list(c["context_tokens"])
    if c.get("version") is not None:
        sql, version_params = versions.condition_sql(c["version"])
        out.append(("version", sql))
        params |= version_params
    return out, params


def conditions_sql(claim: Claim) -> tuple[str, dict]:
    """One SQL condition for all of the claim's conditions, with its named parameters."""
    conds, params = conditions(claim)
    return " AND ".join(f"coalesce({sql}, false)" for _, sql in conds), params


def _chip_label(pattern: str | None) -> str:
    """The chip column of a verdict row when no chip has data."""
    if not pattern:
        return "any chip"
    return "any Mac" if pattern == "Apple*" else pattern


# The fleet's generation runs, from the connection's `runs`.
_FLEET = f"(SELECT * FROM runs WHERE method != '{VERIFY_COST}')"


def has_runs(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection holds a generation run; False when it holds no `runs` yet. Stops
    at the first run found: a count of a million runs for every claim cost seconds."""
    try:
        return bool(con.execute(f"SELECT 1 FROM {_FLEET} LIMIT 1").fetchall())
    except duckdb.CatalogException:
        return False


def matching_runs(claim: Claim, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The runs inside the claim's conditions (its arm and the baselines), the columns
    evaluate() reads and each run's comparable group."""
    if not has_runs(con):
        return pd.DataFrame(columns=[*_COLUMNS, "env_nominal", "lossless", "warmup_converged", "comparable"])
    _matched(claim, con)
    return con.execute("SELECT * FROM matched").df()


def _matched(claim: Claim, con: duckdb.DuckDBPyConnection) -> None:
    """On `con`, the claim's runs as temporary table `matched` and its arm's as `arm`, from the
    connection's `runs`; its `jobs` (job_id, attempt, state) say which attempts are valid."""
    where, params = conditions_sql(claim)
    select = f"{_SELECT}, {_warmup_converged(con)}, {_comparable(con)}"
    con.execute(f"CREATE OR REPLACE TEMP TABLE matched AS SELECT {select} FROM {_FLEET} WHERE {where}", params)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE arm AS SELECT * FROM matched WHERE method = $method", {"method": claim.method}
    )


def selection(claim: Claim, con: duckdb.DuckDBPyConnection, seqs: tuple[int, int] | None = None) -> dict[str, Any]:
    """What the claim selected and why the rest was left out, in one query: fleet (generation
    runs), selected (runs, baselines included), arm (of them, the claim's method), models
    (target references), systems (system_label: "specfleet mlx", "MTPLX (openai)"), of_system
    (the fleet's runs of the claim's system, engine and method, whatever their other fields),
    and excluded: for each condition, the generation runs of the fleet that fail it (a run may
    fail several). `seqs` (lo, hi): only the runs stored with lo < seq <= hi: runs never change
    once stored, so merge_selections of two ranges' is the selection of both."""
    if not has_runs(con):
        return dict(selected=0, arm=0, models=[], systems=[], of_system=0, excluded={}, fleet=0)
    conds, params = conditions(claim)
    every = " AND ".join(f"coalesce({sql}, false)" for _, sql in conds)
    fails = ", ".join(f"count(*) FILTER (WHERE NOT coalesce({sql}, false)) AS c{i}" for i, (_, sql) in enumerate(conds))
    row = con.execute(
        f"SELECT count(*) AS fleet, count(*) FILTER (WHERE {every}) AS selected,"
        f" count(*) FILTER (WHERE {every} AND method = $method) AS arm,"
        f" list(DISTINCT target_reference ORDER BY target_reference) FILTER (WHERE {every}) AS models,"
        f" list(DISTINCT {system_label_sql()} ORDER BY 1) FILTER (WHERE {every}) AS systems,"
        " count(*) FILTER (WHERE engine = $engine AND system = $system AND method = $method) AS of_system,"
        f" {fails} FROM {_FLEET} WHERE {'seq > $lo AND seq <= $hi' if seqs else 'true'}",
        {**params, **(dict(zip(("lo", "hi"), seqs)) if seqs else {})},
    ).fetchone()
    first = 6  # the columns before the conditions' counts
    excluded = {name: int(row[first + i]) for i, (name, _) in enumerate(conds) if row[first + i]}
    return dict(
        fleet=int(row[0]),
        selected=int(row[1]),
        arm=int(row[2]),
        models=list(row[3] or []),
        systems=list(row[4] or []),
        of_system=int(row[5]),
        excluded=excluded,
    )


def merge_selections(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The selection of two disjoint sets of runs, from each one's (selection with seqs)."""
    counts = ("fleet", "selected", "arm", "of_system")
    excluded = {k: a["excluded"].get(k, 0) + b["excluded"].get(k, 0) for k in {**a["excluded"], **b["excluded"]}}
    return dict(
        {k: a[k] + b[k] for k in counts},
        models=sorted(set(a["models"]) | set(b["models"])),
        systems=sorted(set(a["systems"]) | set(b["systems"])),
        excluded={k: n for k, n in excluded.items() if n},
    )


def selection_text(sel: dict[str, Any]) -> str:
    """The card's line: what was selected and what each condition left out."""
    said = f"selected {sel['selected']} of the fleet's {sel['fleet']} run(s), {sel.get('arm', 0)} of them of the arm"
    if sel["selected"]:
        said += f" · models {', '.join(sel['models'])} · systems {', '.join(sel['systems'])}"
    if sel["excluded"]:
        said += " · left out by " + ", ".join(f"{k} {n}" for k, n in sel["excluded"].items())
    return said


# ---------------------------------------------------------------- verdicts

VERDICT_COLUMNS = [
    "claim",
    "chip",
    "group",
    "verdict",
    "adjusted_verdict",
    "figure",
    "ci_low",
    "ci_high",
    "machines",
    "prompts",
    "runs",
    "excluded_runs",
    "unsteady_runs",
    "differs",
    "p_value",
    "adjusted_p",
    "tested",
    "probability",
    "why",
    "beside",
]
NAN = float("nan")


def _short(value) -> str:
    """A checked key's value as the page shows it: a SHA-256 by its first 12 hex digits."""
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{64}", text) else text


def _from_decision(d: inference.Decision, runs: int | None = None, figure: float | None = None) -> dict:
    return dict(
        verdict=d.verdict,
        figure=d.speedup if figure is None else figure,
        ci_low=d.low,
        ci_high=d.high,
        machines=d.machines,
        prompts=d.prompts,
        runs=d.pairs if runs is None else runs,
        p_value=d.p_value,
        tested=d.tested,
        probability=NAN if d.probability is None else d.probability,
        why=d.why,
    )


# The attempts a verdict counts: completed ones only. A leased attempt's runs are real figures
# (the pages show them) but half a machine's prompts; counted, it would pass for a whole machine.
DONE_JOBS = "(SELECT * FROM jobs WHERE state = 'done')"


def _per_prompt(con, value: str) -> pd.DataFrame:
    """per_prompt_sql on the claim's runs of completed attempts (value: the tok/s column the
    ratio is of)."""
    sql = speedup.per_prompt_sql("matched", DONE_JOBS)
    if value != "decode_tokens_per_second":
        sql = sql.replace("decode_tokens_per_second", value)
    return con.execute(sql).df()


def _excluded(con) -> pd.DataFrame:
    """Arm runs of valid attempts left out as not nominal, per group, chip and depth."""
    return con.execute(
        f"SELECT comparable, chip, depth, count(*) AS excluded_runs FROM {speedup.valid_sql('arm', DONE_JOBS)}"
        " WHERE env_nominal IS NOT DISTINCT FROM false GROUP BY ALL"
    ).df()


def _too_few_runs(claim: Claim, d: inference.Decision, runs: int) -> inference.Decision:
    if runs >= claim.rule.min_runs:
        return d
    why = f"{inference.too_few(runs, claim.rule.min_runs, 'runs')} ({d.why})"
    return replace(d, verdict=inference.INCONCLUSIVE, why=why, tested=False, p_value=1.0)


def _finite(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows with a finite log ratio, and how many were not (a NaN speed reads as > 0 in SQL)."""
    ok = np.isfinite(rows["log_ratio"].to_numpy(dtype=float))
    return rows[ok], int((~ok).sum())


def _with_dropped(d: inference.Decision, dropped: int) -> inference.Decision:
    return d if not dropped else replace(d, why=f"{d.why}; {dropped} pair(s) with a non-finite ratio left out")


def _ratio_rows(claim: Claim, con, cells: pd.DataFrame) -> list[dict]:
    value = "prefill_tokens_per_second" if claim.metric == "prefill_ratio" else "decode_tokens_per_second"
    pp = _per_prompt(con, value)
    pp = pp[pp["method"] == claim.method]
    excluded = _excluded(con)
    r = claim.rule
    rows = []
    for cell in cells.itertuples():
        mine = pp[(pp["comparable"] == cell.comparable) & (pp["chip"] == cell.chip)]
        gone = excluded[(excluded["comparable"] == cell.comparable) & (excluded["chip"] == cell.chip)]
        where = dict(chip=cell.chip, group=cell.comparable, differs=cell.differs)
        if claim.metric == "best_depth":
            rows_, dropped = _finite(mine[["machine_id", "prompt_id", "depth", "log_ratio", "repeats"]])
            d = inference.decide_best_depth(
                rows_, r.band_low, r.band_high, min_machines=r.min_machines, min_prompts=r.min_prompts
            )
            d = _with_dropped(_too_few_runs(claim, d, d.pairs), dropped)
            figure = NAN if d.best_depth is None else float(d.best_depth)
            row = _from_decision(d, figure=figure)
            if d.best_depth is not None:
                row["why"] += f"; the best depth's speedup {d.speedup:.3g}x, 95% interval {d.low:.3g}-{d.high:.3g}x"
            rows.append(dict(where, **row, excluded_runs=int(gone["excluded_runs"].sum())))
            continue
        for depth in claim.depths:
            at = mine[mine["depth"] == depth]
            at, dropped = _finite(at.drop(columns=["target_reference", "draft_reference", "prompt_set", "engine"]))
            e = inference.estimate(at)
            d = inference.decide(e, r.band_low, r.band_high, r.min_machines, r.min_prompts)
            d = _with_dropped(_too_few_runs(claim, d, e.pairs), dropped)
            row = _from_decision(d)
            row["why"] = (f"K={depth}: " if len(claim.depths) > 1 else "") + row["why"]
            excl = int(gone.loc[gone["depth"] == depth, "excluded_runs"].sum())
            rows.append(dict(where, **row, excluded_runs=excl))
    return rows


def _change_rows(claim: Claim, con) -> list[dict]:
    """A claim about a change between versions (conditions.version {from, to}), settled by the
    version comparison (specfleet/versions.py settle): per setting (group: the setting's id),
    chip and depth, the ratio to / from of its figure, paired by machine, against its band."""
    where, params = conditions_sql(claim)
    per_prompt = con.execute(
        f"SELECT {versions.SETTING_SQL} AS setting, {versions.VERSION_SQL} AS version, chip, method, depth,"
        " machine_id, prompt_id, avg(ln(decode_tokens_per_second)) AS log_tps,"
        " ln(nullif(avg(tokens_accepted / nullif(tokens_drafted, 0)), 0)) AS log_acceptance, count(*) AS repeats,"
        f" min(seq) AS first_seq FROM {speedup.valid_sql(_FLEET, DONE_JOBS)} WHERE {where}"
        " AND decode_tokens_per_second > 0 AND env_nominal IS DISTINCT FROM false AND lossless IS DISTINCT FROM false"
        " GROUP BY ALL",
        params,
    ).df()
    r, rows = claim.rule, []
    change = claim.conditions["version"]
    settled = versions.settle(
        per_prompt, change, claim.metric, claim.method, r.band_low, r.band_high, r.min_machines, r.min_prompts
    )
    for at, d in settled:
        if claim.depths and at["depth"] not in claim.depths:
            continue
        row = _from_decision(_too_few_runs(claim, d, d.pairs))
        row["why"] = f"{at['old']} → {at['new']}, K={at['depth']} ({at['how']}): {row['why']}"
        rows.append(dict(chip=at["chip"], group=at["setting"], differs="", excluded_runs=0, **row))
    if not rows:
        why = f"no setting with runs on both sides of {change['from']} → {change['to']}"
        rows.append(dict(chip=_chip_label(claim.conditions.get("chip")), group="", differs="", excluded_runs=0,
                         machines=0, prompts=0, runs=0, verdict=inference.INCONCLUSIVE, why=why))  # fmt: skip
    return rows


def _mean_rows(claim: Claim, con, cells: pd.DataFrame) -> list[dict]:
    """Acceptance rate or decode tok/s of the arm's runs (RUN_VALUES), calibrated as the speedups
    are. Acceptance: each run's accepted / drafted, the mean over a prompt's runs, over a machine's
    prompts, then t over machine means on the rate's own scale (inference.estimate_mean,
    docs/verdicts.md: coverage 0.94-0.96 where the median's two-level bootstrap held 0.91-0.97 and
    leaned one way at the edge). Tok/s, whose machines differ by a factor: the same on the log
    scale, as the speedups' (inference.estimate on each prompt's mean log tok/s; the figure is the
    geometric mean; bench/verdicts.py --section tokens: coverage 0.94-0.96, contradicted on the
    band's edge 0.024-0.025 where the linear scale gave 0.030-0.034). The band rule with its
    p-values, and the false-discovery step with every other verdict. Runs of completed attempts
    only; runs that were not nominal are left out and counted."""
    value, has = RUN_VALUES[claim.metric]
    values = con.execute(
        f"SELECT comparable, chip, depth, machine_id, prompt_id, {value} AS rate, tokens_accepted, tokens_drafted,"
        " env_nominal IS NOT DISTINCT FROM false AS degraded"
        f" FROM {speedup.flagged_sql(speedup.valid_sql('arm', DONE_JOBS))} WHERE {has}"
    ).df()
    r = claim.rule
    rows = []
    for cell in cells.itertuples():
        where = dict(chip=cell.chip, group=cell.comparable, differs=cell.differs)
        for depth in claim.depths:
            at = values[
                (values["comparable"] == cell.comparable) & (values["chip"] == cell.chip) & (values["depth"] == depth)
            ]
            degraded = at["degraded"].fillna(False).astype(bool)
            if claim.metric == "tokens_per_second":
                logs = at[~degraded].assign(log_ratio=np.log(at.loc[~degraded, "rate"].astype(float)))
                per_prompt = logs.groupby(["machine_id", "prompt_id"], as_index=False).agg(
                    log_ratio=("log_ratio", "mean"), repeats=("log_ratio", "size")
                )
                e = inference.estimate(per_prompt)
            else:
                e = inference.estimate_mean(at[~degraded], "rate")
            d = _too_few_runs(
                claim, inference.decide(e, r.band_low, r.band_high, r.min_machines, r.min_prompts), e.pairs
            )
            row = _from_decision(d)
            if claim.metric == "tokens_per_second":  # the log scale's figures are speeds, not ratios
                row["why"] = re.sub(r"(\d)x\b", r"\1 tok/s", row["why"]).replace(" pair(s)", " run(s)")
            if claim.metric == "acceptance_rate" and len(at[~degraded]):  # llama-server's own: the pooled ratio
                kept = at[~degraded]
                pooled = float(kept["tokens_accepted"].sum()) / max(float(kept["tokens_drafted"].sum()), 1.0)
                row["why"] += f"; pooled accepted / drafted {pooled:.3f} (the ratio llama-server reports)"
            row["why"] = (f"K={depth}: " if len(claim.depths) > 1 else "") + row["why"]
            rows.append(dict(where, **row, excluded_runs=int(degraded.sum())))
    return rows


def _runs_rows(con, cells: pd.DataFrame) -> list[dict]:
    counts = con.execute(
        "SELECT comparable, chip, count(*) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS runs,"
        " count(*) FILTER (WHERE env_nominal IS NOT DISTINCT FROM false) AS excluded_runs,"
        " count(DISTINCT machine_id) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS machines,"
        " count(DISTINCT prompt_id) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS prompts"
        " FROM arm GROUP BY ALL ORDER BY chip, runs DESC, comparable"
    ).df()
    label = dict(zip(cells["comparable"], cells["differs"]))
    return [
        dict(
            chip=r.chip,
            group=r.comparable,
            verdict=inference.CONTRADICTED,
            figure=float(r.runs),
            machines=int(r.machines),
            prompts=int(r.prompts),
            runs=int(r.runs),
            excluded_runs=int(r.excluded_runs),
            differs=label.get(r.comparable, ""),
            tested=False,
            why=f"the fleet holds {r.runs} run(s) on {r.machines} machine(s)",
        )
        for r in counts.itertuples()
        if r.runs > 0
    ]


def _no_run(claim: Claim, none: dict, sel: dict) -> dict:
    """The one row of a claim no run matches: an absence claim holds, any other is
    inconclusive, saying whether the fleet holds no run of the claim's system at all or none
    on its other conditions, and what the conditions left out."""
    if claim.metric == "runs":
        return dict(none, verdict=inference.REPRODUCED, figure=0.0, why=f"no run of {claim.label} in the fleet yet")
    if claim.system == OURS:
        why = "no run in the fleet matches its conditions"
    elif not sel.get("of_system"):
        why = f"no runs of {claim.label} in the fleet yet"
    else:
        why = f"no run of {claim.label} in the fleet matches its other conditions"
    if sel.get("excluded"):
        why += " (" + selection_text(sel) + ")"
    return dict(none, verdict=inference.INCONCLUSIVE, why=why)


def beside(claim: Claim, con: duckdb.DuckDBPyConnection) -> str:
    """For a claim about another system than ours: our loop of the same method on the same
    weights and the claim's other conditions (our_loop), per chip, as one line ("our loop,
    same weights (specfleet llama.cpp mtp) on Apple M1 Max: 0.87 [0.84, 0.9], 2 machine(s)").
    Shown beside the claim's verdict, never as it; '' when there is no such loop or run."""
    ours = our_loop(claim)
    if ours is None or not has_runs(con):
        return ""
    out = _evaluate(ours, con)
    out = out[out["runs"] > 0]
    parts = []
    for r in out.itertuples():
        depth = r.why.split(": ", 1)[0] + " " if r.why.startswith("K=") else ""
        if claim.metric == "runs":
            parts.append(f"{r.chip}: {r.runs} run(s) on {r.machines} machine(s)")
        elif r.figure == r.figure:
            interval = "" if r.ci_low != r.ci_low else f" [{r.ci_low:.3g}, {r.ci_high:.3g}]"
            parts.append(f"{r.chip}: {depth}{r.figure:.3g}{interval}, {r.machines} machine(s)")
    if not parts:
        return ""
    return f"our loop, same weights ({ours.label}) on " + "; ".join(parts)


def evaluate(claim: Claim, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per comparable group and chip (and depth, for a claim of several) in
    VERDICT_COLUMNS: the verdict, the figure (specfleet.speedup's speedup for ratios), its
    interval, the machines, fewest prompts and runs (pairs, for a ratio) behind it, the runs
    left out as not nominal, the verdict's p-value, and why. Runs that differ in a checked key
    are never pooled: `differs` names each group's values of the keys in which the claim's
    groups differ. `con` holds the runs (`runs`: the typed run columns, RunRecord.columns() and
    the coordinator's, as the mirror holds them) and `jobs` (job_id, attempt, state: which
    attempts are valid); evaluate leaves temporary tables on it. Only runs of
    the claim's system settle it; for a claim about another system, `beside` holds our loop's
    figure of the same method on the same weights wherever it has runs (never the verdict).
    adjusted_verdict is the verdict itself here; `evaluate_all` applies the false-discovery
    step across claims."""
    out = _evaluate(claim, con)
    out["beside"] = beside(claim, con)
    return out


def _evaluate(claim: Claim, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    pattern = claim.conditions.get("chip")
    none = dict(
        chip=_chip_label(pattern), group="", machines=0, prompts=0, runs=0, excluded_runs=0, unsteady_runs=0, differs=""
    )
    if not has_runs(con):
        return _rows(claim, [_no_run(claim, none, {})])
    _matched(claim, con)
    cells = con.execute(
        "SELECT comparable, chip, count(*) AS runs FROM arm GROUP BY ALL ORDER BY chip, runs DESC, comparable"
    ).df()
    if cells.empty:
        return _rows(claim, [_no_run(claim, none, selection(claim, con))])
    groups = speedup.groups(con, "arm").set_index("comparable")
    differs = speedup.what_differs(groups.reset_index())
    cells["differs"] = ["; ".join(f"{k}={_short(groups.loc[g, k])}" for k in differs) for g in cells["comparable"]]
    if claim.metric == "runs":
        rows = _runs_rows(con, cells)
        if not rows:
            excluded = int(
                con.execute("SELECT count(*) FROM arm WHERE env_nominal IS NOT DISTINCT FROM false").fetchone()[0]
            )
            rows = [dict(_no_run(claim, none, {}), excluded_runs=excluded)]
    elif versions.is_change(claim.conditions.get("version")):
        rows = _change_rows(claim, con)
    elif claim.metric in RUN_VALUES:
        rows = _mean_rows(claim, con, cells)
    else:
        rows = _ratio_rows(claim, con, cells)
    return _with_unsteady(_rows(claim, rows), con)


def _with_unsteady(out: pd.DataFrame, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """unsteady_runs: the claim's runs (its arm's and their baselines') in each row's group and
    chip whose warm-up reached the sweep's cap without two runs within 5% (warmup_converged
    false). They still count; the Questions page flags them."""
    counts = con.execute(
        "SELECT comparable, chip, count(*) AS n FROM matched WHERE warmup_converged IS NOT DISTINCT FROM false"
        " GROUP BY ALL"
    ).fetchall()
    by = {(g, c): int(n) for g, c, n in counts}
    out["unsteady_runs"] = [by.get((g, c), 0) for g, c in zip(out["group"], out["chip"])]
    return out


def _rows(claim: Claim, rows: list[dict]) -> pd.DataFrame:
    defaults = dict(
        figure=NAN, ci_low=NAN, ci_high=NAN, p_value=NAN, tested=False, probability=NAN, beside="", unsteady_runs=0
    )
    out = pd.DataFrame([{**defaults, "claim": claim.id, **r} for r in rows], columns=VERDICT_COLUMNS)
    out["adjusted_verdict"] = out["verdict"]
    out["tested"] = out["tested"].astype(bool)
    return out


def _decision_key(r) -> tuple:
    """What makes two rows one decision: the same runs (group, chip) tested the same way (the same
    p-value and verdict): a claim stated twice, or with the same band twice, counts once."""
    return (r.group, r.chip, r.verdict, round(float(r.p_value), 12) if r.p_value == r.p_value else None)


def adjust(verdicts: pd.DataFrame, q: float = FDR_Q) -> pd.DataFrame:
    """The false-discovery step (inference.adjust) over every tested decision of the frame
    (claims x groups x chips x depths): adjusted_p, and adjusted_verdict, the verdict that stands
    after it (inconclusive when its adjusted p-value exceeds q). Decisions share runs (nested
    bands, the net-loss claims at n2 and n6, thinking on and off), so the step is
    Benjamini-Yekutieli's, valid under any dependence, and identical decisions (_decision_key)
    enter the family once. The raw verdict stays in `verdict`; untested rows keep theirs."""
    out = verdicts.copy()
    keys = [_decision_key(r) for r in out.itertuples()]
    first = {}
    for i, (key, tested) in enumerate(zip(keys, out["tested"])):
        if tested:
            first.setdefault(key, i)
    decisions = [
        inference.Decision(
            verdict=r.verdict,
            why=r.why,
            speedup=NAN,
            low=NAN,
            high=NAN,
            machines=0,
            prompts=0,
            pairs=0,
            band_low=0.0,
            band_high=math.inf,
            p_value=1.0 if r.p_value != r.p_value else float(r.p_value),
            tested=bool(r.tested) and first.get(keys[i]) == i,  # a repeat decision counts once
        )
        for i, r in enumerate(out.itertuples())
    ]
    adjusted = inference.adjust(decisions, q=q, dependent=True)
    for i, key in enumerate(keys):  # a repeat of a decision stands or falls with its first
        if out["tested"].iloc[i] and first.get(key) != i:
            lead = adjusted[first[key]]
            adjusted[i] = dataclasses.replace(
                adjusted[i], verdict=lead.verdict, why=lead.why, adjusted_p=lead.adjusted_p, tested=True
            )
    out["adjusted_verdict"] = [d.verdict for d in adjusted]
    out["adjusted_p"] = [NAN if d.adjusted_p is None else d.adjusted_p for d in adjusted]
    changed = out["adjusted_verdict"] != out["verdict"]
    out.loc[changed, "why"] = [d.why for d, c in zip(adjusted, changed) if c]
    return out


def evaluate_all(claims: list[Claim], con: duckdb.DuckDBPyConnection, q: float = FDR_Q) -> pd.DataFrame:
    """Every claim's rows, then the false-discovery step over all their tested decisions."""
    frames = [evaluate(c, con) for c in claims]
    if not frames:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    return adjust(pd.concat(frames, ignore_index=True), q)


# ---------------------------------------------------------------- the sweep that tests a claim


def conflicting(claim: Claim, ledger: list[Claim]) -> list[Claim]:
    """The ledger's claims held against `claim`, whichever of the two records names the other:
    the Questions page shows their verdicts side by side."""
    return [c for c in ledger if c.id != claim.id and (c.id in claim.conflicts or claim.id in c.conflicts)]


def _sweep_settings(claim: Claim) -> dict[str, Any]:
    """The sweep fields of the declared settings the claim names (specfleet/settings.py `sweep`,
    dotted: "spec_draft.n_min" -> {spec_draft: {n_min: ...}}): the sweep varies exactly them."""
    out: dict[str, Any] = {}
    for name, setting in DECLARED_CONDITIONS.items():
        value = claim.conditions.get(name)
        if value is None or not setting.sweep:
            continue
        *parents, leaf = setting.sweep.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        values = _as_list(value)
        node[leaf] = values if len(values) > 1 else values[0]
    return out


def sweep_depths(claim: Claim) -> list[int]:
    """The depths a claim's sweep measures: the claim's own, or for a claim of any depth the
    method's default (llama.cpp's: --spec-draft-n-max 3, ngram-mod's n_max 64, ...; 3 for
    our other loops)."""
    if claim.depths:
        return claim.depths
    types = claim.method.split(",")
    return [server_arms.depth_flag(claim.method)[1] if all(t in SERVER_SPEC_TYPES for t in types) else 3]


def _needs_draft(method: str) -> bool:
    return method in ("draft", "ref-draft") or "draft-simple" in method.split(",")


def sweep_yaml(claim: Claim) -> str:
    """A sweep file that measures the claim's arm against the baseline on the claim's own
    system and chips: in-process methods for our loops, llama-server arms (`spec_type` and its
    depths, with the source's server flags), or an OpenAI-compatible server's command templates
    (SERVER_PRESETS, or the claim's sweep.command and sweep.arm_command). A claim about
    another system gets our loop of the same method on the same weights as the file's second
    engine (our_loop), whose runs stand beside the verdict."""
    c = claim.conditions
    engine, method = claim.engine, claim.method
    depths = sweep_depths(claim)
    named = (c.get("models") or ["target"])[0].split("/")[-1]
    gguf = engine in ("llama.cpp", LLAMA_SERVER) and not named.endswith(".gguf")
    target = claim.sweep.get("target") or "/models/" + named + (".gguf" if gguf else "")
    models = {"target": target}
    if _needs_draft(method):
        models["draft"] = claim.sweep.get("draft") or target + "-draft"
    ours = our_loop(claim)
    engines = [engine] + ([ours.engine] if ours else [])
    notes = []
    doc: dict[str, Any] = {"name": f"claim-{claim.id}"}
    chip = c.get("chip")
    if chip == "Apple*":
        doc["target"] = {"chip_families": list(MAC_FAMILIES)}
    elif chip and not chip.endswith("*"):
        doc["target"] = {"chips": [chip]}
    if c.get("memory_gb") is not None:  # a machine's memory is measured, not set: the sweep targets it
        doc.setdefault("target", {})["min_memory_gb"] = min(_as_list(c["memory_gb"]))
    doc.update(
        models={e: dict(models) for e in engines},
        engines=engines,
        samplers=[dict(c.get("sampler") or {"temperature": 0})],
        prompt_sets=[c.get("prompt_set") or (_as_list(c.get("prompt_category")) or ["conversation"])[0]],
    )
    in_process = claim if engine in IN_PROCESS_ENGINES else ours
    if in_process is not None:
        doc["methods"] = {in_process.method: list(depths)}
        if in_process.method in ("ngram", "ref-ngram"):
            doc["ngram"] = {"n_min": 1, "n_max": 3}
    if engine == LLAMA_SERVER:
        if claim.sweep.get("flags"):
            doc["server"] = {"flags": claim.sweep["flags"]}
            notes.append(f"llama-server's flags are the source's: {claim.sweep['flags']}")
        doc["arms"] = [{"spec_type": method, "depths": list(depths)}]
    elif engine == "openai":
        preset = SERVER_PRESETS.get(claim.system, {})
        arm = claim.sweep.get("arm_command") or preset[method]  # sets {depth}: the ledger checks it
        doc["server"] = {"system": claim.system, "command": claim.sweep.get("command") or preset["baseline"]}
        doc["arms"] = [{"method": method, "depths": list(depths), "command": arm}]
    doc.update(_sweep_settings(claim))
    # Warm-up as every sweep's default (JobSpec.warmup: until two runs agree within 5%, at most 10).
    doc.update(max_new_tokens=claim.sweep.get("max_new_tokens", 256), repeats=SWEEP_REPEATS)
    header = f"# Tests claim {claim.id}: {claim.statement}\n"
    if claim.system != OURS:
        header += f"# The claim is about {claim.label}: only its runs settle it.\n"
    if ours is not None:
        header += (
            f"# Engine {ours.engine} runs our loop of the same method on the same weights ({ours.label}):"
            " shown beside the verdict, never as it.\n"
        )
    header += "".join(f"# {n}.\n" for n in notes)
    header += "# Point models at your files, then: specfleet sweep submit FILE\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)

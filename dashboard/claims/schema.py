"""The ledger file (dashboard/claims.yaml): read and check its records into Claims; a
ClaimError names every faulty field."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from dashboard.claims.claim import (
    DECLARED_CONDITIONS,
    ID_RE,
    LLAMA_SERVER,
    METRICS,
    MIN_MACHINES_FLEET,
    MIN_MACHINES_NAMED_CHIP,
    MIN_PROMPTS,
    OURS,
    OWN_CONDITIONS,
    RULE_FIELDS,
    RULE_METRICS,
    SAMPLER_KEYS,
    SERVER_PRESETS,
    SWEEP_FIELDS,
    Claim,
    Rule,
    _as_list,
)
from specfleet import versions
from specfleet.record import (
    ENGINE_METHODS,
    ENGINES,
    IN_PROCESS_ENGINES,
    MAX_DEPTH,
    PROMPT_CATEGORIES,
    VERIFY_COST,
    is_method,
    is_speculative,
    least_depth,
)
from specfleet.schemas import setting_problem

LEDGER = Path(__file__).parents[1] / "claims.yaml"
CLAIM_KEYS = {"id", "statement", "source", "conditions", "metric", "expected", "verdict", "sweep", "note", "conflicts"}
CONDITION_KEYS = OWN_CONDITIONS | set(DECLARED_CONDITIONS)
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ClaimError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("invalid claims ledger: " + "; ".join(problems))
        self.problems = problems


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

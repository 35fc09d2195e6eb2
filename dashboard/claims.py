"""The claims ledger: load and check the records, settle each claim per chip from fleet runs,
and write the sweep that would test it. No Streamlit here; the Questions page arranges it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dashboard import stats
from specfleet.record import ENGINES, MAX_DEPTH, METHODS, REFERENCE_METHODS

LEDGER = Path(__file__).with_name("claims.yaml")
METRICS = ("speedup", "prefill_ratio", "acceptance_rate", "best_depth", "runs")
RULE_FIELDS = {
    "range": ("low", "high"),
    "above": ("threshold",),
    "below": ("threshold",),
    "best_depth_in": ("low", "high"),
    "none_measured": (),
}
RULE_METRICS = {"best_depth_in": ("best_depth",), "none_measured": ("runs",)}
CLAIM_KEYS = {"id", "statement", "source", "conditions", "metric", "expected", "verdict", "sweep", "note"}
CONDITION_KEYS = {"engine", "method", "model_family", "quantisation", "chip", "depth", "sampler", "prompt_set"}
SAMPLER_KEYS = ("temperature", "top_p", "top_k", "seed")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,79}$")
SWEEP_REPEATS = 5
MAC_FAMILIES = ("M1", "M2", "M3", "M4", "M5")  # "Apple*" claims target every Mac of the fleet


class ClaimError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("invalid claims ledger: " + "; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    source: dict[str, str]
    conditions: dict[str, Any]
    metric: str
    expected: str
    rule: stats.Rule
    sweep: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def depths(self) -> list[int]:
        d = self.conditions.get("depth")
        return [] if d is None else list(d) if isinstance(d, list) else [d]


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
        fail("conditions", "is required: a mapping of engine, method, model_family, chip, depth, sampler")
        cond = {}
    for key in sorted(set(cond) - CONDITION_KEYS, key=str):
        fail(f"conditions.{key}", f"unknown field (allowed: {', '.join(sorted(CONDITION_KEYS))})")
    if cond.get("engine") not in ENGINES:
        fail("conditions.engine", f"is required: one of {', '.join(ENGINES)}")
    methods = [m for m in METHODS + REFERENCE_METHODS if m != "baseline"]
    if cond.get("method") not in methods:
        fail("conditions.method", f"is required: one of {', '.join(methods)}")
    for name in ("model_family", "quantisation", "chip", "prompt_set"):
        if cond.get(name) is not None and not isinstance(cond[name], str):
            fail(f"conditions.{name}", "must be a string or null")
    depth = cond.get("depth")
    depths = depth if isinstance(depth, list) else [depth]
    if not depths or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DEPTH for d in depths):
        fail("conditions.depth", f"is required: a draft depth 0-{MAX_DEPTH} or a list of them")
    sampler = cond.get("sampler", {})
    if not isinstance(sampler, dict):
        fail("conditions.sampler", "must be a mapping of temperature, top_p, top_k, seed")
        sampler = {}
    for key, value in sampler.items():
        if key not in SAMPLER_KEYS:
            fail(f"conditions.sampler.{key}", f"unknown field (allowed: {', '.join(SAMPLER_KEYS)})")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"conditions.sampler.{key}", f"must be a number, got {value!r}")

    v = rec.get("verdict")
    rule = None
    if not isinstance(v, dict) or v.get("rule") not in RULE_FIELDS:
        fail("verdict.rule", f"is required: one of {', '.join(RULE_FIELDS)}")
    else:
        for key in sorted(set(v) - {"rule", "low", "high", "threshold", "min_machines", "min_runs"}, key=str):
            fail(f"verdict.{key}", "unknown field")
        for name in RULE_FIELDS[v["rule"]]:
            if isinstance(v.get(name), bool) or not isinstance(v.get(name), (int, float)):
                fail(f"verdict.{name}", f"is required for rule {v['rule']}: a number")
        if v["rule"] in RULE_METRICS and rec.get("metric") not in RULE_METRICS[v["rule"]]:
            fail("verdict.rule", f"{v['rule']} needs metric {' or '.join(RULE_METRICS[v['rule']])}")
        if v["rule"] not in RULE_METRICS and rec.get("metric") in ("best_depth", "runs"):
            fail("verdict.rule", f"metric {rec['metric']} needs rule best_depth_in or none_measured")
        if isinstance(v.get("low"), (int, float)) and isinstance(v.get("high"), (int, float)) and v["low"] > v["high"]:
            fail("verdict.low", f"must not exceed verdict.high ({v['high']})")
        for name in ("min_machines", "min_runs"):
            if name in v and (not isinstance(v[name], int) or isinstance(v[name], bool) or v[name] < 1):
                fail(f"verdict.{name}", "must be a positive integer")
        if len(problems) == before:
            rule = stats.Rule(
                rule=v["rule"],
                low=v.get("low"),
                high=v.get("high"),
                threshold=v.get("threshold"),
                min_machines=v.get("min_machines", 1),
                min_runs=v.get("min_runs", 3),
            )
    sweep = rec.get("sweep", {})
    paths_ok = isinstance(sweep, dict) and all(
        k in ("target", "draft") and isinstance(x, str) for k, x in sweep.items()
    )
    if not paths_ok:
        fail("sweep", "must be a mapping {target, draft} of model paths")
    if rec.get("note") is not None and not isinstance(rec["note"], str):
        fail("note", "must be a string")
    if len(problems) != before or rule is None:
        return None
    return Claim(
        id=rec["id"],
        statement=rec["statement"].strip(),
        source=source,
        conditions={**cond, "sampler": sampler},
        metric=rec["metric"],
        expected=str(rec["expected"]),
        rule=rule,
        sweep=sweep,
        note=(rec.get("note") or "").strip(),
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
    if problems:
        raise ClaimError(problems)
    return claims


def load_claims(path: Path = LEDGER) -> list[Claim]:
    return parse_claims(Path(path).read_text())


# ---------------------------------------------------------------- matching runs


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def parse_sampler(text: str) -> dict[str, float]:
    """'temperature=0.0,top_p=1.0,top_k=0,seed=0' -> {'temperature': 0.0, ...}."""
    out = {}
    for part in str(text or "").split(","):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            continue
    return out


def _chip_ok(pattern: str | None, chip: str) -> bool:
    if pattern is None:
        return True
    if pattern.endswith("*"):
        return chip.startswith(pattern[:-1])
    return chip == pattern


def _chip_label(pattern: str | None) -> str:
    """The chip column of a verdict row when no chip has data."""
    if not pattern:
        return "any chip"
    return "any Mac" if pattern == "Apple*" else pattern


def matching_runs(claim: Claim, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs inside the claim's conditions (its arm and the baselines of the same cells).
    `runs` needs engine, method, depth, chip, model, sampler, prompt_set; optional
    model_family and quantisation (from params) are preferred over the model path."""
    c = claim.conditions
    if runs.empty:
        return runs
    keep = runs["engine"].eq(c["engine"]) & runs["method"].isin(["baseline", c["method"]])
    keep &= runs["method"].eq("baseline") | runs["depth"].isin(claim.depths)
    keep &= runs["chip"].map(lambda chip: _chip_ok(c.get("chip"), chip))
    for name in ("model_family", "quantisation"):
        if c.get(name):
            want = _norm(c[name])
            declared = runs[name] if name in runs else pd.Series("", index=runs.index)
            text = declared.where(declared.fillna("").astype(bool), runs["model"]).fillna("")
            keep &= text.map(lambda t, w=want: w in _norm(t))
    if c.get("prompt_set"):
        keep &= runs["prompt_set"].eq(c["prompt_set"])
    wanted = c.get("sampler", {})
    if wanted:
        keep &= runs["sampler"].map(
            lambda s: all(np.isclose(parse_sampler(s).get(k, np.nan), float(v)) for k, v in wanted.items())
        )
    return runs[keep]


def evaluate(claim: Claim, runs: pd.DataFrame, seed: int = stats.BOOTSTRAP_SEED) -> pd.DataFrame:
    """One row per chip: verdict, figure, interval, machines, runs, excluded runs and why."""
    cols = ["claim", "chip", "verdict", "figure", "ci_low", "ci_high", "machines", "runs", "excluded_runs", "why"]
    matched = matching_runs(claim, runs)
    arm = matched[matched["method"] == claim.conditions["method"]] if not matched.empty else matched
    rows = []
    if claim.metric == "runs":
        for chip, group in arm.groupby("chip", sort=True) if not arm.empty else []:
            ok = group[group.get("nominal", pd.Series("unknown", index=group.index)) != "degraded"]
            if ok.empty:
                continue
            rows.append(
                dict(
                    chip=chip,
                    verdict=stats.CONTRADICTED,
                    figure=float(len(ok)),
                    machines=int(ok["agent_id"].nunique()),
                    runs=len(ok),
                    excluded_runs=len(group) - len(ok),
                    why=f"the fleet holds {len(ok)} run(s) on {ok['agent_id'].nunique()} machine(s)",
                )
            )
        if not rows:
            rows.append(
                dict(
                    chip=_chip_label(claim.conditions.get("chip")),
                    verdict=stats.REPRODUCED,
                    figure=0.0,
                    machines=0,
                    runs=0,
                    excluded_runs=len(arm),
                    why="no such run in the fleet yet",
                )
            )
        return pd.DataFrame([{"claim": claim.id, **r} for r in rows], columns=cols)

    if claim.metric == "acceptance_rate":
        values = arm.assign(
            ratio=arm["acceptance_rate"] if "acceptance_rate" in arm else np.nan,
            degraded=arm.get("nominal", pd.Series("unknown", index=arm.index)).eq("degraded"),
        ).dropna(subset=["ratio"])
    else:
        column = "prefill_tokens_per_second" if claim.metric == "prefill_ratio" else "decode_tokens_per_second"
        values = stats.paired_ratios(matched, column)
    summary = stats.summarise(values, by=("chip", "depth"), seed=seed)

    chips = sorted(set(summary["chip"]))
    pattern = claim.conditions.get("chip")
    if not chips:
        chips = [_chip_label(pattern)]
    for chip in chips:
        mine = summary[summary["chip"] == chip]
        if claim.metric == "best_depth":
            v, best = stats.best_depth_verdict(claim.rule, mine)
            # The figure is a depth; the interval of its speedup goes into `why`.
            row = {} if best is None else dict(figure=float(best["depth"]))
            if best is not None:
                v = stats.Verdict(
                    v.verdict, f"{v.why}; its speedup 95% CI [{best['ci_low']:.3g}, {best['ci_high']:.3g}]"
                )
            rows.append(
                dict(
                    chip=chip,
                    verdict=v.verdict,
                    machines=int(mine["machines"].max()) if len(mine) else 0,
                    runs=int(mine["runs"].sum()),
                    excluded_runs=int(mine["excluded_runs"].sum()),
                    why=v.why,
                    **row,
                )
            )
            continue
        if mine.empty:
            nan = float("nan")
            r = dict(median=nan, ci_low=nan, ci_high=nan, machines=0, runs=0, excluded_runs=0)
        else:
            r = mine.iloc[0].to_dict()
        v = stats.verdict(claim.rule, r["median"], r["ci_low"], r["ci_high"], int(r["machines"]), int(r["runs"]))
        rows.append(
            dict(
                chip=chip,
                verdict=v.verdict,
                figure=r["median"],
                ci_low=r["ci_low"],
                ci_high=r["ci_high"],
                machines=int(r["machines"]),
                runs=int(r["runs"]),
                excluded_runs=int(r["excluded_runs"]),
                why=v.why,
            )
        )
    return pd.DataFrame([{"claim": claim.id, **r} for r in rows], columns=cols)


# ---------------------------------------------------------------- the sweep that tests a claim


def sweep_yaml(claim: Claim) -> str:
    """A sweep file that measures the claim's arm against the baseline on the claim's chips."""
    c = claim.conditions
    engine = c["engine"]
    default = "/models/" + ("-".join(filter(None, [c.get("model_family"), c.get("quantisation")])) or "target")
    target = claim.sweep.get("target") or (default + (".gguf" if engine == "llama.cpp" else ""))
    models = {"target": target}
    if c["method"] in ("draft", "ref-draft"):
        models["draft"] = claim.sweep.get("draft") or target + "-draft"
    doc: dict[str, Any] = {"name": f"claim-{claim.id}"}
    chip = c.get("chip")
    if chip == "Apple*":
        doc["target"] = {"chip_families": list(MAC_FAMILIES)}
    elif chip and not chip.endswith("*"):
        doc["target"] = {"chips": [chip]}
    doc.update(
        models={engine: models},
        engines=[engine],
        samplers=[dict(c.get("sampler") or {"temperature": 0})],
        prompt_sets=[c.get("prompt_set") or "chat"],
        methods={c["method"]: claim.depths},
        max_new_tokens=256,
        warmup=3,
        repeats=SWEEP_REPEATS,
    )
    if c["method"] in ("ngram", "ref-ngram"):
        doc["ngram"] = {"n_min": 1, "n_max": 3}
    header = (
        f"# Tests claim {claim.id}: {claim.statement}\n"
        "# Point models at your files, then: specfleet sweep submit FILE\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)

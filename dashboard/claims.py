"""The claims ledger: load and check the records, settle each claim per comparable group and
chip from fleet runs, and write the sweep that would test it. No Streamlit here; the
Questions page arranges it.

A claim's conditions select runs by their recorded fields (engine, arm, chip, the target's
recorded name, architecture, size and quantisation, sampler, prompt set); the runs it selects
are then split by comparable group (specfleet/record.py CHECKED_KEYS) and never pooled across
groups. Ratios are specfleet/speedup.py's speedup, the one definition."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import yaml

from dashboard import stats
from specfleet import speedup
from specfleet.record import CHECKED_KEYS, ENGINES, MAX_DEPTH, METHODS, REFERENCE_METHODS

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
    def method(self) -> str:
        return self.conditions["method"]

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

# What evaluate() reads of a run; the nullable flags are cast so that a DataFrame built from
# Python values reads as the mirror's typed columns do.
_COLUMNS = (
    *CHECKED_KEYS,
    "job_id",
    "attempt",
    "lease_id",
    "agent_id",
    "chip",
    "method",
    "depth",
    "prompt_id",
    "repeat",
    "prompt_set",
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
_SELECT = (
    ", ".join(_COLUMNS) + ", CAST(env_nominal AS BOOLEAN) AS env_nominal, CAST(lossless AS BOOLEAN) AS lossless"
    f", {speedup.COMPARABLE_ID} AS comparable"
)
# A model family is a size ("9b", "0.8b") or a name and a size ("qwen3.6-27b"); a recorded
# parameter count must lie within these factors of the size it names.
SIZE_RE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)b(?![a-z0-9])")
SIZE_TOLERANCE = (0.7, 1.3)


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def _norm_sql(expr: str) -> str:
    return f"regexp_replace(lower({expr}), '[^a-z0-9]', '', 'g')"


# The recorded architecture in one spelling for both formats (agent/model_identity.py
# architecture_family): "Qwen3_5ForCausalLM" and "qwen35" -> "qwen35".
_ARCHITECTURE = _norm_sql("regexp_replace(target_architecture, '(For[A-Z][A-Za-z0-9_]*|Model)$', '')")


def family_size(family: str) -> float | None:
    """The parameter count a model family names ("qwen3.6-27b" -> 27e9), or None."""
    m = SIZE_RE.search(str(family).lower())
    return float(m.group(1)) * 1e9 if m else None


def conditions_sql(claim: Claim) -> tuple[str, dict]:
    """SQL condition on a run's typed columns for the claim's conditions (its arm, and the
    baselines of the same engine, chips, models and sampler), with its named parameters.

    model_family matches, ignoring case and punctuation, the target's recorded name (its hub
    id or file name, never a path) or its recorded architecture; a size it names must agree
    with the recorded parameter count where one is recorded. quantisation matches the
    recorded quantisation ("q4_k_m" matches Q4_K_M, "4bit" matches 4bit-g64); a run that
    records none does not match."""
    c = claim.conditions
    where = [
        "engine = $engine",
        "method IN ('baseline', $method)",
        "(method = 'baseline' OR list_contains($depths::INTEGER[], depth))",
    ]
    params: dict[str, Any] = {"engine": c["engine"], "method": c["method"], "depths": claim.depths}
    chip = c.get("chip")
    if chip and chip.endswith("*"):
        where.append("starts_with(chip, $chip)")
        params["chip"] = chip[:-1]
    elif chip:
        where.append("chip = $chip")
        params["chip"] = chip
    if c.get("prompt_set"):
        where.append("prompt_set = $prompt_set")
        params["prompt_set"] = c["prompt_set"]
    if c.get("quantisation"):
        where.append(f"target_quantisation != '' AND starts_with({_norm_sql('target_quantisation')}, $quantisation)")
        params["quantisation"] = _norm(c["quantisation"])
    if c.get("model_family"):
        where.append(f"(contains({_norm_sql('target_reference')}, $family) OR contains({_ARCHITECTURE}, $family))")
        params["family"] = _norm(c["model_family"])
        size = family_size(c["model_family"])
        if size:
            where.append("(target_parameters = 0 OR target_parameters BETWEEN $size_low AND $size_high)")
            params.update(size_low=size * SIZE_TOLERANCE[0], size_high=size * SIZE_TOLERANCE[1])
    for key, value in c.get("sampler", {}).items():
        where.append(f"abs(sampler_{key} - $sampler_{key}) < 1e-9")
        params[f"sampler_{key}"] = float(value)
    return " AND ".join(where), params


def _chip_label(pattern: str | None) -> str:
    """The chip column of a verdict row when no chip has data."""
    if not pattern:
        return "any chip"
    return "any Mac" if pattern == "Apple*" else pattern


def matching_runs(claim: Claim, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs inside the claim's conditions (its arm and the baselines), the columns
    evaluate() reads and each run's comparable group. `runs`: the typed run columns
    (RunRecord.columns() and the coordinator's), as the mirror holds them."""
    if runs.empty:
        return pd.DataFrame(columns=[*_COLUMNS, "env_nominal", "lossless", "comparable"])
    con = _matched(claim, runs)
    return con.execute("SELECT * FROM matched").df()


def _matched(claim: Claim, runs: pd.DataFrame, jobs: pd.DataFrame | None = None) -> duckdb.DuckDBPyConnection:
    """A connection holding the claim's runs as table `matched`, its arm's as `arm`, and the
    jobs (job_id, attempt, state) the speedup definition reads to keep only valid attempts."""
    con = duckdb.connect()
    if jobs is not None:
        con.register("jobs_frame", jobs)
        con.execute("CREATE TEMP TABLE jobs AS SELECT job_id, attempt, state FROM jobs_frame")
        con.unregister("jobs_frame")
    con.register("fleet", runs)
    where, params = conditions_sql(claim)
    con.execute(f"CREATE TEMP TABLE matched AS SELECT {_SELECT} FROM fleet WHERE {where}", params)
    con.unregister("fleet")
    con.execute("CREATE TEMP TABLE arm AS SELECT * FROM matched WHERE method = $method", {"method": claim.method})
    return con


# ---------------------------------------------------------------- verdicts

VERDICT_COLUMNS = [
    "claim",
    "chip",
    "group",
    "verdict",
    "figure",
    "ci_low",
    "ci_high",
    "machines",
    "prompts",
    "runs",
    "excluded_runs",
    "differs",
    "why",
]


def _figures(claim: Claim, con, seed: int) -> pd.DataFrame:
    """The claim's figure per comparable group, chip and depth: figure, ci_low, ci_high,
    machines, prompts, runs (pairs, for a ratio) and excluded_runs (left out: not nominal)."""
    cols = ["comparable", "chip", "depth", "figure", "ci_low", "ci_high", "machines", "prompts", "runs"]
    cols.append("excluded_runs")

    def query(sql, params=None):
        return con.execute(sql, params or []).df()

    if claim.metric == "acceptance_rate":
        values = query(
            "SELECT comparable, chip, depth, agent_id, prompt_id, tokens_accepted / tokens_drafted AS rate,"
            " env_nominal IS NOT DISTINCT FROM false AS degraded FROM arm WHERE tokens_drafted > 0"
        )
        out = stats.summarise(values, by=("comparable", "chip", "depth"), column="rate")
        return out.rename(columns={"median": "figure"})[cols]
    value = "prefill_tokens_per_second" if claim.metric == "prefill_ratio" else "decode_tokens_per_second"
    out = stats.speedups(query, "matched", seed=seed, value=value)
    out = out[out["method"] == claim.method]
    return out.rename(columns={"speedup": "figure", "pairs": "runs", "excluded_pairs": "excluded_runs"})[cols]


def _short(value) -> str:
    """A checked key's value as the page shows it: a SHA-256 by its first 12 hex digits."""
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{64}", text) else text


def evaluate(claim: Claim, runs: pd.DataFrame, jobs: pd.DataFrame, seed: int = stats.BOOTSTRAP_SEED) -> pd.DataFrame:
    """One row per comparable group and chip (VERDICT_COLUMNS): the verdict, the figure
    (specfleet.speedup's speedup for ratios), its interval, the machines, prompts and runs
    (pairs, for a ratio) behind it, the runs left out as not nominal, and why. Runs that differ
    in a checked key are never pooled: each comparable group is settled on its own, and
    `differs` names its values of the checked keys in which the claim's groups differ. `jobs`
    (job_id, attempt, state) says which attempts are valid: runs of a lost attempt or a failed
    job never count."""
    pattern = claim.conditions.get("chip")
    none = dict(chip=_chip_label(pattern), group="", machines=0, prompts=0, runs=0, differs="")
    if runs.empty:
        return _rows(claim, [_no_run(claim, none, 0)])
    con = _matched(claim, runs, jobs)
    cells = con.execute(
        "SELECT comparable, chip, count(*) AS runs FROM arm GROUP BY ALL ORDER BY chip, runs DESC, comparable"
    ).df()
    if cells.empty:
        return _rows(claim, [_no_run(claim, none, 0)])
    groups = speedup.groups(con, "arm").set_index("comparable")
    differs = speedup.what_differs(groups.reset_index())
    label = {g: "; ".join(f"{k}={_short(groups.loc[g, k])}" for k in differs) for g in groups.index}

    if claim.metric == "runs":
        counts = con.execute(
            "SELECT comparable, chip, count(*) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS runs,"
            " count(*) FILTER (WHERE env_nominal IS NOT DISTINCT FROM false) AS excluded_runs,"
            " count(DISTINCT agent_id) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS machines,"
            " count(DISTINCT prompt_id) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS prompts"
            " FROM arm GROUP BY ALL ORDER BY chip, runs DESC, comparable"
        ).df()
        rows = [
            dict(
                chip=r.chip,
                group=r.comparable,
                verdict=stats.CONTRADICTED,
                figure=float(r.runs),
                machines=int(r.machines),
                prompts=int(r.prompts),
                runs=int(r.runs),
                excluded_runs=int(r.excluded_runs),
                differs=label[r.comparable],
                why=f"the fleet holds {r.runs} run(s) on {r.machines} machine(s)",
            )
            for r in counts.itertuples()
            if r.runs > 0
        ]
        return _rows(claim, rows or [_no_run(claim, none, int(counts["excluded_runs"].sum()))])

    figures = _figures(claim, con, seed)
    rows = []
    for cell in cells.itertuples():
        mine = figures[(figures["comparable"] == cell.comparable) & (figures["chip"] == cell.chip)]
        where = dict(chip=cell.chip, group=cell.comparable, differs=label[cell.comparable])
        if claim.metric == "best_depth":
            v, best = stats.best_depth_verdict(claim.rule, mine)
            row = {} if best is None else dict(figure=float(best["depth"]))
            if best is not None:  # the figure is a depth; the interval of its speedup goes into `why`
                why = f"{v.why}; its speedup 95% CI [{best['ci_low']:.3g}, {best['ci_high']:.3g}]"
                v = stats.Verdict(v.verdict, why)
            rows.append(
                dict(
                    where,
                    verdict=v.verdict,
                    machines=int(mine["machines"].max()) if len(mine) else 0,
                    prompts=int(mine["prompts"].min()) if len(mine) else 0,
                    runs=int(mine["runs"].sum()),
                    excluded_runs=int(mine["excluded_runs"].sum()),
                    why=v.why,
                    **row,
                )
            )
            continue
        for depth in claim.depths:
            at = mine[mine["depth"] == depth]
            if at.empty:
                nan = float("nan")
                r = dict(figure=nan, ci_low=nan, ci_high=nan, machines=0, prompts=0, runs=0, excluded_runs=0)
            else:
                r = at.iloc[0].to_dict()
            v = stats.verdict(claim.rule, r["figure"], r["ci_low"], r["ci_high"], int(r["machines"]), int(r["runs"]))
            rows.append(
                dict(
                    where,
                    verdict=v.verdict,
                    figure=r["figure"],
                    ci_low=r["ci_low"],
                    ci_high=r["ci_high"],
                    machines=int(r["machines"]),
                    prompts=int(r["prompts"]),
                    runs=int(r["runs"]),
                    excluded_runs=int(r["excluded_runs"]),
                    why=(f"K={depth}: " if len(claim.depths) > 1 else "") + v.why,
                )
            )
    return _rows(claim, rows)


def _no_run(claim: Claim, none: dict, excluded: int) -> dict:
    """The one row of a claim no run matches: an absence claim holds, any other lacks data."""
    if claim.metric == "runs":
        why = "no such run in the fleet yet"
        return dict(none, verdict=stats.REPRODUCED, figure=0.0, excluded_runs=excluded, why=why)
    why = "no run in the fleet matches its conditions"
    return dict(none, verdict=stats.NOT_ENOUGH, excluded_runs=excluded, why=why)


def _rows(claim: Claim, rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"claim": claim.id, **r} for r in rows], columns=VERDICT_COLUMNS)


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
        prompt_sets=[c.get("prompt_set") or "conversation"],
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

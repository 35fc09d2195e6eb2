"""The claims ledger: load and check the records, settle each claim per comparable group and
chip from fleet runs, and write the sweep that would test it. No Streamlit here; the
Questions page arranges it.

Selection is exact. A claim's conditions name the system (engine and implementation: our own
in-process loops are "specfleet", which is all the fleet runs today; a claim about MTPLX or
llama-server selects only runs of that implementation, so none yet), the models by recorded
reference (Hugging Face id or file name) or digest, the recorded quantisation and architecture
(equal once normalised: lower case, punctuation dropped, an HF "...ForCausalLM" suffix
dropped), the sampler, the prompt category and set, and the context depth. Nothing is matched
by substring. The selected runs are split by comparable group (specfleet/record.py
CHECKED_KEYS) and chip and never pooled.

Verdicts are dashboard/inference.py's: a ratio's interval (t over machine means of
specfleet.speedup.per_prompt_sql's rows) against the claim's tolerance band, best depth by a
confidence set, and the false-discovery step over every claim's decisions (`evaluate_all`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import yaml

from dashboard import inference, stats
from specfleet import speedup
from specfleet.record import (
    ARCHITECTURE_SUFFIX,
    CHECKED_KEYS,
    ENGINES,
    MAX_DEPTH,
    METHODS,
    PROMPT_CATEGORIES,
    REFERENCE_METHODS,
    VERIFY_COST,
    architecture_family,
)

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
CONDITION_KEYS = {
    "engine",
    "implementation",
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
}
# Who ran the decode loop. "specfleet": our in-process loops (agent/), all the fleet runs today;
# the others are systems claims are made about, which select no run until the fleet runs them.
OURS = "specfleet"
IMPLEMENTATIONS = (OURS, "MTPLX", "llama-server draft-mtp", "llama-server ngram-mod")
SAMPLER_KEYS = ("temperature", "top_p", "top_k", "seed")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,79}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SWEEP_REPEATS = 5
MAC_FAMILIES = ("M1", "M2", "M3", "M4", "M5")  # "Apple*" claims target every Mac of the fleet
# Machines a verdict needs unless the record says otherwise: a claim about a Mac or every chip
# is about the fleet (3, inference.MIN_MACHINES); one about a named chip may rest on one
# machine of it, as its source did (the interval then describes that machine, and says so).
MIN_MACHINES_FLEET = inference.MIN_MACHINES
MIN_MACHINES_NAMED_CHIP = 1
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


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    source: dict[str, str]
    conditions: dict[str, Any]
    metric: str
    expected: str
    rule: Rule
    sweep: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def method(self) -> str:
        return self.conditions["method"]

    @property
    def implementation(self) -> str:
        return self.conditions.get("implementation") or OURS

    @property
    def system(self) -> str:
        """The system the claim is about, as the page names it."""
        return f"{self.implementation} ({self.conditions['engine']} {self.method})"

    @property
    def depths(self) -> list[int]:
        return _as_list(self.conditions.get("depth"))


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
        fail("conditions", "is required: a mapping of engine, implementation, method, models, chip, depth, sampler")
        cond = {}
    for key in sorted(set(cond) - CONDITION_KEYS, key=str):
        hint = " (models are named by exact reference: use models or digests)" if key == "model_family" else ""
        fail(f"conditions.{key}", f"unknown field (allowed: {', '.join(sorted(CONDITION_KEYS))}){hint}")
    if cond.get("engine") not in ENGINES:
        fail("conditions.engine", f"is required: one of {', '.join(ENGINES)}")
    if cond.get("implementation") is not None and cond["implementation"] not in IMPLEMENTATIONS:
        fail("conditions.implementation", f"must be one of {', '.join(IMPLEMENTATIONS)}")
    methods = [m for m in METHODS + REFERENCE_METHODS if m != "baseline"]
    if cond.get("method") not in methods:
        fail("conditions.method", f"is required: one of {', '.join(methods)}")
    for name in ("quantisation", "architecture", "chip", "prompt_set"):
        if cond.get(name) is not None and (not isinstance(cond[name], str) or not cond[name].strip()):
            fail(f"conditions.{name}", "must be a non-empty string or null")
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
    if not depths or not all(_is_int(d) and 0 <= d <= MAX_DEPTH for d in depths):
        fail("conditions.depth", f"is required: a draft depth 0-{MAX_DEPTH} or a list of them")
    sampler = cond.get("sampler", {})
    if not isinstance(sampler, dict):
        fail("conditions.sampler", "must be a mapping of temperature, top_p, top_k, seed")
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
        for key in sorted(set(v) - {"rule", "low", "high", "threshold", "min_machines", "min_runs"}, key=str):
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
        for name in ("min_machines", "min_runs"):
            if name in v and (not _is_int(v[name]) or v[name] < 1):
                fail(f"verdict.{name}", "must be a positive integer")
        if len(problems) == before:
            named_chip = isinstance(chip, str) and not chip.endswith("*")
            default = MIN_MACHINES_NAMED_CHIP if named_chip else MIN_MACHINES_FLEET
            rule = Rule(
                v["rule"], *_band(v), min_machines=v.get("min_machines", default), min_runs=v.get("min_runs", 1)
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


# ---------------------------------------------------------------- selecting runs

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
_SELECT = (
    ", ".join(_COLUMNS) + ", implementation, CAST(env_nominal AS BOOLEAN) AS env_nominal,"
    f" CAST(lossless AS BOOLEAN) AS lossless, {speedup.COMPARABLE_ID} AS comparable"
)


def normalise(text: str) -> str:
    """A recorded value in one spelling: lower case, punctuation dropped ("Q4_K_M" -> "q4km")."""
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def _norm_sql(expr: str) -> str:
    return f"regexp_replace(lower(coalesce({expr}, '')), '[^a-z0-9]', '', 'g')"


# The recorded architecture in specfleet.record.architecture_family's spelling, in SQL.
_ARCHITECTURE = _norm_sql(f"regexp_replace(target_architecture, '{ARCHITECTURE_SUFFIX}', '')")


def conditions(claim: Claim) -> tuple[list[tuple[str, str]], dict]:
    """The claim's conditions as (name, SQL condition on a run's typed columns), each an exact
    match, with their named parameters. Baselines of the same system, models, chips and
    sampler are selected with the arm."""
    c = claim.conditions
    out = [
        ("engine", "engine = $engine"),
        ("implementation", "implementation = $implementation"),
        ("method", "method IN ('baseline', $method)"),
        ("depth", "(method = 'baseline' OR list_contains($depths::INTEGER[], depth))"),
    ]
    params: dict[str, Any] = {
        "engine": c["engine"],
        "implementation": claim.implementation,
        "method": c["method"],
        "depths": claim.depths,
    }
    chip = c.get("chip")
    if chip and chip.endswith("*"):
        out.append(("chip", "starts_with(chip, $chip)"))
        params["chip"] = chip[:-1]
    elif chip:
        out.append(("chip", "chip = $chip"))
        params["chip"] = chip
    if c.get("models"):
        out.append(("models", "list_contains($models::VARCHAR[], lower(trim(target_reference)))"))
        params["models"] = [m.strip().lower() for m in c["models"]]
    if c.get("digests"):
        out.append(("digests", "list_contains($digests::VARCHAR[], target_digest)"))
        params["digests"] = list(c["digests"])
    if c.get("quantisation"):
        out.append(("quantisation", f"{_norm_sql('target_quantisation')} = $quantisation"))
        params["quantisation"] = normalise(c["quantisation"])
    if c.get("architecture"):
        out.append(("architecture", f"{_ARCHITECTURE} = $architecture"))
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


def _fleet(con: duckdb.DuckDBPyConnection, runs: pd.DataFrame) -> None:
    """The runs as view `fleet`, generation runs only, with each run's implementation (a run
    that records none ran in our loops: specfleet)."""
    con.register("fleet_frame", runs)
    if "implementation" in runs.columns:
        sql = "SELECT * REPLACE (coalesce(nullif(implementation, ''), $ours) AS implementation) FROM fleet_frame"
    else:
        sql = "SELECT *, $ours AS implementation FROM fleet_frame"
    con.execute(f"CREATE TEMP TABLE fleet AS {sql}", {"ours": OURS})
    con.execute(f"DELETE FROM fleet WHERE method = '{VERIFY_COST}'")
    con.unregister("fleet_frame")


def _empty_runs() -> pd.DataFrame:
    return pd.DataFrame(columns=[*_COLUMNS, "implementation", "env_nominal", "lossless", "comparable"])


def matching_runs(claim: Claim, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs inside the claim's conditions (its arm and the baselines), the columns
    evaluate() reads and each run's comparable group. `runs`: the typed run columns
    (RunRecord.columns() and the coordinator's), as the mirror holds them."""
    if runs.empty:
        return _empty_runs()
    return _matched(claim, runs).execute("SELECT * FROM matched").df()


def _matched(claim: Claim, runs: pd.DataFrame, jobs: pd.DataFrame | None = None) -> duckdb.DuckDBPyConnection:
    """A connection holding the fleet's generation runs as `fleet`, the claim's as `matched`,
    its arm's as `arm`, and the jobs (job_id, attempt, state) the speedup definition reads to
    keep only valid attempts."""
    con = duckdb.connect()
    if jobs is not None:
        con.register("jobs_frame", jobs)
        con.execute("CREATE TEMP TABLE jobs AS SELECT job_id, attempt, state FROM jobs_frame")
        con.unregister("jobs_frame")
    _fleet(con, runs)
    where, params = conditions_sql(claim)
    con.execute(f"CREATE TEMP TABLE matched AS SELECT {_SELECT} FROM fleet WHERE {where}", params)
    con.execute("CREATE TEMP TABLE arm AS SELECT * FROM matched WHERE method = $method", {"method": claim.method})
    return con


def selection(claim: Claim, runs: pd.DataFrame) -> dict[str, Any]:
    """What the claim selected and why the rest was left out, in one query: fleet (generation
    runs), selected (runs, baselines included), arm (of them, the claim's method), models
    (target references), systems ("implementation (engine)"), and excluded: for each
    condition, the generation runs of the fleet that fail it (a run may fail several)."""
    empty = dict(selected=0, arm=0, models=[], systems=[], excluded={}, fleet=0)
    if runs.empty:
        return empty
    con = duckdb.connect()
    _fleet(con, runs)
    conds, params = conditions(claim)
    every = " AND ".join(f"coalesce({sql}, false)" for _, sql in conds)
    fails = ", ".join(f"count(*) FILTER (WHERE NOT coalesce({sql}, false)) AS c{i}" for i, (_, sql) in enumerate(conds))
    row = con.execute(
        f"SELECT count(*) AS fleet, count(*) FILTER (WHERE {every}) AS selected,"
        f" count(*) FILTER (WHERE {every} AND method = $method) AS arm,"
        f" list(DISTINCT target_reference ORDER BY target_reference) FILTER (WHERE {every}) AS models,"
        f" list(DISTINCT implementation || ' (' || engine || ')' ORDER BY 1) FILTER (WHERE {every}) AS systems,"
        f" {fails} FROM fleet",
        params,
    ).fetchone()
    excluded = {name: int(row[5 + i]) for i, (name, _) in enumerate(conds) if row[5 + i]}
    return dict(
        fleet=int(row[0]),
        selected=int(row[1]),
        arm=int(row[2]),
        models=list(row[3] or []),
        systems=list(row[4] or []),
        excluded=excluded,
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


def _per_prompt(con, value: str) -> pd.DataFrame:
    """per_prompt_sql on the claim's runs (value: the tok/s column the ratio is of)."""
    sql = speedup.per_prompt_sql("matched")
    if value != "decode_tokens_per_second":
        sql = sql.replace("decode_tokens_per_second", value)
    return con.execute(sql).df()


def _excluded(con) -> pd.DataFrame:
    """Arm runs of valid attempts left out as not nominal, per group, chip and depth."""
    return con.execute(
        f"SELECT comparable, chip, depth, count(*) AS excluded_runs FROM {speedup.valid_sql('arm')}"
        " WHERE env_nominal IS NOT DISTINCT FROM false GROUP BY ALL"
    ).df()


def _too_few_runs(claim: Claim, d: inference.Decision, runs: int) -> inference.Decision:
    if runs >= claim.rule.min_runs:
        return d
    why = f"{runs} run(s): needs at least {claim.rule.min_runs} ({d.why})"
    return replace(d, verdict=inference.INCONCLUSIVE, why=why, tested=False, p_value=1.0)


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
            d = inference.decide_best_depth(
                mine[["agent_id", "prompt_id", "depth", "log_ratio", "repeats"]],
                r.band_low,
                r.band_high,
                min_machines=r.min_machines,
            )
            d = _too_few_runs(claim, d, d.pairs)
            figure = NAN if d.best_depth is None else float(d.best_depth)
            row = _from_decision(d, figure=figure)
            if d.best_depth is not None:
                row["why"] += f"; the best depth's speedup {d.speedup:.3g}x, 95% interval {d.low:.3g}-{d.high:.3g}x"
            rows.append(dict(where, **row, excluded_runs=int(gone["excluded_runs"].sum())))
            continue
        for depth in claim.depths:
            at = mine[mine["depth"] == depth]
            e = inference.estimate(at.drop(columns=["target_reference", "draft_reference", "prompt_set", "engine"]))
            d = _too_few_runs(claim, inference.decide(e, r.band_low, r.band_high, r.min_machines), e.pairs)
            row = _from_decision(d)
            row["why"] = (f"K={depth}: " if len(claim.depths) > 1 else "") + row["why"]
            excl = int(gone.loc[gone["depth"] == depth, "excluded_runs"].sum())
            rows.append(dict(where, **row, excluded_runs=excl))
    return rows


def _acceptance_rows(claim: Claim, con, cells: pd.DataFrame) -> list[dict]:
    """Acceptance rate keeps its estimate (stats.summarise: the median rate with its two-level
    bootstrap interval); the verdict is the band rule on that interval, with no p-value, so it
    stays out of the false-discovery family."""
    values = con.execute(
        "SELECT comparable, chip, depth, agent_id, prompt_id, tokens_accepted / tokens_drafted AS rate,"
        f" env_nominal IS NOT DISTINCT FROM false AS degraded FROM {speedup.valid_sql('arm')} WHERE tokens_drafted > 0"
    ).df()
    figures = stats.summarise(values, by=("comparable", "chip", "depth"), column="rate")
    r = claim.rule
    band = inference.band_text(r.band_low, r.band_high).replace("x", "")
    rows = []
    for cell in cells.itertuples():
        where = dict(chip=cell.chip, group=cell.comparable, differs=cell.differs)
        for depth in claim.depths:
            at = figures[
                (figures["comparable"] == cell.comparable)
                & (figures["chip"] == cell.chip)
                & (figures["depth"] == depth)
            ]
            f = (
                at.iloc[0]
                if len(at)
                else dict(median=NAN, ci_low=NAN, ci_high=NAN, machines=0, prompts=0, runs=0, excluded_runs=0)
            )
            machines, runs = int(f["machines"]), int(f["runs"])
            counts = f"{machines} machine(s), {int(f['prompts'])} prompt(s), {runs} run(s)"
            if machines < r.min_machines or runs < r.min_runs:
                verdict = inference.INCONCLUSIVE
                why = f"{counts}: needs at least {r.min_machines} machine(s) and {r.min_runs} run(s)"
            else:
                verdict = str(inference.classify(f["ci_low"], f["ci_high"], r.band_low, r.band_high))
                interval = f"median {f['median']:.3g}, 95% bootstrap interval {f['ci_low']:.3g}-{f['ci_high']:.3g}"
                said = {inference.REPRODUCED: "lies inside", inference.CONTRADICTED: "lies wholly outside"}
                why = f"{interval} {said.get(verdict, 'reaches across an edge of')} {band}; {counts}"
            rows.append(
                dict(
                    where,
                    verdict=verdict,
                    figure=float(f["median"]),
                    ci_low=float(f["ci_low"]),
                    ci_high=float(f["ci_high"]),
                    machines=machines,
                    prompts=int(f["prompts"]),
                    runs=runs,
                    excluded_runs=int(f["excluded_runs"]),
                    p_value=NAN,
                    tested=False,
                    why=(f"K={depth}: " if len(claim.depths) > 1 else "")
                    + why
                    + " (no p-value: not in the false-discovery step)",
                )
            )
    return rows


def _runs_rows(con, cells: pd.DataFrame) -> list[dict]:
    counts = con.execute(
        "SELECT comparable, chip, count(*) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS runs,"
        " count(*) FILTER (WHERE env_nominal IS NOT DISTINCT FROM false) AS excluded_runs,"
        " count(DISTINCT agent_id) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS machines,"
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
    inconclusive, saying what the conditions left out."""
    if claim.metric == "runs":
        return dict(none, verdict=inference.REPRODUCED, figure=0.0, why=f"no run of {claim.system} in the fleet yet")
    if claim.implementation != OURS:
        why = f"no runs of {claim.implementation}"
    else:
        why = "no run in the fleet matches its conditions"
    if sel.get("excluded"):
        why += " (" + selection_text(sel) + ")"
    return dict(none, verdict=inference.INCONCLUSIVE, why=why)


def _beside(claim: Claim, runs: pd.DataFrame, jobs: pd.DataFrame) -> str:
    """Our loop's figure on the claim's other conditions, for a claim about another system:
    shown beside its verdict, never as it."""
    if claim.implementation == OURS or claim.metric == "runs":
        return ""
    ours = replace(claim, conditions={**claim.conditions, "implementation": OURS})
    out = _evaluate(ours, runs, jobs)
    out = out[out["runs"] > 0]
    return "; ".join(
        f"{OURS}'s loop on {r.chip}: {r.figure:.3g} [{r.ci_low:.3g}, {r.ci_high:.3g}], {r.machines} machine(s)"
        for r in out.itertuples()
    )


def evaluate(claim: Claim, runs: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    """One row per comparable group and chip (and depth, for a claim of several) in
    VERDICT_COLUMNS: the verdict, the figure (specfleet.speedup's speedup for ratios), its
    interval, the machines, fewest prompts and runs (pairs, for a ratio) behind it, the runs
    left out as not nominal, the verdict's p-value, and why. Runs that differ in a checked key
    are never pooled: `differs` names each group's values of the keys in which the claim's
    groups differ. `jobs` (job_id, attempt, state) says which attempts are valid. A claim about
    another system than ours that selects no run says so, with our loop's figure on the same
    conditions in `beside`. adjusted_verdict is the verdict itself here; `evaluate_all`
    applies the false-discovery step across claims."""
    out = _evaluate(claim, runs, jobs)
    if (out["runs"] == 0).all():
        out["beside"] = _beside(claim, runs, jobs)
    return out


def _evaluate(claim: Claim, runs: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    pattern = claim.conditions.get("chip")
    none = dict(chip=_chip_label(pattern), group="", machines=0, prompts=0, runs=0, excluded_runs=0, differs="")
    if runs.empty:
        return _rows(claim, [_no_run(claim, none, {})])
    con = _matched(claim, runs, jobs)
    cells = con.execute(
        "SELECT comparable, chip, count(*) AS runs FROM arm GROUP BY ALL ORDER BY chip, runs DESC, comparable"
    ).df()
    if cells.empty:
        return _rows(claim, [_no_run(claim, none, selection(claim, runs))])
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
        return _rows(claim, rows)
    if claim.metric == "acceptance_rate":
        return _rows(claim, _acceptance_rows(claim, con, cells))
    return _rows(claim, _ratio_rows(claim, con, cells))


def _rows(claim: Claim, rows: list[dict]) -> pd.DataFrame:
    defaults = dict(figure=NAN, ci_low=NAN, ci_high=NAN, p_value=NAN, tested=False, probability=NAN, beside="")
    out = pd.DataFrame([{**defaults, "claim": claim.id, **r} for r in rows], columns=VERDICT_COLUMNS)
    out["adjusted_verdict"] = out["verdict"]
    out["tested"] = out["tested"].astype(bool)
    return out


def adjust(verdicts: pd.DataFrame, q: float = FDR_Q) -> pd.DataFrame:
    """The false-discovery step (inference.adjust, Benjamini-Hochberg) over every tested
    decision of the frame (claims x groups x chips x depths): adjusted_p, and
    adjusted_verdict, the verdict that stands after it (inconclusive when its adjusted p-value
    exceeds q). The raw verdict stays in `verdict`; untested rows keep theirs."""
    out = verdicts.copy()
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
            tested=bool(r.tested),
        )
        for r in out.itertuples()
    ]
    adjusted = inference.adjust(decisions, q=q)
    out["adjusted_verdict"] = [d.verdict for d in adjusted]
    out["adjusted_p"] = [NAN if d.adjusted_p is None else d.adjusted_p for d in adjusted]
    changed = out["adjusted_verdict"] != out["verdict"]
    out.loc[changed, "why"] = [d.why for d, c in zip(adjusted, changed) if c]
    return out


def evaluate_all(claims: list[Claim], runs: pd.DataFrame, jobs: pd.DataFrame, q: float = FDR_Q) -> pd.DataFrame:
    """Every claim's rows, then the false-discovery step over all their tested decisions."""
    frames = [evaluate(c, runs, jobs) for c in claims]
    if not frames:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    return adjust(pd.concat(frames, ignore_index=True), q)


# ---------------------------------------------------------------- the sweep that tests a claim


def sweep_yaml(claim: Claim) -> str:
    """A sweep file that measures the claim's arm against the baseline on the claim's chips."""
    c = claim.conditions
    engine = c["engine"]
    named = (c.get("models") or ["target"])[0].split("/")[-1]
    default = "/models/" + named + (".gguf" if engine == "llama.cpp" and not named.endswith(".gguf") else "")
    target = claim.sweep.get("target") or default
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
        prompt_sets=[c.get("prompt_set") or (_as_list(c.get("prompt_category")) or ["conversation"])[0]],
        methods={c["method"]: claim.depths},
        max_new_tokens=256,
        warmup=3,
        repeats=SWEEP_REPEATS,
    )
    if c["method"] in ("ngram", "ref-ngram"):
        doc["ngram"] = {"n_min": 1, "n_max": 3}
    header = f"# Tests claim {claim.id}: {claim.statement}\n"
    if claim.implementation != OURS:
        header += f"# The claim is about {claim.implementation}; this sweep runs specfleet's own loop beside it.\n"
    header += "# Point models at your files, then: specfleet sweep submit FILE\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)

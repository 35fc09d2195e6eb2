"""Selecting a claim's runs: its conditions as SQL on the runs' typed columns, the runs they
select (temporary views `matched` and `arm`), and what each condition left out."""

from __future__ import annotations

import re
from typing import Any

import duckdb
import pandas as pd

from dashboard.claims.claim import DECLARED_CONDITIONS, Claim, _as_list, system_label_sql
from specfleet import settings as declared
from specfleet import speedup, versions
from specfleet.record import ARCHITECTURE_SUFFIX, CHECKED_KEYS, VERIFY_COST, architecture_family

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
    "server_decode_tokens_per_second",
    "prefill_tokens_per_second",
    "tokens_drafted",
    "tokens_accepted",
)
_SELECT = ", ".join(_COLUMNS) + ", CAST(env_nominal AS BOOLEAN) AS env_nominal, CAST(lossless AS BOOLEAN) AS lossless"


def _warmup_converged(names: set[str]) -> str:
    """SQL: a run's warmup_converged (settings, record schema 4), NULL where the runs (of columns
    `names`) predate it."""
    known = "CAST(warmup_converged AS BOOLEAN)" if "warmup_converged" in names else "CAST(NULL AS BOOLEAN)"
    return f"{known} AS warmup_converged"


def _comparable(names: set[str]) -> str:
    """SQL: a run's comparable group: the mirror's column (computed once as the run arrived),
    or computed here for runs (of columns `names`) without one (a test's frames)."""
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
    match, with their named parameters. Baselines of the same system, models (baseline_models'
    files where the claim names them), chips and sampler are selected with the arm; a claim of
    any depth has no depth condition."""
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
    reference = "lower(trim(target_reference))"
    arm_models = f"list_contains($models::VARCHAR[], {reference})" if c.get("models") else None
    if c.get("models"):
        params["models"] = [m.strip().lower() for m in c["models"]]
    if claim.baseline_models:  # the baselines are of these files, the arm of the models
        params["baseline_models"] = [m.strip().lower() for m in claim.baseline_models]
        baseline = f"list_contains($baseline_models::VARCHAR[], {reference})"
        out.append(("models", f"CASE WHEN method = 'baseline' THEN {baseline} ELSE {arm_models or 'true'} END"))
    elif arm_models:
        out.append(("models", arm_models))
    if c.get("digests"):
        digest = "list_contains($digests::VARCHAR[], target_digest)"  # the arm's, not baseline_models'
        out.append(("digests", f"(method = 'baseline' OR {digest})" if claim.baseline_models else digest))
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


# A named parameter of the conditions' SQL ($engine, $depths).
PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def _matched(claim: Claim, con: duckdb.DuckDBPyConnection) -> None:
    """On `con`, the claim's runs as temporary view `matched` and its arm's as `arm`, of the
    connection's `runs`; its `jobs` (job_id, attempt, state) say which attempts are valid. Views,
    not tables: duckdb 1.5.5 gives every column of a temporary table a block of its own per
    thread, and the claim's 56 columns took 24 MB at one thread and 56 MB at two for 17k runs,
    a whole 64 MB limit (tests/test_dashboard_memory.py). A view takes no parameter: the claim's
    are one row of temporary table `_claim` that the conditions read. A caller that needs the
    views to see one state of a mirror that syncs beside it runs them in one transaction."""
    where, params = conditions_sql(claim)
    params = {**params, "arm_method": claim.method}
    con.execute(f"CREATE OR REPLACE TEMP TABLE _claim AS SELECT {', '.join(f'${k} AS {k}' for k in params)}", params)
    where = PARAM.sub(lambda m: f"(SELECT {m[1]} FROM _claim)", where)
    names = {d[0] for d in con.execute("SELECT * FROM runs LIMIT 0").description}
    select = f"{_SELECT}, {_warmup_converged(names)}, {_comparable(names)}"
    con.execute(f"CREATE OR REPLACE TEMP VIEW matched AS SELECT {select} FROM {_FLEET} WHERE {where}")
    arm = "SELECT * FROM matched WHERE method = (SELECT arm_method FROM _claim)"
    con.execute(f"CREATE OR REPLACE TEMP VIEW arm AS {arm}")


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

"""What changed between versions of an engine or system: ratios per chip, paired by machine.

Pure functions (no I/O, no Streamlit) on one row per setting, chip, figure, arm, version,
machine and prompt: `value`, the mean over the prompt's repeats of the figure on the log scale
(log decode tok/s; log speedup, the arm's log decode tok/s less the baseline's on the same
machine, prompt and version; log acceptance rate). A *setting* is every checked key but the
versions (specfleet/record.py CHECKED_KEYS less VERSION_KEYS): the runs it holds differ in
their engine or system version alone, so their ratio is the change between versions.

The ratio and its interval are the verdicts' (specfleet/inference.py), nothing new:

- Paired, when machines ran both versions: each such machine's prompts give the log ratio
  new - old per prompt (only prompts run under both), and `inference.estimate` makes the
  interval, t over machine means (df = machines - 1), the calibration the verdicts' coverage
  was simulated for; with one paired machine, t over its prompts, noted as describing that
  machine only. Machines that ran one version only are left out and counted.
- Unpaired, when no machine ran both: Welch's t on the machine means of each version (each
  machine's mean over its prompts is one observation, as in the verdicts), noted as unpaired:
  the machines' own levels are in the interval, so it is wider.

The decision. Conbench's lookback z-score scores a result against the distribution of earlier
results on the same hardware, case and context, and calls a regression or improvement past a
z threshold; Bencher's thresholds (Student's t and others) alert when a new metric falls beyond
a boundary limit of the historical metrics on the same branch, testbed and measure. Both
compare like with like on one machine and decide on statistical distance alone, so a
consistent 0.5% change on a quiet machine is an alert. Here the same machines are compared
with themselves (like with like), and a change must also matter: a regression or gain is
called only when the whole interval lies beyond a stated tolerance (default 3%, both ways on
the log scale: [1 / 1.03, 1.03]), "unchanged" when the whole interval lies inside it, and
inconclusive otherwise. That is `inference.decide` with the tolerance as the band (inside:
unchanged; wholly outside: a regression below it, a gain above it, with its p-value), so the
rules (fewest machines and prompts) and the false-discovery step (`inference.adjust` across
every comparison shown) are the verdicts' too.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from scipy import stats

from specfleet import inference
from specfleet.record import CHECKED_KEYS

TOLERANCE = 0.03  # a change smaller than 3% either way is no regression and no gain
# The checked keys that name a version of the engine or system a run measured. A setting is
# every other checked key.
VERSION_KEYS = tuple(k for k in CHECKED_KEYS if k.endswith(("_version", "_commit", "_build")))
SETTING_KEYS = tuple(k for k in CHECKED_KEYS if k not in VERSION_KEYS)

# SQL over a relation with the checked keys: a setting's id (every checked key but the
# versions, hashed) and a version's label (the version keys' values, joined). The same text as
# dashboard/queries.py SETTING_ID and VERSION_LABEL (tests/test_version_figures.py), so the
# coordinator's /metrics and the dashboard name a setting alike.
SETTING_SQL = (
    "left(md5(concat_ws('|', " + ", ".join(f"coalesce(CAST({k} AS VARCHAR), '')" for k in SETTING_KEYS) + ")), 12)"
)
VERSION_SQL = "concat_ws(' · ', " + ", ".join(f"nullif(CAST({k} AS VARCHAR), '')" for k in VERSION_KEYS) + ")"

REGRESSION = "regression"
GAIN = "gain"
UNCHANGED = "unchanged"
INCONCLUSIVE = inference.INCONCLUSIVE
PAIRED = "paired by machine"
UNPAIRED = "unpaired (Welch t over machines)"

DECODE = "decode tok/s"
SPEEDUP = "speedup"
ACCEPTANCE = "acceptance"
FIGURES = (DECODE, SPEEDUP, ACCEPTANCE)

KEYS = ("setting", "chip", "figure", "method", "depth")
COLUMNS = [*KEYS, "old", "new", "ratio", "ci_low", "ci_high", "change", "raw_change", "p_value", "adjusted_p"]
COLUMNS += ["machines", "prompts", "unpaired_machines", "pooled_old", "pooled_new", "how", "why"]

# A prompt's acceptance, SQL over its runs (every engine records tokens_accepted and
# tokens_drafted): `log_acceptance`, the log of the mean of the runs' rates (the figure judged,
# a prompt one unit); `accepted` and `drafted`, their sums, for the pooled ratio accepted /
# drafted that llama-server itself reports, shown beside the figure (pooled_old, pooled_new)
# and never judged.
ACCEPTANCE_SQL = (
    "ln(nullif(avg(tokens_accepted / nullif(tokens_drafted, 0)), 0)) AS log_acceptance,"
    " sum(tokens_accepted) AS accepted, sum(tokens_drafted) AS drafted"
)


def band(tolerance: float = TOLERANCE) -> tuple[float, float]:
    """The ratios that count as no change: [1 / (1 + tolerance), 1 + tolerance]."""
    if not 0 < tolerance < 1:
        raise ValueError(f"a tolerance is a fraction in (0, 1), got {tolerance}")
    return 1 / (1 + tolerance), 1 + tolerance


def order(values: pd.DataFrame) -> list[str]:
    """Versions in the order they were first measured (`first_seq`, the smallest
    ingest sequence of their runs; by name without it)."""
    if "first_seq" in values:
        first = values.groupby("version")["first_seq"].min().sort_values(kind="stable")
        return list(first.index)
    return sorted(values["version"].unique())


def _welch(old: pd.DataFrame, new: pd.DataFrame, confidence: float) -> inference.Estimate:
    """Welch's t on machine means of the log figure: new - old, no machine in both."""
    a = old.groupby("machine_id")["value"].mean().to_numpy()
    b = new.groupby("machine_id")["value"].mean().to_numpy()
    prompts = int(min(old.groupby("machine_id").size().min(), new.groupby("machine_id").size().min()))
    machines = min(len(a), len(b))
    mean = float(b.mean() - a.mean())
    nan = math.nan
    if len(a) < 2 or len(b) < 2:
        note = "unpaired, with one machine on a side: no interval"
        return inference.Estimate(math.exp(mean), nan, nan, machines, prompts, 0, inference.NO_INTERVAL, note)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        note = "unpaired, identical machine means: no interval"
        return inference.Estimate(math.exp(mean), nan, nan, machines, prompts, 0, inference.NO_INTERVAL, note)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf((1 + confidence) / 2, df) * se
    return inference.Estimate(
        speedup=math.exp(mean),
        low=math.exp(mean - half),
        high=math.exp(mean + half),
        machines=machines,
        prompts=prompts,
        pairs=0,
        method=UNPAIRED,
        note="unpaired: no machine ran both versions",
        confidence=confidence,
        log_mean=mean,
        log_se=se,
        df=max(1, int(math.floor(df))),
    )


def ratio(old: pd.DataFrame, new: pd.DataFrame, confidence: float = inference.CONFIDENCE):
    """The ratio new / old of one figure (rows of one setting, chip, figure and arm under each
    version: machine_id, prompt_id, value) as an inference.Estimate, how it was made, and the
    machines that ran one version only (left out of a paired ratio)."""
    both = sorted(set(old["machine_id"]) & set(new["machine_id"]))
    if not both:
        return _welch(old, new, confidence), UNPAIRED, 0
    merged = old[old["machine_id"].isin(both)].merge(
        new[new["machine_id"].isin(both)], on=["machine_id", "prompt_id"], suffixes=("_old", "_new")
    )
    per_prompt = pd.DataFrame(
        {
            "machine_id": merged["machine_id"],
            "prompt_id": merged["prompt_id"],
            "log_ratio": merged["value_new"] - merged["value_old"],
            "repeats": merged["repeats_new"] if "repeats_new" in merged else 1,
        }
    )
    alone = len(set(old["machine_id"]) ^ set(new["machine_id"]))
    return inference.estimate(per_prompt, confidence), PAIRED, alone


def _pooled(rows: pd.DataFrame) -> float:
    """accepted / drafted over every run behind `rows` (llama-server's own ratio); NaN without
    token counts (figures() gives them to acceptance rows alone)."""
    if "drafted" not in rows:
        return math.nan
    drafted = float(rows["drafted"].sum())
    return float(rows["accepted"].sum()) / drafted if drafted > 0 else math.nan


def compare(
    values: pd.DataFrame,
    tolerance: float = TOLERANCE,
    min_machines: int = inference.MIN_MACHINES,
    min_prompts: int = inference.MIN_PROMPTS,
) -> pd.DataFrame:
    """One row per setting, chip, figure, arm and change between consecutive versions (in the
    order they were first measured): the ratio new / old with its interval, the decision
    (module docstring) before (`raw_change`) and after (`change`) the false-discovery step
    across every row, the machines and fewest prompts behind it, the machines that ran one
    version only, and for acceptance the pooled ratio accepted / drafted of each version's runs
    (pooled_old, pooled_new; NaN without token counts). `values` needs KEYS, version,
    machine_id, prompt_id and value (log scale); repeats, first_seq, accepted and drafted when
    it has them."""
    low, high = band(tolerance)
    if values.empty:
        return pd.DataFrame(columns=COLUMNS)
    orders = {s: order(g) for s, g in values.groupby("setting", sort=False)}  # one order per setting
    rows, decisions = [], []
    for key, group in values.groupby(list(KEYS), sort=True, dropna=False):
        present = set(group["version"])
        versions = [v for v in orders[key[0]] if v in present]
        for old, new in zip(versions, versions[1:]):
            before, after = group[group["version"] == old], group[group["version"] == new]
            e, how, alone = ratio(before, after)
            d = inference.decide(e, low, high, min_machines=min_machines, min_prompts=min_prompts)
            pooled = dict(pooled_old=_pooled(before), pooled_new=_pooled(after))
            rows.append(
                dict(zip(KEYS, key)) | dict(old=old, new=new, how=how, unpaired_machines=alone, note=e.note) | pooled
            )
            decisions.append(d)
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    adjusted = inference.adjust(decisions)
    out = []
    for row, d, a in zip(rows, decisions, adjusted):
        raw, change, why = _change(d), _change(a), a.why
        note = row.pop("note")
        out.append(
            row
            | dict(
                ratio=d.speedup,
                ci_low=d.low,
                ci_high=d.high,
                change=change,
                raw_change=raw,
                p_value=d.p_value,
                adjusted_p=a.adjusted_p if a.adjusted_p is not None else math.nan,
                machines=d.machines,
                prompts=d.prompts,
                why=f"{why} ({note})" if note and note not in why else why,
            )
        )
    return pd.DataFrame(out, columns=COLUMNS)


def _change(d: inference.Decision) -> str:
    if d.verdict == inference.REPRODUCED:
        return UNCHANGED
    if d.verdict == inference.CONTRADICTED:
        return REGRESSION if d.speedup < 1 else GAIN
    return INCONCLUSIVE


def figures(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """The compare() rows of every figure from one row per setting, chip, method, depth,
    version, machine and prompt with `log_tps` (mean log decode tok/s over the prompt's
    repeats), `log_acceptance` (log of the mean acceptance rate; NaN for the baseline) and
    `repeats`: decode tok/s of every arm; the speedup of each speculative arm (its log_tps less
    the baseline's on the same machine, prompt and version); its acceptance rate, with the
    prompt's `accepted` and `drafted` token sums where per_prompt has them (ACCEPTANCE_SQL)."""
    cols = ["setting", "chip", "method", "depth", "version", "machine_id", "prompt_id", "repeats"]
    cols += [c for c in ("first_seq",) if c in per_prompt]
    counts = [c for c in ("accepted", "drafted") if c in per_prompt]
    if per_prompt.empty:
        return pd.DataFrame(columns=[*KEYS, "version", "machine_id", "prompt_id", "value", "repeats"])
    decode = per_prompt[cols].assign(figure=DECODE, value=per_prompt["log_tps"])
    base = per_prompt[per_prompt["method"] == "baseline"]
    arms = per_prompt[per_prompt["method"] != "baseline"]
    on = ["setting", "chip", "version", "machine_id", "prompt_id"]
    paired = arms.merge(base[[*on, "log_tps"]], on=on, suffixes=("", "_base"))
    speedup = paired[cols].assign(figure=SPEEDUP, value=paired["log_tps"] - paired["log_tps_base"])
    accepted = arms[np.isfinite(arms["log_acceptance"].astype(float))]
    acceptance = accepted[cols + counts].assign(figure=ACCEPTANCE, value=accepted["log_acceptance"].astype(float))
    return pd.concat([decode, speedup, acceptance], ignore_index=True)


def changes(per_prompt: pd.DataFrame, tolerance: float = TOLERANCE) -> pd.DataFrame:
    """compare(figures(per_prompt)): every figure's change between versions."""
    return compare(figures(per_prompt), tolerance)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """The regressions and gains of compare()'s rows that stand, one per setting, chip and
    change of version, with the figures and arms they were called on."""
    called = rows[rows["change"].isin([REGRESSION, GAIN])]
    cols = ["setting", "chip", "old", "new", "change", "figures", "lowest_ratio", "highest_ratio"]
    if called.empty:
        return pd.DataFrame(columns=cols)
    arm = called["method"] + np.where(called["depth"] > 0, " K=" + called["depth"].astype(str), "")
    called = called.assign(what=called["figure"] + " · " + arm)
    out = called.groupby(["setting", "chip", "old", "new", "change"], as_index=False).agg(
        figures=("what", lambda s: ", ".join(sorted(s))),
        lowest_ratio=("ratio", "min"),
        highest_ratio=("ratio", "max"),
    )
    return out[cols]


# ---------------------------------------------------------------- claims across versions

# A claim's `conditions.version` (dashboard/claims/selection.py) selects runs by the version of their
# engine or system, in one of four shapes:
#
#   ">= b9330"                        a range of llama.cpp builds (>=, >, <=, <, ==), compared
#                                     by build number (BUILD_SQL: llama.cpp=b9330,
#                                     llama-server.build=9330, "version: 9330 (328874d)")
#   "b9330" or [b9330, 328874d, ...]  exact builds, commits or versions: a run matches when one
#                                     of its version tokens (TOKENS_SQL) is one of them
#   {name: "after PR 22168", versions: [b9412, b9413, ...]}
#                                     a named range, mapped by the ledger to its builds or commits
#   {from: <spec>, to: <spec>}        a change between versions: the claim is about the ratio
#                                     to / from of its figure, settled by the version comparison
#                                     (settle below), each side a range or exact versions
_RANGE_RE = re.compile(r"^\s*(>=|<=|==|>|<)\s*b?(\d+)\s*$")
_SPLIT = r"[\s=,:()\-]+"
_VERSION_TEXT = "lower(coalesce(engine_version, '') || ' ' || coalesce(server_version, ''))"
TOKENS_SQL = f"string_split_regex({_VERSION_TEXT}, '{_SPLIT}')"
BUILD_SQL = (
    "coalesce(try_cast(nullif(regexp_extract(engine_version, '(^|[ =])b([0-9]+)', 2), '') AS BIGINT),"
    " try_cast(nullif(regexp_extract(engine_version, 'build=([0-9]+)', 1), '') AS BIGINT),"
    " try_cast(nullif(regexp_extract(server_version, 'version:? *([0-9]+)', 1), '') AS BIGINT))"
)
CHANGE_FIGURES = {"speedup": SPEEDUP, "acceptance_rate": ACCEPTANCE}  # a change claim's metric -> figure


def _tokens(values) -> list[str]:
    """Exact versions as the tokens they match: lower case, a build b9330 also as 9330."""
    out = []
    for v in [values] if isinstance(values, str) else values:
        v = str(v).strip().lower()
        out += [v, v[1:]] if re.fullmatch(r"b\d+", v) else [v]
    return out


def _spec_problem(spec) -> str | None:
    if isinstance(spec, str):
        return (
            None
            if spec.strip() and (_RANGE_RE.match(spec) or not re.match(r"^\s*[<>=]", spec))
            else (f"{spec!r}: a range is an operator (>=, >, <=, <, ==) and a build (b9330)")
        )
    if isinstance(spec, list) and spec and all(isinstance(v, (str, int)) and str(v).strip() for v in spec):
        return None
    return f"{spec!r}: a range ('>= b9330'), a version, or a list of builds, commits or versions"


def is_change(value) -> bool:
    """Whether a claim's version condition is a change between versions ({from, to})."""
    return isinstance(value, dict) and ("from" in value or "to" in value)


def condition_problem(value) -> str | None:
    """What is wrong with a claim's conditions.version (None when it is well formed)."""
    if is_change(value):
        if set(value) != {"from", "to"}:
            return "a change between versions names exactly `from` and `to`"
        return _spec_problem(value["from"]) or _spec_problem(value["to"])
    if isinstance(value, dict):
        if set(value) != {"name", "versions"} or not isinstance(value["name"], str):
            return "a named range is {name: 'after PR 22168', versions: [builds or commits]}"
        return _spec_problem(value["versions"]) if isinstance(value["versions"], list) else "versions: a list"
    return _spec_problem(value)


def _spec_sql(spec, param: str) -> tuple[str, dict]:
    m = _RANGE_RE.match(spec) if isinstance(spec, str) else None
    if m:
        op = "=" if m[1] == "==" else m[1]
        return f"{BUILD_SQL} {op} ${param}", {param: int(m[2])}
    return f"list_has_any({TOKENS_SQL}, ${param}::VARCHAR[])", {param: _tokens(spec)}


def condition_sql(value) -> tuple[str, dict]:
    """SQL condition on a run's engine_version and server_version for conditions.version,
    with its named parameters (a change: runs of either side)."""
    if is_change(value):
        a, pa = _spec_sql(value["from"], "version_from")
        b, pb = _spec_sql(value["to"], "version_to")
        return f"(({a}) OR ({b}))", pa | pb
    if isinstance(value, dict):
        return _spec_sql(value["versions"], "version")
    return _spec_sql(value, "version")


def matches(spec, version: str) -> bool:
    """Whether a version label (VERSION_SQL's) falls in a range or is one of exact versions:
    condition_sql's test in Python."""
    m = _RANGE_RE.match(spec) if isinstance(spec, str) else None
    if m:
        found = re.search(r"(?:^|[ =])b(\d+)|build=(\d+)|version:? *(\d+)", version)
        if not found:
            return False
        build = int(next(g for g in found.groups() if g))
        want = int(m[2])
        return {">=": build >= want, ">": build > want, "<=": build <= want, "<": build < want, "==": build == want}[
            m[1]
        ]
    return bool(set(re.split(_SPLIT, version.lower())) & set(_tokens(spec)))


def settle(
    per_prompt: pd.DataFrame,
    change: dict,
    metric: str,
    method: str,
    band_low: float,
    band_high: float,
    min_machines: int = inference.MIN_MACHINES,
    min_prompts: int = inference.MIN_PROMPTS,
) -> list[tuple[dict, inference.Decision]]:
    """A claim about a change between versions, settled by the version comparison: the runs'
    per-prompt rows (as figures() takes them) split into the change's `from` and `to` sides,
    and per setting, chip and depth of `method` the ratio to / from of the claim's figure
    (CHANGE_FIGURES[metric]), paired by machine as compare() pairs them, decided against the
    claim's band (inference.decide: reproduced inside it, contradicted wholly outside). Returns
    (where: setting, chip, depth, from and to versions; the decision) per figure."""
    if per_prompt.empty:
        return []
    side = per_prompt["version"].map(
        lambda v: "from" if matches(change["from"], v) else "to" if matches(change["to"], v) else ""
    )
    rows = figures(per_prompt[side != ""].assign(version=side[side != ""]))
    rows = rows[(rows["figure"] == CHANGE_FIGURES[metric]) & (rows["method"] == method)]
    labels = per_prompt.assign(side=side).groupby("side")["version"].agg(lambda s: ", ".join(sorted(set(s))))
    out = []
    for (setting, chip, depth), group in rows.groupby(["setting", "chip", "depth"], sort=True):
        old, new = group[group["version"] == "from"], group[group["version"] == "to"]
        if old.empty or new.empty:
            continue
        e, how, alone = ratio(old, new)
        d = inference.decide(e, band_low, band_high, min_machines=min_machines, min_prompts=min_prompts)
        where = dict(setting=setting, chip=chip, depth=int(depth), old=labels.get("from", ""), new=labels.get("to", ""))
        out.append((where | dict(how=how, unpaired_machines=alone), d))
    return out

"""Statistics for the dashboard: pure functions on DataFrames, no I/O, no Streamlit.

Every speedup is a paired ratio: an arm's run over the baseline's run on the same prompt and
repeat inside one job (one cell on one machine, arms interleaved). Figures per chip are medians
of those ratios with a bootstrap interval that resamples machines, then ratios inside each
machine, and they always carry the number of machines and runs behind them. Runs flagged as
thermally or power degraded (params `env.nominal` == "false") are excluded and counted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

BOOTSTRAP_SEED = 20260
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_BLOCK_VALUES = 2_000_000  # values drawn per block of resamples: bounds the memory used
# Keys that must match for two runs to be paired: the job pins machine and cell already.
PAIR_KEYS = ("job_id", "prompt_id", "repeat")
GROUP_KEYS = ("chip", "engine", "method", "depth")

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
NOT_ENOUGH = "not enough data"
RULES = ("range", "above", "below", "best_depth_in", "none_measured")


def nominal_state(params: str | dict | None) -> str:
    """'nominal', 'degraded' or 'unknown' (no `env.nominal` reading: counted as nominal)."""
    if isinstance(params, str):
        params = json.loads(params) if params else {}
    value = (params or {}).get("env.nominal")
    if value is None:
        return "unknown"
    return "degraded" if str(value).strip().lower() == "false" else "nominal"


def paired_ratios(runs: pd.DataFrame, value: str = "decode_tokens_per_second") -> pd.DataFrame:
    """One row per arm run with a baseline partner on the same job, prompt and repeat.

    `runs` needs PAIR_KEYS, GROUP_KEYS, agent_id, method, `value` and optionally `nominal`
    ('nominal' | 'degraded' | 'unknown'). A pair is degraded when either of its runs is.
    Returns the arm's columns plus baseline, ratio and degraded."""
    cols = ["arm_value", "baseline", "ratio", "degraded"]
    if runs.empty:
        return pd.DataFrame(columns=[*runs.columns, *cols])
    runs = runs.copy()
    if "nominal" not in runs:
        runs["nominal"] = "unknown"
    runs["_degraded"] = runs["nominal"].eq("degraded")
    base = runs[runs["method"] == "baseline"][[*PAIR_KEYS, value, "_degraded"]]
    base = base.drop_duplicates(list(PAIR_KEYS)).rename(columns={value: "baseline", "_degraded": "_base_degraded"})
    arms = runs[(runs["method"] != "baseline") & (runs["method"] != "verify-cost")]
    pairs = arms.merge(base, on=list(PAIR_KEYS), how="inner")
    pairs = pairs[pairs["baseline"] > 0]
    pairs["arm_value"] = pairs[value]
    pairs["ratio"] = pairs[value] / pairs["baseline"]
    pairs["degraded"] = pairs["_degraded"] | pairs["_base_degraded"]
    return pairs.drop(columns=["_degraded", "_base_degraded"]).reset_index(drop=True)


def bootstrap_ci(
    groups: Sequence[Sequence[float]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile interval of the median under a two-level bootstrap: draw machines with
    replacement, then values with replacement inside each drawn machine. With one group this
    is the ordinary bootstrap. Deterministic for a given seed; vectorised in blocks."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        return (float("nan"), float("nan"))
    sizes = np.array([len(a) for a in arrays])
    n_groups, n_max = len(arrays), int(sizes.max())
    padded = np.full((n_groups, n_max), np.nan)
    for i, a in enumerate(arrays):
        padded[i, : len(a)] = a
    rng = np.random.default_rng(seed)
    block = max(1, BOOTSTRAP_BLOCK_VALUES // (n_groups * n_max))
    medians = []
    for start in range(0, resamples, block):
        r = min(block, resamples - start)
        picks = rng.integers(0, n_groups, (r, n_groups))  # the machines drawn
        n = sizes[picks][..., None]
        idx = (rng.random((r, n_groups, n_max)) * n).astype(int)  # values drawn inside each
        values = np.where(np.arange(n_max) < n, padded[picks[..., None], idx], np.nan)
        medians.append(np.nanmedian(values.reshape(r, -1), axis=1))
    stats = np.concatenate(medians)
    alpha = (1 - confidence) / 2
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def summarise(
    values: pd.DataFrame, by: Sequence[str] = GROUP_KEYS, column: str = "ratio", seed: int = BOOTSTRAP_SEED
) -> pd.DataFrame:
    """Median of `column` per group with its bootstrap interval, the machines and runs behind it,
    and how many degraded rows were left out. Needs agent_id and a boolean `degraded` column
    (absent: nothing degraded)."""
    out_cols = [*by, "median", "ci_low", "ci_high", "machines", "runs", "excluded_runs"]
    if values.empty:
        return pd.DataFrame(columns=out_cols)
    values = values.copy()
    if "degraded" not in values:
        values["degraded"] = False
    rows = []
    for key, group in values.groupby(list(by), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        kept = group[~group["degraded"].astype(bool)]
        per_machine = [g[column].to_numpy() for _, g in kept.groupby("agent_id", sort=True)]
        lo, hi = bootstrap_ci(per_machine, seed=seed)
        rows.append(
            {
                **dict(zip(by, key)),
                "median": float(np.median(kept[column])) if len(kept) else float("nan"),
                "ci_low": lo,
                "ci_high": hi,
                "machines": int(kept["agent_id"].nunique()),
                "runs": int(len(kept)),
                "excluded_runs": int(group["degraded"].astype(bool).sum()),
            }
        )
    return pd.DataFrame(rows, columns=out_cols)


# ---------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Rule:
    """How a measured figure and its interval settle a claim.

    range: reproduced when the median lies in [low, high]; contradicted when the whole interval
      lies outside it; otherwise not enough data.
    above / below: reproduced when the whole interval lies above (below) threshold; contradicted
      when it lies wholly on the other side; otherwise not enough data.
    best_depth_in: the depth with the highest median speedup lies in [low, high] (reproduced), or
      beats every depth in [low, high] with intervals apart (contradicted); needs depths on both
      sides of the range.
    none_measured: an absence claim; contradicted as soon as any machine has measured it.
    Any rule: fewer than min_machines machines or min_runs runs is not enough data."""

    rule: str
    low: float | None = None
    high: float | None = None
    threshold: float | None = None
    min_machines: int = 1
    min_runs: int = 3


@dataclass(frozen=True)
class Verdict:
    verdict: str
    why: str


def verdict(rule: Rule, median: float, ci_low: float, ci_high: float, machines: int, runs: int) -> Verdict:
    """The verdict for one figure (rules range, above, below)."""
    if machines < rule.min_machines or runs < rule.min_runs or not np.isfinite(median):
        return Verdict(NOT_ENOUGH, f"needs at least {rule.min_machines} machine(s) and {rule.min_runs} run(s)")
    if rule.rule == "range":
        edges = f"[{rule.low:g}, {rule.high:g}]"
        if rule.low <= median <= rule.high:
            return Verdict(REPRODUCED, f"median within {edges}")
        if ci_high < rule.low or ci_low > rule.high:
            return Verdict(CONTRADICTED, f"interval entirely outside {edges}")
        return Verdict(NOT_ENOUGH, f"median outside {edges} but the interval reaches it")
    if rule.rule in ("above", "below"):
        above = ci_low > rule.threshold
        below = ci_high < rule.threshold
        if (above and rule.rule == "above") or (below and rule.rule == "below"):
            return Verdict(REPRODUCED, f"interval {rule.rule} {rule.threshold:g}")
        if above or below:
            return Verdict(CONTRADICTED, f"interval {'above' if above else 'below'} {rule.threshold:g}")
        return Verdict(NOT_ENOUGH, f"interval includes {rule.threshold:g}")
    raise ValueError(f"rule {rule.rule!r} does not apply to a single figure")


def best_depth_verdict(rule: Rule, by_depth: pd.DataFrame) -> tuple[Verdict, pd.Series | None]:
    """by_depth: summarise() rows of one chip, one per depth. Returns the verdict and the best row."""
    rows = by_depth[by_depth["runs"] > 0]
    if rows.empty:
        return Verdict(NOT_ENOUGH, "no depth measured"), None
    best = rows.loc[rows["median"].idxmax()]
    machines = int(rows["machines"].max())
    if machines < rule.min_machines or rows["runs"].min() < rule.min_runs:
        return Verdict(NOT_ENOUGH, f"{machines} machine(s); needs {rule.min_runs} runs at every depth"), best
    inside = rows[(rows["depth"] >= rule.low) & (rows["depth"] <= rule.high)]
    outside = rows[(rows["depth"] < rule.low) | (rows["depth"] > rule.high)]
    if inside.empty or outside.empty:
        return Verdict(NOT_ENOUGH, f"needs depths both inside and outside [{rule.low:g}, {rule.high:g}]"), best
    depth = int(best["depth"])
    if rule.low <= depth <= rule.high:
        return Verdict(REPRODUCED, f"best depth {depth} (median {best['median']:.3g})"), best
    if best["ci_low"] > inside["ci_high"].max():
        return Verdict(CONTRADICTED, f"depth {depth} beats every depth in range, intervals apart"), best
    return Verdict(NOT_ENOUGH, f"best depth {depth}, but its interval overlaps a depth in range"), best

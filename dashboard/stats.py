"""Statistics for the dashboard: pure functions on DataFrames, no Streamlit.

A speedup is specfleet/speedup.py's, the one definition every surface shows: arm over baseline
on the same attempt, prompt and repeat, pooled only inside a comparable group, combined on the
log scale (repeats, then prompts, then machines) and exponentiated. `speedups` adds what the
dashboard shows beside it: a 95% interval from a two-level bootstrap (machines, then prompts
inside each drawn machine) of the same statistic, and the pairs left out because a run was not
nominal. Other figures (decode tok/s, acceptance) are medians with the same two-level
bootstrap. Every figure carries the machines, prompts and pairs or runs behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specfleet import speedup as definition

BOOTSTRAP_SEED = 20260
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_BLOCK_VALUES = 2_000_000  # values drawn per block of resamples: bounds the memory used
# What one speedup figure is keyed by (specfleet/speedup.py speedup_sql's rows).
SPEEDUP_KEYS = ("comparable", "chip", "method", "depth")

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
NOT_ENOUGH = "not enough data"
RULES = ("range", "above", "below", "best_depth_in", "none_measured")

# A statistic of resampled values: an array (resamples, groups, values) padded with NaN, to
# one figure per resample.
Statistic = Callable[[np.ndarray], np.ndarray]


def pooled_median(values: np.ndarray) -> np.ndarray:
    """The median of every value drawn, whichever machine it came from."""
    return np.nanmedian(values.reshape(values.shape[0], -1), axis=1)


def mean_of_means(values: np.ndarray) -> np.ndarray:
    """The mean over the drawn machines of each one's mean: every machine weighs the same,
    however many prompts it ran (specfleet/speedup.py's combination of log ratios)."""
    return np.nanmean(values, axis=2).mean(axis=1)


def bootstrap_ci(
    groups: Sequence[Sequence[float]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
    statistic: Statistic = pooled_median,
) -> tuple[float, float]:
    """Percentile interval of `statistic` under a two-level bootstrap: draw machines (groups)
    with replacement, then values with replacement inside each drawn machine. With one group
    this is the ordinary bootstrap. Deterministic for a given seed; vectorised in blocks."""
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
    figures = []
    for start in range(0, resamples, block):
        r = min(block, resamples - start)
        picks = rng.integers(0, n_groups, (r, n_groups))  # the machines drawn
        n = sizes[picks][..., None]
        idx = (rng.random((r, n_groups, n_max)) * n).astype(int)  # values drawn inside each
        values = np.where(np.arange(n_max) < n, padded[picks[..., None], idx], np.nan)
        figures.append(statistic(values))
    drawn = np.concatenate(figures)
    alpha = (1 - confidence) / 2
    return float(np.quantile(drawn, alpha)), float(np.quantile(drawn, 1 - alpha))


# ---------------------------------------------------------------- speedups


def speedup_intervals(per_prompt: pd.DataFrame, seed: int = BOOTSTRAP_SEED) -> pd.DataFrame:
    """The 95% interval of each speedup from specfleet.speedup.per_prompt_sql's rows (one per
    comparable group, chip, machine, arm and prompt: the mean log ratio over its repeats):
    machines, then prompts inside each, drawn with replacement; the statistic is the mean over
    machines of their mean log ratio (the point estimate's), exponentiated."""
    cols = [*SPEEDUP_KEYS, "ci_low", "ci_high"]
    if per_prompt.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, group in per_prompt.groupby(list(SPEEDUP_KEYS), sort=True):
        machines = [g["log_ratio"].to_numpy() for _, g in group.groupby("agent_id", sort=True)]
        lo, hi = bootstrap_ci(machines, seed=seed, statistic=mean_of_means)
        rows.append((*key, float(np.exp(lo)), float(np.exp(hi))))
    return pd.DataFrame(rows, columns=cols)


def speedups(
    query: Callable[[str, dict | None], pd.DataFrame],
    source: str,
    params: dict | None = None,
    seed: int = BOOTSTRAP_SEED,
    value: str = "decode_tokens_per_second",
) -> pd.DataFrame:
    """specfleet.speedup's figures for the runs of `source`, one row per comparable group, chip
    and arm (speedup_sql's columns: speedup, machines, prompts, pairs), with ci_low, ci_high
    and excluded_pairs: the pairs left out because one of their runs was not nominal. A group
    whose every pair was left out has a row with speedup NaN and no machines.

    `query(sql, params)` runs DuckDB SQL (a mirror's, or a connection of the caller's);
    `source` is a relation of the caller's (a table name, or a parenthesised SELECT whose named
    parameters `params` binds), never user input. `value` = "prefill_tokens_per_second" gives
    the same figure for prefill speed."""
    if value != "decode_tokens_per_second":  # the one definition, on another speed
        source = f"(SELECT * REPLACE ({value} AS decode_tokens_per_second) FROM {source})"
    # Every pair, nominal or not: what the figure left out is the difference.
    everything = f"(SELECT * REPLACE (NULL::BOOLEAN AS env_nominal) FROM {source})"
    point = query(definition.speedup_sql(source), params)
    every = query(definition.speedup_sql(everything), params)
    if every.empty:
        cols = ["comparable", "engine", "target_reference", "draft_reference", "prompt_set", "chip", "method"]
        cols += ["depth", "speedup", "machines", "prompts", "pairs", "ci_low", "ci_high", "excluded_pairs"]
        return pd.DataFrame(columns=cols)
    intervals = speedup_intervals(query(definition.per_prompt_sql(source), params), seed)
    keys = list(SPEEDUP_KEYS)
    names = ["engine", "target_reference", "draft_reference", "prompt_set"]
    if point.empty:
        point = pd.DataFrame(columns=[*keys, *names, "speedup", "machines", "prompts", "pairs"])
    out = every[[*keys, *names, "pairs"]].rename(columns={"pairs": "all_pairs"})
    out = out.merge(point.drop(columns=names), on=keys, how="left").merge(intervals, on=keys, how="left")
    for name in ("machines", "prompts", "pairs"):
        out[name] = out[name].fillna(0).astype(int)
    for name in ("speedup", "ci_low", "ci_high"):
        out[name] = out[name].astype(float)
    out["excluded_pairs"] = (out["all_pairs"] - out["pairs"]).astype(int)
    order = ["comparable", "engine", "target_reference", "draft_reference", "prompt_set", "chip", "method", "depth"]
    order += ["speedup", "ci_low", "ci_high", "machines", "prompts", "pairs", "excluded_pairs"]
    return out[order].sort_values(keys).reset_index(drop=True)


# ---------------------------------------------------------------- other figures


def summarise(
    values: pd.DataFrame,
    by: Sequence[str],
    column: str,
    seed: int = BOOTSTRAP_SEED,
) -> pd.DataFrame:
    """Median of `column` per group with its two-level bootstrap interval, the machines,
    prompts and runs behind it, and how many degraded rows were left out. Needs agent_id,
    prompt_id and a boolean `degraded` column (absent: nothing degraded)."""
    out_cols = [*by, "median", "ci_low", "ci_high", "machines", "prompts", "runs", "excluded_runs"]
    if values.empty:
        return pd.DataFrame(columns=out_cols)
    values = values.copy()
    if "degraded" not in values:
        values["degraded"] = False
    rows = []
    for key, group in values.groupby(list(by), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        degraded = group["degraded"].fillna(False).astype(bool)
        kept = group[~degraded]
        per_machine = [g[column].to_numpy() for _, g in kept.groupby("agent_id", sort=True)]
        lo, hi = bootstrap_ci(per_machine, seed=seed)
        rows.append(
            {
                **dict(zip(by, key)),
                "median": float(np.median(kept[column])) if len(kept) else float("nan"),
                "ci_low": lo,
                "ci_high": hi,
                "machines": int(kept["agent_id"].nunique()),
                "prompts": int(kept["prompt_id"].nunique()),
                "runs": int(len(kept)),
                "excluded_runs": int(degraded.sum()),
            }
        )
    return pd.DataFrame(rows, columns=out_cols)


# ---------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Rule:
    """How a measured figure and its interval settle a claim.

    range: reproduced when the figure lies in [low, high]; contradicted when the whole interval
      lies outside it; otherwise not enough data.
    above / below: reproduced when the whole interval lies above (below) threshold; contradicted
      when it lies wholly on the other side; otherwise not enough data.
    best_depth_in: the depth with the highest speedup lies in [low, high] (reproduced), or
      beats every depth in [low, high] with intervals apart (contradicted); needs depths on both
      sides of the range.
    none_measured: an absence claim; contradicted as soon as any machine has measured it.
    Any rule: fewer than min_machines machines or min_runs runs (pairs, for a ratio) is not
    enough data."""

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


def verdict(rule: Rule, figure: float, ci_low: float, ci_high: float, machines: int, runs: int) -> Verdict:
    """The verdict for one figure (rules range, above, below)."""
    if machines < rule.min_machines or runs < rule.min_runs or not np.isfinite(figure):
        return Verdict(NOT_ENOUGH, f"needs at least {rule.min_machines} machine(s) and {rule.min_runs} run(s)")
    if rule.rule == "range":
        edges = f"[{rule.low:g}, {rule.high:g}]"
        if rule.low <= figure <= rule.high:
            return Verdict(REPRODUCED, f"figure within {edges}")
        if ci_high < rule.low or ci_low > rule.high:
            return Verdict(CONTRADICTED, f"interval entirely outside {edges}")
        return Verdict(NOT_ENOUGH, f"figure outside {edges} but the interval reaches it")
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
    """by_depth: one chip's figures, one row per depth (depth, figure, ci_low, ci_high,
    machines, runs). Returns the verdict and the best row."""
    rows = by_depth[(by_depth["runs"] > 0) & by_depth["figure"].notna()]
    if rows.empty:
        return Verdict(NOT_ENOUGH, "no depth measured"), None
    best = rows.loc[rows["figure"].idxmax()]
    machines = int(rows["machines"].max())
    if machines < rule.min_machines or rows["runs"].min() < rule.min_runs:
        return Verdict(NOT_ENOUGH, f"{machines} machine(s); needs {rule.min_runs} runs at every depth"), best
    inside = rows[(rows["depth"] >= rule.low) & (rows["depth"] <= rule.high)]
    outside = rows[(rows["depth"] < rule.low) | (rows["depth"] > rule.high)]
    if inside.empty or outside.empty:
        return Verdict(NOT_ENOUGH, f"needs depths both inside and outside [{rule.low:g}, {rule.high:g}]"), best
    depth = int(best["depth"])
    if rule.low <= depth <= rule.high:
        return Verdict(REPRODUCED, f"best depth {depth} (speedup {best['figure']:.3g})"), best
    if best["ci_low"] > inside["ci_high"].max():
        return Verdict(CONTRADICTED, f"depth {depth} beats every depth in range, intervals apart"), best
    return Verdict(NOT_ENOUGH, f"best depth {depth}, but its interval overlaps a depth in range"), best

"""Statistics for the dashboard: pure functions on DataFrames, no Streamlit.

A speedup is specfleet/speedup.py's, the one definition every surface shows: arm over baseline
on the same attempt, prompt and repeat, pooled only inside a comparable group, combined on the
log scale (repeats, then prompts, then machines) and exponentiated. `speedups` adds what the
dashboard shows beside it: the 95% interval the verdicts use (specfleet/inference.py: t over
machine means), and the pairs left out because a run was not nominal. Other figures (decode
tok/s, acceptance) are medians with a two-level bootstrap (machines, then values inside each
drawn machine). Every figure carries the machines, prompts and pairs or runs behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from specfleet import inference
from specfleet import speedup as definition

BOOTSTRAP_SEED = 20260
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_BLOCK_VALUES = 2_000_000  # values drawn per block of resamples: bounds the memory used
# summarise's bootstrap: a machine with more values than this enters as this many of its
# quantiles. A resample then draws fewer values inside the machine than it holds, so the
# within-machine spread counts for more: the interval is as wide or a little wider
# (conservative), and the cost no longer grows with a machine's runs (a million runs: seconds
# instead of minutes). Machines with fewer values enter whole: small fleets are unchanged.
BOOTSTRAP_MAX_VALUES = 64
# What one speedup figure is keyed by (specfleet/speedup.py speedup_sql's rows).
SPEEDUP_KEYS = ("comparable", "chip", "method", "depth")

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


def speedup_intervals(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """The 95% interval of each speedup from specfleet.speedup.per_prompt_sql's rows (one per
    comparable group, chip, machine, arm and prompt: the mean log ratio over its repeats): the
    one the verdicts use (specfleet/inference.py `estimate`: t over machine means; over one
    machine's prompts when it is the only one; none for a single prompt of a single machine)."""
    cols = [*SPEEDUP_KEYS, "ci_low", "ci_high"]
    if per_prompt.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, group in per_prompt.groupby(list(SPEEDUP_KEYS), sort=True):
        est = inference.estimate(group)
        rows.append((*key, est.low, est.high))
    return pd.DataFrame(rows, columns=cols)


def speedups(
    query: Callable[[str, dict | None], pd.DataFrame],
    source: str,
    params: dict | None = None,
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
    intervals = speedup_intervals(query(definition.per_prompt_sql(source), params))
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


def _at_most(values: np.ndarray, k: int = BOOTSTRAP_MAX_VALUES) -> np.ndarray:
    """The values, or for more than k of them their k quantiles at (i + 0.5) / k."""
    return values if len(values) <= k else np.quantile(values, (np.arange(k) + 0.5) / k)


def summarise(
    values: pd.DataFrame,
    by: Sequence[str],
    column: str,
    seed: int = BOOTSTRAP_SEED,
) -> pd.DataFrame:
    """Median of `column` per group (of every value) with its two-level bootstrap interval
    (BOOTSTRAP_MAX_VALUES per machine at most), the machines,
    prompts and runs behind it, and how many degraded rows were left out. Needs machine_id,
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
        per_machine = [_at_most(g[column].to_numpy()) for _, g in kept.groupby("machine_id", sort=True)]
        lo, hi = bootstrap_ci(per_machine, seed=seed)
        rows.append(
            {
                **dict(zip(by, key)),
                "median": float(np.median(kept[column])) if len(kept) else float("nan"),
                "ci_low": lo,
                "ci_high": hi,
                "machines": int(kept["machine_id"].nunique()),
                "prompts": int(kept["prompt_id"].nunique()),
                "runs": int(len(kept)),
                "excluded_runs": int(degraded.sum()),
            }
        )
    return pd.DataFrame(rows, columns=out_cols)

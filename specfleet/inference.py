"""Verdicts a statistician would sign: intervals, decisions and the false-discovery step.

Pure functions on specfleet.speedup.per_prompt_sql's rows (machine_id, prompt_id, log_ratio,
repeats, and depth where several depths are compared): no I/O, no Streamlit. docs/verdicts.md
says it in words, with the simulated figures behind every choice.

The statistic is specfleet's one speedup: the mean log ratio over a machine's prompts (each
already the mean over its repeats), the mean over machines, exponentiated.

The interval. A claim speaks of the machines of a chip crossed with the prompts of a category:
machines differ in level (thermal design, memory bandwidth), and under greedy decoding every
machine sees a prompt's tokens, so a prompt's effect is shared by the fleet. The interval is
`crossed_interval`: the two-way ANOVA of the machines x prompts table (machines and prompts
crossed random effects), Student's t with Satterthwaite's degrees of freedom capped at those of
the larger variance part (its docstring says why). With prompts sharing nothing it is t over
machine means (df = machines - 1), the earlier rule. t rather than a bootstrap because fleets are
small: a bootstrap over 3 machines has only 10 distinct resamples and its distribution never
leaves [min, max] of the three machine means, which holds the truth with probability
1 - 2 / 2**3 = 0.75 at most, so no bootstrap interval (percentile or BCa) can reach 95% there
(bench/verdicts.py sections intervals and crossed; docs/verdicts.md has the tables).

With one machine there is no machine-to-machine spread: the interval is t over that machine's
per-prompt log ratios (df = prompts - 1) and `note` says it describes that machine only; the
rules (`decide`, min_machines=MIN_MACHINES=3) do not accept it: "inconclusive: 1 of 3 machines",
the figure shown. MIN_MACHINES (3) and MIN_PROMPTS (5) are the smallest counts whose simulated
coverage stays within 0.93-0.97 and wrong-verdict rate at the nominal 2.5% with prompts a sample
of their category (bench/verdicts.py section crossed).
Identical values (no spread) give no interval rather than a zero-width one; p-values are never
NaN. `estimate_mean` is the same interval on a rate's own scale (acceptance rates).

Decisions. A claim's figure has a tolerance band [band_low, band_high] (a ratio range; "above
x" is [x, inf), "below x" is (0, x]). `decide` says reproduced when the interval lies inside
the band, contradicted when it lies wholly outside, inconclusive otherwise or with fewer than
min_machines machines. Each verdict carries the p-value of its test on the log scale with the
interval's t distribution: reproduced, the equivalence test (TOST: both one-sided tests against
the band's edges, p = the larger); contradicted, the one-sided test that the truth lies beyond
the band's edge nearest the estimate. The 95% interval lies inside the band exactly when the
TOST p <= 0.025, and wholly outside exactly when that one-sided p < 0.025: the p-values and
the interval say the same thing. An inconclusive decision claims nothing; its p-value is 1.

`adjust` applies Benjamini-Hochberg over every tested decision (claims x chips x depths): a
verdict stands only when its adjusted p-value is <= q. Setting an inconclusive decision's
p-value to 1 keeps each p-value valid (it is never below the test's own), so BH's guarantee
holds for the family: the expected share of false verdicts among those standing is <= q for
independent tests (or positively dependent ones; `dependent=True` uses Benjamini-Yekutieli for
any dependence).

Best depth. Is the depth with the highest speedup inside a band of depths? The verdict uses
a 95% confidence set for the best depth (`depth_p_values`: Gupta's subset selection, Hsu's
multiple comparisons with the best, on the machine x depth table with machines as blocks, so
machine levels cancel): reproduced when the set lies inside the band, contradicted when it lies
wholly outside. With six depths of equal speedup either verdict comes out in <= 5% of fleets
whatever the band (7-8% when the machine x depth spread grows fourfold from depth 1 to 6 and
the band leaves out only the noisiest depth: pooling the error assumes an even spread).
`best_depth_probability` is the bootstrap probability that the best depth lies in the band
(machines drawn with replacement, then prompts within each drawn machine, the same draw
applied at every depth); it is reported beside the verdict, and available as a rule
(`rule="bootstrap"`: reproduced at >= 0.95, contradicted at <= 0.05) for comparison, but not
the default: the bootstrap of an argmax is not calibrated at ties (six equal depths,
a band holding five of them: reproduced in 34-40% of fleets).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats

CONFIDENCE = 0.95
# The fewest machines (per chip) and prompts (on each machine) a verdict needs, chosen by
# simulation (bench/verdicts.py, sections `crossed` and `rules`; docs/verdicts.md): the smallest
# counts at which, with prompts a sample of their category (a prompt effect every machine
# shares), the interval covers 0.93-0.97 and wrong verdicts stay at the nominal rate. Two
# machines cannot (crossed_interval says why); 5 prompts can, from 3 machines up.
MIN_MACHINES = 3
MIN_PROMPTS = 5
NOMINAL_WRONG = (1 - 0.95) / 2  # a verdict's nominal error at the worst edge: 2.5%
FDR_Q = 0.05
BEST_DEPTH_RESAMPLES = 2000
BEST_DEPTH_SEED = 20261
BEST_DEPTH_LEVEL = 0.95  # reproduced at >= this probability, contradicted at <= 1 - this
BEST_DEPTH_BLOCK_VALUES = 4_000_000  # values drawn per block of resamples: bounds the memory used

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive"

CROSSED = "machines x prompts crossed"
T_MACHINES = "t over machines"
T_PROMPTS = "t over one machine's prompts"
NO_INTERVAL = "none"
LOG = "log"  # the figure is a ratio, its interval t on the log scale (speedups)
LINEAR = "linear"  # the figure is a mean, its interval t on its own scale (acceptance rates)

# The columns that name one figure (specfleet.speedup's keys): an estimate is of one of them.
FIGURE_KEYS = ("comparable", "chip", "method", "depth")


# ---------------------------------------------------------------- the interval


@dataclass(frozen=True)
class Estimate:
    """One speedup with its interval. speedup, low, high are ratios; log_mean, log_se and df
    are the t statistic's pieces on the log scale (NaN where there is no interval)."""

    speedup: float
    low: float
    high: float
    machines: int
    prompts: int  # the fewest prompts on any machine
    pairs: int
    method: str
    note: str = ""
    confidence: float = CONFIDENCE
    log_mean: float = math.nan
    log_se: float = math.nan
    df: float = 0.0
    scale: str = LOG  # LOG: log_mean and log_se on the log scale; LINEAR: on the figure's own


def t_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, ...]:
    """Student's t interval of the mean along the last axis, vectorised over the others:
    (mean, se, df, low, high). One value: se, low and high are NaN."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    mean = values.mean(axis=-1)
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return mean, nan, 0, nan, nan
    se = values.std(axis=-1, ddof=1) / np.sqrt(n)
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * se
    return mean, se, n - 1, mean - half, mean + half


ZERO_SPREAD_RTOL = 1e-9  # a standard error this small against the figure's own size is no spread


def flat(se, mean) -> np.ndarray:
    """Whether a standard error is no spread at all, relative to the figure (vectorised): a
    zero-width interval claims a certainty replayed or synthetic data has not earned."""
    se, mean = np.asarray(se, dtype=float), np.asarray(mean, dtype=float)
    with np.errstate(invalid="ignore"):
        return ~(se > ZERO_SPREAD_RTOL * np.maximum(1.0, np.abs(mean)))


def crossed_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, ...]:
    """The interval of the grand mean of a complete machines x prompts table (last two axes,
    vectorised over the others), machines and prompts crossed random effects:

        value[m, p] = mu + machine[m] + prompt[p] + residual[m, p].

    Var(grand mean) = s_machine^2 / M + s_prompt^2 / P + s_residual^2 / (M P), from the two-way
    ANOVA's mean squares in two parts: A = MS_machines / (M P), the variance of the machine means
    over M (the machine and residual terms: t over machine means, exact with M - 1 degrees of
    freedom when prompts share nothing), and B = max(0, MS_prompts - MS_residual) / (M P), the
    prompt effect every machine shares (P - 1 degrees of freedom, MS_prompts'). Degrees of
    freedom: Satterthwaite's on A (M - 1) and B (P - 1), capped at the degrees of freedom of the
    larger part (M - 1 when A >= B, else P - 1). Satterthwaite's figure is computed from the
    estimates themselves, so a part estimated small by chance lends the sum the other part's
    degrees of freedom just when the variance is underestimated: uncapped, coverage fell to
    0.91-0.94 (bench/verdicts.py section crossed); capped, 0.95-0.97 at 3 to 10 machines. With two
    machines A has one degree of freedom and no choice of df holds 0.93-0.97 over the mixes of
    spreads a fleet may have (0.91-0.96 capped; 0.93-0.99 with df 1 whenever A >= B / 2): hence
    MIN_MACHINES 3. Returns (mean, se, df, low, high); fewer than 2 machines or 2 prompts: se, low
    and high NaN."""
    a = np.asarray(values, dtype=float)
    m, p = a.shape[-2:]
    mean = a.mean(axis=(-2, -1))
    if m < 2 or p < 2:
        nan = np.full_like(mean, np.nan)
        return mean, nan, np.zeros_like(mean), nan, nan
    rows, cols = a.mean(axis=-1), a.mean(axis=-2)
    ms_machines = p * ((rows - mean[..., None]) ** 2).sum(axis=-1) / (m - 1)
    ms_prompts = m * ((cols - mean[..., None]) ** 2).sum(axis=-1) / (p - 1)
    residual = a - rows[..., :, None] - cols[..., None, :] + mean[..., None, None]
    ms_residual = (residual**2).sum(axis=(-2, -1)) / ((m - 1) * (p - 1))
    machine_term = ms_machines / (m * p)
    prompt_term = np.maximum(ms_prompts - ms_residual, 0.0) / (m * p)
    with np.errstate(invalid="ignore", divide="ignore"):
        both = (machine_term + prompt_term) ** 2 / (machine_term**2 / (m - 1) + prompt_term**2 / (p - 1))
    larger = np.where(machine_term >= prompt_term, m - 1, p - 1)
    df = np.where(np.isfinite(both), np.clip(both, 1.0, larger), larger).astype(float)
    se = np.sqrt(machine_term + prompt_term)
    half = stats.t.ppf((1 + confidence) / 2, df) * se
    return mean, se, df, mean - half, mean + half


def _one_figure(per_prompt: pd.DataFrame, what: str) -> None:
    missing = {"machine_id", "prompt_id", "log_ratio"} - set(per_prompt.columns)
    if missing:
        raise ValueError(f"{what} needs columns {sorted(missing)}")
    if not np.all(np.isfinite(per_prompt["log_ratio"].to_numpy(dtype=float))):
        raise ValueError("log ratios must be finite (a zero speed is never a pair)")


def _fleet_interval(per_prompt: pd.DataFrame, column: str, confidence: float) -> tuple:
    """(mean, se, df, low, high, method, note) of a figure over machines (>= 2): the mean of
    machine means (the definition's), with the crossed interval's spread on the prompts every
    machine measured (the prompt set is a checked key: normally all of them). Fewer than two such
    prompts: t over machine means, said in the note."""
    table = per_prompt.pivot_table(index="machine_id", columns="prompt_id", values=column, aggfunc="mean")
    mean = float(per_prompt.groupby("machine_id")[column].mean().mean())
    shared = table.dropna(axis=1)
    if shared.shape[1] >= 2:
        _, se, df, _, _ = (float(x) for x in crossed_interval(shared.to_numpy(), confidence))
        half = stats.t.ppf((1 + confidence) / 2, df) * se
        left = table.shape[1] - shared.shape[1]
        note = f"{left} prompt(s) not measured on every machine left out of the spread" if left else ""
        return mean, se, df, mean - half, mean + half, CROSSED, note
    means = per_prompt.groupby("machine_id")[column].mean().to_numpy()
    _, se, df, low, high = (float(x) for x in t_interval(means, confidence))
    return mean, se, df, low, high, T_MACHINES, "fewer than 2 prompts on every machine: t over machine means"


def estimate(per_prompt: pd.DataFrame, confidence: float = CONFIDENCE) -> Estimate:
    """The speedup of one figure (one comparable group, chip, arm and depth) from its
    per_prompt_sql rows, with its interval: t over machine means (df = machines - 1); with one
    machine, t over its prompts (df = prompts - 1), noted as describing that machine only."""
    _one_figure(per_prompt, "estimate")
    for key in FIGURE_KEYS:
        if key in per_prompt and per_prompt[key].nunique(dropna=False) > 1:
            raise ValueError(f"rows of several figures ({key} differs): estimate one at a time")
    if per_prompt.empty:
        nan = math.nan
        return Estimate(nan, nan, nan, 0, 0, 0, NO_INTERVAL, "no pairs", confidence)
    by_machine = per_prompt.groupby("machine_id", sort=True)["log_ratio"]
    means = by_machine.mean().to_numpy()
    machines, prompts = len(means), int(by_machine.size().min())
    pairs = int(per_prompt["repeats"].sum()) if "repeats" in per_prompt else len(per_prompt)
    if machines >= 2:
        mean, se, df, low, high, method, note = _fleet_interval(per_prompt, "log_ratio", confidence)
    else:
        values, method = per_prompt["log_ratio"].to_numpy(dtype=float), T_PROMPTS
        note = "one machine: the interval is over its prompts and describes that machine only, not the fleet"
        if prompts < 2:
            method, note = NO_INTERVAL, "one machine and one prompt: no interval"
        mean, se, df, low, high = (float(x) for x in t_interval(values, confidence))
    if flat(se, mean):  # identical values: a zero-width interval would claim certainty it has not
        low = high = se = math.nan
        method, note = NO_INTERVAL, _zero_spread_note(machines)
    return Estimate(
        speedup=math.exp(mean),
        low=math.exp(low),
        high=math.exp(high),
        machines=machines,
        prompts=prompts,
        pairs=pairs,
        method=method,
        note=note,
        confidence=confidence,
        log_mean=mean,
        log_se=se,
        df=float(df),
    )


def _zero_spread_note(machines: int) -> str:
    what = f"the {machines} machines' figures are" if machines >= 2 else "the machine's prompts are"
    return f"{what} identical: no spread, so no interval (replayed or synthetic results?)"


def estimate_mean(values: pd.DataFrame, column: str = "value", confidence: float = CONFIDENCE) -> Estimate:
    """A mean on its own scale (acceptance rates: 0-1) with the interval the speedups use: each
    machine's mean over its prompts (each prompt's value the mean over its runs) is one
    observation, t over machine means (df = machines - 1); one machine, t over its prompts,
    noted. Needs machine_id, prompt_id and `column`; non-finite values are left out (noted).
    `speedup` holds the mean, `pairs` the runs; log_mean and log_se are on the linear scale."""
    missing = {"machine_id", "prompt_id", column} - set(values.columns)
    if missing:
        raise ValueError(f"estimate_mean needs columns {sorted(missing)}")
    finite = np.isfinite(values[column].to_numpy(dtype=float))
    dropped, values = int((~finite).sum()), values[finite]
    if values.empty:
        nan = math.nan
        return Estimate(nan, nan, nan, 0, 0, 0, NO_INTERVAL, "no values", confidence, scale=LINEAR)
    per_prompt = values.groupby(["machine_id", "prompt_id"], sort=True)[column].mean()
    by_machine = per_prompt.groupby(level="machine_id")
    means = by_machine.mean().to_numpy()
    machines, prompts = len(means), int(by_machine.size().min())
    if machines >= 2:
        mean, se, df, low, high, method, note = _fleet_interval(per_prompt.reset_index(), column, confidence)
    else:
        series, method = per_prompt.to_numpy(dtype=float), T_PROMPTS
        note = "one machine: the interval is over its prompts and describes that machine only, not the fleet"
        if prompts < 2:
            method, note = NO_INTERVAL, "one machine and one prompt: no interval"
        mean, se, df, low, high = (float(x) for x in t_interval(series, confidence))
    if flat(se, mean):
        low = high = se = math.nan
        method, note = NO_INTERVAL, _zero_spread_note(machines)
    if dropped:
        note = "; ".join(x for x in (note, f"{dropped} non-finite value(s) left out") if x)
    return Estimate(
        speedup=mean,
        low=low,
        high=high,
        machines=machines,
        prompts=prompts,
        pairs=len(values),
        method=method,
        note=note,
        confidence=confidence,
        log_mean=mean,
        log_se=se,
        df=float(df),
        scale=LINEAR,
    )


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Decision:
    """A verdict with what stands behind it. p_value is the verdict's own test (TOST for
    reproduced, beyond the nearest edge for contradicted; 1 for inconclusive); p_equivalence
    and p_beyond are both tests' p-values, whatever the verdict. tested: whether the data could
    have given a verdict (enough machines and an interval); only tested decisions enter the
    false-discovery step. adjusted_p: set by `adjust`."""

    verdict: str
    why: str
    speedup: float
    low: float
    high: float
    machines: int
    prompts: int
    pairs: int
    band_low: float
    band_high: float
    p_value: float = 1.0
    p_equivalence: float = math.nan
    p_beyond: float = math.nan
    tested: bool = False
    adjusted_p: float | None = None
    best_depth: int | None = None
    probability: float | None = None


def _check_band(band_low: float, band_high: float) -> None:
    if not (0 <= band_low < band_high <= math.inf):
        raise ValueError(f"a band needs 0 <= low < high <= inf, got [{band_low}, {band_high}]")


def band_text(band_low: float, band_high: float) -> str:
    if math.isinf(band_high):
        return f"above {band_low:g}x"
    if band_low == 0:
        return f"below {band_high:g}x"
    return f"{band_low:g}-{band_high:g}x"


def classify(low, high, band_low: float, band_high: float) -> np.ndarray:
    """The verdict of intervals [low, high] (ratios, vectorised) against a band: reproduced
    inside it, contradicted wholly outside, inconclusive otherwise (or no interval)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    inside = (low >= band_low) & (high <= band_high)
    outside = (high < band_low) | (low > band_high)
    return np.select([inside, outside], [REPRODUCED, CONTRADICTED], INCONCLUSIVE)


def band_p_values(
    log_mean, log_se, df, band_low: float, band_high: float, scale: str = LOG
) -> tuple[np.ndarray, np.ndarray]:
    """(p_equivalence, p_beyond), vectorised, with t(df) on the estimate's scale (LOG: the band's
    edges are logged; LINEAR: taken as they are):

    p_equivalence: TOST of H0 "the truth lies outside the band", the larger of the one-sided
      p-values against each edge (an infinite edge or a zero one is no constraint: p 0 there);
    p_beyond: the one-sided test of H0 "the truth lies inside the band or beyond its other
      edge" against the edge nearest the estimate (the side it lies on).

    A zero or missing standard error gives p 1 for both (no test can be made: never NaN)."""
    m, se = np.asarray(log_mean, dtype=float), np.asarray(log_se, dtype=float)
    if scale == LOG:
        lo = -np.inf if band_low == 0 else math.log(band_low)
        hi = np.inf if math.isinf(band_high) else math.log(band_high)
    elif scale == LINEAR:
        lo = -np.inf if band_low == 0 else float(band_low)
        hi = float(band_high)
    else:
        raise ValueError(f"scale {scale!r}: {LOG} or {LINEAR}")
    usable = np.isfinite(se) & (se > 0) & np.isfinite(m)
    safe = np.where(usable, se, 1.0)
    with np.errstate(invalid="ignore"):
        z_lo = np.where(usable, (m - lo) / safe, 0.0)
        z_hi = np.where(usable, (m - hi) / safe, 0.0)
    df = np.maximum(np.asarray(df, dtype=float), 1.0)
    p_above_lo = stats.t.sf(z_lo, df)  # H0: truth <= low edge
    p_below_hi = stats.t.cdf(z_hi, df)  # H0: truth >= high edge
    p_equivalence = np.maximum(p_above_lo, p_below_hi)
    # beyond the high edge (H0: truth <= high) or below the low edge (H0: truth >= low)
    beyond_high, beyond_low = stats.t.sf(z_hi, df), stats.t.cdf(z_lo, df)
    with np.errstate(invalid="ignore"):
        nearer_high = (m - hi) > (lo - m)
    p_beyond = np.where(nearer_high, beyond_high, beyond_low)
    return np.where(usable, p_equivalence, 1.0), np.where(usable, p_beyond, 1.0)


def too_few(have: int, need: int, what: str) -> str:
    """The verdict's words when a count is short of the rule's: "inconclusive: 1 of 3 machines"."""
    return f"{INCONCLUSIVE}: {have} of {need} {what}"


def decide(
    estimate: Estimate,
    band_low: float,
    band_high: float,
    min_machines: int = MIN_MACHINES,
    min_prompts: int = MIN_PROMPTS,
) -> Decision:
    """Reproduced when the interval lies inside [band_low, band_high], contradicted when it
    lies wholly outside, inconclusive otherwise. Inconclusive and untested, with the figure
    still shown and the reason first in `why`: fewer than min_machines machines
    ("inconclusive: 1 of 3 machines"), fewer than min_prompts prompts on some machine, no pairs,
    or no interval (identical values: no spread). The p-values test the same thing on the
    estimate's scale (module docstring); they are never NaN."""
    _check_band(band_low, band_high)
    e = estimate
    band = band_text(band_low, band_high)
    unit = "x" if e.scale == LOG else ""
    band = band if unit else band.replace("x", "")
    counts = f"{e.machines} machine(s), fewest {e.prompts} prompt(s), {e.pairs} pair(s)"
    interval = f"{e.confidence:.0%} interval {e.low:.3g}-{e.high:.3g}{unit}"
    base = dict(
        speedup=e.speedup,
        low=e.low,
        high=e.high,
        machines=e.machines,
        prompts=e.prompts,
        pairs=e.pairs,
        band_low=band_low,
        band_high=band_high,
    )
    figure = "" if not math.isfinite(e.speedup) else f"; the figure {e.speedup:.3g}{unit}"
    figure += f" ({interval})" if figure and math.isfinite(e.low) else ""
    note = f" ({e.note})" if e.note else ""
    if e.machines == 0:
        return Decision(INCONCLUSIVE, f"{INCONCLUSIVE}: no pairs{note}", **base)
    if e.machines < min_machines:
        why = f"{too_few(e.machines, min_machines, 'machines')}{figure}; {counts}{note}"
        return Decision(INCONCLUSIVE, why, **base)
    if e.prompts < min_prompts:
        why = f"{too_few(e.prompts, min_prompts, 'prompts')} on a machine{figure}; {counts}{note}"
        return Decision(INCONCLUSIVE, why, **base)
    if not (np.isfinite(e.low) and np.isfinite(e.high) and e.high > e.low):
        return Decision(INCONCLUSIVE, f"{INCONCLUSIVE}: no interval{note}{figure}; {counts}", **base)
    p_eq, p_out = (float(x) for x in band_p_values(e.log_mean, e.log_se, e.df, band_low, band_high, e.scale))
    verdict = str(classify(e.low, e.high, band_low, band_high))
    tests = dict(p_equivalence=p_eq, p_beyond=p_out, tested=True)
    if verdict == REPRODUCED:
        why = f"{interval} lies inside {band} (equivalence p {p_eq:.2g}); {counts}"
        return Decision(verdict, why, p_value=p_eq, **tests, **base)
    if verdict == CONTRADICTED:
        why = f"{interval} lies wholly outside {band} (p {p_out:.2g}); {counts}"
        return Decision(verdict, why, p_value=p_out, **tests, **base)
    why = f"{interval} reaches across an edge of {band} (figure {e.speedup:.3g}{unit}); {counts}"
    return Decision(verdict, why, p_value=1.0, **tests, **base)


def decide_arrays(
    log_ratios: np.ndarray,
    band_low: float,
    band_high: float,
    min_machines: int = MIN_MACHINES,
    confidence: float = CONFIDENCE,
    min_prompts: int = MIN_PROMPTS,
) -> dict[str, np.ndarray]:
    """`decide(estimate(...))` for many complete fleets at once: log_ratios is an array
    (..., machines, prompts) of per-prompt mean log ratios (every machine ran every prompt).
    Returns arrays speedup, low, high, verdict and p_value, shaped like the leading axes. For
    simulations (bench/verdicts.py); tests check it against decide figure for figure."""
    _check_band(band_low, band_high)
    a = np.asarray(log_ratios, dtype=float)
    machines = a.shape[-2]
    if machines >= 2 and a.shape[-1] >= 2:
        mean, se, df, low, high = crossed_interval(a, confidence)
    else:
        mean, se, df, low, high = t_interval(a.mean(axis=-1) if machines >= 2 else a[..., 0, :], confidence)
    none = flat(se, mean)  # identical values: no interval
    low, high = np.exp(np.where(none, np.nan, low)), np.exp(np.where(none, np.nan, high))
    verdict = classify(low, high, band_low, band_high)
    if machines < min_machines or a.shape[-1] < min_prompts:
        verdict = np.full(verdict.shape, INCONCLUSIVE)
    with np.errstate(invalid="ignore"):
        p_eq, p_out = band_p_values(mean, se, df, band_low, band_high)
    p = np.select([verdict == REPRODUCED, verdict == CONTRADICTED], [p_eq, p_out], 1.0)
    return {"speedup": np.exp(mean), "low": low, "high": high, "verdict": verdict, "p_value": p}


# ---------------------------------------------------------------- best depth


def _depth_array(per_prompt_by_depth: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values (machines, prompts, depths) padded with NaN, prompts per machine, depths):
    each machine's prompts in one order at every depth, so a prompt drawn is drawn at all."""
    _one_figure(per_prompt_by_depth, "best depth")
    if "depth" not in per_prompt_by_depth:
        raise ValueError("best depth needs a depth column")
    t = per_prompt_by_depth.pivot_table(
        index=["machine_id", "prompt_id"], columns="depth", values="log_ratio", aggfunc="mean"
    )
    depths = t.columns.to_numpy()
    machines = t.index.get_level_values("machine_id")
    names, sizes = np.unique(machines, return_counts=True)
    values = np.full((len(names), int(sizes.max()), len(depths)), np.nan)
    row = 0
    for i, n in enumerate(sizes):  # the pivot's rows are sorted by machine
        values[i, :n] = t.to_numpy()[row : row + n]
        row += n
    return values, sizes, depths


def best_depth_probability(
    per_prompt_by_depth: pd.DataFrame,
    low: float,
    high: float,
    resamples: int = BEST_DEPTH_RESAMPLES,
    seed: int = BEST_DEPTH_SEED,
) -> float:
    """The bootstrap probability that the depth with the highest speedup lies in [low, high]
    (depths, inclusive): machines drawn with replacement, then prompts with replacement within
    each drawn machine; one draw per resample applied to every depth. The statistic at each
    depth is the speedup's (mean over drawn machines of their mean over drawn prompts). A
    depth a drawn machine did not measure is left out of that machine's mean there."""
    values, sizes, depths = _depth_array(per_prompt_by_depth)
    n_machines, n_max, n_depths = values.shape
    inside = (depths >= low) & (depths <= high)
    rng = np.random.default_rng(seed)
    block = max(1, BEST_DEPTH_BLOCK_VALUES // (n_machines * n_max * n_depths))
    hits = 0
    for start in range(0, resamples, block):
        r = min(block, resamples - start)
        picks = rng.integers(0, n_machines, (r, n_machines))
        n = sizes[picks][..., None]
        idx = (rng.random((r, n_machines, n_max)) * n).astype(int)
        drawn = values[picks[..., None], idx]  # (r, machines, prompts, depths)
        drawn = np.where((np.arange(n_max) < n)[..., None], drawn, np.nan)
        with warnings.catch_warnings():  # a depth no drawn machine measured: NaN, left out below
            warnings.simplefilter("ignore", RuntimeWarning)
            by_depth = np.nanmean(np.nanmean(drawn, axis=2), axis=1)  # (r, depths)
        best = np.argmax(np.where(np.isnan(by_depth), -np.inf, by_depth), axis=1)
        hits += int(inside[best].sum())
    return hits / resamples


def complete_machines(per_prompt_by_depth: pd.DataFrame) -> list:
    """The machines that measured every depth of the rows (at least one prompt at each): the
    ones depth_p_values' two-way table holds, and so the ones a best-depth verdict rests on."""
    d = per_prompt_by_depth
    n_depths = d["depth"].nunique()
    per = d.dropna(subset=["log_ratio"]).groupby("machine_id")["depth"].nunique()
    return sorted(per.index[per == n_depths])


def depth_p_values(per_prompt_by_depth: pd.DataFrame) -> pd.Series:
    """For each depth, the p-value of "this depth is a best depth" (highest true speedup, ties
    included), indexed by depth. A depth d is excluded at level a when some other depth beats
    it by more than c(a) standard errors, c(a) = t quantile at 1 - a / (depths - 1) (Bonferroni
    over the other depths), so its p-value is min(1, (depths - 1) * t.sf((max_j mean_j -
    mean_d) / se)). The depths whose p-value exceeds a form a 1 - a confidence set for the best
    depth (Gupta's subset selection; Hsu's multiple comparisons with the best).

    The design is a two-way table: machines are blocks, depths are paired within each (the
    same machine, prompts and thermal window), so machine levels cancel from every comparison.
    The table is each machine's mean log ratio over its prompts at each depth; the error is
    the table's machine x depth residual, pooled over depths: s^2 = sum of squared residuals /
    ((machines - 1) * (depths - 1)), se = s * sqrt(2 / machines), with (machines - 1) * (depths
    - 1) degrees of freedom. Pooling assumes the machine x depth spread is about the same at
    every depth (docs/verdicts.md checks it against spread growing fourfold with depth). Only
    machines that measured every depth enter."""
    values, _, depths = _depth_array(per_prompt_by_depth)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        table = np.nanmean(values, axis=1)  # (machines, depths)
    table = table[np.all(np.isfinite(table), axis=1)]
    machines, n_depths = table.shape
    if machines < 2 or n_depths < 2:
        return pd.Series(1.0, index=pd.Index(depths, name="depth"), name="p_best")
    means = table.mean(axis=0)
    residual = table - table.mean(axis=1, keepdims=True) - means + means.mean()
    df = (machines - 1) * (n_depths - 1)
    se = math.sqrt((residual**2).sum() / df * 2 / machines)
    others = np.array([np.delete(means, d).max() for d in range(n_depths)])
    gap = others - means  # how far the best other depth lies above each depth
    with np.errstate(divide="ignore", invalid="ignore"):
        if flat(se, np.abs(means).max()):  # no spread (replayed data): no depth can be excluded
            return pd.Series(1.0, index=pd.Index(depths, name="depth"), name="p_best")
        z = gap / se
    p = np.minimum(1.0, (n_depths - 1) * stats.t.sf(z, df))
    return pd.Series(p, index=pd.Index(depths, name="depth"), name="p_best")


def decide_best_depth(
    per_prompt_by_depth: pd.DataFrame,
    low: float,
    high: float,
    min_machines: int = MIN_MACHINES,
    resamples: int = BEST_DEPTH_RESAMPLES,
    seed: int = BEST_DEPTH_SEED,
    confidence: float = CONFIDENCE,
    rule: str = "confidence-set",
    level: float = BEST_DEPTH_LEVEL,
    min_prompts: int = MIN_PROMPTS,
) -> Decision:
    """Is the best depth in [low, high] (depths, inclusive)?

    rule "confidence-set" (the default): from depth_p_values, the `confidence` set for the best
    depth (the depths with p_best > 1 - confidence). Reproduced when the set lies inside the
    band, contradicted when it lies wholly outside, inconclusive otherwise: `decide`'s rule
    with a set of depths for the interval. Its p-values: reproduced, the largest p_best of the
    depths outside the band (each must be excluded); contradicted, the largest inside. Each is
    valid whatever the true speedups, ties included: when every depth is equally fast, every
    depth is a best depth and each verdict needs one of them excluded (probability <= 1 -
    confidence).

    rule "bootstrap": reproduced when best_depth_probability >= level, contradicted when it is
    <= 1 - level. The bootstrap probability of an argmax is not calibrated at ties: with six
    depths of equal speedup it reproduces a band holding five of them in 34-40% of
    fleets (docs/verdicts.md). It is here for comparison and as a description, not for
    verdicts.

    Either way inconclusive with fewer than min_machines machines or without depths both
    inside and outside the band. The Decision's speedup and interval are the observed best
    depth's; probability is best_depth_probability's under both rules."""
    if not low <= high:
        raise ValueError(f"a band of depths needs low <= high, got [{low}, {high}]")
    if rule not in ("confidence-set", "bootstrap"):
        raise ValueError(f"rule {rule!r}: confidence-set or bootstrap")
    d = per_prompt_by_depth
    _one_figure(d, "best depth")
    base, partial = _best_depth_base(d, low, high, confidence)
    machines, best = base["machines"], base["best_depth"]
    band = f"[{low:g}, {high:g}]"
    depths = np.sort(d["depth"].unique()) if len(d) else np.array([])
    inside = (depths >= low) & (depths <= high)
    left = f"; {partial} machine(s) that missed a depth left out" if partial else ""
    if machines < min_machines:
        why = f"{too_few(machines, min_machines, 'machines')} measured every depth{left}"
        return Decision(INCONCLUSIVE, why, **base)
    if base["prompts"] < min_prompts:
        return Decision(INCONCLUSIVE, f"{too_few(base['prompts'], min_prompts, 'prompts')} on a machine{left}", **base)
    if not inside.any() or inside.all():
        return Decision(INCONCLUSIVE, f"needs depths both inside and outside {band}", **base)
    prob = best_depth_probability(d, low, high, resamples, seed)
    said = f"best depth measured {best} ({base['speedup']:.3g}x), bootstrap P(best in {band}) {prob:.2f}"
    said = f"{machines} machine(s) measured every depth{left}; " + said
    if rule == "bootstrap":
        p_in, p_out, alpha = 1 - prob, prob, 1 - level
        yes, no = f"P >= {level:g}", f"P <= {1 - level:.2g}"
    else:
        p_in, p_out, chosen = _best_depth_set_p_values(d, low, high, confidence)
        alpha = 1 - confidence
        said += f"; {confidence:.0%} set for the best depth {chosen}"
        yes, no = f"inside {band}", f"wholly outside {band}"
    tested = dict(tested=True, probability=prob, p_equivalence=p_in, p_beyond=p_out)
    if p_in <= alpha:
        return Decision(REPRODUCED, f"{said}: {yes} (p {p_in:.2g})", p_value=p_in, **tested, **base)
    if p_out <= alpha:
        return Decision(CONTRADICTED, f"{said}: {no} (p {p_out:.2g})", p_value=p_out, **tested, **base)
    return Decision(INCONCLUSIVE, f"{said}: neither {yes} nor {no}", **tested, **base)


def _best_depth_base(d: pd.DataFrame, low: float, high: float, confidence: float) -> tuple[dict, int]:
    """(the Decision's fields every best-depth verdict shares, machines that missed a depth): the
    observed best depth's speedup and interval, the machines that measured every depth (only they
    enter the confidence set, so only they count toward the minimum), the fewest prompts, pairs."""
    by_depth = {int(k): estimate(g.drop(columns="depth"), confidence) for k, g in d.groupby("depth")}
    machines = len(complete_machines(d)) if len(d) else 0
    partial = int(d["machine_id"].nunique()) - machines if len(d) else 0
    best = max(by_depth, key=lambda k: by_depth[k].speedup) if by_depth else None
    e = by_depth[best] if best is not None else Estimate(math.nan, math.nan, math.nan, 0, 0, 0, NO_INTERVAL)
    base = dict(
        speedup=e.speedup,
        low=e.low,
        high=e.high,
        machines=machines,
        prompts=min((x.prompts for x in by_depth.values()), default=0),
        pairs=sum(x.pairs for x in by_depth.values()),
        band_low=float(low),
        band_high=float(high),
        best_depth=best,
    )
    return base, partial


def _best_depth_set_p_values(d: pd.DataFrame, low: float, high: float, confidence: float) -> tuple:
    """(p of "the best depth lies inside [low, high]": the largest p_best outside it, p of "wholly
    outside": the largest inside, the depths of the confidence set for the best depth)."""
    p_best = depth_p_values(d)
    in_band = (p_best.index >= low) & (p_best.index <= high)
    chosen = [int(k) for k in p_best.index[p_best > 1 - confidence]]
    return float(p_best[~in_band].max()), float(p_best[in_band].max()), chosen


# ---------------------------------------------------------------- false discoveries


def benjamini_hochberg(pvalues: Sequence[float], dependent: bool = False) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control): hypothesis i
    is rejected at false-discovery rate q when its adjusted p-value is <= q. dependent=True:
    Benjamini-Yekutieli, valid under any dependence (more conservative)."""
    p = np.asarray(pvalues, dtype=float)
    if p.size == 0:
        return p
    if np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    return stats.false_discovery_control(p, method="by" if dependent else "bh")


def adjust(decisions: Sequence[Decision], q: float = FDR_Q, dependent: bool = False) -> list[Decision]:
    """The decisions after the false-discovery step over every tested one (claims x chips x
    depths: pass them all at once): each gets its adjusted p-value, and a verdict stands only
    when that is <= q; otherwise it becomes inconclusive, saying why. Untested decisions (too
    few machines, no interval, no depths on both sides) could not have given a verdict
    whatever the data, so they are left out of the family and returned as they are."""
    if not 0 < q < 1:
        raise ValueError("q must lie in (0, 1)")
    tested = [i for i, d in enumerate(decisions) if d.tested]
    adjusted = benjamini_hochberg([decisions[i].p_value for i in tested], dependent)
    out = list(decisions)
    for i, p in zip(tested, adjusted):
        d = replace(decisions[i], adjusted_p=float(p))
        if d.verdict != INCONCLUSIVE and p > q:
            why = (
                f"{d.verdict} alone ({d.why}), but not after the false-discovery step over "
                f"{len(tested)} tested decisions: adjusted p {p:.2g} > q {q:g}"
            )
            d = replace(d, verdict=INCONCLUSIVE, why=why)
        out[i] = d
    return out

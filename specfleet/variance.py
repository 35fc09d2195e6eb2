"""What the chip does apart from the unit: variance components of a log figure by chip, machine
within chip, prompt and residual, and chip comparisons against the unit-to-unit spread.

Pure functions (no I/O, no Streamlit) on one row per chip, machine (machine_id) and prompt:
`value`, the mean over the prompt's repeats of a log figure (log decode tok/s, or log speedup:
the arm's log decode tok/s less the baseline's on the same machine and prompt), within one
comparable group and arm. The model:

    value = mu + chip + machine(chip) + prompt + residual,

each term normal with mean 0 and its own variance. The fit is statsmodels' MixedLM (REML), in
two fits that keep every matrix one group wide (a single-group crossed fit costs seconds at a
hundred machines, these a fraction of one):

- chip and machine: groups = chips, a random intercept per chip (chip variance), a variance
  component of machines inside each chip (machine variance), prompts as fixed effects; its
  scale is the residual variance.
- prompt: groups = prompts, a random intercept per prompt, on the values less their machine's
  mean (the machines' fixed effects absorbed; in a balanced design the same estimate as with
  them in the model, at a hundredth of the cost).

Intervals (95%): Satterthwaite's. A component's REML estimate v with standard error se (from
the fit's Hessian) is taken as v * chi2(nu) / nu with nu = 2 (v / se)^2 effective degrees of
freedom, so v's interval is [nu v / chi2_hi, nu v / chi2_lo]; the residual's uses its own
degrees of freedom (rows - machines - prompts + 1). A component estimated at zero (the fit's
boundary), or with under one effective degree of freedom, has no curvature to read: its
interval is [0, unknown], said in `note`.

Figures are shown as percentages: a standard deviation s on the log scale is "differ by
exp(s) - 1" (units differ by 3%: one unit's figure is typically 3% off its chip's).

A chip comparison (`compare_chips`) puts the difference between two chips' figures, with a
pooled t interval over machine means (each machine one observation, as in the verdicts; the
within-chip spread pooled over every chip of the fit, so that a chip with one machine can be
compared), beside the unit-to-unit spread: 95% of the differences between two units of one
chip lie within +-1.96 * sqrt(2) * s_machine. The difference exceeds the spread when its whole
interval lies beyond that range, lies within it when its whole interval is inside, and is
undecided otherwise.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats

CONFIDENCE = 0.95
CHIP, MACHINE, PROMPT, RESIDUAL = "chip", "machine", "prompt", "residual"
COMPONENTS = (CHIP, MACHINE, PROMPT, RESIDUAL)
COLUMNS = ["component", "variance", "sd", "sd_low", "sd_high", "percent", "percent_low", "percent_high"]
COLUMNS += ["levels", "df", "note"]
AT_ZERO = "estimated at zero (the fit's boundary): no upper bound from its curvature"
NO_SPREAD = "machine and prompt explain every value: no residual, nothing to part (replayed or synthetic results?)"
NEAR_ZERO = "estimated near zero (under one effective degree of freedom): no upper bound from its curvature"

EXCEEDS = "exceeds the unit-to-unit spread"
WITHIN = "within the unit-to-unit spread"
UNDECIDED = "cannot tell from the unit-to-unit spread"
PAIR_COLUMNS = ["chip_a", "chip_b", "chip_ratio", "ratio_low", "ratio_high", "machines_a", "machines_b", "df"]
PAIR_COLUMNS += ["unit_range", "verdict", "note"]


def percent(sd: float) -> float:
    """A standard deviation on the log scale as a percentage difference: exp(sd) - 1."""
    return math.expm1(min(sd, 700.0)) if np.isfinite(sd) else math.nan


def _row(component: str, variance: float, low: float, high: float, levels: int, df: float, note: str = "") -> dict:
    sd, lo, hi = (math.sqrt(x) if np.isfinite(x) and x >= 0 else math.nan for x in (variance, low, high))
    return dict(
        component=component,
        variance=variance,
        sd=sd,
        sd_low=lo,
        sd_high=hi,
        percent=percent(sd),
        percent_low=percent(lo),
        percent_high=percent(hi),
        levels=levels,
        df=df,
        note=note,
    )


def _satterthwaite(component: str, variance: float, se: float, levels: int, confidence: float) -> dict:
    """A component's row with Satterthwaite's interval from its estimate and standard error."""
    alpha = 1 - confidence
    if not np.isfinite(variance) or variance <= 1e-12 or not np.isfinite(se) or se <= 0:
        return _row(component, max(variance, 0.0), 0.0, math.nan, levels, math.nan, AT_ZERO)
    nu = 2 * (variance / se) ** 2
    if nu < 1:  # near the boundary: the curvature says next to nothing
        return _row(component, variance, 0.0, math.nan, levels, nu, NEAR_ZERO)
    low = nu * variance / stats.chi2.ppf(1 - alpha / 2, nu)
    high = nu * variance / stats.chi2.ppf(alpha / 2, nu)
    return _row(component, variance, low, high, levels, nu)


def _missing(component: str, levels: int, note: str) -> dict:
    return _row(component, math.nan, math.nan, math.nan, levels, math.nan, note)


# Derivative-free first (near a component at zero a gradient method can stop short of it),
# then BFGS from there to polish the estimate and its curvature.
OPTIMIZERS = ("powell", "bfgs")


def _fit(endog, exog, groups, exog_re=None, exog_vc=None):
    """statsmodels' MixedLM by REML, fitted by each of OPTIMIZERS in turn, keeping the highest
    restricted likelihood (a gradient method alone can stop short of a component at zero);
    its convergence warnings are kept out of the page (a boundary estimate is reported as such)."""
    from statsmodels.regression.mixed_linear_model import MixedLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MixedLM(endog, exog, groups=groups, exog_re=exog_re, exog_vc=exog_vc)
        fits = []
        for method in OPTIMIZERS:  # each from the previous one's estimate
            start = fits[-1].params_object if fits else None
            try:
                fits.append(model.fit(reml=True, method=method, start_params=start))
            except (np.linalg.LinAlgError, ValueError):
                continue
        if not fits:
            raise np.linalg.LinAlgError("MixedLM did not fit")
        result = max(fits, key=lambda r: (bool(r.converged), r.llf))
        return result, np.asarray(result.bse, dtype=float)


def _prompt_dummies(prompts: pd.Series) -> np.ndarray:
    """The fixed effects of the chip and machine fit: an intercept and one column per prompt
    but the first."""
    codes, levels = pd.factorize(prompts, sort=True)
    x = np.zeros((len(prompts), len(levels)))
    x[:, 0] = 1.0
    rows = np.flatnonzero(codes > 0)
    x[rows, codes[rows]] = 1.0
    return x


def _residual_spread(data: pd.DataFrame) -> float:
    """The mean square left by least squares on machine and prompt (0: nothing to part)."""
    x = np.hstack([pd.get_dummies(data[c], dtype=float).to_numpy() for c in ("machine_id", "prompt_id")])
    y = data["value"].to_numpy(dtype=float)
    fitted = x @ np.linalg.lstsq(x, y, rcond=None)[0]
    return float(np.mean((y - fitted) ** 2))


def components(values: pd.DataFrame, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """The variance components of `value` (log scale; module docstring) by chip, machine within
    chip, prompt and residual: one row each with the variance, the standard deviation and its
    interval, the same as percentages, the levels behind it (chips, machines, prompts, rows),
    the effective degrees of freedom and a note where a component cannot be told apart."""
    need = {"chip", "machine_id", "prompt_id", "value"}
    if need - set(values.columns):
        raise ValueError(f"components needs columns {sorted(need - set(values.columns))}")
    data = values[list(need)].copy()
    data = data[np.isfinite(data["value"].astype(float))].sort_values(["chip", "machine_id", "prompt_id"])
    data = data.reset_index(drop=True)
    n = len(data)
    chips, machines, prompts = (int(data[c].nunique()) for c in ("chip", "machine_id", "prompt_id"))
    if data.groupby("machine_id")["chip"].nunique().gt(1).any():
        raise ValueError("a machine (machine_id) belongs to one chip")
    y = data["value"].to_numpy(dtype=float)
    per_chip = data.groupby("chip")["machine_id"].nunique()
    resid_df = n - machines - prompts + 1
    if resid_df < 1 or n < 3:
        note = "too few rows to tell the residual from the machines and prompts"
        return pd.DataFrame(
            [_missing(c, k, note) for c, k in zip(COMPONENTS, (chips, machines, prompts, n))], columns=COLUMNS
        )
    if _residual_spread(data) < 1e-12:
        return pd.DataFrame(
            [_missing(c, k, NO_SPREAD) for c, k in zip(COMPONENTS, (chips, machines, prompts, n))], columns=COLUMNS
        )
    rows, scale = _chip_and_machine_rows(data, y, chips, machines, per_chip.ge(2).any(), confidence)
    rows[PROMPT], prompt_scale = _prompt_row(data, y, prompts, confidence)
    if not np.isfinite(scale) and np.isfinite(prompt_scale):
        scale = prompt_scale * n / max(resid_df, 1)  # the centring's lost degrees of freedom
    rows[RESIDUAL] = _residual_row(scale, n, resid_df, confidence)
    return pd.DataFrame([rows[c] for c in COMPONENTS], columns=COLUMNS)


def _chip_and_machine_rows(
    data: pd.DataFrame, y: np.ndarray, chips: int, machines: int, repeated_chip: bool, confidence: float
) -> tuple[dict, float]:
    """The chip's and the machine's rows and the residual variance of their fit (NaN without
    one): a chip and a machine-within-chip component where some chip has two machines, one
    machine component (or chip and unit together) where machines differ, else missing rows."""
    rows: dict = {}
    n, x = len(data), _prompt_dummies(data["prompt_id"])
    k = x.shape[1]
    if chips >= 2 and repeated_chip:
        vc = {"machine": {}}
        for chip, idx in data.groupby("chip", sort=True).indices.items():
            codes, _ = pd.factorize(data["machine_id"].to_numpy()[idx], sort=True)
            z = np.zeros((len(idx), codes.max() + 1))
            z[np.arange(len(idx)), codes] = 1.0
            vc["machine"][chip] = z
        result, bse = _fit(y, x, data["chip"].to_numpy(), np.ones((n, 1)), vc)
        scale = float(result.scale)
        # params and bse after the fixed effects: the chip intercept's, then the machine
        # component's, both relative to the scale
        rows[CHIP] = _satterthwaite(CHIP, float(result.params[k]), float(bse[k]), chips, confidence)
        rows[MACHINE] = _satterthwaite(MACHINE, float(result.params[k + 1]), float(bse[k + 1]), machines, confidence)
        return {c: _scaled(rows[c], scale) for c in (CHIP, MACHINE)}, scale
    if machines >= 2:
        result, bse = _fit(y, x, data["machine_id"].to_numpy(), np.ones((n, 1)))
        scale = float(result.scale)
        if chips >= 2:  # every chip has one machine: the chip's and the unit's shares are one
            row = _satterthwaite(CHIP, float(result.params[k]), float(bse[k]), chips, confidence)
            rows[CHIP] = _scaled(row, scale) | dict(note="one machine per chip: chip and unit together")
            rows[MACHINE] = _missing(MACHINE, machines, "one machine per chip: not told apart from the chip")
        else:
            row = _satterthwaite(MACHINE, float(result.params[k]), float(bse[k]), machines, confidence)
            rows[MACHINE] = _scaled(row, scale)
            rows[CHIP] = _missing(CHIP, chips, "one chip: no spread between chips")
        return rows, scale
    rows[CHIP] = _missing(CHIP, chips, "one machine: no spread between chips or units")
    rows[MACHINE] = _missing(MACHINE, machines, "one machine: no spread between units")
    return rows, math.nan


def _prompt_row(data: pd.DataFrame, y: np.ndarray, prompts: int, confidence: float) -> tuple[dict, float]:
    """The prompt's row, fitted on the values centred on their machine's mean, and that fit's
    residual variance (NaN with one prompt)."""
    if prompts < 2:
        return _missing(PROMPT, prompts, "one prompt: no spread between prompts"), math.nan
    n = len(data)
    centred = y - data.groupby("machine_id")["value"].transform("mean").to_numpy(dtype=float)
    result, bse = _fit(centred, np.ones((n, 1)), data["prompt_id"].to_numpy(), np.ones((n, 1)))
    row = _satterthwaite(PROMPT, float(result.params[1]), float(bse[1]), prompts, confidence)
    return _scaled(row, float(result.scale)), float(result.scale)


def _residual_row(scale: float, n: int, resid_df: int, confidence: float) -> dict:
    """The residual's row: its variance with the chi-square interval on resid_df."""
    if not np.isfinite(scale):
        return _missing(RESIDUAL, n, "no fit")
    alpha = 1 - confidence
    low = resid_df * scale / stats.chi2.ppf(1 - alpha / 2, resid_df)
    high = resid_df * scale / stats.chi2.ppf(alpha / 2, resid_df)
    return _row(RESIDUAL, scale, low, high, n, float(resid_df))


def _scaled(row: dict, scale: float) -> dict:
    """A row fitted relative to the residual variance, in the figure's own units."""
    v = row["variance"] * scale
    low = row["sd_low"] ** 2 * scale if np.isfinite(row["sd_low"]) else math.nan
    high = row["sd_high"] ** 2 * scale if np.isfinite(row["sd_high"]) else math.nan
    return _row(row["component"], v, low, high, row["levels"], row["df"], row["note"])


def sentence(chip: str, figure: str, table: pd.DataFrame) -> str:
    """'Apple M4 Pro: 1.42x; units differ by 3%, chips by 11%' (`figure` already formatted)."""

    spreads = dict(zip(table["component"], table["percent"]))  # a page says it of every chip: no filter each time

    def say(component: str, what: str) -> str:
        p = float(spreads.get(component, math.nan))
        return f"{what} {p:.1%}" if p < 0.1 else f"{what} {p:.0%}" if np.isfinite(p) else f"{what} (not told apart)"

    return f"{chip}: {figure}; {say(MACHINE, 'units differ by')}, {say(CHIP, 'chips by')}"


def compare_chips(
    values: pd.DataFrame, unit_sd: float, confidence: float = CONFIDENCE, pairs: list[tuple[str, str]] | None = None
) -> pd.DataFrame:
    """Every pair of chips (or `pairs`): the ratio of chip b's figure over chip a's (the
    exponent of the difference of their means of machine means), its interval (pooled t over
    machine means: the within-chip variance of machine means pooled over every chip, df =
    machines - chips), the unit range exp(+-1.96 sqrt(2) unit_sd) and whether the difference
    exceeds it (module docstring)."""
    data = values[np.isfinite(values["value"].astype(float))]
    means = data.groupby(["chip", "machine_id"])["value"].mean().reset_index()
    by_chip = means.groupby("chip")["value"]
    level, count, ss = by_chip.mean(), by_chip.size(), by_chip.apply(lambda v: float(((v - v.mean()) ** 2).sum()))
    df = int(count.sum() - len(count))
    pooled = float(ss.sum() / df) if df > 0 else math.nan
    z = stats.norm.ppf((1 + confidence) / 2)
    unit_range = z * math.sqrt(2) * unit_sd if np.isfinite(unit_sd) else math.nan
    t = stats.t.ppf((1 + confidence) / 2, df) if df > 0 else math.nan
    rows = []
    for a, b in pairs or list(itertools.combinations(sorted(level.index), 2)):
        if a not in level.index or b not in level.index:
            continue
        d = float(level[b] - level[a])
        half = t * math.sqrt(pooled * (1 / count[a] + 1 / count[b])) if np.isfinite(pooled) else math.nan
        low, high = d - half, d + half
        note = "" if np.isfinite(half) else "no chip with two machines: no within-chip spread to pool"
        if not (np.isfinite(half) and np.isfinite(unit_range)):
            verdict = UNDECIDED
            note = note or "no unit-to-unit spread estimated"
        elif low > unit_range or high < -unit_range:
            verdict = EXCEEDS
        elif -unit_range <= low and high <= unit_range:
            verdict = WITHIN
        else:
            verdict = UNDECIDED
        rows.append(
            dict(
                chip_a=a,
                chip_b=b,
                chip_ratio=math.exp(d),
                ratio_low=math.exp(low) if np.isfinite(low) else math.nan,
                ratio_high=math.exp(high) if np.isfinite(high) else math.nan,
                machines_a=int(count[a]),
                machines_b=int(count[b]),
                df=df,
                unit_range=math.expm1(unit_range) if np.isfinite(unit_range) else math.nan,
                verdict=verdict,
                note=note,
            )
        )
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def pair_sentence(r, over: str | None = None) -> str:
    """'Apple M4 Pro over Apple M3 Max: 1.18x (1.12-1.24), 3 and 2 machines; two units of one
    chip differ by up to 6%: the difference exceeds the unit-to-unit spread.' A compare_chips
    row (chip_b over chip_a), or with `over` naming chip_a, the same turned round."""
    if over is not None and over == r.chip_a:
        r = pd.Series(r._asdict()).rename(
            {"chip_a": "chip_b", "chip_b": "chip_a", "machines_a": "machines_b", "machines_b": "machines_a"}
        )
        r["chip_ratio"], r["ratio_low"], r["ratio_high"] = 1 / r["chip_ratio"], 1 / r["ratio_high"], 1 / r["ratio_low"]
    interval = f" ({r.ratio_low:.3f}–{r.ratio_high:.3f})" if np.isfinite(r.ratio_low) else ""
    units = "no unit spread"
    if np.isfinite(r.unit_range):
        units = f"two units of one chip differ by up to {r.unit_range:.0%}"
    return (
        f"{r.chip_b} over {r.chip_a}: {r.chip_ratio:.3f}x{interval}, {r.machines_b} and {r.machines_a} machine(s);"
        f" {units} (95% of pairs): the difference {r.verdict}."
    )


def by_figure(per_prompt: pd.DataFrame, keys: tuple[str, ...] = ("figure", "method", "depth")) -> pd.DataFrame:
    """components() of every figure and arm in `per_prompt` (KEYS columns beside chip,
    machine_id, prompt_id and value), one block of rows each, the keys first."""
    frames = []
    for key, group in per_prompt.groupby(list(keys), sort=True, dropna=False):
        try:
            table = components(group)
        except np.linalg.LinAlgError as e:  # a singular design: said, never a page's exception
            counts = [group[c].nunique() for c in ("chip", "machine_id", "prompt_id")] + [len(group)]
            table = pd.DataFrame([_missing(c, k, f"no fit: {e}") for c, k in zip(COMPONENTS, counts)], columns=COLUMNS)
        frames.append(table.assign(**dict(zip(keys, key))))
    if not frames:
        return pd.DataFrame(columns=[*keys, *COLUMNS])
    out = pd.concat(frames, ignore_index=True)
    return out[[*keys, *COLUMNS]]


def pairs_by_figure(values: pd.DataFrame, table: pd.DataFrame, keys: tuple[str, ...]) -> pd.DataFrame:
    """compare_chips of every figure and arm in `values` (by_figure's input), each against the
    unit spread of its machine term in `table` (by_figure's output), the keys first."""
    keys = list(keys)
    frames = []
    for key, group in values.groupby(keys, sort=True):
        mine = table[(table[keys] == pd.Series(key, index=keys)).all(axis=1)]
        unit = mine.loc[mine["component"] == MACHINE, "sd"]
        pairs = compare_chips(group, float(unit.iloc[0]) if len(unit) else math.nan)
        for name, value in zip(reversed(keys), reversed(key)):
            pairs.insert(0, name, value)
        frames.append(pairs)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*keys, *PAIR_COLUMNS])


def levels(values: pd.DataFrame, keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per chip (and per value of `keys`: every figure of by_figure's at once): its figure's
    value (`value`, the exponent of the mean of its machine means of the log figure: a geometric
    mean over prompts, then machines) and its machines, highest first."""
    means = values.groupby([*keys, "chip", "machine_id"], dropna=False)["value"].mean().reset_index()
    out = means.groupby([*keys, "chip"], as_index=False, dropna=False)
    out = out.agg(level=("value", "mean"), machines=("machine_id", "size"))
    out["value"] = np.exp(out["level"])
    return out.sort_values("level", ascending=False, kind="stable").reset_index(drop=True)

"""Fleets with a known answer: seeded draws of per-prompt log ratios for checking verdicts.

Pure and seeded (no I/O): the same seed gives the same fleet. A fleet's paired log ratio for
machine m, prompt p and repeat r is

    log_ratio[m, p, r] = log(true_speedup) + machine[m] + prompt[m, p] + repeat[m, p, r]

with machine ~ N(0, machine_sd) (machines differ in level: thermal design, memory bandwidth),
prompt ~ N(0, prompt_sd) drawn per machine and prompt (how far a prompt's speedup on that
machine lies from the machine's level) and repeat ~ N(0, repeat_sd) (run-to-run noise). The
rows are specfleet.speedup.per_prompt_sql's: the mean over a prompt's repeats, one row per
machine and prompt. The truth is `true_speedup`, the fleet's geometric-mean speedup over
machines for this prompt set (the quantity specfleet.inference estimates).

`prompt_set_sd` adds an effect per prompt shared by every machine (a prompt that accelerates
well everywhere). The prompt set is a checked key, so a fleet's figure is about its prompt set:
with prompt_set_sd > 0 the drawn set's own mean moves the figure away from `true_speedup`, which
then stands for prompts in general, a different question (docs/verdicts.md shows by how much).
`machine_df` / `repeat_df` draw those terms from a t distribution with that many degrees of
freedom, scaled to the same sd, to check robustness to heavy tails.

`draw` is the vectorised core (an array of many fleets at once, for bench/verdicts.py);
`fleet` and `depth_fleet` return one fleet as a DataFrame shaped like per_prompt_sql's rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

Seed = int | np.random.Generator


def _rng(seed: Seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _noise(rng: np.random.Generator, sd: float, size: tuple[int, ...], df: float | None) -> np.ndarray:
    """Centred noise of standard deviation sd: normal, or t with df > 2 degrees of freedom."""
    if np.all(np.asarray(sd) == 0):
        return np.zeros(size)
    if df is None:
        return rng.normal(0.0, sd, size)
    if df <= 2:
        raise ValueError("a t term needs df > 2 to have a standard deviation")
    return rng.standard_t(df, size) * sd / np.sqrt(df / (df - 2))


def draw(
    seed: Seed,
    fleets: int,
    machines: int,
    prompts: int,
    repeats: int,
    true_speedup: float | Sequence[float] = 1.0,
    machine_sd: float = 0.05,
    prompt_sd: float = 0.10,
    repeat_sd: float = 0.03,
    prompt_set_sd: float = 0.0,
    machine_df: float | None = None,
    repeat_df: float | None = None,
    depth_machine_sd: float | Sequence[float] = 0.02,
    depth_prompt_sd: float | Sequence[float] = 0.05,
) -> np.ndarray:
    """Per-prompt mean log ratios of `fleets` independent fleets: an array (fleets, machines,
    prompts) for one true speedup, or (fleets, machines, prompts, depths) when `true_speedup`
    is a sequence, one truth per depth.

    With several depths every machine and prompt term is shared by all depths (depths are
    paired within a machine: the same machine, prompts and thermal window), plus a term per
    machine and depth (depth_machine_sd) and per machine, prompt and depth (depth_prompt_sd),
    and independent repeat noise per run."""
    if min(fleets, machines, prompts, repeats) < 1:
        raise ValueError("fleets, machines, prompts and repeats must each be at least 1")
    rng = _rng(seed)
    multi = not np.isscalar(true_speedup)
    truth = np.log(np.atleast_1d(np.asarray(true_speedup, dtype=float)))
    if np.any(~np.isfinite(truth)):
        raise ValueError("true speedups must be positive")
    depths = truth.size
    f, m, p = fleets, machines, prompts
    out = truth + _noise(rng, machine_sd, (f, m, 1, 1), machine_df)
    out = out + _noise(rng, prompt_sd, (f, m, p, 1), None)
    out = out + _noise(rng, prompt_set_sd, (f, 1, p, 1), None)
    if multi:
        out = out + _noise(rng, depth_machine_sd, (f, m, 1, depths), None)
        out = out + _noise(rng, depth_prompt_sd, (f, m, p, depths), None)
    runs = _noise(rng, repeat_sd, (f, m, p, depths, repeats), repeat_df)
    out = out + runs.mean(axis=-1)
    return out if multi else out[..., 0]


def to_frame(log_ratios: np.ndarray, repeats: int, depths: Sequence[int] | None = None) -> pd.DataFrame:
    """One fleet's array (machines, prompts) or (machines, prompts, depths) as per_prompt rows:
    machine_id, prompt_id, depth, log_ratio, repeats."""
    a = np.asarray(log_ratios, dtype=float)
    if a.ndim == 2:
        a = a[..., None]
        depths = [3] if depths is None else depths
    elif depths is None:
        depths = list(range(1, a.shape[2] + 1))
    m, p, d = a.shape
    if len(depths) != d:
        raise ValueError(f"{d} depths in the array, {len(depths)} named")
    mi, pi, di = np.meshgrid(np.arange(m), np.arange(p), np.arange(d), indexing="ij")
    return pd.DataFrame(
        {
            "machine_id": [f"m{i:02d}" for i in mi.ravel()],
            "prompt_id": [f"p{i:02d}" for i in pi.ravel()],
            "depth": np.asarray(depths, dtype=int)[di.ravel()],
            "log_ratio": a.ravel(),
            "repeats": int(repeats),
        }
    )


def fleet(
    seed: Seed,
    machines: int,
    prompts: int,
    repeats: int,
    true_speedup: float = 1.0,
    depth: int = 3,
    **spread,
) -> pd.DataFrame:
    """One fleet's per-prompt rows (machine_id, prompt_id, depth, log_ratio, repeats) for one
    arm and depth; `spread`: draw's machine_sd, prompt_sd, repeat_sd, prompt_set_sd,
    machine_df, repeat_df."""
    a = draw(seed, 1, machines, prompts, repeats, float(true_speedup), **spread)[0]
    return to_frame(a, repeats, [depth])


def depth_fleet(
    seed: Seed,
    machines: int,
    prompts: int,
    repeats: int,
    true_speedups: dict[int, float] | Sequence[float],
    **spread,
) -> pd.DataFrame:
    """One fleet measured at several depths: per-prompt rows with a depth column, the same
    machines and prompts at every depth. `true_speedups`: {depth: speedup}, or a sequence for
    depths 1, 2, ...; `spread` as draw's (including depth_machine_sd, depth_prompt_sd)."""
    if isinstance(true_speedups, dict):
        depths, truths = list(true_speedups), list(true_speedups.values())
    else:
        truths = list(true_speedups)
        depths = list(range(1, len(truths) + 1))
    if len(truths) < 2:
        raise ValueError("a depth fleet needs at least two depths")
    a = draw(seed, 1, machines, prompts, repeats, truths, **spread)[0]
    return to_frame(a, repeats, depths)

"""How often are verdicts right? Simulated fleets with a known true speedup.

Every fleet is drawn by dashboard/simulate.py (machine level sd 0.05 on the log scale, prompt
sd 0.10 per machine and prompt, repeat noise sd 0.03, unless a section says otherwise) and
judged by dashboard/inference.py's rules against the band of the claim mtplx-2-3x, 2.0-3.0x.
Sections (all by default):

  intervals  coverage of the 95% interval by method: t over machine means (what inference
             uses), scipy.stats.bootstrap BCa over machine means, and the dashboard's two-level
             percentile bootstrap (dashboard/stats.py, machines then prompts)
  table      by machines (1, 2, 3, 5, 10), prompts (2, 5, 20) and repeats (1, 3, 5): coverage,
             and the verdicts' shares when the truth is inside the band (2.45x, its geometric
             centre), 5% below it (1.90x) and on its edge (2.00x)
  depth      best-depth verdicts: the 95% confidence set for the best depth (the rule) and the
             bootstrap probability of the best depth (for comparison)
  fdr        the false-discovery step over families of 100 decisions

    .venv/bin/python bench/verdicts.py [--fleets 1000] [--section table]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scipy import stats as sps  # noqa: E402

from dashboard import inference, simulate  # noqa: E402
from dashboard import stats as dashboard_stats  # noqa: E402

BAND = (2.0, 3.0)
INSIDE = math.sqrt(BAND[0] * BAND[1])  # the band's geometric centre, 2.449x
OUTSIDE = 0.95 * BAND[0]  # 1.90x: 5% below the band
EDGE = BAND[0]
SEED = 2026


def covered(low, high, truth: float) -> float:
    return float(np.mean((low <= truth) & (truth <= high)))


def shares(verdicts: np.ndarray) -> tuple[float, float, float]:
    """(reproduced, contradicted, inconclusive) shares."""
    return tuple(float(np.mean(verdicts == v)) for v in (inference.REPRODUCED, inference.CONTRADICTED, "inconclusive"))


# ---------------------------------------------------------------- intervals


def intervals(fleets: int) -> None:
    print(f"## 95% interval coverage by method ({fleets} fleets a cell, 5 prompts x 3 repeats, truth 2.0x)\n")
    settings = [
        ("machine sd 0.05, prompt sd 0.10", {}),
        ("machine sd 0.10, prompt sd 0.05", {"machine_sd": 0.10, "prompt_sd": 0.05}),
        ("machine effects t(3), sd 0.05", {"machine_df": 3.0}),
    ]
    print(f"{'spread':34} {'machines':>8} {'t':>6} {'BCa':>6} {'2-level pct':>11}")
    truth = math.log(2.0)
    for name, spread in settings:
        for machines in (2, 3, 5, 10):
            a = simulate.draw(SEED + machines, fleets, machines, 5, 3, 2.0, **spread)
            means = a.mean(axis=2)
            _, _, _, lo, hi = inference.t_interval(means)
            t_cov = covered(lo, hi, truth)
            with warnings.catch_warnings():  # degenerate resamples with two machines
                warnings.simplefilter("ignore")
                ci = sps.bootstrap(
                    (means,), np.mean, axis=-1, vectorized=True, n_resamples=2000, method="BCa", rng=SEED
                ).confidence_interval
            bca = covered(ci.low, ci.high, truth)
            two = [
                dashboard_stats.bootstrap_ci(list(f), statistic=dashboard_stats.mean_of_means, seed=i)
                for i, f in enumerate(a)
            ]
            pct = covered(np.array([x[0] for x in two]), np.array([x[1] for x in two]), truth)
            print(f"{name:34} {machines:>8} {t_cov:>6.3f} {bca:>6.3f} {pct:>11.3f}")
    # one machine: the interval over its prompts, against the fleet's truth and the machine's own
    a = simulate.draw(SEED, fleets, 1, 20, 3, 2.0)
    m = simulate.draw(SEED, fleets, 1, 20, 3, 2.0, machine_sd=0.0)
    _, _, _, lo, hi = inference.t_interval(a[:, 0, :])
    _, _, _, lo0, hi0 = inference.t_interval(m[:, 0, :])
    print(
        f"\none machine, 20 prompts, t over its prompts: covers the fleet's truth in {covered(lo, hi, truth):.3f} "
        f"of fleets; the machine's own level (no machine spread) in {covered(lo0, hi0, truth):.3f}"
    )
    a = simulate.draw(SEED, fleets, 3, 5, 3, 2.0, prompt_set_sd=0.10)
    _, _, _, lo, hi = inference.t_interval(a.mean(axis=2))
    print(
        f"prompt effects shared by every machine (sd 0.10), 3 machines: covers the speedup over all prompts in "
        f"{covered(lo, hi, truth):.3f}; the figure is about its prompt set\n"
    )


# ---------------------------------------------------------------- the table


def table(fleets: int) -> None:
    print(
        f"## Verdicts against the band {BAND[0]:g}-{BAND[1]:g}x ({fleets} fleets a cell; min_machines 3)\n\n"
        f"cov: the 95% interval holds the truth. Truth {INSIDE:.2f}x (inside): rep = reproduced (right), "
        f"con = contradicted (wrong), inc = inconclusive. Truth {OUTSIDE:.2f}x (5% below): rep (wrong), "
        f"con (right), inc. Truth {EDGE:.2f}x (on the edge): con (wrong, the worst case).\n"
    )
    head = f"{'machines':>8} {'prompts':>7} {'repeats':>7} | {'cov':>5} | {'rep':>5} {'con':>5} {'inc':>5} |"
    print(head + f" {'rep':>5} {'con':>5} {'inc':>5} | {'con':>5}")
    also = []
    for machines in (1, 2, 3, 5, 10):
        for prompts in (2, 5, 20):
            for repeats in (1, 3, 5):
                noise = simulate.draw(SEED + 7 * machines + prompts + 100 * repeats, fleets, machines, prompts, repeats)
                row = f"{machines:>8} {prompts:>7} {repeats:>7} |"
                inside = inference.decide_arrays(noise + math.log(INSIDE), *BAND)
                row += f" {covered(inside['low'], inside['high'], INSIDE):>5.3f} |"
                row += " {:>5.3f} {:>5.3f} {:>5.3f} |".format(*shares(inside["verdict"]))
                outside = inference.decide_arrays(noise + math.log(OUTSIDE), *BAND)
                row += " {:>5.3f} {:>5.3f} {:>5.3f} |".format(*shares(outside["verdict"]))
                edge = inference.decide_arrays(noise + math.log(EDGE), *BAND)
                row += f" {shares(edge['verdict'])[1]:>5.3f}"
                print(row)
                if machines < 3:  # what accepting one or two machines would give
                    out1 = inference.decide_arrays(noise + math.log(OUTSIDE), *BAND, min_machines=1)
                    in1 = inference.decide_arrays(noise + math.log(INSIDE), *BAND, min_machines=1)
                    also.append((machines, prompts, repeats, shares(in1["verdict"]), shares(out1["verdict"])))
    print("\nIf one or two machines were accepted (min_machines 1): truth inside: rep, con; truth 5% below: rep, con\n")
    print(f"{'machines':>8} {'prompts':>7} {'repeats':>7} | {'rep':>5} {'con':>5} | {'rep':>5} {'con':>5}")
    for machines, prompts, repeats, i, o in also:
        print(f"{machines:>8} {prompts:>7} {repeats:>7} | {i[0]:>5.3f} {i[1]:>5.3f} | {o[0]:>5.3f} {o[1]:>5.3f}")
    print()


# ---------------------------------------------------------------- best depth


PROFILES = {
    "equal (2.0x at every depth)": [2.0] * 6,
    "best at 3 (1.6 1.8 2.0 1.8 1.7 1.6)": [1.6, 1.8, 2.0, 1.8, 1.7, 1.6],
    "best at 5 (1.5 1.6 1.7 1.8 2.0 1.9)": [1.5, 1.6, 1.7, 1.8, 2.0, 1.9],
}
# machine x depth spread growing fourfold from depth 1 to 6: against the pooled error's assumption
GROWING = {"depth_machine_sd": list(np.linspace(0.01, 0.04, 6)), "depth_prompt_sd": list(np.linspace(0.025, 0.1, 6))}


def depth(fleets: int) -> None:
    print(
        f"## Best depth among 1-6 ({fleets} fleets a cell, 5 prompts x 3 repeats, 1000 resamples): "
        "reproduced / contradicted / inconclusive\n"
    )
    print(
        f"{'band':>5} {'true speedups':38} {'spread':7} {'machines':>8} | {'95% set (rule)':>14} | {'bootstrap P':>14}"
    )
    equal = next(iter(PROFILES))
    cells = [((1, 3), name, "even") for name in PROFILES]
    cells += [((1, 5), equal, "even"), ((1, 1), equal, "even")]
    cells += [((1, 3), equal, "growing"), ((4, 6), equal, "growing"), ((1, 5), equal, "growing")]
    cells += [((6, 6), equal, "growing")]
    for (lo, hi), name, spread in cells:
        for machines in (3, 5, 10):
            chosen, boot = [], []
            for i in range(fleets):
                kw = GROWING if spread == "growing" else {}
                d = simulate.depth_fleet(SEED + i, machines, 5, 3, PROFILES[name], **kw)
                dec = inference.decide_best_depth(d, lo, hi, resamples=1000, seed=i)
                chosen.append(dec.verdict)
                p = dec.probability
                boot.append("reproduced" if p >= 0.95 else "contradicted" if p <= 0.05 else "inconclusive")
            a, b = shares(np.array(chosen)), shares(np.array(boot))
            print(
                f"{f'{lo}-{hi}':>5} {name:38} {spread:7} {machines:>8} | {a[0]:.2f} {a[1]:.2f} {a[2]:.2f} |"
                f" {b[0]:.2f} {b[1]:.2f} {b[2]:.2f}"
            )
    print()


# ---------------------------------------------------------------- the false-discovery step


def fdr(families: int) -> None:
    size, true_share = 100, 0.1
    n_true = int(size * true_share)
    print(
        f"## The false-discovery step ({families} families of {size} decisions, each on its own fleet of "
        f"5 machines x 5 prompts x 3 repeats; {n_true} claims true at {INSIDE:.2f}x, {size - n_true} false "
        f"at {BAND[0] * 0.99:.2f}x, 1% below the band)\n"
    )
    noise = simulate.draw(SEED, families * size, 5, 5, 3).reshape(families, size, 5, 5)
    truth = np.where(np.arange(size) < n_true, math.log(INSIDE), math.log(BAND[0] * 0.99))
    d = inference.decide_arrays(noise + truth[None, :, None, None], *BAND)
    claim_true = np.arange(size) < n_true
    wrong = ((d["verdict"] == inference.REPRODUCED) & ~claim_true) | (
        (d["verdict"] == inference.CONTRADICTED) & claim_true
    )
    made = d["verdict"] != "inconclusive"
    adjusted = np.stack([inference.benjamini_hochberg(p) for p in d["p_value"]])
    kept = made & (adjusted <= inference.FDR_Q)
    for name, standing in (("each verdict alone", made), (f"after BH, q {inference.FDR_Q:g}", kept)):
        v, r = (wrong & standing).sum(axis=1), standing.sum(axis=1)
        share = np.where(r > 0, v / np.maximum(r, 1), 0.0).mean()
        print(
            f"{name:22} false-discovery rate {share:.3f}; verdicts a family {r.mean():.1f}, "
            f"of them wrong {v.mean():.2f}"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", type=int, default=1000, help="fleets per cell (table, intervals)")
    parser.add_argument("--depth-fleets", type=int, default=300, help="fleets per cell (depth)")
    parser.add_argument("--section", choices=("all", "intervals", "table", "depth", "fdr"), default="all")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.section in ("all", "intervals"):
        intervals(2 * args.fleets)
    if args.section in ("all", "table"):
        table(args.fleets)
    if args.section in ("all", "depth"):
        depth(args.depth_fleets)
    if args.section in ("all", "fdr"):
        fdr(args.fleets)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()

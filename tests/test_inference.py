"""specfleet/inference.py on answers worked out by hand, and on fleets with a known truth.

The calibration tests are seeded simulations at reduced size (bench/verdicts.py has the full
tables): they would fail with the dashboard's earlier rules (a percentile bootstrap over three
machines; "reproduced" whenever the figure lies in the band; the best depth taken as measured).
"""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from specfleet import inference, simulate
from specfleet.inference import CONTRADICTED, INCONCLUSIVE, REPRODUCED

BAND = (2.0, 3.0)


def rows(by_machine: dict[str, list[float]], repeats: int = 2) -> pd.DataFrame:
    """per_prompt rows from {machine: [per-prompt log ratios]}."""
    out = [
        {"machine_id": m, "prompt_id": f"p{i}", "log_ratio": v, "repeats": repeats}
        for m, values in by_machine.items()
        for i, v in enumerate(values)
    ]
    return pd.DataFrame(out)


def t_975_df2() -> float:
    # Student's t with 2 df has the closed-form quantile (2p - 1) / sqrt(2p(1 - p)).
    p = 0.975
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


# ---------------------------------------------------------------- the interval


def test_t_interval_over_machine_means_by_hand():
    # Machine means on the log scale: a (0.05 + 0.15) / 2 = 0.1, b 0.2, c 0.3: mean 0.2, sd 0.1.
    table = rows({"a": [0.05, 0.15], "b": [0.2], "c": [0.3, 0.3, 0.3]})
    e = inference.estimate(table)
    half = t_975_df2() * 0.1 / math.sqrt(3)  # 4.3027 * 0.0577 = 0.2484
    assert t_975_df2() == pytest.approx(4.302652729911275)
    assert e.speedup == pytest.approx(math.exp(0.2))
    assert (e.low, e.high) == (pytest.approx(math.exp(0.2 - half)), pytest.approx(math.exp(0.2 + half)))
    assert (e.machines, e.prompts, e.pairs, e.df, e.method) == (3, 1, 12, 2, inference.T_MACHINES)
    assert e.log_se == pytest.approx(0.1 / math.sqrt(3))
    assert e.note == "fewer than 2 prompts on every machine: t over machine means"  # only p0 is shared


def test_the_crossed_interval_by_hand():
    # Two machines x three prompts, value = machine + prompt + residual; every machine ran every prompt.
    table = np.array([[0.10, 0.30, 0.20], [0.30, 0.60, 0.30]])
    mean = table.mean()  # 0.3
    rows_, cols = table.mean(axis=1), table.mean(axis=0)  # 0.2, 0.4 / 0.2, 0.45, 0.25
    ms_m = 3 * ((rows_ - mean) ** 2).sum() / 1  # 0.06
    ms_p = 2 * ((cols - mean) ** 2).sum() / 2  # 0.035
    resid = table - rows_[:, None] - cols[None, :] + mean
    ms_e = (resid**2).sum() / 2  # 0.005
    a, b = ms_m / 6, (ms_p - ms_e) / 6  # machine part 0.01, shared prompt part 0.005
    assert (a, b) == (pytest.approx(0.01), pytest.approx(0.005))
    got = inference.estimate(
        pd.DataFrame([{"machine_id": m, "prompt_id": f"p{j}", "log_ratio": table[i, j], "repeats": 1}
                      for i, m in enumerate("ab") for j in range(3)])
    )  # fmt: skip
    assert got.method == inference.CROSSED and got.log_se == pytest.approx(math.sqrt(a + b))
    assert got.df == 1  # the machine part carries most of the variance: its one degree of freedom
    half = 12.706204736174698 * math.sqrt(a + b)
    assert (got.low, got.high) == (pytest.approx(math.exp(mean - half)), pytest.approx(math.exp(mean + half)))
    # the same figures from the vectorised form the simulations use
    m, se, df, low, high = inference.crossed_interval(table[None])
    assert (float(se[0]), float(df[0]), float(low[0])) == (pytest.approx(got.log_se), 1.0, pytest.approx(mean - half))


def test_the_crossed_interval_caps_satterthwaite_at_the_larger_parts_degrees_of_freedom():
    # Three machines x three prompts with a strong shared prompt effect: prompts 0.0, 0.3, 0.6 on
    # every machine, machines 0, 0.03, -0.03, a residual +/-0.01.
    table = np.array([[0.0, 0.3, 0.6], [0.03, 0.33, 0.63], [-0.03, 0.27, 0.57]]) + np.array(
        [[0.01, -0.01, 0.0], [-0.01, 0.0, 0.01], [0.0, 0.01, -0.01]]
    )
    mean, (m, p) = table.mean(), table.shape
    rows_, cols = table.mean(axis=1), table.mean(axis=0)
    ms_m = p * ((rows_ - mean) ** 2).sum() / (m - 1)
    ms_p = m * ((cols - mean) ** 2).sum() / (p - 1)
    ms_e = ((table - rows_[:, None] - cols[None, :] + mean) ** 2).sum() / ((m - 1) * (p - 1))
    a, b = ms_m / 9, (ms_p - ms_e) / 9
    assert b > a  # the shared prompt part carries the variance: df at most P - 1 = 2
    satterthwaite = (a + b) ** 2 / (a**2 / 2 + b**2 / 2)
    assert satterthwaite > 2  # uncapped it would lend the sum the machine part's degrees of freedom
    _, se, df, low, _ = inference.crossed_interval(table)
    assert (float(se), float(df)) == (pytest.approx(math.sqrt(a + b)), 2.0)
    assert float(low) == pytest.approx(mean - t_975_df2() * math.sqrt(a + b))
    # comparable parts, 3 machines x 10 prompts: Satterthwaite's figure lies below the cap (9) and is the df
    even = np.array(
        [
            [0.02, -0.08, 0.03, 0.13, 0.1, -0.05, -0.08, -0.05, 0.06, -0.24],
            [0.01, -0.04, 0.03, 0.09, 0.05, -0.1, -0.13, -0.11, -0.02, -0.25],
            [0.09, 0.02, 0.11, 0.17, 0.15, 0.02, -0.02, -0.04, 0.11, -0.13],
        ]
    )
    a, b = 0.0007823333333333333, 0.000984888888888889  # machine part, shared prompt part (by hand as above)
    _, se, df, _, _ = inference.crossed_interval(even)
    assert float(se) == pytest.approx(math.sqrt(a + b))
    assert float(df) == pytest.approx((a + b) ** 2 / (a**2 / 2 + b**2 / 9))  # 7.55


def crossed_coverage(machines: int, prompts: int, spread: tuple[float, float, float], fleets: int) -> float:
    machine_sd, prompt_sd, shared_sd = spread
    noise = simulate.draw(machines * 100 + prompts, fleets, machines, prompts, 6,
                          machine_sd=machine_sd, prompt_sd=prompt_sd, prompt_set_sd=shared_sd)  # fmt: skip
    _, _, _, low, high = inference.crossed_interval(noise)
    return float(np.mean((low <= 0) & (0 <= high)))


@pytest.mark.parametrize(
    "machines,prompts,spread",
    [(3, 20, (0.05, 0.05, 0.10)), (3, 5, (0.05, 0.05, 0.10)), (10, 5, (0.02, 0.10, 0.10)), (3, 20, (0.10, 0.05, 0.03))],
    ids=["3x20-shared", "3x5-shared", "10x5-prompts-dominant", "3x20-machines-dominant"],
)
def test_the_crossed_interval_covers_the_categorys_truth_from_three_machines(machines, prompts, spread):
    # bench/verdicts.py section crossed's hardest allowed cells (4,000 fleets: 0.948, 0.972, 0.946,
    # 0.954); 4,000 fleets here measure coverage to +/- 0.008 (2.33 sd)
    cover = crossed_coverage(machines, prompts, spread, 4000)
    assert 0.93 <= cover <= 0.97 + 0.008


def test_two_machines_cannot_hold_the_coverage_so_they_are_not_allowed():
    # With two machines the machine part has one degree of freedom: with the machine part carrying
    # the variance and 20 prompts the interval covers 0.91 (bench/verdicts.py section crossed).
    assert crossed_coverage(2, 20, (0.05, 0.05, 0.10), 4000) < 0.93
    assert inference.MIN_MACHINES == 3


def test_every_machine_weighs_the_same_whatever_its_prompts():
    # specfleet's definition: the mean over machines of each one's mean.
    few = inference.estimate(rows({"a": [0.0], "b": [0.4, 0.4, 0.4, 0.4], "c": [0.2]}))
    assert few.speedup == pytest.approx(math.exp(0.2))


def test_one_machine_is_an_interval_over_its_prompts_noted():
    # Prompts 0.1, 0.2, 0.3, 0.4: mean 0.25, sd sqrt(1/60), df 3.
    e = inference.estimate(rows({"a": [0.1, 0.2, 0.3, 0.4]}))
    half = 3.182446305284263 * math.sqrt(1 / 60) / 2
    assert (e.low, e.high) == (pytest.approx(math.exp(0.25 - half)), pytest.approx(math.exp(0.25 + half)))
    assert (e.machines, e.prompts, e.df, e.method) == (1, 4, 3, inference.T_PROMPTS)
    assert "that machine only" in e.note
    lone = inference.estimate(rows({"a": [0.3]}))
    assert math.isnan(lone.low) and lone.method == inference.NO_INTERVAL and "no interval" in lone.note


def test_estimate_takes_one_figure_and_finite_ratios():
    table = rows({"a": [0.1], "b": [0.2]})
    with pytest.raises(ValueError, match="several figures"):
        inference.estimate(table.assign(depth=[2, 3]))
    with pytest.raises(ValueError, match="finite"):
        inference.estimate(table.assign(log_ratio=[0.1, -np.inf]))
    empty = inference.estimate(table.iloc[:0])
    assert empty.machines == 0 and math.isnan(empty.speedup)


# ---------------------------------------------------------------- decisions


def made(speedup: float, low: float, high: float, machines: int = 3) -> inference.Estimate:
    """An Estimate with the given interval (t, df = machines - 1)."""
    df = machines - 1
    se = (math.log(high) - math.log(low)) / 2 / sps.t.ppf(0.975, df)
    mean = (math.log(high) + math.log(low)) / 2
    return inference.Estimate(
        speedup, low, high, machines, 5, 30, inference.T_MACHINES, log_mean=mean, log_se=se, df=df
    )


def test_an_interval_across_the_band_is_inconclusive():
    # The old rule said reproduced: the median 2.05 lies in 2.0-3.0, whatever the interval.
    d = inference.decide(made(2.05, 0.9, 3.6), *BAND)
    assert d.verdict == INCONCLUSIVE and d.p_value == 1.0 and d.tested
    assert "reaches across" in d.why
    assert inference.decide(made(2.45, 2.1, 2.8), *BAND).verdict == REPRODUCED
    assert inference.decide(made(1.5, 1.2, 1.9), *BAND).verdict == CONTRADICTED
    assert inference.decide(made(4.0, 3.2, 5.0), *BAND).verdict == CONTRADICTED


def test_fewer_machines_than_the_minimum_is_inconclusive_and_untested():
    assert inference.MIN_MACHINES == 3  # bench/verdicts.py section crossed; the tests below check it
    d = inference.decide(made(2.45, 2.3, 2.6, 1), *BAND)
    assert d.verdict == INCONCLUSIVE and not d.tested and d.p_value == 1.0
    assert d.why.startswith("inconclusive: 1 of 3 machines; the figure 2.45x (95% interval 2.3-2.6x)")
    assert inference.decide(made(2.45, 2.3, 2.6, 2), *BAND).verdict == INCONCLUSIVE
    assert inference.decide(made(2.45, 2.3, 2.6, 3), *BAND).verdict == REPRODUCED
    one = inference.estimate(rows({"a": [0.9, 0.9, 0.91, 0.89, 0.9]}))  # tight, but one machine
    d = inference.decide(one, *BAND)
    assert d.verdict == INCONCLUSIVE and "that machine only" in d.why and d.speedup == pytest.approx(math.exp(0.9))
    assert inference.decide(one, *BAND, min_machines=1).verdict == REPRODUCED  # the caller's choice
    few = inference.estimate(rows({"a": [0.9] * 4, "b": [0.91] * 4, "c": [0.92] * 4}))
    d = inference.decide(few, *BAND)
    assert d.verdict == INCONCLUSIVE and not d.tested and d.why.startswith("inconclusive: 4 of 5 prompts")


def wrong_rates(machines: int, prompts: int, fleets: int, seed: int) -> tuple[float, float]:
    """(contradicted with the truth on the band's edge, reproduced with it 5% below), with no
    minimum: what the ledger's minimum is chosen from."""
    noise = simulate.draw(seed, fleets, machines, prompts, 6)
    lo, hi = 1.55, 1.9
    edge = inference.decide_arrays(noise + math.log(lo), lo, hi, min_machines=1, min_prompts=1)["verdict"]
    out = inference.decide_arrays(noise + math.log(0.95 * lo), lo, hi, min_machines=1, min_prompts=1)["verdict"]
    return float(np.mean(edge == CONTRADICTED)), float(np.mean(out == REPRODUCED))


def test_the_minimum_machines_is_the_smallest_count_at_the_nominal_rate():
    # One machine with 22 prompts: its interval sits on that machine's level, so a truth on the
    # edge is contradicted in about 21% of fleets (nominal 2.5%); the minimum, 3, holds 2.5% (two
    # machines, whose machine part has one degree of freedom, do not: 3.3% here; the crossed tests above).
    fleets = 8000
    tol = 2.33 * math.sqrt(0.025 * 0.975 / fleets)
    edge, out = wrong_rates(1, 22, fleets, 1)
    assert edge > 0.15 and out > 0.03
    for machines in (inference.MIN_MACHINES, 5):
        edge, out = wrong_rates(machines, 22, fleets, machines)
        assert edge <= inference.NOMINAL_WRONG + tol and out <= inference.NOMINAL_WRONG + tol


def test_degenerate_data_gets_a_verdict_with_its_reason():
    # identical log ratios: a zero-width interval would say "reproduced" with p 1e-32
    same = inference.estimate(rows({m: [math.log(2.4)] * 5 for m in "abc"}))
    assert math.isnan(same.low) and same.method == inference.NO_INTERVAL and "no spread" in same.note
    d = inference.decide(same, *BAND)
    assert (d.verdict, d.tested, d.p_value) == (INCONCLUSIVE, False, 1.0)
    assert d.why.startswith("inconclusive: no interval") and "identical" in d.why and "2.4x" in d.why
    # all-zero log ratios against "below 1x": sign(0) x inf was NaN
    zero = inference.estimate(rows({m: [0.0] * 5 for m in "abc"}))
    d = inference.decide(zero, 0.0, 1.0)
    assert d.verdict == INCONCLUSIVE and not math.isnan(d.p_value)
    p_eq, p_out = inference.band_p_values(0.0, 0.0, 2, 0.0, 1.0)
    assert (float(p_eq), float(p_out)) == (1.0, 1.0)
    p_eq, p_out = inference.band_p_values(np.array([0.0, 0.1]), np.array([np.nan, 0.05]), 2, 0.0, 1.0)
    assert not np.isnan(p_eq).any() and not np.isnan(p_out).any() and p_eq[0] == 1.0
    arrays = inference.decide_arrays(np.zeros((4, 3, 5)), 0.0, 1.0)
    assert (arrays["verdict"] == INCONCLUSIVE).all() and (arrays["p_value"] == 1.0).all()
    assert np.isnan(arrays["low"]).all()
    # one prompt per machine on three machines: a verdict only past the prompt minimum
    one_prompt = inference.decide(inference.estimate(rows({"a": [0.9], "b": [0.91], "c": [0.92]})), *BAND)
    assert one_prompt.why.startswith("inconclusive: 1 of 5 prompts") and not one_prompt.tested


def test_one_sided_bands():
    e = made(1.3, 1.1, 1.5)
    assert inference.decide(e, 1.0, math.inf).verdict == REPRODUCED  # "above 1x"
    assert inference.decide(e, 0.0, 1.0).verdict == CONTRADICTED  # "below 1x"
    assert inference.band_text(1.0, math.inf) == "above 1x" and inference.band_text(0, 1.0) == "below 1x"
    with pytest.raises(ValueError):
        inference.decide(e, 3.0, 2.0)


def test_p_values_by_hand():
    # log mean 0.8 (2.23x), se 0.05, df 4 against 2.0-3.0: z against the low edge (0.8 - ln 2) / 0.05.
    m, se, df = 0.8, 0.05, 4
    z_lo, z_hi = (m - math.log(2)) / se, (m - math.log(3)) / se
    p_eq, p_out = inference.band_p_values(m, se, df, *BAND)
    assert float(p_eq) == pytest.approx(max(sps.t.sf(z_lo, df), sps.t.cdf(z_hi, df)))
    # nearer the low edge: H0 "truth >= 2.0x", p = P(T <= z); large, since 2.23x is above it
    assert float(p_out) == pytest.approx(sps.t.cdf(z_lo, df)) and float(p_out) > 0.9
    # above 4x: beyond the high edge
    _, p_up = inference.band_p_values(math.log(4), se, df, *BAND)
    assert float(p_up) == pytest.approx(sps.t.sf((math.log(4) - math.log(3)) / se, df))


def test_the_p_values_say_what_the_interval_says():
    for seed in range(60):
        truth = [1.8, 2.0, 2.4, 3.0, 3.3][seed % 5]
        e = inference.estimate(simulate.fleet(seed, 3 + seed % 4, 5, 2, truth))
        d = inference.decide(e, *BAND)
        assert (d.verdict == REPRODUCED) == (d.p_equivalence <= 0.025)
        assert (d.verdict == CONTRADICTED) == (d.p_beyond < 0.025)
        assert d.p_value == {REPRODUCED: d.p_equivalence, CONTRADICTED: d.p_beyond, INCONCLUSIVE: 1.0}[d.verdict]


def test_decide_arrays_is_decide_figure_for_figure():
    noise = simulate.draw(7, 40, 4, 5, 2, 2.3)
    out = inference.decide_arrays(noise, *BAND)
    assert len(set(out["verdict"])) >= 2  # verdicts, not only inconclusive ones
    for i in range(40):
        d = inference.decide(inference.estimate(simulate.to_frame(noise[i], 2)), *BAND)
        assert (d.verdict, d.low, d.high) == (
            out["verdict"][i],
            pytest.approx(out["low"][i]),
            pytest.approx(out["high"][i]),
        )
        assert d.p_value == pytest.approx(out["p_value"][i])


# ---------------------------------------------------------------- calibration


def test_intervals_cover_the_truth_at_three_machines():
    # 3 machines x 4 prompts x 2 repeats, machines 5% apart (sd 0.05): the percentile bootstrap
    # covered 0.69-0.74 here.
    fleets, truth, hits = 600, 2.4, 0
    for seed in range(fleets):
        e = inference.estimate(simulate.fleet(seed, 3, 4, 2, truth, machine_sd=0.05))
        hits += e.low <= truth <= e.high
    assert hits / fleets >= 0.93


def test_a_bootstrap_over_three_machines_cannot_hold_95_percent():
    # Why t: a bootstrap's distribution over 3 machines never leaves [min, max] of their means,
    # which holds the truth in 1 - 2/8 = 75% of fleets at most.
    means = simulate.draw(11, 400, 3, 5, 3, 2.0).mean(axis=2)
    ci = sps.bootstrap((means,), np.mean, axis=-1, vectorized=True, n_resamples=999, method="BCa", rng=1)
    bca = np.mean((ci.confidence_interval.low <= math.log(2)) & (math.log(2) <= ci.confidence_interval.high))
    _, _, _, lo, hi = inference.t_interval(means)
    t = np.mean((lo <= math.log(2)) & (math.log(2) <= hi))
    assert bca < 0.80 < 0.93 <= t


@pytest.mark.parametrize("truth", [1.9, 1.99, 3.05])
def test_a_claim_outside_its_band_is_rarely_reproduced(truth):
    # 3 machines x 5 prompts x 2 repeats; 1.99 is the hardest case (0.5% below the edge), where
    # the nominal rate is 2.5%: 20,000 fleets measure it to +/- 0.26 points (2.33 sd)
    fleets = 20000
    noise = simulate.draw(1000, fleets, 3, 5, 2)
    reproduced = np.mean(inference.decide_arrays(noise + math.log(truth), *BAND)["verdict"] == REPRODUCED)
    assert reproduced <= inference.NOMINAL_WRONG + 2.33 * math.sqrt(0.025 * 0.975 / fleets)
    if truth == 1.99:
        assert reproduced > 0.01  # close to nominal: the check has the power to fail


def test_a_claim_on_its_edge_is_rarely_contradicted():
    fleets = 20000
    noise = simulate.draw(4, fleets, 3, 5, 2)
    contradicted = np.mean(inference.decide_arrays(noise + math.log(BAND[0]), *BAND)["verdict"] == CONTRADICTED)
    # 0.019 measured (coverage 0.962): close to nominal, so the check keeps the power to fail.
    assert 0.015 < contradicted <= inference.NOMINAL_WRONG + 2.33 * math.sqrt(0.025 * 0.975 / fleets)


# ---------------------------------------------------------------- best depth


def depth_rows(table: dict[str, dict[int, float]], prompts: int = 1) -> pd.DataFrame:
    """{machine: {depth: log ratio}}, the same value at each of `prompts` prompts."""
    out = [
        {"machine_id": m, "prompt_id": f"p{i}", "depth": k, "log_ratio": v, "repeats": 1}
        for m, by_depth in table.items()
        for k, v in by_depth.items()
        for i in range(prompts)
    ]
    return pd.DataFrame(out)


def test_depth_p_values_by_hand():
    # Depth 2 minus depth 1 per machine: 0.2, 0.1, 0.3 (mean 0.2, se 0.1 / sqrt 3 = the pooled
    # two-way error with two depths). t(2).sf(x) = 1/2 - x / (2 sqrt(x^2 + 2)); x = 2 sqrt 3.
    d = depth_rows({"a": {1: 0.0, 2: 0.2}, "b": {1: 0.1, 2: 0.2}, "c": {1: 0.2, 2: 0.5}})
    p = inference.depth_p_values(d)
    x = 2 * math.sqrt(3)
    assert p[1] == pytest.approx(0.5 - x / (2 * math.sqrt(x * x + 2)))  # 0.0371: depth 1 is not the best
    assert p[2] == pytest.approx(0.5 + x / (2 * math.sqrt(x * x + 2)))


def test_depth_p_values_by_hand_with_three_depths():
    # Depth means 0.20, 0.23, 0.25; residuals (zero row and column sums) 0.02 on the diagonal,
    # -0.01 elsewhere: SS 0.0018 over (3 - 1)(3 - 1) = 4 df, s^2 0.00045, se sqrt(s^2 2 / 3) =
    # sqrt(0.0003). Depth 1 lies 0.05 below the best other, depth 2 0.02, depth 3 0.02 above:
    # p = min(1, (3 - 1) x t(4).sf(gap / se)), the factor 2 being Bonferroni over the others.
    means, levels = [0.20, 0.23, 0.25], {"a": 0.0, "b": 0.1, "c": -0.05}
    resid = {"a": [0.02, -0.01, -0.01], "b": [-0.01, 0.02, -0.01], "c": [-0.01, -0.01, 0.02]}
    table = {m: {d + 1: levels[m] + means[d] + resid[m][d] for d in range(3)} for m in levels}
    p = inference.depth_p_values(depth_rows(table))
    se = math.sqrt(0.0003)
    assert p[1] == pytest.approx(2 * sps.t.sf(0.05 / se, 4))  # 0.0447: excluded at 5%, only with the factor
    assert p[2] == pytest.approx(2 * sps.t.sf(0.02 / se, 4))
    assert p[3] == 1.0
    assert 0.025 < p[1] < 0.05


def test_best_depth_counts_only_machines_that_measured_every_depth():
    clear = {m: {1: 0.3 + s, 2: 0.5 + s, 3: 0.7 + s} for m, s in (("a", 0), ("b", 0.01), ("c", -0.02))}
    rows_ = depth_rows(clear, prompts=5)
    partial = rows_[~((rows_["machine_id"] == "c") & (rows_["depth"] == 3))]  # c never ran depth 3
    d = inference.decide_best_depth(partial, 3, 3, min_machines=3, resamples=100)
    assert d.verdict == INCONCLUSIVE and d.machines == 2 and not d.tested
    assert d.why.startswith("inconclusive: 2 of 3 machines measured every depth; 1 machine(s)")
    assert inference.decide_best_depth(rows_, 3, 3, min_machines=3, resamples=100).machines == 3


def test_best_depth_verdicts():
    clear = {
        m: {1: 0.3 + s, 2: 0.5 + s, 3: 0.7 + s, 4: 0.5 + s, 5: 0.3 + s}
        for m, s in (("a", 0), ("b", 0.01), ("c", -0.02))
    }
    clear["c"][4] += 0.01  # some machine x depth spread
    d = inference.decide_best_depth(depth_rows(clear, 5), 1, 3, resamples=200)
    assert d.verdict == REPRODUCED and d.best_depth == 3 and d.probability == 1.0 and d.tested
    assert d.speedup == pytest.approx(math.exp(np.mean([0.7, 0.71, 0.68])))
    assert inference.decide_best_depth(depth_rows(clear, 5), 4, 5, resamples=200).verdict == CONTRADICTED
    assert inference.decide_best_depth(depth_rows(clear, 5), 1, 5).verdict == INCONCLUSIVE  # no depth outside
    one = {m: clear[m] for m in ("a",)}
    d = inference.decide_best_depth(depth_rows(one, 5), 1, 3)
    assert d.verdict == INCONCLUSIVE and not d.tested and d.why.startswith("inconclusive: 1 of 3 machines")


def test_best_depth_probability():
    d = simulate.depth_fleet(5, 5, 5, 3, [1.5, 1.8, 2.4, 1.8, 1.5, 1.4])
    assert inference.best_depth_probability(d, 3, 3, resamples=500, seed=1) > 0.99
    assert inference.best_depth_probability(d, 5, 6, resamples=500, seed=1) < 0.01
    p = inference.best_depth_probability(d, 2, 4, resamples=500, seed=9)
    assert p == inference.best_depth_probability(d, 2, 4, resamples=500, seed=9)  # seeded


def test_best_depth_probability_of_a_machine_that_missed_a_depth_by_enumeration():
    # One prompt each; c never ran depth 1. A resample draws 3 machines with replacement (27
    # equally likely draws); a depth's figure is the mean over the drawn machines that measured
    # it, so c still counts at depth 2. The exact probability that depth 2 is best, enumerated:
    import itertools

    table = {"a": {1: 0.25, 2: 0.0}, "b": {1: 0.0, 2: 0.2}, "c": {2: 0.3}}
    wins = 0
    for draw in itertools.product("abc", repeat=3):
        d1 = [table[m][1] for m in draw if 1 in table[m]]
        d2 = np.mean([table[m][2] for m in draw])
        assert not d1 or abs(np.mean(d1) - d2) > 1e-9  # no ties
        wins += not d1 or d2 > np.mean(d1)
    exact = wins / 27
    got = inference.best_depth_probability(depth_rows(table), 2, 2, resamples=40000, seed=3)
    assert got == pytest.approx(exact, abs=0.01)
    # were c dropped (counted only where it measured every depth), depth 2 would win less often
    dropped = inference.best_depth_probability(depth_rows({k: table[k] for k in "ab"}), 2, 2, resamples=40000)
    assert abs(dropped - exact) > 0.05


@pytest.mark.parametrize("band", [(1, 3), (1, 5), (1, 1)])
def test_equal_depths_are_rarely_given_a_verdict(band):
    # Six depths of equal true speedup: the old rule (best depth as measured) reproduced 1-3 in
    # 152 of 300 fleets; the bootstrap probability alone reproduces 1-5 in about 35%.
    fleets, verdicts = 300, []
    for seed in range(fleets):
        d = simulate.depth_fleet(seed, 3, 5, 2, [2.0] * 6)
        verdicts.append(inference.decide_best_depth(d, *band, resamples=100, seed=seed).verdict)
    verdicts = np.array(verdicts)
    assert np.mean(verdicts == REPRODUCED) <= 0.05
    # at most 5% in expectation (3.4% of 3,000 fleets for band 1-1); 300 fleets measure that
    # to +/- 1.3 points, so the bound here allows two of them
    assert np.mean(verdicts == CONTRADICTED) <= 0.08


# ---------------------------------------------------------------- false discoveries


def test_benjamini_hochberg_textbook():
    # Benjamini & Hochberg (1995), section 4: 15 p-values; at q 0.05 the first four are rejected.
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459]
    p += [0.3240, 0.4262, 0.5719, 0.6528, 0.7590, 1.0000]
    # by hand: p_(i) * 15 / i, then the running minimum from the largest down
    expected = [0.0015, 0.003, 0.0095, 0.035625, 0.0603, 0.0298 * 15 / 7, 0.0298 * 15 / 7, 0.0645, 0.0765]
    expected += [0.486, 0.4262 * 15 / 11, 0.5719 * 15 / 12, 0.6528 * 15 / 13, 0.7590 * 15 / 14, 1.0]
    adjusted = inference.benjamini_hochberg(p)
    assert adjusted == pytest.approx(expected)
    assert int((adjusted <= 0.05).sum()) == 4
    assert inference.benjamini_hochberg(p[::-1]) == pytest.approx(expected[::-1])  # any order
    assert np.all(inference.benjamini_hochberg(p, dependent=True) >= adjusted)
    with pytest.raises(ValueError):
        inference.benjamini_hochberg([0.1, float("nan")])


def test_adjust_keeps_a_verdict_only_under_q():
    def decision(verdict, p, tested=True):
        return inference.Decision(verdict, "why", 2.4, 2.1, 2.8, 3, 5, 30, 2.0, 3.0, p_value=p, tested=tested)

    ds = [
        decision(REPRODUCED, 0.001),
        decision(CONTRADICTED, 0.02),
        decision(REPRODUCED, 0.024),
        decision(INCONCLUSIVE, 1.0),
        decision(INCONCLUSIVE, 1.0, tested=False),  # too few machines: not in the family
    ]
    out = inference.adjust(ds, q=0.05)
    # m = 4 tested: 0.001 * 4 = 0.004; 0.02 * 4 / 2 = 0.04; 0.024 * 4 / 3 = 0.032 -> both 0.032
    assert [d.adjusted_p for d in out[:4]] == pytest.approx([0.004, 0.032, 0.032, 1.0])
    assert [d.verdict for d in out] == [REPRODUCED, CONTRADICTED, REPRODUCED, INCONCLUSIVE, INCONCLUSIVE]
    assert out[4] is ds[4]
    strict = inference.adjust(ds, q=0.01)
    assert [d.verdict for d in strict[:3]] == [REPRODUCED, INCONCLUSIVE, INCONCLUSIVE]
    assert "false-discovery step over 4 tested" in strict[1].why and strict[1].why.startswith("contradicted alone")


def test_adjust_controls_false_verdicts_over_a_family():
    # 50 claims, 45 false just below their band: alone ~2% of them come out reproduced.
    families, size = 200, 50
    noise = simulate.draw(8, families * size, 5, 5, 2).reshape(families, size, 5, 5)
    truth = np.where(np.arange(size) < 5, math.log(2.45), math.log(1.98))
    d = inference.decide_arrays(noise + truth[None, :, None, None], *BAND)
    wrong = (d["verdict"] == REPRODUCED) & (np.arange(size) >= 5)
    kept = (d["verdict"] != INCONCLUSIVE) & (np.stack([inference.benjamini_hochberg(p) for p in d["p_value"]]) <= 0.05)
    r, v = kept.sum(axis=1), (wrong & kept).sum(axis=1)
    assert np.mean(np.where(r > 0, v / np.maximum(r, 1), 0)) <= 0.05


# ---------------------------------------------------------------- the simulator


def test_simulate_is_seeded_and_shaped_like_per_prompt():
    a, b = simulate.fleet(3, 4, 5, 2, 2.0), simulate.fleet(3, 4, 5, 2, 2.0)
    pd.testing.assert_frame_equal(a, b)
    assert list(a.columns) == ["machine_id", "prompt_id", "depth", "log_ratio", "repeats"]
    assert (a["machine_id"].nunique(), a["prompt_id"].nunique(), len(a)) == (4, 5, 20)
    d = simulate.depth_fleet(1, 3, 2, 1, {2: 1.5, 4: 2.0})
    assert sorted(d["depth"].unique()) == [2, 4] and len(d) == 12
    many = simulate.draw(0, 4000, 3, 2, 1, 2.0)
    assert many.shape == (4000, 3, 2) and many.mean() == pytest.approx(math.log(2.0), abs=0.005)
    # the sd of a machine's mean: sqrt(0.05^2 + 0.10^2 / 2 + 0.03^2 / 2)
    assert many.mean(axis=2).std() == pytest.approx(math.sqrt(0.0025 + 0.005 + 0.00045), rel=0.05)
    heavy = simulate.draw(0, 20000, 1, 1, 1, 1.0, machine_sd=0.05, prompt_sd=0, repeat_sd=0, machine_df=3)
    assert heavy.std() == pytest.approx(0.05, rel=0.1)


# ---------------------------------------------------------------- acceptance rates


def test_estimate_mean_by_hand():
    # rates per run; machine means a (0.5 + 0.7) / 2 = 0.6 (p1's two runs average 0.5), b 0.7, c 0.8
    values = pd.DataFrame(
        {
            "machine_id": ["a", "a", "a", "b", "c", "c"],
            "prompt_id": ["p1", "p1", "p2", "p1", "p1", "p2"],
            "rate": [0.4, 0.6, 0.7, 0.7, 0.8, 0.8],
        }
    )
    e = inference.estimate_mean(values, "rate")
    half = t_975_df2() * 0.1 / math.sqrt(3)
    assert e.speedup == pytest.approx(0.7) and (e.low, e.high) == (pytest.approx(0.7 - half), pytest.approx(0.7 + half))
    assert (e.machines, e.prompts, e.pairs, e.df, e.scale) == (3, 1, 6, 2, inference.LINEAR)
    # the p-values on the rate's own scale: against 0.55-0.71, nearer the upper edge
    p_eq, _ = inference.band_p_values(0.7, 0.1 / math.sqrt(3), 2, 0.55, 0.71, inference.LINEAR)
    assert float(p_eq) == pytest.approx(sps.t.cdf((0.7 - 0.71) / (0.1 / math.sqrt(3)), 2))
    same = inference.estimate_mean(values.assign(rate=1.0), "rate")  # 100% everywhere: no spread
    assert math.isnan(same.low) and inference.decide(same, 0.55, 0.71, min_prompts=1).verdict == INCONCLUSIVE


def test_acceptance_intervals_cover_the_truth_and_enter_the_family():
    # rates 0.63 + machine sd 0.03 + prompt sd 0.08 + run sd 0.04, 3 machines x 5 prompts x 3 runs
    fleets, hits, verdicts = 600, 0, []
    noise = simulate.draw(21, fleets, 3, 5, 3, 1.0, machine_sd=0.03, prompt_sd=0.08, repeat_sd=0.04)
    for i in range(fleets):
        f = simulate.to_frame(noise[i] + 0.63, 3).rename(columns={"log_ratio": "rate"})
        e = inference.estimate_mean(f, "rate")
        hits += e.low <= 0.63 <= e.high
        if i < 100:
            verdicts.append(inference.decide(e, 0.55, 0.71))
    assert hits / fleets >= 0.93
    assert all(d.tested and 0 < d.p_value <= 1 for d in verdicts)  # p-values: the false-discovery step takes them
    assert sum(d.verdict == REPRODUCED for d in verdicts) > 10 and not any(d.verdict == CONTRADICTED for d in verdicts)

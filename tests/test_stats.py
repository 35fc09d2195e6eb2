"""specfleet/stats.py against answers worked out by hand."""

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as stats_t

from specfleet import speedup, stats
from tests.support.dashboard import record, row
from tests.support.fleet import register_runs


def stored(job, agent, method, depth, prompt, repeat, tps, **fields):
    """A stored run (the record's columns and the coordinator's) on chip M4."""
    return row(record(job, method, depth, tps, prompt_id=prompt, repeat=repeat, **fields), agent, "M4")


def query_on(runs: pd.DataFrame):
    con = duckdb.connect()
    register_runs(con, runs)
    return con, lambda sql, params=None: con.execute(sql, params or []).df()


def test_speedups_by_hand():
    # Machine a: prompt p1 at 2x and 8x over two repeats (geometric mean 4), p2 at 1x: 2x.
    # Machine b: p1 at 8x. Over machines: sqrt(2 * 8) = 4x, whatever the count of prompts.
    runs = pd.DataFrame(
        [
            stored("j1", "a", "baseline", 0, "p1", 0, 10.0),
            stored("j1", "a", "draft", 2, "p1", 0, 20.0),
            stored("j1", "a", "baseline", 0, "p1", 1, 10.0),
            stored("j1", "a", "draft", 2, "p1", 1, 80.0),
            stored("j1", "a", "baseline", 0, "p2", 0, 30.0),
            stored("j1", "a", "draft", 2, "p2", 0, 30.0),
            stored("j2", "b", "baseline", 0, "p1", 0, 10.0),
            stored("j2", "b", "draft", 2, "p1", 0, 80.0),
            # left out and counted: the baseline ran hot
            stored("j2", "b", "baseline", 0, "p2", 0, 10.0, env_nominal=False),
            stored("j2", "b", "draft", 2, "p2", 0, 1.0),
            # left out, not counted as degraded: greedy output differed from the baseline's
            stored("j2", "b", "baseline", 0, "p3", 0, 10.0),
            stored("j2", "b", "draft", 2, "p3", 0, 1.0, lossless=False),
            # never a speedup
            stored("j2", "b", "verify-cost", 0, "context-512", 0, 0.0, verify_cost_seconds=(0.01, 0.02)),
            # no baseline on this job: no pair
            stored("j3", "b", "draft", 2, "p1", 0, 1.0),
        ]
    )
    con, query = query_on(runs)
    out = stats.speedups(query, "runs")
    assert len(out) == 1
    r = out.iloc[0]
    assert r["speedup"] == pytest.approx(4.0)
    assert (r["machines"], r["prompts"], r["pairs"], r["excluded_pairs"]) == (2, 1, 4, 1)
    # t over the two machine means (a: log 2, b: log 8) with one degree of freedom
    half = stats_t.ppf(0.975, 1) * np.std(np.log([2.0, 8.0]), ddof=1) / np.sqrt(2)
    assert (r["ci_low"], r["ci_high"]) == (pytest.approx(4.0 * np.exp(-half)), pytest.approx(4.0 * np.exp(half)))
    # the point estimate is specfleet's, figure for figure
    truth = speedup.speedups(con).iloc[0]
    assert (r["speedup"], r["machines"], r["prompts"], r["pairs"]) == (
        truth["speedup"],
        truth["machines"],
        truth["prompts"],
        truth["pairs"],
    )
    prefill = stats.speedups(query, "runs", value="prefill_tokens_per_second").iloc[0]
    assert prefill["speedup"] == pytest.approx(1.0) and prefill["pairs"] == 4  # every run prefills at 2000 tok/s


def test_a_figure_whose_every_pair_ran_hot_is_there_with_no_machines():
    runs = pd.DataFrame(
        [
            stored("j1", "a", "baseline", 0, "p1", 0, 10.0, env_nominal=False),
            stored("j1", "a", "ngram", 3, "p1", 0, 12.0),
        ]
    )
    out = stats.speedups(query_on(runs)[1], "runs").iloc[0]
    assert np.isnan(out["speedup"]) and (out["machines"], out["pairs"], out["excluded_pairs"]) == (0, 0, 1)


def test_a_stall_is_in_the_dashboards_figure_and_not_counted_as_not_nominal():
    """Issue 26's run (a 5.4 s decode among repeats of about 0.68 s): in the speedup (the median
    over the prompt's repeats shrugs it off), not among the pairs left out as not nominal."""
    decode_seconds = [0.68, 0.70, 5.4, 0.66]
    runs = [stored("j1", "a", "baseline", 0, "p1", r, 80.0) for r in range(4)]
    runs += [stored("j1", "a", "draft", 2, "p1", r, 63 / s) for r, s in enumerate(decode_seconds)]
    out = stats.speedups(query_on(pd.DataFrame(runs))[1], "runs").iloc[0]
    assert out["speedup"] == pytest.approx(63 / 80 / (0.68 * 0.70) ** (1 / 2))
    assert (out["pairs"], out["excluded_pairs"]) == (4, 0)


def test_a_baseline_never_pairs_across_jobs():
    runs = pd.DataFrame([stored("j1", "a", "baseline", 0, "p1", 0, 10.0), stored("j2", "a", "ngram", 3, "p1", 0, 9.0)])
    assert stats.speedups(query_on(runs)[1], "runs").empty


def test_speedup_intervals_are_the_verdicts_t_interval():
    per_prompt = pd.DataFrame(
        dict(
            comparable="g",
            chip="M4",
            method="draft",
            depth=2,
            machine_id=["a", "b", "b"],
            prompt_id=["p1", "p1", "p2"],
            log_ratio=np.log([1.0, 4.0, 4.0]),
        )
    )
    out = stats.speedup_intervals(per_prompt).iloc[0]
    # two machines at 1x and 4x: t with one degree of freedom around their geometric mean, 2x
    half = stats_t.ppf(0.975, 1) * np.std(np.log([1.0, 4.0]), ddof=1) / np.sqrt(2)
    assert (out["ci_low"], out["ci_high"]) == (pytest.approx(2.0 * np.exp(-half)), pytest.approx(2.0 * np.exp(half)))
    assert half == pytest.approx(12.706204736 * np.log(4.0) / 2)  # t(1, 0.975) x sd / sqrt 2, sd = ln 4 / sqrt 2
    # machines with identical figures: no interval rather than a zero-width one
    same = stats.speedup_intervals(per_prompt.assign(log_ratio=np.log(2.0))).iloc[0]
    assert np.isnan(same["ci_low"]) and np.isnan(same["ci_high"])


def test_mean_of_means_weighs_machines_equally():
    # machine a ran one prompt (0), machine b nine (1): pooled, the mean would be 0.9
    values = np.array([[[0.0] + [np.nan] * 8, [1.0] * 9]])
    assert stats.mean_of_means(values) == pytest.approx([0.5])
    assert stats.pooled_median(values) == pytest.approx([1.0])
    # two draws of the machine means {0, 1}: 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4
    assert stats.bootstrap_ci([[0.0], [1.0] * 9], seed=3, statistic=stats.mean_of_means) == (0.0, 1.0)
    assert stats.bootstrap_ci([[2.0] * 5, [2.0]], statistic=stats.mean_of_means) == (2.0, 2.0)


def test_bootstrap_of_two_values_by_hand():
    # A resample of [1, 2] has median 1, 1.5 or 2 with probabilities 1/4, 1/2, 1/4:
    # the 2.5% and 97.5% quantiles are 1 and 2.
    assert stats.bootstrap_ci([[1.0, 2.0]], seed=3) == (1.0, 2.0)
    assert stats.bootstrap_ci([[5.0] * 7]) == (5.0, 5.0)
    assert np.isnan(stats.bootstrap_ci([])[0])


def test_bootstrap_resamples_machines_first():
    # Three machines that disagree (1, 1.5, 2): drawing machines, the median is 1 whenever two
    # draws are the first machine (7/27), so the interval spans the machines. Pooling the 60
    # runs as if independent would give a falsely tight 1.5.
    machines = [[1.0] * 20, [1.5] * 20, [2.0] * 20]
    assert stats.bootstrap_ci(machines, seed=1) == (1.0, 2.0)
    assert stats.bootstrap_ci([sum(machines, [])], seed=1) == (1.5, 1.5)


def test_bootstrap_is_deterministic_for_a_seed_and_has_the_expected_width():
    values = np.random.default_rng(0).normal(1.0, 0.1, 200)
    first, again, other = (
        stats.bootstrap_ci([values]),
        stats.bootstrap_ci([values]),
        stats.bootstrap_ci([values], seed=9),
    )
    assert first == again and first != other
    # the median's standard error is 1.2533 sigma / sqrt(n): a 95% interval of about 0.035
    width = first[1] - first[0]
    assert width == pytest.approx(2 * 1.96 * 1.2533 * 0.1 / np.sqrt(200), rel=0.3)
    assert first[0] < np.median(values) < first[1]


def test_summarise_bounds_each_machines_values_and_stays_conservative():
    rng = np.random.default_rng(4)
    machines = [rng.normal(level, 0.2, 5000) for level in (0.9, 1.0, 1.1, 1.05)]
    values = pd.DataFrame(
        dict(g="x", machine_id=np.repeat(["a", "b", "c", "d"], 5000), prompt_id="p", tps=np.concatenate(machines))
    )
    out = stats.summarise(values, by=("g",), column="tps").iloc[0]
    full = stats.bootstrap_ci(machines)  # every value resampled: the exact two-level interval
    assert out["median"] == pytest.approx(np.median(np.concatenate(machines)))  # the figure: every value
    assert out["ci_low"] <= full[0] + 0.002 and out["ci_high"] >= full[1] - 0.002  # as wide, or wider
    assert out["ci_high"] - out["ci_low"] < 1.5 * (full[1] - full[0])  # and not much wider
    few = values.groupby("machine_id").head(stats.BOOTSTRAP_MAX_VALUES)  # at most k a machine: enter whole
    capped = stats.summarise(few, by=("g",), column="tps").iloc[0]
    whole = stats.bootstrap_ci([g["tps"].to_numpy() for _, g in few.groupby("machine_id")])
    assert (capped["ci_low"], capped["ci_high"]) == whole


def test_summarise_counts_machines_prompts_runs_and_exclusions():
    values = pd.DataFrame(
        dict(
            chip=["M4"] * 5 + ["M1"],
            arm="draft K=2",
            machine_id=["a", "a", "b", "b", "b", "c"],
            prompt_id=["p1", "p2", "p1", "p1", "p2", "p1"],
            tps=[1.4, 1.6, 1.5, 1.7, 9.0, 0.8],
            degraded=[False, False, False, False, True, False],
        )
    )
    out = stats.summarise(values, by=("chip", "arm"), column="tps").set_index("chip")
    assert out.loc["M4", "median"] == pytest.approx(1.55)  # 9.0 is excluded
    assert (out.loc["M4", "machines"], out.loc["M4", "prompts"], out.loc["M4", "runs"]) == (2, 2, 4)
    assert out.loc["M4", "excluded_runs"] == 1
    assert (out.loc["M1", "machines"], out.loc["M1", "runs"], out.loc["M1", "excluded_runs"]) == (1, 1, 0)
    assert out.loc["M1", "ci_low"] == out.loc["M1", "ci_high"] == 0.8

"""dashboard/stats.py against answers worked out by hand."""

import numpy as np
import pandas as pd
import pytest

from dashboard import stats


def run(job, agent, chip, method, depth, prompt, repeat, tps, nominal="unknown"):
    return dict(
        job_id=job,
        agent_id=agent,
        chip=chip,
        engine="mlx",
        method=method,
        depth=depth,
        prompt_id=prompt,
        repeat=repeat,
        decode_tokens_per_second=tps,
        nominal=nominal,
    )


def test_paired_ratios_by_hand():
    runs = pd.DataFrame(
        [
            run("j1", "a", "M4", "baseline", 0, "p1", 0, 10.0),
            run("j1", "a", "M4", "draft", 2, "p1", 0, 15.0),  # 1.5
            run("j1", "a", "M4", "baseline", 0, "p2", 0, 20.0),
            run("j1", "a", "M4", "draft", 2, "p2", 0, 30.0),  # 1.5
            run("j1", "a", "M4", "baseline", 0, "p1", 1, 10.0, nominal="degraded"),
            run("j1", "a", "M4", "draft", 2, "p1", 1, 12.0),  # 1.2, degraded through its baseline
            run("j1", "a", "M4", "draft", 2, "p2", 1, 16.0),  # no baseline for p2 repeat 1: no pair
            run("j2", "b", "M1", "baseline", 0, "p1", 0, 40.0),
            run("j2", "b", "M1", "draft", 2, "p1", 0, 32.0),  # 0.8
        ]
    )
    pairs = stats.paired_ratios(runs).sort_values(["job_id", "prompt_id", "repeat"])
    assert pairs["ratio"].tolist() == pytest.approx([1.5, 1.2, 1.5, 0.8])
    assert pairs["baseline"].tolist() == [10.0, 10.0, 20.0, 40.0]
    assert pairs["degraded"].tolist() == [False, True, False, False]
    assert set(pairs["method"]) == {"draft"}


def test_a_baseline_never_pairs_across_jobs():
    runs = pd.DataFrame(
        [run("j1", "a", "M4", "baseline", 0, "p1", 0, 10.0), run("j2", "a", "M4", "ngram", 3, "p1", 0, 9.0)]
    )
    assert stats.paired_ratios(runs).empty


def test_nominal_state_missing_key_counts_as_nominal_but_says_unknown():
    assert stats.nominal_state({}) == "unknown"
    assert stats.nominal_state('{"env.nominal": "false"}') == "degraded"
    assert stats.nominal_state({"env.nominal": "FALSE "}) == "degraded"
    assert stats.nominal_state({"env.nominal": "true"}) == "nominal"
    assert stats.nominal_state(None) == "unknown"


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


def test_summarise_counts_machines_runs_and_exclusions():
    pairs = pd.DataFrame(
        dict(
            chip=["M4"] * 5 + ["M1"],
            engine="mlx",
            method="draft",
            depth=2,
            agent_id=["a", "a", "b", "b", "b", "c"],
            ratio=[1.4, 1.6, 1.5, 1.7, 9.0, 0.8],
            degraded=[False, False, False, False, True, False],
        )
    )
    out = stats.summarise(pairs).set_index("chip")
    assert out.loc["M4", "median"] == pytest.approx(1.55)  # 9.0 is excluded
    assert (out.loc["M4", "machines"], out.loc["M4", "runs"], out.loc["M4", "excluded_runs"]) == (2, 4, 1)
    assert (out.loc["M1", "machines"], out.loc["M1", "runs"], out.loc["M1", "excluded_runs"]) == (1, 1, 0)
    assert out.loc["M1", "ci_low"] == out.loc["M1", "ci_high"] == 0.8


@pytest.mark.parametrize(
    "rule, figure, expected",
    [
        (stats.Rule("range", low=2.0, high=3.0), (2.6, 2.5, 2.7), stats.REPRODUCED),
        (stats.Rule("range", low=2.0, high=3.0), (1.4, 1.3, 1.5), stats.CONTRADICTED),
        (stats.Rule("range", low=2.0, high=3.0), (1.9, 1.7, 2.1), stats.NOT_ENOUGH),  # straddles 2.0
        (stats.Rule("below", threshold=1.0), (0.87, 0.84, 0.9), stats.REPRODUCED),
        (stats.Rule("below", threshold=1.0), (1.2, 1.1, 1.3), stats.CONTRADICTED),
        (stats.Rule("below", threshold=1.0), (0.98, 0.9, 1.05), stats.NOT_ENOUGH),
        (stats.Rule("above", threshold=1.0), (1.2, 1.1, 1.3), stats.REPRODUCED),
        (stats.Rule("above", threshold=1.0), (0.8, 0.7, 0.9), stats.CONTRADICTED),
    ],
)
def test_verdict_rules(rule, figure, expected):
    assert stats.verdict(rule, *figure, machines=2, runs=12).verdict == expected


def test_too_few_machines_or_runs_is_not_enough_data():
    rule = stats.Rule("range", low=2.0, high=3.0, min_machines=2, min_runs=6)
    assert stats.verdict(rule, 2.5, 2.4, 2.6, machines=1, runs=12).verdict == stats.NOT_ENOUGH
    assert stats.verdict(rule, 2.5, 2.4, 2.6, machines=2, runs=5).verdict == stats.NOT_ENOUGH
    assert stats.verdict(rule, 2.5, 2.4, 2.6, machines=2, runs=6).verdict == stats.REPRODUCED
    assert stats.verdict(rule, float("nan"), 0, 0, machines=2, runs=6).verdict == stats.NOT_ENOUGH


def depth_rows(medians, spread=0.05, runs=6):
    return pd.DataFrame(
        [
            dict(depth=d, median=m, ci_low=m - spread, ci_high=m + spread, machines=1, runs=runs)
            for d, m in medians.items()
        ]
    )


def test_best_depth_rule():
    rule = stats.Rule("best_depth_in", low=1, high=3)
    v, best = stats.best_depth_verdict(rule, depth_rows({1: 1.3, 2: 1.4, 4: 0.9, 6: 0.7}))
    assert (v.verdict, best["depth"]) == (stats.REPRODUCED, 2)
    assert stats.best_depth_verdict(rule, depth_rows({1: 1.3, 2: 1.4, 5: 1.8}))[0].verdict == stats.CONTRADICTED
    assert stats.best_depth_verdict(rule, depth_rows({1: 1.3, 5: 1.33}))[0].verdict == stats.NOT_ENOUGH  # overlap
    assert stats.best_depth_verdict(rule, depth_rows({1: 1.3, 2: 1.4}))[0].verdict == stats.NOT_ENOUGH  # no K > 3
    assert stats.best_depth_verdict(rule, depth_rows({1: 1.3, 5: 1.0}, runs=2))[0].verdict == stats.NOT_ENOUGH

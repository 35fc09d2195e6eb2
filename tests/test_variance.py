"""The chip apart from the unit (specfleet/variance.py): variance components by chip, machine
within chip, prompt and residual recovered within their intervals on simulated fleets with
known components, and on the synthetic fleet (tests/support/synthetic.py), whose machines of one chip
share its level exactly; chip comparisons against the unit-to-unit spread; the Compare page."""

from __future__ import annotations

import math
import re
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from specfleet import variance

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
TRUE = {variance.CHIP: 0.10, variance.MACHINE: 0.03, variance.PROMPT: 0.15, variance.RESIDUAL: 0.02}


def fleet(seed: int, chips: int = 8, machines: int = 4, prompts: int = 10, sd: dict | None = None, levels=None):
    """One row per chip, machine and prompt: value = 3 + chip + machine + prompt + residual,
    each normal with the standard deviation `sd` gives it (TRUE by default); `levels` fixes the
    chips' effects instead of drawing them."""
    sd = sd or TRUE
    rng = np.random.default_rng(seed)
    chip = rng.normal(0, sd[variance.CHIP], chips) if levels is None else np.asarray(levels, dtype=float)
    prompt = rng.normal(0, sd[variance.PROMPT], prompts)
    rows = []
    for c in range(len(chip)):
        for m in range(machines):
            unit = rng.normal(0, sd[variance.MACHINE])
            for p in range(prompts):
                value = 3 + chip[c] + unit + prompt[p] + rng.normal(0, sd[variance.RESIDUAL])
                rows.append(dict(chip=f"Apple M{c}", machine_id=f"c{c}-m{m}", prompt_id=f"p{p}", value=value))
    return pd.DataFrame(rows)


def inside(table: pd.DataFrame, truth: dict) -> dict[str, bool]:
    out = {}
    for r in table.itertuples():
        high = r.sd_high if np.isfinite(r.sd_high) else math.inf
        out[r.component] = bool(r.sd_low <= truth[r.component] <= high)
    return out


def test_known_components_are_recovered_within_their_intervals():
    table = variance.components(fleet(2, chips=12, machines=6, prompts=16))  # one fixed fleet; coverage: below
    assert list(table["component"]) == list(variance.COMPONENTS)
    assert all(inside(table, TRUE).values()), table
    assert (table["levels"].tolist()) == [12, 72, 16, 12 * 6 * 16]
    for r in table.itertuples():  # the intervals say something: each within a factor of 3 of its truth
        assert r.sd_high / r.sd_low < 3 and r.percent == pytest.approx(math.expm1(r.sd))


def test_the_intervals_cover_the_truth_across_simulated_fleets():
    """Ten small fleets (6 chips of 3 machines, 8 prompts): each component's 95% interval
    holds its truth in at least 8 of them (a well-calibrated interval misses 3 or more in
    about 1% of such runs; one that ignored the chip's few degrees of freedom would miss more)."""
    held = dict.fromkeys(variance.COMPONENTS, 0)
    for seed in range(10):
        for name, ok in inside(variance.components(fleet(100 + seed, 6, 3, 8)), TRUE).items():
            held[name] += ok
    assert min(held.values()) >= 8, held


def test_a_fleet_without_unit_spread_says_units_differ_by_little():
    sd = TRUE | {variance.MACHINE: 0.0}
    table = variance.components(fleet(3, chips=6, machines=4, prompts=10, sd=sd))
    unit = table.set_index("component").loc[variance.MACHINE]
    assert unit["sd_low"] <= 0.002 and unit["percent"] < 0.01, table
    said = variance.sentence("Apple M4 Pro", "1.42x", table)
    assert re.fullmatch(r"Apple M4 Pro: 1\.42x; units differ by 0\.\d%, chips by \d+%", said), said


def test_chips_apart_beyond_the_unit_spread_and_chips_alike_within_it():
    """Chip levels fixed: M1 at 0, M2 +2% (inside the units' spread of 3%), M3 +25% (far
    beyond it); 6 machines each."""
    values = fleet(11, chips=3, machines=6, prompts=10, levels=[0.0, 0.02, math.log(1.25)])
    table = variance.components(values)
    unit = float(table.set_index("component").loc[variance.MACHINE, "sd"])
    pairs = variance.compare_chips(values, unit).set_index(["chip_a", "chip_b"])
    far = pairs.loc[("Apple M0", "Apple M2")]
    assert far["verdict"] == variance.EXCEEDS and far["ratio_low"] <= 1.25 <= far["ratio_high"]
    near = pairs.loc[("Apple M0", "Apple M1")]
    assert near["verdict"] != variance.EXCEEDS and near["ratio_low"] <= 1.02 <= near["ratio_high"]
    assert "exceeds the unit-to-unit spread" in variance.pair_sentence(next(pairs.reset_index().iloc[[1]].itertuples()))


def test_one_machine_per_chip_cannot_tell_chip_from_unit():
    table = variance.components(fleet(5, chips=5, machines=1, prompts=8)).set_index("component")
    assert np.isnan(table.loc[variance.MACHINE, "sd"]) and "one machine per chip" in table.loc[variance.MACHINE, "note"]
    assert np.isfinite(table.loc[variance.CHIP, "sd"]) and "together" in table.loc[variance.CHIP, "note"]
    single = variance.components(fleet(5, chips=1, machines=4, prompts=8)).set_index("component")
    assert np.isnan(single.loc[variance.CHIP, "sd"]) and np.isfinite(single.loc[variance.MACHINE, "sd"])


# ---------------------------------------------------------------- the synthetic fleet


CELL_JOB = 101  # jobs 101 + 108k all run the synthetic fleet's cell 17 (job x 13 mod 108 cells)
JOBS = 8


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """8 jobs of one cell of tests/support/synthetic.py's fleet: 8 machines on 7 chips. Its
    speeds are a chip's level (0.6 + 0.1 k) times the arm's gain times run noise exp(0.05 z)
    whose draws are keyed on the run's place in its job: every job repeats them. So the fleet
    has a chip term, a prompt term (the repeated draws), and no machine or residual term."""
    from coordinator.store import DB_FILENAME
    from tests.support.synthetic import RUNS_PER_JOB, seed
    from tests.support.versions import Db

    data_dir = tmp_path_factory.mktemp("variance")
    for k in range(JOBS):
        seed(data_dir, RUNS_PER_JOB, start_job=CELL_JOB + 108 * k)
    with duckdb.connect(str(data_dir / DB_FILENAME), read_only=True) as con:
        runs = con.execute("SELECT * FROM runs").df()
        jobs = con.execute("SELECT * FROM jobs").df()
    return Db(runs, jobs)


def test_the_synthetic_fleet_components(synthetic):
    """As generated, machine and prompt explain every value: no residual, nothing parted (said,
    never a fit of noise). With a known residual of 1% added to each value, the chips' spread
    (their levels' standard deviation), the prompts' (the repeated draws, read off one machine),
    no unit spread and the 1% are recovered within their intervals."""
    from dashboard import queries
    from tests.support.synthetic import CHIPS

    values = queries.unit_values(synthetic, queries.Filters())
    assert values["comparable"].nunique() == 1 and values["machine_id"].nunique() == 8
    table = queries.chip_components(synthetic, queries.Filters(), values)
    assert table["sd"].isna().all() and (table["note"] == variance.NO_SPREAD).all()
    decode = values[(values["figure"] == "decode tok/s") & (values["method"] == "baseline")]
    # In a fixed order, so that each value gets the same draw of the noise whatever order DuckDB read the runs in.
    decode = decode.sort_values(list(decode.columns), kind="stable").reset_index(drop=True)
    noisy = decode.assign(value=decode["value"] + np.random.default_rng(4).normal(0, 0.01, len(decode)))
    got = variance.components(noisy).set_index("component")
    chips = sorted(decode["chip"].unique())
    one = decode[decode["machine_id"] == decode["machine_id"].iloc[0]]
    truth = {
        "chip": float(np.log([0.6 + 0.1 * CHIPS.index(c) for c in chips]).std(ddof=1)),
        "machine": 0.0,
        "prompt": float(one["value"].std(ddof=1)),
        "residual": 0.01,
    }
    assert all(inside(got.reset_index(), truth).values()), got
    assert got.loc["machine", "sd"] < 0.005 and got.loc["prompt", "sd"] > 0.005, got
    unit = float(got.loc["machine", "sd"])
    pairs = variance.compare_chips(noisy, unit)
    assert set(pairs["verdict"]) == {variance.EXCEEDS}, pairs  # chips 6% or more apart, units alike


SIMULATED = {variance.CHIP: 0.12, variance.MACHINE: 0.04, variance.PROMPT: 0.10, variance.RESIDUAL: 0.02}


@pytest.fixture(scope="module")
def simulated():
    """A simulated fleet stored as runs (tests/support/versions.py stored_runs: three repeats per
    prompt): 6 chips of 4 machines, 10 prompts, a baseline and mtp K=2 at speedup 1.4, log decode
    speed with the SIMULATED components (the speedup's only spread a 1% per-prompt noise)."""
    from tests.support.versions import Db, stored_runs

    rng = np.random.default_rng(21)
    base = fleet(21, chips=6, machines=4, prompts=10, sd=SIMULATED)
    rows = []
    for r in base.itertuples():
        for method, depth, gain in (("baseline", 0, 0.0), ("mtp", 2, math.log(1.4) + rng.normal(0, 0.01))):
            rows.append(
                dict(
                    setting="s", version="llama.cpp=b1", chip=r.chip, method=method, depth=depth,
                    machine_id=r.machine_id, prompt_id=r.prompt_id, log_tps=r.value + gain,
                    log_acceptance=math.log(0.6) if depth else math.nan, repeats=3, first_seq=0,
                )
            )  # fmt: skip
    return Db(*stored_runs(pd.DataFrame(rows)))


def test_the_compare_page_states_each_chips_spread_within_its_interval(simulated, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import data, queries

    monkeypatch.setattr(data, "mirror", lambda address, token: simulated)
    monkeypatch.setenv("SPECFLEET_COORDINATOR", "variance-test:1")
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    said = "\n".join(m.value for m in at.markdown)
    stated = re.findall(
        r"- (Apple M\d): ([\d.]+) tok/s \(4 machine\(s\)\); units differ by ([\d.]+)%, chips by (\d+)%", said
    )
    assert len(stated) == 6 * 2, said  # six chips, decode speed of two arms
    table = queries.chip_components(simulated, queries.Filters())
    decode = table[(table["figure"] == "decode tok/s") & (table["method"] == "baseline")].set_index("component")
    for component, shown in ((variance.MACHINE, stated[0][2]), (variance.CHIP, stated[0][3])):
        low, high = decode.loc[component, ["percent_low", "percent_high"]]
        assert low <= math.expm1(SIMULATED[component]) <= high, decode  # the truth inside the interval
        assert low <= float(shown) / 100 <= high  # and the figure stated
    assert "x (4 machine(s)); units differ by" in said  # the speedup's lines too
    captions = [c.value for c in at.caption if "unit-to-unit spread" in c.value and " over " in c.value]
    assert captions and any(variance.EXCEEDS in c for c in captions), captions

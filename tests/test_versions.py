"""Changes between engine versions (specfleet/versions.py; dashboard/queries.py version_changes)
on synthetic fleets with known truth: an 8% decode regression planted between two llama.cpp
commits on one chip, none on another."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specfleet import versions
from tests.support.versions import HIT, NEW, OLD, PLANTED, SPARED, per_prompt

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"


def test_the_planted_regression_is_the_only_change_called():
    rows = versions.changes(per_prompt(1))
    assert set(rows["figure"]) == set(versions.FIGURES)
    called = versions.summary(rows)
    assert called[["chip", "old", "new", "change"]].values.tolist() == [[HIT, OLD, NEW, versions.REGRESSION]]
    assert called["figures"][0] == "decode tok/s · baseline, decode tok/s · mtp K=2"
    decode = rows[(rows["figure"] == versions.DECODE) & (rows["chip"] == HIT)]
    assert ((decode["ci_low"] <= PLANTED) & (PLANTED <= decode["ci_high"])).all()  # the truth inside
    assert (decode["how"] == versions.PAIRED).all() and (decode["machines"] == 4).all()
    spared = rows[rows["chip"] == SPARED]
    assert set(spared["change"]) == {versions.UNCHANGED}, spared[["figure", "change", "why"]]
    unmoved = rows[rows["figure"].isin([versions.SPEEDUP, versions.ACCEPTANCE])]  # every arm slowed alike
    assert set(unmoved["change"]) == {versions.UNCHANGED}


def test_a_change_inside_the_tolerance_is_never_a_regression():
    """2% slower on HIT, tolerance 3%: unchanged or inconclusive, never called; with a 1%
    tolerance the same fleet's interval lies wholly below it."""
    fleet = per_prompt(2, machines=8, factor={HIT: 0.98}, noise_sd=0.01)
    assert versions.summary(versions.changes(fleet)).empty
    strict = versions.summary(versions.changes(fleet, tolerance=0.01))
    assert strict[["chip", "change"]].values.tolist() == [[HIT, versions.REGRESSION]]


def test_too_few_machines_is_inconclusive_and_says_so():
    rows = versions.changes(per_prompt(3, machines=1))
    assert set(rows["change"]) == {versions.INCONCLUSIVE}
    assert rows["why"].str.contains("1 of 3 machines").all()
    two = versions.changes(per_prompt(3, machines=2))  # one fewer than the simulated minimum
    assert set(two["change"]) == {versions.INCONCLUSIVE}
    assert two["why"].str.contains("2 of 3 machines").all()


def test_unpaired_machines_give_welch_intervals_wider_than_paired():
    paired = versions.changes(per_prompt(4, machine_sd=0.04))
    unpaired = versions.changes(per_prompt(4, machine_sd=0.04, unpaired=True))
    pick = lambda r: r[(r["figure"] == versions.DECODE) & (r["chip"] == HIT) & (r["method"] == "baseline")].iloc[0]  # noqa: E731
    a, b = pick(paired), pick(unpaired)
    assert b["how"] == versions.UNPAIRED and a["how"] == versions.PAIRED
    assert math.log(b["ci_high"] / b["ci_low"]) > 2 * math.log(a["ci_high"] / a["ci_low"])
    assert b["ci_low"] <= PLANTED <= b["ci_high"]


def test_coverage_of_the_ratio_interval_on_simulated_fleets():
    """The interval is the verdicts' (t over machine means): over 200 fleets of 4 machines it
    holds the planted ratio about 95% of the time (a binomial 99.9% range of 200 draws)."""
    held = 0
    for seed in range(200):
        rows = versions.compare(
            versions.figures(per_prompt(1000 + seed, machines=4, prompts=5, noise_sd=0.05)).query(
                "figure == 'decode tok/s' and chip == @HIT and method == 'baseline'"
            )
        )
        held += bool(rows["ci_low"][0] <= PLANTED <= rows["ci_high"][0])
    assert 175 <= held <= 199, held


# ---------------------------------------------------------------- through the dashboard's query


def fleet_rows():
    """The `fleet_db` fixture's fleet (tests/support/fixtures.py): tests/support/versions.py's, five prompts."""
    return per_prompt(5)


def test_the_dashboards_query_finds_the_planted_regression_alone(fleet_db):
    from dashboard import queries

    per = queries.version_per_prompt(fleet_db, queries.Filters())
    assert set(per["version"]) == {OLD, NEW} and per["setting"].nunique() == 1
    settings = queries.version_settings(per)
    assert settings["versions"].tolist() == [f"{OLD} → {NEW}"]
    rows = queries.version_changes(fleet_db, queries.Filters())
    assert rows["system_label"].nunique() == 1 and set(rows["engine"]) == {"llama.cpp"}
    called = versions.summary(rows)
    assert called[["chip", "old", "new", "change"]].values.tolist() == [[HIT, OLD, NEW, versions.REGRESSION]]
    decode = rows[(rows["figure"] == versions.DECODE) & (rows["chip"] == HIT)]
    assert ((decode["ci_low"] <= PLANTED) & (PLANTED <= decode["ci_high"])).all()
    spared = rows[rows["chip"] == SPARED]
    assert not spared["change"].isin([versions.REGRESSION, versions.GAIN]).any()
    speeds = spared[spared["figure"].isin([versions.DECODE, versions.SPEEDUP])]  # acceptance is rounded to tokens
    assert set(speeds["change"]) == {versions.UNCHANGED}
    # beside the judged acceptance, llama-server's own ratio: accepted / drafted over every run of
    # each version (tests/support/versions.py stores three repeats of 12 x depth drafts a prompt)
    fleet = fleet_rows()
    for r in rows[rows["figure"] == versions.ACCEPTANCE].itertuples():
        for version, pooled in ((r.old, r.pooled_old), (r.new, r.pooled_new)):
            runs = fleet[(fleet["chip"] == r.chip) & (fleet["version"] == version) & (fleet["depth"] == r.depth)]
            accepted = sum(3 * round(12 * r.depth * math.exp(a)) for a in runs["log_acceptance"])
            assert pooled == pytest.approx(accepted / (3 * 12 * r.depth * len(runs)))
    assert rows.loc[rows["figure"] != versions.ACCEPTANCE, ["pooled_old", "pooled_new"]].isna().all().all()


def test_comparable_groups_still_split_by_version(fleet_db):
    """A version is a checked key: Compare pools no two versions; the Versions page pairs them."""
    from dashboard import queries

    groups = queries.groups(fleet_db, queries.Filters())
    assert len(groups) == 2 and set(groups["engine_version"]) == {OLD, NEW}


def test_the_versions_page_shows_the_one_regression(fleet_db, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import data

    monkeypatch.setattr(data, "mirror", lambda address, token: fleet_db)
    monkeypatch.setenv("SPECFLEET_COORDINATOR", "versions-test:1")
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/versions.py").run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith(f"Regression on {HIT}: {OLD} → {NEW}"), errors
    assert not at.success and len(at.get("vega_lite_chart")) == 1
    shown = [d.value for d in at.dataframe if "change" in d.value.columns][0]
    assert set(shown[shown["change"] == versions.REGRESSION]["chip"]) == {HIT}
    accepted = shown[shown["figure"] == versions.ACCEPTANCE]  # the pooled ratio shown beside the figure
    assert len(accepted) and accepted[["pooled_old", "pooled_new"]].notna().all().all()
    assert "pooled" in " ".join(c.value for c in at.caption)


def test_the_reports_section_names_the_one_regression(fleet_db):
    from cli import report
    from dashboard import queries

    blocks = report._versions(queries, fleet_db)
    said = [b.text for b in blocks if isinstance(b, report.Text)]
    assert [t for t in said if t.startswith("Regression")] == [
        f"Regression on {HIT}: {OLD} -> {NEW} (setting {blocks[-1].frame['setting'][0]}):"
        " decode tok/s · baseline, decode tok/s · mtp K=2."
    ]
    table = blocks[-1].frame
    assert set(table[table["change"] == versions.REGRESSION]["chip"]) == {HIT}

"""Claims across versions (dashboard/claims/ conditions.version, specfleet/versions.py): a claim
may name a version range, exact builds or commits, or a named range mapped to them, and selects
only those runs; a claim about a change between versions is settled by the version comparison
(ratio to / from, paired by machine) against its band. On the fleet of tests/support/versions.py:
llama.cpp b9330 then b9500, two chips, a baseline and mtp K=2 at speedup 1.4."""

from __future__ import annotations

import math
import textwrap

import pytest

from dashboard import claims
from specfleet import versions
from tests.support.versions import HIT, NEW, OLD, SPARED, per_prompt


def claim(version, metric: str = "speedup", low: float = 1.3, high: float = 1.5, cid: str = "c") -> claims.Claim:
    record = {
        "id": cid,
        "statement": "a claim across versions",
        "source": {"file": "seeds/x.txt", "section": "s"},
        "conditions": {"engine": "llama.cpp", "method": "mtp", "depth": 2, "version": version},
        "metric": metric,
        "expected": f"{low}-{high}",
        "verdict": {"rule": "range", "low": low, "high": high},
    }
    return claims.parse_claims(textwrap.dedent(_yaml([record])))[0]


def _yaml(records) -> str:
    import yaml

    return yaml.safe_dump(records, sort_keys=False)


def fleet_rows():
    """The `fleet_db` fixture's fleet (tests/support/fixtures.py): mtp's speedup 10% lower under
    b9500 on HIT (its baseline unmoved), none on SPARED."""
    rows = per_prompt(8, factor={HIT: 1.0})
    slower = (rows["chip"] == HIT) & (rows["version"] == NEW) & (rows["method"] == "mtp")
    rows.loc[slower, "log_tps"] += math.log(0.9)
    return rows


@pytest.mark.parametrize(
    "version, problem",
    [
        (">= b9330", None),
        (["b9330", "328874d"], None),
        ({"name": "after PR 22168", "versions": ["b9412", "b9500"]}, None),
        ({"from": "b9330", "to": ">= b9500"}, None),
        ("=> b9330", "a range is an operator"),
        ({"from": "b9330"}, "exactly `from` and `to`"),
        ({"name": "after PR 22168"}, "a named range"),
        ([], "a list of builds"),
    ],
)
def test_the_ledger_checks_a_version_condition(version, problem):
    if problem is None:
        assert claim(version).conditions["version"] == version
    else:
        with pytest.raises(claims.ClaimError, match="conditions.version") as e:
            claim(version)
        assert problem in str(e.value)


def test_a_change_claim_is_settled_on_speedup_or_acceptance_only():
    with pytest.raises(claims.ClaimError, match="metric: a change between versions"):
        claim({"from": "b9330", "to": "b9500"}, metric="best_depth")


def test_matches_reads_builds_and_commits_as_sql_does():
    assert versions.matches(">= b9330", "llama.cpp=b9330") and not versions.matches("> b9330", "llama.cpp=b9330")
    assert versions.matches("< b9500", "llama-server.build=9412 llama-server.commit=ab12cd3")
    assert versions.matches("== b9330", "version: 9330 (328874d)")
    assert versions.matches(["328874d"], "llama-server.build=9330 llama-server.commit=328874d")
    assert versions.matches("b9330", "llama-server.build=9330") and not versions.matches("b9330", "llama.cpp=b93301")


@pytest.mark.parametrize(
    "version, selected",
    [
        (">= b9500", {NEW}),
        ("< b9500", {OLD}),
        ("b9330", {OLD}),
        ({"name": "after PR 22168", "versions": ["b9412", "b9500"]}, {NEW}),
        (["b1"], set()),
    ],
)
def test_a_version_condition_selects_only_its_runs(fleet_db, version, selected):
    where, params = claims.conditions_sql(claim(version))
    got = fleet_db.con.execute(f"SELECT DISTINCT engine_version FROM runs WHERE {where}", params).fetchall()
    assert {v for (v,) in got} == selected


def test_a_range_claim_is_settled_on_its_versions_alone(fleet_db):
    rows = claims.evaluate(claim(">= b9500"), fleet_db.con)
    assert set(rows["chip"]) == {HIT, SPARED}
    by_chip = rows.set_index("chip")
    assert by_chip.loc[SPARED, "verdict"] == "reproduced"  # 1.4 inside [1.3, 1.5]
    assert by_chip.loc[HIT, "figure"] == pytest.approx(1.4 * 0.9, rel=0.03)  # b9500's speedup only


def test_a_change_claim_is_settled_by_the_version_comparison(fleet_db):
    """'mtp's speedup fell 10% from b9330 to b9500': reproduced on HIT (its ratio's interval
    inside [0.85, 0.95]), contradicted on SPARED (unchanged: wholly above the band)."""
    fell = claim({"from": "b9330", "to": ">= b9500"}, low=0.85, high=0.95, cid="fell")
    rows = claims.evaluate(fell, fleet_db.con).set_index("chip")
    assert rows.loc[HIT, "verdict"] == "reproduced", rows.loc[HIT, "why"]
    assert rows.loc[HIT, "ci_low"] <= 0.9 <= rows.loc[HIT, "ci_high"]
    assert rows.loc[SPARED, "verdict"] == "contradicted", rows.loc[SPARED, "why"]
    assert rows.loc[SPARED, "figure"] == pytest.approx(1.0, abs=0.02)
    assert rows.loc[HIT, "why"].startswith(f"{OLD} → {NEW}, K=2 (paired by machine)")
    assert rows.loc[HIT, "machines"] == 4
    unchanged = claim({"from": "b9330", "to": "b9500"}, low=1 / 1.05, high=1.05, cid="same")
    same = claims.evaluate(unchanged, fleet_db.con).set_index("chip")
    assert same.loc[SPARED, "verdict"] == "reproduced" and same.loc[HIT, "verdict"] == "contradicted"


def test_a_change_claim_with_no_run_on_one_side_is_inconclusive(fleet_db):
    rows = claims.evaluate(claim({"from": "b9330", "to": "b9999"}, low=0.9, high=1.1), fleet_db.con)
    assert set(rows["verdict"]) == {"inconclusive"} and "both sides" in rows["why"].iloc[0]

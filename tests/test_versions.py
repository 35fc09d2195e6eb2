"""Changes between engine versions (specfleet/versions.py; dashboard/queries.py version_changes)
on synthetic fleets with known truth: an 8% decode regression planted between two llama.cpp
commits on one chip, none on another."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from specfleet import versions
from specfleet.record import ModelIdentity, RunRecord, Sampler

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
OLD, NEW = "llama.cpp=b9330", "llama.cpp=b9500"
HIT, SPARED = "Apple M1 Max", "Apple M4 Pro"
PLANTED = 0.92  # decode tok/s of every arm on HIT under NEW: 8% slower


def per_prompt(
    seed: int,
    machines: int = 4,
    prompts: int = 8,
    factor: dict[str, float] | None = None,
    machine_sd: float = 0.05,
    noise_sd: float = 0.02,
    unpaired: bool = False,
) -> pd.DataFrame:
    """version_per_prompt's rows of a fleet: two chips, `machines` machines each (disjoint sets
    per version when `unpaired`), both versions, a baseline and mtp K=2 (speedup 1.4,
    acceptance 0.6). `factor`: per chip, NEW's decode tok/s over OLD's (every arm)."""
    rng = np.random.default_rng(seed)
    factor = factor or {HIT: PLANTED}
    rows = []
    for chip, level in ((HIT, math.log(30.0)), (SPARED, math.log(55.0))):
        for m in range(machines * (2 if unpaired else 1)):
            machine = level + rng.normal(0, machine_sd)
            for p in range(prompts):
                prompt = rng.normal(0, 0.1)
                for seq, version in enumerate((OLD, NEW)):
                    if unpaired and (m < machines) != (version == OLD):
                        continue
                    change = math.log(factor.get(chip, 1.0)) if version == NEW else 0.0
                    for method, depth, gain, accept in (("baseline", 0, 0.0, math.nan), ("mtp", 2, math.log(1.4), 0.6)):
                        rows.append(
                            dict(
                                setting="s1",
                                version=version,
                                chip=chip,
                                method=method,
                                depth=depth,
                                agent_id=f"{chip[-6:]}-{m}",
                                prompt_id=f"p{p}",
                                log_tps=machine + prompt + gain + change + rng.normal(0, noise_sd),
                                log_acceptance=math.log(accept) + rng.normal(0, 0.01) if depth else math.nan,
                                repeats=3,
                                first_seq=seq,
                            )
                        )
    return pd.DataFrame(rows)


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
    assert rows["why"].str.contains("1 of 2 machines").all()


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


class Db:
    """A mirror stand-in for dashboard/queries.py: runs with the mirror's labels, and jobs."""

    def __init__(self, runs: pd.DataFrame, jobs: pd.DataFrame):
        from dashboard.queries import LABELS

        self.con = duckdb.connect()
        self.con.register("_runs", runs)
        self.con.execute(f"CREATE TABLE runs AS SELECT *, {LABELS} FROM _runs")
        self.con.register("_jobs", jobs)
        self.con.execute("CREATE TABLE jobs AS SELECT * FROM _jobs")

    def query(self, sql, params=None):
        try:
            return self.con.execute(sql, params or []).df()
        except duckdb.CatalogException:  # as the mirror: a table not arrived yet reads empty
            return pd.DataFrame()

    def sync(self) -> dict[str, int]:
        return {"agents": 0, "sweeps": 0, "jobs": 1, "runs": 1, "imported_results": 0}

    def cursor(self):
        return self.con.cursor()


def stored_runs(fleet: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The fleet's per-prompt rows as stored runs (three repeats each at the prompt's speed,
    spread 1% either side), one job per machine and version."""
    target = ModelIdentity(reference="Qwen3.5-9B-MTP-Q4_K_M.gguf", digest="9" * 64)
    template = RunRecord(
        run_id="t", job_id="t", attempt=1, engine="llama.cpp", engine_version=OLD, method="baseline", depth=0,
        target=target, sampler=Sampler(), prompt_set="code", prompt_set_digest="ef" * 32, prompt_category="code",
        prompt_id="p", context_tokens=0, max_new_tokens=32, repeat=0, position=0, prompt_tokens=20,
        generated_tokens=32, prefill_seconds=0.01, ttft_seconds=0.01, decode_seconds=0.3, wall_seconds=0.31,
        decode_tokens_per_second=100.0, prefill_tokens_per_second=2000.0, peak_memory_bytes=10**8,
        output_sha256="ab" * 32, started_at_unix_seconds=1.7e9,
    ).row()  # fmt: skip
    rows, seq = [], 0
    for r in fleet.itertuples():
        for repeat, spread in enumerate((0.99, 1.0, 1.01)):
            seq += 1
            tps = math.exp(r.log_tps) * spread
            drafted = 12 * r.depth
            rows.append(
                template
                | dict(
                    run_id=f"run-{seq}", job_id=f"job-{r.agent_id}-{r.version}", lease_id="lease", sweep_id="sw",
                    agent_id=r.agent_id, chip=r.chip, engine_version=r.version, method=r.method, depth=r.depth,
                    prompt_id=r.prompt_id, repeat=repeat, decode_tokens_per_second=tps, tokens_drafted=drafted,
                    tokens_accepted=round(drafted * math.exp(r.log_acceptance)) if r.depth else 0,
                    lossless=True if r.depth else None, env_nominal=True, seq=seq + 1000 * r.first_seq,
                    record_sha256="", ingested_at=0.0,
                )
            )  # fmt: skip
    runs = pd.DataFrame(rows)
    jobs = pd.DataFrame({"job_id": runs["job_id"].unique()}).assign(attempt=1, state="done")
    return runs, jobs


@pytest.fixture(scope="module")
def db():
    return Db(*stored_runs(per_prompt(5)))


def test_the_dashboards_query_finds_the_planted_regression_alone(db):
    from dashboard import queries

    per = queries.version_per_prompt(db, queries.Filters())
    assert set(per["version"]) == {OLD, NEW} and per["setting"].nunique() == 1
    settings = queries.version_settings(per)
    assert settings["versions"].tolist() == [f"{OLD} → {NEW}"]
    rows = queries.version_changes(db, queries.Filters())
    assert rows["system_label"].nunique() == 1 and set(rows["engine"]) == {"llama.cpp"}
    called = versions.summary(rows)
    assert called[["chip", "old", "new", "change"]].values.tolist() == [[HIT, OLD, NEW, versions.REGRESSION]]
    decode = rows[(rows["figure"] == versions.DECODE) & (rows["chip"] == HIT)]
    assert ((decode["ci_low"] <= PLANTED) & (PLANTED <= decode["ci_high"])).all()
    spared = rows[rows["chip"] == SPARED]
    assert not spared["change"].isin([versions.REGRESSION, versions.GAIN]).any()
    speeds = spared[spared["figure"].isin([versions.DECODE, versions.SPEEDUP])]  # acceptance is rounded to tokens
    assert set(speeds["change"]) == {versions.UNCHANGED}


def test_comparable_groups_still_split_by_version(db):
    """A version is a checked key: Compare pools no two versions; the Versions page pairs them."""
    from dashboard import queries

    groups = queries.groups(db, queries.Filters())
    assert len(groups) == 2 and set(groups["engine_version"]) == {OLD, NEW}


def test_the_versions_page_shows_the_one_regression(db, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import data

    monkeypatch.setattr(data, "mirror", lambda address, token: db)
    monkeypatch.setenv("SPECFLEET_COORDINATOR", "versions-test:1")
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/versions.py").run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith(f"Regression on {HIT}: {OLD} → {NEW}"), errors
    assert not at.success and len(at.get("vega_lite_chart")) == 1
    shown = [d.value for d in at.dataframe if "change" in d.value.columns][0]
    assert set(shown[shown["change"] == versions.REGRESSION]["chip"]) == {HIT}


def test_the_reports_section_names_the_one_regression(db):
    from cli import report
    from dashboard import queries

    blocks = report._versions(queries, db)
    said = [b.text for b in blocks if isinstance(b, report.Text)]
    assert [t for t in said if t.startswith("Regression")] == [
        f"Regression on {HIT}: {OLD} -> {NEW} (setting {blocks[-1].frame['setting'][0]}):"
        " decode tok/s · baseline, decode tok/s · mtp K=2."
    ]
    table = blocks[-1].frame
    assert set(table[table["change"] == versions.REGRESSION]["chip"]) == {HIT}

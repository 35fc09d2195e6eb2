"""The dashboard's queries at scale (dashboard/data.py on the mirror: labels computed as runs
arrive, claims evaluated on a cursor and cached per claim, selections counted incrementally)
give the same rows and figures as the pandas path they replaced: every run pulled into a
DataFrame and evaluated there. On a synthetic fleet of a few thousand runs (tests/support/synthetic.py)
behind a real coordinator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard import claims, data, queries
from specfleet import speedup, stats
from specfleet.client import fetch_table
from specfleet.data_dir import admin_credential
from tests.support.fleet import admin_for, fleet_db, start_coordinator
from tests.support.synthetic import RUNS_PER_JOB, seed


@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("queries")
    seed(data_dir, 12 * RUNS_PER_JOB)  # 12 jobs: every system of the synthetic fleet, 4812 runs
    coordinator = start_coordinator(data_dir)
    runs, _ = fetch_table(admin_for(coordinator), "runs")
    jobs, _ = fetch_table(admin_for(coordinator), "jobs")
    yield coordinator, runs.to_pandas(), jobs.to_pandas()
    coordinator.stop()


@pytest.fixture
def v(synthetic_store, monkeypatch):
    coordinator, *_ = synthetic_store
    monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", admin_credential(coordinator.config.data_dir))
    return data.version()


def sort(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.sort_values(keys).reset_index(drop=True)


def test_the_fleet_spans_the_systems(synthetic_store):
    _, runs, _ = synthetic_store
    assert len(runs) == 12 * RUNS_PER_JOB + 12
    assert {"openai", "llama-server", "mlx", "llama.cpp"} <= set(runs["engine"])
    assert runs["agent_id"].nunique() == 12 and runs["env_nominal"].isna().any() and runs["env_nominal"].eq(False).any()


def test_verdicts_equal_the_ledger_evaluated_on_every_run_in_pandas(synthetic_store, v):
    _, runs, jobs = synthetic_store
    expected = claims.evaluate_all(claims.load_claims(data.ledger_path()), fleet_db(runs, jobs))
    got = data.verdicts(v)
    keys = ["claim", "chip", "group", "why"]
    assert len(got) == len(expected) and (got["runs"] > 0).any()
    pd.testing.assert_frame_equal(sort(got, keys), sort(expected, keys), check_dtype=False)
    again = data.verdicts(data.version())  # from the per-claim cache: the same frame
    pd.testing.assert_frame_equal(sort(again, keys), sort(got, keys))


def test_selections_equal_and_add_up_over_ranges_of_runs(synthetic_store, v):
    _, runs, jobs = synthetic_store
    con = fleet_db(runs, jobs)
    got = data.selections(v)
    mid = int(runs["seq"].median())
    for c in claims.load_claims(data.ledger_path()):
        whole = claims.selection(c, con)
        assert got[c.id] == whole, c.id
        halves = claims.merge_selections(
            claims.selection(c, con, (0, mid)), claims.selection(c, con, (mid, int(runs["seq"].max())))
        )
        assert halves == {**whole, "excluded": dict(whole["excluded"])}, c.id


def test_speedups_and_groups_equal_the_definition_on_the_frame(synthetic_store, v):
    _, runs, jobs = synthetic_store
    con = fleet_db(runs, jobs)
    got = data.speedups(v, data.Filters())
    expected = stats.speedups(lambda sql, params=None: con.execute(sql, params or {}).df(), "runs")
    keys = ["comparable", "chip", "method", "depth"]
    assert len(got) == len(expected) > 20
    for column in ("speedup", "ci_low", "ci_high", "machines", "prompts", "pairs", "excluded_pairs"):
        assert sort(got, keys)[column].tolist() == pytest.approx(sort(expected, keys)[column].tolist(), nan_ok=True)
    groups = data.groups(v, data.Filters())
    reference = speedup.groups(con)
    assert sorted(groups["comparable"]) == sorted(reference["comparable"])
    assert dict(zip(groups["comparable"], groups["runs"])) == dict(zip(reference["comparable"], reference["runs"]))


def test_tokens_per_joule_only_where_energy_was_recorded(synthetic_store, v):
    _, runs, _ = synthetic_store
    got = data.energy(v, data.Filters()).set_index(["chip", "engine", "arm"])
    measured = runs[(runs["joules_per_token"] > 0) & ~runs["env_nominal"].eq(False)].copy()
    measured["arm"] = measured["method"] + np.where(measured["depth"] > 0, " K=" + measured["depth"].astype(str), "")
    expected = (1 / measured["joules_per_token"]).groupby([measured["chip"], measured["engine"], measured["arm"]])
    assert set(got.index.get_level_values("engine")) == {"llama.cpp"} and len(got) > 0
    assert got["tokens_per_joule"].to_dict() == pytest.approx(expected.median().to_dict())
    # a 2 W package: tokens per joule is half the decode tok/s, run by run
    assert (got["tokens_per_joule"] / got["decode_tokens_per_second"]).tolist() == pytest.approx([0.5] * len(got))
    assert set(got["energy_source"]) == {"rapl"}


def test_decode_speed_and_the_runs_summary_equal_pandas(synthetic_store, v):
    _, runs, _ = synthetic_store
    generation = runs[runs["method"] != "verify-cost"].copy()
    generation["arm"] = generation["method"] + np.where(
        generation["depth"] > 0, " K=" + generation["depth"].astype(str), ""
    )
    kept = generation[~generation["env_nominal"].eq(False)]
    expected = kept.groupby(["chip", "engine", "arm"])["decode_tokens_per_second"].agg(["median", "size"])
    got = data.decode_speed(v, data.Filters()).set_index(["chip", "engine", "arm"])
    assert got["median"].to_dict() == pytest.approx(expected["median"].to_dict())
    assert got["runs"].to_dict() == expected["size"].to_dict()
    summary = data.runs_summary(v, data.Filters(), chips=("Apple M4 Pro",))
    mine = runs[runs["chip"] == "Apple M4 Pro"]
    assert summary["runs"] == len(mine) > 0 and summary["machines"] == mine["agent_id"].nunique()
    assert summary["degraded"] == int(mine["env_nominal"].eq(False).sum())
    assert summary["unknown"] == int(mine["env_nominal"].isna().sum())
    latest = data.runs_table(v, data.Filters(), limit=100)
    assert latest["run_id"].tolist() == runs.sort_values("seq")["run_id"].tolist()[-100:]
    # Their flags, judged among the repeats of their own arms only, are those judged among every run.
    every = (
        data._db(v)
        .query(f"SELECT run_id, stall FROM {speedup.flagged_sql('runs')} ORDER BY seq DESC LIMIT 100")
        .set_index("run_id")["stall"]
    )
    shown = latest.set_index("run_id")["flags"].str.contains("stall")
    assert shown.to_dict() == every.to_dict()
    many = data.runs_table(v, data.Filters(), limit=len(runs))
    assert many["flags"].str.contains("stall").sum() == data.runs_summary(v, data.Filters())["stall"]


MTPLX = "youssofal/qwen3.6-27b-mtplx-optimized-speed"


def test_a_claims_key_moves_only_with_runs_it_could_select():
    systems = pd.DataFrame(
        dict(
            engine=["openai", "openai", "mlx"],
            system=["MTPLX", "MTPLX", "specfleet"],
            model=[
                "youssofal/qwen3.6-27b-mtplx-optimized-speed",
                "other",
                "youssofal/qwen3.6-27b-mtplx-optimized-speed",
            ],
            runs=[10, 20, 30],
            jobs=[1, 2, 3],
        )
    )
    (c,) = [c for c in claims.load_claims() if c.id == "mtplx-2-3x"]
    key = data._claim_key(c, systems)
    assert key == ((10, 1), (30, 3))  # its model's runs, and our loop's (mlx) beside it
    systems.loc[1, "runs"] = 99  # another model's runs: the claim's rows stand
    assert data._claim_key(c, systems) == key
    systems.loc[2, "jobs"] = 4  # a job of our loop's runs changed: recomputed
    assert data._claim_key(c, systems) != key


class _Runs:
    """queries' `db` (Mirror.query's interface) over given runs with the columns the mirror derives."""

    def __init__(self, runs: pd.DataFrame):
        self.con = fleet_db(pd.DataFrame())
        self.con.register("stored", runs)
        self.con.execute(f"CREATE VIEW labelled AS SELECT *, {queries.LABELS} FROM stored")
        flagged = speedup.flagged_sql("labelled")  # the mirror's stored flag (queries.RUN_FLAGS)
        self.con.execute(f"CREATE VIEW runs AS SELECT * EXCLUDE (stall_flag), stall AS stall_flag FROM {flagged}")

    def query(self, sql, params=None):
        return self.con.execute(sql, params or []).df()


def test_energy_shows_ioreport_split_as_shares_of_the_run_energy(synthetic_store, v):
    """A Mac's runs (energy_source ioreport) carry CPU, GPU, ANE and DRAM joules: the Compare page
    shows each one's median share of the run's energy; NVML and RAPL runs have none to show."""
    _, runs, _ = synthetic_store
    assert data.energy(v, data.Filters())[["cpu_share", "gpu_share", "ane_share", "dram_share"]].isna().all().all()
    macs = runs.copy()
    measured = macs["energy_source"] == "rapl"
    macs.loc[measured, "energy_source"] = "ioreport"
    shares = {"cpu": 0.25, "gpu": 0.6, "ane": 0.0, "dram": 0.15}
    for part, share in shares.items():
        macs[f"energy_{part}_joules"] = np.where(measured, macs["energy_joules"].astype(float) * share, np.nan)
    got = queries.energy(_Runs(macs), data.Filters())
    assert len(got) > 0 and set(got["energy_source"]) == {"ioreport"}
    for part, share in shares.items():
        assert got[f"{part}_share"].tolist() == pytest.approx([share] * len(got)), part

"""Comparable runs on the dashboard: runs that differ in any checked key (specfleet/record.py
CHECKED_KEYS) are never pooled, on the Compare page or in claims, and the dashboard's speedup
for a group is specfleet.speedup's on the same runs. A model is one model wherever it lies."""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from streamlit.testing.v1 import AppTest

from cli import demo
from coordinator.metrics import INFO_LABELS
from specfleet import speedup
from specfleet.client import fetch_table
from specfleet.record import CHECKED_KEYS, ModelIdentity
from tests.support.dashboard import (
    APP,
    VARIANTS,
    fingerprint,
    frame,
    group_ids,
    record,
    run_job,
    sha,
    speculative,
    texts,
)
from tests.support.fleet import admin_for, enrol, register_runs, start_coordinator

PROMPTS = 5  # the fewest prompts a verdict rests on (specfleet.inference.MIN_PROMPTS)
AGENTS = ("left", "right", "middle")  # three machines: the fewest a verdict over machines can rest on


def repeats_of(key: str) -> int:
    """The base group has the most runs (the Compare page opens on it); the others one repeat."""
    return 2 if key == "base" else 1


def first_acceptance(i: int) -> float:
    """Group i's acceptance at draft position 1: distinct per group, within [0, 1] however many
    checked keys the declaration has."""
    return 0.3 + 0.6 * i / (len(CHECKED_KEYS) + 1)


def cell(job_id: str, i: int, repeats: int, rng, **fields) -> list:
    """A cell's runs: per prompt and repeat a baseline and MTP at K=2; group i decodes at its
    own speed, speedup and acceptance, so that pooling two groups would show in every figure."""
    base_tps, ratio = 10.0 + i, 1.2 + 0.1 * i
    out = []
    for repeat in range(repeats):
        for p in range(PROMPTS):
            common = dict(prompt_id=f"code-{p + 1:02d}", repeat=repeat, **fields)
            base = base_tps * (1 + rng.normal(0, 0.01))
            out.append(record(job_id, "baseline", 0, base, **common))
            arm = dict(speculative(2), acceptance_by_position=(first_acceptance(i), 0.3))
            out.append(record(job_id, "mtp", 2, base * ratio * (1 + rng.normal(0, 0.02)), **common, **arm))
    return out


def curve(job_id: str, slope: float, **fields):
    times = tuple(0.02 * (1 + slope * m) for m in range(8))
    return record(
        job_id,
        "verify-cost",
        0,
        0.0,
        prompt_id="context-512",
        context_tokens=512,
        prompt_tokens=512,
        generated_tokens=0,
        verify_cost_seconds=times,
        **fields,
    )


def seed_fleet(coordinator):
    """The `fleet` fixture's runs (tests/support/fixtures.py). Three machines on one chip; on each,
    one cell of the base group (two repeats) and one of a group per checked key (one repeat),
    each differing from the base in that key only. Verify-cost curves: the base target's and
    another build's (the target_digest variant). The machines report side by side (a thread
    each): the coordinator batches their streams."""
    jobs = {}  # group name -> job ids

    def machine(index: int, name: str) -> dict[str, str]:
        rng = np.random.default_rng([11, index])
        agent = enrol(coordinator, name, fingerprint(name, "Apple M4 Pro", 20, 48, 273))
        agent.name = name
        mine = {}
        for i, key in enumerate(("base", *CHECKED_KEYS)):
            fields = VARIANTS.get(key, {})

            def records(job_id, i=i, fields=fields, key=key):
                out = cell(job_id, i, repeats_of(key), rng, **fields)
                if key in ("base", "target_digest"):
                    out.append(curve(job_id, 0.1 if key == "base" else 0.5, **fields))
                return out

            mine[key] = run_job(coordinator, agent, f"{name}-{key}", "/models/x", records)
        return mine

    with ThreadPoolExecutor(len(AGENTS)) as pool:
        for mine in pool.map(machine, range(len(AGENTS)), AGENTS):
            for key, job_id in mine.items():
                jobs.setdefault(key, []).append(job_id)
    admin = admin_for(coordinator)
    table, _ = fetch_table(admin, "runs")
    con = duckdb.connect()
    register_runs(con, table)
    group = dict(
        con.execute(
            f"SELECT DISTINCT job_id, {speedup.COMPARABLE_ID} FROM runs WHERE method != 'verify-cost'"
        ).fetchall()
    )
    of = {key: {group[j] for j in jobs[key]} for key in jobs}
    assert all(len(ids) == 1 for ids in of.values()), of  # both machines' cells of a group are one group
    truth = dict(
        groups={key: ids.pop() for key, ids in of.items()},
        speedups=speedup.speedups(con).set_index("comparable"),
        runs=con.execute(f"SELECT *, {speedup.COMPARABLE_ID} AS comparable FROM runs").df(),
    )
    return truth


def test_every_group_is_offered_and_the_page_says_what_differs(page):
    at = page("compare")
    truth = page.truth
    assert sorted(group_ids(at).values()) == sorted(truth["groups"].values())
    # it opens on the group with most runs: the base group's two repeats
    assert at.selectbox(key="compare-group").value == truth["groups"]["base"]
    assert f"they differ in {', '.join(CHECKED_KEYS)}." in texts(at)


@pytest.fixture(scope="module")
def compare_page(fleet):
    """The Compare page, opened once for the groups' tests: each selects its own group on it (a
    rerun of the page), instead of starting the app and switching to the page again."""
    coordinator, token, truth = fleet
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
        env.setenv("SPECFLEET_ADMIN_TOKEN", token)
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page("views/compare.py").run()
        assert not at.exception, at.exception
        yield at, truth


@pytest.mark.parametrize("key", ["base", *CHECKED_KEYS])
def test_compare_page_shows_one_group_only(compare_page, key):
    """The group that differs from the base in `key` alone: every figure on the page is its
    own, and its speedup is specfleet.speedup's on the same runs."""
    at, truth = compare_page
    g = truth["groups"][key]
    at.selectbox(key="compare-group").select(g).run()
    assert not at.exception, at.exception
    mine = truth["runs"][truth["runs"]["comparable"] == g]
    repeats = repeats_of(key)
    speedups = frame(at, "ci_low", "method", "depth")
    assert speedups["comparable"].tolist() == [g]
    expected = truth["speedups"].loc[g]
    shown = speedups.iloc[0]
    assert shown["speedup"] == pytest.approx(expected["speedup"], rel=1e-12)
    machines = len(AGENTS)
    assert (shown["machines"], shown["prompts"], shown["pairs"]) == (machines, PROMPTS, machines * PROMPTS * repeats)
    assert (expected["machines"], expected["prompts"], expected["pairs"]) == (
        machines,
        PROMPTS,
        machines * PROMPTS * repeats,
    )
    assert shown["ci_low"] < shown["speedup"] < shown["ci_high"]
    decode = frame(at, "arm", "median").set_index("arm")
    baselines = mine[mine["method"] == "baseline"]["decode_tokens_per_second"]
    assert decode.loc["baseline", "runs"] == len(baselines) == machines * PROMPTS * repeats
    assert decode.loc["baseline", "median"] == pytest.approx(baselines.median())
    roof = frame(at, "share")
    assert roof["decode_tokens_per_second"].tolist() == pytest.approx([baselines.median()])
    acceptance = frame(at, "position", "acceptance").set_index("position")
    i = ["base", *CHECKED_KEYS].index(key)
    assert acceptance.loc[1, "acceptance"] == pytest.approx(first_acceptance(i))
    assert acceptance.loc[1, "runs"] == machines * PROMPTS * repeats
    assert frame(at, "phase", "ms")["runs"].unique().tolist() == [machines * PROMPTS * repeats]
    # verify cost: the curves of the group's own target build, engine and engine version
    if key in ("engine", "engine_version", "system"):  # no curve of that engine (version) was measured
        assert any("No verify-cost run for this group's model" in note.value for note in at.info)
    else:
        cost = frame(at, "rows", "ratio").set_index("rows")
        slope = 0.5 if key == "target_digest" else 0.1
        assert cost.loc[2, "ratio"] == pytest.approx(1 + slope) and cost.loc[2, "machines"] == machines


def test_claims_settle_every_group_apart(page, tmp_path, monkeypatch):
    ledger = tmp_path / "claims.yaml"
    ledger.write_text(
        "- id: mlx-mtp-k2\n  statement: MTP at depth 2 gains 15-25% with MLX on an M4 Pro.\n"
        "  source: {file: notes.txt, section: top, quote: gains}\n"
        "  conditions: {engine: mlx, method: mtp, chip: Apple M4 Pro, depth: 2}\n"
        "  metric: speedup\n  expected: 1.15-1.25x\n  verdict: {rule: range, low: 1.15, high: 1.25, min_runs: 6}\n"
        "- id: llamacpp-mtp-k2\n  statement: MTP at depth 2 gains with llama.cpp.\n"
        "  source: {file: notes.txt, section: top, quote: gains}\n"
        "  conditions: {engine: llama.cpp, method: mtp, depth: 2}\n"
        "  metric: speedup\n  expected: above 1\n  verdict: {rule: above, threshold: 1.0}\n"
    )
    monkeypatch.setenv("SPECFLEET_CLAIMS", str(ledger))
    at = page("questions")
    truth = page.truth
    verdicts = at.dataframe[0].value
    groups = truth["groups"]
    mlx = verdicts[verdicts["claim"] == "mlx-mtp-k2"].set_index("group")
    # the system variant is an OpenAI-compatible server's runs (engine openai): not the mlx claim's
    assert sorted(mlx.index) == sorted(g for key, g in groups.items() if key not in ("engine", "system"))
    llamacpp = verdicts[verdicts["claim"] == "llamacpp-mtp-k2"]
    assert llamacpp["group"].tolist() == [groups["engine"]]
    for g, r in mlx.iterrows():
        expected = truth["speedups"].loc[g]
        assert r["figure"] == pytest.approx(expected["speedup"], rel=1e-12)
        assert (r["machines"], r["prompts"], r["runs"]) == (
            expected["machines"],
            expected["prompts"],
            expected["pairs"],
        )
        assert r["chip"] == "Apple M4 Pro"
    assert mlx.loc[groups["base"], "verdict"] == "reproduced"  # 1.2x; every other group's is its own
    assert mlx.loc[groups["engine_version"], "verdict"] != "reproduced"
    # each row names what sets its group apart
    assert mlx.loc[groups["base"], "differs"].startswith("target_digest=")
    assert "sampler_seed=1" in mlx.loc[groups["sampler_seed"], "differs"]
    assert f"{len(mlx)} comparable groups match, settled apart and never pooled" in texts(at)


def test_every_group_is_its_own_on_metrics_and_in_the_demo_summary(fleet):
    """The other surfaces that report a figure: /metrics names each group once in
    specfleet_comparable_group_info with its speedup series, and the demo's summary prints one
    table per group; a run differing from the base in any one declared checked key is its own."""
    coordinator, _, truth = fleet
    url = f"http://127.0.0.1:{coordinator.metrics_port}/metrics"
    deadline = time.monotonic() + 60  # the result series follow new runs within RESULTS_EVERY_SECONDS
    while True:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        info = {s.labels["comparable"]: s.labels for s in families["specfleet_comparable_group_info"].samples}
        if set(truth["groups"].values()) <= set(info) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert set(info) == set(truth["groups"].values())
    ratios = {s.labels["comparable"] for s in families["specfleet_speedup_ratio"].samples}
    assert ratios == set(truth["groups"].values())
    for key in CHECKED_KEYS:  # the info names the key the group differs in, apart from the base's
        label = INFO_LABELS.get(key)
        if label:
            assert info[truth["groups"][key]][label] != info[truth["groups"]["base"]][label], key
    admin = admin_for(coordinator)
    runs, _ = fetch_table(admin, "runs")
    jobs, _ = fetch_table(admin, "jobs")
    summary = demo.summary_table(runs, jobs)
    for key, g in truth["groups"].items():
        assert summary.count(f"comparable group {g}:") == 1, key


# ---------------------------------------------------------------- one model, many paths


@pytest.fixture(scope="module")
def same_model(tmp_path_factory):
    """Two machines holding one GGUF file at different paths: the same file name and digest."""
    coordinator = start_coordinator(tmp_path_factory.mktemp("coordinator"))
    rng = np.random.default_rng(5)
    model = ModelIdentity(reference="target.gguf", digest=sha("one file"), architecture="llama", bytes=10**9)
    paths = {"alice": "/Users/alice/models/target.gguf", "bob": "/opt/llm/weights/target.gguf"}
    for name, path in paths.items():
        agent = enrol(coordinator, name, fingerprint(name, "Apple M4 Pro", 20, 48, 273))
        agent.name = name

        def records(job_id):
            return cell(job_id, 0, 2, rng, target=model)

        run_job(coordinator, agent, f"{name}-cell", path, records)
    token = admin_for(coordinator)._metadata[0][1].removeprefix("Bearer ")
    yield coordinator, token, model, paths
    coordinator.stop()


def test_one_model_at_two_paths_is_one_model(same_model, monkeypatch):
    coordinator, token, model, paths = same_model
    monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", token)
    # the cells really named the model by two paths
    jobs, _ = fetch_table(admin_for(coordinator), "jobs")
    specs = " ".join(jobs.column("spec").to_pylist())
    assert all(path in specs for path in paths.values())
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    name = f"target.gguf@{model.digest[:12]}"
    assert at.sidebar.multiselect(key="compare-model").options == [name]
    assert len(at.selectbox(key="compare-group").options) == 1
    speedups = frame(at, "ci_low", "method", "depth")
    assert speedups["machines"].tolist() == [2] and speedups["pairs"].tolist() == [2 * PROMPTS * 2]
    roof = frame(at, "share")
    assert roof["model"].tolist() == [name] and roof["machines"].tolist() == [2]
    assert not any(path in texts(at) for path in paths.values())
    at.switch_page("views/runs.py").run()
    shown = at.dataframe[0].value
    assert set(shown["model"]) == {name} and set(shown["target_reference"]) == {"target.gguf"}
    assert shown["agent_id"].nunique() == 2
    assert not shown.astype(str).apply(lambda column: column.str.contains("/opt/llm")).any().any()

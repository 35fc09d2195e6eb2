"""Every dashboard page against a live coordinator seeded, through its real API, with synthetic
but plausible results from several chips."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from protos.specfleet.v1 import fleet_pb2 as pb
from tests.fleet import admin_for, enrol, make_run, start_coordinator

APP = "../dashboard/app.py"
GREEDY = "temperature=0.0,top_p=1.0,top_k=0,seed=0"
MLX_27B = "/models/Qwen3.6-27B-MTPLX-Optimized-Speed"
GGUF_9B = "/models/Qwen3.5-9B-MTP-Q4_K_M.gguf"


def fingerprint(host, chip, gpu, gib, bandwidth_gbps=0.0):
    return pb.Fingerprint(
        hostname=host,
        os="macos",
        os_version="26.4.1",
        chip=chip,
        gpu_cores=gpu,
        memory_bytes=gib * 2**30,
        model_identifier="Mac16,11",
        memory_bandwidth_bytes_per_second=bandwidth_gbps * 1e9,
    )


# name, fingerprint, engine, model, baseline tok/s, {depth: speedup}, prompts, repeats, extra params
MACHINES = (
    (
        "mini-1",
        fingerprint("mini-1", "Apple M4 Pro", 20, 48, 273),
        "mlx",
        MLX_27B,
        12.0,
        {1: 1.9, 2: 2.3, 3: 2.6, 4: 2.1},
        2,
        3,
    ),
    (
        "mini-2",
        fingerprint("mini-2", "Apple M4 Pro", 20, 64, 273),
        "mlx",
        MLX_27B,
        11.6,
        {1: 1.85, 2: 2.25, 3: 2.55, 4: 2.0},
        2,
        3,
    ),
    ("mbp", fingerprint("mbp", "Apple M1 Max", 24, 32), "llama.cpp", GGUF_9B, 25.3, {2: 0.87}, 2, 3),
    ("studio", fingerprint("studio", "Apple M5 Max", 40, 128, 614), "mlx", MLX_27B, 29.7, {3: 1.86}, 1, 2),
)
COLLAPSE = "1 of 64 mtp proposals accepted (1.6%, below 3%): check the MTP head"
MODEL_BYTES = {MLX_27B: 15.2e9}  # reported for the MLX model only: the GGUF's roofline is "not available"


def sweep_yaml(name: str, engine: str, model: str, max_attempts: int = 2) -> str:
    return (
        f"name: seed-{name}\ntarget: {{agents: [{name}]}}\nmodels: {{{engine}: {{target: {model}}}}}\n"
        f"engines: [{engine}]\nprompt_sets: [code]\nmethods: {{ngram: [3]}}\nrepeats: 1\n"
        f"max_attempts: {max_attempts}\n"
    )


def seed_fleet(coordinator) -> pd.DataFrame:
    """Enrol the machines above and report their runs through the agent API. Returns what was
    reported (the truth the tests compare the pages with)."""
    admin = admin_for(coordinator)
    rng = np.random.default_rng(7)
    truth = []
    for name, fp, engine, model, base_tps, arms, prompts, repeats in MACHINES:
        agent = enrol(coordinator, name, fp, engines=[engine])
        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=sweep_yaml(name, engine, model)))
        job = agent.acquire_job(30).job
        assert job.job_id, f"{name} was offered no job"
        params = {"sampler": GREEDY, "prompt_set": "code", "model.target": model}
        if model in MODEL_BYTES:
            params["model.target.bytes"] = str(MODEL_BYTES[model])
        runs = []
        for repeat in range(repeats):
            for p in range(prompts):
                # mini-2's first repeat ran hot: flagged by the agent, excluded and counted by the dashboard
                degraded = name == "mini-2" and repeat == 0
                run_params = {**params, "env.nominal": "false" if degraded else "true"}
                base = base_tps * (1 + rng.normal(0, 0.01))
                runs.append(("baseline", 0, base, None, run_params, p, repeat))
                if name == "mbp":  # its MTP head was converted badly: the agent flagged every run
                    run_params = {**run_params, "acceptance.collapsed": "true", "acceptance.reason": COLLAPSE}
                for depth, ratio in arms.items():
                    tps = base * ratio * (1 + rng.normal(0, 0.02))
                    accept = {f"acceptance_at_position_{i}": 0.9 - 0.15 * i for i in range(1, depth + 1)}
                    accept.update(acceptance_rate=0.8 - 0.05 * depth, draft_seconds=0.3 * depth, verify_seconds=2.0)
                    runs.append(("mtp", depth, tps, accept, run_params, p, repeat))
        for method, depth, tps, metrics, run_params, p, repeat in runs:
            run = make_run(
                job.job_id,
                method,
                depth,
                tps,
                engine=engine,
                prompt_id=f"code-{p}",
                repeat=repeat,
                generated_tokens=256,
                metrics=metrics or {},
                params=run_params,
            )
            agent.report_result(job.job_id, job.lease_id, run)
            truth.append(
                dict(
                    agent=name,
                    chip=fp.chip,
                    engine=engine,
                    method=method,
                    depth=depth,
                    tps=tps,
                    prompt=p,
                    repeat=repeat,
                    degraded=run_params["env.nominal"] == "false",
                )
            )
        vc = {f"rows_{m}_ratio": 1 + 0.3 * (m - 1) * (1 if engine == "mlx" else 1.4) for m in range(1, 9)}
        vc |= {f"rows_{m}_seconds": 0.02 * r for m, r in ((int(k.split("_")[1]), r) for k, r in vc.items())}
        agent.report_result(
            job.job_id,
            job.lease_id,
            make_run(
                job.job_id,
                "verify-cost",
                0,
                0.0,
                engine=engine,
                prompt_id="context-512",
                prompt_tokens=512,
                generated_tokens=0,
                decode_seconds=0.0,
                metrics=vc,
                params=params,
            ),
        )
        agent.complete_job(job.job_id, job.lease_id, len(runs) + 1)
    # A sweep whose only cell failed, with its reason, for the Sweeps page.
    agent = enrol(coordinator, "air", fingerprint("air", "Apple M2", 8, 16), engines=["mlx"])
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=sweep_yaml("air", "mlx", MLX_27B, max_attempts=1)))
    job = agent.acquire_job(30).job
    assert job.job_id, "air was offered no job"
    assert not agent.fail_job(job.job_id, job.lease_id, "Metal out of memory loading the target").will_retry
    return pd.DataFrame(truth)


def expected_speedup(truth: pd.DataFrame, chip: str, depth: int) -> float:
    """Median paired ratio computed independently of dashboard/stats.py."""
    t = truth[(truth["chip"] == chip) & ~truth["degraded"]]
    base = t[t["method"] == "baseline"].set_index(["agent", "prompt", "repeat"])["tps"]
    arm = t[(t["method"] == "mtp") & (t["depth"] == depth)].set_index(["agent", "prompt", "repeat"])["tps"]
    return float(np.median((arm / base.reindex(arm.index)).to_numpy()))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    coordinator = start_coordinator(tmp_path_factory.mktemp("coordinator"))
    truth = seed_fleet(coordinator)
    token = admin_for(coordinator)._metadata[0][1].removeprefix("Bearer ")
    yield coordinator, token, truth
    coordinator.stop()


@pytest.fixture
def app(fleet, monkeypatch):
    coordinator, token, truth = fleet
    monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", token)

    def open_page(page: str | None = None) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=60).run()
        if page:
            at.switch_page(f"views/{page}.py").run()
        assert not at.exception, at.exception
        return at

    open_page.truth = truth
    return open_page


def frame(at: AppTest, *columns: str) -> pd.DataFrame:
    """The one dataframe on the page holding these columns."""
    found = [d.value for d in at.dataframe if set(columns) <= set(d.value.columns)]
    assert len(found) == 1, [list(d.value.columns) for d in at.dataframe]
    return found[0]


def texts(at: AppTest) -> str:
    return " ".join(
        str(e.value)
        for kind in ("markdown", "caption", "info", "warning", "error", "title", "subheader")
        for e in getattr(at, kind)
    )


def test_fleet_page_lists_agents_with_chip_bin_memory_os(app):
    at = app()  # the default page
    assert at.title[0].value == "Fleet"
    agents = at.dataframe[0].value.set_index("name")
    assert sorted(agents.index) == ["air", "mbp", "mini-1", "mini-2", "studio"]
    assert agents.loc["mbp", "chip"] == "Apple M1 Max" and agents.loc["mbp", "gpu_cores"] == 24
    assert agents.loc["mini-2", "memory_gib"] == 64.0 and agents.loc["studio", "os_version"] == "26.4.1"
    assert agents.loc["mini-1", "bandwidth_gb_per_s"] == 273.0
    assert set(agents["state"]) == {"idle"}
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["agents"] == "5" and metrics["chips"] == "4"
    per_chip = at.dataframe[1].value.set_index("chip")["machines"]
    assert per_chip["Apple M4 Pro"] == 2 and per_chip["Apple M1 Max"] == 1


def test_sweeps_page_shows_progress_and_failures_with_reasons(app):
    at = app("sweeps")
    bars = {b.proto.text.split(" · ")[0]: b for b in at.get("progress")}
    assert len(at.get("progress")) == 5
    assert "1 of 1 cells done" in bars and "0 of 1 cells done" in bars
    failed = [b.proto.text for b in at.get("progress") if "1 failed" in b.proto.text]
    assert len(failed) == 1
    assert "1 cell(s) failed in seed-air" in texts(at)
    failures = at.dataframe[0].value
    assert failures["reason"].str.contains("Metal out of memory").all() and failures["agent"].tolist() == ["air"]
    table = at.dataframe[1].value.set_index("name")
    assert table.loc["seed-mini-1", "runs"] == 2 * 3 * 5 + 1 and table.loc["seed-air", "failed"] == 1


def test_compare_page_speedups_with_machines_runs_and_exclusions(app):
    at = app("compare")
    truth = app.truth
    speedups = frame(at, "ci_low", "method", "depth").set_index(["chip", "depth"])
    m4 = speedups.loc[("Apple M4 Pro", 3)]
    assert m4["median"] == pytest.approx(expected_speedup(truth, "Apple M4 Pro", 3))
    assert m4["ci_low"] < m4["median"] < m4["ci_high"]
    assert m4["machines"] == 2 and m4["runs"] == 2 * 3 + 2 * 2  # mini-2's hot repeat left out
    assert m4["excluded_runs"] == 2
    assert speedups.loc[("Apple M1 Max", 2), "median"] == pytest.approx(expected_speedup(truth, "Apple M1 Max", 2))
    degraded = int(truth["degraded"].sum())
    assert any(f"{degraded} run(s) flagged thermally or power degraded" in w.value for w in at.warning)
    assert any(
        w.value.startswith("Acceptance collapsed on Apple M1 Max · llama.cpp · mtp") and COLLAPSE in w.value
        for w in at.warning
    )
    assert not any("Acceptance collapsed on Apple M4 Pro" in w.value for w in at.warning)
    # the GGUF reports no model size: its roofline share says so instead of guessing
    assert any("Roofline share not available for Apple M1 Max" in w.value for w in at.warning)
    roof = frame(at, "share").set_index("chip")
    nominal = truth[(truth["chip"] == "Apple M4 Pro") & (truth["method"] == "baseline") & ~truth["degraded"]]
    assert roof.loc["Apple M4 Pro", "share"] == pytest.approx(nominal["tps"].median() * 15.2e9 / 273e9)
    assert np.isnan(roof.loc["Apple M1 Max", "share"])
    # every figure shown says how many machines stand behind it
    for columns in (("arm", "median"), ("position", "acceptance"), ("phase", "ms"), ("rows", "ratio")):
        assert (frame(at, *columns)["machines"] >= 1).all()
    charts = at.get("vega_lite_chart")
    assert len(charts) == 6  # speedup, decode, acceptance, draft/verify, verify cost, roofline
    # one chip -> colour mapping on every chart
    scales = set()
    for chart in charts:
        spec = chart.proto.spec
        start = spec.index('"domain"', spec.index('"color"'))
        scales.add(spec[start : spec.index("]", spec.index('"range"', start)) + 1])
    assert len(scales) == 1


def test_compare_filters_narrow_every_figure(app):
    at = app("compare")
    at.sidebar.multiselect(key="compare-engine").select("llama.cpp").run()
    assert not at.exception, at.exception
    speedups = frame(at, "ci_low", "method", "depth")
    assert set(speedups["chip"]) == {"Apple M1 Max"} and set(speedups["engine"]) == {"llama.cpp"}


def test_questions_page_verdicts_per_claim_and_chip(app):
    at = app("questions")
    truth = app.truth
    verdicts = at.dataframe[0].value.set_index(["claim", "chip"])
    row = verdicts.loc[("mtplx-m4-pro-2.6x", "Apple M4 Pro")]
    assert row["verdict"] == "reproduced"
    assert row["figure"] == pytest.approx(expected_speedup(truth, "Apple M4 Pro", 3))
    assert row["machines"] == 2 and row["runs"] == 10 and row["excluded_runs"] == 2
    assert verdicts.loc[("optiq-depth-k3", "Apple M4 Pro"), "verdict"] == "contradicted"
    assert verdicts.loc[("llamacpp-mtp-m1-max-net-loss-n2", "Apple M1 Max"), "verdict"] == "reproduced"
    studio = verdicts.loc[("mtplx-m5-max-55.4-vs-29.7", "Apple M5 Max")]
    assert studio["verdict"] == "not enough data" and studio["machines"] == 1 and studio["runs"] == 2
    assert verdicts.loc[("llamacpp-mtp-m1-max-net-loss-n6", "Apple M1 Max"), "verdict"] == "not enough data"
    assert verdicts.loc[("depth-1-3-optimal-on-metal", "Apple M4 Pro"), "figure"] == 3
    assert verdicts.loc[("no-mac-ngram-mod-benchmark", "any Mac"), "verdict"] == "reproduced"
    page = texts(at)
    assert "**Apple M4 Pro**: :green-badge[reproduced]" in page and "2 machine(s), 10 run(s)" in page
    assert ":red-badge[contradicted]" in page and ":gray-badge[not enough data]" in page
    counts = {m.label: int(m.value) for m in at.metric}
    assert counts["reproduced"] == (verdicts["verdict"] == "reproduced").sum() > 0
    # every claim offers its sweep, and the coordinator accepts every one (MTP included)
    assert len(at.code) == len(at.expander) > 10
    assert not any("refuses this sweep today" in w.value for w in at.warning)


def test_questions_page_names_the_field_of_a_malformed_claim(app, tmp_path, monkeypatch):
    ledger = tmp_path / "claims.yaml"
    ledger.write_text(
        "- id: mine\n  statement: Drafting wins.\n  source: {file: notes.txt, section: top}\n"
        "  conditions: {engine: mlx, method: draft, depth: 2}\n  metric: speedup\n  expected: 1.2x\n"
        "  verdict: {rule: range, low: 1.1}\n"
    )
    monkeypatch.setenv("SPECFLEET_CLAIMS", str(ledger))
    at = app("questions")
    assert len(at.error) == 1 and "claims[0] (mine).verdict.high: is required for rule range" in at.error[0].value
    assert str(ledger) in at.error[0].value


def test_a_claim_added_to_the_ledger_is_settled_on_the_page(app, tmp_path, monkeypatch):
    ledger = tmp_path / "claims.yaml"
    ledger.write_text(
        "- id: m1-mtp-k2-loss\n  statement: MTP at depth 2 loses on an M1 Max.\n"
        "  source: {file: notes.txt, section: top, quote: loses}\n"
        "  conditions: {engine: llama.cpp, method: mtp, chip: Apple M1 Max, depth: 2}\n"
        "  metric: speedup\n  expected: below 1\n  verdict: {rule: below, threshold: 1.0}\n"
    )
    monkeypatch.setenv("SPECFLEET_CLAIMS", str(ledger))
    at = app("questions")
    verdicts = at.dataframe[0].value
    assert verdicts["claim"].tolist() == ["m1-mtp-k2-loss"] and verdicts["verdict"].tolist() == ["reproduced"]
    assert verdicts["figure"][0] == pytest.approx(expected_speedup(app.truth, "Apple M1 Max", 2))
    assert "MTP at depth 2 loses on an M1 Max." in [h.value for h in at.subheader]


def test_runs_page_every_parameter_and_downloads(app):
    at = app("runs")
    runs = at.dataframe[0].value
    truth = app.truth
    assert len(runs) == len(truth) + 4  # and one verify-cost run per machine
    for column in ("param.env.nominal", "param.sampler", "param.model.target", "metric.acceptance_rate", "nominal"):
        assert column in runs.columns
    assert (runs["nominal"] == "degraded").sum() == truth["degraded"].sum()
    assert any("flagged thermally or power degraded" in w.value for w in at.warning)
    at.multiselect(key="runs-chip").select("Apple M1 Max").run()
    narrowed = at.dataframe[0].value
    assert set(narrowed["chip"]) == {"Apple M1 Max"} and len(narrowed) == 3 * 2 * 2 + 1
    buttons = at.get("download_button")
    assert [b.proto.label for b in buttons] == ["Download CSV", "Download Parquet"]


def test_runs_downloads_are_csv_and_parquet(app):
    """The bytes behind the buttons hold the table shown, column for column."""
    from dashboard import data

    shown = app("runs").dataframe[0].value
    csv, parquet = data.downloads(shown)
    from_csv, from_parquet = pd.read_csv(io.BytesIO(csv)), pd.read_parquet(io.BytesIO(parquet))
    assert list(from_csv.columns) == list(from_parquet.columns) == list(shown.columns)
    assert len(from_csv) == len(from_parquet) == len(shown)
    assert sorted(from_parquet["run_id"]) == sorted(shown["run_id"])
    assert from_csv["param.env.nominal"].astype(str).str.lower().tolist() == shown["param.env.nominal"].tolist()


def test_empty_coordinator_says_what_to_do(tmp_path, monkeypatch):
    coordinator = start_coordinator(tmp_path)
    try:
        admin = admin_for(coordinator)
        monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
        monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", admin._metadata[0][1].removeprefix("Bearer "))
        seen = []
        for page in (None, "sweeps", "compare", "questions", "runs"):
            at = AppTest.from_file(APP, default_timeout=60).run()
            if page:
                at.switch_page(f"views/{page}.py").run()
            assert not at.exception, (page, at.exception)
            seen.append(texts(at))
        assert "No agent has enrolled yet" in seen[0] and "No sweep yet" in seen[1]
        assert "No results yet" in seen[2] and "No results yet" in seen[4]
        assert "not enough data" in seen[3]
    finally:
        coordinator.stop()

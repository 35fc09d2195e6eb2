"""Every dashboard page against a live coordinator seeded, through its real API, with synthetic
but plausible results from several chips."""

from __future__ import annotations

import dataclasses
import hashlib
import io

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.record import ModelIdentity, RunRecord, Sampler
from tests.fleet import admin_for, enrol, run_record, setting_changes, start_coordinator

APP = "../dashboard/app.py"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


MLX_27B = ModelIdentity(
    reference="Youssofal/Qwen3.6-27B-MTPLX-Optimized-Speed",
    revision="0123abcd",
    digest=sha("mlx-27b"),
    architecture="Qwen3_5ForCausalLM",
    parameters=27_300_000_000,
    quantisation="4bit-g64",
    has_mtp=True,
    bytes=15_200_000_000,
    source="huggingface",
)
# Records no size: its roofline share is "not available".
GGUF_9B = ModelIdentity(
    reference="Qwen3.5-9B-MTP-Q4_K_M.gguf",
    digest=sha("gguf-9b"),
    architecture="qwen35",
    parameters=9_400_000_000,
    quantisation="Q4_K_M",
    has_mtp=True,
    source="local",
)
PATHS = {MLX_27B: "/models/Qwen3.6-27B-MTPLX-Optimized-Speed", GGUF_9B: "/models/Qwen3.5-9B-MTP-Q4_K_M.gguf"}
VERSIONS = {
    "mlx": "mlx=0.29.1 mlx-lm=0.28.0",
    "llama.cpp": "llama-cpp-python=0.3.16",
    "llama-server": "httpx=0.28.1 llama-server=9330",
    "openai": "httpx=0.28.1",
}


def record(job_id: str, method: str = "baseline", depth: int = 0, tps: float = 100.0, **fields) -> RunRecord:
    """tests/fleet.py's run record with this fleet's defaults (the MLX 27B model, 256 new
    tokens, nominal readings); `fields` replace any field."""
    generated = fields.pop("generated_tokens", 256)
    engine = fields.get("engine", "mlx")
    values = dict(
        engine_version=VERSIONS[engine],
        target=MLX_27B,
        prompt_set_digest=sha("code"),
        max_new_tokens=256,
        prompt_tokens=200,
        generated_tokens=generated,
        prefill_seconds=0.1,
        ttft_seconds=0.1,
        decode_seconds=generated / tps if tps else 0.0,
        wall_seconds=0.1 + (generated / tps if tps else 0.0),
        peak_memory_bytes=10**9,
        output_sha256=sha("output"),
        started_at_unix_seconds=1.77e9,
        env_nominal=True,
    )
    values.update(fields)
    return run_record(job_id, method, depth, tps, **values)


def row(r: RunRecord, agent: str, chip: str, lease: str | None = None, seq: int = 0) -> dict:
    """A run as the coordinator stores it: the record's columns and the coordinator's."""
    return {
        **r.row(),
        "lease_id": lease or f"lease-{r.job_id}",
        "sweep_id": "sweep",
        "agent_id": agent,
        "chip": chip,
        "record_sha256": sha(r.to_json()),
        "ingested_at": 1.77e9,
        "seq": seq,
    }


# One way to differ from record()'s defaults in each checked key and in nothing else; for
# `system`, nothing else but the engine: a run of another system than our loops is a server's
# (specfleet/record.py ties in-process engines to "specfleet"), so its variant is an
# OpenAI-compatible server's run, and tests/test_claims.py also keeps two such servers apart.
VARIANTS = {
    "target_digest": dict(target=dataclasses.replace(MLX_27B, digest=sha("another build"))),
    "draft_digest": dict(draft=ModelIdentity(reference="Qwen3.5-0.8B-draft", digest=sha("draft"))),
    "engine": dict(engine="llama.cpp", engine_version=VERSIONS["mlx"]),
    "engine_version": dict(engine_version="mlx=0.30.0 mlx-lm=0.29.0"),
    "system": dict(engine="openai", engine_version=VERSIONS["mlx"], system="MTPLX"),
    "sampler_temperature": dict(sampler=Sampler(temperature=0.7)),
    "sampler_top_p": dict(sampler=Sampler(top_p=0.9)),
    "sampler_top_k": dict(sampler=Sampler(top_k=20)),
    "sampler_seed": dict(sampler=Sampler(seed=1)),
    "prompt_set_digest": dict(prompt_set_digest=sha("code, second edition")),
    "context_tokens": dict(context_tokens=4096),
    "max_new_tokens": dict(max_new_tokens=128),
    "power_mode": dict(power_mode="high"),  # from unknown: High Power runs are never pooled with them
    "backend": dict(backend="cuda"),
    "server_version": dict(server_version="version: 9999 (0c1e570)"),
    **setting_changes(),  # every declared setting the record carries (specfleet/settings.py)
}


def speculative(depth: int, collapsed: bool = False) -> dict:
    """What an MTP arm at `depth` records: proposals and their acceptance by position."""
    drafted = 64 * depth
    return dict(
        rounds=64,
        tokens_drafted=drafted,
        tokens_accepted=round(drafted * (0.8 - 0.05 * depth)),
        drafted_by_position=(64,) * depth,
        acceptance_by_position=tuple(round(0.9 - 0.15 * i, 2) for i in range(1, depth + 1)),
        draft_seconds=0.3 * depth,
        verify_seconds=2.0,
        acceptance_collapsed=collapsed,
        acceptance_reason=COLLAPSE if collapsed else "",
    )


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


# name, fingerprint, engine, model, baseline tok/s, {depth: speedup}, prompts, repeats
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


def sweep_yaml(name: str, engine: str, model: str, max_attempts: int = 2) -> str:
    return (
        f"name: seed-{name}\ntarget: {{agents: [{name}]}}\nmodels: {{{engine}: {{target: {model}}}}}\n"
        f"engines: [{engine}]\nprompt_sets: [code]\nmethods: {{ngram: [3]}}\nrepeats: 1\n"
        f"max_attempts: {max_attempts}\n"
    )


def report(agent, job, records) -> None:
    """Upload records as the agent does: RunRecord JSON through ReportResult."""
    for r in records:
        assert not agent.report_result(job.job_id, job.lease_id, r.to_json()).duplicate


def seed_fleet(coordinator) -> pd.DataFrame:
    """Enrol the machines above and report their runs through the agent API. Returns what was
    reported (the truth the tests compare the pages with)."""
    admin = admin_for(coordinator)
    rng = np.random.default_rng(7)
    truth = []
    for name, fp, engine, model, base_tps, arms, prompts, repeats in MACHINES:
        agent = enrol(coordinator, name, fp, engines=[engine])
        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=sweep_yaml(name, engine, PATHS[model])))
        job = agent.acquire_job(30).job
        assert job.job_id, f"{name} was offered no job"
        records = []
        for repeat in range(repeats):
            for p in range(prompts):
                # mini-2's first repeat ran hot: flagged by the agent, excluded and counted by the dashboard
                degraded = name == "mini-2" and repeat == 0
                common = dict(
                    engine=engine,
                    target=model,
                    prompt_id=f"code-{p + 1:02d}",
                    repeat=repeat,
                    env_nominal=not degraded,
                    env_reasons=("thermal: serious",) if degraded else (),
                )
                base = base_tps * (1 + rng.normal(0, 0.01))
                records.append(record(job.job_id, "baseline", 0, base, **common))
                for depth, ratio in arms.items():
                    tps = base * ratio * (1 + rng.normal(0, 0.02))
                    # mbp's MTP head was converted badly: the agent flagged every arm run
                    records.append(record(job.job_id, "mtp", depth, tps, **common, **speculative(depth, name == "mbp")))
        for r in records:
            truth.append(
                dict(
                    agent=name,
                    chip=fp.chip,
                    engine=engine,
                    method=r.method,
                    depth=r.depth,
                    tps=r.decode_tokens_per_second,
                    prompt=r.prompt_id,
                    repeat=r.repeat,
                    degraded=r.env_nominal is False,
                )
            )
        curve = tuple(0.02 * (1 + 0.3 * (m - 1) * (1 if engine == "mlx" else 1.4)) for m in range(1, 9))
        records.append(
            record(
                job.job_id,
                "verify-cost",
                0,
                0.0,
                engine=engine,
                target=model,
                prompt_id="context-512",
                context_tokens=512,
                prompt_tokens=512,
                generated_tokens=0,
                verify_cost_seconds=curve,
            )
        )
        report(agent, job, records)
        agent.complete_job(job.job_id, job.lease_id, len(records))
    # A sweep whose only cell failed, with its reason, for the Sweeps page.
    agent = enrol(coordinator, "air", fingerprint("air", "Apple M2", 8, 16), engines=["mlx"])
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=sweep_yaml("air", "mlx", PATHS[MLX_27B], max_attempts=1)))
    job = agent.acquire_job(30).job
    assert job.job_id, "air was offered no job"
    assert not agent.fail_job(job.job_id, job.lease_id, "Metal out of memory loading the target").will_retry
    return pd.DataFrame(truth)


def expected_speedup(truth: pd.DataFrame, chip: str, depth: int) -> float:
    """specfleet's speedup worked out independently of the SQL: the log ratio of each nominal
    pair, its mean over repeats, then over a machine's prompts, then over machines, exponentiated."""
    t = truth[(truth["chip"] == chip) & ~truth["degraded"]]
    key = ["agent", "prompt", "repeat"]
    base = t[t["method"] == "baseline"].set_index(key)["tps"]
    arm = t[(t["method"] == "mtp") & (t["depth"] == depth)].set_index(key)["tps"]
    logs = np.log(arm / base.reindex(arm.index)).dropna()
    per_prompt = logs.groupby(level=["agent", "prompt"]).mean()
    return float(np.exp(per_prompt.groupby(level="agent").mean().mean()))


def group_ids(at: AppTest) -> dict[str, str]:
    """Label -> comparable group id of the Compare page's selector."""
    return {label: label.rsplit("group ", 1)[1] for label in at.selectbox(key="compare-group").options}


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


def test_compare_page_speedups_with_machines_prompts_pairs_and_exclusions(app):
    at = app("compare")
    truth = app.truth
    # it opens on the comparable group with most runs: the MLX model on three machines
    labels = group_ids(at)
    assert len(labels) == 2
    chosen = at.selectbox(key="compare-group").value
    mlx = next(g for label, g in labels.items() if label.startswith("specfleet mlx · "))  # the system first
    assert chosen == mlx
    assert "they differ in target_digest, engine, engine_version" in texts(at)
    speedups = frame(at, "ci_low", "method", "depth").set_index(["chip", "depth"])
    assert set(speedups["comparable"]) == {mlx} and set(speedups["engine"]) == {"mlx"}
    assert set(speedups["model"]) == {f"{MLX_27B.reference}@{MLX_27B.digest[:12]}"}
    m4 = speedups.loc[("Apple M4 Pro", 3)]
    assert m4["speedup"] == pytest.approx(expected_speedup(truth, "Apple M4 Pro", 3))
    assert m4["ci_low"] < m4["speedup"] < m4["ci_high"]
    assert (m4["machines"], m4["prompts"], m4["pairs"]) == (2, 2, 2 * 3 + 2 * 2)  # mini-2's hot repeat left out
    assert m4["excluded_pairs"] == 2
    assert speedups.loc[("Apple M5 Max", 3), "speedup"] == pytest.approx(expected_speedup(truth, "Apple M5 Max", 3))
    assert "Apple M1 Max" not in speedups.index.get_level_values("chip")  # another group
    degraded = int(truth["degraded"].sum())
    assert any(f"{degraded} run(s) flagged thermally or power degraded" in w.value for w in at.warning)
    assert not any("Acceptance collapsed" in w.value for w in at.warning)
    roof = frame(at, "share").set_index("chip")
    nominal = truth[(truth["chip"] == "Apple M4 Pro") & (truth["method"] == "baseline") & ~truth["degraded"]]
    assert roof.loc["Apple M4 Pro", "share"] == pytest.approx(nominal["tps"].median() * 15.2e9 / 273e9)
    assert roof.loc["Apple M4 Pro", "model"] == f"{MLX_27B.reference}@{MLX_27B.digest[:12]}"
    # acceptance by position, read from acceptance_by_position
    acceptance = frame(at, "position", "acceptance").set_index(["chip", "depth", "position"])
    assert acceptance.loc[("Apple M4 Pro", 3, 2), "acceptance"] == pytest.approx(0.6)
    assert acceptance.loc[("Apple M4 Pro", 3, 2), "runs"] == 2 * 3 + 2 * 2
    # verify cost from verify_cost_seconds, at the run's context depth
    cost = frame(at, "rows", "ratio").set_index(["chip", "rows"])
    assert set(cost["context_tokens"]) == {512} and set(cost["engine"]) == {"mlx"}
    assert (
        cost.loc[("Apple M4 Pro", 4), "ratio"] == pytest.approx(1.9) and cost.loc[("Apple M4 Pro", 4), "machines"] == 2
    )
    # every figure shown says how many machines, prompts and runs stand behind it
    for columns in (("arm", "median"), ("position", "acceptance"), ("phase", "ms"), ("share",)):
        figures = frame(at, *columns)
        assert (figures["machines"] >= 1).all() and (figures["prompts"] >= 1).all() and (figures["runs"] >= 1).all()
    charts = at.get("vega_lite_chart")
    assert len(charts) == 6  # speedup, decode, acceptance, draft/verify, verify cost, roofline
    # one chip -> colour mapping on every chart
    scales = set()
    for chart in charts:
        spec = chart.proto.spec
        start = spec.index('"domain"', spec.index('"color"'))
        scales.add(spec[start : spec.index("]", spec.index('"range"', start)) + 1])
    assert len(scales) == 1


def test_compare_page_switches_to_another_group(app):
    at = app("compare")
    truth = app.truth
    gguf = next(g for label, g in group_ids(at).items() if label.startswith("specfleet llama.cpp · "))
    label = next(label for label, g in group_ids(at).items() if g == gguf)
    assert f"{GGUF_9B.reference}@{GGUF_9B.digest[:12]}" in label and "no draft" in label and "greedy" in label
    at.selectbox(key="compare-group").select(gguf).run()
    assert not at.exception, at.exception
    speedups = frame(at, "ci_low", "method", "depth").set_index(["chip", "depth"])
    assert set(speedups["comparable"]) == {gguf} and list(speedups.index) == [("Apple M1 Max", 2)]
    assert speedups.loc[("Apple M1 Max", 2), "speedup"] == pytest.approx(expected_speedup(truth, "Apple M1 Max", 2))
    assert set(speedups["system_label"]) == {"specfleet llama.cpp"}
    assert "System under test: **specfleet llama.cpp**" in texts(at)
    assert any(
        w.value.startswith("Acceptance collapsed on Apple M1 Max · llama.cpp · mtp") and COLLAPSE in w.value
        for w in at.warning
    )
    # the GGUF records no model size: its roofline share says so instead of guessing
    assert any("Roofline share not available for Apple M1 Max" in w.value for w in at.warning)
    roof = frame(at, "share").set_index("chip")
    assert list(roof.index) == ["Apple M1 Max"] and np.isnan(roof.loc["Apple M1 Max", "share"])
    assert set(frame(at, "arm", "median")["chip"]) == {"Apple M1 Max"}
    assert set(frame(at, "rows", "ratio")["engine"]) == {"llama.cpp"}
    # filters that leave the chosen group out: the page falls back to a group they keep
    at.sidebar.multiselect(key="compare-engine").select("mlx").run()
    assert not at.exception, at.exception
    assert set(frame(at, "ci_low", "method", "depth")["engine"]) == {"mlx"}


def test_compare_filters_narrow_every_figure(app):
    at = app("compare")
    at.sidebar.multiselect(key="compare-engine").select("llama.cpp").run()
    assert not at.exception, at.exception
    assert len(at.selectbox(key="compare-group").options) == 1
    speedups = frame(at, "ci_low", "method", "depth")
    assert set(speedups["chip"]) == {"Apple M1 Max"} and set(speedups["engine"]) == {"llama.cpp"}


def test_models_are_named_by_reference_and_digest_never_by_path(app):
    at = app("compare")
    models = at.sidebar.multiselect(key="compare-model").options
    assert sorted(models) == sorted(f"{m.reference}@{m.digest[:12]}" for m in (MLX_27B, GGUF_9B))
    assert not any("/models/" in label for label in group_ids(at))


def test_questions_page_settles_claims_only_with_the_system_they_name(app):
    """The shipped ledger on a fleet that ran only specfleet's own loops: a claim about MTPLX or
    llama-server is inconclusive for want of runs of that system, with our loop's figure on the
    same model beside it (never as the verdict); an absence claim holds."""
    at = app("questions")
    truth = app.truth
    verdicts = at.dataframe[0].value.set_index(["claim", "chip"])
    mtplx = verdicts.loc[("mtplx-m4-pro-2.6x", "Apple M4 Pro")]
    assert mtplx["verdict"] == "inconclusive" and mtplx["runs"] == 0
    assert "no runs of MTPLX (openai) mtp" in mtplx["why"]
    ours = f"{expected_speedup(truth, 'Apple M4 Pro', 3):.3g}"
    assert mtplx["beside"].startswith(f"our loop, same weights (specfleet mlx mtp) on Apple M4 Pro: {ours} [")
    assert "2 machine(s)" in mtplx["beside"]
    loss = verdicts.loc[("llamacpp-mtp-m1-max-net-loss-n2", "Apple M1 Max")]
    assert "no runs of llama-server draft-mtp" in loss["why"] and loss["runs"] == 0
    m1 = f"{expected_speedup(truth, 'Apple M1 Max', 2):.3g}"  # the bug report's claim, our llama.cpp loop beside
    assert loss["beside"].startswith(f"our loop, same weights (specfleet llama.cpp mtp) on Apple M1 Max: {m1} [")
    page = texts(at)
    assert "system **MTPLX (openai) mtp**" in page and "system **llama-server draft-mtp**" in page
    assert "Beside the verdict, never as it: our loop, same weights" in page
    assert verdicts.loc[("no-mac-ngram-mod-benchmark", "any Mac"), "verdict"] == "reproduced"
    assert not (verdicts["verdict"] == "contradicted").any()  # nothing is settled by runs of another system
    assert ":gray-badge[inconclusive: not enough data]" in texts(at)
    # every claim offers its sweep, and the coordinator accepts every one (MTP included)
    assert len(at.code) == len(at.expander) > 10
    assert not any("refuses this sweep today" in w.value for w in at.warning)


def test_questions_page_verdicts_decided_by_the_interval(app, tmp_path, monkeypatch):
    """Claims on the fleet's own runs (specfleet's loop, the MLX 27B model on two M4 Pros):
    reproduced when the interval lies inside the band, contradicted when wholly outside, each
    with the machines, prompts and pairs behind it, and the adjusted verdict beside it."""
    ledger = tmp_path / "claims.yaml"
    model = "Youssofal/Qwen3.6-27B-MTPLX-Optimized-Speed"
    claim = (
        "- id: {id}\n  statement: our loop at depth 3.\n  source: {{file: notes.txt, section: top, quote: q}}\n"
        "  conditions: {{engine: mlx, method: mtp, models: [{model}], chip: Apple M4 Pro, depth: 3}}\n"
        "  metric: speedup\n  expected: x\n  verdict: {{rule: range, low: {low}, high: {high}}}\n"
    )
    ledger.write_text(
        claim.format(id="wide-band", model=model, low=0.1, high=100)
        + claim.format(id="far-band", model=model, low=100, high=200)
    )
    monkeypatch.setenv("SPECFLEET_CLAIMS", str(ledger))
    at = app("questions")
    truth = app.truth
    verdicts = at.dataframe[0].value.set_index(["claim", "chip"])
    wide, far = verdicts.loc[("wide-band", "Apple M4 Pro")], verdicts.loc[("far-band", "Apple M4 Pro")]
    assert wide["verdict"] == "reproduced" and far["verdict"] == "contradicted"
    assert wide["ci_low"] < wide["figure"] < wide["ci_high"]
    assert wide["figure"] == pytest.approx(expected_speedup(truth, "Apple M4 Pro", 3))
    assert (wide["machines"], wide["prompts"], wide["runs"], wide["excluded_runs"]) == (2, 2, 10, 2)
    assert wide["differs"] == "" and len(wide["group"]) == 12
    assert {wide["adjusted_verdict"], far["adjusted_verdict"]} == {"reproduced", "contradicted"}
    page = texts(at)
    assert ":green-badge[reproduced]" in page and ":red-badge[contradicted]" in page
    assert "2 machine(s), 2 prompt(s), 10 pair(s)" in page
    counts = {m.label: int(m.value) for m in at.metric}
    assert counts["reproduced"] == 1


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


def test_runs_page_every_field_and_downloads(app):
    at = app("runs")
    runs = at.dataframe[0].value
    truth = app.truth
    assert len(runs) == len(truth) + 4  # and one verify-cost run per machine
    for column in ("env_nominal", "sampler_temperature", "target_reference", "target_digest", "nominal", "model"):
        assert column in runs.columns
    for column in ("system", "system_method", "flags", "server_version", "server_command", "drafter_warm"):
        assert column in runs.columns
    assert set(runs["system_method"]) == {
        "specfleet mlx baseline",
        "specfleet mlx mtp",
        "specfleet llama.cpp baseline",
        "specfleet llama.cpp mtp",
        "specfleet mlx verify-cost",
        "specfleet llama.cpp verify-cost",
    }
    assert set(runs["flags"]) == {"", "acceptance collapsed"}  # mbp's badly converted MTP head
    assert {"acceptance_by_position", "verify_cost_seconds", "env_reasons", "started_at"} <= set(runs.columns)
    assert (runs["nominal"] == "degraded").sum() == truth["degraded"].sum()
    assert runs["counts"].all()  # every seeded job finished at its one attempt (tests/test_speedup.py: lost ones)
    assert not runs["model"].str.contains("/models/").any()
    assert any("flagged thermally or power degraded" in w.value for w in at.warning)
    at.multiselect(key="runs-chip").select("Apple M1 Max").run()
    narrowed = at.dataframe[0].value
    assert set(narrowed["chip"]) == {"Apple M1 Max"} and len(narrowed) == 3 * 2 * 2 + 1
    buttons = at.get("download_button")
    assert [b.proto.label for b in buttons] == ["Download CSV", "Download Parquet"]


def test_runs_downloads_are_csv_and_parquet(app):
    """The bytes behind the buttons hold the table shown (all of the selection), column for column."""
    from dashboard import data

    shown = app("runs").dataframe[0].value
    csv, parquet = (data.runs_download(data.version(), data.Filters(), (), (), fmt) for fmt in ("csv", "parquet"))
    from_csv, from_parquet = pd.read_csv(io.BytesIO(csv)), pd.read_parquet(io.BytesIO(parquet))
    assert list(from_csv.columns) == list(from_parquet.columns) == list(shown.columns)
    assert len(from_csv) == len(from_parquet) == len(shown)
    assert sorted(from_parquet["run_id"]) == sorted(shown["run_id"])
    assert (
        from_csv["env_nominal"].astype(str).str.lower().tolist()
        == shown["env_nominal"].astype(str).str.lower().tolist()
    )
    arm = shown.index[(shown["method"] == "mtp") & (shown["depth"] == 2)][0]
    assert list(from_parquet.loc[arm, "acceptance_by_position"]) == pytest.approx([0.75, 0.6])
    assert from_csv.loc[arm, "acceptance_by_position"] == "[0.75, 0.6]"


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


def test_sampler_labels_name_every_checked_sampler_key():
    import duckdb

    from dashboard.data import sampler_label

    samplers = [
        Sampler(),
        Sampler(top_k=20),
        Sampler(seed=1),
        Sampler(temperature=0.7, top_p=0.9, top_k=20, seed=1),
        Sampler(temperature=0.7, top_p=0.9, top_k=20, seed=2),
    ]
    con = duckdb.connect()
    labels = [
        con.execute(
            f"SELECT {sampler_label()} FROM (SELECT ? AS sampler_temperature, ? AS sampler_top_p,"
            " ? AS sampler_top_k, ? AS sampler_seed)",
            [s.temperature, s.top_p, s.top_k, s.seed],
        ).fetchone()[0]
        for s in samplers
    ]
    assert labels[0] == "greedy" and len(set(labels)) == len(samplers)
    assert labels[3] == samplers[3].label() + " seed=1"  # specfleet's label, and the seed

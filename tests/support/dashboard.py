"""A fleet of synthetic but plausible results from several chips, seeded through a live
coordinator's real API (seed_fleet), the run records and stored rows it is made of (record, row,
one VARIANTS entry per checked key), and helpers that read a dashboard page (frame, texts,
group_ids): what the dashboard, claims, report and browser tests share."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet import settings as declared
from specfleet.record import ModelIdentity, RunRecord, Sampler
from tests.support.fleet import admin_for, another_value, enrol, run_record, setting_changes

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")  # AppTest.from_file


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
    """tests/support/fleet.py's run record with this fleet's defaults (the MLX 27B model, 256 new
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
        "machine_id": agent,  # one machine per agent in these fixtures
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
    **{s.name: dict(sampler=Sampler(**{s.key: another_value(s)})) for s in declared.SAMPLER},  # every sampler row
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


def one_cell_sweep(name: str, agent: str, target: str, engine: str = "mlx") -> str:
    return (
        f"name: {name}\ntarget: {{agents: [{agent}]}}\nmodels: {{{engine}: {{target: {target}}}}}\n"
        f"engines: [{engine}]\nprompt_sets: [code]\nmethods: {{mtp: [2]}}\nrepeats: 1\n"
    )


def run_job(coordinator, agent, name: str, target_path: str, records_for) -> str:
    """Submit a one-cell sweep for `agent`, take its job, report records_for(job_id), finish."""
    admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=one_cell_sweep(name, agent.name, target_path)))
    job = agent.acquire_job(30).job
    assert job.job_id, f"{agent.name} was offered no job for {name}"
    records = records_for(job.job_id)
    report(agent, job, records)
    agent.complete_job(job.job_id, job.lease_id, len(records))
    return job.job_id


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
    pair, its median over repeats, then the mean over a machine's prompts, then over machines,
    exponentiated."""
    t = truth[(truth["chip"] == chip) & ~truth["degraded"]]
    key = ["agent", "prompt", "repeat"]
    base = t[t["method"] == "baseline"].set_index(key)["tps"]
    arm = t[(t["method"] == "mtp") & (t["depth"] == depth)].set_index(key)["tps"]
    logs = np.log(arm / base.reindex(arm.index)).dropna()
    per_prompt = logs.groupby(level=["agent", "prompt"]).median()
    return float(np.exp(per_prompt.groupby(level="agent").mean().mean()))


def group_ids(at: AppTest) -> dict[str, str]:
    """Label -> comparable group id of the Compare page's selector."""
    return {label: label.rsplit("group ", 1)[1] for label in at.selectbox(key="compare-group").options}


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

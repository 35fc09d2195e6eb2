"""Synthetic fleets written straight into a coordinator's store, in its own format, in SQL: for
the dashboard's scale benchmark (bench/dashboard.py) and for tests that need thousands of runs.

A fleet of `runs` runs: 100 machines on 12 chips, cells of several systems (our MLX and
llama.cpp loops, llama-server, two OpenAI-compatible servers), models, methods, depths,
samplers, prompt sets and context depths, as the seeds' claims name them. Every job is one cell
on one machine (cell: job x 13 mod the cells: nine jobs span the nine systems): a baseline
and its method at three depths, 20 prompts, 5 repeats (400 runs),
plus one verify-cost run; done at its one attempt. Speeds are seeded draws (a chip's level, a
model's, a per-run noise; the arm's true speedup by method and depth), so the same arguments
give the same fleet. llama.cpp runs record their energy (a 2 W package: 2 / tok/s joules a
token), the others none. The store is written behind coordinator/figures.py's back: the next open
rebuilds the figures (figures.ensure).
"""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path

from coordinator.ingest import RUN_COLUMNS
from coordinator.store import Store
from specfleet.record import ModelIdentity, Sampler
from tests.support.fleet import run_record

CHIPS = (
    "Apple M1", "Apple M1 Max", "Apple M2", "Apple M2 Ultra", "Apple M3", "Apple M3 Max",
    "Apple M4", "Apple M4 Pro", "Apple M4 Max", "Apple M5", "Apple M5 Pro", "Apple M5 Max",
)  # fmt: skip
MACHINES = 100
PROMPTS = 20
REPEATS = 5
ARMS = 4  # the baseline and the method at three depths
RUNS_PER_JOB = ARMS * PROMPTS * REPEATS
PROMPT_SETS = (("code", "code"), ("qa", "qa"), ("summarisation", "summarisation"))
# (engine, system, method, target, quantisation, architecture, draft, depths, true speedup at depth 1)
CELLS = (
    ("openai", "MTPLX", "mtp", "Youssofal/Qwen3.6-27B-MTPLX-Optimized-Speed", "4bit", "qwen3_5", "", (1, 2, 3), 2.2),
    ("openai", "OptiQ", "mtp", "mlx-community/Qwen3.6-27B-OptiQ-4bit", "4bit", "qwen3_5", "", (1, 2, 3), 1.6),
    ("llama-server", "llama-server", "draft-mtp", "Qwen3.6-27B-Q8_0.gguf", "Q8_0", "qwen35", "", (1, 2, 3), 1.3),
    ("llama-server", "llama-server", "draft-mtp", "Qwen3.5-9B-MTP-Q4_K_M.gguf", "Q4_K_M", "qwen35", "", (2, 4, 6), 0.9),
    ("llama-server", "llama-server", "ngram-mod", "Qwen3.6-35B-A3B-Q8_0.gguf", "Q8_0", "qwen35moe", "",
     (16, 32, 64), 1.2),
    ("mlx", "specfleet", "mtp", "mlx-community/Qwen3.6-27B-OptiQ-4bit", "4bit", "qwen3_5", "", (1, 2, 3), 1.5),
    ("mlx", "specfleet", "draft", "mlx-community/Qwen3-8B-4bit", "4bit", "qwen3",
     "mlx-community/Qwen3-0.6B-4bit", (2, 4, 6), 1.4),
    ("llama.cpp", "specfleet", "mtp", "Qwen3.5-9B-MTP-Q4_K_M.gguf", "Q4_K_M", "qwen35", "", (1, 2, 3), 1.1),
    ("llama.cpp", "specfleet", "draft", "Qwen3-8B-Q4_K_M.gguf", "Q4_K_M", "qwen3", "Qwen3-0.6B-Q4_K_M.gguf",
     (2, 4, 6), 1.25),
)  # fmt: skip
CONTEXTS = (0, 4096)
TEMPERATURES = (0.0, 0.7)


def _digest(text: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, text).hex * 2


def _cells() -> list[dict]:
    """Every cell: a system and model at a prompt set, context depth and sampler."""
    out = []
    for engine, system, method, target, quant, arch, draft, depths, gain in CELLS:
        for prompt_set, category in PROMPT_SETS:
            for context in CONTEXTS:
                for temperature in TEMPERATURES:
                    out.append(
                        dict(
                            cell=len(out), engine=engine, system=system, method=method, target_reference=target,
                            target_digest=_digest(target), target_quantisation=quant, target_architecture=arch,
                            draft_reference=draft, draft_digest=_digest(draft) if draft else "",
                            depths=list(depths), gain=gain, prompt_set=prompt_set, prompt_category=category,
                            prompt_set_digest=_digest(prompt_set), context_tokens=context,
                            sampler_temperature=temperature, engine_version=f"{engine}=1.0",
                        )
                    )  # fmt: skip
    return out


def _template(con) -> None:
    """One valid stored run as table `template`: the columns the generator does not vary."""
    record = run_record("job-template", target=ModelIdentity(reference="t", digest="0" * 64), sampler=Sampler())
    values = record.row()
    values.update(
        lease_id="", sweep_id="", agent_id="", chip="", record_sha256="", ingested_at=0.0, seq=0, run_id="template"
    )
    columns = list(RUN_COLUMNS)
    con.execute("CREATE OR REPLACE TEMP TABLE template AS SELECT * FROM runs LIMIT 0")
    con.execute(
        f"INSERT INTO template ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        [values[c] for c in columns],
    )


def _job(j: str) -> str:
    return f"'job-' || lpad({j}::VARCHAR, 7, '0')"


def _sweep(j: str) -> str:
    return f"'sw-' || lpad(({j} // 100)::VARCHAR, 5, '0')"


def _machine(j: str) -> str:
    """SQL: the machine (0-99) job j ran on."""
    return f"(({j} * 7 + {j} // 97) % {MACHINES})"


def _agent(j: str) -> str:
    return f"'ag-' || lpad({_machine(j)}::VARCHAR, 3, '0')"


def _owner(j: str) -> str:
    """The REPLACE items that place a run of job j: job, lease, sweep, agent, chip."""
    return (
        f"{_job(j)} AS job_id, 'lease-' || {j} AS lease_id, {_sweep(j)} AS sweep_id, {_agent(j)} AS agent_id,"
        f" {_agent(j)} AS machine_id,"
        f" list_extract({list(CHIPS)}, {_machine(j)} % {len(CHIPS)} + 1) AS chip"
    )


def _uniform(i: str, salt: str) -> str:
    return f"(hash({i}, '{salt}') % 1000003) / 1000003.0"


def _normal(i: str, salt: str) -> str:
    """About a standard normal draw (the sum of four uniforms, centred and scaled)."""
    return f"(({' + '.join(_uniform(i, salt + str(k)) for k in range(4))}) - 2.0) * 1.7320508"


def seed(data_dir: Path, runs: int, start_job: int = 0, redraw: bool = False) -> int:
    """Add a synthetic fleet of about `runs` runs (whole jobs) to the store in data_dir, jobs
    numbered from start_job; returns the number of jobs written. Agents and cells are written
    once, on the first call. A run's random draws are keyed on its place among this call's runs
    (another call repeats them), or with `redraw` on its place in the fleet (start_job's runs
    on): jobs added by a later call then differ by more than their chips and prompts."""
    store = Store(data_dir)
    jobs = max(1, runs // RUNS_PER_JOB)
    cells = _cells()
    try:
        with store.tx() as con:
            if not con.execute("SELECT count(*) FROM agents").fetchone()[0]:
                for a in range(MACHINES):
                    chip = CHIPS[a % len(CHIPS)]
                    fingerprint = {
                        "chip": chip, "gpuCores": str(8 + 4 * (a % 12)), "memoryBytes": str(2**35),
                        "osVersion": "26.1", "modelIdentifier": f"Mac{14 + a % 3},{a % 10}",
                        "memoryBandwidthBytesPerSecond": str(int((100 + 50 * (a % 12)) * 1e9)),
                    }  # fmt: skip
                    con.execute(
                        "INSERT INTO agents VALUES (?, ?, ?, ?, '{}', '[]', ?, ?, 'idle', '', NULL, 1.7e9, 1.7e9,"
                        " nextval('ingest_seq'), ?)",  # each agent its own machine
                        [
                            f"ag-{a:03d}",
                            f"mac-{a:03d}",
                            f"hash-{a}",
                            json.dumps(fingerprint),
                            chip,
                            2**35,
                            f"ag-{a:03d}",
                        ],
                    )
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "cells.json"
                path.write_text(json.dumps(cells))
                con.execute("CREATE OR REPLACE TEMP TABLE cells AS SELECT * FROM read_json_auto(?)", [str(path)])
            j = f"({start_job} + j)"  # integers of ours, never user input
            con.execute(
                "INSERT INTO sweeps (sweep_id, name, yaml, state, created_at, seq)"
                " SELECT sweep_id, 'synthetic', '', 'done', 1.7e9, nextval('ingest_seq')"
                f" FROM (SELECT DISTINCT {_sweep(j)} AS sweep_id FROM range({jobs}) r(j))"
                " WHERE sweep_id NOT IN (SELECT sweep_id FROM sweeps)"
            )
            con.execute(
                f"INSERT INTO jobs SELECT {_job(j)}, {_sweep(j)}, {_agent(j)}, '{{}}', 'done', 1, 3, 'lease-' || {j},"
                f" NULL, '', 1.7e9, 1.7e9, nextval('ingest_seq') FROM range({jobs}) r(j)"
            )
            _template(con)
            n = len(cells)
            i = "r.i"
            job = f"({start_job} + {i} // {RUNS_PER_JOB})"
            k = f"({i} % {RUNS_PER_JOB})"
            arm = f"({k} // {PROMPTS * REPEATS})"
            prompt = f"(({k} % {PROMPTS * REPEATS}) // {REPEATS})"
            repeat = f"({k} % {REPEATS})"
            agent = _machine(job)
            chip_level = f"(0.6 + 0.1 * ({agent} % 12))"
            depth = f"CASE WHEN {arm} = 0 THEN 0 ELSE c.depths[{arm}] END"
            # the arm's true speedup: the cell's gain at its first depth, falling off with depth
            gain = f"CASE WHEN {arm} = 0 THEN 1.0 ELSE c.gain * pow(0.93, {arm} - 1) END"
            drawn = f"({start_job * RUNS_PER_JOB if redraw else 0} + {i})"
            tps = f"(40.0 / (1 + c.cell % 5) * {chip_level} * {gain} * exp(0.05 * {_normal(drawn, 'tps')}))"
            accept = f"list_transform(range({depth}), lambda p: greatest(0.0, 0.8 - 0.15 * p))"
            env = _uniform(drawn, "env")
            nominal = f"CASE WHEN {env} < 0.05 THEN false WHEN {env} < 0.35 THEN NULL ELSE true END"
            con.execute(
                f"""
                INSERT INTO runs SELECT t.* REPLACE (
                    'run-' || {job} || '-' || {k} AS run_id, {_owner(job)},
                    c.engine AS engine, c.engine_version AS engine_version, c.system AS system,
                    CASE WHEN {arm} = 0 THEN 'baseline' ELSE c.method END AS method, {depth} AS depth,
                    c.target_reference AS target_reference, c.target_digest AS target_digest,
                    c.target_quantisation AS target_quantisation, c.target_architecture AS target_architecture,
                    c.draft_reference AS draft_reference, c.draft_digest AS draft_digest,
                    c.sampler_temperature AS sampler_temperature, c.prompt_set AS prompt_set,
                    c.prompt_category AS prompt_category, c.prompt_set_digest AS prompt_set_digest,
                    c.prompt_set || '-' || lpad({prompt}::VARCHAR, 2, '0') AS prompt_id,
                    c.context_tokens AS context_tokens, {repeat} AS repeat, {arm} AS position,
                    {tps} AS decode_tokens_per_second, 31 / {tps} AS decode_seconds,
                    0.05 + 31 / {tps} AS wall_seconds, CASE WHEN {arm} = 0 THEN 0 ELSE 12 END AS rounds,
                    CASE WHEN {arm} = 0 THEN 0 ELSE 12 * {depth} END AS tokens_drafted,
                    CASE WHEN {arm} = 0 THEN 0 ELSE 8 * least({depth}, 2) END AS tokens_accepted,
                    list_transform(range({depth}), lambda p: 12) AS drafted_by_position,
                    {accept} AS acceptance_by_position,
                    CASE WHEN {arm} = 0 THEN 0.0 ELSE 0.1 / {tps} END AS draft_seconds,
                    CASE WHEN {arm} = 0 THEN 0.0 ELSE 0.3 / {tps} END AS verify_seconds,
                    {nominal} AS env_nominal, CASE WHEN {arm} = 0 THEN NULL ELSE true END AS lossless,
                    CASE WHEN c.engine = 'llama.cpp' THEN 'rapl' ELSE '' END AS energy_source,
                    CASE WHEN c.engine = 'llama.cpp' THEN 32 * 2.0 / {tps} END AS energy_joules,
                    CASE WHEN c.engine = 'llama.cpp' THEN 2.0 / {tps} END AS joules_per_token,
                    1.7e9 + {i} AS started_at_unix_seconds, 1.7e9 + {i} AS ingested_at,
                    nextval('ingest_seq') AS seq)
                FROM template t, range({jobs * RUNS_PER_JOB}) r(i)
                JOIN cells c ON c.cell = {job} * 13 % {n}
                """
            )
            con.execute(
                f"""
                INSERT INTO runs SELECT t.* REPLACE (
                    'run-' || {j} || '-verify' AS run_id, {_owner(j)},
                    c.engine AS engine, c.engine_version AS engine_version, c.system AS system,
                    'verify-cost' AS method, 0 AS depth, c.target_reference AS target_reference,
                    c.target_digest AS target_digest, c.context_tokens AS context_tokens,
                    0.0 AS decode_tokens_per_second,
                    [0.01, 0.012, 0.015, 0.02] AS verify_cost_seconds, nextval('ingest_seq') AS seq)
                FROM template t, range({jobs}) r(j) JOIN cells c ON c.cell = {j} * 13 % {n}
                """
            )
        return jobs
    finally:
        store.close()

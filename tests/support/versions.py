"""Synthetic fleets with a known change between two engine versions (an 8% decode regression
planted between two llama.cpp commits on one chip, none on another), as per-prompt rows and as
stored runs, and a mirror stand-in that dashboard/queries.py reads them through."""

from __future__ import annotations

import functools
import math

import duckdb
import numpy as np
import pandas as pd

from specfleet.record import ModelIdentity, RunRecord, Sampler

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
                                machine_id=f"{chip[-6:]}-{m}",
                                prompt_id=f"p{p}",
                                log_tps=machine + prompt + gain + change + rng.normal(0, noise_sd),
                                log_acceptance=math.log(accept) + rng.normal(0, 0.01) if depth else math.nan,
                                repeats=3,
                                first_seq=seq,
                            )
                        )
    return pd.DataFrame(rows)


@functools.cache
def _store_types() -> dict[str, str]:
    """The coordinator's runs columns and their SQL types (its migrations on an empty store)."""
    from coordinator.store import migrate

    with duckdb.connect() as con:
        migrate(con)
        sql = "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'runs'"
        return dict(con.execute(sql).fetchall())


class Db:
    """A mirror stand-in for dashboard/queries.py: runs with the mirror's labels and stored flags
    (the statements the mirror runs on a page of new runs), and jobs."""

    def __init__(self, runs: pd.DataFrame, jobs: pd.DataFrame):
        from dashboard.queries import LABELS, RUN_FLAGS

        self.con = duckdb.connect()
        # A column the frame holds no value of (divergence, ...) takes the store's type: duckdb
        # 1.5.5 reads an all-None object column as INTEGER.
        self.con.register("_batch", runs)
        empty = [c for c in runs.columns if runs[c].dtype == object and runs[c].isna().all()]
        types = _store_types()
        typed = ", ".join(f'NULL::{types[c]} AS "{c}"' for c in empty if c in types)
        replaced = f" REPLACE ({typed})" if typed else ""
        self.con.execute(f"CREATE TABLE runs AS SELECT *{replaced}, {LABELS} FROM _batch")
        for sql in RUN_FLAGS:
            self.con.execute(sql)
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
                    run_id=f"run-{seq}", job_id=f"job-{r.machine_id}-{r.version}", lease_id="lease", sweep_id="sw",
                    agent_id=r.machine_id, machine_id=r.machine_id, chip=r.chip, engine_version=r.version,
                    method=r.method, depth=r.depth,
                    prompt_id=r.prompt_id, repeat=repeat, decode_tokens_per_second=tps, tokens_drafted=drafted,
                    tokens_accepted=round(drafted * math.exp(r.log_acceptance)) if r.depth else 0,
                    lossless=True if r.depth else None, env_nominal=True, seq=seq + 1000 * r.first_seq,
                    record_sha256="", ingested_at=0.0,
                )
            )  # fmt: skip
    runs = pd.DataFrame(rows)
    jobs = pd.DataFrame({"job_id": runs["job_id"].unique()}).assign(attempt=1, state="done")
    return runs, jobs

"""Helpers shared by the tests: an in-process coordinator, clients and run records."""

from __future__ import annotations

import json
import uuid

import duckdb
import pandas as pd

from coordinator.server import Coordinator, CoordinatorConfig
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet import settings as declared
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from specfleet.record import FIELD_VERSIONS, ModelIdentity, RunRecord, Sampler, Settings

LINUX_BOX = pb.Fingerprint(hostname="box", os="linux", chip="Test CPU", memory_bytes=16 * 2**30, cpu_cores=2)


# The stored runs with every run's environment judged unknown: which runs pair and enter a figure
# is then the same whatever the load (a busy test machine judges every run not nominal, and those
# never pair). For tests of pairing, grouping and figures, not of that judgement.
ANY_LOAD = "(SELECT * REPLACE (NULL::BOOLEAN AS env_nominal) FROM runs)"


def start_coordinator(data_dir, **config) -> Coordinator:
    """An in-process coordinator on free ports. Its stop lets calls in flight finish for 0.1 s
    (a served coordinator's 2 s): the tests' clients leave their streams open, and each stop
    would otherwise wait out the whole grace."""
    config = {"stop_grace_seconds": 0.1, **config}
    return Coordinator(CoordinatorConfig(data_dir=data_dir, port=0, metrics_port=0, **config)).start()


def admin_for(coordinator: Coordinator) -> AdminApi:
    return AdminApi(channel(f"127.0.0.1:{coordinator.port}"), admin_credential(coordinator.config.data_dir))


def enrol(
    coordinator: Coordinator, name: str = "mac-1", fingerprint=LINUX_BOX, engines=("mlx", "llama.cpp"), labels=None
) -> AgentApi:
    admin = admin_for(coordinator)
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    address = f"127.0.0.1:{coordinator.port}"
    resp = AgentApi(channel(address)).enrol(token, name, fingerprint, labels or {}, list(engines))
    api = AgentApi(channel(address), resp.credential)
    api.agent_id = resp.agent_id
    return api


TARGET = ModelIdentity(reference="target", digest="cd" * 32, architecture="LlamaForCausalLM", context_length=4096)


def another_value(setting: declared.Setting):
    """A valid value of a declared setting other than its default (the comparability tables)."""
    if setting.choices:
        return next(c for c in setting.choices if c != setting.default)
    if setting.type is int:
        return setting.default + 1 if setting.default is not None else int(setting.lo or 1)
    if setting.type is float:
        up = (setting.default or 0.0) + 0.5
        return up if setting.hi is None or up <= setting.hi else (setting.default or 0.0) - 0.5
    return "--changed 1"


def as_schema(data: dict, schema: int) -> dict:
    """A record's dict as a writer of `schema` wrote it: every field the one schema table
    (specfleet/record.py FIELD_VERSIONS) dates later left out, a part's fields too."""
    out = {k: v for k, v in data.items() if FIELD_VERSIONS.get(k, 1) <= schema}
    for path, since in FIELD_VERSIONS.items():
        part, _, key = path.rpartition(".")
        if part and since > schema and isinstance(out.get(part), dict):
            out[part] = {k: v for k, v in out[part].items() if k != key}
    return {**out, "schema": schema}


def setting_changes() -> dict[str, dict]:
    """Per declared checked setting that the record carries: record fields changing it alone."""
    return {s.name: {"settings": Settings(**{s.name: another_value(s)})} for s in declared.CARRIED if s.checked}


def run_record(job_id: str, method: str = "baseline", depth: int = 0, tps: float = 100.0, **overrides) -> RunRecord:
    """A valid run record of a fake measurement; `overrides` replace any field."""
    fields = dict(
        run_id=str(uuid.uuid4()),
        job_id=job_id,
        attempt=1,
        engine="mlx",
        engine_version="mlx=0.0 mlx-lm=0.0",
        method=method,
        depth=depth,
        target=TARGET,
        sampler=Sampler(),
        prompt_set="code",
        prompt_set_digest="ef" * 32,
        prompt_category="code",
        prompt_id="code-01",
        context_tokens=0,
        max_new_tokens=32,
        repeat=0,
        position=0,
        prompt_tokens=20,
        generated_tokens=32,
        prefill_seconds=0.01,
        ttft_seconds=0.01,
        decode_seconds=31 / tps if tps else 0.0,
        wall_seconds=0.01 + (31 / tps if tps else 0.0),
        decode_tokens_per_second=tps,
        prefill_tokens_per_second=2000.0,
        peak_memory_bytes=10**8,
        output_sha256="ab" * 32,
        started_at_unix_seconds=1.7e9,
    )
    fields.update(overrides)
    return RunRecord(**fields)


def make_run(job_id: str, method: str = "baseline", depth: int = 0, tps: float = 100.0, **overrides) -> str:
    """The JSON an agent uploads for a fake run. `overrides` are written into the JSON without
    validation, so that tests can send what a faulty agent would (NaN, unknown methods)."""
    record = run_record(job_id, tps=tps).to_dict()
    record.update(method=method, depth=depth, **overrides)
    return json.dumps(record)


def run_id(record_json: str) -> str:
    return json.loads(record_json)["run_id"]


SWEEP_YAML = """
name: test-sweep
models:
  mlx: {target: /models/target, draft: /models/draft}
  llama.cpp: {target: /models/target.gguf}
engines: [mlx]
prompt_sets: [code]
prompts: 2
methods: {draft: [2]}
max_new_tokens: 16
repeats: 1
max_attempts: 2
"""


def register_runs(con, runs) -> None:
    """`runs` (a DataFrame or Arrow table of stored runs) as table "runs" on a DuckDB connection,
    with the "jobs" the speedup definition reads: every job done, at its runs' latest attempt."""
    con.register("runs", runs)
    con.register("jobs", jobs_of(runs.to_pandas() if hasattr(runs, "to_pandas") else runs))


def fleet_db(runs, jobs: pd.DataFrame | None = None):
    """A DuckDB connection holding `runs` (a DataFrame of stored runs) as "runs" and `jobs` (by
    default jobs_of(runs)) as "jobs": what dashboard/claims/evaluation.py evaluates on. A frame without
    columns is no runs table at all, as in a mirror before its first run."""
    con = duckdb.connect()
    if len(runs.columns):
        con.register("runs", runs)
    con.register("jobs", jobs_of(runs) if jobs is None else jobs)
    return con


def jobs_of(runs: pd.DataFrame) -> pd.DataFrame:
    """The jobs table a set of runs implies when every job finished at its runs' latest attempt."""
    if len(runs) == 0:
        return pd.DataFrame({"job_id": [], "attempt": [], "state": []})
    latest = runs.groupby("job_id", as_index=False)["attempt"].max()
    return latest.assign(state="done")

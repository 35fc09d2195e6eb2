"""The demo's sweeps on an accelerator machine, through a coordinator and an agent.

    python3 bench/gpu_sweep.py --models DIR --out DIR [--deadline 400] [--engines llama.cpp,llama-server,mlx]

What `specfleet demo` runs, without the dashboard (a machine with no Apple GPU, and perhaps no
Streamlit): a coordinator and an agent as separate processes on loopback, the demo's sweeps
(cli/demo.py demo_sweeps: both model pairs, every method and depth) for llama.cpp,
llama-server and, where it imports, MLX (on Linux its CPU build), with verify cost at 128 and
4080 tokens of context (4096, the engine's context, less the 16 query rows) and 1 to 16 rows.
Every job runs in the agent's worker process, as on any agent. At the deadline, or when every
sweep is done, the runs, jobs and agents tables are exported to Parquet in --out (runs.parquet
is what `specfleet export` writes), with the agent's fingerprint as JSON, the coordinator's
DuckDB file once it has stopped, and the demo's summary printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import yaml  # noqa: E402
from google.protobuf.json_format import MessageToJson  # noqa: E402

from agent.fingerprint import fingerprint  # noqa: E402
from cli import demo  # noqa: E402
from cli.tiny import make_tiny  # noqa: E402
from coordinator.store import DB_FILENAME  # noqa: E402
from protos.specfleet.v1 import fleet_pb2 as pb  # noqa: E402
from specfleet.client import (  # noqa: E402
    AdminApi,
    channel,
    fetch_table,  # noqa: E402
)
from specfleet.data_dir import ENDPOINTS_FILE, admin_credential  # noqa: E402
from specfleet.record import ENGINE_METHODS  # noqa: E402

ENGINES = ("llama.cpp", "llama-server", "mlx")
VERIFY_COST = {"context_tokens": [128, 4080], "max_rows": 16, "repeats": 5}


def available(engines) -> tuple[str, ...]:
    """`engines` less MLX where it does not import (mlx and mlx_lm)."""
    mlx = all(importlib.util.find_spec(name) is not None for name in ("mlx", "mlx_lm"))
    return tuple(e for e in engines if e != "mlx" or mlx)


def sweeps(models, engines_wanted=ENGINES) -> list[dict]:
    """The demo's sweeps restricted to `engines_wanted`, verify cost at two depths."""
    out = []
    for spec in demo.demo_sweeps(models):
        engines = [e for e in spec["engines"] if e in engines_wanted]
        if not engines:
            continue
        models = {e: m for e, m in spec["models"].items() if e in engines_wanted}
        methods = {m: d for m, d in spec["methods"].items() if any(m in ENGINE_METHODS.get(e, ()) for e in engines)}
        spec = {**spec, "engines": engines, "models": models, "methods": methods}
        if "llama-server" not in engines:  # the server's own flags and arms need it
            spec = {k: v for k, v in spec.items() if k not in ("server", "arms")}
        if "verify_cost" in spec:
            spec["verify_cost"] = VERIFY_COST
        out.append(spec)
    return out


def _methods(spec: dict, engines: list[str]) -> dict:
    """The spec's methods that one of `engines` runs (a sweep refuses a method none of its engines has)."""
    return {m: d for m, d in spec["methods"].items() if any(m in ENGINE_METHODS.get(e, ()) for e in engines)}


def mlx_last(specs: list[dict]) -> list[dict]:
    """The sweeps with MLX's jobs split off into sweeps of their own ("<name>-mlx"), queued after
    every other: MLX on a CPU is the slow engine here, and the deadline should cut its jobs, not
    the accelerator's."""
    first, last = [], []
    for spec in specs:
        others = [e for e in spec["engines"] if e != "mlx"]
        if "mlx" not in spec["engines"] or not others:
            (last if others == [] else first).append(spec)
            continue
        first.append(
            {
                **spec,
                "engines": others,
                "models": {e: m for e, m in spec["models"].items() if e != "mlx"},
                "methods": _methods(spec, others),
            }
        )
        mlx = {k: v for k, v in spec.items() if k not in ("server", "arms")}
        mlx.update(
            name=f"{spec['name']}-mlx",
            engines=["mlx"],
            models={"mlx": spec["models"]["mlx"]},
            methods=_methods(spec, ["mlx"]),
        )
        last.append(mlx)
    return first + last


def submit(admin, specs: list[dict], wanted: set[str]) -> list[tuple[str, str]]:
    """Submit the sweeps named in `wanted` (all when empty): (name, sweep id) of those accepted."""
    submitted = []
    for spec in specs:
        if wanted and spec["name"] not in wanted:
            continue
        try:
            sweep = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(spec)))
        except grpc.RpcError as e:
            print(f"sweep {spec['name']} refused: {e.details()}", flush=True)
            continue
        print(f"sweep {spec['name']} ({sweep.sweep_id}): {sweep.jobs} job(s); notes {list(sweep.notes)}", flush=True)
        submitted.append((spec["name"], sweep.sweep_id))
    return submitted


def report(admin, submitted: list[tuple[str, str]], procs: list, stop_at: float) -> None:
    """Wait until every sweep ended, a process died or the deadline passed; print each sweep's end."""
    states = []
    while time.monotonic() < stop_at:
        states = [admin.GetSweep(pb.GetSweepRequest(sweep_id=sid)) for _, sid in submitted]
        if all(s.state != "running" for s in states) or any(p.poll() is not None for p in procs):
            break
        time.sleep(2.0)
    for (name, _), s in zip(submitted, states):
        print(f"sweep {name}: {s.state}, {s.jobs_done}/{s.jobs_total} jobs done, {s.jobs_failed} failed, {s.runs} runs")
        for failure in s.failures:
            print(f"  failed {failure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path(".data/tiny"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/specfleet-gpu-sweep"))
    parser.add_argument("--deadline", type=float, default=400.0, help="seconds before exporting what is done")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated; MLX only where it imports")
    parser.add_argument("--sweeps", default="", help="comma-separated sweep names to submit (default: all)")
    args = parser.parse_args(argv)
    engines = available(args.engines.split(","))
    print(f"engines: {', '.join(engines)}", flush=True)
    stop_at = time.monotonic() + args.deadline
    models = make_tiny(args.models)
    data = args.data_dir.resolve()
    coordinator_dir, agent_dir, logs = data / "coordinator", data / "agent", data / "logs"
    for d in (coordinator_dir, agent_dir, logs):
        d.mkdir(parents=True, exist_ok=True)
    procs = []

    def start(name: str, cmd: list[str]):
        log = open(logs / f"{name}.log", "a")  # noqa: SIM115 - the child process owns it
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1]

    try:
        coordinator = start(
            "coordinator",
            demo._specfleet(
                "coordinator", "serve", "--data-dir", str(coordinator_dir), "--port", "0", "--metrics-port", "0"
            ),
        )
        endpoints = demo._wait_for(
            coordinator_dir / ENDPOINTS_FILE, coordinator, "coordinator", logs / "coordinator.log"
        )
        address = endpoints["grpc"]
        admin = AdminApi(channel(address), admin_credential(coordinator_dir))
        demo._enrol(address, admin, agent_dir)
        start("agent", demo._specfleet("agent", "run", "--config-dir", str(agent_dir)))
        submitted = submit(admin, mlx_last(sweeps(models, engines)), set(filter(None, args.sweeps.split(","))))
        report(admin, submitted, procs, stop_at)
        runs, _ = fetch_table(admin, "runs")
        jobs, _ = fetch_table(admin, "jobs")
        agents, _ = fetch_table(admin, "agents")
        args.out.mkdir(parents=True, exist_ok=True)
        for name, table in (("runs", runs), ("jobs", jobs), ("agents", agents)):
            if table is not None:
                pq.write_table(table, args.out / f"{name}.parquet")
        (args.out / "fingerprint.json").write_text(MessageToJson(fingerprint()) + "\n")
        if runs is not None:
            print("\n" + demo.summary_table(runs, jobs), flush=True)
        return 0
    finally:
        for proc in reversed(procs):  # the agent first, so that it is not left retrying uploads
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in sorted(logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-5:]
            print(f"--- {log.name}: " + " | ".join(tail))
        store = coordinator_dir / DB_FILENAME
        if store.exists() and all(p.poll() is not None for p in procs):
            args.out.mkdir(parents=True, exist_ok=True)
            shutil.copy(store, args.out / "coordinator.duckdb")  # the whole store, for a dashboard


if __name__ == "__main__":
    sys.exit(main())

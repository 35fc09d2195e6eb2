"""The demo's llama.cpp sweeps on an accelerator machine, through a coordinator and an agent.

    python3 bench/gpu_sweep.py --models DIR --out DIR [--deadline 400]

What `specfleet demo` runs, without MLX and the dashboard (a machine with no Apple GPU, and
perhaps no Streamlit): a coordinator and an agent as separate processes on loopback, the demo's
sweeps for llama.cpp and llama-server (cli/demo.py demo_sweeps: both model pairs, every
method and depth), with verify cost at 128 and 4080 tokens of context (4096, the engine's
context, less the 16 query rows). At the deadline, or when every sweep is done, the runs and
jobs tables are exported to Parquet in --out and the demo's summary printed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.parquet as pq  # noqa: E402
import yaml  # noqa: E402

from cli import demo  # noqa: E402
from cli.tinymodels import make_tiny  # noqa: E402
from coordinator.server import ENDPOINTS_FILE, admin_credential  # noqa: E402
from protos.specfleet.v1 import fleet_pb2 as pb  # noqa: E402
from specfleet.client import (  # noqa: E402
    AdminApi,
    channel,
    fetch_table,  # noqa: E402
)
from specfleet.record import ENGINE_METHODS  # noqa: E402

ENGINES = ("llama.cpp", "llama-server")
VERIFY_COST = {"context_tokens": [128, 4080], "max_rows": 16, "repeats": 5}


def sweeps(models) -> list[dict]:
    """The demo's sweeps restricted to llama.cpp and llama-server, verify cost at two depths."""
    out = []
    for spec in demo.demo_sweeps(models):
        engines = [e for e in spec["engines"] if e in ENGINES]
        if not engines:
            continue
        models = {e: m for e, m in spec["models"].items() if e in ENGINES}
        methods = {m: d for m, d in spec["methods"].items() if any(m in ENGINE_METHODS.get(e, ()) for e in engines)}
        spec = {**spec, "engines": engines, "models": models, "methods": methods}
        if "verify_cost" in spec:
            spec["verify_cost"] = VERIFY_COST
        out.append(spec)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path(".data/tiny"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/specfleet-gpu-sweep"))
    parser.add_argument("--deadline", type=float, default=400.0, help="seconds before exporting what is done")
    args = parser.parse_args(argv)
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
        submitted = []
        for spec in sweeps(models):
            sweep = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(spec)))
            print(
                f"sweep {spec['name']} ({sweep.sweep_id}): {sweep.jobs} job(s); notes {list(sweep.notes)}", flush=True
            )
            submitted.append((spec["name"], sweep.sweep_id))
        while time.monotonic() < stop_at:
            states = [admin.GetSweep(pb.GetSweepRequest(sweep_id=sid)) for _, sid in submitted]
            if all(s.state != "running" for s in states) or any(p.poll() is not None for p in procs):
                break
            time.sleep(2.0)
        for (name, _), s in zip(submitted, states):
            print(
                f"sweep {name}: {s.state}, {s.jobs_done}/{s.jobs_total} jobs done, "
                f"{s.jobs_failed} failed, {s.runs} runs"
            )
            for failure in s.failures:
                print(f"  failed {failure}")
        runs, _ = fetch_table(admin, "runs")
        jobs, _ = fetch_table(admin, "jobs")
        agents, _ = fetch_table(admin, "agents")
        args.out.mkdir(parents=True, exist_ok=True)
        for name, table in (("runs", runs), ("jobs", jobs), ("agents", agents)):
            if table is not None:
                pq.write_table(table, args.out / f"{name}.parquet")
        if runs is not None:
            print("\n" + demo.summary_table(runs, jobs), flush=True)
        return 0
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in sorted(logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-5:]
            print(f"--- {log.name}: " + " | ".join(tail))


if __name__ == "__main__":
    sys.exit(main())

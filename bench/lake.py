"""Ingest on the lake store against the file, and two coordinators on one lake against one.

Each configuration starts real coordinator processes (`specfleet coordinator serve`, with
`--store ducklake:postgres://...` on a PostgreSQL cluster of the benchmark's own,
cli/postgres.py), enrols UPLOADERS agents, gives each one job, and lets every agent upload run
records on its result stream as fast as it is answered for SECONDS: the results acknowledged
per second, and their p50/p99 round trip. With two coordinators, half the agents talk to each.
Printed side by side, with the ratios lake/file and two/one, in one run.

    .venv/bin/python bench/lake.py [--uploaders 16] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli import postgres  # noqa: E402
from protos.specfleet.v1 import fleet_pb2 as pb  # noqa: E402
from specfleet.client import AdminApi, AgentApi, channel  # noqa: E402
from tests.support.fleet import make_run  # noqa: E402

SWEEP = {"name": "bench", "models": {"mlx": {"target": "/m"}}, "engines": ["mlx"], "prompt_sets": ["code"]}
FINGERPRINT = pb.Fingerprint(hostname="sim", os="macos", chip="Apple M4 Pro", memory_bytes=48 * 2**30)


def start_coordinator(data_dir: Path, store: str) -> tuple[subprocess.Popen, str, str]:
    """A coordinator process; (it, its gRPC address, its admin credential) once it serves."""
    data_dir.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "coordinator", "serve", "--data-dir", str(data_dir), "--store", store]
        + ["--port", "0", "--metrics-port", "-1", "--lease-seconds", "600"],
        cwd=ROOT,
        stdout=open(data_dir / "coordinator.log", "w"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
    )
    endpoints = data_dir / "coordinator.json"
    deadline = time.monotonic() + 120
    while not endpoints.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("coordinator did not start:\n" + (data_dir / "coordinator.log").read_text())
        time.sleep(0.1)
    return proc, json.loads(endpoints.read_text())["grpc"], (data_dir / "admin.token").read_text().strip()


def upload(api: AgentApi, seconds: float, latencies: list[float], start: threading.Barrier) -> None:
    """Take the agent's job, then upload runs of it one after another until `seconds` passed."""
    job = api.acquire_job(5.0).job
    start.wait()
    end = time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        api.report_result(job.job_id, job.lease_id, make_run(job.job_id))
        latencies.append(time.monotonic() - now)
    api.close()


def measure(tmp: Path, stores: list[str], uploaders: int, seconds: float) -> dict[str, float]:
    """Acknowledged results per second, p50 and p99 ms, with one coordinator per store given."""
    procs, addresses = [], []
    try:
        for i, store in enumerate(stores):
            proc, address, credential = start_coordinator(tmp / f"coordinator-{i}", store)
            procs.append(proc)
            addresses.append(address)
            if i == 0:
                admin = AdminApi(channel(address), credential)
        apis = []
        for n in range(uploaders):
            token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
            resp = AgentApi(channel(addresses[0])).enrol(token, f"mac-{n}", FINGERPRINT, {}, ["mlx"])
            apis.append(AgentApi(channel(addresses[n % len(addresses)]), resp.credential))
        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=json.dumps(SWEEP)))
        latencies: list[list[float]] = [[] for _ in apis]
        start = threading.Barrier(len(apis) + 1)
        threads = [threading.Thread(target=upload, args=(a, seconds, la, start)) for a, la in zip(apis, latencies)]
        for t in threads:
            t.start()
        start.wait()
        began = time.monotonic()
        for t in threads:
            t.join()
        took = time.monotonic() - began
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    every = sorted(x for one in latencies for x in one)
    return {
        "results/s": len(every) / took,
        "p50 ms": statistics.median(every) * 1000,
        "p99 ms": every[int(len(every) * 0.99)] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uploaders", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    results = {}
    with postgres.cluster() as pg, tempfile.TemporaryDirectory(prefix="specfleet-bench-") as tmp:
        pg.create_database("bench_one")
        pg.create_database("bench_two")
        configurations = {
            "file, 1 coordinator": ["file"],
            "lake, 1 coordinator": [pg.store(Path(tmp) / "lake-one", "bench_one")],
            "lake, 2 coordinators": [pg.store(Path(tmp) / "lake-two", "bench_two")] * 2,
        }
        for i, (name, stores) in enumerate(configurations.items()):
            results[name] = measure(Path(tmp) / str(i), stores, args.uploaders, args.seconds)
            print(name, {k: round(v, 1) for k, v in results[name].items()}, flush=True)
    print(f"\n{args.uploaders} uploaders, {args.seconds:g} s each configuration")
    print(f"{'':24}{'results/s':>11}{'p50 ms':>9}{'p99 ms':>9}")
    for name, r in results.items():
        print(f"{name:24}{r['results/s']:11.0f}{r['p50 ms']:9.1f}{r['p99 ms']:9.1f}")
    file, one, two = (results[name]["results/s"] for name in configurations)
    print(f"\nratio lake/file (1 coordinator each): {one / file:.2f}")
    print(f"ratio 2 coordinators / 1 on the lake:  {two / one:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

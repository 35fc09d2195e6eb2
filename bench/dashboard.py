"""The dashboard, the mirror and /metrics at 10k, 100k and 1M runs, measured side by side.

For each size: a synthetic fleet (tests/support/synthetic.py: 100 machines, 12 chips, five systems,
several models, methods, depths, samplers, prompt sets and context depths) is written into a
coordinator's store in its own format, and a real coordinator process is started on it (its
start rebuilds the /metrics figures from the runs). A dashboard process (this script with
--child) then syncs its mirror and renders every page through Streamlit's AppTest, first after
the change (cold caches) and again unchanged; the Questions page's claim evaluation is timed on
its own. Meanwhile this process scrapes /metrics and stores 10k more runs through the real
ingest path (agents' result streams, 16 uploading at once), in blocks alternating without and
with a scrape every second; the dashboard then syncs those 10k incrementally and renders again.
Its peak memory (peak_gib) closes its report. Prints one table with the issue's targets.

    .venv/bin/python bench/dashboard.py                 # 10k, 100k, 1M (about 15 minutes)
    .venv/bin/python bench/dashboard.py --sizes 10000   # one size
    .venv/bin/python bench/dashboard.py --sizes 1000000 --keep build/bench   # seed once, copy after
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.noise import NoiseProbe  # noqa: E402

PAGES = ("fleet", "sweeps", "compare", "versions", "questions", "runs", "imported")
NEW_RUNS = 10_000
UPLOADERS = 16
BLOCKS = 4  # alternating: without a scrape, with one every second, ...
TARGETS = {  # seconds, or a ratio for ingest
    "page after a change": 1.0,
    "page unchanged": 0.3,
    "incremental sync of 10k": 2.0,
    "dashboard peak memory GiB": 1.0,
    "/metrics scrape": 0.05,
    "ingest with scrapes / without": 0.95,
}


# ---------------------------------------------------------------- the dashboard process


def peak_gib() -> float:
    """This process's peak resident memory, GiB: Linux's VmHWM, of this program alone. Not
    ru_maxrss, which Linux carries over exec from the forked parent (this script's other half,
    which seeded the fleet in its own memory before starting this one); ru_maxrss where there
    is no /proc."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    (kib,) = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")]
    return kib / 2**20


def child() -> int:
    """The dashboard's side: report each step as a JSON line; wait for 'go' on stdin before
    the incremental part."""
    from streamlit.testing.v1 import AppTest

    from dashboard import data

    def say(**what) -> None:
        peak = peak_gib()
        print(json.dumps({**what, "peak_gib": peak}), flush=True)

    def pages(when: str) -> None:
        at = AppTest.from_file(str(ROOT / "dashboard/app.py"), default_timeout=600)
        at.run()
        for page in PAGES:
            for state in ("after a change", "unchanged"):
                start = time.perf_counter()
                at.switch_page(f"views/{page}.py").run()
                assert not at.exception, (page, [e.message for e in at.exception])
                say(step=f"page {state}", page=page, when=when, seconds=time.perf_counter() - start)

    c = data.coordinator()
    mirror = data.mirror(c.where.address, c.token)
    start = time.perf_counter()
    mirror.sync()
    say(step="first sync", seconds=time.perf_counter() - start)
    start = time.perf_counter()
    v = data.version()
    data.verdicts(v)
    say(step="claim evaluation", seconds=time.perf_counter() - start)
    pages("cold start")
    assert sys.stdin.readline().strip() == "go"
    start = time.perf_counter()
    mirror.sync()
    say(step="incremental sync of 10k", seconds=time.perf_counter() - start)
    data.synced.clear()  # the page run after it sees the new sequences now, not in REFRESH_SECONDS
    start = time.perf_counter()
    data.verdicts(data.version())
    say(step="claim evaluation after 10k", seconds=time.perf_counter() - start)
    pages("after 10k new runs")
    say(step="dashboard peak memory GiB", value=peak_gib())
    return 0


# ---------------------------------------------------------------- the coordinator's side


def scrape_seconds(address: str, n: int = 20) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as r:
            r.read()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def uploaders(grpc_address: str, data_dir: Path, n: int):
    """n enrolled agents, each holding a job of a sweep submitted for them."""
    from protos.specfleet.v1 import fleet_pb2 as pb
    from specfleet.client import AdminApi, AgentApi, channel
    from specfleet.data_dir import admin_credential
    from tests.support.fleet import LINUX_BOX, SWEEP_YAML

    admin = AdminApi(channel(grpc_address), admin_credential(data_dir))
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=600, max_uses=n)).token
    agents = []
    for i in range(n):
        resp = AgentApi(channel(grpc_address)).enrol(token, f"bench-{i}", LINUX_BOX, {}, ["mlx"])
        agents.append(AgentApi(channel(grpc_address), resp.credential))
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML.replace("prompts: 2", "prompts: 3")))
    held = []
    for api in agents:
        job = api.acquire_job(1).job
        if job.job_id:
            held.append((api, job))
    if not held:
        raise RuntimeError("no bench agent got a job")
    return held


def ingest_block(held, runs: int, scrape_address: str | None) -> float:
    """Store `runs` runs through the agents' result streams, all uploading at once; runs/s.
    With scrape_address, /metrics is scraped every second meanwhile."""
    from tests.support.fleet import make_run

    per = runs // len(held)
    records = [[make_run(job.job_id, repeat=r % 5, prompt_id=f"p{r}") for r in range(per)] for _, job in held]
    stop = threading.Event()

    def scrape():
        while not stop.wait(1.0):
            with urllib.request.urlopen(f"http://{scrape_address}/metrics", timeout=30) as r:
                r.read()

    def upload(i: int):
        api, job = held[i]
        for k, record in enumerate(records[i]):
            api.report_result(job.job_id, job.lease_id, record)
            if k % 200 == 0:
                api.heartbeat(job.job_id, job.lease_id, "bench")

    scraper = threading.Thread(target=scrape, daemon=True) if scrape_address else None
    if scraper:
        scraper.start()
    threads = [threading.Thread(target=upload, args=(i,)) for i in range(len(held))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    stop.set()
    return per * len(held) / elapsed


def seeded(size: int, tmp: Path, keep: Path | None) -> Path:
    """A fresh store of `size` synthetic runs in tmp: seeded there, or, with `keep`, copied from
    the one seeded there once (keep/fleet-SIZE; a million runs take minutes to seed on 2 cores)."""
    from tests.support.synthetic import seed

    data_dir = tmp / f"fleet-{size}"
    if keep is None:
        seed(data_dir, size)
        return data_dir
    kept = keep / f"fleet-{size}"
    if not kept.exists():
        shutil.rmtree(keep / f"partial-{size}", ignore_errors=True)  # a seed cut short
        seed(keep / f"partial-{size}", size)
        (keep / f"partial-{size}").rename(kept)  # there only once whole
    shutil.copytree(kept, data_dir)
    return data_dir


def measure(size: int, tmp: Path, keep: Path | None = None) -> dict:
    from tests.support.processes import start_coordinator, stop

    out: dict = {"size": size}
    start = time.perf_counter()
    data_dir = seeded(size, tmp, keep)
    out["seed"] = time.perf_counter() - start
    start = time.perf_counter()
    proc, endpoints = start_coordinator(data_dir)
    out["coordinator start (figures rebuilt)"] = time.perf_counter() - start
    try:
        from specfleet.data_dir import admin_credential

        env = {
            **os.environ,
            "SPECFLEET_COORDINATOR": endpoints["grpc"],
            "SPECFLEET_ADMIN_TOKEN": admin_credential(data_dir),
            "PYTHONPATH": str(ROOT),
        }
        dash = subprocess.Popen(
            [sys.executable, __file__, "--child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        steps = []

        def read_until(step: str) -> None:
            for line in dash.stdout:
                if not line.startswith("{"):
                    continue  # not a report (the process's own output)
                steps.append(json.loads(line))
                if steps[-1]["step"] == step and steps[-1].get("page", PAGES[-1]) == PAGES[-1]:
                    return
            raise RuntimeError(f"the dashboard process ended before {step!r} (exit {dash.wait()})")

        read_until("page unchanged")
        out["/metrics scrape"] = scrape_seconds(endpoints["metrics"])
        held = uploaders(endpoints["grpc"], data_dir, UPLOADERS)
        rates = {False: [], True: []}
        for b in range(BLOCKS):
            scraping = b % 2 == 1
            rates[scraping].append(ingest_block(held, NEW_RUNS // BLOCKS, endpoints["metrics"] if scraping else None))
        out["ingest runs/s without scrapes"] = statistics.mean(rates[False])
        out["ingest runs/s with scrapes"] = statistics.mean(rates[True])
        out["ingest with scrapes / without"] = out["ingest runs/s with scrapes"] / out["ingest runs/s without scrapes"]
        out["/metrics scrape after 10k"] = scrape_seconds(endpoints["metrics"])
        dash.stdin.write("go\n")
        dash.stdin.flush()
        read_until("dashboard peak memory GiB")
        dash.wait(timeout=60)
    finally:
        stop(proc)
    for s in steps:
        if "page" in s:
            out[f"{s['page']} {s['step'].removeprefix('page ')} ({s['when']})"] = s["seconds"]
        else:
            out[s["step"]] = s.get("seconds", s.get("value"))
            out[f"peak GiB after {s['step']}"] = s["peak_gib"]  # where the dashboard's memory goes
    return out


def target_of(name: str) -> float | None:
    if name.startswith(PAGES):
        return TARGETS["page after a change"] if "after a change" in name else TARGETS["page unchanged"]
    if name.startswith("/metrics scrape"):
        return TARGETS["/metrics scrape"]
    return TARGETS.get(name)


def report(results: list[dict]) -> None:
    names = [k for k in results[0] if k != "size"]
    print(f"{'':46}" + "".join(f"{r['size']:>12,}" for r in results) + "   target  (at the largest size)")
    for name in names:
        row = f"{name:46}" + "".join(f"{r.get(name, float('nan')):12.3f}" for r in results)
        target = target_of(name)
        if target is not None:
            got = results[-1].get(name, float("nan"))
            ratio = name == "ingest with scrapes / without"
            met = got >= target if ratio else got <= target
            row += f"   {target:<6g}  " + ("met" if met else f"missed: {got / target:.2f}x the target")
        print(row)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--keep", type=Path, help="seed each size once into this folder, copied from there after")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child()
    with NoiseProbe() as probe, tempfile.TemporaryDirectory(prefix="specfleet-bench-dashboard-") as tmp:
        results = [measure(n, Path(tmp), args.keep) for n in args.sizes]
    print("seconds unless named; pages rendered through Streamlit's AppTest; runs stored 10k at a time")
    report(results)
    print(probe.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

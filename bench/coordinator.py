"""Load on one coordinator: many simulated agents in one process, over loopback.

Every agent heartbeats every second; agents without a job sit in AcquireJob long-polls; the
agents a sweep gives a job to upload results at a fixed total rate while holding their lease.
The coordinator runs as its own process (`specfleet coordinator serve`), as in production.
Prints p50/p99/max latency per RPC kind and the results acknowledged per second.

    .venv/bin/python bench/coordinator.py --agents 1000 --workers 100 --rate 600 --seconds 30

Heartbeats and results travel on one stream per agent, as specfleet/client.py sends them: their
latency is a message's round trip. AcquireJob latency is the time past the requested wait for
polls that came back empty (how late the long-poll answers), and the whole call for the polls
that got a job. Measuring starts once every agent's first long-poll has come back: the
start-up burst (a thousand agents connecting in the same second) is not the steady state.
The last line says how steady the machine's own CPU was meanwhile (bench/noise.py): its slow
spells set the tail of every latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.noise import NoiseProbe  # noqa: E402
from coordinator.server import quiet_gc  # noqa: E402
from protos.specfleet.v1 import fleet_pb2 as pb  # noqa: E402
from protos.specfleet.v1 import fleet_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.fleet import run_record  # noqa: E402

FINGERPRINT = pb.Fingerprint(hostname="sim", os="macos", chip="Apple M4 Pro", memory_bytes=48 * 2**30)


def start_coordinator(data_dir: Path) -> tuple[subprocess.Popen, dict, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "coordinator", "serve", "--data-dir", str(data_dir)]
        + ["--port", "0", "--metrics-port", "0", "--lease-seconds", "60"],
        cwd=ROOT,
        stdout=open(data_dir / "coordinator.log", "w"),
        stderr=subprocess.STDOUT,
    )
    endpoints = data_dir / "coordinator.json"
    deadline = time.monotonic() + 60
    while not endpoints.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("coordinator did not start:\n" + (data_dir / "coordinator.log").read_text())
        time.sleep(0.1)
    return proc, json.loads(endpoints.read_text()), (data_dir / "admin.token").read_text().strip()


def server_histogram(metrics_address: str) -> dict[str, list[tuple[float, float]]]:
    """The coordinator's own RPC histogram: per method, cumulative (upper bound, count) pairs."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=30).read().decode()
    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "specfleet_rpc_duration_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bucket = out.setdefault(sample.labels["method"], {})
                    le = float(sample.labels["le"])
                    bucket[le] = bucket.get(le, 0.0) + sample.value
    return {method: sorted(b.items()) for method, b in out.items()}


def bucket_quantile(before, after, q: float) -> tuple[int, float]:
    """(calls, upper bound of the bucket holding quantile q) between two histogram readings."""
    counts = [(le, n - dict(before).get(le, 0.0)) for le, n in after]
    total = counts[-1][1]
    for le, n in counts:
        if n >= q * total:
            return int(total), le
    return int(total), float("inf")


def make_run(job_id: str, i: int) -> str:
    """One run record as an agent uploads it (JSON): baselines and draft arms in turn."""
    speculative = dict(method="draft", depth=2, tokens_drafted=300, tokens_accepted=210, rounds=100)
    return run_record(
        job_id,
        tps=127.5,
        repeat=i,
        position=i % 2,
        started_at_unix_seconds=time.time(),
        **(speculative if i % 2 else {}),
    ).to_json()


class Sim:
    def __init__(self, args, address: str, admin_token: str):
        self.args = args
        self.address = address
        self.channels = []  # made in main(), on the running event loop
        self.admin_md = (("authorization", f"Bearer {admin_token}"),)
        self.latencies: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.measuring = False

    def stub(self, i: int, kind=pb_grpc.AgentServiceStub):
        return kind(self.channels[i % len(self.channels)])

    def record(self, kind: str, seconds: float) -> None:
        if self.measuring:
            self.latencies.setdefault(kind, []).append(seconds)

    def error(self, kind: str, e: grpc.aio.AioRpcError) -> None:
        if self.measuring:
            key = f"{kind} {e.code().name}"
            self.errors[key] = self.errors.get(key, 0) + 1

    async def exchange(self, kind: str, method, md, next_request) -> None:
        """Calls on one stream, as specfleet/client.py makes them: send `await next_request()`, wait for
        its answer and record the round trip, until stopped; after an error (counted), another
        stream a second later."""
        while not self.stop.is_set():
            stream = method(metadata=md)
            try:
                while not self.stop.is_set():
                    request = await next_request()
                    start = time.perf_counter()
                    await stream.write(request)
                    await stream.read()
                    self.record(kind, time.perf_counter() - start)
            except grpc.aio.AioRpcError as e:
                self.error(kind, e)
                await asyncio.sleep(1)
            finally:
                stream.cancel()

    async def enrol_all(self) -> list[tuple[str, tuple]]:
        admin = self.stub(0, pb_grpc.AdminServiceStub)
        token = (
            await admin.CreateToken(
                pb.CreateTokenRequest(ttl_seconds=3600, max_uses=self.args.agents), metadata=self.admin_md
            )
        ).token
        limit = asyncio.Semaphore(64)

        async def one(i):
            async with limit:
                resp = await self.stub(i).Enrol(
                    pb.EnrolRequest(token=token, name=f"sim-{i:05d}", fingerprint=FINGERPRINT, engines=["mlx"]),
                    timeout=60,
                )
                return resp.agent_id, (("authorization", f"Bearer {resp.credential}"),)

        return await asyncio.gather(*(one(i) for i in range(self.args.agents)))

    async def agent(self, i: int, md) -> None:
        stub = self.stub(i)
        state = {"job": None}

        beat_delay = random.random() * self.args.heartbeat  # the first beats spread over a period

        async def next_beat():
            nonlocal beat_delay
            await asyncio.sleep(beat_delay)
            beat_delay = self.args.heartbeat
            job = state["job"]
            return pb.HeartbeatRequest(
                job_id=job.job_id if job else "", lease_id=job.lease_id if job else "", status="sim"
            )

        # Results on a fixed schedule, as an agent's runs finish: a slow answer does not lower the
        # rate offered (only an answer slower than the interval delays the next upload).
        interval = self.args.workers / self.args.rate
        next_at = time.perf_counter() + random.random() * interval
        n = 0

        async def next_upload():
            nonlocal next_at, n
            await asyncio.sleep(max(next_at - time.perf_counter(), 0))
            next_at += interval
            job = state["job"]
            n += 1
            return pb.ReportResultRequest(
                job_id=job.job_id, lease_id=job.lease_id, record_json=make_run(job.job_id, n - 1)
            )

        tasks = [asyncio.create_task(self.exchange("Heartbeat", stub.Heartbeat, md, next_beat))]
        # Agents start at different times in a real fleet: spread the first polls over a
        # second and their waits over the long-poll, so that polls end at a steady rate.
        await asyncio.sleep(random.random())
        wait = random.uniform(1, self.args.wait)
        while not self.stop.is_set() and state["job"] is None:
            start = time.perf_counter()
            try:
                resp = await stub.AcquireJob(pb.AcquireJobRequest(wait_seconds=wait), metadata=md, timeout=wait + 30)
            except grpc.aio.AioRpcError as e:
                self.error("AcquireJob", e)
                await asyncio.sleep(1)
                continue
            elapsed = time.perf_counter() - start
            if resp.has_job:
                self.record("AcquireJob (got a job)", elapsed)
                state["job"] = resp.job
                tasks.append(asyncio.create_task(self.exchange("ReportResult", stub.ReportResult, md, next_upload)))
            else:
                self.record("AcquireJob (empty, past the wait)", elapsed - wait)
            wait = self.args.wait
        await self.stop.wait()
        for t in tasks:
            t.cancel()

    async def main(self) -> dict:
        # A local subchannel pool each: otherwise grpc shares one connection among channels to the
        # same address, and real agents each have their own.
        self.channels = [
            grpc.aio.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(self.args.channels)
        ]
        self.stop = asyncio.Event()
        t = time.perf_counter()
        agents = await self.enrol_all()
        print(f"enrolled {len(agents)} agents in {time.perf_counter() - t:.1f}s", flush=True)
        # This one process plays a thousand agents: its own full garbage collections would
        # delay every simulated agent's calls and be counted as the coordinator's latency.
        quiet_gc()
        tasks = [asyncio.create_task(self.agent(i, md)) for i, (_, md) in enumerate(agents)]
        started = time.perf_counter()
        await asyncio.sleep(2)  # every agent is now heartbeating and long-polling
        names = [f"sim-{i:05d}" for i in range(self.args.workers)]
        sweep = {
            "name": "bench",
            "target": {"agents": names},
            "models": {"mlx": {"target": "/models/target"}},
            "engines": ["mlx"],
            "prompt_sets": ["code"],
        }
        admin = self.stub(0, pb_grpc.AdminServiceStub)
        resp = await admin.SubmitSweep(pb.SubmitSweepRequest(yaml=json.dumps(sweep)), metadata=self.admin_md)
        print(f"sweep {resp.sweep_id}: {resp.jobs} jobs for the {self.args.workers} uploading agents", flush=True)
        # Measure the steady state: after the warm-up, and once every agent's first long-poll
        # (made in the start-up burst of a thousand agents connecting) has come back.
        await asyncio.sleep(max(self.args.warmup, started + 1 + self.args.wait - time.perf_counter()))
        before = await asyncio.to_thread(server_histogram, self.metrics_address)
        self.measuring = True
        start, cpu, server_cpu = time.perf_counter(), time.process_time(), cpu_seconds(self.server_pid)
        await asyncio.sleep(self.args.seconds)
        self.measuring = False
        elapsed = time.perf_counter() - start
        self.window = (start, start + elapsed)
        self.server_histograms = (before, await asyncio.to_thread(server_histogram, self.metrics_address))
        self.cpu = {
            "client": (time.process_time() - cpu) / elapsed,
            "coordinator": (cpu_seconds(self.server_pid) - server_cpu) / elapsed,
        }
        self.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in self.channels:
            await c.close()
        return {"seconds": elapsed}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=100, help="agents given a job, uploading results")
    parser.add_argument("--rate", type=float, default=600.0, help="results per second offered, all workers together")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured duration")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the sweep before measuring")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="seconds between an agent's heartbeats")
    parser.add_argument("--wait", type=float, default=10.0, help="AcquireJob long-poll wait")
    parser.add_argument("--channels", type=int, default=32, help="HTTP/2 connections the agents share")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="specfleet-bench-") as tmp:
        proc, endpoints, admin_token = start_coordinator(Path(tmp))
        try:
            sim = Sim(args, endpoints["grpc"], admin_token)
            sim.metrics_address = endpoints["metrics"]
            sim.server_pid = proc.pid
            with NoiseProbe() as probe:
                result = asyncio.run(sim.main())
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    seconds = result["seconds"]
    print(
        f"\n{args.agents} agents ({args.workers} uploading, {args.rate:g} results/s offered), heartbeat every "
        f"{args.heartbeat:g}s, long-poll {args.wait:g}s, {seconds:.0f}s measured, {os.cpu_count()} CPUs\n"
    )
    print(f"{'rpc':36} {'count':>7} {'per s':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for kind, values in sorted(sim.latencies.items()):
        print(
            f"{kind:36} {len(values):7d} {len(values) / seconds:7.0f} {statistics.median(values) * 1000:8.1f} "
            f"{pct(values, 99) * 1000:8.1f} {max(values) * 1000:8.1f}"
        )
    before, after = sim.server_histograms
    print("\nin the coordinator (its histogram; the bucket holding p50/p99):")
    for method in ("AcquireJob", "Heartbeat", "ReportResult"):
        if method in after:
            calls, p50 = bucket_quantile(before.get(method, []), after[method], 0.5)
            _, p99 = bucket_quantile(before.get(method, []), after[method], 0.99)
            print(f"  {method:14} {calls:7d} calls  p50 <= {p50 * 1000:g} ms  p99 <= {p99 * 1000:g} ms")
    for kind, n in sorted(sim.errors.items()):
        print(f"errors: {kind}: {n}")
    acked = len(sim.latencies.get("ReportResult", []))  # every answer recorded while measuring
    print(f"\nresults acknowledged: {acked} = {acked / seconds:.0f}/s")
    print(f"CPU used: coordinator {sim.cpu['coordinator']:.2f} cores, simulated agents {sim.cpu['client']:.2f} cores")
    print(probe.summary(*sim.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())

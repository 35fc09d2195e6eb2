"""What a unary call costs beside a message on a long-lived stream, in grpc.aio, on this machine.

Why heartbeats and results travel on streams (protos/specfleet/v1/fleet.proto): a bare echo
server (no interceptors, no protobuf) in its own process, and N simulated agents in this one,
each sending one small message a second, first as unary calls, then on one bidirectional
stream per agent. Prints CPU microseconds per message on each side and the ratio.

    .venv/bin/python bench/grpc_streams.py --agents 1500 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.coordinator import cpu_seconds  # noqa: E402

METHOD = "bench.Echo"


def _identity(b: bytes) -> bytes:
    return b


async def serve(port: int) -> None:
    async def unary(request, context):
        return request

    async def stream(requests, context):
        async for request in requests:
            yield request

    handlers = grpc.method_handlers_generic_handler(
        METHOD,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary, _identity, _identity),
            "Stream": grpc.stream_stream_rpc_method_handler(stream, _identity, _identity),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handlers,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def load(mode: str, port: int, server_pid: int, agents: int, seconds: float) -> dict[str, float]:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(32)
    ]
    latencies: list[float] = []
    measuring = False
    stop = asyncio.Event()
    payload = b"x" * 60

    async def agent(i: int) -> None:
        channel = channels[i % len(channels)]
        await asyncio.sleep(i / agents)  # spread over the first second
        if mode == "unary":
            call = channel.unary_unary(f"/{METHOD}/Unary")
            while not stop.is_set():
                start = time.perf_counter()
                await call(payload)
                if measuring:
                    latencies.append(time.perf_counter() - start)
                await asyncio.sleep(1)
        else:
            call = channel.stream_stream(f"/{METHOD}/Stream")()
            while not stop.is_set():
                start = time.perf_counter()
                await call.write(payload)
                await call.read()
                if measuring:
                    latencies.append(time.perf_counter() - start)
                await asyncio.sleep(1)
            call.cancel()

    tasks = [asyncio.create_task(agent(i)) for i in range(agents)]
    await asyncio.sleep(3)
    measuring = True
    client_cpu, server_cpu, start = time.process_time(), cpu_seconds(server_pid), time.perf_counter()
    await asyncio.sleep(seconds)
    measuring = False
    elapsed = time.perf_counter() - start
    client_cpu, server_cpu = time.process_time() - client_cpu, cpu_seconds(server_pid) - server_cpu
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in channels:
        await c.close()
    n = len(latencies)
    return {
        "per_s": n / elapsed,
        "server_us": server_cpu / n * 1e6,
        "client_us": client_cpu / n * 1e6,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": sorted(latencies)[int(0.99 * (n - 1))] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=50998)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port))
        return 0
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(args.port)], stdout=subprocess.PIPE, text=True
    )
    try:
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the echo server did not start")
        results = {
            mode: asyncio.run(load(mode, args.port, server.pid, args.agents, args.seconds))
            for mode in ("unary", "stream")
        }
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"{args.agents} agents, one message a second each, {args.seconds:g} s measured, {os.cpu_count()} CPUs\n")
    print(f"{'':24} {'msgs/s':>7} {'server us/msg':>14} {'client us/msg':>14} {'p50 ms':>7} {'p99 ms':>7}")
    for mode, r in results.items():
        label = "unary call" if mode == "unary" else "message on a stream"
        print(
            f"{label:24} {r['per_s']:7.0f} {r['server_us']:14.0f} {r['client_us']:14.0f}"
            f" {r['p50_ms']:7.1f} {r['p99_ms']:7.1f}"
        )
    unary, stream = results["unary"], results["stream"]
    print(
        f"\nunary / stream CPU per message: server {unary['server_us'] / stream['server_us']:.1f}x,"
        f" client {unary['client_us'] / stream['client_us']:.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

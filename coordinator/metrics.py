"""Prometheus metrics: counters and the RPC histogram live in-process; fleet, queue and
latest-result gauges are read from DuckDB at scrape time by a custom collector.

Labels are bounded: chip, engine, method, depth, state, RPC method. Never run or job ids.
"""

from __future__ import annotations

import asyncio
import collections
import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from coordinator.interceptors import WrappingInterceptor, stream_handler, unary_handler
from coordinator.scheduler import Scheduler

RPC_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class FleetCollector:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler

    def collect(self):
        with self.scheduler.store.tx() as con:
            agents = con.execute("SELECT state, chip, count(*) FROM agents GROUP BY ALL").fetchall()
            jobs = con.execute("SELECT state, count(*) FROM jobs GROUP BY ALL").fetchall()
            sweeps = con.execute(
                "SELECT s.name, count(*) FILTER (WHERE j.state IN ('done', 'failed', 'cancelled')) / count(*)"
                " FROM sweeps s JOIN jobs j USING (sweep_id) WHERE s.state = 'running' GROUP BY ALL"
            ).fetchall()
            latest = con.execute(LATEST_SQL).fetchall()
        g = GaugeMetricFamily("specfleet_agents", "Enrolled agents by state and chip", labels=["state", "chip"])
        for state, chip, n in agents:
            g.add_metric([state, chip], n)
        yield g
        g = GaugeMetricFamily("specfleet_jobs", "Jobs by state", labels=["state"])
        for state in ("queued", "leased", "done", "failed", "cancelled"):
            g.add_metric([state], dict(jobs).get(state, 0))
        yield g
        g = GaugeMetricFamily(
            "specfleet_sweep_progress_ratio", "Finished share of each running sweep's jobs", labels=["sweep"]
        )
        for name, ratio in sweeps:
            g.add_metric([name], ratio)
        yield g
        tps = GaugeMetricFamily(
            "specfleet_latest_decode_tokens_per_second",
            "Median decode tokens/s of the latest job per chip, engine, method and depth",
            labels=["chip", "engine", "method", "depth"],
        )
        speedup = GaugeMetricFamily(
            "specfleet_latest_speedup_ratio",
            "Median decode tokens/s over the same job's baseline, latest job",
            labels=["chip", "engine", "method", "depth"],
        )
        for chip, engine, method, depth, median_tps, ratio in latest:
            labels = [chip, engine, method, str(depth)]
            tps.add_metric(labels, median_tps)
            if ratio is not None:
                speedup.add_metric(labels, ratio)
        yield tps
        yield speedup


# Per chip and engine, the most recently ingested job; its arms' medians and ratios to baseline.
LATEST_SQL = """
WITH latest AS (
    SELECT chip, engine, arg_max(job_id, seq) AS job_id FROM runs GROUP BY ALL
), arms AS (
    SELECT r.chip, r.engine, r.method, r.depth, median(r.decode_tokens_per_second) AS tps
    FROM runs r JOIN latest l USING (job_id) GROUP BY ALL
)
SELECT a.chip, a.engine, a.method, a.depth, a.tps, a.tps / nullif(b.tps, 0)
FROM arms a LEFT JOIN arms b ON a.chip = b.chip AND a.engine = b.engine AND b.method = 'baseline'
ORDER BY ALL
"""


class Metrics:
    def __init__(self, scheduler: Scheduler):
        self.registry = CollectorRegistry()
        self.registry.register(FleetCollector(scheduler))
        self.runs_ingested = Counter("specfleet_runs_ingested_total", "Runs stored", registry=self.registry)
        self.runs_duplicate = Counter(
            "specfleet_runs_duplicate_total", "Run uploads acknowledged as duplicates", registry=self.registry
        )
        self.lease_expiries = Counter(
            "specfleet_lease_expiries_total", "Leases that expired without a heartbeat", registry=self.registry
        )
        self.rpc_seconds = Histogram(
            "specfleet_rpc_duration_seconds",
            "gRPC handling time",
            ["method", "code"],
            buckets=RPC_BUCKETS_SECONDS,
            registry=self.registry,
        )

    def serve(self, host: str, port: int):
        """Start the /metrics HTTP server; returns (server, thread)."""
        return start_http_server(port, addr=host, registry=self.registry)


class MetricsInterceptor(WrappingInterceptor):
    """One histogram sample per unary call; on a stream, one per answered message (from its
    request to its response) and one for a stream that fails (since its last answer)."""

    def __init__(self, metrics: Metrics):
        super().__init__()
        self.metrics = metrics

    def wrap(self, method: str, handler):
        method = method.rsplit("/", 1)[-1]
        histogram = self.metrics.rpc_seconds
        by_code = {}  # status code -> this method's histogram child: labels() costs more than observe()

        def observe(code: grpc.StatusCode, seconds: float) -> None:
            child = by_code.get(code) or by_code.setdefault(code, histogram.labels(method, code.name))
            child.observe(seconds)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def timed(request, context):
                start = time.perf_counter()
                code = grpc.StatusCode.UNKNOWN
                try:
                    response = await inner(request, context)
                    code = context.code() or grpc.StatusCode.OK
                    return response
                except asyncio.CancelledError:
                    code = grpc.StatusCode.CANCELLED
                    raise
                except BaseException:
                    code = context.code() or grpc.StatusCode.UNKNOWN
                    raise
                finally:
                    observe(code, time.perf_counter() - start)

            return unary_handler(timed, handler)
        if handler.stream_stream is not None:
            inner_stream = handler.stream_stream

            async def timed_stream(requests, context):
                arrived = collections.deque()  # when each request not answered yet came in
                last = time.perf_counter()

                async def marked():
                    async for request in requests:
                        arrived.append(time.perf_counter())
                        yield request

                try:
                    async for response in inner_stream(marked(), context):
                        last = time.perf_counter()
                        observe(grpc.StatusCode.OK, last - (arrived.popleft() if arrived else last))
                        yield response
                except asyncio.CancelledError:
                    observe(grpc.StatusCode.CANCELLED, time.perf_counter() - last)
                    raise
                except BaseException:
                    observe(context.code() or grpc.StatusCode.UNKNOWN, time.perf_counter() - last)
                    raise

            return stream_handler(timed_stream, handler)
        return handler

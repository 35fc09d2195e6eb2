"""Prometheus metrics: counters and the RPC histogram live in-process; fleet, queue and
result gauges are read from DuckDB at scrape time by a custom collector, on a connection of its
own (Store.reader: no lock). Results come from coordinator/figures.py's tables, kept as runs
are ingested: a scrape reads small tables, never the runs.

Speedups follow the one definition (specfleet/speedup.py), per comparable group: the
`comparable` label is the group's id, and `specfleet_comparable_group_info` names what the group
holds (models by reference and digest, engine version, sampler, prompt set, context depth).
Labels are bounded by the fleet's chips, models and sweeps; never run or job ids.
"""

from __future__ import annotations

import asyncio
import collections
import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from coordinator import figures
from coordinator.interceptors import WrappingInterceptor, stream_handler, unary_handler
from coordinator.scheduler import Scheduler
from coordinator.states import JobState

RPC_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class FleetCollector:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        # The result figures and what they were computed at (the runs' and jobs' last sequence):
        # a scrape recomputes them only when a run or a job changed since.
        self._at: tuple | None = None
        self._figures: tuple = ()

    def collect(self):
        # Its own connection: a scrape never waits for ingest's lock, nor ingest for a scrape.
        with self.scheduler.store.reader() as con:
            agents = con.execute("SELECT state, chip, count(*) FROM agents GROUP BY ALL").fetchall()
            jobs = con.execute("SELECT state, count(*) FROM jobs GROUP BY ALL").fetchall()
            sweeps = con.execute(
                "SELECT s.name,"
                " count(*) FILTER (WHERE j.state IN ('done', 'failed', 'refused', 'cancelled')) / count(*)"
                " FROM sweeps s JOIN jobs j USING (sweep_id) WHERE s.state = 'running' GROUP BY ALL"
            ).fetchall()
            at = con.execute(
                "SELECT (SELECT last_seq FROM figure_state), (SELECT coalesce(max(seq), 0) FROM jobs)"
            ).fetchone()
            if at != self._at:
                self._figures, self._at = (figures.arms(con), figures.speedups(con), figures.groups(con)), at
            arm_speeds, speedups, groups = self._figures
        g = GaugeMetricFamily("specfleet_agents", "Enrolled agents by state and chip", labels=["state", "chip"])
        for state, chip, n in agents:
            g.add_metric([state, chip], n)
        yield g
        g = GaugeMetricFamily("specfleet_jobs", "Jobs by state", labels=["state"])
        for state in JobState:
            g.add_metric([state.value], dict(jobs).get(state.value, 0))
        yield g
        g = GaugeMetricFamily(
            "specfleet_sweep_progress_ratio", "Finished share of each running sweep's jobs", labels=["sweep"]
        )
        for name, ratio in sweeps:
            g.add_metric([name], ratio)
        yield g
        arm_labels = ["comparable", "chip", "engine", "model", "method", "depth"]
        tps = GaugeMetricFamily(
            "specfleet_decode_tokens_per_second",
            "Geometric mean decode tokens/s per comparable group, chip and arm (nominal and unknown runs, speed > 0)",
            labels=arm_labels,
        )
        for comparable, chip, engine, model, method, depth, median_tps in arm_speeds:
            tps.add_metric([comparable, chip, engine, model, method, str(depth)], median_tps)
        yield tps
        ratio = GaugeMetricFamily(
            "specfleet_speedup_ratio",
            "Speedup over the baseline (docs/speedup.md) per comparable group, chip and arm",
            labels=arm_labels,
        )
        for r in speedups.itertuples():
            ratio.add_metric([r.comparable, r.chip, r.engine, r.target_reference, r.method, str(r.depth)], r.speedup)
        yield ratio
        info = GaugeMetricFamily(
            "specfleet_comparable_group_info",
            "What each comparable group of runs holds: only runs equal on all of these are pooled",
            labels=["comparable", "engine", "engine_version", "system", "model", "model_digest", "draft",
                    "draft_digest", "sampler", "prompt_set", "prompt_set_digest", "context_tokens", "max_new_tokens"],
        )  # fmt: skip
        for g in groups.itertuples():
            sampler = (
                f"temperature={g.sampler_temperature:g},top_p={g.sampler_top_p:g},"
                f"top_k={g.sampler_top_k},seed={g.sampler_seed}"
            )
            info.add_metric(
                [g.comparable, g.engine, g.engine_version, g.system, g.target_reference, g.target_digest[:12],
                 g.draft_reference, g.draft_digest[:12], sampler, g.prompt_set, g.prompt_set_digest[:12],
                 str(g.context_tokens), str(g.max_new_tokens)],
                1,
            )  # fmt: skip
        yield info


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

    def serve(self, host: str, port: int, certfile=None, keyfile=None, client_cafile=None):
        """Start the /metrics server: HTTPS with a certificate and key, requiring a client
        certificate signed by client_cafile when given; plain HTTP without. Returns (server, thread)."""
        return start_http_server(
            port,
            addr=host,
            registry=self.registry,
            certfile=str(certfile) if certfile else None,
            keyfile=str(keyfile) if keyfile else None,
            client_cafile=str(client_cafile) if client_cafile else None,
            client_auth_required=client_cafile is not None,
        )


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

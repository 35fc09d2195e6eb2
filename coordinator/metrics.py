"""Prometheus metrics: counters and the RPC histogram live in-process; fleet and queue gauges
are read from DuckDB at scrape time by a custom collector, on a connection of its
own (Store.reader: no lock). Result gauges come from coordinator/figures.py's tables (a scrape
reads small tables, never the runs), which catch up with the runs stored since their last update
when the figures are due, at most every RESULTS_EVERY_SECONDS, and are formatted once per change
(ResultFigures).

Speedups follow the one definition (specfleet/speedup.py), per comparable group: the
`comparable` label is the group's id, and `specfleet_comparable_group_info` names what the group
holds (models by reference and digest, engine version, sampler, prompt set, context depth).
Labels are bounded by the fleet's chips, models and sweeps; never run or job ids.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import socket
import ssl
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

from coordinator import figures, version_figures
from coordinator.interceptors import WrappingInterceptor, stream_handler, unary_handler
from coordinator.scheduler import Scheduler
from coordinator.states import JobState
from specfleet import settings as declared
from specfleet import speedup
from specfleet.record import CHECKED_KEYS

RESULTS_EVERY_SECONDS = 5.0  # the result figures are recomputed at most this often (ResultFigures)
# A /metrics connection has this long to finish its TLS handshake, and then to send each read of
# its request: one that holds a connection open costs a thread for that long, never other scrapes.
HANDSHAKE_SECONDS = 5.0
READ_SECONDS = 10.0
RPC_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class FleetCollector:
    """The fleet and queue gauges: agents by state and chip, distinct machines by chip, jobs by state, running sweeps'
    progress. Small tables, read at every scrape."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler

    def collect(self):
        # Its own connection: a scrape never waits for ingest's lock, nor ingest for a scrape.
        with self.scheduler.store.reader() as con:
            agents = con.execute("SELECT state, chip, count(*) FROM agents GROUP BY ALL").fetchall()
            machines = con.execute(
                "SELECT chip, count(DISTINCT machine_id) FROM agents WHERE state != 'revoked' GROUP BY ALL"
            ).fetchall()
            jobs = con.execute("SELECT state, count(*) FROM jobs GROUP BY ALL").fetchall()
            sweeps = con.execute(
                "SELECT s.name,"
                " count(*) FILTER (WHERE j.state IN ('done', 'failed', 'refused', 'cancelled', 'held')) / count(*)"
                " FROM sweeps s JOIN jobs j USING (sweep_id) WHERE s.state = 'running' GROUP BY ALL"
            ).fetchall()
        g = GaugeMetricFamily("specfleet_agents", "Enrolled agents by state and chip", labels=["state", "chip"])
        for state, chip, n in agents:
            g.add_metric([state, chip], n)
        yield g
        g = GaugeMetricFamily(
            "specfleet_machines",
            "Distinct machines (by salted hardware id: one Mac enrolled twice is one) of agents not revoked, by chip",
            labels=["chip"],
        )
        for chip, n in machines:
            g.add_metric([chip], n)
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


class ResultFigures:
    """The result gauges (decode tok/s, speedups, what each comparable group holds) as
    exposition text, formatted by prometheus_client and kept until a run or a job changed, and
    at least `every` seconds: a million runs are about 6,600 series and 1.2 MB of text, which
    take Python 0.1-0.2 s to format, the GIL held, while ingest needs it too. So between
    scrapes of a busy fleet the figures are at most `every` seconds behind the runs."""

    def __init__(self, store, every: float = RESULTS_EVERY_SECONDS, clock=time.monotonic):
        self.store, self.every, self.clock = store, every, clock
        self._lock = threading.Lock()
        self._at: tuple | None = None  # the runs' and jobs' last sequence the text is of
        self._when = -math.inf
        self._text = b""

    def text(self) -> bytes:
        with self._lock:
            if self.clock() - self._when < self.every:
                return self._text
            self._when = self.clock()
            self.store.catch_up_figures()  # the runs stored since the last time it was due
            with self.store.reader() as con:
                at = con.execute(
                    "SELECT (SELECT last_seq FROM figure_state), (SELECT coalesce(max(seq), 0) FROM jobs)"
                ).fetchone()
                if at != self._at:
                    families = list(
                        _result_families(
                            figures.arms(con),
                            figures.speedups(con),
                            figures.groups(con),
                            version_figures.changes(con),
                            figures.stalls(con),
                        )
                    )
                    self._text, self._at = generate_latest(_Families(families)), at
            return self._text


class _Families:
    """Metric families already built, in the shape generate_latest reads (a collector)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def _result_families(arm_speeds, speedups, groups, version_changes=None, stalls=()):
    if version_changes is not None:  # per change between versions (coordinator/version_figures.py)
        yield from version_figures.families(version_changes)
    arm_labels = ["comparable", "chip", "engine", "model", "method", "depth"]
    tps = GaugeMetricFamily(
        "specfleet_decode_tokens_per_second",
        "Median decode tokens/s per comparable group, chip and arm (nominal and unknown runs, speed > 0,"
        " stalls included)",
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
    stalled = GaugeMetricFamily(
        "specfleet_stall_ratio",
        f"Share of runs that stalled per comparable group, chip and arm: under 1/{speedup.STALL_FACTOR:g} of the"
        " median decode speed of their arm's repeats on the prompt (docs/speedup.md), in attempts that count;"
        " counted, never left out",
        labels=arm_labels,
    )
    for comparable, chip, engine, model, method, depth, _, rate in stalls:
        stalled.add_metric([comparable, chip, engine, model, method, str(depth)], rate or 0.0)
    yield stalled
    info = GaugeMetricFamily(
        "specfleet_comparable_group_info",
        "What each comparable group of runs holds: only runs equal on all of these are pooled",
        labels=["comparable", "model", "draft", "sampler", "prompt_set", *INFO_LABELS.values()],
    )
    for g in groups.to_dict("records"):
        sampler = ",".join(  # every declared sampler row known (specfleet/settings.py SAMPLER)
            f"{s.label}={declared.shown_value(s, g[s.name]) if s.type is int else format(g[s.name], 'g')}"
            for s in declared.SAMPLER
            if not declared.is_missing(g.get(s.name))
        )
        names = [g["comparable"], g["target_reference"], g["draft_reference"], sampler, g["prompt_set"]]
        info.add_metric(names + [_label_value(key, g[key]) for key in INFO_LABELS], 1)
    yield info


# The group info's labels: one per checked key (specfleet/settings.py), the sampler's four as one
# `sampler` label, digests cut to 12 characters.
INFO_LABELS = {k: {"target_digest": "model_digest"}.get(k, k) for k in CHECKED_KEYS if not k.startswith("sampler_")}


def _label_value(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if key.endswith("_digest"):
        return str(value)[:12]
    return f"{value:g}" if isinstance(value, float) else str(value)


class Metrics:
    def __init__(self, scheduler: Scheduler, results_every: float = RESULTS_EVERY_SECONDS, coordinator: str = ""):
        self.registry = CollectorRegistry()
        # Which coordinator answers, and on which store: several coordinators of one lake are told
        # apart by this label (the fleet-wide figures are the same from each: they read the lake).
        Info("specfleet_coordinator", "This coordinator and its store", registry=self.registry).info(
            {"coordinator": coordinator, "store": "file" if scheduler.store.lake is None else "lake"}
        )
        self.registry.register(FleetCollector(scheduler))
        self.results = ResultFigures(scheduler.store, results_every)
        self.runs_ingested = Counter("specfleet_runs_ingested_total", "Runs stored", registry=self.registry)
        self.runs_duplicate = Counter(
            "specfleet_runs_duplicate_total", "Run uploads acknowledged as duplicates", registry=self.registry
        )
        store = scheduler.store
        Gauge(
            "specfleet_store_writable",
            "1 while the store takes writes; 0 while it refuses them (disk full, read-only file, I/O error)",
            registry=self.registry,
        ).set_function(lambda: 0 if store.refusing else 1)
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

    def exposition(self) -> bytes:
        """What /metrics answers: the live counters and gauges, then the result figures."""
        return generate_latest(self.registry) + self.results.text()

    def serve(self, host: str, port: int, certfile=None, keyfile=None, client_cafile=None):
        """Start the /metrics server on a thread: HTTPS with a certificate and key, requiring a
        client certificate signed by client_cafile when given; plain HTTP without. Returns
        (server, thread). prometheus_client's own server formats every series at every scrape;
        this one answers exposition(), whose result figures are formatted once per change.

        Each connection is served on a thread of its own, its TLS handshake included (on the
        accepting thread, one client that never finishes its handshake would stall every
        scrape), within HANDSHAKE_SECONDS, and each read of its request within READ_SECONDS."""

        def app(environ, start_response):
            body = self.exposition()
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
            return [body]

        context = None
        if certfile and keyfile:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(certfile), str(keyfile))
            if client_cafile:
                context.load_verify_locations(cafile=str(client_cafile))
                context.verify_mode = ssl.CERT_REQUIRED

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

            def finish_request(self, request, client_address):  # on the connection's own thread
                if context is None:
                    return super().finish_request(request, client_address)
                request.settimeout(HANDSHAKE_SECONDS)
                try:
                    tls = context.wrap_socket(request, server_side=True)
                except OSError:  # no handshake in time, a plaintext client, an untrusted certificate
                    return
                try:
                    super().finish_request(tls, client_address)
                finally:
                    with contextlib.suppress(OSError):
                        tls.close()

        server = make_server(host, port, app, Server, handler_class=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
        thread.start()
        return server, thread


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_SECONDS  # the socket's timeout while a request is read and answered

    def log_message(self, format, *args):  # a scrape a second is not news
        pass


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

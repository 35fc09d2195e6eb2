"""Start the coordinator: gRPC (agent + admin + health), /metrics, and the lease reaper."""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator import auth
from coordinator.batching import Database
from coordinator.lake import LakeUrl
from coordinator.metrics import Metrics, MetricsInterceptor
from coordinator.scheduler import LEASE_SECONDS, Scheduler
from coordinator.service import AdminServicer, AgentServicer, check_lease
from coordinator.store import Store, StoreUnavailable
from coordinator.upkeep import Upkeep
from protos.specfleet.v1 import fleet_pb2_grpc as pb_grpc
from specfleet.data_dir import ADMIN_TOKEN_FILE, ENDPOINTS_FILE, admin_credential, write_private
from specfleet.keys import private_key_file

log = logging.getLogger("specfleet.coordinator")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Agents ping every specfleet/client.py KEEPALIVE_SECONDS (10 s), calls in flight or not, to
# notice a hung link: permitted, never answered with GOAWAY "too many pings" (gRPC's default
# wants 5 minutes between pings without data). The coordinator pings idle agents' connections
# itself, so that a dead agent's streams are closed within a minute and a half.
KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
)
REAPER_INTERVAL_SECONDS = 1.0
# Garbage collection thresholds, in collections of the next younger generation (Python's
# defaults are 10 and 10).
MIDDLE_GC_EVERY = 1
FULL_GC_EVERY = 5000


@dataclass(frozen=True)
class CoordinatorConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 50551  # 0 picks a free port (written to coordinator.json)
    metrics_port: int = 9464  # 0 picks a free port; -1 disables /metrics
    lease_seconds: float = LEASE_SECONDS
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # set to require client certificates (mTLS)
    # How long a stopping coordinator lets calls in flight finish; agents' idle streams (heartbeats,
    # results) stay open until then, so a stop with agents connected takes this long.
    stop_grace_seconds: float = 2.0
    # "file" (the embedded default: one DuckDB file in data_dir) or a DuckLake that several
    # coordinators share (coordinator/lake.py: ducklake:postgres://...?data_path=DIR).
    store: str = "file"
    # The /metrics label naming this coordinator among those of one lake; "" for none.
    name: str = ""
    # Seconds between two passes of the lake's upkeep (coordinator/upkeep.py); 0: none. Unused on a file.
    lake_upkeep_seconds: float = 3600.0


def quiet_gc() -> None:
    """For a process that serves a coordinator (or plays a fleet of agents): garbage
    collection stops the event loop for as long as it takes (bench/README.md has the figures
    of this project's 2-core machine). Freeze what start-up made. Calls in flight (a thousand
    streams and long-polls) live for seconds, longer than the 0.2 s between two young
    collections, so they reach the middle generation; collected only every tenth time, it
    held all of them (30,000 objects; collections of up to 50 ms). Collecting it every other time
    moves them on to the oldest generation, collected after every 10,000 young collections
    (about as often as with the earlier thresholds; 107-133 ms with a thousand agents)."""
    gc.freeze()
    young, _, _ = gc.get_threshold()
    gc.set_threshold(young, MIDDLE_GC_EVERY, FULL_GC_EVERY)


BIND_HINTS = {
    errno.EADDRINUSE: "another coordinator or program listens there: choose another port",
    errno.EADDRNOTAVAIL: "not an address of this machine",
    errno.EACCES: "a port below 1024 needs privileges",
}


def _bind_problem(host: str, port: int) -> str:
    """Why gRPC could not bind (host, port), as the system tells a plain socket."""
    try:
        with socket.create_server((host, port)):
            return "gRPC refused the address"
    except OSError as e:
        if e.errno is None or e.errno < 0:  # the resolver's: no such name
            return f"cannot resolve {host!r}"
        return f"{os.strerror(e.errno)} ({BIND_HINTS.get(e.errno, 'the system refused it')})"


class Coordinator:
    """A running coordinator; `stop()` shuts everything down and closes the database.

    gRPC is served by grpc.aio on an event loop in its own thread: a waiting long-poll costs
    an asyncio task, not a thread. Every DuckDB call runs on one database thread (see
    coordinator/batching.py); heartbeats and results are batched into shared transactions.
    """

    def __init__(self, config: CoordinatorConfig):
        check_lease(config.lease_seconds)  # before anything is opened: one line, and no start
        if config.tls_key:
            private_key_file(config.tls_key)
        self.config = config
        self.store = Store(config.data_dir, None if config.store == "file" else LakeUrl.parse(config.store))
        self.scheduler = self.store.retrying(lambda: Scheduler(self.store, lease_seconds=config.lease_seconds))
        self.metrics = Metrics(self.scheduler, coordinator=config.name)
        credential = self.store.retrying(auth.ensure_admin_credential, self.store, admin_credential(config.data_dir))
        write_private(config.data_dir / ADMIN_TOKEN_FILE, credential + "\n")

        self.db = Database(self.store.retrying)
        self._upkeep = None
        if self.store.lake is not None and config.lake_upkeep_seconds > 0:
            self._upkeep = Upkeep(self.store.lake, config.lake_upkeep_seconds)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._loop_thread.start()
        self.metrics_port = None
        self._metrics_server = None
        try:
            self.port = self._on_loop(self._build_server())
            if config.metrics_port >= 0:
                self._metrics_server = self._serve_metrics()
                self.metrics_port = self._metrics_server.server_port
        except BaseException:
            self._close_loop()
            self.store.close()
            raise

        self._flusher: asyncio.Task | None = None
        self._stopping = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="lease-reaper", daemon=True)

    def _on_loop(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _build_server(self) -> int:
        config = self.config
        credentials = auth.Credentials(self.store, self.db)
        self.server = grpc.aio.server(
            interceptors=[MetricsInterceptor(self.metrics), auth.AuthInterceptor(credentials)],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.so_reuseport", 0),  # a second coordinator on this port fails instead of sharing it
                *KEEPALIVE_OPTIONS,
            ],
        )
        self.agent_service = AgentServicer(self.scheduler, self.metrics, self.db)
        pb_grpc.add_AgentServiceServicer_to_server(self.agent_service, self.server)
        admin = AdminServicer(self.scheduler, self.db, credentials, self.agent_service)
        pb_grpc.add_AdminServiceServicer_to_server(admin, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"{config.host}:{config.port}"
        try:
            if config.tls_cert:
                creds = grpc.ssl_server_credentials(
                    [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
                    root_certificates=config.tls_client_ca.read_bytes() if config.tls_client_ca else None,
                    require_client_auth=config.tls_client_ca is not None,
                )
                return self.server.add_secure_port(address, creds)
            return self.server.add_insecure_port(address)
        except RuntimeError:  # grpc's message only says that it failed
            raise RuntimeError(
                f"could not serve gRPC on {address}: {_bind_problem(config.host, config.port)}"
            ) from None

    def _serve_metrics(self):
        """/metrics over HTTP, or over HTTPS with gRPC's certificate (and client CA) when it has one."""
        config = self.config
        try:
            server, _ = self.metrics.serve(
                config.host,
                config.metrics_port,
                certfile=config.tls_cert,
                keyfile=config.tls_key,
                client_cafile=config.tls_client_ca,
            )
        except OSError as e:
            raise RuntimeError(
                f"could not serve /metrics on {config.host}:{config.metrics_port}: {e.strerror}"
                " (another program there? choose another --metrics-port, or -1 for none)"
            ) from None
        return server

    async def _start_server(self) -> None:
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._flusher = asyncio.get_running_loop().create_task(self.agent_service.flush_beats_forever())

    def start(self) -> Coordinator:
        self._on_loop(self._start_server())
        self._reaper.start()
        if self._upkeep is not None:
            self._upkeep.start()
        endpoints = {
            "grpc": f"{self.config.host}:{self.port}",
            "pid": os.getpid(),
            "metrics": f"{self.config.host}:{self.metrics_port}" if self.metrics_port else None,
        }
        write_private(self.config.data_dir / ENDPOINTS_FILE, json.dumps(endpoints))
        log.info(
            "coordinator serving gRPC on %s, metrics on %s, data in %s",
            endpoints["grpc"],
            endpoints["metrics"],
            self.store.path,
        )
        return self

    def _reap(self) -> None:
        while not self._stopping.wait(REAPER_INTERVAL_SECONDS):
            try:
                expired = self.store.retrying(self.scheduler.expire_leases)
            except StoreUnavailable:  # logged by the store, once; leases are extended in memory meanwhile
                continue
            except Exception:  # keep reaping; the next pass retries
                log.exception("lease reaper pass failed")
                continue
            if expired:
                self.metrics.lease_expiries.inc(expired)
                log.warning("%d lease(s) expired", expired)

    async def _stop_server(self, grace_seconds: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_seconds)
        if self._flusher is not None:
            self._flusher.cancel()
        await self.agent_service.flush_beats()  # the last contact of every agent is kept

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)
        self._loop.close()

    def stop(self, grace_seconds: float | None = None) -> None:
        """Stop serving: calls in flight get `grace_seconds` (default: the config's) to finish."""
        if grace_seconds is None:
            grace_seconds = self.config.stop_grace_seconds
        self._stopping.set()
        self._on_loop(self._stop_server(grace_seconds), timeout=grace_seconds + 30)
        self._close_loop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self._reaper.join(timeout=5)
        if self._upkeep is not None:
            self._upkeep.stop(timeout=5)  # a call in progress ends at its bound, in a daemon thread
        self.db.close()
        self.store.close()
        (self.config.data_dir / ENDPOINTS_FILE).unlink(missing_ok=True)

"""The agent's optional /metrics (`specfleet agent run --metrics-port N`), in its own registry.

Bounded labels only: the current job shows as busy/idle and its engine, never its id.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

OUTCOMES = ("done", "failed", "refused")


class AgentMetrics:
    def __init__(self, spool_depth: Callable[[], int]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.busy = Gauge("specfleet_agent_busy", "1 while a job runs on this agent", ["engine"], registry=r)
        self.job_started = Gauge(
            "specfleet_agent_current_job_started_timestamp_seconds",
            "When the current job started (0 when idle)",
            registry=r,
        )
        self.not_starting = Gauge(
            "specfleet_agent_not_starting_jobs",
            "1 while the agent holds back new jobs (on battery, low-power mode)",
            registry=r,
        )
        self.runs_uploaded = Counter(
            "specfleet_agent_runs_uploaded_total", "Runs the coordinator acknowledged", registry=r
        )
        self.jobs = Counter("specfleet_agent_jobs_total", "Jobs finished, by outcome", ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.jobs.labels(outcome)
        self.spool_depth = Gauge("specfleet_agent_spool_depth", "Runs in the spool not yet acknowledged", registry=r)
        self.spool_depth.set_function(spool_depth)
        self.last_upload = Gauge(
            "specfleet_agent_last_upload_timestamp_seconds", "When a run was last acknowledged (0: never)", registry=r
        )
        self._server = None

    def job_began(self, engine: str, now: float) -> None:
        self.busy.clear()
        self.busy.labels(engine).set(1)
        self.job_started.set(now)

    def job_ended(self, outcome: str) -> None:
        self.busy.clear()
        self.job_started.set(0)
        self.jobs.labels(outcome).inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics; returns the port (useful with port 0)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

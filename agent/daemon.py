"""The agent: its state, and the threads that share it.

Three loops, one module each, each with the retry policy it uses written beside it:
agent/poll.py (the main thread: acquire a job, run it with agent/runner.py), agent/heartbeat.py
(extends the lease, carries the status, hears a lost lease or a drain order) and
agent/upload.py (empties the spool; parks what will never go). An error a loop cannot live with
(a refused credential, an unexpected failure of the uploader, named) stops the agent with
status 2 and the reason in its log.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from agent import doctor, environment, heartbeat, poll, retry
from agent.config import AgentConfig
from agent.credentials import AgentIdentity
from agent.engines.llama_server import build_versions, find_binary, find_builds
from agent.fingerprint import available_engines, engine_problems, fingerprint
from agent.job_runner import JobRunner
from agent.metrics import AgentMetrics
from agent.models import HashCache
from agent.parts import AgentState
from agent.spool import Spool
from agent.upload import Uploader, UploadFailed
from specfleet import client as api

log = logging.getLogger("specfleet.agent")

FATAL_EXIT_STATUS = 2
PARKED_REASON_STATUS_CHARS = 200  # of the last parked run's reason, in the status


class Agent:
    """The agent built from its `config` (agent/config.py AgentConfig, fixed at start) and its
    identity (by default the credential in the config's directory). `doctor_hold` is the check
    that holds jobs while `agent doctor`'s machine checks fail (agent/doctor.py agent_hold), or
    None (`--ignore-doctor`); `sample_environment` reads the power state; `hf_cache` the Hugging
    Face cache models are resolved in (None: the library's own)."""

    def __init__(
        self,
        config: AgentConfig,
        identity: AgentIdentity | None = None,
        *,
        sample_environment=environment.sample,
        hf_cache: Path | None = None,
        doctor_hold: Callable[[], str] | None = None,
    ):
        self.config = config
        config_dir = config.config_dir
        self.identity = identity or AgentIdentity.load(config_dir)
        chan = api.channel(self.identity.coordinator, **self.identity.tls_files())
        self.api = api.AgentApi(chan, self.identity.credential)
        self.spool = Spool(config_dir / "spool")
        self.state = AgentState()
        self.stop = threading.Event()
        self.lock = threading.Lock()  # guards state
        self.beat = threading.Event()  # set to send a heartbeat now (the status changed)
        self.heard = threading.Event()  # set once a heartbeat was answered (the coordinator's schema known)
        self.job_runner: JobRunner | None = None  # the job running now, its worker and lease
        self.fatal = ""  # why the agent stopped itself; "" when it did not
        self.sample_environment = sample_environment
        self.hf_cache = hf_cache
        self.doctor_hold = doctor_hold
        self.fingerprint = fingerprint()  # taken at start: sent once, and the memory that models must fit
        problems = engine_problems()
        for engine, problem in problems.items():  # named, never just missing from the engines
            log.warning("engine %s cannot run here; this agent runs no job of it: %s", engine, problem)
        self.engines = available_engines(config.llama_server, problems)
        # Its llama-server binaries by build (sweeps pin arms to one): reported in the fingerprint.
        default = find_binary(str(config.llama_server) if config.llama_server else None)
        self.llama_builds = find_builds(default, list(config.llama_server_builds))
        self.fingerprint.engine_versions.update(build_versions(self.llama_builds))
        self.hashes = HashCache(config_dir / "model-hashes.json")
        self.metrics = AgentMetrics(self.spool.depth)
        self.metrics_port = config.metrics_port  # the port served, once run() serves it
        self.uploader = Uploader(self.api, self.spool, self.stop, self.metrics)
        # Jobs are held while this clock is off the coordinator's (agent/doctor.py clock_hold; agent/poll.py).
        self.clock_hold = doctor.clock_hold(self.api)
        if not config.model_dirs:
            log.warning("no --model-dir configured: jobs may name model files anywhere on this machine")

    def upload_pending(self) -> int:
        """Upload every spooled run; those that will never go are parked. Returns uploads."""
        done = self.uploader.flush()
        if done:
            with self.lock:
                self.state.last_contact = self.uploader.last_upload
        return done

    def kill_worker(self) -> None:
        """SIGKILL the running job's worker and its process group (the servers it started)."""
        job_runner = self.job_runner
        if job_runner is not None:
            job_runner.kill()

    def die(self, reason: str) -> None:
        """Stop the agent for a reason it cannot live with; run() then returns FATAL_EXIT_STATUS."""
        log.error("%s; stopping", reason)
        self.fatal = self.fatal or reason
        self.stop.set()

    def status_line(self) -> str:
        """The status a heartbeat carries: what the agent does, its runs held for a coordinator
        upgrade and its parked runs, if any."""
        with self.lock:
            status = self.state.status
        if held := self.uploader.held_reason():
            status += f"; {held}"
        parked = self.uploader.parked
        if parked:
            last = parked[-1]
            runs = "run" if len(parked) == 1 else "runs"
            status += f"; {len(parked)} {runs} parked, last {last.run_id}: {last.reason[:PARKED_REASON_STATUS_CHARS]}"
        return status

    def write_status(self) -> None:
        status_line = self.status_line()
        with self.lock:
            status = {
                "agent": self.identity.name,
                "job_id": self.state.job_id,
                "status": status_line,
                "spool_depth": self.spool.depth(),
                "parked_runs": len(self.uploader.parked),
                "held_runs": len(self.uploader.held),
                "held_reason": self.uploader.held_reason(),
                "last_contact_unix_seconds": self.state.last_contact,
                "not_starting_jobs": self.state.not_starting,
                "model_dirs": [str(d) for d in self.config.model_dirs],
                "last_upload_unix_seconds": self.uploader.last_upload,
                "metrics_port": self.metrics_port,
            }
        tmp = self.config.config_dir / "status.json.tmp"
        tmp.write_text(json.dumps(status))
        tmp.replace(self.config.config_dir / "status.json")

    def run(self) -> int:
        """Run until stopped, drained or a fatal error: 0, or FATAL_EXIT_STATUS with the reason logged."""
        threads = [
            threading.Thread(target=heartbeat.loop, args=(self,), name="heartbeat", daemon=True),
            threading.Thread(target=self.uploader.loop, args=(self.die,), name="uploader", daemon=True),
        ]
        if self.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.metrics_port)
            log.info("agent metrics on http://127.0.0.1:%d/metrics", self.metrics_port)
        for t in threads:
            t.start()
        log.info("agent %s polling %s", self.identity.name, self.identity.coordinator)
        try:
            # Runs left by an earlier life go up before any new job: their lease may still be valid.
            self.upload_pending()
            poll.loop(self)
        except InterruptedError:
            pass
        except (retry.FatalApiError, UploadFailed) as e:
            self.die(str(e))
        finally:
            self.stop.set()
            self.kill_worker()
            for t in threads:
                t.join(timeout=5)
            self.api.close()
            self.write_status()
            self.metrics.close()
        return FATAL_EXIT_STATUS if self.fatal else 0

"""The agent's lifecycle: heartbeat, acquire, run a worker per job, upload the spool.

Three threads: the main loop (acquire -> worker -> complete/fail), a heartbeat that extends
the lease and notices a lost lease or a drain order, and an uploader that empties the spool
whenever it holds anything, with retries that outlast a coordinator outage.

Before a job reaches a worker the agent checks it (preflight): an engine and methods it knows,
model paths inside its model directories, models that fit in memory and whose weights it can
read (their identity: agent/model_identity.py), a context the model can hold; a job that fails the
check is refused (FailJob refused=True, never retried) with the reason. While the machine is
on battery or in low-power mode the agent does not ask for jobs at all and says why in its
status, which every heartbeat carries to the coordinator.

Each worker runs in a session and process group of its own, which the agent kills whole on a
deadline, a lost lease (a cancelled sweep), a stop, and after the worker has exited for any
reason: no server a worker started (llama-server, an OpenAI-compatible server) outlives its job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent import api, environment, retry
from agent.credentials import AgentIdentity
from agent.fingerprint import available_engines, fingerprint
from agent.metrics import AgentMetrics
from agent.model_identity import ModelUnreadable, identify
from agent.models import HashCache, ModelRefused, check_fits, resolve
from agent.spool import Spool
from specfleet.record import ENGINE_METHODS, ENGINES, JobSpec, ModelIdentity, is_method

log = logging.getLogger("specfleet.agent")

POLL_WAIT_SECONDS = 20.0
POWER_RECHECK_SECONDS = 15.0  # how often an agent holding back (on battery) looks again
WORKER_OUTPUT_TAIL_CHARS = 2000


@dataclass
class AgentState:
    job_id: str = ""
    lease_id: str = ""
    status: str = "starting"
    last_contact: float = 0.0
    lease_lost: bool = False
    draining: bool = False
    not_starting: str = ""  # why no job is started now (battery, low-power mode); "" when none


def kill_group(pgid: int) -> None:
    """SIGKILL a worker's process group; nothing to do when it is empty."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Agent:
    def __init__(
        self,
        config_dir: Path,
        identity: AgentIdentity | None = None,
        *,
        model_dirs: list[Path] | tuple[Path, ...] = (),
        allow_battery: bool = False,
        metrics_port: int | None = None,
        sample_environment=environment.sample,
        hf_cache: Path | None = None,
        allow_downloads: bool = False,
        llama_server: Path | None = None,
    ):
        self.config_dir = config_dir
        self.identity = identity or AgentIdentity.load(config_dir)
        chan = api.channel(self.identity.coordinator, **self.identity.tls_files())
        self.api = api.AgentApi(chan, self.identity.credential)
        self.spool = Spool(config_dir / "spool")
        self.state = AgentState()
        self.stop = threading.Event()
        self._spooled = threading.Event()
        self._lock = threading.Lock()
        self._upload_lock = threading.Lock()  # the uploader thread and the main loop both flush
        self._worker: subprocess.Popen | None = None
        self._beat = threading.Event()  # set to send a heartbeat now (the status changed)
        self.model_dirs = [Path(d).expanduser().resolve() for d in model_dirs]
        self.allow_battery = allow_battery
        self.sample_environment = sample_environment
        self.hf_cache, self.allow_downloads = hf_cache, allow_downloads
        self.fingerprint = fingerprint()  # taken at start: sent once, and the memory that models must fit
        self.llama_server = llama_server
        self.engines = available_engines(llama_server)
        self.hashes = HashCache(config_dir / "model-hashes.json")
        self.metrics = AgentMetrics(self.spool.depth)
        self.metrics_port = metrics_port
        self.last_upload = 0.0
        if not self.model_dirs:
            log.warning("no --model-dir configured: jobs may name model files anywhere on this machine")

    # ------------------------------------------------------------------ threads

    def _wait_for_beat(self) -> None:
        deadline = time.monotonic() + self.identity.heartbeat_interval_seconds
        while not self.stop.is_set() and not self._beat.is_set() and time.monotonic() < deadline:
            self._beat.wait(0.2)
        self._beat.clear()

    def _heartbeat_loop(self) -> None:
        fp = self.fingerprint  # refreshed once at start, then only the lease and status travel
        while not self.stop.is_set():
            with self._lock:
                job_id, lease_id, status = self.state.job_id, self.state.lease_id, self.state.status
            try:
                resp = retry.call(
                    lambda: self.api.heartbeat(job_id, lease_id, status, fp), retry.HEARTBEAT, "heartbeat", self.stop
                )
                fp = None
                with self._lock:
                    self.state.last_contact = time.time()
                    self.state.draining = resp.drain
                    if job_id and job_id == self.state.job_id and not resp.lease_valid:
                        self.state.lease_lost = True
                        log.warning("lease on %s is gone; stopping its worker", job_id)
                        self._kill_worker()
            except retry.FatalApiError as e:
                log.error("%s; stopping", e)
                self.stop.set()
            except (grpc.RpcError, InterruptedError) as e:
                log.warning("heartbeat failed: %s", e)
            self._write_status()
            self._wait_for_beat()

    def _upload_loop(self) -> None:
        while not self.stop.is_set():
            self._spooled.wait(timeout=1.0)
            self._spooled.clear()
            try:
                self.upload_pending()
            except InterruptedError:
                return
            except retry.FatalApiError as e:
                log.error("%s; stopping", e)
                self.stop.set()

    def upload_pending(self) -> int:
        """Upload every spooled run; refused ones move aside with their reason. Returns uploads."""
        with self._upload_lock:
            return self._upload_pending()

    def _upload_pending(self) -> int:
        done = 0
        for item in self.spool.items():
            try:
                retry.call(
                    lambda: self.api.report_result(item.job_id, item.lease_id, item.record_json),
                    retry.UPLOAD,
                    f"upload {item.run_id}",
                    self.stop,
                )
                self.spool.ack(item)
                done += 1
                self.last_upload = time.time()
                self.metrics.runs_uploaded.inc()
                self.metrics.last_upload.set(self.last_upload)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                    log.error("coordinator refused run %s: %s", item.run_id, e.details())
                    self.spool.refuse(item, f"{e.code().name}: {e.details()}")
                else:
                    raise
        with self._lock:
            self.state.last_contact = time.time() if done else self.state.last_contact
        return done

    # ------------------------------------------------------------------ jobs

    def _kill_worker(self) -> None:
        """SIGKILL the worker and everything in its process group (the servers it started)."""
        if self._worker is not None and self._worker.poll() is None:
            kill_group(self._worker.pid)

    def preflight(self, spec: JobSpec) -> tuple[JobSpec, dict[str, ModelIdentity]]:
        """Check a job before any worker starts: (spec with local model paths, the models'
        identities). Raises ModelRefused with the reason this agent will not run it."""
        if spec.engine not in ENGINES or spec.engine not in self.engines:
            raise ModelRefused(
                f"engine {spec.engine!r} is not one this agent runs (it runs: {', '.join(self.engines) or 'none'})"
            )
        unknown = sorted({a.method for a in spec.arms if not is_method(spec.engine, a.method)}, key=str)
        if unknown:
            raise ModelRefused(
                f"method(s) {', '.join(map(repr, unknown))} unknown to engine {spec.engine} on this agent "
                f"(it knows: {', '.join(ENGINE_METHODS[spec.engine])})"
            )
        roles = [r for r in ("target", "draft") if spec.model.get(r)]
        if "target" not in roles:
            raise ModelRefused("the job names no target model")
        resolved = {r: resolve(spec.model[r], self.model_dirs, self.allow_downloads, self.hf_cache) for r in roles}
        check_fits(list(resolved.values()), self.fingerprint.memory_bytes, spec.memory_gb or None)
        try:
            identities = {r: identify(m, self.hashes.digest(m)) for r, m in resolved.items()}
        except ModelUnreadable as e:
            raise ModelRefused(str(e)) from None
        limit = identities["target"].context_length
        if limit and spec.context_tokens + spec.max_new_tokens > limit:
            raise ModelRefused(
                f"context of {spec.context_tokens} tokens and {spec.max_new_tokens} new tokens is longer than "
                f"{identities['target'].reference}'s own context length of {limit} tokens"
            )
        return spec.with_models(**{r: str(m.path) for r, m in resolved.items()}), identities

    def _refuse(self, job, reason: str) -> None:
        log.error("job %s refused: %s", job.job_id, reason)
        retry.call(
            lambda: self.api.fail_job(job.job_id, job.lease_id, reason, refused=True),
            retry.JOB_STATE,
            f"refuse {job.job_id}",
            None,
        )
        self.metrics.jobs.labels("refused").inc()

    def run_job(self, job) -> None:
        try:
            spec, models = self.preflight(JobSpec.from_json(job.spec_json))
        except ModelRefused as e:
            self._refuse(job, str(e))
            return
        except (ValueError, TypeError, AttributeError) as e:  # InvalidRecord is a ValueError
            self._refuse(job, f"the job's spec is malformed: {type(e).__name__}: {e}")
            return
        except OSError as e:  # a model file this agent may not read, a disk error while hashing
            self._refuse(job, f"could not read the job's model files: {e}")
            return
        workdir = self.config_dir / "jobs" / job.job_id
        workdir.mkdir(parents=True, exist_ok=True)
        job_file = workdir / "job.json"
        job_file.write_text(
            json.dumps(
                {
                    "job_id": job.job_id,
                    "lease_id": job.lease_id,
                    "attempt": job.attempt,
                    "spec": spec.to_json(),
                    "models": {role: dataclasses.asdict(m) for role, m in models.items()},
                    "memory_bytes": self.fingerprint.memory_bytes,
                    "llama_server": str(self.llama_server) if self.llama_server else None,
                }
            )
        )
        with self._lock:
            self.state.job_id, self.state.lease_id, self.state.lease_lost = job.job_id, job.lease_id, False
            self.state.status = f"running {job.job_id} ({spec.engine})"
        self._beat.set()
        self.metrics.job_began(spec.engine, time.time())
        log.info("job %s attempt %d: %s on %s", job.job_id, job.attempt, spec.engine, spec.model["target"])
        out_path, err_path = workdir / "worker.out", workdir / "worker.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            self._worker = subprocess.Popen(
                [sys.executable, "-m", "agent.worker", str(job_file), str(self.spool.pending.parent)],
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: the servers it starts are in it
            )
            (workdir / "worker.pid").write_text(str(self._worker.pid))
            deadline = time.monotonic() + spec.deadline_seconds
            while self._worker.poll() is None:
                self._spooled.set()  # let the uploader take runs as they are measured
                if time.monotonic() > deadline:
                    self._kill_worker()
                if self.stop.wait(0.5):
                    self._kill_worker()
            code = self._worker.wait()
            kill_group(self._worker.pid)  # whatever the worker left behind, however it ended
        timed_out = time.monotonic() > deadline
        try:
            self.upload_pending()
            self._finish(job, code, timed_out, out_path, err_path)
        finally:
            with self._lock:
                self.state.job_id = self.state.lease_id = ""
                self.state.status = "idle"
            self._worker = None

    def _finish(self, job, code: int, timed_out: bool, out_path: Path, err_path: Path) -> None:
        if self.state.lease_lost:
            log.warning("job %s: lease lost; its runs stay refused in the spool", job.job_id)
            self.metrics.job_ended("failed")
            return
        if code == 0:
            runs = json.loads(out_path.read_text().strip().splitlines()[-1])["runs"]
            retry.call(
                lambda: self.api.complete_job(job.job_id, job.lease_id, runs),
                retry.JOB_STATE,
                f"complete {job.job_id}",
                self.stop,
            )
            log.info("job %s done: %d runs", job.job_id, runs)
            self.metrics.job_ended("done")
            return
        if self.stop.is_set():
            reason = "agent stopped during the job"
        elif timed_out:
            reason = "worker exceeded the job's deadline and was killed"
        elif code == -signal.SIGKILL:
            reason = "worker killed by SIGKILL (out of memory, or killed by another process)"
        elif code < 0:
            reason = f"worker killed by {signal.Signals(-code).name}"
        else:
            reason = f"worker exited with status {code}"
        tail = err_path.read_text()[-WORKER_OUTPUT_TAIL_CHARS:].strip()
        reason = f"{reason}: {tail}" if tail else reason
        resp = retry.call(
            lambda: self.api.fail_job(job.job_id, job.lease_id, reason), retry.JOB_STATE, f"fail {job.job_id}", None
        )
        log.error("job %s failed (%s): %s", job.job_id, "will retry" if resp.will_retry else "final", reason)
        self.metrics.job_ended("failed")

    def _write_status(self) -> None:
        with self._lock:
            status = {
                "agent": self.identity.name,
                "job_id": self.state.job_id,
                "status": self.state.status,
                "spool_depth": self.spool.depth(),
                "last_contact_unix_seconds": self.state.last_contact,
                "not_starting_jobs": self.state.not_starting,
                "model_dirs": [str(d) for d in self.model_dirs],
                "last_upload_unix_seconds": self.last_upload,
                "metrics_port": self.metrics_port,
            }
        tmp = self.config_dir / "status.json.tmp"
        tmp.write_text(json.dumps(status))
        tmp.replace(self.config_dir / "status.json")

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._upload_loop, name="uploader", daemon=True),
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
            while not self.stop.is_set():
                if self.state.draining:
                    log.info("coordinator asked this agent to drain; exiting")
                    break
                if self._holding_back():
                    self.stop.wait(POWER_RECHECK_SECONDS)
                    continue
                with self._lock:
                    self.state.status = "waiting for a job"
                try:
                    resp = retry.call(
                        lambda: self.api.acquire_job(POLL_WAIT_SECONDS, self.stop),
                        retry.JOB_STATE,
                        "acquire",
                        self.stop,
                    )
                except InterruptedError:
                    break
                if resp.has_job:
                    self.run_job(resp.job)
        except InterruptedError:
            pass
        except retry.FatalApiError as e:
            log.error("%s; stopping", e)
            return 2
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=5)
            self.api.close()
            self._write_status()
            self.metrics.close()
        return 0

    def _holding_back(self) -> bool:
        """Whether the machine is in no state to start a job (battery, low-power mode); the
        reason goes into the status, and at once to the coordinator with a heartbeat."""
        reason = None if self.allow_battery else environment.refusal_reason(self.sample_environment())
        with self._lock:
            changed = (reason or "") != self.state.not_starting
            self.state.not_starting = reason or ""
            if reason:
                self.state.status = f"not starting jobs: {reason}"
        self.metrics.not_starting.set(1 if reason else 0)
        if changed:
            if reason:
                log.warning("not starting jobs: %s", reason)
            else:
                log.info("power is back to normal: taking jobs again")
            self._beat.set()
        return reason is not None

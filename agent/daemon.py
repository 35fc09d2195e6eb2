"""The agent's lifecycle: heartbeat, acquire, run a worker per job, upload the spool.

Three threads: the main loop (acquire -> worker -> complete/fail), a heartbeat that extends
the lease and notices a lost lease or a drain order, and an uploader that empties the spool
whenever it holds anything, with retries that outlast a coordinator outage.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent import api, retry
from agent.credentials import AgentIdentity
from agent.fingerprint import fingerprint
from agent.spool import Spool

log = logging.getLogger("specfleet.agent")

POLL_WAIT_SECONDS = 20.0
WORKER_OUTPUT_TAIL_CHARS = 2000


@dataclass
class AgentState:
    job_id: str = ""
    lease_id: str = ""
    status: str = "starting"
    last_contact: float = 0.0
    lease_lost: bool = False
    draining: bool = False


class Agent:
    def __init__(self, config_dir: Path, identity: AgentIdentity | None = None):
        self.config_dir = config_dir
        self.identity = identity or AgentIdentity.load(config_dir)
        ca = Path(self.identity.tls_ca) if self.identity.tls_ca else None
        self.api = api.AgentApi(api.channel(self.identity.coordinator, ca=ca), self.identity.credential)
        self.spool = Spool(config_dir / "spool")
        self.state = AgentState()
        self.stop = threading.Event()
        self._spooled = threading.Event()
        self._lock = threading.Lock()
        self._upload_lock = threading.Lock()  # the uploader thread and the main loop both flush
        self._worker: subprocess.Popen | None = None

    # ------------------------------------------------------------------ threads

    def _heartbeat_loop(self) -> None:
        fp = fingerprint()  # refreshed once at start, then only the lease and status travel
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
            self.stop.wait(self.identity.heartbeat_interval_seconds)

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
                    lambda: self.api.report_result(item.job_id, item.lease_id, item.run),
                    retry.UPLOAD,
                    f"upload {item.run.run_id}",
                    self.stop,
                )
                self.spool.ack(item)
                done += 1
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                    log.error("coordinator refused run %s: %s", item.run.run_id, e.details())
                    self.spool.refuse(item, f"{e.code().name}: {e.details()}")
                else:
                    raise
        with self._lock:
            self.state.last_contact = time.time() if done else self.state.last_contact
        return done

    # ------------------------------------------------------------------ jobs

    def _kill_worker(self) -> None:
        if self._worker is not None and self._worker.poll() is None:
            self._worker.kill()

    def run_job(self, job) -> None:
        spec = json.loads(job.spec_json)
        workdir = self.config_dir / "jobs" / job.job_id
        workdir.mkdir(parents=True, exist_ok=True)
        job_file = workdir / "job.json"
        job_file.write_text(
            json.dumps({"job_id": job.job_id, "lease_id": job.lease_id, "attempt": job.attempt, "spec": spec})
        )
        with self._lock:
            self.state.job_id, self.state.lease_id, self.state.lease_lost = job.job_id, job.lease_id, False
            self.state.status = f"running {job.job_id} ({spec['engine']})"
        log.info("job %s attempt %d: %s on %s", job.job_id, job.attempt, spec["engine"], spec["model"]["target"])
        out_path, err_path = workdir / "worker.out", workdir / "worker.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            self._worker = subprocess.Popen(
                [sys.executable, "-m", "agent.worker", str(job_file), str(self.spool.pending.parent)],
                stdout=out,
                stderr=err,
            )
            deadline = time.monotonic() + spec.get("deadline_seconds", 3600)
            while self._worker.poll() is None:
                self._spooled.set()  # let the uploader take runs as they are measured
                if time.monotonic() > deadline:
                    self._worker.kill()
                if self.stop.wait(0.5):
                    self._worker.kill()
            code = self._worker.wait()
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
            return
        if self.stop.is_set():
            reason = "agent stopped during the job"
        elif timed_out:
            reason = "worker exceeded the job's deadline and was killed"
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

    def _write_status(self) -> None:
        with self._lock:
            status = {
                "agent": self.identity.name,
                "job_id": self.state.job_id,
                "status": self.state.status,
                "spool_depth": self.spool.depth(),
                "last_contact_unix_seconds": self.state.last_contact,
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
        return 0

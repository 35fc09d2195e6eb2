"""One job on this agent, as its loops share it: agent/runner.py makes a JobRunner per job, the
heartbeat loop asks it (agent/heartbeat.py), a stop kills its worker (agent/daemon.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading


def kill_group(pgid: int) -> None:
    """SIGKILL a worker's process group; nothing to do when it is empty."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class JobRunner:
    """One job on this agent (the Buildkite agent's job runner): its ids, its worker process and
    whether its lease was lost, behind a lock of its own. The poll loop makes one per job
    (run_job); the heartbeat loop asks it for the lease it beats for (`ids`) and tells it when
    the coordinator says that lease is gone (`lease_gone`, which kills the worker); a stop kills
    its worker through `kill`. Nothing else reaches the worker."""

    def __init__(self, job):
        self.job = job
        self._lock = threading.Lock()
        self._worker: subprocess.Popen | None = None
        self._lease_lost = False

    @property
    def ids(self) -> tuple[str, str]:
        """(job id, lease id): what the heartbeat names."""
        return self.job.job_id, self.job.lease_id

    @property
    def lease_lost(self) -> bool:
        with self._lock:
            return self._lease_lost

    def started(self, worker: subprocess.Popen) -> None:
        """The job's worker runs: killed at once if the lease was lost meanwhile."""
        with self._lock:
            self._worker = worker
            lost = self._lease_lost
        if lost:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the worker and everything in its process group (the servers it started)."""
        with self._lock:
            worker = self._worker
        if worker is not None and worker.poll() is None:
            kill_group(worker.pid)

    def lease_gone(self) -> None:
        """The coordinator says the job's lease is gone (a cancelled sweep, an expiry another
        attempt followed): stop its worker; the job's runs stay in the spool."""
        with self._lock:
            self._lease_lost = True
        self.kill()

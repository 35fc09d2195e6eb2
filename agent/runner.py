"""The run loop's one job: preflight (agent/preflight.py), a fresh worker process, then the job's
end at the coordinator.

Each worker runs in a session and process group of its own, which the agent kills whole on a
deadline, a lost lease (a cancelled sweep), a stop, and after the worker has exited for any
reason: no server a worker started (llama-server, an OpenAI-compatible server) outlives its job.
The worker also holds the read end of a pipe whose write end only the agent holds: its end of
file tells the worker that the agent is gone, however and whenever it died (agent/worker.py).

When the worker is done the job's runs are uploaded; the job is completed only if none of them
was parked (agent/upload.py) and the coordinator stored as many as the worker measured;
otherwise it fails with the reason, naming the parked runs.

Retry policy (JOB_STATE): completing, failing and refusing a job are retried for as long as the
coordinator is unreachable; a refusal of its own (a lease that is gone) is logged, not retried.
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
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from agent import preflight, retry
from agent.job_runner import JobRunner, kill_group
from agent.models import ModelRefused
from specfleet.record import JobSpec

if TYPE_CHECKING:
    from agent.parts import AgentParts as Agent

log = logging.getLogger("specfleet.agent")

JOB_STATE = retry.Budget(0.5, 30.0, float("inf"), max_refusals=5)
WORKER_MODULE = "agent.worker"  # run as `python -m WORKER_MODULE JOB.json SPOOL_DIR ALIVE_FD`
WORKER_CHECK_SECONDS = 0.5
WORKER_OUTPUT_TAIL_CHARS = 2000
FAILURE_REASON_CHARS = 2000  # of parked runs' names and reasons (the coordinator keeps 2000)
STOPPING_TELL_SECONDS = 10.0  # a stopping agent tells a job's failure this long at most
PARKED_REASON_CHARS = 300  # of each parked run's reason, in its job's failure


def _tell(what: str, rpc, stop) -> bool:
    """Send a job's end to the coordinator; False (logged) when it refuses to hear it. With
    `stop` None it is sent even while the agent stops (a failure must reach the coordinator)."""
    try:
        retry.call(rpc, JOB_STATE, what, stop)
        return True
    except grpc.RpcError as e:
        log.error("%s: the coordinator would not take it: %s", what, retry.refusal(e, JOB_STATE))
        return False


def _tell_while_stopping(what: str, rpc, stop: threading.Event) -> bool:
    """_tell a job's failure, retrying as long as it takes while the agent runs; once it stops,
    for at most STOPPING_TELL_SECONDS (a coordinator that is gone would hold the agent's exit
    for ever: the job's lease then expires and the coordinator requeues the job itself)."""
    if not stop.is_set():
        return _tell(what, rpc, None)
    give_up = threading.Event()
    timer = threading.Timer(STOPPING_TELL_SECONDS, give_up.set)
    timer.daemon = True
    timer.start()
    try:
        return _tell(what, rpc, give_up)
    except InterruptedError:
        log.warning("%s: not told, the agent is stopping; the job's lease expiry will tell it", what)
        return False
    finally:
        timer.cancel()


def one_line(text: str) -> str:
    """A failure reason as `sweep status` prints it: one line, at most FAILURE_REASON_CHARS."""
    text = " ".join(str(text).split())
    return text if len(text) <= FAILURE_REASON_CHARS else text[: FAILURE_REASON_CHARS - 3] + "..."


def last_line(output: str) -> str:
    """The last non-empty line of a worker's output: a traceback's exception and its message."""
    return next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")


def _fail(agent: Agent, job, reason: str, *, refused: bool = False) -> None:
    outcome = "refused" if refused else "failed"
    reason = one_line(reason)
    log.error("job %s %s: %s", job.job_id, outcome, reason)
    _tell_while_stopping(
        f"{outcome} {job.job_id}", lambda: agent.api.fail_job(job.job_id, job.lease_id, reason, refused), agent.stop
    )
    if refused:
        agent.metrics.jobs.labels("refused").inc()
    else:
        agent.metrics.job_ended("failed")


def llama_server_for(agent: Agent, spec: JobSpec) -> str | None:
    """The llama-server binary a job runs: its pinned build's (preflight refused a build the agent
    lacks), else the agent's own (None: the engine's own search)."""
    if spec.server is not None and spec.server.build:
        return str(agent.llama_builds[spec.server.build].binary)
    return str(agent.config.llama_server) if agent.config.llama_server else None


def _job_file(agent: Agent, job, spec: JobSpec, models) -> Path:
    workdir = agent.config.config_dir / "jobs" / job.job_id
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
                "memory_bytes": agent.fingerprint.memory_bytes,
                "llama_server": llama_server_for(agent, spec),
                "threads": agent.config.threads,
            }
        )
    )
    return job_file


def run_job(agent: Agent, job) -> None:
    """Check, run and end one job; the agent's state says so while it runs. A job given while
    the coordinator cannot read this agent's records is refused, saying so."""
    if waiting := agent.uploader.waiting_for():
        return _fail(agent, job, waiting, refused=True)
    try:
        spec, models = preflight.check(agent, JobSpec.from_json(job.spec_json))
    except ModelRefused as e:
        return _fail(agent, job, str(e), refused=True)
    except (ValueError, TypeError, AttributeError) as e:  # InvalidRecord is a ValueError
        return _fail(agent, job, f"the job's spec is malformed: {type(e).__name__}: {e}", refused=True)
    except OSError as e:  # a model file this agent may not read, a disk error while hashing
        return _fail(agent, job, f"could not read the job's model files: {e}", refused=True)
    job_file = _job_file(agent, job, spec, models)
    job_runner = JobRunner(job)
    with agent.lock:
        agent.job_runner = job_runner
        agent.state.job_id, agent.state.lease_id = job.job_id, job.lease_id
        agent.state.status = f"running {job.job_id} ({spec.engine})"
    agent.beat.set()
    agent.metrics.job_began(spec.engine, time.time())
    log.info("job %s attempt %d: %s on %s", job.job_id, job.attempt, spec.engine, spec.model["target"])
    parked_mark = len(agent.uploader.parked)
    try:
        code, timed_out = _run_worker(agent, job_runner, job_file, spec.deadline_seconds)
        agent.uploader.flush(wait_for_held=False)  # held runs end the job "held", not wait
        parked = agent.uploader.parked_since(parked_mark, job.job_id)
        _finish(agent, job_runner, code, timed_out, job_file.parent, parked)
    finally:
        with agent.lock:
            agent.job_runner = None
            agent.state.job_id = agent.state.lease_id = ""
            agent.state.status = "idle"


def _run_worker(agent: Agent, job_runner: JobRunner, job_file: Path, deadline_seconds: float) -> tuple[int, bool]:
    """Run the job's worker to its end: (exit status, whether it ran past the deadline)."""
    workdir = job_file.parent
    alive, agent_end = os.pipe()  # the agent never writes: the worker reads until the agent is gone
    try:
        with open(workdir / "worker.out", "w") as out, open(workdir / "worker.err", "w") as err:
            worker = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, str(job_file), str(agent.spool.pending.parent), str(alive)],
                stdout=out,
                stderr=err,
                pass_fds=(alive,),
                start_new_session=True,  # its own process group: the servers it starts are in it
            )
        job_runner.started(worker)
        os.close(alive)
        alive = -1
        (workdir / "worker.pid").write_text(str(worker.pid))
        deadline = time.monotonic() + deadline_seconds
        while worker.poll() is None:
            agent.uploader.wake.set()  # let the uploader take runs as they are measured
            if time.monotonic() > deadline:
                job_runner.kill()
            if agent.stop.wait(WORKER_CHECK_SECONDS):
                job_runner.kill()
        code = worker.wait()
        kill_group(worker.pid)  # whatever the worker left behind, however it ended
        return code, time.monotonic() > deadline
    finally:
        for fd in (alive, agent_end):
            if fd >= 0:
                os.close(fd)


def _worker_runs(out_path: Path) -> int | None:
    """The run count a worker printed on its last line; None when it printed none."""
    try:
        return int(json.loads(out_path.read_text().strip().splitlines()[-1])["runs"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


def parked_reason(parked, runs: int) -> str:
    """A job's failure for its parked runs: each named with (the start of) its reason, as many
    as fit in FAILURE_REASON_CHARS, then how many more."""
    entries = [f"{p.run_id}: {p.reason[:PARKED_REASON_CHARS]}" for p in parked]
    shown = len(entries)
    while shown > 1 and len("; ".join(entries[:shown])) > FAILURE_REASON_CHARS - 100:
        shown -= 1
    more = f"; and {len(entries) - shown} more" if shown < len(entries) else ""
    return f"{len(parked)} of its {runs} runs parked: " + "; ".join(entries[:shown]) + more


def _failure(agent: Agent, code: int, timed_out: bool) -> str:
    if agent.stop.is_set():
        return "agent stopped during the job"
    if timed_out:
        return "worker exceeded the job's deadline and was killed"
    if code == -signal.SIGKILL:
        return "worker killed by SIGKILL (out of memory, or killed by another process)"
    if code < 0:
        return f"worker killed by {signal.Signals(-code).name}"
    return f"worker exited with status {code}"


def _finish(agent: Agent, job_runner: JobRunner, code: int, timed_out: bool, workdir: Path, parked) -> None:
    job = job_runner.job
    if job_runner.lease_lost:
        log.warning("job %s: lease lost; its runs stay refused in the spool", job.job_id)
        agent.metrics.job_ended("failed")
        return
    runs = _worker_runs(workdir / "worker.out") if code == 0 else None
    if code == 0 and runs is None:
        return _fail(agent, job, "worker exited with status 0 but printed no run count")
    if code != 0:
        reason = _failure(agent, code, timed_out)
        tail = (workdir / "worker.err").read_text(errors="replace")[-WORKER_OUTPUT_TAIL_CHARS:].strip()
        if tail:  # the traceback stays in the agent's log; the coordinator gets its last line
            log.error("job %s: the worker's output ends:\n%s", job.job_id, tail)
        return _fail(agent, job, f"{reason}: {last_line(tail)}" if tail else reason)
    if parked:
        return _fail(agent, job, parked_reason(parked, runs))
    held = agent.uploader.held_for(job.job_id)
    if _tell(
        f"complete {job.job_id}", lambda: agent.api.complete_job(job.job_id, job.lease_id, runs, held), agent.stop
    ):
        log.info("job %s %s: %d runs", job.job_id, f"held ({held} runs held)" if held else "done", runs)
        agent.metrics.job_ended("done")
    else:
        _fail(agent, job, f"the coordinator would not complete it with the {runs} runs its worker measured")

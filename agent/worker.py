"""A worker process runs one job and exits (pyperf-style isolation).

`python -m agent.worker JOB.json SPOOL_DIR ALIVE_FD`: JOB.json holds the job's ids, its `JobSpec`
(with local model paths), the models' identities, the machine's memory, the agent's llama-server
(`llama_server`, None for the engine's own search) and thread count (`threads`, its AgentConfig's);
the worker builds the engine with the options its kind takes (`engine_options`), measures, writes
every run record to the spool as soon as it is measured, prints {"runs": N} on its last line and
exits 0. An EngineError (a server that would not start, an answer the engine cannot use) ends it
with status 1 and the error's message as the last line of its stderr, which the agent reports as the
job's failure.
A crash, an out-of-memory kill or a hang ends only this process; the agent fails the job and
kills this worker's process group, servers included.
A worker whose agent has died (kill -9) stops too, and takes the servers it started with it:
benchmarks never share a machine, and a restarted agent will run the next attempt. ALIVE_FD is
the read end of a pipe whose write end only the agent holds: the worker reads it from its first
moment, and its end of file (the agent is gone, even before the worker started) stops the worker.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from pathlib import Path

from agent.config import BY_FIELD, field_from_environment
from agent.engines import make_engine
from agent.engines.base import EngineError
from agent.engines.server_process import stop_all
from agent.protocol import run_job
from agent.spool import Spool
from specfleet.record import JobSpec, ModelIdentity
from specfleet.settings import BY_NAME

ORPHANED_EXIT_STATUS = 3
ENGINE_ERROR_STATUS = 1


def _exit_when_orphaned(alive_fd: int) -> None:
    """Read the agent's pipe until its end of file (or an error): then the agent is gone, and
    this worker stops its servers, its process group and itself."""
    try:
        while os.read(alive_fd, 1):
            pass
    except OSError:
        pass
    print("the agent that started this worker is gone; stopping", file=sys.stderr, flush=True)
    stop_all()
    if os.getpgrp() == os.getpid():  # started by an agent, so the group is this job's alone
        os.killpg(os.getpid(), signal.SIGKILL)  # whatever its servers started, and this worker
    os._exit(ORPHANED_EXIT_STATUS)


THREADS_ENV = BY_FIELD["threads"].env


def default_threads() -> int:
    """The agent's thread count for llama.cpp where a sweep names none, the same for our loop and
    llama-server: AgentConfig.threads (agent/config.py: SPECFLEET_THREADS where the agent's
    environment sets it, a machine that runs other work beside the agent, else the machine's
    physical cores, llama.cpp's own default), read here from the environment this process
    inherited, by the same row. ValueError naming the variable when it is not a whole number
    from 1 to 1024."""
    return field_from_environment("threads")


def resolved(spec: JobSpec, memory_bytes: int | None = None, threads: int | None = None) -> JobSpec:
    """The spec with what the agent decides filled in: threads 0 -> the agent's `threads` (its
    AgentConfig's, which it writes in the job file), else default_threads(); the machine's
    memory in GiB, rounded (setting memory_gb, a claim condition), where it is known."""
    if spec.settings.threads == 0 and spec.engine in BY_NAME["threads"].engines:
        chosen = threads or default_threads()
        spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, threads=chosen))
    if memory_bytes:
        memory_gb = max(1, round(memory_bytes / 2**30))
        spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, memory_gb=memory_gb))
    return spec


def engine_options(spec: JobSpec, job: dict, workdir: Path) -> dict:
    """make_engine's options for the job's engine: the llama.cpp engines get the cell's declared
    settings (threads, ...); server engines the cell's server settings, the machine's memory (for
    their interleaving) and the job directory for their servers' logs."""
    if spec.engine == "llama.cpp":
        return {"settings": spec.settings}
    if spec.engine not in ("llama-server", "openai"):
        return {}
    options = {"memory_bytes": job.get("memory_bytes") or None, "log_dir": str(workdir)}
    if spec.engine == "llama-server":
        flags = spec.server.flags if spec.server else ()
        build = spec.server.build if spec.server else ""
        return {**options, "binary": job.get("llama_server"), "flags": flags, "settings": spec.settings, "build": build}
    return {**options, "server": spec.server}


def main(argv: list[str]) -> int:
    threading.Thread(target=_exit_when_orphaned, args=(int(argv[2]),), daemon=True).start()
    job_file = Path(argv[0])
    job = json.loads(job_file.read_text())
    spool = Spool(Path(argv[1]))
    spec = resolved(JobSpec.from_json(job["spec"]), job.get("memory_bytes"), job.get("threads"))
    models = {role: ModelIdentity(**identity) for role, identity in job["models"].items()}
    try:
        runs = run_job(
            spec,
            make_engine(spec.engine, **engine_options(spec, job, job_file.parent)),
            lambda record: spool.put(job["job_id"], job["lease_id"], record),
            job_id=job["job_id"],
            attempt=job["attempt"],
            target=models["target"],
            draft=models.get("draft"),
            memory_total_bytes=job.get("memory_bytes") or None,
        )
    except EngineError as e:
        # One line: the agent reports a crashed worker by its last line (a server's log tail included)
        print(f"{type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return ENGINE_ERROR_STATUS
    print(json.dumps({"runs": runs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

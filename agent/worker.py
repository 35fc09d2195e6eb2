"""A worker process runs one job and exits (pyperf-style isolation).

`python -m agent.worker JOB.json SPOOL_DIR`: JOB.json holds the job's ids, its `JobSpec` (with
local model paths) and the models' identities; the worker loads the engine, measures, writes
every run record to the spool as soon as it is measured, prints {"runs": N} on its last line and exits 0.
A crash, an out-of-memory kill or a hang ends only this process; the agent fails the job.
A worker whose agent has died (kill -9) stops too: benchmarks never share a machine, and a
restarted agent will run the next attempt.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from agent.engines import make_engine
from agent.protocol import run_job
from agent.spool import Spool
from specfleet.record import JobSpec, ModelIdentity

PARENT_CHECK_SECONDS = 0.5
ORPHANED_EXIT_STATUS = 3


def _exit_when_orphaned(parent: int) -> None:
    while True:
        time.sleep(PARENT_CHECK_SECONDS)
        if os.getppid() != parent:
            print("the agent that started this worker is gone; stopping", file=sys.stderr, flush=True)
            os._exit(ORPHANED_EXIT_STATUS)


def main(argv: list[str]) -> int:
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    job = json.loads(Path(argv[0]).read_text())
    spool = Spool(Path(argv[1]))
    spec = JobSpec.from_json(job["spec"])
    models = {role: ModelIdentity(**identity) for role, identity in job["models"].items()}
    runs = run_job(
        spec,
        make_engine(spec.engine),
        lambda record: spool.put(job["job_id"], job["lease_id"], record),
        job_id=job["job_id"],
        attempt=job["attempt"],
        target=models["target"],
        draft=models.get("draft"),
        memory_total_bytes=job.get("memory_bytes") or None,
    )
    print(json.dumps({"runs": runs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A stand-in for agent.worker (`python -m tests.support.poison_worker JOB.json SPOOL_DIR ...`): it spools
two valid runs of its job, then the poisoned records SPECFLEET_POISON names (comma-separated),
and prints the count of all it wrote, as a worker whose own records went bad would.

Poisons: `big` (a valid record padded past the coordinator's 4 MiB message limit), `invalid`
(a record with a field the coordinator does not know), and records the agent cannot read:
`not-json`, `surrogate` (a lone surrogate in the record), `no-lease` (no lease_id) and
`unknown-field` (a field the spool does not know)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from agent.spool import SCHEMA_VERSION, Spool
from tests.support.fleet import run_record

BIG_RECORD_BYTES = 5 * 2**20


def poisoned(kind: str, job: dict) -> tuple[str, str]:
    """(run id, the spool file's text) of one poisoned record of the job."""
    run = run_record(job["job_id"], attempt=job["attempt"])
    envelope = {"schema": SCHEMA_VERSION, "job_id": job["job_id"], "lease_id": job["lease_id"]}
    if kind == "big":
        return run.run_id, json.dumps({**envelope, "record": run.to_json() + " " * BIG_RECORD_BYTES})
    if kind == "invalid":
        return run.run_id, json.dumps({**envelope, "record": json.dumps({**run.to_dict(), "colour": "blue"})})
    if kind == "not-json":
        return run.run_id, '{"schema": 2, "job_id": "' + job["job_id"] + '", "rec'
    if kind == "surrogate":
        record = run.to_json().replace('"code-01"', '"code-\ud800"')  # the character, not its escape
        return run.run_id, json.dumps({**envelope, "record": record})
    if kind == "no-lease":
        return run.run_id, json.dumps({"schema": SCHEMA_VERSION, "job_id": job["job_id"], "record": run.to_json()})
    if kind == "unknown-field":
        return run.run_id, json.dumps({**envelope, "record": run.to_json(), "priority": "high"})
    raise ValueError(f"unknown poison {kind!r}")


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    spool = Spool(Path(argv[1]))
    for _ in range(2):
        spool.put(job["job_id"], job["lease_id"], run_record(job["job_id"], attempt=job["attempt"]))
    kinds = [k for k in os.environ.get("SPECFLEET_POISON", "").split(",") if k]
    for kind in kinds:
        run_id, text = poisoned(kind, job)
        (spool.pending / f"{run_id}.json").write_text(text)
    print(json.dumps({"runs": 2 + len(kinds)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

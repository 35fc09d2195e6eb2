"""The durable spool: every run is on disk (fsync'd) before anyone tries to upload it.

One JSON file per run in `pending/`, written to a temporary name and renamed, so a crash at
any moment leaves either the whole record or nothing. A record leaves `pending/` only once the
coordinator has acknowledged it (deleted) or refused it for good (moved to `refused/` with the
reason, never dropped). `measured.log` lists the id of every run ever put, so that what was
measured can be checked against what the coordinator stored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specfleet.record import RunRecord

SCHEMA_VERSION = 2  # of the spool file; the record inside carries its own schema


@dataclass(frozen=True)
class Spooled:
    path: Path
    job_id: str
    lease_id: str
    record_json: str  # the RunRecord exactly as the worker wrote it: uploaded unchanged

    @property
    def run_id(self) -> str:
        return self.path.stem


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    def __init__(self, root: Path):
        self.pending = root / "pending"
        self.refused = root / "refused"
        self.journal = root / "measured.log"
        self.pending.mkdir(parents=True, exist_ok=True)
        self.refused.mkdir(parents=True, exist_ok=True)

    def put(self, job_id: str, lease_id: str, run: RunRecord) -> Path:
        record = {"schema": SCHEMA_VERSION, "job_id": job_id, "lease_id": lease_id, "record": run.to_json()}
        path = self.pending / f"{run.run_id}.json"
        tmp = self.pending / f".{run.run_id}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.pending)
        with open(self.journal, "a") as f:
            f.write(run.run_id + "\n")
            f.flush()
            os.fsync(f.fileno())
        return path

    def measured(self) -> list[str]:
        """Ids of every run ever put in this spool, in order."""
        return self.journal.read_text().split() if self.journal.exists() else []

    def items(self) -> list[Spooled]:
        """Pending records, oldest first."""
        out = []
        for path in sorted(self.pending.glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
            record = json.loads(path.read_text())
            if record.get("schema") != SCHEMA_VERSION:
                raise ValueError(f"{path}: spool schema {record.get('schema')} is not {SCHEMA_VERSION}")
            out.append(Spooled(path, record["job_id"], record["lease_id"], record["record"]))
        return out

    def depth(self) -> int:
        return sum(1 for _ in self.pending.glob("*.json"))

    def ack(self, item: Spooled) -> None:
        item.path.unlink(missing_ok=True)
        _fsync_dir(self.pending)

    def refuse(self, item: Spooled, reason: str) -> None:
        """Keep a record the coordinator will never take, with the reason, out of the upload queue."""
        record = json.loads(item.path.read_text())
        record["refused_reason"] = reason
        target = self.refused / item.path.name
        target.write_text(json.dumps(record))
        item.path.unlink()
        _fsync_dir(self.pending)

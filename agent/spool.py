"""The durable spool: every run is on disk (fsync'd) before anyone tries to upload it.

One JSON file per run in `pending/`, written to a temporary name and renamed, so a crash at
any moment leaves either the whole record or nothing. A record leaves `pending/` only once the
coordinator has acknowledged it (deleted) or it is parked: refused for good by the coordinator,
or unreadable here (not JSON, not UTF-8, a field missing, mistyped or unknown). A parked record
moves to `refused/` untouched, its reason beside it in `<run id>.reason`; nothing is dropped.
`measured.log` lists the id of every run ever put, so that what was measured can be checked
against what the coordinator stored.

`parked()` lists the parked records with their reasons and `requeue()` moves one back to
`pending/` (`specfleet agent spool list|retry`), unless its reason still holds here: a file that
still cannot be read, a record this agent's own validation refuses. A reason only the
coordinator can judge (a lease that is gone, its validation) is judged by it again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specfleet.record import InvalidRecord, RunRecord

SCHEMA_VERSION = 2  # of the spool file; the record inside carries its own schema
FIELDS = ("schema", "job_id", "lease_id", "record")


@dataclass(frozen=True)
class Spooled:
    path: Path
    job_id: str
    lease_id: str
    record_json: str  # the RunRecord exactly as the worker wrote it: uploaded unchanged

    @property
    def run_id(self) -> str:
        return self.path.stem


@dataclass(frozen=True)
class ParkedRecord:
    run_id: str
    path: Path
    reason: str  # as written when it was parked; "" if its reason file is gone
    parked_at: float  # unix seconds


class StillRefused(ValueError):
    """A parked record whose reason still holds: `requeue` leaves it parked."""


class Unreadable(ValueError):
    """A spool file that is no record: `job_id` as far as it could be read ("" if not)."""

    def __init__(self, path: Path, reason: str, job_id: str = ""):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.job_id = path, reason, job_id


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read(path: Path) -> Spooled:
    """The record in one spool file; Unreadable naming what is wrong with it."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise Unreadable(path, f"not UTF-8: {e}") from None
    except ValueError as e:
        raise Unreadable(path, f"not JSON: {e}") from None
    except OSError as e:
        raise Unreadable(path, f"cannot be read: {e}") from None
    if not isinstance(data, dict):
        raise Unreadable(path, f"not a spool record: a JSON {type(data).__name__}")
    job_id = data.get("job_id") if isinstance(data.get("job_id"), str) else ""
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise Unreadable(path, f"unknown field(s) {', '.join(map(repr, unknown))}", job_id)
    if data.get("schema") != SCHEMA_VERSION:
        raise Unreadable(path, f"spool schema {data.get('schema')!r} is not {SCHEMA_VERSION}", job_id)
    for name in FIELDS[1:]:
        value = data.get(name)
        if not isinstance(value, str):
            raise Unreadable(path, f"{name} is missing" if value is None else f"{name} is not a string", job_id)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise Unreadable(path, f"{name} cannot be sent as UTF-8 (a lone surrogate): {e}", job_id) from None
    return Spooled(path, data["job_id"], data["lease_id"], data["record"])


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
        _write_durably(tmp, json.dumps(record))
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

    def paths(self) -> list[Path]:
        """Pending record files, oldest first (one that vanishes meanwhile is left out)."""
        dated = []
        for path in self.pending.glob("*.json"):
            try:
                dated.append((path.stat().st_mtime_ns, path))
            except FileNotFoundError:
                continue
        return [path for _, path in sorted(dated)]

    def depth(self) -> int:
        return sum(1 for _ in self.pending.glob("*.json"))

    def ack(self, item: Spooled) -> None:
        item.path.unlink(missing_ok=True)
        _fsync_dir(self.pending)

    def park(self, path: Path, reason: str) -> Path:
        """Move a pending file that will never be uploaded to `refused/`, untouched, with its
        reason beside it; returns where the record now is."""
        target = self.refused / path.name
        _write_durably(target.with_suffix(".reason"), reason + "\n")
        os.replace(path, target)
        _fsync_dir(self.refused)
        _fsync_dir(self.pending)
        return target

    def parked(self) -> list[ParkedRecord]:
        """The parked records, oldest first, each with the reason it was parked for."""
        found = []
        for path in self.refused.glob("*.json"):
            try:
                parked_at = path.stat().st_mtime
            except FileNotFoundError:
                continue
            reason_file = path.with_suffix(".reason")
            reason = reason_file.read_text(errors="replace").strip() if reason_file.exists() else ""
            found.append(ParkedRecord(path.stem, path, reason, parked_at))
        return sorted(found, key=lambda p: (p.parked_at, p.run_id))

    def requeue(self, run_id: str) -> Path:
        """Move a parked record back to `pending/`, where the uploader takes it; returns its path.
        KeyError when no record of that id is parked; StillRefused naming it and why when it
        still cannot be read here or this agent's record validation still refuses it."""
        parked = self.refused / f"{run_id}.json"
        if not parked.exists() or parked.name.startswith("."):
            raise KeyError(f"no parked record {run_id!r} in {self.refused}")
        try:
            item = read(parked)
            RunRecord.from_json(item.record_json)
        except (Unreadable, InvalidRecord) as e:
            why = e.reason if isinstance(e, Unreadable) else str(e)
            raise StillRefused(f"{run_id}: still refused: {why}") from None
        target = self.pending / parked.name
        os.replace(parked, target)
        _fsync_dir(self.pending)
        parked.with_suffix(".reason").unlink(missing_ok=True)
        _fsync_dir(self.refused)
        return target

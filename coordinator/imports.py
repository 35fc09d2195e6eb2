"""Storing imported results (`specfleet import`): the rows an admin parsed from llama-bench or
mtplx output on their machine, in table `imported_results`, all in one transaction.

The client (cli/importers) validated every row and the service bounded every field
(coordinator/limits.py); here the rows are checked once more for what a bound cannot say (a
known tool and method, a JSON object where JSON is due), then stored together or not at all.
A row's `import_id` is the SHA-256 of its tool and its fields as the file gives them, so the
same row imported twice, from the same file or another, is stored once: the second time it
counts as a duplicate.
"""

from __future__ import annotations

import hashlib
import json
import time

from coordinator.store import Store
from protos.specfleet.v1 import fleet_pb2 as pb

TOOLS = ("llama-bench", "mtplx bench", "mtplx tune")
METHODS = ("baseline", "mtp")


class InvalidImport(ValueError):
    """A row the coordinator refuses; nothing of the request is stored."""


def _json_object(text: str, where: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidImport(f"{where}: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise InvalidImport(f"{where}: must be a JSON object, got {type(value).__name__}")
    return value


def import_id(tool: str, fields: dict) -> str:
    """A row's identity: its tool and its fields (canonical JSON), whatever file carried it."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{tool}\n{canonical}".encode()).hexdigest()


def _checked(result: pb.ImportedResult, index: int) -> tuple:
    where = f"results[{index}]"
    if result.tool not in TOOLS:
        raise InvalidImport(f"{where}.tool: {result.tool!r} is not one of {', '.join(TOOLS)}")
    if result.method not in METHODS:
        raise InvalidImport(f"{where}.method: {result.method!r} is not one of {', '.join(METHODS)}")
    if result.quality_gates_json:
        _json_object(result.quality_gates_json, f"{where}.quality_gates_json")
    fields = _json_object(result.fields_json, f"{where}.fields_json")
    return (
        import_id(result.tool, fields),
        result.tool,
        result.tool_version,
        result.source_file,
        result.source_sha256,
        result.source_line,
        result.machine,
        result.model,
        result.test,
        result.method,
        result.draft_depth,
        result.n_prompt,
        result.n_gen,
        result.n_depth,
        result.tokens_per_second,
        result.tokens_per_second_stddev if result.has_stddev else None,
        list(result.samples_tokens_per_second),
        list(result.acceptance_by_depth),
        result.quality_gates_json or None,
        result.measured_at,
        result.fields_json,
    )


def store_imported(store: Store, request: pb.ImportResultsRequest, imported_by: str) -> tuple[int, int]:
    """Store the request's rows not stored before, in one transaction; (stored, duplicates)."""
    if not request.results:
        raise InvalidImport("results: nothing to import")
    rows = [_checked(result, i) for i, result in enumerate(request.results)]
    now = time.time()
    with store.tx() as con:
        seen = {
            known
            for (known,) in con.execute(
                "SELECT import_id FROM imported_results WHERE import_id IN (SELECT unnest(?))", [[r[0] for r in rows]]
            ).fetchall()
        }
        new = []
        for row in rows:
            if row[0] not in seen:
                seen.add(row[0])  # the same row twice in one file is stored once
                new.append([*row, request.machine_note, imported_by, request.local_user, now])
        if new:
            con.executemany(
                "INSERT INTO imported_results (import_id, tool, tool_version, source_file, source_sha256, source_line,"
                " machine, model, test, method, draft_depth, n_prompt, n_gen, n_depth, tokens_per_second,"
                " tokens_per_second_stddev, samples_tokens_per_second, acceptance_by_depth, quality_gates, measured_at,"
                " fields, machine_note, imported_by, imported_by_user, imported_at, seq)"
                " VALUES (" + ", ".join("?" * 25) + ", nextval('ingest_seq'))",
                new,
            )
    return len(new), len(rows) - len(new)

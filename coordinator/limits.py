"""Bounds on every field of every request the coordinator's services accept, in one table.

`LIMITS` names each field as `Message.field`: a string is bounded in characters, a repeated
field in items (each item a string bounded too), a map in entries (keys and values bounded),
a number by its range (and finite), a repeated number field in items (each in its range), a
repeated message field in items. Nested messages (Fingerprint, each ImportedResult) are walked,
booleans need no bound. `problems(request)` names every field out of bounds by its path in the request
("fingerprint.chip: 1048576 characters; at most 128"); the service refuses such a request with
INVALID_ARGUMENT before it reads anything else of it, so nothing of it is stored. `unbounded()`
lists the fields of request messages missing from the table: a test keeps it empty, so that a
field added to the proto is bounded before it is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from protos.specfleet.v1 import fleet_pb2 as pb

MAX_ID_CHARS = 64  # job, lease, sweep and agent ids ("job-" and 12 hex digits)
MAX_RECORD_CHARS = 256 * 1024  # a run record's JSON (ingest validates what is inside)
MAX_SWEEP_YAML_CHARS = 1024 * 1024
MAX_REASON_CHARS = 4096  # an agent's reason holds up to 2000 characters of its worker's stderr
MAX_STATUS_CHARS = 1024
MAX_IMPORT_ROWS = 10_000  # results of one import (one file); the message size bounds it too
MAX_IMPORT_FIELDS_CHARS = 16 * 1024  # one imported row as its file gives it, as JSON


@dataclass(frozen=True)
class Text:
    max_chars: int
    min_chars: int = 0


@dataclass(frozen=True)
class Items:
    max_items: int
    item: Text


@dataclass(frozen=True)
class Entries:
    max_entries: int
    key: Text
    value: Text


@dataclass(frozen=True)
class Number:
    low: float
    high: float


@dataclass(frozen=True)
class Numbers:
    max_items: int
    item: Number


@dataclass(frozen=True)
class Messages:
    max_items: int


ID = Text(MAX_ID_CHARS)
COUNT = Number(0, 1_000_000)
TOKENS = Number(0, 2**31 - 1)

LIMITS: dict[str, Text | Items | Entries | Number | Numbers | Messages] = {
    "Fingerprint.hostname": Text(255),
    "Fingerprint.os": Text(32),
    "Fingerprint.os_version": Text(64),
    "Fingerprint.chip": Text(128),
    "Fingerprint.gpu_cores": Number(0, 4096),
    "Fingerprint.performance_cores": Number(0, 4096),
    "Fingerprint.efficiency_cores": Number(0, 4096),
    "Fingerprint.cpu_cores": Number(0, 65536),
    "Fingerprint.hardware_digest": Text(64),
    "Fingerprint.memory_bytes": Number(0, 2**50),
    "Fingerprint.model_identifier": Text(64),
    "Fingerprint.memory_bandwidth_bytes_per_second": Number(0, 1e14),
    "Fingerprint.gpus": Items(16, Text(128)),
    "Fingerprint.engine_versions": Entries(32, Text(64), Text(128)),
    "Fingerprint.unavailable": Items(32, Text(64)),
    "EnrolRequest.token": Text(128),
    "EnrolRequest.name": Text(64, min_chars=1),
    "EnrolRequest.labels": Entries(32, Text(64), Text(256)),
    "EnrolRequest.engines": Items(16, Text(32)),
    "HeartbeatRequest.job_id": ID,
    "HeartbeatRequest.lease_id": ID,
    "HeartbeatRequest.status": Text(MAX_STATUS_CHARS),
    "AcquireJobRequest.wait_seconds": Number(0, 3600),
    "ReportResultRequest.job_id": ID,
    "ReportResultRequest.lease_id": ID,
    "ReportResultRequest.record_json": Text(MAX_RECORD_CHARS),
    "CompleteJobRequest.job_id": ID,
    "CompleteJobRequest.lease_id": ID,
    "CompleteJobRequest.run_count": COUNT,
    "CompleteJobRequest.held_runs": COUNT,
    "FailJobRequest.job_id": ID,
    "FailJobRequest.lease_id": ID,
    "FailJobRequest.reason": Text(MAX_REASON_CHARS),
    "CreateTokenRequest.ttl_seconds": Number(0, 365 * 86400),  # 0: the default
    "CreateTokenRequest.max_uses": Number(0, 100_000),  # 0: the default
    "CreateTokenRequest.note": Text(256),
    "SubmitSweepRequest.yaml": Text(MAX_SWEEP_YAML_CHARS),
    "GetSweepRequest.sweep_id": ID,
    "CancelSweepRequest.sweep_id": ID,
    "SetAgentStateRequest.agent_id": ID,
    "SetAgentStateRequest.state": Text(16),
    "ExportRequest.table": Text(16),
    "ExportRequest.after_seq": Number(0, 2**63 - 1),
    "ExportRequest.limit": Number(0, 2**31 - 1),
    "ImportResultsRequest.results": Messages(MAX_IMPORT_ROWS),
    "ImportResultsRequest.machine_note": Text(256),
    "ImportResultsRequest.local_user": Text(64),
    "ImportedResult.tool": Text(32, min_chars=1),
    "ImportedResult.tool_version": Text(128),
    "ImportedResult.source_file": Text(255, min_chars=1),
    "ImportedResult.source_sha256": Text(64, min_chars=64),
    "ImportedResult.source_line": Number(1, 2**31 - 1),
    "ImportedResult.machine": Text(512),
    "ImportedResult.model": Text(512, min_chars=1),
    "ImportedResult.test": Text(128, min_chars=1),
    "ImportedResult.method": Text(16, min_chars=1),
    "ImportedResult.draft_depth": Number(0, 64),
    "ImportedResult.n_prompt": TOKENS,
    "ImportedResult.n_gen": TOKENS,
    "ImportedResult.n_depth": TOKENS,
    "ImportedResult.tokens_per_second": Number(0, 1e9),
    "ImportedResult.tokens_per_second_stddev": Number(0, 1e9),
    "ImportedResult.samples_tokens_per_second": Numbers(1000, Number(0, 1e9)),
    "ImportedResult.acceptance_by_depth": Numbers(64, Number(0, 1)),
    "ImportedResult.quality_gates_json": Text(4096),
    "ImportedResult.measured_at": Text(64),
    "ImportedResult.fields_json": Text(MAX_IMPORT_FIELDS_CHARS, min_chars=2),
}

SERVICES = ("AgentService", "AdminService")


def messages() -> dict[str, Descriptor]:
    """Every message a request of the services holds, by name: the requests and those nested."""
    found: dict[str, Descriptor] = {}

    def visit(message: Descriptor) -> None:
        if message.name in found:
            return
        found[message.name] = message
        for field in message.fields:
            if field.message_type is not None and not field.message_type.GetOptions().map_entry:
                visit(field.message_type)

    for service in SERVICES:
        for method in pb.DESCRIPTOR.services_by_name[service].methods:
            visit(method.input_type)
    return found


def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _needs_bound(field: FieldDescriptor) -> bool:
    nested = field.message_type is not None and not field.message_type.GetOptions().map_entry
    return field.type != FieldDescriptor.TYPE_BOOL and (not nested or _repeated(field))


def unbounded() -> list[str]:
    """`Message.field` of every field of a request message that LIMITS does not bound."""
    return sorted(
        f"{name}.{field.name}"
        for name, message in messages().items()
        for field in message.fields
        if _needs_bound(field) and f"{name}.{field.name}" not in LIMITS
    )


def _text(path: str, value: str, bound: Text) -> str | None:
    if bound.min_chars <= len(value) <= bound.max_chars:
        return None
    if bound.min_chars == 0:
        return f"{path}: {len(value)} characters; at most {bound.max_chars}"
    return f"{path}: {len(value)} characters; must be {bound.min_chars}-{bound.max_chars}"


def _number(path: str, value: float, bound: Number) -> str | None:
    if math.isfinite(value) and bound.low <= value <= bound.high:
        return None
    return f"{path}: {value!r} is not in [{bound.low:g}, {bound.high:g}]"


def _short(key: str) -> str:
    return repr(key if len(key) <= 20 else key[:20] + "...")


def problems(message, prefix: str = "") -> list[str]:
    """Every field of `message` (and of the messages it holds) out of its bound, by path."""
    out: list[str] = []
    name = message.DESCRIPTOR.name
    for field in message.DESCRIPTOR.fields:
        path = prefix + field.name
        value = getattr(message, field.name)
        nested = field.message_type is not None and not field.message_type.GetOptions().map_entry
        bound = LIMITS.get(f"{name}.{field.name}")
        if nested and _repeated(field):
            if len(value) > bound.max_items:
                out.append(f"{path}: {len(value)} items; at most {bound.max_items}")
            else:
                for i, item in enumerate(value):
                    out.extend(problems(item, f"{path}[{i}]."))
            continue
        if nested:
            if message.HasField(field.name):
                out.extend(problems(value, path + "."))
            continue
        if bound is None:  # a boolean (unbounded() keeps the rest in the table)
            continue
        if isinstance(bound, Text):
            out.append(_text(path, value, bound))
        elif isinstance(bound, Number):
            out.append(_number(path, value, bound))
        elif isinstance(bound, Numbers):
            if len(value) > bound.max_items:
                out.append(f"{path}: {len(value)} items; at most {bound.max_items}")
            else:
                out.extend(_number(f"{path}[{i}]", item, bound.item) for i, item in enumerate(value))
        elif isinstance(bound, Items):
            if len(value) > bound.max_items:
                out.append(f"{path}: {len(value)} items; at most {bound.max_items}")
            else:
                out.extend(_text(f"{path}[{i}]", item, bound.item) for i, item in enumerate(value))
        else:
            if len(value) > bound.max_entries:
                out.append(f"{path}: {len(value)} entries; at most {bound.max_entries}")
            else:
                for key, item in value.items():
                    out.append(_text(f"{path} key {_short(key)}", key, bound.key))
                    out.append(_text(f"{path}[{_short(key)}]", item, bound.value))
    return [p for p in out if p is not None]

"""The coordinator's domain errors and the gRPC status each is answered with: one table, used by
every servicer through `answered` (coordinator/service.py), instead of an `except` per call.

A class's status is its own entry or, failing that, its nearest ancestor's (so UnknownEntity,
a StateError, answers NOT_FOUND and every other StateError FAILED_PRECONDITION); an exception
with no entry is a bug and goes on to gRPC as INTERNAL. An AuthError carries its own code.
"""

from __future__ import annotations

import contextlib

import grpc

from coordinator.auth import AuthError
from coordinator.imports import InvalidImport
from coordinator.ingest import InvalidRun, NewerRun
from coordinator.scheduler import NoMatchingAgents
from coordinator.states import StateError, UnknownEntity
from coordinator.store import StoreUnavailable
from specfleet.sweeps import SweepError

# Trailing metadata of a run refused as NewerRun: the newest record schema this coordinator
# reads, so that the agent holds the record instead of parking it (agent/upload.py).
READABLE_SCHEMA_KEY = "specfleet-max-record-schema"

STATUS: dict[type[BaseException], grpc.StatusCode] = {
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,  # the store's own fault: retry later
    UnknownEntity: grpc.StatusCode.NOT_FOUND,
    NoMatchingAgents: grpc.StatusCode.FAILED_PRECONDITION,
    StateError: grpc.StatusCode.FAILED_PRECONDITION,  # a stale lease, a move a state does not allow
    NewerRun: grpc.StatusCode.FAILED_PRECONDITION,  # not wrong, too new: held by the agent
    InvalidRun: grpc.StatusCode.INVALID_ARGUMENT,
    SweepError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidImport: grpc.StatusCode.INVALID_ARGUMENT,
    ValueError: grpc.StatusCode.INVALID_ARGUMENT,  # a request's value refused (a name, a state, a ttl)
}


def status_of(error: BaseException) -> grpc.StatusCode | None:
    """The status `error` is answered with; None for an error of no entry (a bug)."""
    if isinstance(error, AuthError):
        return error.code
    return next((STATUS[cls] for cls in type(error).__mro__ if cls in STATUS), None)


def trailing_metadata(error: BaseException) -> tuple:
    return ((READABLE_SCHEMA_KEY, str(error.readable)),) if isinstance(error, NewerRun) else ()


@contextlib.asynccontextmanager
async def answered(context):
    """Answer a domain error raised inside with its status (STATUS) and its message."""
    try:
        yield
    except Exception as e:
        code = status_of(e)
        if code is None:
            raise
        await context.abort(code, str(e), trailing_metadata=trailing_metadata(e))

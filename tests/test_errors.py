"""coordinator/errors.py: one table of domain errors and their gRPC statuses, nearest ancestor first."""

import grpc

from coordinator.auth import AuthError
from coordinator.errors import READABLE_SCHEMA_KEY, STATUS, status_of, trailing_metadata
from coordinator.ingest import InvalidRun, NewerRun
from coordinator.scheduler import NoMatchingAgents, SchedulerError
from coordinator.states import StateError, UnknownEntity
from coordinator.store import StoreUnavailable
from specfleet.sweeps import SweepError


def test_each_error_is_answered_with_its_own_or_its_nearest_ancestors_status():
    assert status_of(UnknownEntity("unknown sweep s")) == grpc.StatusCode.NOT_FOUND  # before StateError's
    assert status_of(StateError("sweep s is done")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_of(SchedulerError("lease l is no longer valid")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_of(NoMatchingAgents("no agent")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status_of(NewerRun("too new", 3)) == grpc.StatusCode.FAILED_PRECONDITION  # before ValueError's
    assert status_of(InvalidRun("bad")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(SweepError(["x: bad"])) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(StoreUnavailable("disk full")) == grpc.StatusCode.UNAVAILABLE
    assert status_of(AuthError(grpc.StatusCode.PERMISSION_DENIED, "revoked")) == grpc.StatusCode.PERMISSION_DENIED
    assert status_of(KeyError("a bug")) is None and status_of(RuntimeError("a bug")) is None  # INTERNAL


def test_a_newer_run_carries_the_schema_the_coordinator_reads_and_nothing_else_does():
    assert trailing_metadata(NewerRun("too new", 7)) == ((READABLE_SCHEMA_KEY, "7"),)
    assert trailing_metadata(InvalidRun("bad")) == ()
    assert all(isinstance(code, grpc.StatusCode) for code in STATUS.values())

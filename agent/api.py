"""A thin gRPC client for the coordinator: one method per call, no retries (see client.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from protos.specfleet.v1 import fleet_pb2 as pb
from protos.specfleet.v1 import fleet_pb2_grpc as pb_grpc

CALL_TIMEOUT_SECONDS = 30.0


def channel(address: str, ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> grpc.Channel:
    """A channel to the coordinator; TLS when a CA is given, mTLS when a client cert is too."""
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    if ca is None:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    return grpc.secure_channel(address, creds, options=options)


class AgentApi:
    def __init__(self, chan: grpc.Channel, credential: str = ""):
        self._stub = pb_grpc.AgentServiceStub(chan)
        self._metadata = (("authorization", f"Bearer {credential}"),) if credential else ()

    def enrol(
        self, token: str, name: str, fingerprint: pb.Fingerprint, labels: dict[str, str], engines: list[str]
    ) -> pb.EnrolResponse:
        return self._stub.Enrol(
            pb.EnrolRequest(token=token, name=name, fingerprint=fingerprint, labels=labels, engines=engines),
            timeout=CALL_TIMEOUT_SECONDS,
        )

    def heartbeat(
        self, job_id: str = "", lease_id: str = "", status: str = "", fingerprint: pb.Fingerprint | None = None
    ) -> pb.HeartbeatResponse:
        return self._stub.Heartbeat(
            pb.HeartbeatRequest(job_id=job_id, lease_id=lease_id, status=status, fingerprint=fingerprint),
            metadata=self._metadata,
            timeout=CALL_TIMEOUT_SECONDS,
        )

    def acquire_job(self, wait_seconds: float, stop: threading.Event | None = None) -> pb.AcquireJobResponse:
        """Long-poll for a job; `stop` cancels the wait (raising InterruptedError)."""
        future = self._stub.AcquireJob.future(
            pb.AcquireJobRequest(wait_seconds=wait_seconds),
            metadata=self._metadata,
            timeout=wait_seconds + CALL_TIMEOUT_SECONDS,
        )
        while stop is not None and not future.done():
            if stop.wait(0.2):
                future.cancel()
                raise InterruptedError("acquire cancelled: agent stopping")
        return future.result()

    def report_result(self, job_id: str, lease_id: str, run: pb.Run) -> pb.ReportResultResponse:
        return self._stub.ReportResult(
            pb.ReportResultRequest(job_id=job_id, lease_id=lease_id, run=run),
            metadata=self._metadata,
            timeout=CALL_TIMEOUT_SECONDS,
        )

    def complete_job(self, job_id: str, lease_id: str, run_count: int) -> pb.CompleteJobResponse:
        return self._stub.CompleteJob(
            pb.CompleteJobRequest(job_id=job_id, lease_id=lease_id, run_count=run_count),
            metadata=self._metadata,
            timeout=CALL_TIMEOUT_SECONDS,
        )

    def fail_job(self, job_id: str, lease_id: str, reason: str, refused: bool = False) -> pb.FailJobResponse:
        return self._stub.FailJob(
            pb.FailJobRequest(job_id=job_id, lease_id=lease_id, reason=reason, refused=refused),
            metadata=self._metadata,
            timeout=CALL_TIMEOUT_SECONDS,
        )


class AdminApi:
    def __init__(self, chan: grpc.Channel, credential: str):
        self._stub = pb_grpc.AdminServiceStub(chan)
        self._metadata = (("authorization", f"Bearer {credential}"),)

    def __getattr__(self, name):
        """AdminApi.CreateToken(request) etc.: every admin RPC with the admin credential attached."""
        rpc = getattr(self._stub, name)
        return lambda request, timeout=CALL_TIMEOUT_SECONDS: rpc(request, metadata=self._metadata, timeout=timeout)

"""A thin gRPC client for the coordinator, shared by the agent, the dashboard and the CLI: one
method per call (heartbeats and results each travel on one stream), no retries (the agent adds
them: agent/retry.py); and the Export read path (a table's rows one page at a time, as Arrow)."""

from __future__ import annotations

import ipaddress
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa

from protos.specfleet.v1 import fleet_pb2 as pb
from protos.specfleet.v1 import fleet_pb2_grpc as pb_grpc

CALL_TIMEOUT_SECONDS = 30.0
# A hung connection (a Wi-Fi drop: the TCP connection stays up, nothing arrives) is noticed
# within KEEPALIVE_SECONDS + KEEPALIVE_TIMEOUT_SECONDS (15 s): the channel pings the coordinator
# every KEEPALIVE_SECONDS, calls in flight or not, and closes a connection whose ping is not
# answered in KEEPALIVE_TIMEOUT_SECONDS; its calls fail UNAVAILABLE (retried) and the channel
# opens a new connection, retrying at most every MAX_RECONNECT_SECONDS (gRPC's own default backs
# off to 120 s, which would keep an agent off a link that came back for two minutes); each
# attempt waits gRPC's 20 s for the coordinator's handshake, which a slow link needs. The
# coordinator permits these pings (coordinator/server.py KEEPALIVE_OPTIONS).
KEEPALIVE_SECONDS = 10.0
KEEPALIVE_TIMEOUT_SECONDS = 5.0
MAX_RECONNECT_SECONDS = 5.0
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
    ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_SECONDS * 1000)),
    # Every other ping (the one sent with a cancelled call's RST_STREAM) waits as long: gRPC's
    # default of 60 s applied to it would hold off the keepalive's ping meanwhile.
    ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_TIMEOUT_SECONDS * 1000)),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # ping however long no data flows
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", int(MAX_RECONNECT_SECONDS * 1000)),
)


def target(address: str) -> tuple[str, list[tuple[str, str]]]:
    """The gRPC target of `HOST:PORT`, or of a list `HOST:PORT,HOST:PORT,...` (several
    coordinators of one lake), and the channel options it needs. A list becomes one channel over
    every address (gRPC's ipv4:/ipv6: target; names resolved here, once) with the pick_first
    policy: calls go to one coordinator and, when it is gone, the channel connects to the next
    that answers. Over TLS the first name is the one each certificate is checked against."""
    addresses = [a.strip() for a in address.split(",") if a.strip()]
    if len(addresses) < 2:
        return address, []
    resolved = []
    for one in addresses:
        host, sep, port = one.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"coordinator address {one!r} in {address!r}: expected HOST:PORT")
        host = host.strip("[]")
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise ValueError(f"coordinator address {one!r}: cannot resolve {host!r} ({e.strerror})") from None
        family, *_, sockaddr = infos[0]
        ip = sockaddr[0]
        resolved.append((family, f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"))
    families = {family for family, _ in resolved}
    if len(families) > 1:
        raise ValueError(f"coordinator addresses {address!r}: all IPv4 or all IPv6, not both")
    scheme = "ipv6" if families == {socket.AF_INET6} else "ipv4"
    options = [("grpc.lb_policy_name", "pick_first")]
    first_host = addresses[0].rpartition(":")[0].strip("[]")
    if not _is_ip(first_host):
        options.append(("grpc.ssl_target_name_override", first_host))
    return f"{scheme}:" + ",".join(a for _, a in resolved), options


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def channel(address: str, ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> grpc.Channel:
    """A channel to the coordinator (or to the first of a list that answers: `target`); TLS when
    a CA is given, mTLS when a client cert is too; keepalive pings and a bounded reconnect
    backoff (CHANNEL_OPTIONS)."""
    address, extra = target(address)
    options = [*CHANNEL_OPTIONS, *extra]
    if ca is None:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    return grpc.secure_channel(address, creds, options=options)


class StreamError(grpc.RpcError):
    """A stream that timed out or ended: a retryable error, as a unary call's would be."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class CallStream:
    """Calls of one stream-stream method on one long-lived stream (etcd's lease keep-alive
    pattern): `call` sends a request and waits for its answer. An error, a refusal included,
    closes the stream and raises as a unary call would; the next call opens another stream.
    A call unanswered within its timeout cancels the stream (a `timer(seconds, fn)` started per
    call, threading.Timer unless a test gives its own) and raises DEADLINE_EXCEEDED."""

    def __init__(self, method, metadata, what: str, timer=threading.Timer):
        self._method, self._metadata, self._what, self._timer = method, metadata, what, timer
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue | None = None
        self._responses = None

    def call(self, request, timeout: float = CALL_TIMEOUT_SECONDS):
        with self._lock:
            if self._responses is None:
                self._requests = queue.SimpleQueue()
                self._responses = self._method(iter(self._requests.get, None), metadata=self._metadata)
            self._requests.put(request)
            timed_out = threading.Event()
            responses = self._responses
            timer = self._timer(timeout, lambda: (timed_out.set(), responses.cancel()))
            timer.daemon = True
            timer.start()
            try:
                return next(responses)
            except grpc.RpcError:
                self._close()
                if timed_out.is_set():
                    raise StreamError(
                        grpc.StatusCode.DEADLINE_EXCEEDED, f"no {self._what} answer in {timeout:g} s"
                    ) from None
                raise
            except StopIteration:
                self._close()
                raise StreamError(
                    grpc.StatusCode.UNAVAILABLE, f"the coordinator ended the {self._what} stream"
                ) from None
            finally:
                timer.cancel()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._requests is not None:
            self._requests.put(None)  # ends the request iterator: the stream closes cleanly
            self._responses.cancel()
        self._requests = self._responses = None


class AgentApi:
    def __init__(self, chan: grpc.Channel, credential: str = ""):
        self._stub = pb_grpc.AgentServiceStub(chan)
        self._metadata = (("authorization", f"Bearer {credential}"),) if credential else ()
        self._heartbeats = CallStream(self._stub.Heartbeat, self._metadata, "heartbeat")
        self._reports = CallStream(self._stub.ReportResult, self._metadata, "result")

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
        return self._heartbeats.call(
            pb.HeartbeatRequest(job_id=job_id, lease_id=lease_id, status=status, fingerprint=fingerprint)
        )

    def close(self) -> None:
        """End the heartbeat and result streams, if open."""
        self._heartbeats.close()
        self._reports.close()

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

    def report_result(self, job_id: str, lease_id: str, record_json: str) -> pb.ReportResultResponse:
        """Upload one run record (RunRecord JSON, as spooled)."""
        return self._reports.call(pb.ReportResultRequest(job_id=job_id, lease_id=lease_id, record_json=record_json))

    def complete_job(self, job_id: str, lease_id: str, run_count: int, held_runs: int = 0) -> pb.CompleteJobResponse:
        return self._stub.CompleteJob(
            pb.CompleteJobRequest(job_id=job_id, lease_id=lease_id, run_count=run_count, held_runs=held_runs),
            metadata=self._metadata,
            timeout=CALL_TIMEOUT_SECONDS,
        )

    def ping(self, timeout: float = CALL_TIMEOUT_SECONDS) -> pb.PingResponse:
        """The coordinator's word that this credential is valid, and its clock."""
        return self._stub.Ping(pb.PingRequest(), metadata=self._metadata, timeout=timeout)

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


# ---------------------------------------------------------------- the Export read path


def arrow_from_ipc(data: bytes) -> pa.Table:
    """A table from Arrow IPC stream bytes (an Export page's, a stored frame's), read without a
    copy of them (pa.py_buffer)."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def pages(admin, table: str, after_seq: int = 0) -> Iterator[tuple[pa.Table, int]]:
    """The rows of a coordinator table above after_seq, one Export page at a time (at most
    MAX_EXPORT_ROWS rows each): (page, its last seq)."""
    while True:
        resp = admin.Export(pb.ExportRequest(table=table, after_seq=after_seq), timeout=120)
        if resp.rows == 0:
            return
        after_seq = resp.last_seq
        yield arrow_from_ipc(resp.arrow_ipc), after_seq


def fetch_table(admin, table: str, after_seq: int = 0) -> tuple[pa.Table | None, int]:
    """Every row of a coordinator table above after_seq; (table or None, last seq)."""
    parts, seqs = [], [after_seq]
    for page, seq in pages(admin, table, after_seq):
        parts.append(page)
        seqs.append(seq)
    return (pa.concat_tables(parts) if parts else None), seqs[-1]

"""TLS and mTLS on the gRPC port and /metrics, with certificates from deploy/make-test-certs.sh."""

import http.client
import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

import grpc
import pytest

from agent.config import AgentConfig
from agent.credentials import AgentIdentity
from agent.daemon import Agent
from coordinator import metrics
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.fleet import LINUX_BOX, start_coordinator
from tests.support.processes import ROOT, cli, stop
from tests.support.processes import start_coordinator as start_coordinator_process

pytestmark = [pytest.mark.process]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    subprocess.run([ROOT / "deploy/make-test-certs.sh", directory], check=True, capture_output=True, timeout=60)
    return directory


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    """A second, unrelated CA: its certificates must not be trusted by the first one's server."""
    directory = tmp_path_factory.mktemp("other")
    subprocess.run([ROOT / "deploy/make-test-certs.sh", directory], check=True, capture_output=True, timeout=60)
    return directory


def refused(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code()


def admin(coordinator, **tls):
    return AdminApi(channel(f"127.0.0.1:{coordinator.port}", **tls), admin_credential(coordinator.config.data_dir))


def test_helper_makes_a_ca_a_server_and_a_client_certificate(certs):
    for name in ("ca", "server", "client"):
        assert (certs / f"{name}.pem").exists() and (certs / f"{name}.key").exists()
        assert (certs / f"{name}.key").stat().st_mode & 0o077 == 0
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", certs / "ca.pem", certs / "server.pem", certs / "client.pem"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", certs / "server.pem", "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text


def test_tls_serves_clients_that_trust_the_ca_and_refuses_plaintext(tmp_path, certs, other_ca):
    c = start_coordinator(tmp_path, tls_cert=certs / "server.pem", tls_key=certs / "server.key")
    try:
        token = admin(c, ca=certs / "ca.pem").CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
        secure = AgentApi(channel(f"127.0.0.1:{c.port}", ca=certs / "ca.pem"))
        assert secure.enrol(token, "tls-mac", LINUX_BOX, {}, ["mlx"]).credential.startswith("sfa.")
        assert refused(lambda: admin(c).ListAgents(pb.ListAgentsRequest())) == grpc.StatusCode.UNAVAILABLE
        wrong_ca = admin(c, ca=other_ca / "ca.pem")
        assert refused(lambda: wrong_ca.ListAgents(pb.ListAgentsRequest())) == grpc.StatusCode.UNAVAILABLE
    finally:
        c.stop()


def test_mtls_refuses_a_client_without_a_certificate(tmp_path, certs, other_ca):
    c = start_coordinator(
        tmp_path, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_client_ca=certs / "ca.pem"
    )
    try:
        no_cert = admin(c, ca=certs / "ca.pem")
        assert refused(lambda: no_cert.ListAgents(pb.ListAgentsRequest())) == grpc.StatusCode.UNAVAILABLE
        foreign = admin(c, ca=certs / "ca.pem", cert=other_ca / "client.pem", key=other_ca / "client.key")
        assert refused(lambda: foreign.ListAgents(pb.ListAgentsRequest())) == grpc.StatusCode.UNAVAILABLE
        assert refused(lambda: admin(c).ListAgents(pb.ListAgentsRequest())) == grpc.StatusCode.UNAVAILABLE
        ok = admin(c, ca=certs / "ca.pem", cert=certs / "client.pem", key=certs / "client.key")
        assert ok.ListAgents(pb.ListAgentsRequest()).agents == []
    finally:
        c.stop()


def test_cli_enrols_over_mtls_and_the_agent_keeps_its_certificate(tmp_path, certs):
    data, agent_dir = tmp_path / "coordinator", tmp_path / "agent"
    server_tls = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    proc, endpoints = start_coordinator_process(data, *server_tls, "--tls-client-ca", str(certs / "ca.pem"))
    client_tls = [
        "--tls-ca",
        str(certs / "ca.pem"),
        "--tls-cert",
        str(certs / "client.pem"),
        "--tls-key",
        str(certs / "client.key"),
    ]
    address = endpoints["grpc"]
    try:
        admin_flags = ["--coordinator", address, "--data-dir", str(data)]
        plain = cli("token", "create", *admin_flags, check=False)
        assert plain.returncode != 0 and "UNAVAILABLE" in plain.stderr
        half = cli("token", "create", *admin_flags, "--tls-ca", str(certs / "ca.pem"), "--tls-cert", "x", check=False)
        assert half.returncode != 0 and "--tls-cert and --tls-key go together" in half.stderr
        token = cli("token", "create", *admin_flags, *client_tls).stdout.strip()
        enrol = ["agent", "enrol", "--coordinator", address, "--token", token, "--name", "mtls-mac"]
        cli(*enrol, "--config-dir", str(agent_dir), *client_tls)
        stored = json.loads((agent_dir / "agent.json").read_text())
        assert stored["tls_cert"] == str(certs / "client.pem") and stored["tls_key"] == str(certs / "client.key")
        assert stored["tls_ca"] == str(certs / "ca.pem")
        # The daemon builds its channel from the stored identity: a heartbeat goes through mTLS.
        agent = Agent(AgentConfig.load(agent_dir), AgentIdentity.load(agent_dir))
        assert agent.api.heartbeat(status="mtls test").drain is False
    finally:
        assert stop(proc) == 0


def scrape(port: int, context: ssl.SSLContext | None = None, scheme: str = "https") -> str:
    with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/metrics", timeout=10, context=context) as resp:
        return resp.read().decode()


def test_metrics_are_served_with_the_same_tls_as_grpc(tmp_path, certs, other_ca):
    c = start_coordinator(tmp_path / "tls", tls_cert=certs / "server.pem", tls_key=certs / "server.key")
    try:
        trusting = ssl.create_default_context(cafile=certs / "ca.pem")
        assert "specfleet_jobs" in scrape(c.metrics_port, trusting)
        with pytest.raises(urllib.error.URLError):
            scrape(c.metrics_port, ssl.create_default_context(cafile=other_ca / "ca.pem"))
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            scrape(c.metrics_port, scheme="http")
    finally:
        c.stop()
    c = start_coordinator(
        tmp_path / "mtls",
        tls_cert=certs / "server.pem",
        tls_key=certs / "server.key",
        tls_client_ca=certs / "ca.pem",
    )
    try:
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            scrape(c.metrics_port, ssl.create_default_context(cafile=certs / "ca.pem"))
        client = ssl.create_default_context(cafile=certs / "ca.pem")
        client.load_cert_chain(certs / "client.pem", certs / "client.key")
        assert "specfleet_jobs" in scrape(c.metrics_port, client)
    finally:
        c.stop()


def test_a_client_that_never_finishes_its_handshake_stalls_no_scrape(tmp_path, certs):
    """Issue 31: one client holding a TLS connection open without a handshake stopped /metrics for
    everyone (the handshake ran on the accepting thread). Each connection has its own thread now,
    and a handshake that does not come within HANDSHAKE_SECONDS is dropped."""
    c = start_coordinator(tmp_path, tls_cert=certs / "server.pem", tls_key=certs / "server.key")
    silent = socket.create_connection(("127.0.0.1", c.metrics_port), timeout=10)
    half = socket.create_connection(("127.0.0.1", c.metrics_port), timeout=10)
    try:
        half.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, never the rest
        trusting = ssl.create_default_context(cafile=certs / "ca.pem")
        for _ in range(3):
            assert "specfleet_jobs" in scrape(c.metrics_port, trusting)
        # The server gives up on both (EOF or a reset), well within a generous minute.
        for held in (silent, half):
            held.settimeout(60)
            try:
                assert held.recv(1024) == b""
            except ConnectionResetError:
                pass
        assert metrics.HANDSHAKE_SECONDS < 60
    finally:
        silent.close()
        half.close()
        c.stop()


def test_tls_keys_readable_by_others_are_made_0600_or_refused(tmp_path, certs, monkeypatch):
    """Issue 31: TLS key files were read whatever their mode. The coordinator's key, an agent's
    stored key and a CLI's --tls-key are made 0600 when group or others could read them, and
    refused, saying what to do, when that cannot be done."""
    keys = {}
    for name in ("coordinator", "agent", "cli"):
        keys[name] = tmp_path / f"{name}.key"
        keys[name].write_bytes((certs / ("server.key" if name == "coordinator" else "client.key")).read_bytes())
        keys[name].chmod(0o644)
    c = start_coordinator(tmp_path / "data", tls_cert=certs / "server.pem", tls_key=keys["coordinator"])
    try:
        assert keys["coordinator"].stat().st_mode & 0o777 == 0o600
        identity = AgentIdentity(
            f"127.0.0.1:{c.port}", "ag-1", "m", "sfa.x", 10.0, str(certs / "ca.pem"), str(certs / "client.pem"),
            str(keys["agent"]),
        )  # fmt: skip
        assert identity.tls_files()["key"] == keys["agent"] and keys["agent"].stat().st_mode & 0o777 == 0o600
    finally:
        c.stop()
    tls = ["--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / "client.pem"), "--tls-key", str(keys["cli"])]
    cli("agents", "list", "--coordinator", "127.0.0.1:1", "--admin-token", "x", *tls, check=False)
    assert keys["cli"].stat().st_mode & 0o777 == 0o600

    # A key whose mode cannot be changed (not its owner's, a read-only disk) is refused.
    keys["coordinator"].chmod(0o640)

    def refuse(path, mode):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("os.chmod", refuse)
    with pytest.raises(ValueError, match=r"readable by other users \(mode 640\).*chmod 600"):
        start_coordinator(tmp_path / "data", tls_cert=certs / "server.pem", tls_key=keys["coordinator"])
    with pytest.raises(ValueError, match="chmod 600"):
        AgentIdentity("a:1", "ag-1", "m", "sfa.x", 10.0, None, None, str(keys["coordinator"])).tls_files()

"""A server subprocess: waited for until healthy, every way of failing named with its log, and
never left running. Real llama-server where a real server is needed (the project's build of the
locked llama.cpp); tests/support/fake_server.py stands for servers that are broken on purpose."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent.engines import server_process
from agent.engines.base import EngineError
from agent.engines.llama_server import PROJECT_BUILD
from agent.engines.server_process import ServerProcess, free_port, stop_all
from tests.support.processes import FAKE_SERVER as FAKE
from tests.support.processes import gone, needs_llama_server

pytestmark = [pytest.mark.process]
# A process sent SIGKILL (by us, or by the kernel when its parent dies) is gone at once on a quiet
# machine; a loaded one may take a moment to schedule its exit.
KILL_GRACE_SECONDS = 10.0


def fake(tmp_path, mode, monkeypatch, timeout=30.0, **env) -> ServerProcess:
    monkeypatch.setenv("FAKE_SERVER_MODE", mode)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    port = free_port()
    return ServerProcess([sys.executable, FAKE, "--port", str(port)], port, tmp_path / f"{mode}.log", "fake", timeout)


@needs_llama_server
def test_a_real_server_is_healthy_then_stopped(tmp_path, tiny_models):
    port = free_port()
    argv = [str(PROJECT_BUILD), "-m", str(tiny_models.gguf_target), "--host", "127.0.0.1", "--port", str(port)]
    with ServerProcess(argv, port, tmp_path / "server.log", "llama-server") as server:
        pid = server.proc.pid
        assert server.alive()
        server.check()
    assert gone(pid)
    assert (tmp_path / "server.log").read_text().startswith(f"$ {server.command}\n")


def test_a_missing_or_unexecutable_binary_is_named(tmp_path):
    with pytest.raises(EngineError, match=r"binary /nonexistent/llama-server does not exist"):
        ServerProcess(["/nonexistent/llama-server"], free_port(), tmp_path / "a.log", "llama-server").start()
    plain = tmp_path / "llama-server"
    plain.write_text("not a program")
    with pytest.raises(EngineError, match=r"llama-server is not an executable file"):
        ServerProcess([str(plain)], free_port(), tmp_path / "b.log", "llama-server").start()
    with pytest.raises(EngineError, match=r"'no-such-server-binary' is not on PATH"):
        ServerProcess(["no-such-server-binary"], free_port(), tmp_path / "c.log", "x").start()


@needs_llama_server
def test_a_server_that_exits_at_start_says_why_with_its_log(tmp_path):
    port = free_port()
    argv = [str(PROJECT_BUILD), "-m", str(tmp_path / "missing.gguf"), "--port", str(port)]
    with pytest.raises(EngineError) as e:
        ServerProcess(argv, port, tmp_path / "server.log", "llama-server").start()
    message = str(e.value)
    assert "llama-server: exited at start with status 1" in message, message
    assert "its last log lines:" in message and "exiting due to model loading error" in message, message


def test_a_port_taken_is_named(tmp_path, monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        server = ServerProcess([sys.executable, FAKE, "--port", str(port)], port, tmp_path / "p.log", "fake")
        with pytest.raises(EngineError, match=rf"port {port} on 127.0.0.1 is already taken by another process"):
            server.start()
    assert server.proc is None  # refused before anything started


def test_a_server_that_takes_its_port_late_is_named_too(tmp_path, monkeypatch):
    """The port was free when checked and taken before the server bound it: the server exits
    at start and the message names the port."""
    real_check, checks = server_process.port_taken, []

    def free_at_the_first_check(port):
        checks.append(port)
        return len(checks) > 1 and real_check(port)

    monkeypatch.setattr(server_process, "port_taken", free_at_the_first_check)
    monkeypatch.setenv("FAKE_SERVER_MODE", "")
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        server = ServerProcess([sys.executable, FAKE, "--port", str(port)], port, tmp_path / "late.log", "fake")
        with pytest.raises(EngineError, match=rf"exited at start with status 1; port {port} on 127.0.0.1 is taken"):
            server.start()
    assert "Address already in use" in (tmp_path / "late.log").read_text()


@pytest.mark.parametrize("mode, last", [("unhealthy", "HTTP 503"), ("garbage", "ConnectionError")])
def test_a_health_that_never_answers_200_times_out_and_leaves_nothing(tmp_path, monkeypatch, mode, last):
    server = fake(tmp_path, mode, monkeypatch, timeout=2.0)
    with pytest.raises(EngineError) as e:
        server.start()
    message = str(e.value)
    assert f"GET /health on port {server.port} did not answer 200 within 2 s" in message, message
    assert last in message and "its last log lines:" in message, message  # the last answer, and the log
    assert gone(server.proc.pid)


def test_a_server_without_health_is_ready_when_its_next_path_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SERVER_MODE", "")
    port = free_port()
    argv = [sys.executable, FAKE, "--port", str(port)]
    with ServerProcess(argv, port, tmp_path / "m.log", "fake", 10, ("/nothing-here", "/v1/models")) as server:
        assert server.alive()


@needs_llama_server
def test_a_server_that_dies_later_is_reported_with_its_log(tmp_path, tiny_models):
    port = free_port()
    argv = [str(PROJECT_BUILD), "-m", str(tiny_models.gguf_target), "--port", str(port)]
    with ServerProcess(argv, port, tmp_path / "server.log", "llama-server") as server:
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        with pytest.raises(EngineError, match=r"llama-server: died during the run \(killed by SIGKILL\)") as e:
            server.check()
        assert "its last log lines:" in str(e.value)


def test_stop_escalates_to_sigkill_and_takes_the_children(tmp_path, monkeypatch):
    monkeypatch.setattr(server_process, "STOP_GRACE_SECONDS", 1.0)
    stubborn = fake(tmp_path, "ignore-term", monkeypatch).start()
    stubborn.stop()
    assert stubborn.proc.returncode == -signal.SIGKILL
    assert "ignoring SIGTERM" in (tmp_path / "ignore-term.log").read_text()

    pid_file = tmp_path / "child.pid"
    parent = fake(tmp_path, "spawn-child", monkeypatch, FAKE_CHILD_PID_FILE=str(pid_file)).start()
    child = int(pid_file.read_text())
    os.kill(child, 0)
    parent.stop()
    assert gone(parent.proc.pid) and gone(child, timeout=KILL_GRACE_SECONDS)  # SIGKILLed, reaped by init


def test_stop_all_kills_every_server_still_running(tmp_path, monkeypatch):
    servers = [fake(tmp_path, "", monkeypatch).start() for _ in range(2)]
    stop_all()
    assert all(gone(s.proc.pid) for s in servers)
    assert not server_process._running


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_dies_with_the_process_that_started_it(tmp_path):
    """SIGKILL leaves no finally and no watchdog: on Linux the kernel's parent-death signal
    still takes the server down."""
    pid_file = tmp_path / "server.pid"
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        os.environ["FAKE_SERVER_MODE"] = ""
        from agent.engines.server_process import ServerProcess, free_port
        port = free_port()
        server = ServerProcess([sys.executable, {FAKE!r}, "--port", str(port)], port, {str(tmp_path / "s.log")!r}, "f")
        server.start()
        open({str(pid_file)!r}, "w").write(str(server.proc.pid))
        time.sleep(300)
    """)
    starter = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and starter.poll() is None, "the starter did not start its server"
        time.sleep(0.1)
    server = int(pid_file.read_text())
    starter.kill()
    starter.wait()
    assert gone(server, timeout=KILL_GRACE_SECONDS), "the server outlived the process that started it"

"""Real processes for end-to-end tests: the `specfleet` CLI run as separate programs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.engines.llama_server import PROJECT_BUILD
from specfleet.data_dir import ENDPOINTS_FILE

ROOT = Path(__file__).resolve().parents[2]
# Tests of a real llama-server need the set-up's build (scripts/build-llama-cpp.sh). Skipped
# where it was not run, by hand; under CI (CI set) they run regardless, and fail without it.
needs_llama_server = pytest.mark.skipif(
    not PROJECT_BUILD.exists() and not os.environ.get("CI"), reason="scripts/build-llama-cpp.sh not run"
)


def cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if check and result.returncode != 0:
        raise AssertionError(f"specfleet {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def spawn(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        stdout=open(log, "a"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def start_coordinator(data_dir: Path, *extra: str) -> tuple[subprocess.Popen, dict]:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
    proc = spawn(
        "coordinator",
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        "0",
        "--metrics-port",
        "0",
        *extra,
        log=data_dir / "coordinator.log",
    )
    deadline = time.monotonic() + 60
    while not (data_dir / ENDPOINTS_FILE).exists():
        assert proc.poll() is None, (data_dir / "coordinator.log").read_text()
        assert time.monotonic() < deadline, "coordinator did not start"
        time.sleep(0.1)
    return proc, json.loads((data_dir / ENDPOINTS_FILE).read_text())


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout=timeout)


def wait_for_sweep(coordinator: str, data_dir: Path, sweep_id: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cli("sweep", "status", sweep_id, "--coordinator", coordinator, "--data-dir", str(data_dir)).stdout
        if out.split()[2] != "running":  # "<id>  <name> <state> ..."
            return out
        time.sleep(1)
    raise AssertionError(f"sweep {sweep_id} did not finish: {out}")


def wait_until(predicate, what: str, timeout: float = 30.0, every: float = 0.1):
    """predicate()'s first true value, polled every `every` seconds; AssertionError naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def gone(pid: int, timeout: float = 0.0) -> bool:
    """Whether process `pid` has exited (a zombie counts), waiting up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# A fake OpenAI-compatible / llama-server-like server (tests/support/fake_server.py), run as a program.
FAKE_SERVER = str(Path(__file__).resolve().parent / "fake_server.py")


def specfleet(*args: str, home: Path, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, with its data and config directories under `home`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPECFLEET_")}
    environ.update(XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"), HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**environ, **(env or {})},
    )


def one_line_error(result: subprocess.CompletedProcess, *names: str) -> str:
    """The error line of a failed command: the last line on stderr, the only one that is not a log
    record (a warning of ours, or gRPC's own log of a failed bind)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr and lines[-1].startswith("error: "), result.stderr
    assert [line for line in lines if line.startswith("error")] == lines[-1:], result.stderr
    for name in names:
        assert name in lines[-1], (name, lines[-1])
    return lines[-1]

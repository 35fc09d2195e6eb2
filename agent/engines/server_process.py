"""One server subprocess on a loopback port: started, waited for until healthy, stopped.

A `ServerProcess` runs an argv with its output in a log file, polls GET /health until it
answers 200 (llama-server answers 503 while it loads the model; a server without /health may
name a path to try after a 404, such as /v1/models) and watches the process the whole time.
Every failure is an EngineError that names what went wrong and ends with the server log's last
lines (and its first error lines): a binary that is missing or not executable, a server that
exits at start, a port already taken (named), a /health that never answers 200 in time, a
server that died later (`check`).

No server may outlive the worker that started it. Three lines of defence, because a worker can
die in ways no `finally` sees:
- `stop()` (also on leaving the `with` block) sends SIGTERM, waits, then SIGKILL; the server's
  own children, found with `pgrep -P`, get the same.
- the server runs in the worker's process group, which the agent kills whole when the worker
  ends, however it ends (agent/runner.py); the worker's orphan watchdog calls `stop_all()`.
- on Linux the server also gets PR_SET_PDEATHSIG through util-linux's setpriv (SIGKILL when the
  thread that started it dies). macOS has no such call, so this is only a second line.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import loopback
from .base import EngineError
from .llamacpp_lib import cpu_has_amx

HOST = loopback.HOST
HEALTH_TIMEOUT_SECONDS = 600.0  # a large model on a slow disk can take minutes to load
HEALTH_POLL_SECONDS = 0.1
HEALTH_REQUEST_TIMEOUT_SECONDS = 2.0
STOP_GRACE_SECONDS = 10.0
DEATH_WAIT_SECONDS = 1.0  # after a failed request, how long a dying server may take to be gone
LOG_TAIL_LINES = 12
LOG_LINE_CHARS = 120  # 15 lines of these, and the reason, fit in the agent's 2000-character failure report

_running: set[ServerProcess] = set()  # started and not yet stopped, for stop_all()
_running_lock = threading.Lock()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    """Whether some process already holds `port` on 127.0.0.1."""
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def _parent_death_prefix() -> list[str]:
    """A command prefix that asks Linux to SIGKILL the server when the thread that started it
    dies (util-linux's setpriv sets PR_SET_PDEATHSIG, then execs the server, which keeps it), or
    [] where there is none (macOS). Not a preexec_fn: Python code run between fork and exec in a
    process with gRPC's threads can deadlock or abort the child."""
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def _children(pid: int) -> list[int]:
    """The live descendants of `pid`, deepest last (pgrep is on macOS and Linux)."""
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for child in (int(p) for p in out.split()):
        found += [child, *_children(child)]
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def log_excerpt(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The log's last `lines` lines, after its first error lines when those come earlier (a
    server that refuses an argument prints the reason first and its usage after); each line cut
    to LOG_LINE_CHARS, so that the whole fits in the agent's report of a failed job."""
    try:
        with open(path, errors="replace") as f:
            text = [line[:LOG_LINE_CHARS] for line in f.read().splitlines()]
    except OSError:
        return ""
    tail = text[-lines:]
    errors = [line for line in text[: len(text) - len(tail)] if "error" in line.lower()][:3]
    return "\n".join(errors + (["..."] if errors else []) + tail).rstrip()


def server_environment(environ=os.environ) -> dict[str, str]:
    """A server's environment: this process's, with llama.cpp's weight repacking off where the CPU
    has AMX (LLAMA_ARG_REPACK, the environment form of llama-server's --no-repack: ggml's AMX
    matrix product crashes there, llamacpp_lib.cpu_has_amx), for llama-server whichever command
    line started it (its own engine's or an OpenAI-compatible command template)."""
    return {**environ, "LLAMA_ARG_REPACK": "0"} if cpu_has_amx() else dict(environ)


class ServerProcess:
    """A server started from `argv`, which must make it listen on 127.0.0.1:`port`.

    `name` is what messages call it ("llama-server", "MTPLX"); `log_path` receives its stdout
    and stderr. Use as a context manager, or call start() and stop()."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        name: str,
        health_timeout_seconds: float = HEALTH_TIMEOUT_SECONDS,
        health_paths: tuple[str, ...] = ("/health",),
    ):
        self.argv, self.port, self.log_path, self.name = list(argv), port, Path(log_path), name
        self.health_timeout_seconds = health_timeout_seconds
        self.health_paths = health_paths
        self.proc: subprocess.Popen | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def _fail(self, reason: str) -> EngineError:
        tail = log_excerpt(self.log_path)
        where = f" (log {self.log_path})"
        return EngineError(f"{self.name}: {reason}{where}" + (f"; its last log lines:\n{tail}" if tail else ""))

    def start(self) -> ServerProcess:
        """Start the server and return once GET /health answers 200."""
        binary = self.argv[0]
        if os.sep not in binary and not os.path.isabs(binary):
            if shutil.which(binary) is None:
                raise EngineError(f"{self.name}: {binary!r} is not on PATH")
        elif not Path(binary).exists():
            raise EngineError(f"{self.name}: binary {binary} does not exist")
        elif not os.access(binary, os.X_OK) or Path(binary).is_dir():
            raise EngineError(f"{self.name}: {binary} is not an executable file")
        if port_taken(self.port):
            raise EngineError(f"{self.name}: port {self.port} on {HOST} is already taken by another process")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {self.command}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    [*_parent_death_prefix(), *self.argv],
                    env=server_environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            except OSError as e:
                raise EngineError(f"{self.name}: could not start {binary}: {e}") from None
        with _running_lock:
            _running.add(self)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.health_timeout_seconds
        last = "no answer"
        while True:
            code = self.proc.poll()
            if code is not None:
                reason = f"exited at start with status {code}"
                if port_taken(self.port):
                    reason += f"; port {self.port} on {HOST} is taken by another process"
                raise self._fail(reason)
            for path in self.health_paths:  # the next path only where this one does not exist (404)
                try:
                    status, body = loopback.request(self.port, "GET", path, timeout=HEALTH_REQUEST_TIMEOUT_SECONDS)
                except OSError as e:
                    last = f"{type(e).__name__}: {e}"
                    break
                if status == 200:
                    return
                last = f"GET {path}: HTTP {status} {body[:200].decode(errors='replace').strip()}"
                if status != 404:
                    break
            if time.monotonic() > deadline:
                raise self._fail(
                    f"GET {' or '.join(self.health_paths)} on port {self.port} did not answer 200 within "
                    f"{self.health_timeout_seconds:g} s (last: {last})"
                )
            time.sleep(HEALTH_POLL_SECONDS)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        """Raise EngineError (with the log's tail) if the server is no longer running."""
        if self.proc is None:
            raise EngineError(f"{self.name} was never started")
        code = self.proc.poll()
        if code is not None:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            raise self._fail(f"died during the run ({how})")

    def died(self, error: Exception) -> EngineError:
        """The error to raise after a failed request: the server's death if it died (a dying
        server's connection may fail before the process is gone: wait a moment), else `error`."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=DEATH_WAIT_SECONDS)
        try:
            self.check()
        except EngineError as dead:
            return dead
        return self._fail(f"request failed: {type(error).__name__}: {error}")

    def stop(self) -> None:
        """SIGTERM, up to STOP_GRACE_SECONDS, then SIGKILL; the server's children too."""
        with _running_lock:
            _running.discard(self)
        if self.proc is None or self.proc.poll() is not None:
            return
        children = _children(self.proc.pid)
        self.proc.terminate()
        _signal_all(children, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _signal_all(children, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL at once, for a worker that is about to exit."""
        with _running_lock:
            _running.discard(self)
        if self.proc is not None and self.proc.poll() is None:
            _signal_all(_children(self.proc.pid), signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_all() -> None:
    """SIGKILL every server this process started and has not stopped (the worker's last act
    when its agent is gone)."""
    with _running_lock:
        servers = list(_running)
    for server in servers:
        server.kill()

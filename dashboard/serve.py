"""Start Streamlit on the dashboard app, pointed at a coordinator; and the lifeline that keeps a
command's children from outliving it.

A child started with a lifeline (`start_child`) holds the read end of a pipe whose write end
only its parent holds. When the parent ends, however it ends (SIGKILL included), the pipe
reaches end-of-file and the child stops itself with SIGTERM, as if its parent had asked
(`hold_lifeline`, run early in every `specfleet` process and in the Streamlit wrapper below).
A parent that is asked to stop (SIGTERM, SIGINT) stops its children first (`serve`, the demo).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

APP = Path(__file__).with_name("app.py")
LIFELINE_ENV = "SPECFLEET_LIFELINE_FD"
STOP_SECONDS = 15.0  # a child asked to stop has this long before it is killed

# Streamlit's own command line, run by a Python that holds its lifeline first.
_STREAMLIT = (
    "import sys; from dashboard.serve import hold_lifeline; hold_lifeline(); "
    "from streamlit.web.cli import main; sys.argv[0] = 'streamlit'; sys.exit(main())"
)


def hold_lifeline() -> None:
    """When this process was started with a lifeline (LIFELINE_ENV names its descriptor), watch
    it on a thread: at its end (the parent is gone) SIGTERM this process."""
    fd = os.environ.pop(LIFELINE_ENV, None)  # popped: a grandchild never inherits a stale number
    if fd is None:
        return

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(int(fd), 64):
                pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def start_child(cmd: list[str], env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Popen(cmd) with a lifeline: the child stops itself when this process ends, even by SIGKILL
    (the write end stays here, never inherited: os.pipe's descriptors are not inheritable)."""
    read, write = os.pipe()
    try:
        proc = subprocess.Popen(cmd, env={**(env or os.environ), LIFELINE_ENV: str(read)}, pass_fds=(read,), **popen)
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    proc.lifeline = write  # open until this process ends, or its owner closes it
    return proc


def stop_child(proc: subprocess.Popen, timeout: float = STOP_SECONDS) -> int:
    """SIGTERM, then SIGKILL after `timeout`; the child's exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def command(port: int, host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable,
        "-c",
        _STREAMLIT,
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={host}",
        "--browser.gatherUsageStats=false",
    ]


def environment(coordinator: str | None, admin_token: str | None, data_dir: Path | None = None) -> dict[str, str]:
    """Streamlit's environment: the coordinator and admin credential when given (flag or
    environment), else only the data directory, whose coordinator.json and admin.token the
    dashboard reads again at every rerun (dashboard/data.py coordinator): a dashboard started
    before its coordinator finds it once it has written them."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k not in ("SPECFLEET_COORDINATOR", "SPECFLEET_ADMIN_TOKEN")}
    given = {"SPECFLEET_COORDINATOR": coordinator, "SPECFLEET_ADMIN_TOKEN": admin_token}
    env.update({k: v for k, v in given.items() if v})
    if data_dir is not None:
        env["SPECFLEET_DATA_DIR"] = str(data_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return env


def serve(coordinator: str | None, admin_token: str | None, data_dir: Path, port: int, host: str = "127.0.0.1") -> int:
    """Run Streamlit until it exits, or until this process is asked to stop (SIGTERM, SIGINT):
    then Streamlit is stopped first. Its exit status; 128 + the signal's number when stopped.
    `coordinator` and `admin_token` None: read from `data_dir` by the dashboard (environment)."""
    proc = start_child(command(port, host), env=environment(coordinator, admin_token, data_dir))
    asked: list[int] = []
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        asked.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while proc.poll() is None and not stop.wait(0.5):
            pass
    finally:
        status = stop_child(proc)  # SIGTERM, then SIGKILL: it never outlives this command
        os.close(proc.lifeline)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + asked[0] if asked else status

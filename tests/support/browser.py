"""Headless Chromium (Debian's `chromium`, installed by scripts/setup.sh) driven over the Chrome
DevTools protocol with the `websockets` client Streamlit already depends on, and the helpers that
start and stop what it looks at."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
START_SECONDS = 90


def wait_http(url: str, proc: subprocess.Popen, log: Path, seconds: float) -> bytes:
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, f"{proc.args[0]} exited:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read()
        except OSError:
            assert time.monotonic() < deadline, f"{url} did not answer in {seconds}s:\n{log.read_text()[-3000:]}"
            time.sleep(0.3)


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a process this test started in its own session, and its children."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


class DevTools:
    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, timeout: float = 30, **params):
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == call_id:
                assert "error" not in msg, msg
                return msg.get("result", {})

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def rendered(self) -> str:
        """The page's text once Streamlit has drawn every element (no skeleton placeholders left)."""
        skeletons = self.evaluate("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length")
        return self.evaluate("document.body ? document.body.innerText : ''") if skeletons == 0 else ""

"""A real browser on the served dashboard: headless Chromium (Debian's `chromium`, installed by
the project's setup), driven over the Chrome DevTools protocol with the `websockets` client that
Streamlit already depends on. Nothing is downloaded; everything stays on loopback."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.sync.client import connect

from dashboard import serve
from tests.fleet import admin_for, start_coordinator
from tests.test_dashboard import seed_fleet

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
START_SECONDS = 90
RENDER_SECONDS = 90

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def test_questions_page_renders_verdicts_in_chromium(tmp_path):
    coordinator = start_coordinator(tmp_path / "coordinator")
    procs = []
    try:
        seed_fleet(coordinator)
        token = admin_for(coordinator)._metadata[0][1].removeprefix("Bearer ")
        port = free_port()
        st_log = tmp_path / "streamlit.log"
        streamlit = subprocess.Popen(
            serve.command(port),
            env=serve.environment(f"127.0.0.1:{coordinator.port}", token),
            stdout=open(st_log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(streamlit)
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", streamlit, st_log, START_SECONDS)

        assert CHROMIUM, "chromium is not installed: run scripts/setup.sh (it installs Debian's chromium)"
        debug_port = free_port()
        cr_log = tmp_path / "chromium.log"
        chromium = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-default-apps",
                "--disable-extensions",
                "--disable-sync",
                "--disable-quic",
                "--no-first-run",
                "--window-size=1400,2400",
                f"--user-data-dir={tmp_path / 'chromium-profile'}",
                "--remote-debugging-address=127.0.0.1",
                f"--remote-debugging-port={debug_port}",
                "about:blank",
            ],
            stdout=open(cr_log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(chromium)
        targets = json.loads(wait_http(f"http://127.0.0.1:{debug_port}/json/list", chromium, cr_log, START_SECONDS))
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as ws:
            tools = DevTools(ws)
            tools.call("Page.enable")
            tools.call("Page.navigate", url=f"http://127.0.0.1:{port}/questions")
            deadline = time.monotonic() + RENDER_SECONDS
            # The shipped ledger on a fleet of specfleet's own runs: claims about MTPLX wait for its
            # runs, with our loop's figure on the same weights beside them; the absence of a Mac
            # ngram-mod benchmark holds.
            wanted = ("Open questions", "Apple M4 Pro: inconclusive", "no runs of MTPLX", "any Mac: reproduced")
            wanted += ("our loop, same weights (specfleet mlx mtp) on Apple M4 Pro", "2 machine(s)")
            wanted += ("Fleet", "Sweeps", "Compare", "Questions", "Runs")  # the navigation, by title
            text = ""
            while not all(w in text for w in wanted):
                assert time.monotonic() < deadline, f"verdicts did not render in {RENDER_SECONDS}s:\n{text[:3000]}"
                time.sleep(0.5)
                text = tools.rendered()
            assert "Traceback" not in text and "Error" not in text.split("Open questions")[0]
            shot = tools.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
            png = base64.b64decode(shot["data"])
        path = tmp_path / "questions.png"
        path.write_bytes(png)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    finally:
        for proc in reversed(procs):
            stop_group(proc)
        coordinator.stop()

"""A real browser on the served dashboard: headless Chromium (Debian's `chromium`, installed by
the project's setup), driven over the Chrome DevTools protocol with the `websockets` client that
Streamlit already depends on. Nothing is downloaded; everything stays on loopback."""

from __future__ import annotations

import base64
import json
import subprocess
import time

import pytest
from websockets.sync.client import connect

from dashboard import serve
from tests.support.browser import CHROMIUM, START_SECONDS, DevTools, stop_group, wait_http
from tests.support.dashboard import seed_fleet
from tests.support.fleet import admin_for, start_coordinator
from tests.support.ports import free_port

RENDER_SECONDS = 90

pytestmark = [pytest.mark.slow, pytest.mark.process]


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

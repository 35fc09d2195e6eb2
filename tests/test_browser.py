"""A real browser on the served dashboard: headless Chromium (Debian's `chromium`, installed by
the project's setup), driven by Playwright (tests/support/browser.py). Nothing is downloaded;
everything stays on loopback."""

from __future__ import annotations

import subprocess

import pytest

from dashboard import serve
from tests.support.browser import START_SECONDS, chromium_page, stop_group, wait_http, wait_text
from tests.support.dashboard import seed_fleet
from tests.support.fleet import admin_for, start_coordinator
from tests.support.ports import free_port

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

        with chromium_page() as page:
            page.goto(f"http://127.0.0.1:{port}/questions")
            # The shipped ledger on a fleet of specfleet's own runs: claims about MTPLX wait for its
            # runs, with our loop's figure on the same weights beside them; the absence of a Mac
            # ngram-mod benchmark holds.
            wanted = ("Open questions", "Apple M4 Pro: inconclusive", "no runs of MTPLX", "any Mac: reproduced")
            wanted += ("our loop, same weights (specfleet mlx mtp) on Apple M4 Pro", "2 machine(s)")
            wanted += ("Fleet", "Sweeps", "Compare", "Questions", "Runs")  # the navigation, by title
            text = wait_text(page, wanted)
            assert "Traceback" not in text and "Error" not in text.split("Open questions")[0]
            png = page.screenshot()
        path = tmp_path / "questions.png"
        path.write_bytes(png)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    finally:
        for proc in reversed(procs):
            stop_group(proc)
        coordinator.stop()

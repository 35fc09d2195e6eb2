"""Headless Chromium (Debian's `chromium`, installed by scripts/setup.sh) driven by Playwright
(`executable_path`: Playwright downloads no browser of its own), the helpers that start and stop
what it looks at, and what a Streamlit page must show: text, and no exception element."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
START_SECONDS = 90
RENDER_SECONDS = 90
# As the machine's own probe starts it: without the background-networking flags Chromium's
# connections are refused by a closed network many at a time.
CHROMIUM_ARGS = [
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
]
# What Streamlit draws for an exception a page raised (st.exception, an uncaught error).
EXCEPTION = '[data-testid="stException"]'


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


@contextlib.contextmanager
def chromium_page(width: int = 1400, height: int = 2400):
    """A Playwright page in headless system Chromium, closed (with its browser) on exit."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh (it installs Debian's chromium)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


# The app's root once a script run of this page has ended on a live connection: before the first
# run its script state is "initial", and between goto and the connection no run is drawn at all
# (a loaded machine's blank page read as settled, and Compare's selector was never found).
RAN = '[data-testid="stApp"][data-test-script-state="notRunning"][data-test-connection-state="CONNECTED"]'


def settled(page, seconds: float = RENDER_SECONDS) -> str:
    """The page's text once Streamlit has finished a run of it: the app connected and its script
    not running, no skeleton placeholder left and its status widget gone, for half a second; fails
    on an exception element, with its text."""
    deadline = time.monotonic() + seconds
    quiet_since = None
    while True:
        busy = page.locator('[data-testid="stSkeleton"], [data-testid="stStatusWidget"]').count()
        if busy == 0 and page.locator(RAN).count():
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 0.5:  # a rerun may start just after one ends
                break
        else:
            quiet_since = None
        assert time.monotonic() < deadline, f"{page.url} did not settle in {seconds}s:\n{body(page)[:3000]}"
        time.sleep(0.2)
    errors = page.locator(EXCEPTION)
    assert errors.count() == 0, f"{page.url} shows an exception:\n" + "\n".join(errors.all_inner_texts())[:3000]
    return body(page)


def body(page) -> str:
    return page.evaluate("document.body ? document.body.innerText : ''")


def table_headers(page, n: int = 0) -> list[str]:
    """The column headers of the page's n-th st.dataframe (from the grid's accessible table: its
    cells are drawn on a canvas), once the grid has drawn them."""
    headers = page.locator('[data-testid="stDataFrame"]').nth(n).locator('[role="columnheader"]')
    headers.first.wait_for(state="attached", timeout=RENDER_SECONDS * 1000)  # hidden: a grid's a11y table
    return headers.all_inner_texts()


def wait_text(page, wanted: tuple[str, ...], seconds: float = RENDER_SECONDS) -> str:
    """The page's text once every string of `wanted` is in it (and no exception element is)."""
    deadline = time.monotonic() + seconds
    while True:
        assert page.locator(EXCEPTION).count() == 0, "\n".join(page.locator(EXCEPTION).all_inner_texts())[:3000]
        text = body(page)
        if all(w in text for w in wanted):
            return text
        missing = [w for w in wanted if w not in text]
        assert time.monotonic() < deadline, f"{page.url}: {missing} not shown in {seconds}s:\n{text[:3000]}"
        time.sleep(0.3)


# The dashboard's pages (dashboard/app.py), each at its own address.
PAGES = ("fleet", "sweeps", "compare", "versions", "questions", "runs", "imported")


def options(page, selectbox) -> list[str]:
    """The options of a Streamlit selectbox, read from its opened list (closed again)."""
    selectbox.click()
    listbox = page.locator('[role="listbox"]')
    listbox.wait_for()
    names, deadline = [], time.monotonic() + 10
    while time.monotonic() < deadline:  # a loaded machine draws the options a few at a time
        now = listbox.locator('[role="option"]').all_inner_texts()
        if now and now == names:
            break
        names = now
        time.sleep(0.5)
    page.keyboard.press("Escape")
    return names


def every_page(page, base: str) -> dict[str, str]:
    """Open every page of the dashboard at `base`, every comparable group of Compare's selector
    and every tab on a page that has tabs; fail on any exception element Streamlit renders. The
    text shown per page (a Compare group as "compare: LABEL", a tab as "PAGE: TAB")."""
    seen = {}
    for name in PAGES:
        page.goto(f"{base}/{name}")
        seen[name] = settled(page)
        assert "Page not found" not in seen[name], f"/{name}: {seen[name][:500]}"
        for tab in page.locator('[role="tab"]').all():
            label = tab.inner_text()
            tab.click()
            seen[f"{name}: {label}"] = settled(page)
        if name != "compare":
            continue
        selector = page.locator('[data-testid="stSelectbox"]').filter(has_text="comparable group")
        if not selector.count():
            continue  # no runs yet: the page says so
        for i, label in enumerate(options(page, selector)):
            selector.click()
            page.locator('[role="listbox"] [role="option"]').nth(i).click()
            seen[f"compare: {label}"] = settled(page)
    return seen

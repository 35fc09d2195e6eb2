"""`specfleet demo --small`: the demo's own path, checked from its summary against the stored runs.

What no other test proves (tests/test_e2e.py drives a sweep through the CLI by hand; this runs
what `specfleet demo` runs for a user): every sweep and arm of the demo on both engines (MTP at
depths 1-3 on the hybrid and dense models, llama-server's draft-mtp and ngram-mod beside our
loops, the libraries' own ref-* paths, a verify-cost curve per engine), the summary's figures
equal to the one definition of speedup over the stored runs whatever the machine's load (a busy
machine marks a figure, never fails it), outlier runs counted as stored, the greedy baselines of
our llama.cpp loop and llama-server compared token for token, a second run reusing the models and
the enrolment (`--sweep`: one of its sweeps only), the dashboard it serves, and Ctrl-C stopping
every process it started. `--small` (cli/demo.py SMALL) keeps every sweep and arm at one prompt
and one repeat.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import duckdb
import pytest

from specfleet.speedup import COMPARABLE_ID, flagged_sql, speedups
from tests.support.browser import (
    START_SECONDS,
    chromium_page,
    every_page,
    table_headers,
    wait_http,
    wait_text,
)
from tests.support.fleet import ANY_LOAD
from tests.support.ports import free_port
from tests.support.processes import ROOT, spawn, start_coordinator, stop

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]

# system, method, K, decode tok/s, the server's own tok/s ("-" for our loops), speedup (marked "*"
# where it comes from runs judged not nominal: a busy machine), acceptance, lossless, runs, outliers
ROW = re.compile(
    r"^(mlx|llama\.cpp|llama-server)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+(\S+)\s+([\d.]+\*?)\s+(\S+)\s+(yes|NO|near-tie)"
    r"\s+(\d+)\s+(\d+)$"
)
SWEEPS = ("demo", "demo-mtp-hybrid", "demo-ngram-mod", "demo-mtp-dense")

# About a minute on a quiet 2-core machine; a loaded one (other suites, both cores busy) takes
# several times that. The load may slow the demo, never fail it.
DEMO_SECONDS = 900


def demo(data_dir, *args: str, **popen):
    command = [sys.executable, "-m", "cli.main", "demo", "--small", "--data-dir", str(data_dir), *args]
    return subprocess.Popen(command, cwd=ROOT, text=True, **popen)


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory):
    """One `specfleet demo --small --no-dashboard` run: its data dir and printed output."""
    data_dir = tmp_path_factory.mktemp("demo")
    proc = demo(data_dir, "--no-dashboard", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.communicate(timeout=DEMO_SECONDS)[0]
    assert proc.returncode == 0, out
    return data_dir, out


def _rows(text: str) -> list[tuple]:
    return [m.groups() for line in text.splitlines() if (m := ROW.match(line.strip()))]


def _printed(text: str) -> dict[tuple, tuple]:
    """(comparable group, method, K) -> (speedup printed or None for a baseline, whether it was marked
    as coming from runs judged not nominal, outlier runs)."""
    out, group = {}, None
    for line in text.splitlines():
        if line.startswith("comparable group "):
            group = line.split()[2].rstrip(":")
        elif m := ROW.match(line.strip()):
            speedup = None if m.group(2) == "baseline" else float(m.group(6).rstrip("*"))
            out[(group, m.group(2), int(m.group(3)))] = (speedup, m.group(6).endswith("*"), int(m.group(10)))
    return out


@pytest.mark.timeout(DEMO_SECONDS + 120)
def test_demo_measures_every_arm_on_both_engines(small_demo):
    """Every arm of the demo's four sweeps, lossless, and its summary equal to the stored runs."""
    data_dir, stdout = small_demo
    llama, hybrid, ngram_mod, dense = (stdout.split(f"\nsweep {name} done")[1].split("\nsweep ")[0] for name in SWEEPS)
    arms = {(engine, method, int(k)) for engine, method, k, *_ in _rows(llama)}
    for engine in ("mlx", "llama.cpp"):
        for arm in (("baseline", 0), ("draft", 2), ("draft", 4), ("ngram", 3), ("ref-baseline", 0)):
            assert (engine, *arm) in arms, stdout
    assert ("mlx", "ref-draft", 2) in arms and ("llama.cpp", "ref-ngram", 3) in arms
    for engine, method, k, tps, _server_tps, speedup, acceptance, lossless, runs, _ in _rows(stdout):
        assert float(tps) > 0 and float(speedup.rstrip("*")) > 0 and int(runs) > 0
        assert lossless == "yes", f"{engine} {method} K={k} changed the greedy output"
        if method in ("draft", "mtp", "draft-mtp", "ngram-mod"):
            assert 0 < float(acceptance) <= 1, (engine, method, k, acceptance)  # it drafted, and hit
        elif method == "ngram":  # it drafted (16 tokens of real text may repeat nothing of the prompt)
            assert 0 <= float(acceptance) <= 1, (engine, method, k, acceptance)
    assert re.search(r"verify cost, mlx, 128 tokens of context: T\(M\)/T\(1\) for M = 1\.\.4: 1\.00 ", stdout)
    assert "verify cost, llama.cpp" in stdout

    # MTP at depths 1-3 on both engines (draft and n-gram beside it, all rolling back the
    # hybrid's recurrent state), and on the all-attention variant on MLX.
    mtp_arms = {(engine, method, int(k)) for engine, method, k, *_ in _rows(hybrid)}
    for engine in ("mlx", "llama.cpp"):
        for arm in (("baseline", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3), ("draft", 2), ("ngram", 3)):
            assert (engine, *arm) in mtp_arms, hybrid
    assert {("mlx", "mtp", k) for k in (1, 2, 3)} <= {(e, m, int(k)) for e, m, k, *_ in _rows(dense)}, dense

    # llama.cpp's own server beside our loops: its baseline and draft-mtp at depths 1-3 on the
    # hybrid, ngram-mod on the Llama target beside our loops' ngram-mod; the server's own decode
    # speed printed beside the client's; its greedy baselines and our loop's, token for token.
    server_rows = [r for r in _rows(hybrid) + _rows(ngram_mod) if r[0] == "llama-server"]
    assert {(m, int(k)) for _, m, k, *_ in server_rows} == {
        ("baseline", 0), ("draft-mtp", 1), ("draft-mtp", 2), ("draft-mtp", 3), ("ngram-mod", 8)
    }, hybrid + ngram_mod  # fmt: skip
    assert all(float(server_tps) > 0 for _, _, _, _, server_tps, *_ in server_rows)
    assert {(e, "ngram-mod", 8) for e in ("mlx", "llama.cpp", "llama-server")} <= {
        (e, m, int(k)) for e, m, k, *_ in _rows(ngram_mod)
    }, ngram_mod
    printed_same = re.findall(
        r"greedy baselines, llama-server and llama\.cpp at 1 thread\(s\): the same tokens on (\d+)", stdout
    )

    # The summary prints the one definition of speedup (specfleet/speedup.py, as /metrics and the
    # dashboard compute it), one comparable group at a time: the same runs give the same figures.
    # Runs judged not nominal (a loaded machine) count only where an arm has no nominal pair, and
    # then the figure is marked: the load changes a label, never whether this test passes.
    with duckdb.connect(str(data_dir / "coordinator" / "specfleet.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(DISTINCT engine) FROM runs").fetchone()[0] == 3
        stored = {(r.comparable, r.method, r.depth): r.speedup for r in speedups(db).itertuples()}
        any_load = {(r.comparable, r.method, r.depth): r.speedup for r in speedups(db, ANY_LOAD).itertuples()}
        stalls = db.execute(
            f"SELECT {COMPARABLE_ID} AS comparable, method, depth, count(*) FILTER (WHERE stall)"
            f" FROM {flagged_sql('runs')} WHERE method != 'verify-cost' GROUP BY ALL"
        ).fetchall()
        # Per sweep with both: whether every greedy baseline of the prompt gave one output (tiny random
        # models have near-ties everywhere, so the two may differ: the count must be the stored runs').
        same = db.execute(
            "SELECT count(DISTINCT output_sha256) = 1 FROM runs WHERE method = 'baseline'"
            " AND engine IN ('llama.cpp', 'llama-server') GROUP BY sweep_id, target_digest, prompt_id, max_new_tokens"
            " HAVING count(DISTINCT engine) = 2 ORDER BY min(seq)"
        ).fetchall()
    assert [int(n) for n in printed_same] == [int(s) for (s,) in same] and len(same) == 2, stdout
    printed = _printed(stdout)
    figures = {key: value for key, value in printed.items() if value[0] is not None}
    assert figures.keys() == any_load.keys() and len({g for g, *_ in printed}) == 9  # 2 + 3 + 3 + 1 groups
    for key, (figure, marked, _) in figures.items():
        assert marked == (key not in stored), (key, stdout)
        assert abs(figure - stored.get(key, any_load[key])) <= 0.005, (key, figure, stored, any_load)
    assert ("* from runs judged not nominal" in stdout) == any(m for _, m, _ in figures.values())
    assert {key: n for key, (_, _, n) in printed.items()} == {(g, m, d): n for g, m, d, n in stalls}


@pytest.mark.timeout(DEMO_SECONDS + 120)
def test_a_second_demo_reuses_its_set_up_serves_the_dashboard_and_stops_everything_on_ctrl_c(small_demo):
    data_dir, _ = small_demo
    unknown = demo(data_dir, "--sweep", "demo-poetry", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert unknown.wait(timeout=120) == 2
    assert "no demo sweep demo-poetry (the demo's: demo, demo-mtp-hybrid" in unknown.stderr.read()
    port = free_port()  # for the dashboard
    # One sweep (the cheapest: one MLX job) this time: what is checked here is the reuse, the
    # dashboard and Ctrl-C, not the sweeps again.
    proc = demo(
        data_dir, "--sweep", "demo-mtp-dense", "--dashboard-port", str(port), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("dashboard: "):
            break
    assert lines and lines[-1].startswith("dashboard: "), "".join(lines)
    endpoints = json.loads((data_dir / "coordinator" / "coordinator.json").read_text())
    deadline = time.monotonic() + 60
    while True:
        try:
            health = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5).read()
            break
        except OSError:
            assert time.monotonic() < deadline, "the dashboard did not come up"
            time.sleep(0.5)
    assert health == b"ok"
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
    assert "<title>" in page

    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]
    assert "demo stopped" in rest
    with pytest.raises(ProcessLookupError):  # the coordinator process is gone too
        for _ in range(50):
            os.kill(endpoints["pid"], 0)
            time.sleep(0.1)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
    # The second run built no models and enrolled no second agent: one agent, both runs' sweeps done.
    with duckdb.connect(str(data_dir / "coordinator" / "specfleet.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM agents").fetchone()[0] == 1
        done = db.execute("SELECT name FROM sweeps WHERE state = 'done'").fetchall()
    assert sorted(name for (name,) in done) == sorted([*SWEEPS, "demo-mtp-dense"])


@pytest.mark.timeout(DEMO_SECONDS)
def test_every_page_renders_on_the_demos_data_from_a_dashboard_started_before_its_coordinator(small_demo, tmp_path):
    """What a user does after `make demo`: `specfleet dashboard` and `specfleet coordinator serve` on the
    demo's data directory, the dashboard first. It says in one line which address it tried and
    where that came from, and recovers by itself once the coordinator is up; then every page, every
    comparable group of Compare and every tab renders on the demo's own data without an exception."""
    data_dir = small_demo[0] / "coordinator"
    port = free_port()
    procs = [spawn("dashboard", "--data-dir", str(data_dir), "--port", str(port), log=tmp_path / "dashboard.log")]
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", procs[0], tmp_path / "dashboard.log", START_SECONDS)
        with chromium_page() as page:
            page.goto(f"http://127.0.0.1:{port}/")
            said = wait_text(page, ("No coordinator answers at 127.0.0.1:", "specfleet coordinator serve --data-dir"))
            line = next(x for x in said.splitlines() if "No coordinator answers at" in x)
            assert f"coordinator.json in {data_dir}" in line and "Trying again" in line, line
            assert "Traceback" not in said and "_InactiveRpcError" not in said

            procs.append(start_coordinator(data_dir)[0])
            # The same page, never reloaded: it retries by itself and lands on the Fleet page at /fleet.
            fleet = wait_text(page, ("busy now", "agents"), seconds=120)
            assert page.url.endswith("/fleet") and "No coordinator answers" not in fleet
            # The demo's one agent is this Linux box: the readings it has no value for are no column.
            headers = table_headers(page)
            assert {"name", "chip", "state", "last seen"} <= set(headers), headers
            assert not {"GPU cores (bin)", "model", "bandwidth (GB/s)", "current job"} & set(headers), headers

            seen = every_page(page, f"http://127.0.0.1:{port}")
    finally:
        for proc in reversed(procs):
            stop(proc)
    groups = [k for k in seen if k.startswith("compare: ")]
    assert len(groups) >= len(SWEEPS), list(seen)  # every sweep's groups are in the selector, each rendered
    assert "Speedup over the baseline against draft depth" in seen[groups[0]]
    assert "Open questions" in seen["questions"] and "Runs" in seen["runs"]

"""`specfleet demo --no-dashboard`: the main job on tiny models, checked from its summary."""

import re
import subprocess
import sys

import duckdb
import pytest

from specfleet.speedup import speedups
from tests.support.ports import free_port
from tests.support.processes import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]

# system, method, K, decode tok/s, the server's own tok/s ("-" for our loops), speedup (marked "*"
# where it comes from runs judged not nominal: a busy machine), acceptance, lossless, runs
ROW = re.compile(
    r"^(mlx|llama\.cpp|llama-server)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+(\S+)\s+([\d.]+\*?)\s+(\S+)\s+(yes|NO)\s+(\d+)$"
)
# The stored runs as if every one were nominal: the same definition of speedup whatever the load.
ANY_LOAD = "(SELECT * REPLACE (NULL::BOOLEAN AS env_nominal) FROM runs)"


# About 2 minutes on a quiet 2-core machine; a loaded one (other suites, both cores busy) takes
# several times that. The load may slow the demo, never fail it (its figures are checked against
# the stored runs whatever the load).
DEMO_SECONDS = 1800


def run_demo(data_dir):
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "demo", "--no-dashboard", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=DEMO_SECONDS,
        cwd=ROOT,
    )


def _rows(text: str) -> list[tuple]:
    return [m.groups() for line in text.splitlines() if (m := ROW.match(line.strip()))]


def _printed_speedups(text: str) -> dict[tuple, tuple[float, bool]]:
    """(comparable group, method, K) -> (the speedup the summary printed, whether it was marked as
    coming from runs judged not nominal)."""
    out, group = {}, None
    for line in text.splitlines():
        if line.startswith("comparable group "):
            group = line.split()[2].rstrip(":")
        elif (m := ROW.match(line.strip())) and m.group(2) != "baseline":
            out[(group, m.group(2), int(m.group(3)))] = (float(m.group(6).rstrip("*")), m.group(6).endswith("*"))
    return out


@pytest.mark.timeout(2 * DEMO_SECONDS + 300)  # two runs of the demo
def test_demo_measures_every_arm_on_both_engines(tmp_path):
    """`specfleet demo` itself, which tests/test_e2e.py does not run: every arm of its four sweeps
    (MTP at depths 1-3, llama-server beside our loops, ngram-mod), the summary's figures equal to
    the stored runs' speedups whatever the machine's load (a busy machine marks a figure, never
    fails it), and a second run reusing the models and the enrolment."""
    result = run_demo(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    llama, hybrid, ngram_mod, dense = (
        result.stdout.split(f"\nsweep {name} done")[1].split("\nsweep ")[0]
        for name in ("demo", "demo-mtp-hybrid", "demo-ngram-mod", "demo-mtp-dense")
    )
    rows = _rows(llama)
    arms = {(engine, method, int(k)) for engine, method, k, *_ in rows}
    for engine in ("mlx", "llama.cpp"):
        for arm in (("baseline", 0), ("draft", 2), ("draft", 4), ("ngram", 3), ("ref-baseline", 0)):
            assert (engine, *arm) in arms, result.stdout
    assert ("mlx", "ref-draft", 2) in arms and ("llama.cpp", "ref-ngram", 3) in arms
    for engine, method, k, tps, _server_tps, speedup, acceptance, lossless, runs in rows:
        assert float(tps) > 0 and float(speedup.rstrip("*")) > 0 and int(runs) > 0
        assert lossless == "yes", f"{engine} {method} K={k} changed the greedy output"
        if method in ("draft", "ngram"):
            assert 0 < float(acceptance) <= 1
    assert re.search(r"verify cost, mlx, 128 tokens of context: T\(M\)/T\(1\) for M = 1\.\.8: 1\.00 ", result.stdout)
    assert "verify cost, llama.cpp" in result.stdout

    # MTP at depths 1-3 on both engines (draft and n-gram beside it, all rolling back the
    # hybrid's recurrent state), and on the all-attention variant on MLX.
    mtp_rows = _rows(hybrid) + _rows(dense)
    mtp_arms = {(engine, method, int(k)) for engine, method, k, *_ in _rows(hybrid)}
    for engine in ("mlx", "llama.cpp"):
        for arm in (("baseline", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3), ("draft", 2), ("ngram", 3)):
            assert (engine, *arm) in mtp_arms, hybrid
    assert {("mlx", "mtp", k) for k in (1, 2, 3)} <= {(e, m, int(k)) for e, m, k, *_ in _rows(dense)}, dense
    for engine, method, k, _tps, _server_tps, _speedup, acceptance, lossless, _runs in mtp_rows:
        assert lossless == "yes", f"{engine} {method} K={k} changed the greedy output on an MTP model"
        if method in ("mtp", "draft-mtp"):
            assert 0 < float(acceptance) < 1

    # llama.cpp's own server beside our loops: its baseline and draft-mtp at depths 1-3 on the
    # hybrid, ngram-mod on the Llama target beside our loops' ngram-mod; the server's own decode
    # speed printed beside the client's.
    server_rows = [r for r in _rows(hybrid) + _rows(ngram_mod) if r[0] == "llama-server"]
    assert {(m, int(k)) for _, m, k, *_ in server_rows} == {
        ("baseline", 0), ("draft-mtp", 1), ("draft-mtp", 2), ("draft-mtp", 3), ("ngram-mod", 8)
    }, hybrid + ngram_mod  # fmt: skip
    assert all(float(server_tps) > 0 for _, _, _, _, server_tps, *_ in server_rows)
    ngram_arms = {(e, m, int(k)) for e, m, k, *_ in _rows(ngram_mod)}
    assert {(e, "ngram-mod", 8) for e in ("mlx", "llama.cpp", "llama-server")} <= ngram_arms, ngram_mod
    assert all(r[7] == "yes" for r in _rows(ngram_mod)), ngram_mod
    assert all(0 < float(r[6]) <= 1 for r in _rows(ngram_mod) if r[1] == "ngram-mod"), ngram_mod  # it drafted

    # Everything went to --data-dir, and a second run reuses the models and the enrolment.
    db = duckdb.connect(str(tmp_path / "coordinator" / "specfleet.duckdb"), read_only=True)
    assert db.execute("SELECT count(DISTINCT engine), count(*) FROM runs").fetchone()[0] == 3
    # The summary prints the one definition of speedup (specfleet/speedup.py, as /metrics and the
    # dashboard compute it), one comparable group at a time: the same runs give the same figures.
    # Runs judged not nominal (a loaded machine) count only where an arm has no nominal pair, and
    # then the figure is marked: the load changes a label, never whether this test passes.
    stored = {(r.comparable, r.method, r.depth): r.speedup for r in speedups(db).itertuples()}
    any_load = {(r.comparable, r.method, r.depth): r.speedup for r in speedups(db, ANY_LOAD).itertuples()}
    printed = _printed_speedups(result.stdout)
    assert printed.keys() == any_load.keys() and len({g for g, *_ in printed}) == 9  # 2 + 3 + 3 + 1 groups
    for key, (figure, marked) in printed.items():
        assert marked == (key not in stored), (key, result.stdout)
        assert abs(figure - stored.get(key, any_load[key])) <= 0.005, (key, figure, stored, any_load)
    assert ("* from runs judged not nominal" in result.stdout) == any(m for _, m in printed.values())
    db.close()
    again = run_demo(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    db = duckdb.connect(str(tmp_path / "coordinator" / "specfleet.duckdb"), read_only=True)
    assert db.execute("SELECT count(*) FROM agents").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM sweeps WHERE state = 'done'").fetchone()[0] == 8
    db.close()


def test_demo_serves_the_dashboard_and_stops_everything_on_ctrl_c(tmp_path):
    import json
    import os
    import signal
    import time
    import urllib.request

    port = free_port()  # for the dashboard
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "demo", "--data-dir", str(tmp_path), "--dashboard-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("dashboard: "):
            break
    assert lines and lines[-1].startswith("dashboard: "), "".join(lines)
    endpoints = json.loads((tmp_path / "coordinator" / "coordinator.json").read_text())
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

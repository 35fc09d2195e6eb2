"""`specfleet demo --no-dashboard`: the main job on tiny models, checked from its summary."""

import re
import subprocess
import sys

import duckdb
import pytest

from tests.processes import ROOT

pytestmark = pytest.mark.slow

ROW = re.compile(r"^(mlx|llama\.cpp)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+(yes|NO)\s+(\d+)$")


def run_demo(data_dir):
    return subprocess.run([sys.executable, "-m", "specfleet.cli", "demo", "--no-dashboard", "--data-dir",
                           str(data_dir)], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_demo_measures_every_arm_on_both_engines(tmp_path):
    result = run_demo(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [m.groups() for line in result.stdout.splitlines() if (m := ROW.match(line.strip()))]
    arms = {(engine, method, int(k)) for engine, method, k, *_ in rows}
    for engine in ("mlx", "llama.cpp"):
        for arm in (("baseline", 0), ("draft", 2), ("draft", 4), ("ngram", 3), ("ref-baseline", 0)):
            assert (engine, *arm) in arms, result.stdout
    assert ("mlx", "ref-draft", 2) in arms and ("llama.cpp", "ref-ngram", 3) in arms
    for engine, method, k, tps, speedup, acceptance, lossless, runs in rows:
        assert float(tps) > 0 and float(speedup) > 0 and int(runs) > 0
        assert lossless == "yes", f"{engine} {method} K={k} changed the greedy output"
        if method in ("draft", "ngram"):
            assert 0 < float(acceptance) <= 1
    assert re.search(r"verify cost, mlx, 128 tokens of context: T\(M\)/T\(1\) for M = 1\.\.8: 1\.00 ", result.stdout)
    assert "verify cost, llama.cpp" in result.stdout

    # Everything went to --data-dir, and a second run reuses the models and the enrolment.
    db = duckdb.connect(str(tmp_path / "coordinator" / "specfleet.duckdb"), read_only=True)
    assert db.execute("SELECT count(DISTINCT engine), count(*) FROM runs").fetchone()[0] == 2
    db.close()
    again = run_demo(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    db = duckdb.connect(str(tmp_path / "coordinator" / "specfleet.duckdb"), read_only=True)
    assert db.execute("SELECT count(*) FROM agents").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM sweeps WHERE state = 'done'").fetchone()[0] == 2
    db.close()

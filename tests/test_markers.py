"""The markers by what a test starts (tests/conftest.py): a test that starts a process or loads a
model without its marker fails, naming what it started; marked, or starting nothing, it passes.
Checked on a small suite run by pytest in a child process with this project's conftest."""

import os
import subprocess
import sys

import pytest

from tests.support.processes import ROOT

pytestmark = [pytest.mark.process]

CASES = """
import subprocess
import sys

import mlx_lm
import pytest


def test_unmarked_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.process
def test_marked_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_unmarked_model_load(tiny_models):
    mlx_lm.load(str(tiny_models.mlx_target))


@pytest.mark.engine
def test_marked_model_load(tiny_models):
    mlx_lm.load(str(tiny_models.mlx_target))


def test_nothing_started():
    assert sum([1, 2]) == 3
"""


def test_unmarked_starts_fail_and_marked_ones_pass(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403 - its hooks and fixtures\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "test_cases.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out = done.stdout + done.stderr
    assert "2 failed, 3 passed" in out, out
    assert "FAILED test_cases.py::test_unmarked_process" in out
    assert "FAILED test_cases.py::test_unmarked_model_load" in out
    assert "started process: [" in out and "is not marked pytest.mark.process: mark it" in out, out
    assert "started engine: " in out and "is not marked pytest.mark.engine: mark it" in out, out

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """The project's tiny target and draft, built once per test session (or reused from
    SPECFLEET_TINY_DIR, which the setup script fills)."""
    from cli.tinymodels import make_tiny

    root = os.environ.get("SPECFLEET_TINY_DIR")
    directory = Path(root) if root else tmp_path_factory.mktemp("tiny")
    return make_tiny(directory)


@pytest.fixture
def page(fleet, monkeypatch):
    """A dashboard page opener on the requesting module's `fleet` fixture (a coordinator, its
    admin token and the truth the fleet was built from): page("compare") runs the app and
    switches to that page, failing on any exception."""
    from streamlit.testing.v1 import AppTest

    from tests.test_dashboard import APP

    coordinator, token, truth = fleet
    monkeypatch.setenv("SPECFLEET_COORDINATOR", f"127.0.0.1:{coordinator.port}")
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", token)

    def open_page(name: str) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page(f"views/{name}.py").run()
        assert not at.exception, at.exception
        return at

    open_page.truth = truth
    return open_page


LLAMA_BENCH = Path(__file__).resolve().parent.parent / ".data" / "llama.cpp" / "bin" / "llama-bench"


@pytest.fixture(scope="session")
def llama_bench_output(tiny_models, tmp_path_factory):
    """Real llama-bench output on the tiny target, once per session: {format: file} for -o json,
    jsonl, csv and sql (two repetitions of pp16 and tg16, a second or so in all)."""
    import subprocess

    if not LLAMA_BENCH.exists():
        pytest.fail(f"no llama-bench at {LLAMA_BENCH}: run scripts/build-llama-cpp.sh")
    out = tmp_path_factory.mktemp("llama-bench")
    files = {}
    for fmt in ("json", "jsonl", "csv", "sql"):
        files[fmt] = out / f"results.{fmt}"
        command = [str(LLAMA_BENCH), "-m", str(tiny_models.gguf_target), "-r", "2", "-p", "16", "-n", "16", "-o", fmt]
        files[fmt].write_text(subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout)
    return files


@pytest.fixture(scope="module")
def coord(tmp_path_factory):
    """A coordinator process for a module's CLI tests: (its gRPC address, its data directory)."""
    from tests.processes import start_coordinator, stop

    data = tmp_path_factory.mktemp("coordinator")
    proc, endpoints = start_coordinator(data)
    yield endpoints["grpc"], data
    assert stop(proc) == 0

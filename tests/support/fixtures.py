"""The fixtures the test modules share, one definition per name (tests/conftest.py loads this
module as a plugin; a module never redefines one of these names).

- `tiny_models`: the project's tiny generated models, once per session.
- `coordinator`: an in-process coordinator per test; `coord`: a coordinator process per module.
- `fleet`: an in-process coordinator per module, seeded by the module's own
  `seed_fleet(coordinator) -> truth`: (coordinator, admin token, truth). `page` opens the
  dashboard's pages on it.
- `fleet_db`: the module's own `fleet_rows() -> DataFrame` (tests/support/versions.py's per-prompt
  rows) stored as runs in a mirror stand-in (tests/support/versions.py `Db`): no process.
- `llama_bench_output`: real llama-bench output on the tiny target, once per session.

Imports are made inside the fixtures, so that loading this plugin stays cheap for every run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LLAMA_BENCH = Path(__file__).resolve().parents[2] / ".data" / "llama.cpp" / "bin" / "llama-bench"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """The project's tiny target and draft, built once per test session (or reused from
    SPECFLEET_TINY_DIR, which the setup script fills)."""
    from cli.tiny import make_tiny

    root = os.environ.get("SPECFLEET_TINY_DIR")
    directory = Path(root) if root else tmp_path_factory.mktemp("tiny")
    return make_tiny(directory)


@pytest.fixture
def coordinator(tmp_path):
    """An in-process coordinator (coordinator.server.Coordinator on a thread, tests/support/fleet.py)
    with its data in tmp_path/coordinator, stopped after the test."""
    from tests.support.fleet import start_coordinator

    c = start_coordinator(tmp_path / "coordinator")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def coord(tmp_path_factory):
    """A coordinator process for a module's CLI tests: (its gRPC address, its data directory)."""
    from tests.support.processes import start_coordinator, stop

    data = tmp_path_factory.mktemp("coordinator")
    proc, endpoints = start_coordinator(data)
    yield endpoints["grpc"], data
    assert stop(proc) == 0


def _module_function(request, name: str, fixture: str, what: str):
    seed = getattr(request.module, name, None)
    if seed is None:
        pytest.fail(f"{request.module.__name__} uses `{fixture}` but defines no {name}(): {what}", pytrace=False)
    return seed


@pytest.fixture(scope="module")
def fleet(request, tmp_path_factory):
    """An in-process coordinator seeded by the requesting module's `seed_fleet(coordinator)`, which
    stores the module's agents, sweeps and runs and returns what they should show (its truth):
    (coordinator, admin token, truth), stopped after the module."""
    from specfleet.data_dir import admin_credential
    from tests.support.fleet import start_coordinator

    seed = _module_function(request, "seed_fleet", "fleet", "it seeds the coordinator and returns the truth")
    coordinator = start_coordinator(tmp_path_factory.mktemp("coordinator"))
    try:
        truth = seed(coordinator)
        yield coordinator, admin_credential(coordinator.config.data_dir), truth
    finally:
        coordinator.stop()


@pytest.fixture(scope="module")
def fleet_db(request):
    """The requesting module's `fleet_rows()` (per-prompt rows of tests/support/versions.py's
    columns) stored as runs, three repeats each, in a mirror stand-in for dashboard/queries.py."""
    from tests.support.versions import Db, stored_runs

    rows = _module_function(request, "fleet_rows", "fleet_db", "it returns the fleet's per-prompt rows")
    return Db(*stored_runs(rows()))


@pytest.fixture
def page(fleet, monkeypatch):
    """A dashboard page opener on the `fleet` fixture (a coordinator, its admin token and the truth
    the fleet was built from): page("compare") runs the app and switches to that page, failing on
    any exception."""
    from streamlit.testing.v1 import AppTest

    from tests.support.dashboard import APP

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

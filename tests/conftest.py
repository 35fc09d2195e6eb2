from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Agents started by tests (`specfleet agent run` in a subprocess) take jobs on a busy machine: the
# test machine is shared, and a test must not depend on it being quiet. The doctor's hold has its
# own tests (tests/test_honest_failures.py), which set it explicitly.
os.environ.setdefault("SPECFLEET_IGNORE_DOCTOR", "1")
# For the same reason their llama.cpp engines decode on one thread where a sweep names none (the
# agent's default, agent/worker.py default_threads): the suite runs in parallel processes, and a
# batch's threads wait for each other at every op, so one descheduled thread stalls them all.
os.environ.setdefault("SPECFLEET_THREADS", "1")

# Markers by what a test starts (issue 29). `make test-fast` runs `-m "not process and not engine"`;
# the hooks below fail a test that starts a process or loads a model without its marker, so the
# fast lane cannot silently grow a coordinator. Starts during a test's set-up count too: a fixture
# that starts a coordinator makes every test that uses it a `process` test.
STARTS = pytest.StashKey[list]()
_running: list = [None]  # the item whose set-up or call is running now


def _started(kind: str, what) -> None:
    item = _running[0]
    if item is not None:
        item.stash.setdefault(STARTS, []).append((kind, what))


def _wrap(owner, name: str, kind: str, describe) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_specfleet_watched", False):
        return

    def watched(*args, **kwargs):
        _started(kind, describe(args, kwargs))
        return original(*args, **kwargs)

    watched._specfleet_watched = True
    setattr(owner, name, watched)


def _watch_model_loads() -> None:
    """Model loads in this process, by whatever path (our engines or the libraries directly);
    patched once each library is imported, since importing them here would slow every run."""
    first = lambda args, kwargs: args[0] if args else kwargs
    if "mlx_lm" in sys.modules:
        import mlx_lm.utils

        _wrap(sys.modules["mlx_lm"], "load", "engine", first)
        _wrap(mlx_lm.utils, "load", "engine", first)
        _wrap(mlx_lm.utils, "load_model", "engine", first)
    if "llama_cpp" in sys.modules:
        import llama_cpp.llama_cpp

        _wrap(sys.modules["llama_cpp"], "llama_model_load_from_file", "engine", first)
        _wrap(llama_cpp.llama_cpp, "llama_model_load_from_file", "engine", first)


def pytest_configure(config):
    _wrap(subprocess.Popen, "__init__", "process", lambda args, kwargs: args[1] if len(args) > 1 else kwargs)
    import multiprocessing.process

    _wrap(multiprocessing.process.BaseProcess, "start", "process", lambda args, kwargs: args[0])


def _check_markers(item) -> None:
    starts = item.stash.get(STARTS, [])
    missing = {kind for kind, _ in starts if item.get_closest_marker(kind) is None}
    if missing:
        what = "; ".join(dict.fromkeys(f"{kind}: {str(thing)[:160]}" for kind, thing in starts if kind in missing))
        marks = " and ".join(f"pytest.mark.{kind}" for kind in sorted(missing))
        pytest.fail(
            f"this test (or a fixture it uses) started {what}, but is not marked {marks}: mark it, "
            "or its module (pytestmark), so that `make test-fast` leaves it out",
            pytrace=False,
        )


def pytest_collection_modifyitems(items):
    """Modules marked slow, then those that load engines, then those that start processes, each
    in file order: `--dist loadfile` hands modules out in this order, so the longest start first
    instead of leaving one running alone at the end."""
    weight = {}
    for item in items:
        path = item.path
        marks = {m for m in ("slow", "engine", "process") if item.get_closest_marker(m)}
        weight[path] = max(weight.get(path, (0, 0)), ("slow" in marks, len(marks)))
    items.sort(key=lambda item: tuple(-w for w in weight[item.path]))  # stable: file order within a weight


def pytest_collection_finish(session):
    _watch_model_loads()  # the test modules have imported the engines by now


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _watch_model_loads()
    _running[0] = item
    try:
        return (yield)
    finally:
        _running[0] = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _watch_model_loads()
    _running[0] = item
    try:
        result = yield
    finally:
        _running[0] = None
    _check_markers(item)
    return result


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

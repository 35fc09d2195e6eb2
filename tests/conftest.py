from __future__ import annotations

import os
import subprocess
import sys

import pytest

# The shared fixtures (tiny_models, coordinator, coord, fleet, fleet_db, page, llama_bench_output)
# live in tests/support/fixtures.py, one definition per name; this file keeps the hooks.
pytest_plugins = ("tests.support.fixtures",)

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

"""The tests' own house rules (issue 38), read from the sources, no process: helpers live in
tests/support, a shared fixture is defined once (tests/support/fixtures.py) and never again by a
test module under the same name, and no test imports tests/conftest.py."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = TESTS / "support" / "fixtures.py"


def fixtures_defined(tree: ast.Module) -> set[str]:
    """Names of the module-level functions decorated with pytest.fixture (called or not)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Attribute) and target.attr == "fixture":
                    names.add(node.name)
    return names


def imports_conftest(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("tests.conftest", "conftest"):
            return True
        if isinstance(node, ast.Import) and any(a.name in ("tests.conftest", "conftest") for a in node.names):
            return True
    return False


def problems(sources: dict[str, str], shared: set[str]) -> list[str]:
    out = []
    for name, source in sorted(sources.items()):
        tree = ast.parse(source)
        out += [f"{name} redefines the shared fixture `{f}`" for f in sorted(fixtures_defined(tree) & shared)]
        if imports_conftest(tree):
            out.append(f"{name} imports tests/conftest.py: take what it needs from tests/support")
    return out


def test_shared_fixtures_are_defined_once_and_conftest_is_never_imported():
    shared = fixtures_defined(ast.parse(SHARED.read_text()))
    assert {"tiny_models", "coordinator", "coord", "fleet", "fleet_db", "page"} <= shared
    sources = {p.name: p.read_text() for p in TESTS.glob("test_*.py")}
    assert problems(sources, shared) == []


def test_helper_modules_live_in_tests_support():
    loose = sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py")
    assert loose == [], f"helper modules outside tests/support: {loose}"


def test_the_rules_catch_a_redefinition_and_a_conftest_import():
    source = (
        "import pytest\nfrom tests.conftest import LLAMA_BENCH\n\n"
        "@pytest.fixture(scope='module')\ndef fleet():\n    return 1\n\n@pytest.fixture\ndef mine():\n    return 2\n"
    )
    assert problems({"test_x.py": source}, {"fleet", "coordinator"}) == [
        "test_x.py redefines the shared fixture `fleet`",
        "test_x.py imports tests/conftest.py: take what it needs from tests/support",
    ]

"""No function of the project over MAX_LINES lines outside tests/ (issue 38 item 5): a long function
says that an object or a table is missing. Lines are counted from the `def` to the last line of
the body, as an editor shows them (decorators left out). ruff's PLR0915 (pyproject.toml: at most 60
statements a function) says the same in statements while the code is edited; this counts lines.

Read by `ast` from the files themselves: every .py file under the repository root except tests/,
virtual environments, build outputs, hidden folders and the generated gRPC stubs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
SKIPPED_DIRS = {"tests", "build", "dist", "node_modules", "__pycache__"}  # and every hidden folder (.venv, .git)
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # protos/generate.py's output


def project_files(root: Path = ROOT) -> list[Path]:
    """The project's own Python files under `root` (see the module's docstring)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if any(p in SKIPPED_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in parts):
            continue
        if path.name.endswith(GENERATED):
            continue
        out.append(path)
    return out


def long_functions(source: str, max_lines: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function or method in `source` over `max_lines`
    lines, nested ones included ("Agent.run", "run_demo.start")."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                lines = child.end_lineno - child.lineno + 1
                if lines > max_lines:
                    found.append((name, child.lineno, lines))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_counts_lines_of_every_function_kind():
    """The counter on known answers: a function of 81 lines is caught, one of 80 is not; methods,
    nested and async functions are named by their path; decorators are not counted."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    source = (
        f"def too_long():\n{body}\n    return 0\n\n"  # 1 + 79 + 1 = 81 lines
        f"@decorator\ndef exact():\n{body}\n\n"  # 80 lines
        f"class A:\n    async def method(self):\n{body.replace('    ', '        ')}\n        return 1\n"
        f"        def inner():\n{body.replace('    ', '            ')}\n            return 2\n"
    )
    found = {name: lines for name, _, lines in long_functions(source)}
    assert found == {"too_long": 81, "A.method": 162, "A.method.inner": 81}


def test_skips_tests_hidden_build_and_generated_files(tmp_path):
    for rel in ("pkg/mod.py", "tests/test_x.py", ".venv/lib/x.py", "build/x.py", "protos/v1/fleet_pb2.py",
                "protos/v1/fleet_pb2_grpc.py", "protos/generate.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert [p.relative_to(tmp_path).as_posix() for p in project_files(tmp_path)] == [
        "pkg/mod.py",
        "protos/generate.py",
    ]


def test_no_function_over_80_lines_outside_tests():
    files = project_files()
    assert any(p.relative_to(ROOT).parts[0] == "specfleet" for p in files)  # the walk found the project
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name}: {lines} lines"
        for path in files
        for name, line, lines in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(offenders)

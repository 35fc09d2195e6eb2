"""docs/sweeps.md, the sweep file's reference, generated from the declaration.

Every key a sweep file takes: the declared rows' (specfleet/settings.py: the sampler, the job's own
parameters, the cell's settings, llama-server's spec-type parameters), each with its type, bounds,
default, what it changes and the record schema that added it; the file's own parts (target, models,
verify_cost: their pydantic models in specfleet/sweeps.py) with theirs; and the record's schema
history (specfleet/record.py SCHEMA_HISTORY and the rows' `since`). `python -m specfleet.sweep_reference`
writes the page; tests/test_sweep_reference.py fails when it is not current.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from specfleet import settings as declared
from specfleet.record import FIELD_VERSIONS, SCHEMA_HISTORY, SCHEMA_VERSION
from specfleet.sweeps import ModelFields, TargetFields, VerifyCostFields

PAGE = Path(__file__).resolve().parent.parent / "docs" / "sweeps.md"

# The file's structure: keys that are no setting of a run (what runs, where, and with which arms).
STRUCTURE = (
    ("name", "string", "required: 1-100 letters, digits, `_`, `.`, `-`", "The sweep's name"),
    ("engines", "list of string", f"required: of {', '.join(declared.ENGINES)}", "The engines whose cells it has"),
    ("models.<engine>", "mapping or list of them", "required per engine", "The target (and draft) each engine runs"),
    ("prompt_sets", "list of string", "required: specfleet/prompt_sets", "The prompt sets; one cell each"),
    ("methods.<method>", "list of int", "in-process engines; depths 1-64", "Speculative arms and their draft depths"),
    ("arms", "list of mapping", "llama-server, openai", "Server arms (specfleet/server_arms.py)"),
    ("server", "mapping", "flags, system, command, url", "What every server arm of a cell shares"),
)
PARTS = (("target", TargetFields), ("models.<engine>", ModelFields), ("verify_cost", VerifyCostFields))


def _bounds(lo, hi) -> str:
    def number(x) -> str:
        return f"{x:g}" if isinstance(x, float) else str(x)

    if lo is None and hi is None:
        return ""
    if hi is None:
        return f">= {number(lo)}"
    return f"{number(lo)}..{number(hi)}" if lo is not None else f"<= {number(hi)}"


def _type_name(annotation) -> str:
    """A field's annotation as the page names it: "float", "list of string", "string or null"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "mapping"
    return {str: "string", int: "int", float: "float", bool: "bool"}.get(annotation, str(annotation))


def _constraints(annotation, found: list) -> list:
    """Every constraint in an annotation, nested ones (an optional number's bounds) included."""
    if typing.get_origin(annotation) is typing.Annotated:
        found += list(annotation.__metadata__)
        return _constraints(typing.get_args(annotation)[0], found)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            _constraints(arg, found)
    for m in list(found):
        found += list(getattr(m, "metadata", []))  # a FieldInfo's own bounds
    return found


def _rows() -> list[declared.Setting]:
    """The declared rows a sweep file sets, one per key: the parameters that several spec types
    share (size_n of three n-gram types) merged into one row naming every type."""
    rows: dict[tuple, declared.Setting] = {}
    for s in (s for s in declared.DECLARED if s.sweep):
        key = (s.sweep, s.lo, s.hi, s.doc)
        if key in rows and s.spec_types:
            s = dataclasses.replace(rows[key], spec_types=rows[key].spec_types + s.spec_types)
        rows[key] = s
    return list(rows.values())


def _row(s: declared.Setting) -> str:
    kind = " \\| ".join(s.choices) if s.choices else _type_name(s.type)
    default = "unset" if s.default is None else f"`{s.default!r}`" if s.type is str else f"`{s.default}`"
    engines = "" if s.engines == declared.ENGINES else f" ({', '.join(s.engines)} only)"
    if s.spec_types:
        engines = f" (llama-server --spec-type {', '.join(s.spec_types)})"
    since = str(s.since) if s.recorded else "not recorded"
    return f"| `{s.sweep}` | {kind} | {_bounds(s.lo, s.hi)} | {default} | {s.doc}{engines} | {since} |"


def _part_rows(prefix: str, part: type[BaseModel]) -> list[str]:
    rows = []
    for name, field in part.model_fields.items():
        found = _constraints(field.annotation, list(field.metadata))
        lo = next((m.ge for m in found if getattr(m, "ge", None) is not None), None)
        hi = next((m.le for m in found if getattr(m, "le", None) is not None), None)
        kind = _type_name(field.annotation)
        default = "required" if field.is_required() else f"`{field.default!r}`"
        rows.append(f"| `{prefix}.{name}` | {kind} | {_bounds(lo, hi)} | {default} |")
    return rows


def _history() -> list[str]:
    """Each schema version: what specfleet/record.py SCHEMA_HISTORY says it added, and every field
    path it added (the record's own and the declared rows')."""
    by_version: dict[int, list[str]] = {}
    for path, since in FIELD_VERSIONS.items():
        by_version.setdefault(since, []).append(f"`{path}`")
    lines = ["| schema | what it added | fields it added |", "| --- | --- | --- |"]
    for v in range(1, SCHEMA_VERSION + 1):
        what = SCHEMA_HISTORY[v][0] if v in SCHEMA_HISTORY else "declared settings"
        lines.append(f"| {v} | {what} | {', '.join(by_version.get(v, []))} |")
    return lines


def render() -> str:
    """The page, as docs/sweeps.md holds it."""
    declared_rows = _rows()
    lines = [
        "# The sweep file",
        "",
        "Generated from specfleet/settings.py (the declaration) and specfleet/sweeps.py by",
        "`python -m specfleet.sweep_reference`; tests/test_sweep_reference.py fails when it is not current.",
        "A sweep file is YAML: `specfleet sweep submit sweep.yaml` checks it and names every problem by its",
        "line and key. A setting given as a list is a dimension of the matrix (one cell per value).",
        "",
        "## The file's structure",
        "",
        "| key | type | takes | what it is |",
        "| --- | --- | --- | --- |",
        *(f"| `{key}` | {kind} | {takes} | {doc} |" for key, kind, takes, doc in STRUCTURE),
        "",
        "## Settings, the sampler and the job's parameters",
        "",
        "`samplers[]`: each entry of the list `samplers`; `arms[].params`: a llama-server arm's `params`.",
        f"Since: the run record schema that added the setting's column (this code writes schema {SCHEMA_VERSION}).",
        "",
        "| key | type | bounds | default | what it changes | since |",
        "| --- | --- | --- | --- | --- | --- |",
        *(_row(s) for s in declared_rows),
        "",
        "## The file's parts",
        "",
        "| key | type | bounds | default |",
        "| --- | --- | --- | --- |",
        *(row for prefix, part in PARTS for row in _part_rows(prefix, part)),
        "",
        "## Record schema history",
        "",
        "The coordinator reads every older schema, the fields it predates unknown (specfleet/record.py).",
        "",
        *_history(),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE}", file=sys.stderr)


if __name__ == "__main__":
    main()

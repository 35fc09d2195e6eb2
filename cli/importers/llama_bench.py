"""llama-bench's output (`-o json`, `jsonl`, `csv`, `sql`) as imported results.

Fields are read by name, as llama-bench's `test::get_fields()` names them, since they drift
between llama.cpp versions (n_depth, backends, n_cpu_moe came late; cuda/metal/... flags went):
required are build_commit, model_type, n_prompt, n_gen and avg_ts; stddev_ts, samples_ts (json
and jsonl only), n_depth (absent before llama-bench had -d, when every test ran at depth 0),
build_number, cpu_info, gpu_info, backends, model_filename and test_time are read where present.
Every field of the row is kept as the file gives it. csv and sql give every value as text
(llama-bench quotes them all); json and jsonl give numbers and booleans as such.

The sql output (`CREATE TABLE IF NOT EXISTS llama_bench (...)` and one `INSERT INTO llama_bench
(...) VALUES (...)` per test) is run in an in-memory DuckDB with no file or network access,
after checking that it holds nothing but those statements; its columns are made text first so
that a value is read exactly as written (the file's REAL would be DuckDB's 4-byte float).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import duckdb

from cli.importers import LLAMA_BENCH_FORMATS as FORMATS
from cli.importers.result import BadFile, Fields, ImportedResult, Source, at_most_rows, read_source

TOOL = "llama-bench"
# Backend flags of llama-bench versions before its `backends` field, in the order it printed them.
OLD_BACKEND_FLAGS = ("cuda", "vulkan", "kompute", "metal", "sycl", "rpc", "gpu_blas", "blas")
_CREATE = re.compile(r"\s*CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+llama_bench\s*\(", re.IGNORECASE)
_INSERT = re.compile(r"\s*INSERT\s+INTO\s+llama_bench\s*\(", re.IGNORECASE)
_COLUMN = re.compile(r"[a-z_][a-z0-9_]*")


def detect_format(path: Path, text: str) -> str:
    """The format by the file's suffix, else by how its text starts."""
    suffix = path.suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    start = text.lstrip()[:32].upper()
    if start.startswith("["):
        return "json"
    if start.startswith("{"):
        return "jsonl"
    if start.startswith("CREATE") or start.startswith("INSERT"):
        return "sql"
    return "csv"


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _key_lines(text: str, start: int, end: int):
    """For a JSON object at text[start:end]: the line of a key's first occurrence in it."""

    def line_of(name: str) -> int:
        found = text.find(f'"{name}"', start, end)
        return _line(text, found if found >= 0 else start)

    return line_of


def _json_rows(text: str, source: Source) -> list[Fields]:
    decoder = json.JSONDecoder()
    rows: list[Fields] = []
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise source.bad("expected a JSON array of results ('[' ... ']')", _line(text, i))
    i += 1
    while True:
        i += len(text[i:]) - len(text[i:].lstrip())
        if text.startswith("]", i) and not rows:
            break
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise source.bad(f"not JSON: {e.msg}", e.lineno) from None
        if not isinstance(value, dict):
            raise source.bad(f"expected a result object, got {type(value).__name__}", _line(text, i))
        rows.append(Fields(value, source, _line(text, i), _key_lines(text, i, end)))
        i = end + len(text[end:]) - len(text[end:].lstrip())
        if text.startswith(",", i):
            i += 1
        elif text.startswith("]", i):
            break
        else:
            raise source.bad("expected ',' or ']' after a result", _line(text, i))
    rest = text[i + 1 :].strip()
    if rest:
        raise source.bad("text after the closing ']'", _line(text, len(text) - len(text[i + 1 :].lstrip())))
    return rows


def _jsonl_rows(text: str, source: Source) -> list[Fields]:
    rows = []
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        start, offset = offset, offset + len(line)
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise source.bad(f"not JSON: {e.msg} (column {e.colno})", number) from None
        if not isinstance(value, dict):
            raise source.bad(f"expected a result object, got {type(value).__name__}", number)
        rows.append(Fields(value, source, number, _key_lines(text, start, offset)))
    return rows


def _csv_rows(text: str, source: Source) -> list[Fields]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header:
            raise source.bad("empty: expected a header line of field names", 1)
        rows = []
        for values in reader:
            if not values or values == header:  # a blank line, or the header of a file appended to it
                continue
            if len(values) != len(header):
                raise source.bad(f"{len(values)} values for the header's {len(header)} fields", reader.line_num)
            rows.append(Fields(dict(zip(header, values)), source, reader.line_num))
    except csv.Error as e:
        raise source.bad(f"not CSV: {e}", reader.line_num) from None
    return rows


def _sql_rows(text: str, source: Source) -> list[Fields]:
    con = duckdb.connect(":memory:", config={"enable_external_access": False})
    try:
        try:
            statements = con.extract_statements(text)
        except duckdb.Error as e:
            raise source.bad(f"not SQL DuckDB can read: {str(e).splitlines()[0]}") from None
        offset, lines = 0, []
        for statement in statements:
            found = text.find(statement.query, offset)
            offset = found + len(statement.query)
            lines.append(_line(text, found + len(statement.query) - len(statement.query.lstrip())))
        for statement, line in zip(statements, lines):
            create = statement.type == duckdb.StatementType.CREATE and _CREATE.match(statement.query)
            insert = statement.type == duckdb.StatementType.INSERT and _INSERT.match(statement.query)
            if not (create or insert):
                raise source.bad("only CREATE TABLE IF NOT EXISTS llama_bench and INSERT INTO llama_bench", line)
        for statement, line in zip(statements, lines):
            try:
                if statement.type == duckdb.StatementType.INSERT:
                    con.execute(statement.query)
                elif not _has_table(con):  # a second CREATE (files concatenated) keeps the first's rows
                    con.execute(statement.query)
                    _as_text(con, source, line)
            except duckdb.Error as e:
                raise source.bad(str(e).splitlines()[0], line) from None
        inserts = [line for statement, line in zip(statements, lines) if statement.type == duckdb.StatementType.INSERT]
        cursor = con.execute("SELECT * FROM llama_bench ORDER BY rowid")
        names = [d[0] for d in cursor.description]
        return [Fields(dict(zip(names, row)), source, line) for row, line in zip(cursor.fetchall(), inserts)]
    finally:
        con.close()


def _has_table(con) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'llama_bench'").fetchone()[0])


def _as_text(con, source: Source, line: int) -> None:
    """Recreate table llama_bench with the file's columns, every one text."""
    columns = [name for (name,) in con.execute("SELECT column_name FROM (DESCRIBE llama_bench)").fetchall()]
    for name in columns:
        if not _COLUMN.fullmatch(name):
            raise source.bad(f"column {name!r} is not a llama-bench field name", line)
    con.execute("DROP TABLE llama_bench")
    con.execute(f"CREATE TABLE llama_bench ({', '.join(f'{name} VARCHAR' for name in columns)})")


def _flag(value) -> bool:
    return value is True or (isinstance(value, str | int) and str(value).lower() in ("1", "true"))


def _result(row: Fields) -> ImportedResult:
    n_prompt, n_gen = row.integer("n_prompt"), row.integer("n_gen")
    n_depth = row.integer("n_depth", required=False, default=0)
    if n_prompt == 0 and n_gen == 0:
        raise row.bad("n_prompt", "n_prompt and n_gen are both 0: no test")
    tokens_per_second = row.number("avg_ts")
    if tokens_per_second <= 0:
        raise row.bad("avg_ts", f"must be above 0, got {row.values['avg_ts']!r}")
    # Named as llama-bench's markdown table names it: pp512, tg128, pp512+tg128, "@ d4096" for depth.
    test = "+".join(name for name, n in ((f"pp{n_prompt}", n_prompt), (f"tg{n_gen}", n_gen)) if n)
    test += f" @ d{n_depth}" if n_depth else ""
    version = row.text("build_commit")
    if row.has("build_number"):
        version += f" ({row.integer('build_number')})"
    if row.has("backends"):
        backends = row.text("backends")
    else:
        backends = ",".join(name.upper() for name in OLD_BACKEND_FLAGS if _flag(row.values.get(name)))
    machine = " / ".join(p for p in (row.text("cpu_info", False), row.text("gpu_info", False), backends) if p)
    model = row.text("model_type")
    if row.has("model_filename"):
        model += f" ({Path(row.text('model_filename').replace(chr(92), '/')).name})"  # a name, never a path
    return ImportedResult(
        tool=TOOL,
        tool_version=version,
        source=row.source,
        line=row.line,
        machine=machine,
        model=model,
        test=test,
        method="baseline",
        draft_depth=0,
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=n_depth,
        tokens_per_second=tokens_per_second,
        tokens_per_second_stddev=row.number("stddev_ts", required=False),
        samples_tokens_per_second=row.numbers("samples_ts"),
        measured_at=row.text("test_time", False),
        fields_json=json.dumps(row.values, sort_keys=True),
    )


def parse(path: Path, fmt: str = "auto") -> list[ImportedResult]:
    """Every result of a llama-bench output file, or BadFile naming the first bad line and field."""
    text, source = read_source(path)
    fmt = detect_format(path, text) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise BadFile(f"{path.name}: unknown format {fmt!r} (known: auto, {', '.join(FORMATS)})")
    rows = {"json": _json_rows, "jsonl": _jsonl_rows, "csv": _csv_rows, "sql": _sql_rows}[fmt](text, source)
    return at_most_rows([_result(row) for row in rows], source)

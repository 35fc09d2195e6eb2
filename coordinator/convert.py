"""A store file written by a DuckDB other than the pinned one (pyproject.toml pins duckdb to the
version whose lake extension packages the registry has: coordinator/lake.py), carried into the
pinned one's storage format.

DuckDB reads only the storage versions up to its own: duckdb 1.5.5 refuses a file that 2.0.1 wrote.
`foreign()` tells such a file from the error that opening it raised and names the DuckDB that wrote
it, from the file's header (after the checksum: the magic b"DUCK", the storage version, four flag
words, then the library version and git hash, 32 bytes each). `convert()` runs that DuckDB in a
throwaway environment (`uv run --with duckdb==VERSION`, from the registry) to EXPORT DATABASE the
file read-only, imports the export with the pinned DuckDB into a new file, checks every table's
row count and every sequence's next value against the old, and only then moves the old file (and
its WAL) aside under a name saying which DuckDB wrote it and puts the new one in its place. The
old file's bytes are never changed.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

_MAGIC = b"DUCK"
_MAGIC_AT = 8
_LIBRARY_AT = 8 + 4 + 8 + 4 * 8  # magic, storage version, four flag words
_FIELD = 32


class ConvertError(RuntimeError):
    """The file cannot be converted: one line naming it and why."""


@dataclass(frozen=True)
class Header:
    storage_version: int
    library_version: str  # "2.0.1"; "" where the writer recorded none (DuckDB before 1.0)


def read_header(path: Path) -> Header | None:
    """The DuckDB header of `path`; None when it is not a DuckDB file."""
    with open(path, "rb") as f:
        head = f.read(_LIBRARY_AT + _FIELD)
    if len(head) < _LIBRARY_AT or head[_MAGIC_AT : _MAGIC_AT + 4] != _MAGIC:
        return None
    storage = int.from_bytes(head[_MAGIC_AT + 4 : _MAGIC_AT + 12], "little")
    library = head[_LIBRARY_AT : _LIBRARY_AT + _FIELD].split(b"\0", 1)[0].decode("ascii", "replace")
    return Header(storage, library.removeprefix("v"))


def command(path: Path) -> str:
    return f"specfleet store convert {path}"


def kept_path(path: Path, version: str) -> Path:
    """Where convert() keeps the old file: beside it, named for the DuckDB that wrote it."""
    return path.with_name(f"{path.name}.duckdb-{version}")


def foreign(path: Path, e: BaseException) -> str | None:
    """When `e` is DuckDB refusing to open `path` because another DuckDB's storage format holds
    it: one line naming the file, the DuckDB that wrote it, the pinned one, and the command that
    converts it. None for any other error."""
    if "version number" not in str(e) or not path.is_file():
        return None
    header = read_header(path)
    if header is None:
        return None
    writer = f"DuckDB {header.library_version}" if header.library_version else "another DuckDB"
    return (
        f"{path} was written by {writer} (storage version {header.storage_version}), which this"
        f" coordinator's DuckDB {duckdb.__version__} cannot read (pyproject.toml pins it for the lake"
        f" store's extension packages); nothing in it was changed. Convert it once, with the"
        f" coordinator stopped: `{command(path)}` (the old file is kept beside it)"
    )


# Run by the writer's DuckDB: export the file read-only, print each table's rows and each
# sequence's next value (what the import must reproduce).
_EXPORT = """
import json, sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
tables = [r[0] for r in con.execute(
    "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary")
    .fetchall()]
counts = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
sequences = dict(con.execute(
    "SELECT sequence_name, coalesce(last_value + increment_by, start_value) FROM duckdb_sequences()"
    " WHERE database_name = current_database() AND NOT temporary").fetchall())
con.execute("EXPORT DATABASE '" + sys.argv[2].replace("'", "''") + "' (FORMAT parquet)")
print(json.dumps({"version": duckdb.__version__, "rows": counts, "sequences": sequences}))
"""


@dataclass(frozen=True)
class Converted:
    path: Path
    kept: Path
    from_version: str
    rows: dict[str, int]


def _uv() -> str:
    """uv as scripts/setup.sh installs it: on PATH, or in the user's base directory."""
    found = shutil.which("uv")
    if found:
        return found
    user = Path(site.getuserbase()) / "bin" / "uv"
    if user.is_file():
        return str(user)
    raise ConvertError("uv is not installed (scripts/setup.sh installs it): convert needs it to run the old DuckDB")


def _export(path: Path, version: str, into: Path) -> dict:
    """The file exported by DuckDB `version` into `into`; its row counts and sequences."""
    argv = [_uv(), "run", "--no-project", "--quiet", "--python", sys.executable, "--with", f"duckdb=={version}"]
    done = subprocess.run([*argv, "python", "-c", _EXPORT, str(path), str(into)], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConvertError(f"DuckDB {version} could not export {path}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(new: duckdb.DuckDBPyConnection, old: dict, path: Path) -> None:
    for table, rows in old["rows"].items():
        have = new.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
        if have != rows:
            raise ConvertError(f"{path}: table {table} has {rows} rows, but {have} after the import")
    for name, following in old["sequences"].items():
        (have,) = new.execute(
            "SELECT coalesce(last_value + increment_by, start_value) FROM duckdb_sequences() WHERE sequence_name = ?",
            [name],
        ).fetchone()
        if have != following:
            raise ConvertError(f"{path}: sequence {name} went on at {following}, but at {have} after the import")


def convert(path: Path, from_version: str | None = None) -> Converted:
    """Carry `path` into the pinned DuckDB's storage format (see the module's docstring). The
    writer's version is read from the header unless given. ConvertError, with the file untouched,
    when it is readable already, not a DuckDB file, or the export or its check fails."""
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"{path}: no such file")
    header = read_header(path)
    if header is None:
        raise ConvertError(f"{path} is not a DuckDB database file")
    version = from_version or header.library_version
    if not version:
        raise ConvertError(f"{path} does not record which DuckDB wrote it: name it with --from-version")
    if version == duckdb.__version__:
        raise ConvertError(f"{path} was written by DuckDB {version}, the pinned one: nothing to convert")
    kept = kept_path(path, version)
    if kept.exists():
        raise ConvertError(f"{kept} exists already: move it away first (it may be an earlier conversion's old file)")
    with tempfile.TemporaryDirectory(prefix=".specfleet-convert-", dir=path.parent) as scratch:
        exported = Path(scratch) / "export"
        old = _export(path, version, exported)
        new_path = Path(scratch) / path.name
        new = duckdb.connect(str(new_path))
        try:
            new.execute("IMPORT DATABASE '" + str(exported).replace("'", "''") + "'")
            _check(new, old, path)
            new.execute("CHECKPOINT")
        finally:
            new.close()
        wal = path.with_name(path.name + ".wal")
        os.rename(path, kept)
        if wal.exists():
            os.rename(wal, kept.with_name(kept.name + ".wal"))
        os.rename(new_path, path)
    return Converted(path, kept, old["version"], old["rows"])

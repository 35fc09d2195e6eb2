"""The store option beside the embedded DuckDB file: a DuckLake whose catalog is a PostgreSQL
database and whose data files lie in a directory every coordinator can reach
(`--store ducklake:postgres://USER@HOST:PORT/DBNAME?data_path=/srv/specfleet-lake`).

DuckLake is DuckDB's own dialect, so the store's SQL serves both. What DuckLake lacks, this module
stands in for, in one place:

- no PRIMARY KEY or UNIQUE constraints: `dialect()` drops them from the migrations' DDL; the
  writers that relied on them ask `Store.unique_keys` (ingest checks a run id before inserting);
- no sequences: `ingest_seq` is a TEMP sequence of the connection, started at the value of the
  one-row table `ingest_counter` at each transaction's start and written back before its commit
  (coordinator/store.py). Every transaction that took a sequence number so updates that row: two
  such transactions on two coordinators conflict, the later commit fails, and the store runs
  the whole transaction again on the catalog's next snapshot (`conflict`). That is what keeps a
  job from being leased twice and a run from being stored twice across coordinators;
- the extensions (ducklake, postgres) come from their registry packages at exactly duckdb's
  version, loaded from the files inside them, never from the network (`connect`).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

import duckdb

SCHEME = "ducklake:postgres://"
# The registry package of each extension and the name DuckDB knows it by (the file's entry point
# is <name>_duckdb_cpp_init; the postgres package's file answers to postgres_scanner).
EXTENSIONS = {
    "ducklake": ("duckdb_extension_ducklake", "ducklake"),
    "postgres": ("duckdb_extension_postgres", "postgres_scanner"),
}
COUNTER_TABLE = "ingest_counter"


class ExtensionMismatch(RuntimeError):
    """duckdb and its extension packages are not at one version."""


@dataclass(frozen=True)
class LakeUrl:
    """`ducklake:postgres://USER[:PASSWORD]@HOST:PORT/DBNAME?data_path=DIR`, parsed."""

    postgres: str  # the libpq connection URI of the catalog
    data_path: str

    @classmethod
    def parse(cls, text: str) -> LakeUrl:
        if not text.startswith(SCHEME):
            raise ValueError(f"--store {text!r}: expected 'file' or {SCHEME}USER@HOST:PORT/DBNAME?data_path=DIR")
        parts = urlsplit(text.removeprefix("ducklake:"))
        query = parse_qs(parts.query)
        data_path = query.pop("data_path", [""])[0]
        if not data_path:
            raise ValueError(f"--store {text!r}: no data_path=DIR (where the lake's Parquet files go)")
        if not parts.hostname or not parts.path.strip("/"):
            raise ValueError(f"--store {text!r}: the catalog needs a host and a database name")
        rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
        return cls(urlunsplit(parts._replace(query=rest)), data_path)

    def describe(self) -> str:
        """The catalog and data path, without a password."""
        parts = urlsplit(self.postgres)
        host = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
        return f"ducklake catalog {host}{parts.path}, data in {self.data_path}"


def extension_file(name: str) -> Path:
    """The extension's file inside its registry package, at duckdb's own version; ExtensionMismatch
    naming both versions when the package is missing or at another."""
    package, _ = EXTENSIONS[name]
    wanted = duckdb.__version__
    dist = package.replace("_", "-")
    try:
        have = metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise ExtensionMismatch(f"{dist} is not installed: the lake store needs it at duckdb's {wanted}") from None
    if have != wanted:
        raise ExtensionMismatch(f"duckdb is {wanted} but {dist} is {have}: pin both to one version (pyproject.toml)")
    path = Path(str(resources.files(package))) / "extensions" / f"v{wanted}" / f"{name}.duckdb_extension"
    if not path.is_file():
        raise ExtensionMismatch(f"{dist} {have} holds no {path.name} for duckdb v{wanted} (looked in {path.parent})")
    return path


_linked: dict[str, Path] = {}


def loadable(name: str) -> Path:
    """A path to the extension's file whose name is the one DuckDB knows it by (it derives the
    entry point from the file name): a link in a private temporary directory where they differ."""
    path = extension_file(name)
    known = EXTENSIONS[name][1]
    if path.stem == known:
        return path
    if name not in _linked:
        link = Path(tempfile.mkdtemp(prefix="specfleet-ext-")) / f"{known}.duckdb_extension"
        link.symlink_to(path)
        _linked[name] = link
    return _linked[name]


def connect(url: LakeUrl) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached as `lake` and made the default database; its
    temporary objects (the sequence, the figures' scratch tables) stay in the connection."""
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in EXTENSIONS:
        con.load_extension(str(loadable(name)))
    Path(url.data_path).mkdir(parents=True, exist_ok=True)
    try:
        con.execute(f"ATTACH {_quote('ducklake:postgres:' + url.postgres)} AS lake (DATA_PATH {_quote(url.data_path)})")
        con.execute("USE lake")
    except BaseException:
        con.close()
        raise
    return con


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_CONSTRAINT = re.compile(r"\s+(PRIMARY KEY|UNIQUE)\b(?!\s*\()", re.IGNORECASE)
_TABLE_KEY = re.compile(r",\s*PRIMARY KEY\s*\([^)]*\)", re.IGNORECASE)
_SEQUENCE = re.compile(r"CREATE SEQUENCE ingest_seq START 1;", re.IGNORECASE)
# DuckLake takes no default for a LIST column: the rows stored get it by an UPDATE (the writers
# name the column in every insert, so no later row needs the default).
_LIST_DEFAULT = re.compile(r"^ALTER TABLE (\w+) ADD COLUMN (\w+) (\w+\[\]) DEFAULT (\[[^;]*\]);", re.MULTILINE)


def dialect(sql: str) -> str:
    """A migration's SQL as DuckLake takes it: no key constraints, no LIST default, and the
    sequence's row."""
    sql = _TABLE_KEY.sub("", _CONSTRAINT.sub("", sql))
    sql = _LIST_DEFAULT.sub(r"ALTER TABLE \1 ADD COLUMN \2 \3; UPDATE \1 SET \2 = \4;", sql)
    counter = f"CREATE TABLE {COUNTER_TABLE} (value BIGINT NOT NULL); INSERT INTO {COUNTER_TABLE} VALUES (0);"
    return _SEQUENCE.sub(counter, sql)


def conflict(e: BaseException) -> bool:
    """Whether a commit failed because another coordinator committed first (DuckLake's
    optimistic concurrency): the transaction is run again, not refused."""
    return isinstance(e, duckdb.TransactionException) and "DuckLake transaction" in str(e)

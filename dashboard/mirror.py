"""The dashboard's own DuckDB, mirrored from the coordinator through its read path.

The coordinator stays the only writer of its file; the dashboard asks for rows whose ingest
sequence is above the last one it saw, per table, and adds them locally: runs and imported
results are stored once and never change, so new ones are appended; agents, sweeps and jobs
change, so their rows are replaced. A sync moves only what changed since the last one, and works
while the coordinator runs and from another host.

The mirror is a file in a temporary directory (removed on close, or when the process exits),
not an in-memory database:
DuckDB keeps it compressed on disk and holds in memory, within MEMORY_LIMIT, what the queries
touch, so a million runs do not live in the dashboard's memory. `derived` adds columns computed
once per row as it arrives (the labels the pages filter and group by) instead of at every query.
`after_sync` holds what is computed from the mirrored tables once a sync has added to them
(dashboard/after_sync.py: figures and counts a page would otherwise compute at its first render).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import duckdb

from specfleet.client import pages

TABLES = {
    "agents": "agent_id",
    "sweeps": "sweep_id",
    "jobs": "job_id",
    "runs": "run_id",
    "imported_results": "import_id",  # `specfleet import`: stored once, never changed
}
APPEND_ONLY = {"runs", "imported_results"}
# DuckDB's memory_limit for the mirror: what the queries may hold (sorts and joins spill beyond
# it to the mirror's temporary directory). SPECFLEET_MIRROR_MEMORY sets another (tests scale it
# down with their fleet's size).
MEMORY_LIMIT = os.environ.get("SPECFLEET_MIRROR_MEMORY", "256MB")


class Mirror:
    def __init__(
        self,
        admin,
        derived: dict[str, str] | None = None,
        summaries: dict[str, list[str]] | None = None,
        path: Path | str | None = None,
    ):
        """`derived`: per table, a SELECT list of extra columns computed from the table's own
        columns as rows arrive. `summaries`: per table, statements run on each page of new rows
        (registered as `_batch`) in its transaction: small tables kept up to date as rows
        arrive. `path`: the file (a temporary one by default)."""
        self.admin = admin
        self.derived = derived or {}
        self.summaries = summaries or {}
        self._tmp = None if path is not None else tempfile.mkdtemp(prefix="specfleet-mirror-")
        # A dashboard holds its mirror for the process's life and never closes it: the directory
        # goes at exit (or when the mirror is collected), not only on close().
        self._remove = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True) if self._tmp else None
        self.con = duckdb.connect(str(path or Path(self._tmp) / "mirror.duckdb"))
        self.con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        self.con.execute("CREATE TABLE IF NOT EXISTS _mirror (tbl VARCHAR PRIMARY KEY, last_seq BIGINT)")
        self._lock = threading.Lock()
        # Called with the tables' sequences at the end of every sync, outside the lock (they
        # read and write the mirror through query() and cursor()).
        self.after_sync: list[Callable[[dict[str, int]], None]] = []

    def sync(self) -> dict[str, int]:
        """Pull what changed since the last sync, one Export page at a time (a first sync of a
        million runs never holds them all in memory); return each table's highest sequence
        mirrored, which changes exactly when that table's data does. Each page is committed
        with its sequence: a sync cut short resumes where it stopped. Then every after_sync."""
        with self._lock:
            for table, key in TABLES.items():
                # fetchall: a half-read result would block register() below
                rows = self.con.execute("SELECT last_seq FROM _mirror WHERE tbl = ?", [table]).fetchall()
                for page, last in pages(self.admin, table, rows[0][0] if rows else 0):
                    self._add(table, key, page, last)
            seqs = {t: s for t, s in self.con.execute("SELECT tbl, last_seq FROM _mirror").fetchall()}
        for then in self.after_sync:
            then(seqs)
        return seqs

    def _add(self, table: str, key: str, page, last: int) -> None:
        extra = f", {self.derived[table]}" if table in self.derived else ""
        self.con.register("_batch", page)
        try:
            self.con.execute("BEGIN")
            self.con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT *{extra} FROM _batch LIMIT 0")
            if table not in APPEND_ONLY:
                self.con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM _batch)")
            self.con.execute(f"INSERT INTO {table} BY NAME SELECT *{extra} FROM _batch")
            for sql in self.summaries.get(table, ()):
                self.con.execute(sql)
            self.con.execute("INSERT OR REPLACE INTO _mirror VALUES (?, ?)", [table, last])
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            self.con.unregister("_batch")
        # Into the file now: under duckdb 1.5.5 a synced page otherwise stayed in memory after its
        # commit (87 MB of 100k runs, more than the 64 MB test limit, before any query ran), and
        # a checkpoint per page cost no measurable time (14.3 s against 13.8 s for 100k runs).
        try:
            self.con.execute("CHECKPOINT")
        except duckdb.TransactionException:  # another transaction in the way (DuckDB's docs): the next page's
            pass

    @contextlib.contextmanager
    def transaction(self):
        """The mirror's connection inside one transaction, holding the lock a sync holds while
        it adds pages: what is written here never interleaves with a page of a sync."""
        with self._lock:
            self.con.execute("BEGIN")
            try:
                yield self.con
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: list | dict | None = None):
        """A pandas DataFrame; an empty one when the table has not arrived yet."""
        with self._lock:
            try:
                return self.con.execute(sql, params or []).df()
            except duckdb.CatalogException:
                import pandas as pd

                return pd.DataFrame()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own on the mirror, for work that leaves temporary tables
        (dashboard/claims/); it sees what was synced when each statement starts."""
        with self._lock:
            return self.con.cursor()

    def close(self) -> None:
        with self._lock:
            self.con.close()
        if self._remove:
            self._remove()

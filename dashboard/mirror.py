"""The dashboard's own DuckDB, mirrored from the coordinator through its read path.

The coordinator stays the only writer of its file; the dashboard asks for rows whose ingest
sequence is above the last one it saw and upserts them locally. It works while the
coordinator runs and from another host.
"""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb

from coordinator.export import fetch_table

TABLES = {"agents": "agent_id", "sweeps": "sweep_id", "jobs": "job_id", "runs": "run_id"}


class Mirror:
    def __init__(self, admin, path: Path | str = ":memory:"):
        self.admin = admin
        self.con = duckdb.connect(str(path))
        self.con.execute("CREATE TABLE IF NOT EXISTS _mirror (tbl VARCHAR PRIMARY KEY, last_seq BIGINT)")
        self._lock = threading.Lock()

    def sync(self) -> int:
        """Pull what changed since the last sync; return the highest sequence mirrored, which
        changes exactly when the data does."""
        with self._lock:
            for table, key in TABLES.items():
                # fetchall: a half-read result would block register() below
                rows = self.con.execute("SELECT last_seq FROM _mirror WHERE tbl = ?", [table]).fetchall()
                batch, last = fetch_table(self.admin, table, rows[0][0] if rows else 0)
                if batch is None:
                    continue
                self.con.register("_batch", batch)
                try:
                    self.con.execute("BEGIN")
                    self.con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM _batch LIMIT 0")
                    self.con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM _batch)")
                    self.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
                    self.con.execute("INSERT OR REPLACE INTO _mirror VALUES (?, ?)", [table, last])
                    self.con.execute("COMMIT")
                finally:
                    self.con.unregister("_batch")
            return self.con.execute("SELECT coalesce(max(last_seq), 0) FROM _mirror").fetchone()[0]

    def query(self, sql: str, params: list | None = None):
        """A pandas DataFrame; an empty one when the table has not arrived yet."""
        with self._lock:
            try:
                return self.con.execute(sql, params or []).df()
            except duckdb.CatalogException:
                import pandas as pd

                return pd.DataFrame()

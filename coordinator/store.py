"""The coordinator's DuckDB file: opening it, numbered migrations, one writer.

The coordinator is the file's only writer. Writes go through `Store.tx()` (or `autocommit()`),
which serialise callers on one lock: DuckDB connections are not meant to be shared between
threads, and a single writer keeps every state change a plain transaction. Readers that must
not wait for writers (a /metrics scrape, an export) take `reader()`, a connection of their own.
Opening the file migrates it and brings the /metrics figure tables up to date
(coordinator/figures.py); afterwards `catch_up_figures` adds the runs stored since, when a
scrape is due.

A write that fails for the store's own reasons (disk full, a read-only file, an I/O error) is
no caller's fault: `tx()` and `autocommit()` raise it as StoreUnavailable (answered
UNAVAILABLE, so agents keep their runs and retry), and `refusing` says why until a write
succeeds again. Reads go on meanwhile.

With `lake` (coordinator/lake.py) the same tables live in a DuckLake with a PostgreSQL catalog that
several coordinators share: each transaction takes its sequence numbers from the lake's counter
row, `autocommit()` is a transaction too, and a transaction whose commit lost the catalog's race
to another coordinator raises StoreConflict, which `retrying` answers by running the caller's
whole unit of work again on the newer snapshot.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from importlib import resources
from pathlib import Path

import duckdb

from coordinator import convert, figures, lake

DB_FILENAME = "specfleet.duckdb"
log = logging.getLogger("specfleet.coordinator")


class StoreUnavailable(Exception):
    """The store refuses writes for its own reasons (disk full, read-only file, I/O error):
    nothing the caller sent is wrong, and the same write may succeed later."""


class StoreConflict(StoreUnavailable):
    """Another coordinator committed to the lake first: the whole transaction is to run again."""


CONFLICT_RETRIES = 20  # then StoreUnavailable, answered UNAVAILABLE: the caller retries later


def store_fault(e: BaseException) -> bool:
    """Whether a DuckDB error is the store's (its file or disk), not the statement's or the data's."""
    if isinstance(e, (duckdb.IOException, duckdb.FatalException, duckdb.PermissionException)):
        return True
    return isinstance(e, duckdb.TransactionException) and "Failed to commit" in str(e)


def migrations() -> list[tuple[int, str]]:
    """(version, sql) for every file in coordinator/migrations, in order."""
    found = []
    for entry in resources.files("coordinator.migrations").iterdir():
        name = entry.name
        if name.endswith(".sql"):
            found.append((int(name.split("_", 1)[0]), entry.read_text()))
    found.sort()
    versions = [v for v, _ in found]
    if len(set(versions)) != len(versions) or not versions or versions[0] < 1:
        raise RuntimeError(f"migrations must have distinct numbers from 1, found {versions}")
    return found


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'"
    ).fetchone()[0]
    if not exists:
        return 0
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0]


def migrate(con: duckdb.DuckDBPyConnection, dialect=lambda sql: sql) -> int:
    """Apply the migrations the file has not seen, in their numbers' order (numbers may have gaps:
    branches take numbers of their own); return the resulting version, the highest number.
    `dialect` rewrites each migration's SQL for the store (lake.dialect: no key constraints)."""
    con.execute(
        dialect("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE)")
    )
    current = schema_version(con)
    known = migrations()
    newest = known[-1][0]
    if current > newest:
        raise RuntimeError(
            f"database schema version {current} is newer than this specfleet ({newest}): upgrade specfleet"
        )
    applied = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
    for version, sql in known:
        if version in applied:
            continue
        con.execute("BEGIN")
        try:
            con.execute(dialect(sql))
            con.execute("INSERT INTO schema_migrations VALUES (?, ?)", [version, time.time()])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return newest


class DataDirUnusable(ValueError):
    """The data directory cannot hold the coordinator's database: one line naming it and why."""


def _read_only(path: Path) -> bool:
    """Whether `path`, or its nearest existing parent, is on a read-only file system."""
    for candidate in (path, *path.parents):
        try:
            return bool(os.statvfs(candidate).f_flag & os.ST_RDONLY)
        except OSError:
            continue
    return False


def unusable(data_dir: Path, e: BaseException) -> DataDirUnusable:
    """Why the coordinator cannot start on `data_dir`, from the error that stopped it."""
    path = data_dir / DB_FILENAME
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    where = f"cannot use {data_dir} as the coordinator's data directory"
    if _read_only(data_dir):
        why = "it is on a read-only file system (the database and admin.token are written there)"
    elif data_dir.exists() and not data_dir.is_dir():
        why = "it is a file, not a directory"
    elif "Conflicting lock" in text:
        pid = text.rsplit("(PID ", 1)[-1].split(")")[0] if "(PID " in text else "?"
        return DataDirUnusable(
            f"{where}: its database {path} is in use by process {pid}: is a coordinator already serving "
            "this --data-dir? Stop it, or choose another"
        )
    elif message := convert.foreign(path, e):  # another DuckDB's storage format
        return DataDirUnusable(f"{where}: {message}")
    elif "not a valid DuckDB database" in text:
        return DataDirUnusable(
            f"{where}: {path} is not a DuckDB database file; move it away or choose another --data-dir"
        )
    elif isinstance(e, OSError) and e.strerror:
        why = e.strerror.lower()
    else:
        why = text
    return DataDirUnusable(f"{where}: {why}; choose a writable --data-dir")


class Store:
    def __init__(self, data_dir: Path, lake_url: lake.LakeUrl | None = None):
        self.lake = lake_url
        self.unique_keys = lake_url is None  # whether the tables' keys refuse a duplicate row
        self.path = data_dir / DB_FILENAME if lake_url is None else lake_url.describe()
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self._con = duckdb.connect(str(self.path)) if lake_url is None else lake.connect(lake_url)
        except (OSError, duckdb.IOException, duckdb.PermissionException) as e:
            raise unusable(data_dir, e) from None
        self.lock = threading.RLock()  # held through a transaction; re-entrant for callers that wrap one
        self._depth = 0  # tx() nesting on this thread (under the lock): the outermost one commits
        try:
            if lake_url is None:
                migrate(self._con)
                figures.ensure(self._con)
                # The schema's changes into the file, out of the WAL: duckdb 1.5.5 cannot replay a
                # logged ALTER ... SET DEFAULT of a function (it binds it with no default database,
                # duckdb#19712/#22044), so a kill -9 before the WAL's own checkpoint left a store
                # no coordinator could open (tests/test_kill_drill.py).
                self._con.execute("CHECKPOINT")
            else:
                self.retrying(self._open_lake)
        except duckdb.Error as e:
            self._con.close()
            if store_fault(e):  # a full disk, an I/O error: the directory's, not the code's
                raise unusable(data_dir, e) from None
            raise
        self._readers = self._con.cursor()  # what reader() opens cursors from, never used for queries
        self._readers_lock = threading.Lock()
        self.refusing = ""  # why the store refuses writes now; "" while they succeed

    def fault(self, e: BaseException) -> StoreUnavailable:
        """Note that writes fail for the store's reasons (logged once, until one succeeds)."""
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not self.refusing:
            log.error("the store refuses writes: %s; runs stay pending on the agents until it takes them", why)
        self.refusing = why
        return StoreUnavailable(f"the coordinator's store refuses writes ({why}); retry later")

    def wrote(self) -> None:
        """Told by a writer whose write committed (ingest, heartbeats; a read-only transaction
        commits on a full disk too): a store that refused writes takes them again."""
        if self.refusing:
            log.warning("the store takes writes again (it refused them: %s)", self.refusing)
            self.refusing = ""

    def _open_lake(self) -> None:
        """Migrate the lake and bring its figure tables up to date: both transactions of their
        own, which a coordinator starting beside another may lose (StoreConflict: run again)."""
        # A migration that takes sequence numbers (002 copies runs) binds nextval('ingest_seq'):
        # the lake's stand-in, from the counter row once migration 001 made it.
        self._con.execute("CREATE OR REPLACE TEMP SEQUENCE ingest_seq START 1")
        try:
            migrate(self._con, lake.dialect)
            figures.ensure(self._con)
        except duckdb.TransactionException as e:
            if lake.conflict(e):
                raise StoreConflict(str(e)) from e
            raise

    def retrying(self, fn, *args):
        """fn(*args), run again while it raises StoreConflict (a lake transaction that lost the
        race to another coordinator's commit), with a short random pause; StoreUnavailable after
        CONFLICT_RETRIES. On the file store nothing conflicts: one call."""
        for attempt in range(CONFLICT_RETRIES):
            try:
                return fn(*args)
            except StoreConflict:
                time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
        raise StoreUnavailable(f"the lake's catalog refused {CONFLICT_RETRIES} commits in a row to other coordinators")

    @contextlib.contextmanager
    def tx(self):
        """A transaction on the single connection; commits on success, rolls back on error.
        StoreUnavailable when the store's file or disk fails it; StoreConflict when another
        coordinator committed first (lake). A tx() inside another joins it."""
        with self.lock:
            if self._depth:
                yield self._con
                return
            self._depth += 1
            try:
                self._con.execute("BEGIN")
                try:
                    if self.lake is not None:
                        self._take_counter()
                    yield self._con
                    if self.lake is not None:
                        self._give_counter()
                except BaseException:
                    with contextlib.suppress(duckdb.Error):  # a failed commit leaves none to roll back
                        self._con.execute("ROLLBACK")
                    raise
                self._con.execute("COMMIT")
            except duckdb.Error as e:
                if lake.conflict(e):
                    raise StoreConflict(f"another coordinator committed first ({str(e).splitlines()[0]})") from e
                if store_fault(e):
                    raise self.fault(e) from e
                raise
            finally:
                self._depth -= 1

    def _take_counter(self) -> None:
        """The lake's ingest_seq: a temporary sequence starting after the counter row's value."""
        value = self._con.execute(f"SELECT value FROM {lake.COUNTER_TABLE}").fetchone()[0]
        self._con.execute(f"CREATE OR REPLACE TEMP SEQUENCE ingest_seq START {int(value) + 1}")

    def _give_counter(self) -> None:
        """The counter row moved past the numbers this transaction took, if it took any."""
        (used,) = self._con.execute(
            "SELECT last_value FROM duckdb_sequences() WHERE sequence_name = 'ingest_seq' AND temporary"
        ).fetchone()
        if used is not None:
            self._con.execute(f"UPDATE {lake.COUNTER_TABLE} SET value = ?", [used])

    @contextlib.contextmanager
    def autocommit(self):
        """The connection with no transaction around it: each statement commits on its own.
        For writers whose statements need not stand or fall together: it saves the BEGIN and
        COMMIT round trips, each a release and re-acquisition of the GIL. StoreUnavailable as
        for tx(). On the lake it is a transaction: its statements take sequence numbers from
        the counter row, which only a transaction keeps consistent across coordinators."""
        if self.lake is not None:
            with self.tx() as con:
                yield con
            return
        with self.lock:
            try:
                yield self._con
            except duckdb.Error as e:
                if store_fault(e):
                    raise self.fault(e) from e
                raise

    def catch_up_figures(self) -> None:
        """Add the runs stored since the figure tables' last update to them, in one transaction
        (figures.catch_up). Should it fail, the runs stay stored and the figures lag until the
        next call (or the next start rebuilds them)."""
        try:
            self.retrying(self._catch_up)
        except (duckdb.Error, StoreUnavailable):
            log.exception("the /metrics figures could not catch up with the stored runs")

    def _catch_up(self) -> None:
        with self.tx() as con:
            figures.catch_up(con)

    @contextlib.contextmanager
    def reader(self):
        """A connection of its own on the same file, for reading while writers go on: it sees
        what was committed when each statement started and never takes the writers' lock (a
        /metrics scrape, an export page)."""
        with self._readers_lock:
            con = self._readers.cursor()
        if self.lake is not None:
            con.execute("USE lake")
        try:
            yield con
        finally:
            con.close()

    def close(self) -> None:
        with self.lock:
            self._readers.close()
            self._con.close()


class DatabaseInUse(ValueError):
    """The file is locked by a running coordinator."""


def open_readonly(data_dir: Path) -> duckdb.DuckDBPyConnection:
    """Open a stopped coordinator's file for reading (export, inspection)."""
    path = data_dir / DB_FILENAME
    if not path.exists():
        raise FileNotFoundError(f"no coordinator database at {path}")
    try:
        return duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as e:
        if message := convert.foreign(path, e):
            raise DataDirUnusable(message) from None
        raise DatabaseInUse(
            f"cannot open {path} for reading ({str(e).splitlines()[0]}): is the coordinator still running? "
            "Export through it instead (without --stopped)"
        ) from None


def placeholders(values: list) -> str:
    """`(?, ?, ...)` for `col IN (...)`: DuckDB answers a list of constants from the column's
    index, where `IN (SELECT unnest(?))` scans the whole table."""
    return "(" + ", ".join("?" * len(values)) + ")"


def next_seq(con: duckdb.DuckDBPyConnection) -> int:
    return con.execute("SELECT nextval('ingest_seq')").fetchone()[0]

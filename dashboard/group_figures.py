"""The Compare page's costly figures of each comparable group it shows, computed once and kept in
the mirror, kept current after each sync, and read by the page as computed.

What cost the page seconds at a million runs is computation on the chosen group's runs
(docs/scale.md): the MixedLM fits of the chip apart from the unit, the decode speed's
bootstrap, the speedups. They depend on the group's runs and those runs' jobs alone, so:

- As each page of runs arrives (SUMMARIES, in the page's transaction), the groups of its
  generation runs (no figure here reads a verify-cost run) are marked due in
  `group_figures_due`, and `group_jobs` keeps which jobs each group's runs are of; a page of
  jobs marks due the groups of its jobs' runs (an attempt replaced, a job failed: its runs no
  longer count). A mark is a number from a sequence, new at every mark.
- The groups kept are the one the page opens on (most runs) and every group a page has shown.
  After a sync (dashboard/after_sync.py), `refresh` computes each due kept group's FIGURES with
  the queries the page runs on the whole group (dashboard/queries.py on
  Filters(comparable=group)), stores each frame as Arrow IPC in `group_figures`, and clears the
  group's mark unless a sync marked it again meanwhile. A group refreshed less than
  REFIT_SECONDS ago waits, still due: a fleet that keeps adding runs to a group costs a refit of
  it every REFIT_SECONDS, not one a sync. The other groups cost nothing until shown: fitting all
  108 of a fleet doubled the first sync at a million runs (docs/scale.md).
- `read` gives a figure of a group as stored when the group is not due; else the page's
  computation of the whole group's FIGURES, stored, so that the group is kept from then on.
  Filters narrower than a whole group (a method, a model) are computed by the page itself.

tests/test_group_figures.py checks each figure equal to the page's own computation after syncs
that add late runs to groups already computed and replace an attempt.
"""

from __future__ import annotations

import logging
import time

import pandas as pd
import pyarrow as pa

from dashboard import queries
from dashboard.mirror import Mirror
from specfleet.client import arrow_from_ipc
from specfleet.record import VERIFY_COST

log = logging.getLogger(__name__)
REFIT_SECONDS = 30.0
NAMES = ("speedups", "decode_speed", "chip_components", "chip_levels", "chip_pairs")

_MARK = "nextval('group_figures_marks')"
_TABLES = [
    "CREATE SEQUENCE IF NOT EXISTS group_figures_marks",
    "CREATE TABLE IF NOT EXISTS group_figures_due (comparable VARCHAR PRIMARY KEY, mark BIGINT)",
    "CREATE TABLE IF NOT EXISTS group_jobs (job_id VARCHAR, comparable VARCHAR, PRIMARY KEY (job_id, comparable))",
    "CREATE TABLE IF NOT EXISTS group_figures (comparable VARCHAR, figure VARCHAR, frame BLOB, computed_at DOUBLE,"
    " PRIMARY KEY (comparable, figure))",
]
SUMMARIES = {
    "runs": [
        *_TABLES,
        "INSERT OR IGNORE INTO group_jobs SELECT DISTINCT job_id, comparable FROM runs"
        f" WHERE seq >= (SELECT min(seq) FROM _batch) AND method != '{VERIFY_COST}'",
        f"INSERT OR REPLACE INTO group_figures_due SELECT comparable, {_MARK} FROM (SELECT DISTINCT comparable"
        f" FROM runs WHERE seq >= (SELECT min(seq) FROM _batch) AND method != '{VERIFY_COST}')",
    ],
    "jobs": [
        *_TABLES,
        f"INSERT OR REPLACE INTO group_figures_due SELECT comparable, {_MARK} FROM (SELECT DISTINCT comparable"
        " FROM group_jobs WHERE job_id IN (SELECT job_id FROM _batch))",
    ],
}


def attach(mirror: Mirror) -> None:
    """Have `mirror` mark due, as pages arrive, the groups whose figures change (SUMMARIES);
    before its first sync, so that every group it mirrors is marked."""
    for table, statements in SUMMARIES.items():
        mirror.summaries.setdefault(table, []).extend(statements)


def figures(db, comparable: str) -> dict[str, pd.DataFrame]:
    """NAMES' frames of one whole group: what the Compare page computes for it."""
    f = queries.Filters(comparable=comparable)
    values = queries.unit_values(db, f)
    table = queries.chip_components(db, f, values)
    return {
        "speedups": queries.speedups(db, f),
        "decode_speed": queries.decode_speed(db, f),
        "chip_components": table,
        "chip_levels": queries.chip_levels(db, f, values),
        "chip_pairs": queries.chip_pairs(db, f, values, table),
    }


def _ipc(frame: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def refresh(mirror: Mirror, seqs: dict[str, int] | None = None) -> int:
    """Compute and store the figures of every due group that is kept (the module docstring) and
    was not refreshed in the last REFIT_SECONDS; the number of groups refreshed. `seqs`
    (after_sync's argument) is not needed: the marks say what changed."""
    due = mirror.query(
        "SELECT d.comparable, d.mark, coalesce(max(f.computed_at), -1) AS computed_at FROM group_figures_due d"
        " LEFT JOIN group_figures f USING (comparable) GROUP BY d.comparable, d.mark ORDER BY d.comparable"
    )
    if due.empty:
        return 0
    shown = queries.groups(mirror, queries.Filters())
    opens_on = shown["comparable"].iloc[0] if len(shown) else None
    now = time.time()
    kept = [
        (g, mark)
        for g, mark, at in due.itertuples(index=False)
        if (g == opens_on or at >= 0) and now - at >= REFIT_SECONDS
    ]
    return sum(_store(mirror, g, mark, figures(mirror, g)) for g, mark in kept)


def _store(mirror: Mirror, comparable: str, mark: int | None, frames: dict[str, pd.DataFrame]) -> int:
    """Store one group's frames and clear its mark (None: it had none), unless a sync marked it
    again while they were computed (then they wait for a later refresh); 1 when stored."""
    blobs = {name: _ipc(frame) for name, frame in frames.items()}
    with mirror.transaction() as con:
        row = con.execute("SELECT mark FROM group_figures_due WHERE comparable = ?", [comparable]).fetchone()
        if (row[0] if row else None) != mark:
            return 0
        stamp = time.time()
        con.executemany(
            "INSERT OR REPLACE INTO group_figures VALUES (?, ?, ?, ?)",
            [(comparable, name, blob, stamp) for name, blob in blobs.items()],
        )
        con.execute("DELETE FROM group_figures_due WHERE comparable = ?", [comparable])
    return 1


def _current(db, comparable: str, name: str) -> tuple[int | None, bytes | None] | None:
    """The group's mark (None when not due) and figure `name` as stored (None when never); None
    when `db` is not a mirror that keeps figures (attach was not called)."""
    if not isinstance(db, Mirror) or not comparable:
        return None
    rows = db.query(
        "SELECT (SELECT mark FROM group_figures_due WHERE comparable = $g) AS mark,"
        " (SELECT frame FROM group_figures WHERE comparable = $g AND figure = $name) AS frame",
        {"g": comparable, "name": name},
    )
    if rows.empty:
        return None
    mark, frame = rows.iloc[0]
    return (None if pd.isna(mark) else int(mark)), (frame if isinstance(frame, bytes | bytearray) else None)


def _frame(current: tuple[int | None, bytes | None] | None) -> pd.DataFrame | None:
    """The stored frame of `_current`'s answer when the group is not due, else None."""
    if current is None or current[0] is not None or current[1] is None:
        return None
    return arrow_from_ipc(current[1]).to_pandas()


def stored(db, comparable: str, name: str) -> pd.DataFrame | None:
    """Figure `name` of group `comparable` as stored, or None when there is none or the group is
    due (its runs or jobs changed since) or the database is not a mirror that keeps figures."""
    return _frame(_current(db, comparable, name))


def read(db, comparable: str, name: str) -> pd.DataFrame | None:
    """Figure `name` of group `comparable`: as stored when current, else the whole group's
    FIGURES computed now and stored (the group is kept from then on); None on a database that is
    not a mirror that keeps figures, or when the computation fails (logged: the caller's own
    query then raises where it should)."""
    current = _current(db, comparable, name)
    kept = _frame(current)
    if current is None or kept is not None:
        return kept
    try:
        frames = figures(db, comparable)
    except Exception:
        log.exception("the figures of group %s failed: the page computes each itself", comparable)
        return None
    _store(db, comparable, current[0], frames)
    return frames[name]

"""The Compare page's costly figures of each comparable group, computed after a sync for the
groups whose runs or jobs it changed, kept in the mirror, and read by the page as computed.

What cost the page seconds at a million runs is computation on the chosen group's runs
(docs/scale.md): the MixedLM fits of the chip apart from the unit, the decode speed's
bootstrap, the speedups. They depend on the group's runs and those runs' jobs alone, so:

- As each page of runs arrives (SUMMARIES, in the page's transaction), the groups of its
  generation runs (no figure here reads a verify-cost run) are marked due in
  `group_figures_due`, and `group_jobs` keeps which jobs each group's runs are of; a page of
  jobs marks due the groups of its jobs' runs (an attempt replaced, a job failed: its runs no
  longer count). A mark is a number from a sequence, new at every mark.
- After the sync (dashboard/after_sync.py), `refresh` computes each due group's FIGURES with the
  queries the page runs on the whole group (dashboard/queries.py on Filters(comparable=group)),
  stores each frame as Arrow IPC in `group_figures`, and clears the group's mark unless a sync
  marked it again meanwhile. A group refreshed less than REFIT_SECONDS ago waits, still due: a
  fleet that keeps adding runs to a group costs a refit of it every REFIT_SECONDS, not one a sync.
- `read` gives a figure of a group that is not due, else None: the page then computes it itself,
  as it does for filters narrower than a whole group (a method, a model).

tests/test_group_figures.py checks each figure equal to the page's own computation after syncs
that add late runs to groups already computed and replace an attempt.
"""

from __future__ import annotations

import time

import pandas as pd
import pyarrow as pa

from dashboard import queries
from dashboard.mirror import Mirror
from specfleet.client import arrow_from_ipc
from specfleet.record import VERIFY_COST

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
    """Compute and store the figures of every due group not refreshed in the last REFIT_SECONDS,
    the groups with most runs first (the page opens on the one with most); the groups
    refreshed. `seqs` (after_sync's argument) is not needed: the marks say what changed."""
    due = mirror.query(
        "SELECT d.comparable, d.mark, coalesce(max(f.computed_at), 0) AS computed_at FROM group_figures_due d"
        " LEFT JOIN group_figures f USING (comparable) LEFT JOIN (SELECT comparable, sum(n) AS n FROM group_cells"
        " GROUP BY ALL) c USING (comparable) GROUP BY d.comparable, d.mark, c.n ORDER BY c.n DESC NULLS LAST,"
        " d.comparable"
    )
    due = [(g, mark) for g, mark, at in due.itertuples(index=False) if time.time() - at >= REFIT_SECONDS]
    return sum(_store(mirror, g, mark, figures(mirror, g)) for g, mark in due)


def _store(mirror: Mirror, comparable: str, mark: int, frames: dict[str, pd.DataFrame]) -> int:
    """Store one group's frames and clear its mark, unless a sync marked it again while they were
    computed (then they wait for a later refresh); 1 when stored."""
    blobs = {name: _ipc(frame) for name, frame in frames.items()}
    with mirror.transaction() as con:
        row = con.execute("SELECT mark FROM group_figures_due WHERE comparable = ?", [comparable]).fetchone()
        if row is None or row[0] != mark:
            return 0
        stamp = time.time()
        con.executemany(
            "INSERT OR REPLACE INTO group_figures VALUES (?, ?, ?, ?)",
            [(comparable, name, blob, stamp) for name, blob in blobs.items()],
        )
        con.execute("DELETE FROM group_figures_due WHERE comparable = ?", [comparable])
    return 1


def read(db, comparable: str, name: str) -> pd.DataFrame | None:
    """Figure `name` of group `comparable` as refresh stored it, or None when there is none or
    the group is due (its runs or jobs changed since): the caller computes it then."""
    if not isinstance(db, Mirror) or not comparable:
        return None
    rows = db.query(
        "SELECT frame FROM group_figures f WHERE comparable = $g AND figure = $name"
        " AND NOT EXISTS (SELECT 1 FROM group_figures_due d WHERE d.comparable = $g)",
        {"g": comparable, "name": name},
    )
    return None if rows.empty else arrow_from_ipc(rows["frame"].iloc[0]).to_pandas()

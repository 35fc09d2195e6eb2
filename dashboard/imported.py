"""Results imported with `specfleet import` (llama-bench, `mtplx bench run`, `mtplx tune`), for
the Imported page: read from the mirror's copy of the coordinator's `imported_results` table.

Imported figures are shown beside the fleet's, each marked imported and unpaired, and are never
pooled: nothing here feeds specfleet/speedup.py, a verdict or a metric, and no query joins them
with `runs`. `beside` puts the two in one table only for reading side by side: one row per
imported figure, one row per fleet group (the median decode speed of its runs), each with its
source.
"""

from __future__ import annotations

import pandas as pd

from dashboard import data
from dashboard.mirror import Mirror

IMPORTED = "imported, unpaired"
FLEET = "fleet, median of its runs"


def rows(mirror: Mirror, tool: str | None = None) -> pd.DataFrame:
    """Every imported figure with its provenance, oldest import first; of one tool if given."""
    where, params = ("WHERE tool = ?", [tool]) if tool else ("", [])
    return mirror.query(
        "SELECT tool, tool_version, model, test, method, draft_depth, tokens_per_second,"
        " tokens_per_second_stddev, acceptance_by_depth, quality_gates, machine, machine_note, measured_at,"
        " source_file, source_line, source_sha256, imported_by, imported_by_user,"
        " to_timestamp(imported_at) AS imported_at"
        f" FROM imported_results {where} ORDER BY seq",
        params,
    )


def beside(mirror: Mirror) -> pd.DataFrame:
    """Imported figures and the fleet's, one table, each row with its source and never combined."""
    imported = mirror.query(
        f"SELECT '{IMPORTED}' AS source, coalesce(nullif(machine_note, ''), machine) AS machine, tool AS system,"
        " model, method, draft_depth AS depth, test, tokens_per_second, 1 AS figures FROM imported_results"
    )
    fleet = mirror.query(
        f"SELECT '{FLEET}' AS source, chip AS machine, engine AS system, target_reference AS model, method, depth,"
        " 'decode' AS test, median(decode_tokens_per_second) AS tokens_per_second, count(*) AS figures"
        " FROM runs WHERE decode_tokens_per_second > 0 GROUP BY ALL"
    )
    frames = [f for f in (imported, fleet) if not f.empty]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).sort_values(["model", "machine", "source"], ignore_index=True)


@data.cached_on("imported_results")
def imported_results(v: data.Version, tool: str | None = None) -> pd.DataFrame:
    return rows(data.mirror(v.address, v.token), tool)


@data.cached_on("imported_results", "runs")
def side_by_side(v: data.Version) -> pd.DataFrame:
    return beside(data.mirror(v.address, v.token))

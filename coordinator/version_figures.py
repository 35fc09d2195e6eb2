"""/metrics series per change between versions of an engine or system: what
specfleet/versions.py computes (the dashboard's Versions page), from the coordinator's runs.

`changes(con)` reads, per setting measured under two or more versions, the per-prompt rows
specfleet/versions.py takes (the same setting id and version label: versions.SETTING_SQL and
VERSION_SQL; the same runs: the job's current attempt, nominal or unknown, never lossy, a speed
above 0) and returns versions.changes() of them: per setting, chip, figure, arm and change of
version, the ratio new / old with its interval and the change called (regression, gain,
unchanged, inconclusive) at versions.TOLERANCE after the false-discovery step.

Cost. Which settings hold two versions is read from coordinator/figures.py's figure_groups (one
row per comparable group, kept at ingest): with none, nothing else is read. Otherwise the runs of
those settings' target models are aggregated in DuckDB (one row per machine, prompt and arm)
and the ratios computed on that. coordinator/metrics.py recomputes the result families only
when runs or jobs changed, at most every RESULTS_EVERY_SECONDS.

`families(changes)` formats them:

- specfleet_version_change_ratio{setting, chip, engine, model, figure, method, depth,
  old_version, new_version}: new / old; `_low` and `_high` its 95% interval.
- specfleet_version_change (same labels): -1 a regression, 1 a gain, 0 unchanged, NaN
  inconclusive (too few machines or prompts, or an interval across the tolerance).
- specfleet_version_regressions / specfleet_version_gains{setting, chip, engine, model,
  old_version, new_version}: the figures and arms regressed (gained) by that change.

Labels are bounded by settings, chips, arms and versions measured; never run or job ids.
"""

from __future__ import annotations

import math

import duckdb
import pandas as pd
from prometheus_client.core import GaugeMetricFamily

from specfleet import speedup, versions
from specfleet.record import VERIFY_COST

FIGURE_LABELS = {
    versions.DECODE: "decode_tokens_per_second",
    versions.SPEEDUP: "speedup",
    versions.ACCEPTANCE: "acceptance",
}
LABELS = ["setting", "chip", "engine", "model", "figure", "method", "depth", "old_version", "new_version"]
CHANGE_LABELS = ["setting", "chip", "engine", "model", "old_version", "new_version"]
DIRECTION = {versions.REGRESSION: -1.0, versions.GAIN: 1.0, versions.UNCHANGED: 0.0}

_SETTINGS = (
    f"SELECT {versions.SETTING_SQL} AS setting, list(DISTINCT target_digest) AS digests FROM figure_groups"
    f" GROUP BY setting HAVING count(DISTINCT {versions.VERSION_SQL}) >= 2"
)
_PER_PROMPT = (
    f"SELECT * FROM (SELECT {versions.SETTING_SQL} AS setting, {versions.VERSION_SQL} AS version, chip, method,"
    " depth, machine_id, prompt_id, avg(ln(decode_tokens_per_second)) AS log_tps,"
    f" {versions.ACCEPTANCE_SQL}, count(*) AS repeats,"
    " min(seq) AS first_seq, any_value(engine) AS engine, any_value(target_reference) AS model"
    f" FROM {speedup.valid_sql('runs')} WHERE list_contains($digests, target_digest)"
    f" AND method != '{VERIFY_COST}' AND decode_tokens_per_second > 0 AND env_nominal IS DISTINCT FROM false"
    " AND lossless IS DISTINCT FROM false GROUP BY setting, version, chip, method, depth, machine_id, prompt_id)"
    " WHERE list_contains($settings, setting)"
)


def per_prompt(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """specfleet/versions.py's per-prompt rows of every setting measured under two or more
    versions (none read when figure_groups holds no such setting)."""
    try:
        settings = con.execute(_SETTINGS).df()
    except duckdb.CatalogException:  # figures not built yet
        return pd.DataFrame()
    if settings.empty:
        return pd.DataFrame()
    digests = sorted({d for ds in settings["digests"] for d in ds})
    return con.execute(_PER_PROMPT, {"digests": digests, "settings": list(settings["setting"])}).df()


def changes(con: duckdb.DuckDBPyConnection, tolerance: float = versions.TOLERANCE) -> pd.DataFrame:
    """versions.changes() of every setting measured under two or more versions, with the
    engine and model (target reference) that name it."""
    rows = per_prompt(con)
    if rows.empty:
        return pd.DataFrame(columns=[*versions.COLUMNS, "engine", "model"])
    names = rows.groupby("setting", as_index=False)[["engine", "model"]].first()
    return versions.changes(rows, tolerance).merge(names, on="setting", how="left")


def _labels(r) -> list[str]:
    figure = FIGURE_LABELS.get(r.figure, r.figure)
    return [r.setting, r.chip, r.engine, r.model, figure, r.method, str(r.depth), r.old, r.new]


def families(rows: pd.DataFrame):
    """The metric families of changes()' rows (module docstring)."""
    ratio = GaugeMetricFamily(
        "specfleet_version_change_ratio",
        "A figure new version / old version per setting, chip and arm, paired by machine (specfleet/versions.py)",
        labels=LABELS,
    )
    low = GaugeMetricFamily(
        "specfleet_version_change_ratio_low", "Lower end of the ratio's 95% interval", labels=LABELS
    )
    high = GaugeMetricFamily(
        "specfleet_version_change_ratio_high", "Upper end of the ratio's 95% interval", labels=LABELS
    )
    called = GaugeMetricFamily(
        "specfleet_version_change",
        f"-1 a regression, 1 a gain, 0 unchanged (the interval beyond or inside ±{versions.TOLERANCE:.0%},"
        " after the false-discovery step), NaN inconclusive",
        labels=LABELS,
    )
    for r in rows.itertuples():
        labels = _labels(r)
        ratio.add_metric(labels, r.ratio)
        low.add_metric(labels, r.ci_low)
        high.add_metric(labels, r.ci_high)
        called.add_metric(labels, DIRECTION.get(r.change, math.nan))
    yield from (ratio, low, high, called)
    for change, name in ((versions.REGRESSION, "regressions"), (versions.GAIN, "gains")):
        family = GaugeMetricFamily(
            f"specfleet_version_{name}",
            f"Figures and arms called a {change} per setting, chip and change of version",
            labels=CHANGE_LABELS,
        )
        if not rows.empty:
            counts = (
                rows.assign(hit=rows["change"] == change)
                .groupby(["setting", "chip", "engine", "model", "old", "new"], as_index=False)["hit"]
                .sum()
            )
            for r in counts.itertuples():
                family.add_metric([r.setting, r.chip, r.engine, r.model, r.old, r.new], int(r.hit))
        yield family

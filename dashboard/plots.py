"""Altair charts for the pages. Every chart colours chips through `chip_colour`, one mapping
built from every chip the fleet has seen, so a chip keeps its colour on every chart."""

from __future__ import annotations

import altair as alt
import pandas as pd

# Tableau 10, then 10 more: distinct, colour-blind-friendlier than the defaults.
PALETTE = (
    "#4e79a7 #f28e2b #e15759 #76b7b2 #59a14f #edc948 #b07aa1 #ff9da7 #9c755f #bab0ac "
    "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf"
).split()


def chip_colours(chips: list[str]) -> dict[str, str]:
    """chip -> colour for the fleet's sorted chip list (stable while the fleet keeps its chips)."""
    return {chip: PALETTE[i % len(PALETTE)] for i, chip in enumerate(sorted(chips))}


def tips(*fields) -> list[alt.Tooltip]:
    """Tooltip channels: a field name becomes alt.Tooltip(name). Channel objects, never shorthand
    strings, throughout: altair resolves a string against its whole schema (several ms each,
    a quarter of the Compare page's drawing), an object it takes as it is."""
    return [alt.Tooltip(f) if isinstance(f, str) else f for f in fields]


def chip_colour(chips: list[str], title: str = "chip") -> alt.Color:
    mapping = chip_colours(chips)
    return alt.Color("chip:N", title=title, scale=alt.Scale(domain=list(mapping), range=list(mapping.values())))


def speedup_vs_depth(df: pd.DataFrame, chips: list[str]) -> alt.Chart:
    """One line per chip and method, its 95% band, and the interval at every measured depth."""
    df = df.dropna(subset=["speedup"])  # a figure whose every pair was left out
    base = alt.Chart(df).encode(
        x=alt.X("depth:Q", title="draft depth K (tokens)", axis=alt.Axis(tickMinStep=1, format="d")),
        color=chip_colour(chips),
        detail=alt.Detail("method:N"),
    )
    band = base.mark_area(opacity=0.15).encode(
        y=alt.Y("ci_low:Q", title="speedup over baseline (×)"), y2=alt.Y2("ci_high:Q")
    )
    interval = base.mark_rule(strokeWidth=2, opacity=0.6).encode(y=alt.Y("ci_low:Q"), y2=alt.Y2("ci_high:Q"))
    tooltip = tips(
        "chip",
        "engine",
        "method",
        "depth",
        alt.Tooltip("speedup:Q", format=".3f"),
        alt.Tooltip("ci_low:Q", format=".3f"),
        alt.Tooltip("ci_high:Q", format=".3f"),
        "machines",
        "prompts",
        "pairs",
    )
    line = base.mark_line(point=True).encode(
        y=alt.Y("speedup:Q"), strokeDash=alt.StrokeDash("method:N", title="method"), tooltip=tooltip
    )
    even = alt.Chart().mark_rule(strokeDash=[4, 4], color="grey").encode(y=alt.datum(1.0))
    return (
        alt.layer(band, interval, line, even, data=df)
        .properties(width=320, height=260)
        .facet(column=alt.Column("engine:N", title="engine"))
    )


def decode_speed(df: pd.DataFrame, chips: list[str]) -> alt.Chart:
    df = df.assign(label=df["engine"] + " · " + df["arm"])
    return (
        alt.Chart(df)
        .mark_bar()
        .encode(
            x=alt.X("label:N", title=None, axis=alt.Axis(labelAngle=-30, labelLimit=240, labelOverlap=False)),
            xOffset=alt.XOffset("chip:N"),
            y=alt.Y("median:Q", title="decode tokens/s (median)"),
            color=chip_colour(chips),
            tooltip=tips("chip", "engine", "arm", alt.Tooltip("median:Q", format=".1f"), "machines", "prompts", "runs"),
        )
        .properties(height=280)
    )


def acceptance_by_position(df: pd.DataFrame, chips: list[str]) -> alt.Chart:
    df = df.assign(arm=df["engine"] + " · " + df["method"] + " K=" + df["depth"].astype(str))
    return (
        alt.Chart(df)
        .mark_line(point=True)
        .encode(
            x=alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("acceptance:Q", title="acceptance rate (0-1)", scale=alt.Scale(domain=[0, 1])),
            color=chip_colour(chips),
            strokeDash=alt.StrokeDash("arm:N", title="arm"),
            tooltip=tips(
                "chip",
                "arm",
                "position",
                alt.Tooltip("acceptance:Q", format=".2f"),
                "machines",
                "prompts",
                "runs",
            ),
        )
        .properties(width=560, height=260)
    )


def draft_verify(df: pd.DataFrame, chips: list[str]) -> alt.Chart:
    return (
        alt.Chart(df)
        .mark_bar()
        .encode(
            y=alt.Y("arm:N", title=None, axis=alt.Axis(labelLimit=300)),
            yOffset=alt.YOffset("chip:N"),
            x=alt.X("ms:Q", title="milliseconds per generated token (median)", stack="zero"),
            color=chip_colour(chips),
            opacity=alt.Opacity("phase:N", title="phase", scale=alt.Scale(domain=["draft", "verify"], range=[0.45, 1])),
            tooltip=tips("chip", "arm", "phase", alt.Tooltip("ms:Q", format=".3f"), "machines", "prompts", "runs"),
        )
        .properties(width=560)
    )


def verify_cost(df: pd.DataFrame, chips: list[str]) -> alt.Chart:
    df = df.assign(series=df["engine"] + " · " + df["context_tokens"].astype(str) + " tokens of context")
    return (
        alt.Chart(df)
        .mark_line(point=True)
        .encode(
            x=alt.X("rows:O", title="query rows M", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("ratio:Q", title="T(M) / T(1)"),
            color=chip_colour(chips),
            strokeDash=alt.StrokeDash("series:N", title="engine · context"),
            tooltip=tips("chip", "engine", "context_tokens", "rows", alt.Tooltip("ratio:Q", format=".2f"), "machines"),
        )
        .properties(width=560, height=260)
    )


def roofline(df: pd.DataFrame, chips: list[str]) -> alt.Chart:
    df = df.dropna(subset=["share"]).assign(percent=lambda d: d["share"] * 100)
    return (
        alt.Chart(df)
        .mark_bar()
        .encode(
            y=alt.Y("model:N", title=None),
            yOffset=alt.YOffset("chip:N"),
            x=alt.X("percent:Q", title="share of the memory-bandwidth roofline (%)", scale=alt.Scale(domain=[0, 100])),
            color=chip_colour(chips),
            tooltip=tips(
                "chip", "engine", "model", alt.Tooltip("percent:Q", format=".1f"), "machines", "prompts", "runs"
            ),
        )
        .properties(width=560)
    )


def version_changes(frame: pd.DataFrame, chips: list[str]) -> alt.Chart:
    """Ratio new / old version per chip, figure and arm with its 95% interval, against the
    tolerance band (shaded); a point's shape says the change called."""
    frame = frame.assign(
        arm=frame["method"] + frame["depth"].map(lambda d: f" K={d}" if d > 0 else ""),
        what=frame["figure"] + " · " + frame["method"] + frame["depth"].map(lambda d: f" K={d}" if d > 0 else ""),
        change_of=frame["old"] + " → " + frame["new"],
    )
    colour = chip_colour(chips)
    base = alt.Chart(frame).encode(
        y=alt.Y("what:N", title=None),
        yOffset=alt.YOffset("chip:N"),
        color=colour,
        tooltip=tips("chip", "change_of", "figure", "arm", "ratio", "ci_low", "ci_high", "change", "machines", "how"),
    )
    rules = base.mark_rule().encode(
        x=alt.X("ci_low:Q", title="new / old", scale=alt.Scale(zero=False)), x2=alt.X2("ci_high:Q")
    )
    points = base.mark_point(filled=True, size=60).encode(
        x=alt.X("ratio:Q"), shape=alt.Shape("change:N", title="change")
    )
    one = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(x=alt.X("x:Q"))
    return (one + rules + points).properties(width=600)

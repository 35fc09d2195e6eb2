"""`specfleet report`: one sweep's results as Markdown with PNG plots beside it (ready to paste
into a GitHub issue), or as one self-contained HTML file with the plots inline.

Every figure is the dashboard's: the report opens a mirror of its own (dashboard/queries.py
open_mirror), syncs it, and asks the dashboard's pure queries (dashboard/queries.py, no
Streamlit) on a SweepView of it: every query reads the sweep's runs alone through a temporary
view, while the mirror keeps every run. For each of the sweep's comparable groups it shows what
the Compare page shows for that group; the plots are the dashboard's charts (dashboard/plots.py)
rendered to PNG without a browser (vl-convert).
"""

from __future__ import annotations

import base64
import html
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specfleet.speedup import STALL_FACTOR

FORMATS = ("md", "html")
PNG_SCALE = 2  # pixels per CSS pixel: sharp in an issue, about 100 KB a plot
FLAGGED_SHOWN = 200  # rows of the flagged-runs table; the count above it is of every run
SPEEDUP_COLUMNS = ["chip", "engine", "method", "depth", "speedup", "ci_low", "ci_high", "machines", "prompts"]
SPEEDUP_COLUMNS += ["pairs", "excluded_pairs", "stalled_runs", "stall_rate", "near_tie_runs"]
MACHINE_COLUMNS = ["name", "chip", "gpu_cores", "memory_gib", "model_identifier", "os_version", "bandwidth_gb_per_s"]
VERDICT_COLUMNS = ["claim", "chip", "group", "adjusted_verdict", "verdict", "figure", "ci_low", "ci_high"]
VERDICT_COLUMNS += ["machines", "prompts", "runs", "why"]
VERSION_COLUMNS = ["setting", "system_label", "model", "chip", "figure", "method", "depth", "old", "new", "ratio"]
VERSION_COLUMNS += ["ci_low", "ci_high", "change", "machines", "prompts", "how"]
FLAGGED_COLUMNS = ["machine", "chip", "system_method", "depth", "prompt_id", "repeat", "nominal", "env_reasons"]
FLAGGED_COLUMNS += ["flags", "acceptance_reason", "run_id"]
# The Compare page's figures after the speedup: the data and plots function (one name), the
# heading, what an empty one says.
SECTIONS = (
    ("decode_speed", "Decode tokens/s per chip and method", "No run in this group."),
    ("acceptance_by_position", "Acceptance by draft position", "No speculative run with acceptance by position."),
    ("draft_verify", "Draft versus verify time", "No speculative run with draft and verify times."),
    ("verify_cost", "Verify cost: T(M)/T(1) per chip", "No verify-cost run of this group's model in this sweep."),
)


@dataclass(frozen=True)
class Heading:
    text: str
    level: int


@dataclass(frozen=True)
class Text:
    """A paragraph of plain text (no markup: escaped in HTML, as is in Markdown)."""

    text: str


@dataclass(frozen=True)
class Code:
    text: str
    language: str = ""


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame


@dataclass(frozen=True)
class Plot:
    """A chart rendered to PNG; `name` is its file's stem (a comparable group id and a kind)."""

    name: str
    title: str
    png: bytes


Block = Heading | Text | Code | Table | Plot


def server_commands(db):
    """The sweep's server command lines, one row per arm and server flags: lines that differ only
    in port, host or model paths (server_flags, a checked key, leaves those out) are one
    configuration, shown by one of them with the count of lines and runs behind it."""
    return db.query(
        "SELECT system_method, coalesce(server_flags, server_command) AS server_flags,"
        " min(server_command) AS server_command, count(DISTINCT server_command) AS command_lines,"
        " count(DISTINCT machine_id) AS machines, count(*) AS runs FROM runs WHERE server_command != ''"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    )


def make(address: str, token: str, sweep_id: str, fmt: str, out_dir: Path) -> Path:
    """Write the report of `sweep_id` in `out_dir` (report.md and its PNGs, or report.html);
    return the report's path. Raises ValueError naming what was wrong: the directory cannot be
    written, no such sweep, a sweep with no runs."""
    _check_writable(out_dir)
    return write(build(address, token, sweep_id), fmt, out_dir)


def _check_writable(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as e:
        raise ValueError(f"cannot write the report in {out_dir}: {e.strerror or e}") from None


def build(address: str, token: str, sweep_id: str) -> list[Block]:
    """The report's blocks, in order: the sweep, its machines, its sweep file and server command
    lines, per comparable group the Compare page's figures, the verdicts of the claims its runs
    enter, and its flagged runs."""
    from dashboard import queries

    mirror = queries.open_mirror(address, token)
    try:
        mirror.sync()
        return _blocks(queries, mirror, address, sweep_id)
    finally:
        mirror.close()


def _blocks(q, mirror, address: str, sweep_id: str) -> list[Block]:
    sweep = mirror.query("SELECT sweep_id, name, state, yaml FROM sweeps WHERE sweep_id = ?", [sweep_id])
    if sweep.empty:
        raise ValueError(f"no sweep {sweep_id!r} on the coordinator at {address} (`specfleet sweep list` lists them)")
    name, state, sweep_file = sweep["name"][0], sweep["state"][0], sweep["yaml"][0]
    counted = mirror.query("SELECT count(*) AS n FROM runs WHERE sweep_id = ?", [sweep_id])
    if counted.empty or not int(counted["n"][0]):
        why = f"`specfleet sweep status {sweep_id}` says why"
        raise ValueError(f"sweep {sweep_id} ({name}, {state}) has no runs: nothing to report ({why})")
    db = q.SweepView(mirror, sweep_id)  # every query below reads the sweep's runs alone
    try:
        blocks: list[Block] = [Heading(f"Sweep {name}", 1), Text(_progress(q.sweeps(db), sweep_id))]
        failures = q.failures(db)
        failures = failures[failures["sweep_id"] == sweep_id] if not failures.empty else failures
        if not failures.empty:
            blocks.append(Table(failures[["job_id", "agent", "state", "attempt", "reason"]]))
        blocks += _machines(q, db, sweep_id)
        blocks += [Heading("The sweep file", 2), Code(sweep_file, "yaml")]
        commands = server_commands(db)
        if not commands.empty:
            blocks += [Heading("Server command lines", 2), Table(commands)]
        chips = q.chips(db)
        for group in q.groups(db, q.Filters()).itertuples():
            blocks += _group(q, db, group, chips)
        blocks += _versions(q, db)
        blocks += _verdicts(q, db)
        blocks += _flagged(q, db)
        return blocks
    finally:
        db.close()


def _progress(sweeps: pd.DataFrame, sweep_id: str) -> str:
    s = sweeps[sweeps["sweep_id"] == sweep_id].iloc[0]
    states = ", ".join(f"{int(s[k])} {k.replace('_', ' ')}" for k in ("done", "failed", "refused", "cancelled"))
    open_jobs = f"{int(s['queued'])} queued, {int(s['in_flight'])} in flight"
    return f"Sweep {sweep_id}: {s['state']}; {int(s['jobs'])} job(s): {states}, {open_jobs}; {int(s['runs'])} run(s)."


def _machines(q, db, sweep_id: str) -> list[Block]:
    """The agents that ran the sweep's jobs (or stored its runs), with the engines and versions
    their runs recorded."""
    ran = db.query(
        "SELECT DISTINCT agent_id FROM jobs WHERE sweep_id = ? AND coalesce(agent_id, '') != ''"
        " UNION SELECT DISTINCT agent_id FROM runs",
        [sweep_id],
    )
    engines = db.query(
        "SELECT agent_id, string_agg(DISTINCT engine || ' ' || engine_version, '; ' ORDER BY engine || ' '"
        " || engine_version) AS engine_versions, coalesce(string_agg(DISTINCT nullif(server_version, ''), '; '"
        " ORDER BY nullif(server_version, '')), '') AS server_versions FROM runs GROUP BY agent_id"
    )
    agents = q.agents(db)
    agents = agents[agents["agent_id"].isin(ran["agent_id"])].merge(engines, on="agent_id", how="left")
    return [Heading("Machines", 2), Table(agents[[*MACHINE_COLUMNS, "engine_versions", "server_versions"]])]


def _group(q, db, group, chips: list[str]) -> list[Block]:
    """The Compare page's figures for one comparable group: speedup against depth with its
    intervals, decode tok/s, acceptance by position, draft versus verify time, verify cost."""
    from dashboard import plots

    f = q.Filters(comparable=group.comparable)
    out: list[Block] = [
        Heading(f"Group {group.comparable}: {group.system_label} · {group.model}", 2),
        Text(f"{q.group_label(group)}. {group.runs} run(s) on {group.machines} machine(s): {group.chips}."),
        Heading("Speedup over the baseline against draft depth", 3),
    ]
    for r in q.lossy_runs(db, f).itertuples():
        out.append(
            Text(
                f"Engine defect on {r.chip} · {r.system_label} · {r.method} K={r.depth}: {r.runs} run(s) changed the"
                f" output against the {r.checked_against}; they are left out of every speedup."
            )
        )
    speedups = q.speedups(db, f)
    if speedups.empty:
        out.append(Text("No arm with a baseline in this group."))
    else:
        chart = plots.speedup_vs_depth(speedups, chips)
        out += [
            _plot(group.comparable, "speedup", "Speedup over the baseline", chart),
            Table(speedups[SPEEDUP_COLUMNS]),
        ]
        if speedups["stalled_runs"].any():
            out.append(
                Text(
                    f"stalled_runs: {speedups['stalled_runs'].sum()} run(s) under 1/{STALL_FACTOR:g} of the median"
                    " speed of their arm's repeats on the prompt (docs/speedup.md): counted, kept in every figure."
                )
            )
    for name, title, empty in SECTIONS:
        out.append(Heading(title, 3))
        if name == "acceptance_by_position":
            for r in q.collapsed_acceptance(db, f).itertuples():
                said = f"Acceptance collapsed on {r.chip} · {r.engine} · {r.method} · {r.model}: {r.runs} run(s)."
                out.append(Text(f"{said} {r.reason}"))
        frame = getattr(q, name)(db, f)
        if frame.empty:
            out.append(Text(empty))
        else:
            out += [_plot(group.comparable, name, title, getattr(plots, name)(frame, chips)), Table(frame)]
    return out


def _plot(stem: str, kind: str, title: str, chart) -> Plot:
    buf = io.BytesIO()
    chart.save(buf, format="png", scale_factor=PNG_SCALE)
    return Plot(f"{stem}-{kind}", title, buf.getvalue())


def _versions(q, db) -> list[Block]:
    """The Versions page for the sweep: each setting measured under two or more versions of its
    engine or system, the changes called, and every ratio with its interval."""
    from specfleet import versions

    out: list[Block] = [Heading("Changes between versions", 2)]
    rows = q.version_changes(db, q.Filters())
    if rows.empty:
        return [*out, Text("No setting of this sweep was measured under two versions of its engine or system.")]
    low, high = versions.band()
    out.append(
        Text(
            f"Ratio new / old per chip, paired by machine where the same machines ran both, with the verdicts' 95%"
            f" interval; a regression or gain only when the whole interval lies outside {low:.3f}-{high:.3f}."
        )
    )
    called = versions.summary(rows)
    if called.empty:
        out.append(Text("No regression and no gain beyond the tolerance."))
    for r in called.itertuples():
        out.append(Text(f"{r.change.capitalize()} on {r.chip}: {r.old} -> {r.new} (setting {r.setting}): {r.figures}."))
    return [*out, Table(rows[VERSION_COLUMNS])]


def _verdicts(q, db) -> list[Block]:
    """The Questions page's rows of the claims whose conditions select runs of the sweep."""
    ledger = q.load_claims()
    claims = {c.id: c for c in ledger}
    tested = [cid for cid, sel in q.selections(db, ledger).items() if sel["selected"]]
    out: list[Block] = [Heading("Verdicts of the claims it tests", 2)]
    if not tested:
        return [*out, Text(f"No claim of the ledger ({q.ledger_path()}) selects a run of this sweep.")]
    rows = q.verdicts(db, ledger)
    out += [Text(f"{cid}: {claims[cid].statement}") for cid in tested]
    return [*out, Table(rows[rows["claim"].isin(tested)][VERDICT_COLUMNS])]


def _flagged(q, db) -> list[Block]:
    """The Runs page's counts for the sweep, and its runs with a flag or a degraded environment."""
    every = q.Filters()
    summary = q.runs_summary(db, every)
    counts = ", ".join(f"{summary[k]} {k}" for k in ("nominal", "degraded", "unknown", *q.FLAG_NAMES))
    out: list[Block] = [Heading("Flagged runs", 2), Text(f"{summary['runs']} run(s): {counts}.")]
    runs = q.runs_table(db, every, limit=summary["runs"])
    flagged = runs[(runs["flags"] != "") | (runs["nominal"] == "degraded")]
    if flagged.empty:
        return [*out, Text("No run was flagged or ran in a degraded environment.")]
    names = q.agents(db).set_index("agent_id")["name"]
    flagged = flagged.assign(machine=flagged["agent_id"].map(names))[FLAGGED_COLUMNS]
    if len(flagged) > FLAGGED_SHOWN:
        out.append(Text(f"The first {FLAGGED_SHOWN} of {len(flagged)} flagged runs:"))
    return [*out, Table(flagged.head(FLAGGED_SHOWN))]


# ---------------------------------------------------------------- writing


def write(blocks: list[Block], fmt: str, out_dir: Path) -> Path:
    """report.md with each plot as NAME.png beside it (relative links), or report.html with the
    plots inline as data: URIs."""
    if fmt not in FORMATS:
        raise ValueError(f"report format {fmt!r}: must be one of {', '.join(FORMATS)}")
    if fmt == "md":
        for b in blocks:
            if isinstance(b, Plot):
                (out_dir / f"{b.name}.png").write_bytes(b.png)
        path, text = out_dir / "report.md", "\n\n".join(_markdown(b) for b in blocks) + "\n"
    else:
        body = "\n".join(_html(b) for b in blocks)
        title = html.escape(next(b.text for b in blocks if isinstance(b, Heading)))
        path, text = out_dir / "report.html", HTML_PAGE.format(title=title, body=body)
    path.write_text(text, encoding="utf-8")
    return path


def cell(x) -> str:
    """A table cell as text: floats to 3 decimals ('–' for none), lists joined by ', '."""
    if isinstance(x, (list, tuple, np.ndarray)):
        return ", ".join(map(str, x))
    if x is None or x is pd.NA or x is pd.NaT:
        return ""
    if isinstance(x, (float, np.floating)):
        return "–" if np.isnan(x) else f"{x:.3f}"
    return str(x)


def _markdown(b: Block) -> str:
    if isinstance(b, Heading):
        return f"{'#' * b.level} {b.text}"
    if isinstance(b, Text):
        return b.text
    if isinstance(b, Code):
        return f"```{b.language}\n{b.text.rstrip()}\n```"
    if isinstance(b, Plot):
        return f"![{b.title}]({b.name}.png)"
    # A pipe table by hand: pandas' to_markdown needs tabulate for nothing more than this.
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(esc(c) for c in b.frame.columns) + " |", "|" + " --- |" * len(b.frame.columns)]
    lines += ["| " + " | ".join(esc(cell(x)) for x in row) + " |" for row in b.frame.itertuples(index=False)]
    return "\n".join(lines)


def _html(b: Block) -> str:
    if isinstance(b, Heading):
        return f"<h{b.level}>{html.escape(b.text)}</h{b.level}>"
    if isinstance(b, Text):
        return f"<p>{html.escape(b.text)}</p>"
    if isinstance(b, Code):
        return f"<pre><code>{html.escape(b.text)}</code></pre>"
    if isinstance(b, Plot):
        src = "data:image/png;base64," + base64.b64encode(b.png).decode()
        return f'<figure><img alt="{html.escape(b.title)}" src="{src}"></figure>'
    return b.frame.map(cell).to_html(index=False, border=0)


HTML_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 80em; padding: 0 1em; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }}
img {{ max-width: 100%; }} pre {{ background: #f6f8fa; padding: 1em; overflow-x: auto; }}
</style></head>
<body>
{body}
</body></html>
"""

"""`specfleet report` on tests/test_dashboard.py's seeded fleet (a real coordinator, seeded
through its real API with known truth: one sweep per machine). The CLI runs as a process of its
own, as a user runs it (a report narrows its process's dashboard mirror to the sweep); this
process reads the same coordinator through the dashboard's data functions, on the whole fleet,
and the report's figures must equal them where the sweep holds every run of a chip, and the
truth worked out by hand where it does not. The HTML report is opened in headless Chromium."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from cli.report import cell
from dashboard import data
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.support.browser import chromium_page
from tests.support.dashboard import (
    MLX_27B,
    expected_speedup,
    seed_fleet,  # noqa: F401 - what the `fleet` fixture seeds (tests/support/fixtures.py)
)
from tests.support.fleet import admin_for

pytestmark = [pytest.mark.process]  # coordinators, CLI processes and Chromium

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLI_SECONDS = 120


def report(fleet, *args: str, **env: str) -> subprocess.CompletedProcess:
    coordinator, token, _ = fleet
    command = [sys.executable, "-m", "cli.main", "report", *args]
    command += ["--coordinator", f"127.0.0.1:{coordinator.port}", "--admin-token", token]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(command, capture_output=True, text=True, timeout=CLI_SECONDS, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def sweeps(fleet) -> dict[str, str]:
    """Sweep name -> id: seed-mini-1, seed-mini-2, seed-mbp, seed-studio, seed-air (no runs)."""
    listed = admin_for(fleet[0]).ListSweeps(pb.ListSweepsRequest()).sweeps
    return {s.name: s.sweep_id for s in listed}


@pytest.fixture(scope="module")
def dashboard(fleet):
    """The dashboard's Version of the whole fleet, read in this process."""
    coordinator, token, _ = fleet
    address = f"127.0.0.1:{coordinator.port}"
    return data.Version(address, token, **data.mirror(address, token).sync())


def tables(md: str) -> list[tuple[list[str], pd.DataFrame]]:
    """Every pipe table of the Markdown, with the headings above it (outermost first)."""
    headings: list[str] = []
    lines, out, i = md.splitlines(), [], 0
    split = lambda line: [c.replace("\\|", "|") for c in re.split(r"(?<!\\) \| ", line[2:-2])]
    while i < len(lines):
        if m := re.match(r"(#+) (.*)", lines[i]):
            headings = [*headings[: len(m[1]) - 1], m[2]]
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            header, rows, i = split(lines[i]), [], i + 2
            while i < len(lines) and lines[i].startswith("| "):
                rows.append(split(lines[i]))
                i += 1
            out.append((headings, pd.DataFrame(rows, columns=header)))
            continue
        i += 1
    return out


def table(md: str, heading: str) -> tuple[str, pd.DataFrame]:
    """The one table under `heading`, and the comparable group of the section holding it ('' outside one)."""
    found = [(h, t) for h, t in tables(md) if h[-1] == heading]
    assert len(found) == 1, [h for h, _ in tables(md)]
    headings, frame = found[0]
    groups = [m[1] for h in headings if (m := re.match(r"Group (\w+):", h))]
    return (groups or [""])[0], frame


def same_figures(reported: pd.DataFrame, expected: pd.DataFrame, keys: list[str], columns: list[str]) -> None:
    """Every row of `expected` is in the report, each column as the report writes it."""
    assert len(reported) == len(expected), (reported, expected)
    shown = reported.set_index(keys)
    for row in expected.itertuples(index=False):
        key = tuple(cell(getattr(row, k)) for k in keys)
        for column in columns:
            assert shown.loc[key, column] == cell(getattr(row, column)), (key, column, shown.loc[key], row)


def png_size(path: Path) -> tuple[int, int]:
    """The width and height a PNG's header says, after checking the signature and the IHDR chunk."""
    raw = path.read_bytes()
    assert raw[:8] == PNG_MAGIC and raw[12:16] == b"IHDR", path
    return struct.unpack(">II", raw[16:24])


def test_markdown_report_plots_and_figures_equal_the_dashboards(fleet, sweeps, dashboard, tmp_path):
    out = tmp_path / "studio"
    done = report(fleet, sweeps["seed-studio"], "--format", "md", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out / "report.md")
    md = (out / "report.md").read_text()

    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(linked) == sorted(p.name for p in out.glob("*.png")) and len(linked) >= 4, linked
    for name in linked:
        width, height = png_size(out / name)
        with Image.open(out / name) as image:
            image.load()  # decodes every row: a truncated or corrupt file raises
            assert image.size == (width, height) and width > 100 and height > 100

    group, speedups = table(md, "Speedup over the baseline against draft depth")
    expected = data.speedups(dashboard, data.Filters(comparable=group))
    expected = expected[expected["chip"] == "Apple M5 Max"]  # the studio's sweep holds every M5 Max run
    columns = ["speedup", "ci_low", "ci_high", "machines", "pairs", "stalled_runs", "stall_rate", "near_tie_runs"]
    same_figures(speedups, expected, ["chip", "method", "depth"], columns)
    assert abs(float(speedups["speedup"][0]) - expected_speedup(fleet[2], "Apple M5 Max", 3)) < 6e-4

    group_decode, decode = table(md, "Decode tokens/s per chip and method")
    expected = data.decode_speed(dashboard, data.Filters(comparable=group_decode))
    same_figures(
        decode,
        expected[expected["chip"] == "Apple M5 Max"],
        ["chip", "engine", "arm"],
        ["median", "ci_low", "ci_high", "runs"],
    )
    assert group_decode == group

    _, accepted = table(md, "Acceptance by draft position")
    assert accepted["position"].tolist() == ["1", "2", "3"] and set(accepted["chip"]) == {"Apple M5 Max"}
    _, machines = table(md, "Machines")
    assert machines.to_dict("records") == [
        dict(
            name="studio",
            chip="Apple M5 Max",
            gpu_cores="40",
            memory_gib="128.000",
            model_identifier="Mac16,11",
            os_version="26.4.1",
            bandwidth_gb_per_s="614.000",
            engine_versions="mlx mlx=0.29.1 mlx-lm=0.28.0",
            server_versions="",
        )
    ]
    assert "name: seed-studio" in md and "## Verdicts of the claims it tests" in md


def test_a_report_holds_its_sweeps_runs_only(fleet, sweeps, dashboard, tmp_path):
    """mini-1 and mini-2 (two sweeps) share a chip and a group: mini-1's report counts mini-1 alone,
    where the dashboard pools both, in its figures and in the verdicts of the claims it tests
    (tests/test_dashboard.py's claims on our loop at depth 3, and one it does not test);
    mini-2's hot first repeat is not in it."""
    ledger = tmp_path / "claims.yaml"
    claim = (
        "- id: {id}\n  statement: our loop at depth 3.\n  source: {{file: notes.txt, section: top, quote: q}}\n"
        "  conditions: {{engine: mlx, method: mtp, models: [{model}], chip: Apple M4 Pro, depth: 3}}\n"
        "  metric: speedup\n  expected: x\n  verdict: {{rule: range, low: 0.1, high: 100}}\n"
    )
    ledger.write_text(claim.format(id="depth-3", model=MLX_27B.reference) + claim.format(id="other", model="other"))
    out = tmp_path / "mini-1"
    done = report(fleet, sweeps["seed-mini-1"], "--output", str(out), SPECFLEET_CLAIMS=str(ledger))
    assert done.returncode == 0, done.stderr
    md = (out / "report.md").read_text()
    group, speedups = table(md, "Speedup over the baseline against draft depth")
    pooled = data.speedups(dashboard, data.Filters(comparable=group))
    assert set(pooled[pooled["chip"] == "Apple M4 Pro"]["machines"]) == {2}
    assert set(speedups[speedups["chip"] == "Apple M4 Pro"]["machines"]) == {"1"}
    truth = fleet[2][fleet[2]["agent"] == "mini-1"]
    for depth in (1, 2, 3, 4):
        shown = float(speedups[speedups["depth"] == str(depth)]["speedup"].iloc[0])
        assert abs(shown - expected_speedup(truth, "Apple M4 Pro", depth)) < 6e-4, depth
    _, verdicts = table(md, "Verdicts of the claims it tests")
    assert verdicts["claim"].tolist() == ["depth-3"] and "depth-3: our loop at depth 3." in md
    (verdict,) = verdicts.itertuples()
    assert (verdict.chip, verdict.group, verdict.machines) == ("Apple M4 Pro", group, "1")
    assert abs(float(verdict.figure) - expected_speedup(truth, "Apple M4 Pro", 3)) < 6e-4
    _, machines = table(md, "Machines")
    assert machines["name"].tolist() == ["mini-1"]
    assert "No run was flagged" in md and "mini-2" not in md


@pytest.mark.slow
def test_html_report_renders_in_chromium_with_its_plots_and_flagged_runs(fleet, sweeps, dashboard, tmp_path):
    out = tmp_path / "mbp"
    done = report(fleet, sweeps["seed-mbp"], "--format", "html", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]  # the plots are inline
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') >= 4 and "<script" not in html

    (row,) = data.speedups(dashboard, data.Filters(engine=("llama.cpp",))).itertuples()  # every M1 Max run is mbp's
    with chromium_page() as page:
        page.goto((out / "report.html").as_uri(), wait_until="load")  # every inline image decoded
        shown = page.evaluate(
            "({text: document.body.innerText,"
            " images: [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])})"
        )
    assert len(shown["images"]) >= 4 and all(w > 100 and h > 100 for _, w, h in shown["images"]), shown["images"]
    text = shown["text"]
    assert "Sweep seed-mbp" in text and "Apple M1 Max" in text and "Mac16,11" in text
    assert f"{cell(row.speedup)}\t{cell(row.ci_low)}\t{cell(row.ci_high)}" in text  # the dashboard's figure
    collapsed = fleet[2][(fleet[2]["agent"] == "mbp") & (fleet[2]["method"] == "mtp")]  # every arm run of mbp
    assert "Acceptance collapsed on Apple M1 Max" in text
    assert f"{len(collapsed)} acceptance collapsed" in text.split("Flagged runs")[-1]
    assert text.split("Flagged runs")[-1].count("\tacceptance collapsed\t") == len(collapsed)


@pytest.mark.parametrize(
    "args, status, said",
    [
        (["no-such-sweep", "--output", "{tmp}/x"], 1, "error: no sweep 'no-such-sweep' on the coordinator at"),
        (
            ["{seed-air}", "--output", "{tmp}/x"],
            1,
            "error: sweep {seed-air} (seed-air, done) has no runs: nothing to report",
        ),
        (["{seed-mbp}", "--output", "{tmp}/file/x"], 1, "error: cannot write the report in {tmp}/file/x: Not a direc"),
        (["{seed-mbp}", "--format", "pdf", "--output", "{tmp}/x"], 2, "--format: invalid choice: 'pdf'"),
    ],
)
def test_bad_inputs_are_one_line_errors(fleet, sweeps, tmp_path, args, status, said):
    (tmp_path / "file").write_text("a file, not a directory")
    names = {"tmp": str(tmp_path), **sweeps}
    done = report(fleet, *[a.format(**names) for a in args])
    assert done.returncode == status, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said.format(**names) in lines[0], done.stderr
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


BUILD_TWICE = """
import sys
from pathlib import Path
from cli import report

address, token, first, second, out = sys.argv[1:]
for sweep in (first, second, first):
    report.make(address, token, sweep, "md", Path(out) / sweep)
    print((Path(out) / sweep / "report.md").read_text().count("\\n"))
assert "streamlit" not in sys.modules, "building a report imported streamlit"
"""


def test_reports_of_two_sweeps_in_one_process_without_streamlit(fleet, sweeps, tmp_path):
    """The report reads the dashboard's pure queries (dashboard/queries.py) on a mirror of its
    own, narrowed by a view: one process builds mini-1's, mini-2's and mini-1's again, each the
    same as the CLI's, and never imports Streamlit."""
    coordinator, token, _ = fleet
    first, second = sweeps["seed-mini-1"], sweeps["seed-mini-2"]
    command = [sys.executable, "-c", BUILD_TWICE, f"127.0.0.1:{coordinator.port}", token, first, second]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*command, str(tmp_path)], capture_output=True, text=True, timeout=CLI_SECONDS, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    for sweep in (first, second):
        alone = tmp_path / f"cli-{sweep}"
        assert report(fleet, sweep, "--output", str(alone)).returncode == 0
        assert (tmp_path / sweep / "report.md").read_text() == (alone / "report.md").read_text(), sweep
    mini_2 = (tmp_path / second / "report.md").read_text()
    _, machines = table(mini_2, "Machines")
    assert machines["name"].tolist() == ["mini-2"]


def test_a_sweep_view_narrows_every_query_and_deletes_nothing(fleet, sweeps):
    """dashboard/queries.py SweepView: the sweep's runs through a temporary view on a
    connection of its own; the mirror keeps every run, and the sweep id is a bound parameter."""
    from dashboard import queries

    coordinator, token, truth = fleet
    mirror = queries.open_mirror(f"127.0.0.1:{coordinator.port}", token)
    try:
        mirror.sync()
        every = int(mirror.query("SELECT count(*) AS n FROM runs")["n"][0])
        per_sweep = mirror.query("SELECT sweep_id, count(*) AS n FROM runs GROUP BY ALL").set_index("sweep_id")["n"]
        assert len(per_sweep) >= 4 and every == per_sweep.sum()
        for name in ("seed-mini-1", "seed-studio"):
            view = queries.SweepView(mirror, sweeps[name])
            assert int(view.query("SELECT count(*) AS n FROM runs")["n"][0]) == per_sweep[sweeps[name]]
            with view.cursor() as con:  # the claims' connections see the sweep alone too
                assert con.execute("SELECT count(DISTINCT sweep_id) FROM runs").fetchone()[0] == 1
            assert set(queries.decode_speed(view, queries.Filters())["chip"]) == set(
                truth[truth["agent"] == name.removeprefix("seed-")]["chip"]
            )
            view.close()
        hostile = queries.SweepView(mirror, "x' OR '1'='1")
        assert int(hostile.query("SELECT count(*) AS n FROM runs")["n"][0]) == 0
        assert int(mirror.query("SELECT count(*) AS n FROM runs")["n"][0]) == every  # nothing deleted
    finally:
        mirror.close()

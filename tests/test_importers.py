"""The importers (cli/importers) on real llama-bench output (the project's build, run once
per session by tests/support/fixtures.py's llama_bench_output), on small captured copies of it
(tests/captured/llama-bench-cpu-target.*), on mtplx files written from MTPLX's documented
fields (tests/importer_fixtures: written by hand, no MTPLX output was captured), and on bad
files: each refused with one line naming the file, line and field."""

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest

from cli.importers import llama_bench, mtplx
from cli.importers.result import BadFile
from tests.support.captured import CAPTURED, MTPLX_RUN
from tests.support.fixtures import LLAMA_BENCH

FORMATS = ("json", "jsonl", "csv", "sql")


def build_commit() -> str:
    """The commit llama-bench reports for itself: `version: 0.5.0-dev (build 1, commit 0c1e570)`."""
    out = subprocess.run([str(LLAMA_BENCH), "--version"], capture_output=True, text=True, timeout=30)
    return re.search(r"commit ([0-9a-f]+)", out.stdout + out.stderr).group(1)


def refused(path: Path, *fragments: str, parse=llama_bench.parse) -> str:
    with pytest.raises(BadFile) as e:
        parse(path)
    message = str(e.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


@pytest.mark.process
def test_real_output_in_every_format_reads_the_same_tests(llama_bench_output):
    commit = build_commit()
    parsed = {fmt: llama_bench.parse(path) for fmt, path in llama_bench_output.items()}
    for fmt, results in parsed.items():
        assert [r.test for r in results] == ["pp16", "tg16"], fmt
        assert [(r.n_prompt, r.n_gen, r.n_depth) for r in results] == [(16, 0, 0), (0, 16, 0)]
        for r in results:
            assert r.tool == "llama-bench" and r.tool_version.split()[0] == commit
            assert r.method == "baseline" and r.draft_depth == 0
            assert r.model.endswith("(target.gguf)") and "/" not in r.model  # a name, never a path
            assert r.tokens_per_second > 0 and r.tokens_per_second_stddev is not None
            assert r.machine.endswith("CPU")  # cpu_info / gpu_info / backends
            assert r.source.name == f"results.{fmt}" and len(r.source.sha256) == 64
    # json and jsonl carry each repetition's figure; csv and sql do not have the field.
    assert all(len(r.samples_tokens_per_second) == 2 for fmt in ("json", "jsonl") for r in parsed[fmt])
    assert all(r.samples_tokens_per_second == () for fmt in ("csv", "sql") for r in parsed[fmt])


@pytest.mark.process
def test_real_json_values_are_the_files_own(llama_bench_output):
    """Every figure is the file's: compared with the file read by the json module."""
    rows = json.loads(llama_bench_output["json"].read_text())
    for row, result in zip(rows, llama_bench.parse(llama_bench_output["json"]), strict=True):
        assert result.tokens_per_second == row["avg_ts"] and result.tokens_per_second_stddev == row["stddev_ts"]
        assert list(result.samples_tokens_per_second) == row["samples_ts"]
        assert result.measured_at == row["test_time"] and json.loads(result.fields_json) == row


@pytest.mark.parametrize("fmt", FORMATS)
def test_captured_output_lines_and_values(fmt):
    path = CAPTURED / f"llama-bench-cpu-target.{fmt}"
    results = llama_bench.parse(path)
    text = path.read_text()
    lines = text.splitlines()
    if fmt == "csv":
        expected = [float(row["avg_ts"]) for row in csv.DictReader(lines)]
    elif fmt == "sql":  # the 41st of 42 quoted values of each INSERT is avg_ts
        expected = [float(re.findall(r"'([^']*)'", line)[-2]) for line in lines if line.startswith("INSERT")]
    elif fmt == "jsonl":
        expected = [json.loads(line)["avg_ts"] for line in lines]
    else:
        expected = [row["avg_ts"] for row in json.loads(text)]
    assert [r.tokens_per_second for r in results] == expected  # sql's REAL read exactly, not as a 4-byte float
    for r in results:  # each result's line is where its row starts (json: its object's "{")
        row_start = "{" if fmt == "json" else str(json.loads(r.fields_json)["avg_ns"])
        assert row_start in lines[r.line - 1], (fmt, r.line)
    assert [r.machine for r in results] == ["AMD EPYC / CPU"] * 2
    assert [r.model for r in results] == ["llama ?B all F32 (target.gguf)"] * 2


def test_fields_of_older_and_newer_llama_bench_versions_are_read_by_name(tmp_path):
    """An older llama-bench had no n_depth and no backends field but cuda/metal/... flags; a newer
    one may add fields: read by name, the missing optional ones absent, the new ones kept."""
    row = json.loads((CAPTURED / "llama-bench-cpu-target.jsonl").read_text().splitlines()[1])
    for name in ("n_depth", "backends", "samples_ts", "stddev_ts", "build_number", "cpu_info"):
        row.pop(name)
    row.update(metal=True, cuda=False, gpu_blas=True, future_field="kept")
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (result,) = llama_bench.parse(path)
    assert (result.test, result.n_depth, result.machine) == ("tg16", 0, "METAL,GPU_BLAS")
    assert result.tokens_per_second_stddev is None and result.samples_tokens_per_second == ()
    assert result.tool_version == row["build_commit"]
    assert json.loads(result.fields_json)["future_field"] == "kept"
    depth = {**row, "n_prompt": 0, "n_gen": 128, "n_depth": 4096}
    path.write_text(json.dumps(depth) + "\n")
    assert llama_bench.parse(path)[0].test == "tg128 @ d4096"


@pytest.mark.parametrize("fmt", ("csv", "sql", "jsonl"))
def test_outputs_appended_to_one_file_are_read_whole(tmp_path, fmt):
    """`llama-bench -o csv >> results.csv` twice: every result of both runs, each with its line."""
    text = (CAPTURED / f"llama-bench-cpu-target.{fmt}").read_text()
    path = tmp_path / f"results.{fmt}"
    path.write_text(text + text.replace("2026-12-01T", "2026-12-02T"))
    results = llama_bench.parse(path)
    assert [r.test for r in results] == ["pp16", "tg16"] * 2
    assert [r.measured_at[:10] for r in results] == ["2026-12-01"] * 2 + ["2026-12-02"] * 2
    assert len({r.line for r in results}) == 4


def test_unquoted_sql_numbers_are_read_too(tmp_path):
    """llama-bench quotes every value; a hand-edited or older file may not."""
    sql = (CAPTURED / "llama-bench-cpu-target.sql").read_text()
    values = re.findall(r"'([^']*)'", sql.splitlines()[-1])
    path = tmp_path / "results.sql"
    path.write_text(sql.replace(f"'{values[-2]}'", values[-2]))
    assert llama_bench.parse(path)[1].tokens_per_second == float(values[-2])


def test_format_is_detected_from_the_suffix_or_the_text(tmp_path):
    for fmt in FORMATS:
        copy = tmp_path / f"noext-{fmt}"
        copy.write_text((CAPTURED / f"llama-bench-cpu-target.{fmt}").read_text())
        assert llama_bench.detect_format(copy, copy.read_text()) == fmt
        assert len(llama_bench.parse(copy)) == 2


def _jsonl_with(tmp_path, line: int, **changes) -> Path:
    rows = [json.loads(x) for x in (CAPTURED / "llama-bench-cpu-target.jsonl").read_text().splitlines()]
    rows.append(dict(rows[0]))
    rows[line - 1].update(changes)
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_llama_bench_rows_name_file_line_and_field(tmp_path):
    assert (
        refused(_jsonl_with(tmp_path, 3, avg_ts="abc"))
        == "results.jsonl line 3: field avg_ts: expected a number, got 'abc'"
    )
    refused(_jsonl_with(tmp_path, 2, avg_ts=float("nan")), "line 2: field avg_ts: expected a number")
    refused(_jsonl_with(tmp_path, 1, avg_ts=0), "line 1: field avg_ts: must be above 0")
    refused(_jsonl_with(tmp_path, 2, avg_ts=True), "line 2: field avg_ts: expected a number, got True")
    refused(_jsonl_with(tmp_path, 2, stddev_ts=-1), "line 2: field stddev_ts: must be at least 0")
    refused(_jsonl_with(tmp_path, 2, n_gen=1.5), "line 2: field n_gen: expected a whole number")
    refused(_jsonl_with(tmp_path, 2, n_gen=0, n_prompt=0), "line 2: field n_prompt: n_prompt and n_gen are both 0")
    refused(_jsonl_with(tmp_path, 3, samples_ts=[1, "x"]), "line 3: field samples_ts[1]: expected a number")
    refused(_jsonl_with(tmp_path, 3, model_type=None), "line 3: field model_type: missing")
    path = tmp_path / "results.jsonl"
    path.write_text(path.read_text() + "{not json\n")
    refused(path, "results.jsonl line 4: not JSON")


def test_bad_json_csv_and_sql_files(tmp_path):
    text = (CAPTURED / "llama-bench-cpu-target.json").read_text()
    bad = tmp_path / "results.json"
    bad.write_text(text.replace('"avg_ts": ', '"avg_ts": "fast", "was": ', 1))
    line = next(i for i, x in enumerate(bad.read_text().splitlines(), 1) if '"fast"' in x)
    refused(bad, f"results.json line {line}: field avg_ts: expected a number, got 'fast'")
    bad.write_text(text + "\nmore")
    refused(bad, "results.json line", "text after the closing ']'")
    bad.write_text('{"avg_ts": 1}')
    refused(bad, "expected a JSON array")
    bad.write_text("[]")
    refused(bad, "results.json: no results in the file")

    lines = (CAPTURED / "llama-bench-cpu-target.csv").read_text().splitlines()
    bad = tmp_path / "results.csv"
    bad.write_text("\n".join([lines[0], lines[1], lines[2].rsplit(",", 1)[0]]) + "\n")
    refused(bad, "results.csv line 3: 41 values for the header's 42 fields")
    header = lines[0].replace("avg_ts", "mean_ts")
    bad.write_text("\n".join([header, *lines[1:]]) + "\n")
    refused(bad, "results.csv line 2: field avg_ts: missing")

    sql = (CAPTURED / "llama-bench-cpu-target.sql").read_text()
    bad = tmp_path / "results.sql"
    bad.write_text(sql.replace("'f16', 'f16'", "'f16', 'f16', 'extra'", 1))
    first_insert = next(i for i, x in enumerate(sql.splitlines(), 1) if x.startswith("INSERT"))
    refused(bad, f"results.sql line {first_insert}:")
    target = tmp_path / "written.csv"
    bad.write_text(sql + f"COPY llama_bench TO '{target}';\n")
    refused(bad, "results.sql line", "only CREATE TABLE IF NOT EXISTS llama_bench and INSERT INTO llama_bench")
    assert not target.exists()  # refused before anything ran
    bad.write_text(sql + "DROP TABLE llama_bench;\n")
    refused(bad, "only CREATE TABLE")


def test_mtplx_bench_run_directory():
    envelope, *tune = mtplx.parse(MTPLX_RUN)
    raw = json.loads((MTPLX_RUN / "envelope.json").read_text())
    assert (envelope.tool, envelope.tool_version) == ("mtplx bench", "2.12.0")
    assert (envelope.method, envelope.draft_depth) == ("mtp", 3)
    assert envelope.tokens_per_second == raw["runtime"]["tok_s"]
    assert list(envelope.acceptance_by_depth) == raw["runtime"]["acceptance_by_depth"]
    assert envelope.n_gen == raw["runtime"]["generated_tokens"]
    assert envelope.model == "Youssofal/Qwen3.8-27B-MTPLX-Optimized-Speed"  # from the cache path, never the path
    assert json.loads(envelope.quality_gates_json) == {"quality": True, "cold_tok_s_ge_55": True}
    assert envelope.machine == "studio.local / macOS-26.2-arm64-arm-64bit-Mach-O"
    assert envelope.measured_at == raw["created_at"] and json.loads(envelope.fields_json) == raw
    raw_tune = json.loads((MTPLX_RUN / "tuning.json").read_text())
    assert [(r.method, r.draft_depth, r.tokens_per_second) for r in tune] == [
        ("mtp" if c["mode"] != "ar" else "baseline", int(c["mode"][1:]) if c["mode"] != "ar" else 0, c["tok_s"])
        for c in raw_tune["results"]
    ]
    assert tune[3].acceptance_by_depth == (0.79, 0.6)  # up to the depth MTPLX gave no rate for
    assert {r.model for r in tune} == {raw_tune["model_repo"]}
    lines = (MTPLX_RUN / "tuning.json").read_text().splitlines()
    assert all(f'"mode": "{c["mode"]}"' in lines[r.line - 1] for r, c in zip(tune, raw_tune["results"]))


def _copy_run(tmp_path, name: str, edit) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    for f in MTPLX_RUN.iterdir():
        (run / f.name).write_text(f.read_text())
    document = json.loads((run / name).read_text())
    edit(document)
    (run / name).write_text(json.dumps(document, indent=2))
    return run


def test_bad_mtplx_files_name_file_line_and_field(tmp_path):
    run = _copy_run(tmp_path, "envelope.json", lambda d: d["runtime"].update(tok_s="fast"))
    line = next(i for i, x in enumerate((run / "envelope.json").read_text().splitlines(), 1) if '"tok_s"' in x)
    assert refused(run, parse=mtplx.parse) == (
        f"run/envelope.json line {line}: field runtime.tok_s: expected a number, got 'fast'"
    )
    run = _copy_run(tmp_path, "envelope.json", lambda d: d["runtime"].update(acceptance_by_depth=[0.9, 1.3]))
    refused(run, "run/envelope.json line", "field runtime.acceptance_by_depth[1]: must be in [0, 1]", parse=mtplx.parse)
    run = _copy_run(tmp_path, "envelope.json", lambda d: d["strict_gates"].update(cold_tok_s_ge_55="yes"))
    refused(run, "field strict_gates.cold_tok_s_ge_55: expected true or false", parse=mtplx.parse)
    run = _copy_run(tmp_path, "envelope.json", lambda d: d.update(model={"architecture": "x"}))
    refused(run, "field model: names no model", parse=mtplx.parse)
    run = _copy_run(tmp_path, "envelope.json", lambda d: d.pop("runtime"))
    refused(run, "run/envelope.json line 1: field runtime: missing", parse=mtplx.parse)
    (run / "envelope.json").write_text(json.dumps(json.loads((MTPLX_RUN / "envelope.json").read_text())))
    run = _copy_run(tmp_path, "tuning.json", lambda d: d["results"][1].update(mode="turbo"))
    line = next(i for i, x in enumerate((run / "tuning.json").read_text().splitlines(), 1) if '"turbo"' in x)
    refused(run, f"run/tuning.json line {line}: field results[1].mode: expected 'ar' or a depth", parse=mtplx.parse)
    run = _copy_run(tmp_path, "tuning.json", lambda d: d.pop("model_repo"))
    refused(run, "run/tuning.json", "field model: missing", parse=mtplx.parse)
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(empty, "no envelope.json and no tune results", parse=mtplx.parse)
    refused(tmp_path / "nowhere", "not a directory", parse=mtplx.parse)

"""`specfleet import` end to end: real llama-bench output (the llama_bench_output fixture) and an
mtplx run directory imported by the CLI, a separate process, into a coordinator process over
gRPC with the admin token; the rows read back through the admin read path with their
provenance; bad files and bad requests refused whole; imported results never in `runs` and
never in a speedup."""

import getpass
import hashlib
import json

import grpc
import pyarrow as pa
import pytest

from cli.importers import llama_bench
from coordinator import limits
from coordinator.auth import hash_secret
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet import speedup
from specfleet.client import AdminApi, channel
from specfleet.data_dir import admin_credential
from tests.support.captured import MTPLX_RUN
from tests.support.fleet import SWEEP_YAML, admin_for, enrol, make_run
from tests.support.fleet import start_coordinator as start_in_process
from tests.support.processes import cli

# real processes: the CLI a dozen times, a coordinator (about a minute)
pytestmark = [pytest.mark.slow, pytest.mark.process]
M1_MAX = pb.Fingerprint(hostname="m1", os="macos", chip="Apple M1 Max", memory_bytes=64 * 2**30)


def run_import(coord, *args, check=True):
    address, data = coord
    return cli("import", *args, "--coordinator", address, "--data-dir", str(data), check=check, timeout=120)


def imported(coord) -> list[dict]:
    address, data = coord
    resp = AdminApi(channel(address), admin_credential(data)).Export(pb.ExportRequest(table="imported_results"))
    return pa.ipc.open_stream(resp.arrow_ipc).read_all().to_pylist()


def test_llama_bench_files_imported_with_their_provenance_and_never_twice(coord, llama_bench_output):
    first = run_import(coord, "llama-bench", str(llama_bench_output["json"]), "--machine-note", "ci box, 2 cores")
    identity = "admin:" + hash_secret(admin_credential(coord[1]))[:12]
    assert f"imported 2 result(s) from {llama_bench_output['json']} as {identity}" in first.stdout
    again = run_import(coord, "llama-bench", str(llama_bench_output["json"]))
    assert "imported 0 result(s)" in again.stdout and "(2 already stored)" in again.stdout
    for fmt in ("jsonl", "csv", "sql"):
        assert "imported 2 result(s)" in run_import(coord, "llama-bench", str(llama_bench_output[fmt])).stdout
    rows = imported(coord)
    assert len(rows) == 8 and len({r["import_id"] for r in rows}) == 8
    by_file = {}
    for row in rows:
        by_file.setdefault(row["source_file"], []).append(row)
    for fmt, path in llama_bench_output.items():
        parsed = llama_bench.parse(path)
        stored = sorted(by_file[f"results.{fmt}"], key=lambda r: r["source_line"])
        assert [r["source_line"] for r in stored] == [p.line for p in parsed]
        assert [r["tokens_per_second"] for r in stored] == [p.tokens_per_second for p in parsed]
        for row in stored:
            assert row["tool"] == "llama-bench" and row["tool_version"] == parsed[0].tool_version
            assert row["source_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
            assert row["machine"].endswith("CPU") and row["method"] == "baseline"
            assert row["imported_by"] == identity and row["imported_by_user"] == getpass.getuser()
            assert json.loads(row["fields"])["n_gen"] in (0, 16, "0", "16")
    assert {r["machine_note"] for r in by_file["results.json"]} == {"ci box, 2 cores"}
    assert {r["tokens_per_second_stddev"] is not None for r in rows} == {True}


def test_mtplx_directory_imported(coord):
    out = run_import(coord, "mtplx", str(MTPLX_RUN), "--machine-note", "Mac Studio M3 Ultra 256 GB")
    assert "imported 5 result(s)" in out.stdout
    rows = [r for r in imported(coord) if r["tool"].startswith("mtplx")]
    envelope = next(r for r in rows if r["tool"] == "mtplx bench")
    assert (envelope["method"], envelope["draft_depth"], envelope["tokens_per_second"]) == ("mtp", 3, 72.9)
    assert envelope["acceptance_by_depth"] == [0.931, 0.862, 0.745]
    assert json.loads(envelope["quality_gates"]) == {"quality": True, "cold_tok_s_ge_55": True}
    assert envelope["machine_note"] == "Mac Studio M3 Ultra 256 GB" and envelope["tool_version"] == "2.12.0"
    assert sorted((r["draft_depth"], r["tokens_per_second"]) for r in rows if r["tool"] == "mtplx tune") == [
        (0, 14.4),
        (1, 23.0),
        (2, 20.6),
        (3, 17.3),
    ]
    assert "(5 already stored)" in run_import(coord, "mtplx", str(MTPLX_RUN)).stdout


def test_bad_files_and_requests_are_refused_whole(coord, llama_bench_output, tmp_path):
    before = len(imported(coord))
    lines = llama_bench_output["jsonl"].read_text().splitlines()
    bad = tmp_path / "results.jsonl"
    bad.write_text("\n".join([lines[0], lines[1], lines[0].replace('"avg_ts": ', '"avg_ts": "abc", "x": ')]) + "\n")
    result = run_import(coord, "llama-bench", str(bad), check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "error: results.jsonl line 3: field avg_ts: expected a number, got 'abc'\n"
    result = run_import(coord, "llama-bench", str(llama_bench_output["csv"]), "--machine-note", "x" * 300, check=False)
    assert result.returncode == 1 and "machine_note: 300 characters; at most 256" in result.stderr
    result = run_import(coord, "llama-bench", str(tmp_path / "missing.json"), check=False)
    assert result.returncode == 1 and "cannot read" in result.stderr and "missing.json" in result.stderr
    # The coordinator checks for itself: a request no client checked is refused whole.
    admin = AdminApi(channel(coord[0]), admin_credential(coord[1]))
    rows = [r.to_proto() for r in llama_bench.parse(llama_bench_output["json"])]
    rows[0].fields_json = json.dumps({"fresh": 1})  # a row not stored yet ...
    rows[1].acceptance_by_depth.append(1.5)  # ... beside one out of bounds
    with pytest.raises(grpc.RpcError) as e:
        admin.ImportResults(pb.ImportResultsRequest(results=rows))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "results[1].acceptance_by_depth[0]: 1.5 is not in [0, 1]" in e.value.details()
    rows[1].ClearField("acceptance_by_depth")
    rows[1].tool = "vibes"
    with pytest.raises(grpc.RpcError) as e:
        admin.ImportResults(pb.ImportResultsRequest(results=rows))
    assert "results[1].tool: 'vibes' is not one of" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        AdminApi(channel(coord[0]), "sfadm.wrong").ImportResults(pb.ImportResultsRequest(results=rows[:1]))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:  # every row bad: the status names the first 20, counts the rest
        admin.ImportResults(pb.ImportResultsRequest(results=[pb.ImportedResult()] * 30))
    assert e.value.details().count("results[") == 20 and e.value.details().endswith(f"; and {30 * 8 - 20} more")
    assert len(imported(coord)) == before


def test_a_file_too_large_for_one_request_is_refused_before_sending(coord, llama_bench_output, tmp_path):
    row = llama_bench_output["jsonl"].read_text().splitlines()[0]
    big = tmp_path / "big.jsonl"
    big.write_text("".join(row.replace('"avg_ns": ', f'"avg_ns": {i}, "was": ') + "\n" for i in range(4000)))
    before = len(imported(coord))
    result = run_import(coord, "llama-bench", str(big), check=False)
    assert result.returncode == 1 and "big.jsonl: 4000 results make a" in result.stderr
    assert "split the file; nothing was imported" in result.stderr and len(imported(coord)) == before


def test_at_most_max_import_rows_per_request():
    too_many = limits.MAX_IMPORT_ROWS + 1
    request = pb.ImportResultsRequest(results=[pb.ImportedResult()] * too_many)
    assert limits.problems(request) == [f"results: {too_many} items; at most {limits.MAX_IMPORT_ROWS}"]


def test_imported_results_are_not_runs_and_change_no_speedup(tmp_path, llama_bench_output):
    """A fleet's paired speedup, then imports of a baseline (llama-bench) and MTP figures (mtplx)
    for a machine of the same chip: `runs` and every speedup stay as they were."""
    coordinator = start_in_process(tmp_path / "coordinator")
    try:
        agent = enrol(coordinator, "m1", fingerprint=M1_MAX)
        admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
        job = agent.acquire_job(1).job
        runs = [make_run(job.job_id, "baseline", tps=100.0), make_run(job.job_id, "draft", 2, tps=150.0)]
        for run in runs:
            agent.report_result(job.job_id, job.lease_id, run)
        agent.complete_job(job.job_id, job.lease_id, len(runs))

        def fleet_figures():
            with coordinator.store.tx() as con:
                count = con.execute("SELECT count(*) FROM runs").fetchone()[0]
                return count, speedup.speedups(con).to_dict("records")

        before = fleet_figures()
        assert before[0] == 2 and [round(s["speedup"], 6) for s in before[1]] == [1.5]
        coord = (f"127.0.0.1:{coordinator.port}", coordinator.config.data_dir)
        run_import(coord, "llama-bench", str(llama_bench_output["jsonl"]), "--machine-note", "Apple M1 Max")
        run_import(coord, "mtplx", str(MTPLX_RUN), "--machine-note", "Apple M1 Max")
        assert len(imported(coord)) == 7
        assert fleet_figures() == before
    finally:
        coordinator.stop()

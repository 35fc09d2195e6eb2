"""Migration 002 on a database written by the schema-1 code: every stored run is kept, readable
through the new schema, with what schema 1 recorded read into the typed columns.

tests/captured/store-schema1.duckdb.gz is the coordinator file of a `specfleet demo` run by the
previous release (commit 4fbdef3): 170 runs of every method and both engines, verify cost
included, schema version 1, in DuckDB 2.0.1's storage format. The pinned DuckDB (pyproject.toml)
cannot read that format: the file goes through `specfleet store convert` first, as a user's would
(coordinator/convert.py; tests/test_store_convert.py tests the conversion itself)."""

import gzip
import shutil
from pathlib import Path

import duckdb
import pytest

from cli.main import main
from coordinator.store import Store, migrations
from specfleet import speedup
from specfleet.record import RunRecord

CAPTURED = Path(__file__).parent / "captured" / "store-schema1.duckdb.gz"


pytestmark = pytest.mark.process  # the conversion runs DuckDB 2.0.1 in a process of its own


@pytest.fixture
def old_db(tmp_path) -> Path:
    data = tmp_path / "coordinator"
    data.mkdir()
    with gzip.open(CAPTURED) as src, open(data / "specfleet.duckdb", "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert main(["store", "convert", str(data / "specfleet.duckdb")]) == 0
    return data


def old_runs(path: Path) -> dict[str, tuple]:
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == 1
    rows = con.execute(
        "SELECT run_id, method, depth, decode_tokens_per_second, prompt_tokens, lossless, seq,"
        " params->>'model.target' AS path, params->>'model.target.sha256' AS digest,"
        " params->>'env.nominal' AS nominal, params->>'sampler' AS sampler,"
        " metrics->>'acceptance_at_position_1' AS acceptance_1, metrics->>'rows_2_seconds' AS rows_2,"
        " params->>'attempt' AS attempt FROM runs"
    ).fetchall()
    con.close()
    return {r[0]: r[1:] for r in rows}


def test_migration_keeps_every_schema_1_run_readable_through_the_new_schema(old_db):
    before = old_runs(old_db / "specfleet.duckdb")
    assert len(before) == 170

    store = Store(old_db)  # opening migrates
    with store.tx() as con:
        assert con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == migrations()[-1][0]
        result = con.execute("SELECT * FROM runs")
        names = [d[0] for d in result.description]
        rows = [dict(zip(names, values)) for values in result.fetchall()]
        figures = speedup.speedups(con)
    store.close()
    assert {r["run_id"] for r in rows} == set(before)
    for row in rows:
        method, depth, tps, prompt_tokens, lossless, seq, path, digest, nominal, sampler, acc1, rows_2, attempt = (
            before[row["run_id"]]
        )
        assert (row["method"], row["depth"], row["decode_tokens_per_second"], row["seq"]) == (method, depth, tps, seq)
        assert row["lossless"] == lossless and row["attempt"] == int(attempt)
        assert row["target_reference"] == Path(path).name and row["target_digest"] == digest  # a name, not a path
        assert "/" not in row["draft_reference"]
        assert sampler == (
            f"temperature={row['sampler_temperature']},top_p={row['sampler_top_p']},"
            f"top_k={row['sampler_top_k']},seed={row['sampler_seed']}"
        )
        assert row["env_nominal"] is not True or nominal == "true"  # never nominal where schema 1 said not
        if acc1 is not None:
            assert row["acceptance_by_position"][0] == pytest.approx(float(acc1))
        if method == "verify-cost":
            assert row["verify_cost_seconds"][1] == pytest.approx(float(rows_2))
            assert row["context_tokens"] == prompt_tokens
        else:
            assert row["prompt_category"] in ("conversation", "code") and row["engine_version"]
        # Readable through the new schema: every stored row is a valid RunRecord.
        record = RunRecord.from_row(row)
        assert record.run_id == row["run_id"] and record.target.digest == digest
    # Schema-1 runs compare through the one definition too: every arm of every job has a figure.
    arms = {(r["job_id"], r["method"], r["depth"]) for r in rows if r["method"] not in ("baseline", "verify-cost")}
    assert len(figures) == len(arms) and (figures.speedup > 0).all() and (figures.machines == 1).all()

"""The dashboard's mirror follows the coordinator incrementally: new rows arrive, changed rows
replace their old versions, nothing is counted twice; each table's sequence moves only when
that table changed."""

from pathlib import Path

from dashboard.mirror import Mirror
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.record import RunRecord
from tests.support.fleet import SWEEP_YAML, admin_for, enrol, make_run, start_coordinator


def test_incremental_sync(tmp_path):
    coordinator = start_coordinator(tmp_path / "c")
    try:
        admin = admin_for(coordinator)
        agent = enrol(coordinator, "mini")
        mirror = Mirror(admin, derived={"runs": "upper(method) AS shout"}, path=tmp_path / "mirror.duckdb")
        first = mirror.sync()
        # Not heard from yet: enrolled.
        assert mirror.query("SELECT name, state FROM agents").values.tolist() == [["mini", "enrolled"]]
        assert mirror.query("SELECT * FROM runs").empty  # not arrived yet: empty, not an error

        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
        job = agent.acquire_job(1).job
        for repeat in range(3):
            agent.report_result(job.job_id, job.lease_id, make_run(job.job_id, repeat=repeat))
        second = mirror.sync()
        assert second["runs"] > first.get("runs", 0) and second["agents"] > first["agents"]
        assert mirror.query("SELECT count(*) AS n FROM runs")["n"][0] == 3
        assert mirror.query("SELECT DISTINCT shout FROM runs")["shout"].tolist() == ["BASELINE"]  # derived as it came
        assert mirror.query("SELECT state FROM agents")["state"].tolist() == ["busy"]
        # the typed run record's columns arrive as they are stored: lists as lists, NULL as NULL
        columns = mirror.query("DESCRIBE runs").set_index("column_name")["column_type"]
        assert set(RunRecord.columns()) <= set(columns.index)
        assert columns["acceptance_by_position"] == "DOUBLE[]" and columns["drafted_by_position"] == "INTEGER[]"
        assert columns["env_reasons"] == "VARCHAR[]" and columns["env_nominal"] == "BOOLEAN"
        assert not {"params", "metrics"} & set(columns.index)

        agent.complete_job(job.job_id, job.lease_id, 3)
        third = mirror.sync()
        assert third["jobs"] > second["jobs"] and mirror.sync() == third  # nothing new: same sequences
        assert third["runs"] == second["runs"]  # no new run: the runs' figures need not be recomputed
        assert mirror.query("SELECT count(*) AS n FROM runs")["n"][0] == 3
        assert mirror.query("SELECT state FROM agents")["state"].tolist() == ["idle"]
        assert mirror.query("SELECT state FROM jobs")["state"].tolist() == ["done"]
        assert mirror.query("SELECT state FROM sweeps")["state"].tolist() == ["done"]
        assert "credential_hash" not in mirror.query("SELECT * FROM agents").columns
    finally:
        coordinator.stop()


def test_the_default_mirror_is_a_temporary_file_removed_on_close(tmp_path):
    coordinator = start_coordinator(tmp_path / "c")
    try:
        mirror = Mirror(admin_for(coordinator))
        mirror.sync()
        (path,) = [
            Path(p) for (p,) in mirror.con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchall()
        ]
        assert path.exists() and path.name == "mirror.duckdb"
        assert mirror.con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "244.1 MiB"
        mirror.close()
        assert not path.parent.exists()
    finally:
        coordinator.stop()


def test_a_mirror_never_closed_leaves_no_directory_behind():
    """A dashboard holds its mirror until its process ends and never closes it: the temporary
    directory goes when the mirror does (at exit, or when collected), as close() removes it."""
    import gc

    kept, closed = Mirror(None), Mirror(None)
    directories = [Path(kept._tmp), Path(closed._tmp)]
    assert all(d.is_dir() and (d / "mirror.duckdb").exists() for d in directories)
    closed.close()
    assert not directories[1].exists()
    kept.con.close()
    del kept
    gc.collect()
    assert not directories[0].exists()

"""A coordinator that cannot use its data directory says so in one line naming the directory and
why (a read-only file system, a file, a database in use or not DuckDB's), never "internal error"."""

import os
import subprocess
from pathlib import Path

import pytest

from coordinator.store import DataDirUnusable, Store
from tests.support.processes import cli, one_line_error, start_coordinator, stop

pytestmark = pytest.mark.process


def serve(data_dir: Path) -> subprocess.CompletedProcess:
    return cli("coordinator", "serve", "--data-dir", str(data_dir), "--port", "0", "--metrics-port", "-1",
               check=False, timeout=60)  # fmt: skip


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a read-only file system (a tmpfs mounted read-only: needs root)."""
    where = tmp_path / "ro"
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)]).returncode
    ):
        pytest.skip("mounting a read-only tmpfs needs root")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_read_only_data_directory_is_named_in_one_line(read_only_dir):
    for data_dir in (read_only_dir, read_only_dir / "below"):
        with pytest.raises(DataDirUnusable) as refused:
            Store(data_dir)
        message = str(refused.value)
        assert message.startswith(f"cannot use {data_dir} as the coordinator's data directory")
        assert "read-only file system" in message and "\n" not in message


def test_every_unusable_data_directory_is_one_line_naming_it(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    not_duckdb = tmp_path / "not-duckdb"
    not_duckdb.mkdir()
    (not_duckdb / "specfleet.duckdb").write_text("garbage")
    for data_dir, why in ((a_file, "it is a file, not a directory"), (not_duckdb, "is not a DuckDB database file")):
        line = one_line_error(serve(data_dir), str(data_dir), why)
        assert "internal error" not in line
    serving = tmp_path / "serving"
    proc, _ = start_coordinator(serving)
    try:
        line = one_line_error(serve(serving), str(serving), f"in use by process {proc.pid}")
        assert "internal error" not in line
    finally:
        assert stop(proc) == 0

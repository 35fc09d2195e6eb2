"""A coordinator file written by another DuckDB than the pinned one (coordinator/convert.py): the
coordinator refuses it by name, with the DuckDB that wrote it and the command that converts it,
changing nothing; `specfleet store convert` carries every row over and keeps the old file.

The input is tests/captured/store-schema1.duckdb.gz, a coordinator file that DuckDB 2.0.1 wrote
(the project's duckdb before the pin to 1.5.5); the conversion runs 2.0.1 from the registry."""

import gzip
import hashlib
import shutil
from pathlib import Path

import duckdb
import pytest

from cli.main import main
from coordinator import convert
from coordinator.store import DB_FILENAME, DataDirUnusable, Store, open_readonly

CAPTURED = Path(__file__).parent / "captured" / "store-schema1.duckdb.gz"
ROWS = {"admin_credentials": 1, "agents": 1, "jobs": 5, "runs": 170, "schema_migrations": 1, "sweeps": 3, "tokens": 1}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def data_dir(tmp_path) -> Path:
    data = tmp_path / "coordinator"
    data.mkdir()
    with gzip.open(CAPTURED) as src, open(data / DB_FILENAME, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return data


def test_the_header_names_the_duckdb_that_wrote_the_file(data_dir, tmp_path):
    assert convert.read_header(data_dir / DB_FILENAME) == convert.Header(999, "2.0.1")
    mine = tmp_path / "mine.duckdb"
    duckdb.connect(str(mine)).close()
    assert convert.read_header(mine).library_version == duckdb.__version__
    (tmp_path / "text").write_text("not a database, but long enough to hold a header" * 4)
    assert convert.read_header(tmp_path / "text") is None


def test_a_file_of_another_duckdb_is_refused_by_name_and_left_as_it_was(data_dir):
    path = data_dir / DB_FILENAME
    before = digest(path)
    for opening in (lambda: Store(data_dir), lambda: open_readonly(data_dir)):
        with pytest.raises(DataDirUnusable) as refused:
            opening()
        message = str(refused.value)
        assert f"{path} was written by DuckDB 2.0.1 (storage version 999)" in message
        assert f"DuckDB {duckdb.__version__} cannot read" in message
        assert f"`specfleet store convert {path}`" in message
    assert digest(path) == before and sorted(p.name for p in data_dir.iterdir()) == [DB_FILENAME]


@pytest.mark.process  # DuckDB 2.0.1 exports in a process of its own (uv run)
def test_convert_carries_every_row_and_keeps_the_old_file(data_dir, capsys):
    path = data_dir / DB_FILENAME
    before = digest(path)
    assert main(["store", "convert", str(path)]) == 0
    kept = convert.kept_path(path, "2.0.1")
    assert f"the old file is {kept}" in capsys.readouterr().out
    assert digest(kept) == before  # the old bytes, untouched
    assert convert.read_header(path).library_version == duckdb.__version__
    con = duckdb.connect(str(path), read_only=True)
    rows = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in ROWS}
    (last_seq,) = con.execute("SELECT max(seq) FROM runs").fetchone()
    (start,) = con.execute("SELECT start_value FROM duckdb_sequences() WHERE sequence_name = 'ingest_seq'").fetchone()
    con.close()
    assert rows == ROWS
    assert start > last_seq  # new rows get numbers after every stored one
    assert sorted(p.name for p in data_dir.iterdir()) == sorted([DB_FILENAME, kept.name])  # no scratch left

    # A second conversion refuses, and changes nothing; so does one whose old file would be overwritten.
    converted = digest(path)
    assert main(["store", "convert", str(path)]) == 1
    assert "the pinned one: nothing to convert" in capsys.readouterr().err
    shutil.copy(kept, path)
    assert main(["store", "convert", str(path)]) == 1
    assert f"{kept} exists already" in capsys.readouterr().err
    assert digest(path) == digest(kept) == before != converted

    # The converted file serves: the coordinator opens (and migrates) it.
    shutil.move(kept, path)
    assert main(["store", "convert", str(path)]) == 0
    Store(data_dir).close()


@pytest.mark.process  # uv is asked for a DuckDB that does not exist
def test_a_failed_export_leaves_the_file_and_no_scratch(data_dir):
    path = data_dir / DB_FILENAME
    before = digest(path)
    with pytest.raises(convert.ConvertError, match=f"DuckDB 9.9.9 could not export {path}"):
        convert.convert(path, from_version="9.9.9")
    assert digest(path) == before and sorted(p.name for p in data_dir.iterdir()) == [DB_FILENAME]

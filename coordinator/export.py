"""Export runs for anyone's notebook: one row per run, one column per field of the run record
(specfleet/record.py) and the coordinator's own. Parquet keeps list columns (acceptance by
position, verify-cost times, reasons) as lists; CSV writes them as JSON arrays."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb


def arrow_from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(io.BytesIO(data)).read_all()


def pages(admin, table: str, after_seq: int = 0) -> Iterator[tuple[pa.Table, int]]:
    """The rows of a coordinator table above after_seq, one Export page at a time (at most
    MAX_EXPORT_ROWS rows each): (page, its last seq)."""
    while True:
        resp = admin.Export(pb.ExportRequest(table=table, after_seq=after_seq), timeout=120)
        if resp.rows == 0:
            return
        after_seq = resp.last_seq
        yield arrow_from_ipc(resp.arrow_ipc), after_seq


def fetch_table(admin, table: str, after_seq: int = 0) -> tuple[pa.Table | None, int]:
    """Every row of a coordinator table above after_seq; (table or None, last seq)."""
    parts, seqs = [], [after_seq]
    for page, seq in pages(admin, table, after_seq):
        parts.append(page)
        seqs.append(seq)
    return (pa.concat_tables(parts) if parts else None), seqs[-1]


def _write(table: pa.Table, output: Path, fmt: str) -> int:
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(table, output)
    elif fmt == "csv":
        for i, field in enumerate(table.schema):
            if pa.types.is_list(field.type):
                text = [None if v is None else json.dumps(v) for v in table.column(i).to_pylist()]
                table = table.set_column(i, field.name, pa.array(text, pa.string()))
        pa_csv.write_csv(table, output)
    else:
        raise ValueError(f"unknown export format {fmt!r} (parquet or csv)")
    return table.num_rows


def export_from_coordinator(admin, output: Path, fmt: str) -> int:
    table, _ = fetch_table(admin, "runs")
    if table is None:
        raise ValueError("the coordinator holds no runs yet; nothing to export")
    return _write(table, output, fmt)


def export_from_data_dir(data_dir: Path, output: Path, fmt: str) -> int:
    con = open_readonly(data_dir)
    try:
        table = con.sql("SELECT * FROM runs ORDER BY seq").to_arrow_table()
    finally:
        con.close()
    if table.num_rows == 0:
        raise ValueError(f"{data_dir} holds no runs yet; nothing to export")
    return _write(table, output, fmt)

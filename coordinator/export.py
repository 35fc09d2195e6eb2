"""Export runs for anyone's notebook: one row per run, one column per field of the run record
(specfleet/record.py) and the coordinator's own. Parquet keeps list columns (acceptance by
position, verify-cost times, reasons) as lists; CSV writes them as JSON arrays."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from coordinator.store import open_readonly
from specfleet.client import fetch_table


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

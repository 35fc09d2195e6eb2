"""Export runs for anyone's notebook: one row per run, every parameter and metric a column."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb


def flatten(runs: pd.DataFrame) -> pd.DataFrame:
    """Spread the metrics and params JSON columns into metric.* and param.* columns."""
    out = runs.drop(columns=["metrics", "params"])
    for column, prefix in (("metrics", "metric."), ("params", "param.")):
        expanded = pd.DataFrame([json.loads(v) for v in runs[column]], index=runs.index).add_prefix(prefix)
        out = out.join(expanded)
    return out


def arrow_from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(io.BytesIO(data)).read_all()


def fetch_table(admin, table: str, after_seq: int = 0) -> tuple[pa.Table | None, int]:
    """Every row of a coordinator table above after_seq, page by page; (table or None, last seq)."""
    parts = []
    while True:
        resp = admin.Export(pb.ExportRequest(table=table, after_seq=after_seq), timeout=120)
        if resp.rows == 0:
            break
        parts.append(arrow_from_ipc(resp.arrow_ipc))
        after_seq = resp.last_seq
    return (pa.concat_tables(parts) if parts else None), after_seq


def _write(df: pd.DataFrame, output: Path, fmt: str) -> int:
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        df.to_parquet(output, index=False)
    elif fmt == "csv":
        df.to_csv(output, index=False)
    else:
        raise ValueError(f"unknown export format {fmt!r} (parquet or csv)")
    return len(df)


def export_from_coordinator(admin, output: Path, fmt: str) -> int:
    table, _ = fetch_table(admin, "runs")
    if table is None:
        raise ValueError("the coordinator holds no runs yet; nothing to export")
    return _write(flatten(table.to_pandas()), output, fmt)


def export_from_data_dir(data_dir: Path, output: Path, fmt: str) -> int:
    con = open_readonly(data_dir)
    try:
        df = con.execute("SELECT * FROM runs ORDER BY seq").df()
    finally:
        con.close()
    if df.empty:
        raise ValueError(f"{data_dir} holds no runs yet; nothing to export")
    return _write(flatten(df), output, fmt)

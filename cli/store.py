"""`specfleet store convert FILE`: a coordinator's DuckDB file written by another DuckDB than the
pinned one, carried into the pinned one's format (coordinator/convert.py); the old file is kept
beside it. A coordinator that cannot open its file names this command."""

from __future__ import annotations

from pathlib import Path


def cmd_convert(args) -> int:
    from coordinator import convert

    done = convert.convert(Path(args.file), args.from_version)
    rows = ", ".join(f"{table} {count}" for table, count in sorted(done.rows.items()))
    print(f"converted {done.path} from DuckDB {done.from_version}: {rows} rows; the old file is {done.kept}")
    return 0


def add_parsers(sub, flag) -> None:
    """`store convert` under the top-level subcommands."""
    store = sub.add_parser("store", help="the coordinator's DuckDB file").add_subparsers(dest="sub", required=True)
    p = store.add_parser("convert", help="carry a file written by another DuckDB into the pinned one's format")
    p.add_argument("file", help="the file (--data-dir's specfleet.duckdb), with its coordinator stopped")
    what = "the DuckDB that wrote it, where its header names none"
    flag(p, "--from-version", env="STORE_CONVERT_FROM_VERSION", default=None, help=what)
    p.set_defaults(fn=cmd_convert)

"""Importers of results people already measured with other tools: `llama_bench` (its json,
jsonl, csv and sql output) and `mtplx` (a `mtplx bench run` directory and `mtplx tune`
results). Each parses on the importer's machine, reads fields by name, validates every row and
returns `ImportedResult`s (result.py), or raises `BadFile` naming the file, line and field of
the first problem; `specfleet import` sends the rows to the coordinator in one call."""

LLAMA_BENCH_FORMATS = ("json", "jsonl", "csv", "sql")  # llama-bench -o ... (md is for people, not imports)

"""The H200 fleet sweep's figures, from its export in this folder (bench/README.md, "NVIDIA H200").

    .venv/bin/python bench/h200/summary.py [bench/h200/sweep]

sweep/ holds what bench/gpu_sweep.py exported on the lent H200 (runs, jobs and agents as Parquet,
the agent's fingerprint as JSON): two calls' coordinators, the demo's sweeps on llama.cpp (CUDA),
llama-server (CUDA) and MLX (its CPU build). Printed: per engine, model and arm the median decode
tok/s, its ratio to the same engine's baseline on the same model (not paired: a summary), the
acceptance, whether every run was lossless, and NVML's joules per generated token (the GPU's
energy: for MLX on the CPU it is the idle GPU's, not the work's); then the verify-cost curves
T(M)/T(1) for M = 1..16 at 128 and 4080 tokens of context.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path(__file__).resolve().parent / "sweep"
    runs = pq.read_table(folder / "runs.parquet").to_pandas()
    fingerprint = json.loads((folder / "fingerprint.json").read_text())
    print(f"machine: {fingerprint['chip']}, {fingerprint['cpuCores']} cores; GPU: {'; '.join(fingerprint['gpus'])}")
    arms = runs[runs.method != "verify-cost"]
    keys = ["engine", "backend", "target_reference", "max_new_tokens", "method", "depth"]
    table = arms.groupby(keys, dropna=False).agg(
        runs=("run_id", "size"),
        tps=("decode_tokens_per_second", "median"),
        joules_per_token=("joules_per_token", "median"),
        accepted=("tokens_accepted", "sum"),
        drafted=("tokens_drafted", "sum"),
        lossless=("lossless", "all"),
    )
    print(
        f"\n{'engine':12} {'backend':7} {'model':16} {'n':>4} {'method':10} {'K':>2} {'runs':>4} {'tok/s':>8} "
        f"{'/base':>6} {'accept':>6} {'lossless':>8} {'J/token':>8} {'tok/J':>6}"
    )
    for key, row in table.iterrows():
        engine, backend, model, n, method, depth = key
        base = table.loc[(engine, backend, model, n, "baseline", 0), "tps"]
        accept = f"{row.accepted / row.drafted:.2f}" if row.drafted else "-"
        print(
            f"{engine:12} {backend or '-':7} {model:16} {n:4} {method:10} {depth:2} {row.runs:4} {row.tps:8.1f} "
            f"{row.tps / base:6.2f} {accept:>6} {'yes' if row.lossless else 'NO':>8} "
            f"{row.joules_per_token:8.3f} {1 / row.joules_per_token:6.1f}"
        )
    print("\nverify cost T(M)/T(1), M = 1..16 (T(1) in ms)")
    for _, row in runs[runs.method == "verify-cost"].iterrows():
        t = list(row.verify_cost_seconds)
        curve = " ".join(f"{x / t[0]:.2f}" for x in t)
        print(f"{row.engine:10} {row.backend:5} context {row.context_tokens:5}: T(1) {t[0] * 1e3:.2f} ms; {curve}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

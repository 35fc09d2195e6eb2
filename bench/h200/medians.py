"""The median and range of every bench/overhead.py figure over the runs in H200 call logs.

    python3 bench/h200/medians.py bench/h200/call9.log bench/h200/call10.log

Each `overhead` stage of bench/h200.sh prints one run (medians of its own repeats); this reads
every run in the logs given and prints, per figure, the median over the runs, their range and
each run's value, in the order bench/README.md's H200 table lists them.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

RUN_HEADER = "tokens, medians of"
BASELINE = re.compile(
    r"^(\w+)\s+fa on: ours\s+([\d.]+) bench\s+([\d.]+) \(([\d.]+)\) \| fa off: ours\s+([\d.]+) bench\s+([\d.]+) "
    r"\(([\d.]+)\) \| server\s+([\d.]+) \(ours/server ([\d.]+)",
    re.M,
)
BEYOND = re.compile(r"outside forward passes beyond one argmax of the row, (\w+): ([\d.]+) - ([\d.]+)")
OUTSIDE = re.compile(r"outside forward passes, (\w+): ([\d.]+) us/token <= ")
# llama-bench on an empty context beside the one at the prompt's depth (bench/overhead.py since call 12)
DEPTH0 = re.compile(
    r"^(\w+)\s+fa on: .* llama-bench at depth \d+ \(above\) or 0: fa on ([\d.]+) \(ours/bench ([\d.]+)\)", re.M
)
SERVERS = re.compile(r"^(ngram-mod K=8|mtp K=2 / draft-mtp)\s+ours/llama-server ([\d.]+)", re.M)


def figures(run: str) -> dict[str, float]:
    out = {}
    for m in BASELINE.finditer(run):
        model = m.group(1)
        out[f"{model} ours/llama-bench fa on"] = float(m.group(4))
        out[f"{model} ours/llama-bench fa off"] = float(m.group(7))
        out[f"{model} ours/llama-server"] = float(m.group(9))
        out[f"{model} llama-bench fa on tok/s"] = float(m.group(3))
    for m in DEPTH0.finditer(run):
        out[f"{m.group(1)} llama-bench fa on at depth 0 tok/s"] = float(m.group(2))
        out[f"{m.group(1)} ours/llama-bench fa on, bench at depth 0"] = float(m.group(3))
    for model, us in OUTSIDE.findall(run):
        out[f"{model} outside us/token (runs' means)"] = float(us)
    for model, step, argmax in BEYOND.findall(run):
        out[f"{model} median step outside us"] = float(step)
        out[f"{model} argmax after a decode us"] = float(argmax)
    for arm, r in SERVERS.findall(run):
        out[f"{arm} ours/llama-server"] = float(r)
    return out


def main(paths: list[str]) -> int:
    text = "".join(Path(p).read_text() for p in paths)
    runs = [figures(run) for run in text.split(RUN_HEADER)[1:]]
    runs = [r for r in runs if r]
    print(f"{len(runs)} runs")
    for key in dict.fromkeys(k for r in runs for k in r):
        values = [r[key] for r in runs if key in r]
        print(
            f"{key:44} median {statistics.median(values):9.3f}  range {min(values):.3f}-{max(values):.3f}  "
            f"({' '.join(f'{v:g}' for v in values)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

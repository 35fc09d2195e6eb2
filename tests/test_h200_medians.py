"""bench/h200/medians.py reads bench/overhead.py's runs out of the H200 call logs (bench/README.md's
table is its output): on call 12's captured log, every run and its figures, the llama-bench
figures at the prompt's depth and at depth 0 told apart."""

import importlib.util
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _medians():
    spec = importlib.util.spec_from_file_location("h200_medians", ROOT / "bench/h200/medians.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runs(module, log: str) -> list[dict]:
    text = (ROOT / "bench/h200" / log).read_text()
    return [r for r in map(module.figures, text.split(module.RUN_HEADER)[1:]) if r]


def test_call12_runs_and_their_figures():
    runs = _runs(_medians(), "call12.log")
    assert len(runs) == 5
    assert [r["tiny ours/llama-bench fa on"] for r in runs] == [0.94, 0.926, 0.962, 1.057, 1.055]
    assert statistics.median(r["tiny ours/llama-bench fa on"] for r in runs) == 0.962
    assert [r["tiny ours/llama-bench fa on, bench at depth 0"] for r in runs] == [0.869, 0.889, 0.871, 0.884, 0.893]
    assert runs[0]["tiny llama-bench fa on at depth 0 tok/s"] > runs[0]["tiny llama-bench fa on tok/s"]
    assert [r["mtp K=2 / draft-mtp ours/llama-server"] for r in runs] == [1.183, 1.15, 1.393, 1.174, 1.268]
    assert runs[2]["151k argmax after a decode us"] == 21.0


def test_logs_before_the_depth_have_no_depth_figures():
    runs = _runs(_medians(), "call11.log")
    assert len(runs) == 3
    assert [r["tiny ours/llama-bench fa on"] for r in runs] == [0.811, 0.865, 0.942]
    assert not any("depth 0" in key for r in runs for key in r)

"""Are our greedy speculative arms lossless on this machine, in every greedy sampling mode
(agent/engines/llamacpp.py GREEDY: in the graph on the device, in place, through llama.cpp's
sampler chain)? (The H200 sweep found llama.cpp's ngram K=3 on the tiny
hybrid not lossless on CUDA; this tells an engine fault from the in-place argmax of issue 28.)

    python3 bench/h200/lossless.py TINY_DIR

For each of the qa prompt set's first prompts, the baseline's tokens against each arm's, with
each greedy mode, and each mode's baseline against the chain's: the first position where they
differ, or "same"."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.engines import llamacpp, make_engine  # noqa: E402
from agent.engines.base import Request  # noqa: E402
from cli.tiny import make_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def first_difference(a, b) -> str:
    return next((f"differ at {i}" for i, (x, y) in enumerate(zip(a, b)) if x != y), "same")


def main() -> int:
    tiny = make_tiny(Path(sys.argv[1]))
    texts = [p["text"] for p in yaml.safe_load((ROOT / "specfleet/prompt_sets/qa.yaml").read_text())["prompts"][:4]]
    for target, draft, arms in (
        (tiny.gguf_mtp_hybrid, tiny.gguf_mtp_hybrid_draft, [("ngram", 3), ("draft", 2), ("mtp", 2)]),
        (tiny.gguf_target, tiny.gguf_draft, [("ngram", 3), ("draft", 4)]),
    ):
        engine = make_engine("llama.cpp")
        engine.load(str(target), str(draft))
        for n in (32, 128):
            for i, text in enumerate(texts):
                prompt = engine.tokenize(text)
                cells, bases = [], {}
                for mode in llamacpp.GREEDY_MODES:
                    llamacpp.GREEDY = mode
                    base = bases[mode] = engine.generate(Request(prompt, n)).tokens
                    for method, k in arms:
                        tokens = engine.generate(Request(prompt, n, method, k)).tokens
                        cells.append(f"{method}{k} {mode}: {first_difference(base, tokens)}")
                for mode in llamacpp.GREEDY_MODES[:-1]:
                    cells.append(f"baseline {mode} vs chain: {first_difference(bases[mode], bases['chain'])}")
                print(f"{target.name} {n} tokens, prompt {i}: " + "; ".join(cells), flush=True)
        engine.close()
    llamacpp.GREEDY = "device"
    return 0


if __name__ == "__main__":
    sys.exit(main())

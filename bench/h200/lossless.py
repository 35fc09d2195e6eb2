"""Are our greedy speculative arms lossless on this machine, with greedy sampling in place and
through llama.cpp's sampler chain alike? (The H200 sweep found llama.cpp's ngram K=3 on the tiny
hybrid not lossless on CUDA; this tells an engine fault from the in-place argmax of issue 28.)

    python3 bench/h200/lossless.py TINY_DIR

For each of the qa prompt set's first prompts, the baseline's tokens against each arm's, with
GREEDY_IN_PLACE on and off: the first position where they differ, or "same"."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.engines import llamacpp, make_engine  # noqa: E402
from agent.engines.base import Request  # noqa: E402
from cli.tinymodels import make_tiny  # noqa: E402

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
                cells = []
                for in_place in (True, False):
                    llamacpp.GREEDY_IN_PLACE = in_place
                    base = engine.generate(Request(prompt, n)).tokens
                    for method, k in arms:
                        tokens = engine.generate(Request(prompt, n, method, k)).tokens
                        cells.append(f"{method}{k} {'np' if in_place else 'chain'}: {first_difference(base, tokens)}")
                    if in_place:
                        llamacpp.GREEDY_IN_PLACE = False
                        chain_base = engine.generate(Request(prompt, n)).tokens
                        cells.append(f"baseline np vs chain: {first_difference(base, chain_base)}")
                print(f"{target.name} {n} tokens, prompt {i}: " + "; ".join(cells), flush=True)
        engine.close()
    llamacpp.GREEDY_IN_PLACE = True
    return 0


if __name__ == "__main__":
    sys.exit(main())

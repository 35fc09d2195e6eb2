"""Llama GGUFs with real vocabulary sizes, for the loop's cost per token (bench/overhead.py).

    python3 bench/shaped.py DIR [--trunk tiny|smol]

The loop's own work per token that grows with the vocabulary is sampling over a logits row, so
the tiny models' 512 tokens hide it. These models keep the tiny models' byte-level BPE
vocabulary (the same token ids for the same text) and pad it with filler tokens up to
SmolLM2's 49,152 and Qwen2.5's and Qwen3's 151,936, with random float32 weights
(cli/tinymodels.py random_weights, seeded: the same bytes every time). The trunk is the tiny
target's (4 layers of 128: forward passes stay cheap, so the loop's share shows) or, with
`--trunk smol`, SmolLM2-135M's (30 layers of 576, 9 heads, 3 KV heads, 1,536 MLP; 135 M
parameters at 49k tokens), the model the issue measured on the H200.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli import tinymodels  # noqa: E402

VOCABS = {"49k": 49_152, "151k": 151_936}
TRUNKS = {
    "tiny": tinymodels.TARGET_SHAPE,
    "smol": tinymodels.LlamaShape(layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536),
}
SEED = 4321


def padded_vocab(size: int) -> tinymodels.Vocab:
    """The tiny vocabulary (its ids unchanged) and filler tokens after it, `size` in all."""
    base = tinymodels.build_vocab()
    fillers = tuple(f"<|filler{i}|>" for i in range(size - base.size))  # printable ASCII: byte-level safe
    return tinymodels.Vocab(base.tokens + fillers, base.merges, base.bos_id, base.eos_id)


def make_shaped(directory: Path, vocab: str, trunk: str = "tiny") -> Path:
    """directory/<trunk>-<vocab>.gguf, written once (a complete file is kept)."""
    path = Path(directory) / f"{trunk}-{vocab}.gguf"
    if path.exists():
        return path
    words = padded_vocab(VOCABS[vocab])
    shape = TRUNKS[trunk]
    weights = tinymodels.random_weights(shape, words.size, SEED)
    partial = path.with_suffix(".partial")
    tinymodels.write_gguf(partial, shape, weights, words)
    partial.rename(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--trunk", choices=TRUNKS, default="tiny")
    args = parser.parse_args(argv)
    for vocab in VOCABS:
        print(make_shaped(args.directory, vocab, args.trunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())

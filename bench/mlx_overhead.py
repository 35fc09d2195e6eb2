"""MLX's decode loop against mlx_lm.stream_generate at real vocabulary sizes (issue 40, item 4).

    python3 bench/mlx_overhead.py [--shaped DIR] [--tokens 128] [--repeats 7]

bench/shaped.py's GGUFs (the tiny trunk, 49,152 and 151,936 tokens) as MLX model directories
(cli/gguf_to_mlx.py), loaded once each in agent/engines/mlx.py; our greedy baseline and
`ref-baseline` (mlx_lm.stream_generate with the same end-of-generation ban) run alternately after
two warm-ups each, on the same prompt tokens. Printed per model: the medians of each side's
decode time per token and their difference (the per-token cost of our loop beyond the
library's, negative where ours is cheaper), the paired ratio of tok/s, whether both gave the same
tokens, and one `mx.argmax` over a logits row of that vocabulary evaluated alone (the floor of a
greedy step's host-visible work). MLX evaluates lazily, so a forward pass cannot be timed apart
from the loop around it as bench/overhead.py does for llama.cpp: the library's own loop is the
measure set beside ours instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from agent.engines import make_engine  # noqa: E402
from agent.engines.base import Request  # noqa: E402
from bench.servers import PROMPT  # noqa: E402
from bench.shaped import VOCABS, make_shaped  # noqa: E402
from cli.gguf_to_mlx import convert  # noqa: E402


def per_token(gen) -> float:
    times = gen.token_times_seconds
    return (times[-1] - times[0]) / (len(times) - 1)


def argmax_seconds(vocab: int, repeats: int = 200) -> float:
    row = mx.random.normal((1, vocab))
    mx.eval(row)
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(mx.argmax(row, axis=-1))
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shaped", type=Path, default=Path(".data/shaped"))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"{args.tokens} tokens, medians of {args.repeats} pairs; mlx {mx.__version__}, {mx.default_device()}")
    for name, size in VOCABS.items():
        directory = args.shaped / f"tiny-{name}-mlx"
        if not (directory / "config.json").exists():
            convert(make_shaped(args.shaped, name), directory)
        engine = make_engine("mlx")
        engine.load(str(directory))
        prompt = engine.tokenize(PROMPT)
        ours, theirs = Request(prompt, args.tokens), Request(prompt, args.tokens, "ref-baseline")
        for _ in range(2):
            engine.generate(ours), engine.generate(theirs)
        pairs = [(engine.generate(ours), engine.generate(theirs)) for _ in range(args.repeats)]
        mine = statistics.median(per_token(a) for a, _ in pairs)
        lib = statistics.median(per_token(b) for _, b in pairs)
        ratio = statistics.median(per_token(b) / per_token(a) for a, b in pairs)
        same = all(a.tokens == b.tokens for a, b in pairs)
        print(
            f"{name:5} ours {mine * 1e6:8.1f} us/token, stream_generate {lib * 1e6:8.1f} us/token: ours beyond it "
            f"{(mine - lib) * 1e6:+7.1f} us/token, ours/theirs tok/s {ratio:.3f}, same tokens {same}; "
            f"one mx.argmax over {size} logits {argmax_seconds(size) * 1e6:.1f} us",
            flush=True,
        )
        del engine
    return 0


if __name__ == "__main__":
    sys.exit(main())

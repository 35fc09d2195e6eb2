"""Our decode loops against the libraries' own generation paths, on the same loaded models.

    .venv/bin/python bench/engines.py [--models DIR] [--tokens 128] [--repeats 15] [--depth 3]

For each pair (ours, the library's) the two arms run back to back, alternating which goes
first, after two warm-up runs each. Printed per pair: the median of the paired ratios of
decode tokens/s (ours / theirs; above 1 means our loop is faster) and of whole-generation
time (theirs / ours), with each arm's median decode tokens/s and acceptance.

    mlx        baseline vs mlx_lm.stream_generate                       (target >= 0.97)
    mlx        draft    vs mlx_lm.stream_generate(draft_model=...)     (target >= 1.0)
    llama.cpp  baseline vs Llama.generate                                (target >= 0.97)
    llama.cpp  ngram    vs Llama.generate + LlamaPromptLookupDecoding    (target >= 1.0)

Default models are the project's tiny ones (built on first use); point --models at a
directory from `specfleet models make-tiny` or pass --mlx/--gguf target and draft paths.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.engines import make_engine  # noqa: E402
from agent.engines.base import Request  # noqa: E402
from cli.tiny import make_tiny  # noqa: E402

# Prose on which the tiny target does not fall into a loop within 128 tokens (on a loop every
# proposal is accepted, which says nothing about the loops' costs).
PROMPT = (
    "Speculative decoding lets a small draft model propose several tokens that the large target model then "
    "checks in a single forward pass. When the draft agrees with the target"
)
PAIRS = {
    "mlx": [("baseline", "ref-baseline"), ("draft", "ref-draft")],
    "llama.cpp": [("baseline", "ref-baseline"), ("ngram", "ref-ngram")],
}
WARMUP_RUNS = 2


def decode_tps(gen) -> float:
    return (len(gen.tokens) - 1) / gen.decode_seconds


def wall(gen) -> float:
    return gen.prefill_seconds + gen.decode_seconds


def acceptance(gen) -> str:
    drafted = sum(r.drafted for r in gen.rounds)
    return f"{sum(r.accepted for r in gen.rounds) / drafted:.2f}" if drafted else "-"


def compare(engine, ours: Request, theirs: Request, repeats: int) -> dict:
    for request in (ours, theirs):
        for _ in range(WARMUP_RUNS):
            engine.generate(request)
    runs = {"ours": [], "theirs": []}
    for repeat in range(repeats):
        order = ("ours", "theirs") if repeat % 2 == 0 else ("theirs", "ours")
        for arm in order:
            runs[arm].append(engine.generate(ours if arm == "ours" else theirs))
    same = all(a.tokens == b.tokens for a, b in zip(runs["ours"], runs["theirs"]))
    return {
        "decode_ratio": statistics.median(decode_tps(a) / decode_tps(b) for a, b in zip(runs["ours"], runs["theirs"])),
        "wall_ratio": statistics.median(wall(b) / wall(a) for a, b in zip(runs["ours"], runs["theirs"])),
        "ours_tps": statistics.median(map(decode_tps, runs["ours"])),
        "theirs_tps": statistics.median(map(decode_tps, runs["theirs"])),
        "acceptance": acceptance(runs["ours"][0]),
        "same_tokens": same,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path(".data/tiny"), help="tiny models directory")
    parser.add_argument("--mlx", nargs=2, metavar=("TARGET", "DRAFT"), help="MLX target and draft instead")
    parser.add_argument("--gguf", nargs=2, metavar=("TARGET", "DRAFT"), help="GGUF target and draft instead")
    parser.add_argument("--engines", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args(argv)

    paths = {}
    if not (args.mlx and args.gguf):
        tiny = make_tiny(args.models)
        paths = {"mlx": (tiny.mlx_target, tiny.mlx_draft), "llama.cpp": (tiny.gguf_target, tiny.gguf_draft)}
    paths.update({k: v for k, v in (("mlx", args.mlx), ("llama.cpp", args.gguf)) if v})

    print(f"{args.tokens} tokens, depth {args.depth}, {args.repeats} interleaved pairs, medians")
    print(
        f"{'engine':10} {'ours':9} {'theirs':13} {'decode ours/theirs':>18} {'wall theirs/ours':>16} "
        f"{'ours tok/s':>10} {'theirs tok/s':>12} {'accept':>6} {'same':>5}"
    )
    for name in args.engines:
        engine = make_engine(name)
        target, draft = paths[name]
        engine.load(str(target), str(draft))
        versions = ", ".join(f"{k} {v}" for k, v in engine.versions().items())
        tokens = engine.tokenize(PROMPT)
        for ours, theirs in PAIRS[name]:
            depth = 0 if ours == "baseline" else args.depth
            r = compare(
                engine,
                Request(tokens, args.tokens, method=ours, depth=depth),
                Request(tokens, args.tokens, method=theirs, depth=depth),
                args.repeats,
            )
            print(
                f"{name:10} {ours:9} {theirs:13} {r['decode_ratio']:18.3f} {r['wall_ratio']:16.3f} "
                f"{r['ours_tps']:10.1f} {r['theirs_tps']:12.1f} {r['acceptance']:>6} {str(r['same_tokens']):>5}"
            )
        print(f"{'':10} ({versions})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""MTP against the baseline and against a draft model, depths 1 to 4, on both engines.

    .venv/bin/python bench/mtp.py [--models DIR] [--tokens 128] [--repeats 9] [--depths 1 2 3 4]

On the tiny hybrid Qwen3.5-style model (GatedDeltaNet and attention layers, one MTP block) and
its layer-skip draft, and on the all-attention variant (MLX only: llama.cpp's qwen35 graph
needs a recurrent layer). For every depth the arms run back to back in a rotating order, after
warm-up runs, on the same prompt tokens; printed are medians of paired ratios of decode
tokens/s (mtp over baseline, mtp over draft at the same depth), acceptance at each draft
position, and draft and verify seconds per generated token. Every arm's tokens are checked
against the baseline's (greedy): `same` must say True.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.engines import make_engine  # noqa: E402
from agent.engines.base import Request  # noqa: E402
from bench.engines import PROMPT, WARMUP_RUNS, decode_tps  # noqa: E402
from cli.tiny import make_tiny  # noqa: E402


def positions(gens) -> str:
    """Acceptance at each draft position over all runs (accepted / drafted there)."""
    accepted = [sum(g.accepted_by_position[i] for g in gens) for i in range(len(gens[0].accepted_by_position))]
    drafted = [sum(g.drafted_by_position[i] for g in gens) for i in range(len(gens[0].drafted_by_position))]
    return " ".join(f"{a / d:.2f}" if d else "-" for a, d in zip(accepted, drafted))


def per_token_ms(gens, field: str) -> float:
    return 1000 * statistics.median(sum(getattr(r, field) for r in g.rounds) / len(g.tokens) for g in gens)


def measure(engine, tokens, n: int, depth: int, methods: list[str], repeats: int) -> dict[str, list]:
    requests = {m: Request(tokens, n, method=m, depth=0 if m == "baseline" else depth) for m in methods}
    for request in requests.values():
        for _ in range(WARMUP_RUNS):
            engine.generate(request)
    runs = {m: [] for m in methods}
    for repeat in range(repeats):
        order = methods[repeat % len(methods) :] + methods[: repeat % len(methods)]
        for m in order:
            runs[m].append(engine.generate(requests[m]))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path(".data/tiny"), help="tiny models directory")
    parser.add_argument("--engines", nargs="+", default=["mlx", "llama.cpp"], choices=["mlx", "llama.cpp"])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4])
    args = parser.parse_args(argv)

    tiny = make_tiny(args.models)
    setups = [
        ("mlx", "hybrid", tiny.mlx_mtp_hybrid, tiny.mlx_mtp_hybrid_draft),
        ("mlx", "dense", tiny.mlx_mtp_dense, None),
        ("llama.cpp", "hybrid", tiny.gguf_mtp_hybrid, tiny.gguf_mtp_hybrid_draft),
    ]
    print(f"{args.tokens} tokens, {args.repeats} rotations of the arms per depth, medians of paired ratios")
    print(
        f"{'engine':10} {'model':7} {'K':>2} {'mtp/base':>8} {'mtp/draft':>9} {'base tok/s':>10} {'mtp tok/s':>9} "
        f"{'draft tok/s':>11} {'mtp accept by position':<24} {'draft accept':<24} "
        f"{'mtp draft ms/tok':>16} {'mtp verify ms/tok':>17} {'same':>5}"
    )
    for name, variant, target, draft in setups:
        if name not in args.engines:
            continue
        engine = make_engine(name)
        engine.load(str(target), str(draft) if draft else None)
        tokens = engine.tokenize(PROMPT)
        methods = ["baseline", "mtp"] + (["draft"] if draft else [])
        for depth in args.depths:
            runs = measure(engine, tokens, args.tokens, depth, methods, args.repeats)
            base = runs["baseline"]
            mtp_ratio = statistics.median(decode_tps(m) / decode_tps(b) for m, b in zip(runs["mtp"], base))
            same = all(g.tokens == base[0].tokens for gens in runs.values() for g in gens)
            if draft:
                vs_draft = statistics.median(decode_tps(m) / decode_tps(d) for m, d in zip(runs["mtp"], runs["draft"]))
                draft_cols = f"{statistics.median(map(decode_tps, runs['draft'])):11.1f}"
                draft_accept = positions(runs["draft"])
            else:
                vs_draft, draft_cols, draft_accept = float("nan"), f"{'-':>11}", "-"
            base_tps, mtp_tps = (statistics.median(map(decode_tps, runs[m])) for m in ("baseline", "mtp"))
            draft_ms, verify_ms = (per_token_ms(runs["mtp"], f) for f in ("draft_seconds", "verify_seconds"))
            print(
                f"{name:10} {variant:7} {depth:>2} {mtp_ratio:8.3f} {vs_draft:9.3f} {base_tps:10.1f} {mtp_tps:9.1f} "
                f"{draft_cols} {positions(runs['mtp']):<24} {draft_accept:<24} "
                f"{draft_ms:16.3f} {verify_ms:17.3f} {str(same):>5}"
            )
        print(f"{'':10} ({', '.join(f'{k} {v}' for k, v in engine.versions().items())})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

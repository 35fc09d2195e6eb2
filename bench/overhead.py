"""The decode loops' own cost: time spent outside forward passes, on one GGUF and one machine.

    .venv/bin/python bench/overhead.py [--models DIR] [--tokens 128] [--repeats 7]

Printed, each a median over `--repeats` runs after two warm-up runs:

    baseline   our decode tok/s against `llama-bench -p 0 -n N` (its tg figure, same threads and
               flash attention) and against llama-server's baseline as its client sees it; the
               loop's own time per token: our time per token minus llama-bench's.
    variants   the baseline with a 256-token context, and without flash attention beside
               llama-bench's tg without it: where a gap to llama-bench lies.
    each arm   (baseline, draft K, ngram K, ngram-mod K on the tiny Llama pair; mtp K and draft K
               on the hybrid): time per round and per token, how much of it was inside forward
               passes (`llama_decode` and `llama_process` with a `llama_synchronize` after each,
               timed by wrapping those two functions) and how much outside: the loop's own
               Python, ctypes and sampling work.

The wrapper adds one synchronize per forward pass (the loop synchronizes there anyway: it reads
logits next) and about a microsecond of Python per pass, counted as outside. Default models are
the project's tiny ones, whose forward passes are so small that the loop is most of a token's time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp as ll  # noqa: E402

from agent.engines import make_engine  # noqa: E402
from agent.engines.base import Request  # noqa: E402
from bench.servers import PROMPT, engines, llama_bench  # noqa: E402
from cli.tinymodels import make_tiny  # noqa: E402

NGRAM_MOD = {"n_match": 4, "n_min": 1}


class ForwardTimer:
    """Wraps llama_cpp's forward-pass functions; `passes` holds (start, seconds) of each call."""

    def __init__(self):
        self.passes: list[tuple[float, float]] = []
        self.originals = {name: getattr(ll, name) for name in ("llama_decode", "llama_process")}

    def __enter__(self):
        for name, original in self.originals.items():
            setattr(ll, name, self._timed(original))
        return self

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(ll, name, original)

    def _timed(self, original):
        synchronize = ll.llama_synchronize

        def timed(ctx, *args):
            t0 = time.perf_counter()
            rc = original(ctx, *args)
            synchronize(ctx)
            self.passes.append((t0, time.perf_counter() - t0))
            return rc

        return timed


def measure(engine, request: Request, repeats: int) -> dict:
    """Medians over `repeats` runs (two warm-ups first) of decode tok/s and, per round of the
    decode (per token for the baseline), wall time, forward time and the rest."""
    for _ in range(2):
        engine.generate(request)
    runs = []
    for _ in range(repeats):
        with ForwardTimer() as timer:
            gen = engine.generate(request)
            done = time.perf_counter()
        times = gen.token_times_seconds
        decode = times[-1] - times[0]
        decode_start = done - (gen.token_times_seconds[-1] - times[0])  # the first token's time, nearly
        passes = [seconds for start, seconds in timer.passes if start >= decode_start]
        rounds = len(gen.rounds) or len(gen.tokens) - 1
        runs.append(
            {
                "tps": (len(gen.tokens) - 1) / decode,
                "per_round": decode / rounds,
                "forward_per_round": sum(passes) / rounds,
                "passes_per_round": len(passes) / rounds,
                "tokens_per_round": (len(gen.tokens) - 1) / rounds,
            }
        )
    out = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    out["outside_per_round"] = statistics.median(r["per_round"] - r["forward_per_round"] for r in runs)
    return out


def line(label: str, m: dict) -> str:
    us = 1e6
    return (
        f"{label:16} {m['tps']:9.1f} {m['per_round'] * us:9.1f} {m['forward_per_round'] * us:9.1f} "
        f"{m['outside_per_round'] * us:9.1f} {m['outside_per_round'] / m['tokens_per_round'] * us:9.1f} "
        f"{m['tokens_per_round']:6.2f} {m['passes_per_round']:6.1f}"
    )


HEADER = (
    f"{'arm':16} {'tok/s':>9} {'us/round':>9} {'forward':>9} {'outside':>9} {'out/tok':>9} {'tok/rd':>6} {'passes':>6}"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path(".data/tiny"), help="tiny models directory")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    tiny = make_tiny(args.models)
    n, repeats = args.tokens, args.repeats

    ours, server = engines(tiny.gguf_target)
    prompt = ours.tokenize(PROMPT)
    print(f"{n} tokens, medians of {repeats} runs; {ours.n_threads} thread(s); {ours.versions()}")
    base = measure(ours, Request(prompt, n), repeats)
    server.generate(Request(prompt, n))  # warm-up
    served = statistics.median(
        (len(g.tokens) - 1) / (g.token_times_seconds[-1] - g.token_times_seconds[0])
        for g in (server.generate(Request(prompt, n)) for _ in range(repeats))
    )
    bench = llama_bench(tiny.gguf_target, n, ours.n_threads, ours.flash_attn)
    server.close()
    print(
        f"baseline: ours {base['tps']:.1f} tok/s, llama-bench tg{n} {bench:.1f} tok/s (ours/bench "
        f"{base['tps'] / bench:.3f}), llama-server {served:.1f} tok/s (ours/server {base['tps'] / served:.3f}); "
        f"loop's own time per token (ours - llama-bench) {(1 / base['tps'] - 1 / bench) * 1e6:.1f} us"
    )
    print(HEADER)
    print(line("baseline", base))
    ours.close()
    # Where the per-token gap to llama-bench lies: the same baseline on a small context, and
    # without flash attention beside llama-bench's own figure without it.
    for label, options, flash in (
        ("baseline n_ctx=256", {"n_ctx": 256}, True),
        ("baseline fa off", {"flash_attn": False}, False),
    ):
        variant = make_engine("llama.cpp", **options)
        variant.load(str(tiny.gguf_target))
        m = measure(variant, Request(prompt, n), repeats)
        tg = llama_bench(tiny.gguf_target, n, variant.n_threads, flash)
        print(f"{line(label, m)}   llama-bench tg{n} fa {'on' if flash else 'off'} {tg:.1f} tok/s")
        variant.close()
    ours = make_engine("llama.cpp")
    ours.load(str(tiny.gguf_target), str(tiny.gguf_draft))
    mod = {"ngram_mod_n_match": NGRAM_MOD["n_match"], "ngram_mod_n_min": NGRAM_MOD["n_min"]}
    for method, k in (("draft", 2), ("draft", 4), ("ngram", 3), ("ngram-mod", 8)):
        extra = mod if method == "ngram-mod" else {}
        print(line(f"{method} K={k}", measure(ours, Request(prompt, n, method, k, **extra), repeats)), flush=True)
    ours.close()
    ours = make_engine("llama.cpp")
    ours.load(str(tiny.gguf_mtp_hybrid), str(tiny.gguf_mtp_hybrid_draft))
    prompt = ours.tokenize(PROMPT)
    print(line("hybrid baseline", measure(ours, Request(prompt, n), repeats)))
    for method, k in (("mtp", 1), ("mtp", 2), ("draft", 2)):
        print(line(f"hybrid {method} K={k}", measure(ours, Request(prompt, n, method, k), repeats)), flush=True)
    ours.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

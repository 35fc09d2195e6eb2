"""Our in-process llama.cpp loops against llama.cpp's own tools on the same GGUF, side by side.

    .venv/bin/python bench/servers.py [--models DIR] [--tokens 128] [--repeats 9]

Paired and interleaved (the order alternates every repeat, after two warm-up runs each), with the
same threads, context, batch and flash attention on every side:

    baseline   ours vs `llama-bench -n 128` (its tg figure) vs llama-server's baseline
    mtp        ours (mtp, K) vs llama-server --spec-type draft-mtp (the hybrid GGUF)
    ngram-mod  ours vs llama-server --spec-type ngram-mod (the Llama GGUF)

Printed: the median of paired decode tok/s ratios (ours / theirs: above 1 our side is faster),
each side's median decode tok/s (llama-server's as its client sees it and as its own `timings`
say), acceptance on both sides, and each side's overhead: ours against llama-bench's pure
decode loop (our Python per token), the server's client figure against its own (HTTP and
streaming per token). bench/noise.py's probe runs alongside; its line says how steady the
machine was. Default models are the project's tiny ones, on which every per-token overhead
is large against a forward pass of about 0.2 ms; on a real model it shrinks in proportion.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.engines import make_engine  # noqa: E402
from agent.engines.base import Request, Settings  # noqa: E402
from agent.engines.llama_server import PROJECT_BUILD  # noqa: E402
from agent.summary import summarise  # noqa: E402
from bench.noise import NoiseProbe  # noqa: E402
from cli.demo import NGRAM_MOD, ngram_mod_flags, ngram_mod_settings  # noqa: E402  (the tiny models' ngram-mod parameters, as the demo runs them)
from cli.tiny import make_tiny  # noqa: E402

PROMPT = (
    "Speculative decoding lets a small draft model propose several tokens that the large target model then "
    "checks in a single forward pass. When the draft agrees with the target"
)
LLAMA_BENCH = PROJECT_BUILD.with_name("llama-bench")
WARMUP_RUNS = 2


def tps(gen) -> float:
    return summarise(gen)["decode_tokens_per_second"]


def acceptance(gen) -> str:
    s = summarise(gen)
    return f"{s['tokens_accepted'] / s['tokens_drafted']:.2f}" if s["tokens_drafted"] else "-"


def llama_bench(model: Path, tokens: int, threads: int, flash: bool, depth: int = 0) -> float:
    """llama-bench's tg tok/s: `tokens` tokens decoded after `depth` tokens of context (`-d`: our
    loops decode after the prompt, so like for like is the prompt's length), 3 repetitions. Where
    attention runs on the CPU (flash attention forced on for a head size the GPU backend has no
    kernel for: the tiny models' 32 on CUDA), its cost grows with the depth: ggml's CPU kernel
    skips the masked cells."""
    out = subprocess.run(
        [str(LLAMA_BENCH), "-m", str(model), "-p", "0", "-n", str(tokens), "-d", str(depth), "-r", "3"]
        + ["-t", str(threads), "-fa", "1" if flash else "0", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout)[0]["avg_ts"]


def paired(sides: dict, repeats: int) -> dict[str, list]:
    """name -> generations, the sides' order rotating every repeat."""
    for run in sides.values():
        for _ in range(WARMUP_RUNS):
            run()
    names = list(sides)
    out = {n: [] for n in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            out[name].append(sides[name]())
    return out


def ratio(a: list, b: list) -> float:
    return statistics.median(tps(x) / tps(y) for x, y in zip(a, b))


def own(runs: list) -> float:
    """The server's own decode tok/s (its `timings`), median over runs."""
    return statistics.median(g.server.decode_tokens_per_second for g in runs)


HEADER = f"{'arm':10} {'ours/theirs':>11} {'ours tok/s':>10} {'theirs tok/s':>12} {'server own':>10} {'accepted':>11}"


def row(arm: str, ours: list, theirs: list, note: str) -> str:
    accepted = f"{acceptance(ours[0])} / {acceptance(theirs[0])}"
    return (
        f"{arm:10} {ratio(ours, theirs):11.3f} {statistics.median(map(tps, ours)):10.1f} "
        f"{statistics.median(map(tps, theirs)):12.1f} {own(theirs):10.1f} {accepted:>11}  {note}"
    )


def engines(model: Path):
    """Our llama.cpp engine and llama-server with its threads, context, batch and flash attention."""
    ours = make_engine("llama.cpp")
    ours.load(str(model))
    flags = ("-t", str(ours.n_threads), "-tb", str(ours.n_threads_batch), "-c", str(ours.n_ctx))
    flags += ("-b", str(ours.n_batch), "-ub", str(ours.n_batch), "-fa", "on" if ours.flash_attn else "off")
    server = make_engine("llama-server", flags=flags, memory_bytes=8 * 2**30)
    server.load(str(model))
    return ours, server


def side_by_side(ours, server, mine: Request, theirs: Request, repeats: int) -> tuple[list, list]:
    runs = paired({"ours": lambda: ours.generate(mine), "server": lambda: server.generate(theirs)}, repeats)
    return runs["ours"], runs["server"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path(".data/tiny"), help="tiny models directory")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--depth", type=int, default=2, help="MTP depth")
    parser.add_argument("--ngram-depth", type=int, default=8, help="ngram-mod's n_max")
    args = parser.parse_args(argv)
    tiny = make_tiny(args.models)
    n, repeats = args.tokens, args.repeats

    with NoiseProbe() as probe:
        start = time.perf_counter()
        ours, server = engines(tiny.gguf_target)
        prompt = ours.tokenize(PROMPT)
        print(f"{n} tokens, {repeats} interleaved repeats, medians; {ours.n_threads} thread(s); {server.versions()}")
        print(HEADER)
        mine, theirs = side_by_side(ours, server, Request(prompt, n), Request(prompt, n), repeats)
        print(row("baseline", mine, theirs, "vs llama-server"))
        bench_tps = llama_bench(tiny.gguf_target, n, ours.n_threads, ours.flash_attn, len(prompt))
        ours_tps = statistics.median(map(tps, mine))
        line = f"{'baseline':10} {ours_tps / bench_tps:11.3f} {ours_tps:10.1f} {bench_tps:12.1f}"
        print(f"{line}  vs llama-bench tg{n} @ d{len(prompt)}")

        k, mod = args.ngram_depth, NGRAM_MOD
        flags = ngram_mod_flags(mod)
        mine, theirs = side_by_side(
            ours,
            server,
            Request(
                prompt,
                n,
                "ngram-mod",
                k,
                settings=Settings(**ngram_mod_settings(mod)),
            ),
            Request(prompt, n, "ngram-mod", k, flags=flags),
            repeats,
        )
        print(row("ngram-mod", mine, theirs, f"K={k}, a fresh server per run"))
        ours.close()
        server.close()

        ours, server = engines(tiny.gguf_mtp_hybrid)
        prompt = ours.tokenize(PROMPT)
        k = args.depth
        mine, theirs = side_by_side(
            ours, server, Request(prompt, n, "mtp", k), Request(prompt, n, "draft-mtp", k), repeats
        )
        print(row("mtp", mine, theirs, f"K={k} vs draft-mtp, hybrid GGUF"))
        base_mine, base_theirs = side_by_side(ours, server, Request(prompt, n), Request(prompt, n), repeats)
        print(
            f"{'':10} speedup over its own baseline: ours {ratio(mine, base_mine):.3f}, llama-server "
            f"{ratio(theirs, base_theirs):.3f} as its client sees it, "
            f"{own(theirs) / own(base_theirs):.3f} by its own timings"
        )
        ours.close()
        server.close()
        end = time.perf_counter()
    print(probe.summary(start, end))
    return 0


if __name__ == "__main__":
    sys.exit(main())

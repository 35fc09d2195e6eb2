"""Why does ours/llama-bench on the tiny model with flash attention on sit below 0.95 on the H200
(issue 40, item 5; 0.817-0.957 over five runs, ours 1,934-2,151 tok/s, llama-bench 2,022-2,631)?

    python3 bench/h200/fa_diag.py TINY_DIR [--rounds 3] [--tokens 128]

The tiny target's heads are 32 wide (cli/tinymodels.py TARGET_SHAPE: hidden 128, 4 heads), a
head size for which ggml's CUDA backend has no flash-attention kernel (ggml-cuda/fattn.cu
ggml_cuda_get_best_fattn_kernel: 40, 64, 72, 80, 96, 112, 128, 256, ...), so with flash attention
forced on (LLAMA_FLASH_ATTN_TYPE_ENABLED, llama-bench's `-fa 1`) the scheduler runs that op on the
CPU backend: every layer's K/V view is copied to the host and its attention computed by ggml's
CPU threads. Printed:

    splits     llama-bench -v's context lines (graph splits, flash_attn) with -fa 1 and -fa 0
    rounds     `--rounds` rounds, each side in a fresh process per figure, the sides alternating:
               llama-bench `-p 0 -n N -r 3 -fa 1 -t T` and ours (agent/engines/llamacpp.py,
               a context of 256 as overhead.py's, median of 5 runs after 2 warm-ups) at threads
               T = 1, 2, 4, 8, 16; at T = 8 also with OMP_WAIT_POLICY=active and =passive, with
               GGML_CUDA_DISABLE_GRAPHS=1, and ours with a ggml threadpool attached as
               llama-bench attaches one (llama_attach_threadpool); flash attention off at T = 8
    summary    per configuration: each side's median over the rounds, its range, and the median
               of the rounds' ratios ours/llama-bench
    steps      ours at T = 8: the median, p10 and p90 of the gaps between token times (a token's
               whole step), against the mean step that tok/s measures

`python3 bench/h200/fa_diag.py --ours MODEL --threads T --fa 1|0 [--pool]` is one ours figure (the
child's side), printed as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GGML_MAX_N_THREADS = 512


class ThreadpoolParams(ctypes.Structure):  # ggml.h struct ggml_threadpool_params
    _fields_ = [
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


def attach_pool(ctx, threads: int):
    """A ggml threadpool of `threads` (the defaults llama-bench gives it: poll 50) attached to the
    context, as llama-bench does; returns it (kept alive by the caller)."""
    import llama_cpp as ll
    from llama_cpp.llama_cpp import _lib

    from agent.engines.llamacpp_lib import library_dir

    libdir = library_dir(Path(ll.__file__).parent)
    base = ctypes.CDLL(str(sorted(libdir.glob("libggml-base.so*"))[0]))
    cpu = ctypes.CDLL(str(sorted(libdir.glob("libggml-cpu.so*"))[0]))
    params = ThreadpoolParams()
    base.ggml_threadpool_params_init.argtypes = [ctypes.POINTER(ThreadpoolParams), ctypes.c_int]
    base.ggml_threadpool_params_init(ctypes.byref(params), threads)
    cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(ThreadpoolParams)]
    cpu.ggml_threadpool_new.restype = ctypes.c_void_p
    pool = cpu.ggml_threadpool_new(ctypes.byref(params))
    _lib.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    _lib.llama_attach_threadpool.restype = None
    _lib.llama_attach_threadpool(ctx, pool, pool)
    return pool


def ours(model: str, threads: int, fa: bool, pool: bool, tokens: int) -> dict:
    from agent.engines import make_engine
    from agent.engines.base import Request
    from bench.servers import PROMPT, tps

    engine = make_engine("llama.cpp", n_ctx=256, n_threads=threads, flash_attn=fa)
    engine.load(model)
    kept = attach_pool(engine._target.ctx, threads) if pool else None
    request = Request(engine.tokenize(PROMPT), tokens)
    for _ in range(2):
        engine.generate(request)
    runs = [engine.generate(request) for _ in range(5)]
    gaps = [b - a for g in runs for a, b in zip(g.token_times_seconds[1:], g.token_times_seconds[2:])]
    deciles = statistics.quantiles(gaps, n=10)
    del kept
    engine.close()
    return {
        "tps": statistics.median(map(tps, runs)),
        "gap_median_us": statistics.median(gaps) * 1e6,
        "gap_p10_us": deciles[0] * 1e6,
        "gap_p90_us": deciles[-1] * 1e6,
        "gap_mean_us": statistics.fmean(gaps) * 1e6,
    }


def bench_tps(model: str, threads: int, fa: bool, tokens: int, env: dict) -> float:
    from bench.servers import LLAMA_BENCH

    out = subprocess.run(
        [str(LLAMA_BENCH), "-m", model, "-p", "0", "-n", str(tokens), "-r", "3", "-t", str(threads)]
        + ["-fa", "1" if fa else "0", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    return json.loads(out.stdout)[0]["avg_ts"]


def ours_tps(model: str, threads: int, fa: bool, pool: bool, tokens: int, env: dict) -> dict:
    command = [sys.executable, __file__, "--ours", model, "--threads", str(threads), "--fa", str(int(fa))]
    command += ["--tokens", str(tokens)] + (["--pool"] if pool else [])
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    if out.returncode:
        raise RuntimeError(f"ours {command[3:]} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def splits(model: str) -> None:
    from bench.servers import LLAMA_BENCH

    for fa in ("1", "0"):
        out = subprocess.run(
            [str(LLAMA_BENCH), "-m", model, "-p", "0", "-n", "4", "-r", "1", "-fa", fa, "-v"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=120,
        )
        lines = [
            line
            for line in (out.stderr + out.stdout).splitlines()
            if any(k in line for k in ("splits", "flash_attn", "n_ctx ", "Flash Attention", "n_head", "n_embd_head"))
        ]
        print(f"llama-bench -fa {fa} -v:")
        for line in lines[:14]:
            print("   ", line.strip())


CONFIGS = (
    *((f"t={t}", t, True, False, {}) for t in (1, 2, 4, 8, 16)),
    ("t=8 OMP_WAIT_POLICY=active", 8, True, False, {"OMP_WAIT_POLICY": "active"}),
    ("t=8 OMP_WAIT_POLICY=passive", 8, True, False, {"OMP_WAIT_POLICY": "passive"}),
    ("t=8 GGML_CUDA_DISABLE_GRAPHS=1", 8, True, False, {"GGML_CUDA_DISABLE_GRAPHS": "1"}),
    ("t=8 ours with a threadpool", 8, True, True, {}),
    ("t=8 fa off", 8, False, False, {}),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="?", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ours", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--fa", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--pool", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ours:
        print(json.dumps(ours(args.ours, args.threads, bool(args.fa), args.pool, args.tokens)))
        return 0
    from cli.tiny import make_tiny

    model = str(make_tiny(args.models).gguf_target)
    print(f"cpu: {os.cpu_count()} logical; ", end="")
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    name = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
    print(name.split(":")[-1].strip(), "| amx:", "amx_tile" in flags, "| avx512f:", "avx512f" in flags)
    splits(model)
    figures: dict[str, dict[str, list]] = {label: {"ours": [], "bench": [], "steps": []} for label, *_ in CONFIGS}
    started = time.perf_counter()
    for r in range(args.rounds):
        for label, threads, fa, pool, extra in CONFIGS:
            env = {**os.environ, **extra}
            sides = ("bench", "ours") if r % 2 == 0 else ("ours", "bench")
            for side in sides:
                try:
                    if side == "bench":
                        figures[label]["bench"].append(bench_tps(model, threads, fa, args.tokens, env))
                    else:
                        o = ours_tps(model, threads, fa, pool, args.tokens, env)
                        figures[label]["ours"].append(o["tps"])
                        figures[label]["steps"].append(o)
                except Exception as e:  # one failed figure must not cost the call's others
                    print(f"round {r + 1} {label} {side}: FAILED {type(e).__name__}: {str(e)[-300:]}")
            f = figures[label]
            if f["ours"] and f["bench"]:
                print(
                    f"round {r + 1} {label:32} ours {f['ours'][-1]:8.1f} bench {f['bench'][-1]:8.1f} "
                    f"({f['ours'][-1] / f['bench'][-1]:.3f}) [{time.perf_counter() - started:.0f} s]",
                    flush=True,
                )
    print("summary: medians over the rounds (range), and the median of the rounds' ratios")
    for label, f in figures.items():
        if not (f["ours"] and f["bench"]):
            continue
        ratios = [a / b for a, b in zip(f["ours"], f["bench"])]
        print(
            f"  {label:32} ours {statistics.median(f['ours']):8.1f} ({min(f['ours']):.0f}-{max(f['ours']):.0f}) "
            f"bench {statistics.median(f['bench']):8.1f} ({min(f['bench']):.0f}-{max(f['bench']):.0f}) "
            f"ours/bench {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )
        s = f["steps"][-1]
        print(
            f"  {'':32} ours' step: median {s['gap_median_us']:.1f} p10 {s['gap_p10_us']:.1f} "
            f"p90 {s['gap_p90_us']:.1f} mean {s['gap_mean_us']:.1f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why do llama-server's and our greedy baselines differ on CUDA (issue 40, item 3)? Each setting
that could make them compute differently is varied on one side at a time, and every variant's
tokens are set against the others' on the same prompts.

    python3 bench/h200/parity.py TINY_DIR [--tokens 64]

Printed, for the first four qa prompts on the tiny target: per variant of ours (our engine:
greedy in the graph, in place, through the chain; flash attention off) and of llama-server's (the
demo's flags, `-c 4096 -fa on --parallel 1`; ours copied: threads, context, batch and ubatch;
flash attention off), the first position where its tokens leave the reference's (llama-server's
with the demo's flags), each run twice (is either side deterministic?). At the first divergence
of ours from the server's (where both ids are known: the server's stream holds back the id of
a token whose text is incomplete UTF-8; "u" counts those): the target's logit gap between the two
tokens there, in our engine (one-token decoding on the server's prefix) and in the server (its
n_probs), so that a near-tie is told from a defect. Then llama-server's own ngram-mod run (K=8,
n_match 4, n_min 1) against its own baseline: where it leaves it, and the gap there by one-token
decoding and by a 9-row batch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.engines import llamacpp, make_engine  # noqa: E402
from agent.engines.base import EngineError, Request  # noqa: E402
from agent.engines.llama_server import UNKNOWN_ID  # noqa: E402
from cli.tiny import make_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO_FLAGS = ("-c", "4096", "-fa", "on", "--parallel", "1")  # cli/demo.py SERVER_FLAGS
NGRAM_MOD_FLAGS = ("--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1")


def known_divergence(tokens, reference) -> int | None:
    """The first position where both ids are known (llama-server's stream holds back the id of a
    token whose text is incomplete UTF-8: UNKNOWN_ID) and differ; None where none does."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b and UNKNOWN_ID not in (a, b)), None)


def where(tokens, reference) -> str:
    """ "same", or "@i" (the first known difference), with "(u unknown)" where ids were held back."""
    at = known_divergence(tokens, reference)
    unknown = sum(UNKNOWN_ID in pair for pair in zip(tokens, reference))
    return ("same" if at is None else f"@{at}") + (f"({unknown}u)" if unknown else "")


def gap(engine, prompt, reference, tokens, at: int, rows: int = 1) -> str:
    """The logit gap reference[at] - tokens[at] after the reference's prefix, as `engine` sees it."""
    try:
        margin = engine.logit_margin([*prompt, *reference[:at]], len(prompt) + at, rows, (reference[at], tokens[at]))
        return f"{margin.margin:+.4f}"
    except EngineError as e:
        return f"unreadable ({e})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    tiny = make_tiny(args.models)
    model, n = str(tiny.gguf_target), args.tokens
    texts = [p["text"] for p in yaml.safe_load((ROOT / "specfleet/prompt_sets/qa.yaml").read_text())["prompts"][:4]]

    ours = make_engine("llama.cpp")
    ours.load(model)
    prompts = [ours.tokenize(t) for t in texts]
    same = ("-t", str(ours.n_threads), "-tb", str(ours.n_threads_batch), "-c", str(ours.n_ctx))
    same += ("-b", str(ours.n_batch), "-ub", str(ours.n_batch), "-fa", "on")
    servers = {
        "server demo flags": DEMO_FLAGS,
        "server our flags": same,
        "server fa off": (*same[:-1], "off"),
    }
    runs: dict[str, list[list[list[int]]]] = {}
    for name, flags in servers.items():
        server = make_engine("llama-server", flags=flags, memory_bytes=8 * 2**30)
        server.load(model)
        runs[name] = [[server.generate(Request(p, n)).tokens for p in prompts] for _ in range(2)]
        if name == "server demo flags":
            reference = runs[name][0]
            demo_server = server
            continue
        server.close()
    for mode in llamacpp.GREEDY_MODES:
        llamacpp.GREEDY = mode
        runs[f"ours {mode}"] = [[ours.generate(Request(p, n)).tokens for p in prompts] for _ in range(2)]
    llamacpp.GREEDY = "device"
    off = make_engine("llama.cpp", flash_attn=False)
    off.load(model)
    runs["ours fa off"] = [[off.generate(Request(p, n)).tokens for p in prompts] for _ in range(2)]
    off.close()

    print(f"{n} tokens, first difference from llama-server with the demo's flags (run 1), per prompt; run 2 beside")
    for name, (first, second) in runs.items():
        cells = [f"{where(a, r)}/{where(b, r)}" for a, b, r in zip(first, second, reference)]
        print(f"  {name:22} " + "  ".join(cells), flush=True)
    print("gaps at ours' first difference from the server (server's token - ours), ours | server:")
    for i, (mine, theirs) in enumerate(zip(runs["ours device"][0], reference)):
        at = known_divergence(mine, theirs)
        if at is not None and UNKNOWN_ID not in theirs[:at]:
            print(
                f"  prompt {i} @{at}: server {theirs[at]} ours {mine[at]}: "
                f"{gap(ours, prompts[i], theirs, mine, at)} | {gap(demo_server, prompts[i], theirs, mine, at)}",
                flush=True,
            )

    request = [Request(p, n, "ngram-mod", 8, flags=NGRAM_MOD_FLAGS) for p in prompts]
    print(
        "llama-server ngram-mod K=8 against its own baseline (gap: baseline's token - ngram-mod's, "
        "ours one-token | ours 9-row batch | server one-token):"
    )
    for i, (req, base) in enumerate(zip(request, reference)):
        demo_server.restart(req)
        tokens = demo_server.generate(req).tokens
        at = known_divergence(tokens, base)
        if at is None:
            print(f"  prompt {i}: same ({where(tokens, base)})", flush=True)
            continue
        print(
            f"  prompt {i} @{at}: baseline {base[at]} ngram-mod {tokens[at]}: {gap(ours, prompts[i], base, tokens, at)}"
            f" | {gap(ours, prompts[i], base, tokens, at, 9)} | {gap(demo_server, prompts[i], base, tokens, at)}",
            flush=True,
        )
    demo_server.close()
    ours.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

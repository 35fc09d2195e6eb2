"""Our loops against llama.cpp's own: the in-process llama.cpp engine and `llama-server` built from
the same llama.cpp commit (scripts/build-llama-cpp.sh), on the tiny GGUFs, greedy, the same prompt
tokens and the same threads, context and batch sizes.

- ngram-mod and ngram-map-k4v (agent/engines/ngram.py, ports of common/ngram-mod.cpp and
  common/ngram-map.cpp): our run drafts and accepts exactly what the server's `timings` count
  (`draft_n`, `draft_n_accepted`), with the same tokens. Both sides are deterministic functions of
  the token sequence, so the tolerance is zero.
- MTP: our `mtp` and `--spec-type draft-mtp` at depths 1-3 emit the same tokens (both ban
  end-of-sequence, as fixed-length runs do everywhere), and acceptance by position agrees within
  MTP_TOLERANCE. Not zero because the two compute the head differently (ours decodes it token by
  token in its own context, the server in its draft context with its own batch shapes), and on a
  CPU the order of a float sum can flip a near-tie of a random tiny model's logits; on this build
  they agree exactly (test output: 15 of 47 accepted at position 1 on both sides, K = 1-3).

The server streams a token's id only once its text is complete UTF-8 (llama_server.UNKNOWN_ID
otherwise: frequent with the tiny models' byte tokens), so tokens are compared where the server
sent an id, and the server's own baseline must stream the same sequence.
"""

import pytest

from agent.engines import make_engine
from agent.engines.base import Request, Settings
from agent.engines.llama_server import UNKNOWN_ID
from agent.summary import summarise
from specfleet.record import Arm
from tests.support.processes import needs_llama_server

NEW_TOKENS = 200  # long enough for the tiny target's greedy output to repeat itself
# Small n-gram parameters, so that 200 tokens of a tiny random model give drafts to count.
NGRAM_MOD = dict(n_match=4, n_min=1)
NGRAM_MAP = dict(size_n=2, min_hits=1)
MTP_TOLERANCE = 0.05  # of the proposals at a position, and at least one proposal
MIN_KNOWN = 0.75  # of the server's streamed tokens, the share that must carry an id to be compared
PROMPT = "the fleet measures speed and the fleet measures speed " * 4
pytestmark = [needs_llama_server, pytest.mark.process, pytest.mark.engine]


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    """(ours, server, prompt tokens) per model file: our in-process engine and llama-server with
    its threads, context, batch and flash attention."""
    made = []

    def make(model):
        ours = make_engine("llama.cpp")
        ours.load(str(model))
        flags = ("-t", str(ours.n_threads), "-tb", str(ours.n_threads_batch), "-c", str(ours.n_ctx))
        flags += ("-b", str(ours.n_batch), "-ub", str(ours.n_batch), "-fa", "on" if ours.flash_attn else "off")
        server = make_engine(
            "llama-server", flags=flags, memory_bytes=8 * 2**30, log_dir=str(tmp_path_factory.mktemp("srv"))
        )
        server.load(str(model))
        made.extend((ours, server))
        return ours, server, ours.tokenize(PROMPT)

    yield make
    for engine in made:
        engine.close()


def same_tokens(ours: list[int], server: list[int]) -> bool:
    """Equal wherever the server sent an id; a comparison needs at least MIN_KNOWN of them (the
    tiny target streams about 83% of its ids, the MTP model 98%: a server that sent none would
    otherwise agree with anything)."""
    known = [(o, s) for o, s in zip(ours, server) if s != UNKNOWN_ID]
    assert len(known) >= MIN_KNOWN * len(server), f"{len(known)} of {len(server)} ids streamed: too few to compare"
    return len(ours) == len(server) and all(o == s for o, s in known)


def test_a_comparison_needs_most_of_the_servers_ids():
    assert same_tokens([1, 2, 3, 4], [1, UNKNOWN_ID, 3, 4]) and not same_tokens([1, 2, 3, 4], [1, 2, 3, 5])
    with pytest.raises(AssertionError, match="1 of 4 ids streamed: too few"):
        same_tokens([1, 2, 3, 4], [UNKNOWN_ID, UNKNOWN_ID, UNKNOWN_ID, 9])
    with pytest.raises(AssertionError, match="0 of 3 ids streamed"):
        same_tokens([1, 2, 3], [UNKNOWN_ID] * 3)


@pytest.mark.parametrize(
    "method, depth, ours_params, server_flags",
    [
        ("ngram-mod", 4, dict(ngram_mod_n_match=4, ngram_mod_n_min=1), NGRAM_MOD),
        ("ngram-mod", 8, dict(ngram_mod_n_match=4, ngram_mod_n_min=1), NGRAM_MOD),
        ("ngram-map-k4v", 4, dict(ngram_map_size_n=2, ngram_map_min_hits=1), NGRAM_MAP),
    ],
)
def test_our_ngram_drafters_propose_exactly_what_llama_server_counts(
    pair, tiny_models, method, depth, ours_params, server_flags
):
    ours, server, prompt = pair(tiny_models.gguf_target)
    prefix = "--spec-ngram-mod-" if method == "ngram-mod" else "--spec-ngram-map-k4v-"
    flags = tuple(w for k, v in server_flags.items() for w in (prefix + k.replace("_", "-"), str(v)))
    mine = ours.generate(Request(prompt, NEW_TOKENS, method=method, depth=depth, settings=Settings(**ours_params)))
    server.restart(Arm(method, depth, flags))  # a fresh server: its table learns only from this run
    theirs = server.generate(Request(prompt, NEW_TOKENS, method=method, depth=depth, flags=flags))
    baseline = server.generate(Request(prompt, NEW_TOKENS))
    summary = summarise(mine)
    assert theirs.server.accepted > 0, "no draft was accepted: the test would not tell anything"
    assert (summary["tokens_drafted"], summary["tokens_accepted"]) == (theirs.server.drafted, theirs.server.accepted)
    assert theirs.server.drafter_warm is False  # a fresh server: its table learnt nothing before
    assert same_tokens(mine.tokens, theirs.tokens) and theirs.tokens == baseline.tokens


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_our_mtp_agrees_with_llama_server_draft_mtp(pair, tiny_models, depth):
    ours, server, prompt = pair(tiny_models.gguf_mtp_hybrid)
    mine = ours.generate(Request(prompt, 64, method="mtp", depth=depth))
    theirs = server.generate(Request(prompt, 64, method="draft-mtp", depth=depth))
    assert same_tokens(mine.tokens, theirs.tokens)
    assert same_tokens(ours.generate(Request(prompt, 64)).tokens, theirs.tokens)  # both lossless
    accepted = theirs.server.accepted_by_position
    assert len(accepted) == depth and sum(accepted) > 0
    for position, (a, b, drafted) in enumerate(zip(mine.accepted_by_position, accepted, mine.drafted_by_position)):
        assert abs(a - b) <= max(1, MTP_TOLERANCE * drafted), (position, mine.accepted_by_position, accepted)
    assert abs(summarise(mine)["tokens_accepted"] - theirs.server.accepted) <= max(
        1, MTP_TOLERANCE * theirs.server.drafted
    )

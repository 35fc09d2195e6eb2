"""llama.cpp's n-gram drafters as ported in agent/engines/ngram.py, on known answers: the hashes
against llama.cpp's C arithmetic, the ngram-mod table and draft rules, its two resets, the k4v
map's min_hits and dominance rules, the server's driving (truncation, accept), and both engines
running them losslessly on the tiny models."""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from agent.engines import make_engine
from agent.engines.base import EngineError, Request, Settings
from agent.engines.ngram import (
    MOD_EMPTY,
    MOD_TABLE_SLOTS,
    NgramMapK4v,
    NgramMod,
    NgramModTable,
    ServerDriven,
    _mod_hashes,
    map_hash,
    mod_hash,
)

# Printed by this C program, the hash loops of common/ngram-mod.cpp and common/ngram-map.cpp
# verbatim (gcc on x86-64 Linux, size_t 64-bit):
#   size_t raw(const int32_t *t, size_t n) { size_t res = 0;
#       for (size_t i = 0; i < n; ++i) res = res*6364136223846793005ULL + t[i]; return res; }
#   uint32_t h32(const int32_t *t, size_t n) { uint32_t h = 0;
#       for (size_t i = 0; i < n; ++i) h = h * 2654435761UL + t[i]; return h; }
# with c[i] = 511 - 7*i for i < 24.
C_TOKENS = [511 - 7 * i for i in range(24)]
MOD_KNOWN = [  # (tokens, raw 64-bit hash, slot in the 4M table)
    ([1, 2], 6364136223846793007, 1408815),
    ([510, 102, 345, 278], 10327594587610105767, 4147111),
    (C_TOKENS, 10424597706995863020, 1510892),
]
MAP_KNOWN = [([510, 102, 345, 278], 2667594019, 16675), (C_TOKENS[:12], 1900577542, 33542)]  # (tokens, hash, % 262144)


@pytest.mark.parametrize("tokens,raw,slot", MOD_KNOWN)
def test_mod_hash_equals_llama_cpps(tokens, raw, slot):
    assert mod_hash(tokens) == raw
    assert NgramModTable(len(tokens)).idx(tokens) == slot
    assert MOD_TABLE_SLOTS == 4 * 1024 * 1024


@pytest.mark.parametrize("tokens,raw,slot", MAP_KNOWN)
def test_map_hash_equals_llama_cpps(tokens, raw, slot):
    assert map_hash(tokens, 0, len(tokens)) == raw
    assert raw % 262144 == slot


def test_hashes_equal_explicit_fixed_width_arithmetic():
    """ctypes' c_uint64 and c_uint32 wrap as C's size_t and uint32_t do: an independent check
    of the masking, and of the vectorised form the table uses for many n-grams at once."""
    rng = random.Random(3)
    tokens = [rng.randrange(200_000) for _ in range(300)]
    for n in (1, 4, 24, 64):
        res64 = ctypes.c_uint64(0)
        for token in tokens[:n]:
            res64 = ctypes.c_uint64(res64.value * 6364136223846793005 + token)
        assert mod_hash(tokens[:n]) == res64.value
        res32 = ctypes.c_uint32(0)
        for token in tokens[:n]:
            res32 = ctypes.c_uint32(res32.value * 2654435761 + token)
        assert map_hash(tokens, 0, n) == res32.value
        many = _mod_hashes(np.asarray(tokens, dtype=np.uint64), 5, 100, n)
        assert [int(h) for h in many] == [mod_hash(tokens[5 + i : 5 + i + n]) for i in range(100)]


def _colliding(table: NgramModTable, first: list[int]) -> list[int]:
    """Another n-gram with the same slot as `first`."""
    for a in range(1000):
        other = [a, *first[1:]]
        if other != first and table.idx(other) == table.idx(first):
            return other
    raise AssertionError("no collision found")


def test_table_add_get_and_collisions():
    table = NgramModTable(2, slots=7)
    assert table.get([1, 2]) == MOD_EMPTY
    table.add([1, 2, 3])
    assert table.get([1, 2]) == 3 and table.used == 1
    table.add([1, 2, 4])  # the same n-gram again: its newest follower wins
    assert table.get([1, 2]) == 4 and table.used == 1
    other = _colliding(table, [1, 2])
    table.add([*other, 9])  # a colliding n-gram overwrites the slot, and reads back for both
    assert table.get([1, 2]) == table.get(other) == 9 and table.used == 1
    table.reset()
    assert table.get(other) == MOD_EMPTY and table.used == 0


def test_add_range_equals_adds_one_by_one():
    """Many collisions in a small table: the bulk add leaves what sequential adds leave."""
    rng = random.Random(5)
    tokens = [rng.randrange(50) for _ in range(400)]
    for n in (1, 3):
        one, bulk = NgramModTable(n, slots=61), NgramModTable(n, slots=61)
        for i in range(10, 300):
            one.add(tokens[i:])
        bulk.add_range(tokens, 10, 300)
        assert np.array_equal(one.entries, bulk.entries) and one.used == bulk.used


def _mod_with(pairs: dict[tuple[int, ...], int], n: int, n_min: int, n_max: int) -> NgramMod:
    mod = NgramMod(n, n_min, n_max, slots=1 << 16)
    for key, value in pairs.items():
        mod.mod.add([*key, value])
    return mod


def test_mod_draft_chains_lookups_and_cuts_at_an_empty_slot():
    # (5, 6) -> 7, (6, 7) -> 8, (7, 8) -> 9; (8, 9) is empty.
    chain = {(5, 6): 7, (6, 7): 8, (7, 8): 9}
    assert _mod_with(chain, 2, 1, 10).draft([1, 5], 6) == [7, 8, 9]  # the key is prompt[-1:] + id_last
    assert _mod_with(chain, 2, 3, 10).draft([1, 5], 6) == [7, 8, 9]  # exactly n_min: kept
    assert _mod_with(chain, 2, 1, 2).draft([1, 5], 6) == [7, 8]  # n_max caps it
    refused = _mod_with(chain, 2, 4, 10)
    assert refused.draft([1, 5], 6) == [] and refused.n_draft_last == 0  # shorter than n_min: dropped
    assert _mod_with(chain, 2, 0, 10).draft([1, 9], 9) == []  # nothing at all
    assert NgramMod(3, 1, 10).draft([5], 6) == []  # fewer prompt tokens than n_match


def test_mod_begin_indexes_the_prompt_but_not_its_last_ngram():
    prompt = [10, 11, 12, 13]
    mod = NgramMod(2, 1, 4)
    mod.begin(prompt)
    # (10, 11) -> 12 and (11, 12) -> 13; (12, 13) has no follower yet.
    assert mod.i_last == 2 and mod.mod.used == 2
    assert mod.draft([0, 10], 11) == [12, 13]
    assert mod.draft(prompt, 99) == []


def _history(length: int) -> list[int]:
    """(20, 21) -> 22 early on, filler, and 20 at the end: with id_last 21 the key is (20, 21)."""
    start = [10, 11, 12, 13, 20, 21, 22, 20]
    return [*start, *range(100, 100 + length - len(start) - 1), 20]


def test_mod_adds_new_ngrams_in_chunks_of_32():
    """After begin() the table grows only when more than 32 tokens are not indexed
    (i_last + 32 < cur_len): the generated (20, 21) -> 22 is unknown at 34 tokens, known at 35."""
    mod = NgramMod(2, 1, 4)
    mod.begin(_history(34)[:4])
    assert mod.i_last == 2
    assert mod.draft(_history(34), 21) == []
    assert mod.i_last == 2
    assert mod.draft(_history(35), 21) == [22, 20, 100, 101]
    assert mod.i_last == 35 - 2


@pytest.mark.parametrize("prompt_length,reset", [(26, False), (27, True)])
def test_mod_occupancy_reset_at_begin(prompt_length, reset):
    """A table more than a quarter full after begin() is cleared (n = 1: a token's slot is the
    token modulo the size; 25 of 100 slots stay, 26 go). i_last stays: the prompt is not
    indexed again."""
    mod = NgramMod(1, 1, 4, slots=100)
    mod.begin(list(range(prompt_length)))  # prompt_length - 1 n-grams in distinct slots
    assert mod.resets == int(reset)
    assert mod.mod.used == (0 if reset else prompt_length - 1)
    assert mod.i_last == prompt_length - 1


def test_mod_low_acceptance_streak_resets_the_table():
    chain = {(5, 6): 7, (6, 7): 8, (7, 8): 9, (8, 9): 10}
    mod = _mod_with(chain, 2, 1, 4)
    rounds = [0, 0, 0, 0, 1, 0, 0, 0, 0]  # accepted of 4 drafted; 1/4 = 0.25 is not low
    for accepted in rounds:
        assert mod.draft([1, 5], 6) == [7, 8, 9, 10]
        mod.accept(accepted)
    assert mod.n_low == 4 and mod.resets == 0
    assert mod.draft([1, 5], 6) == [7, 8, 9, 10]
    mod.accept(0)  # the fifth low round in a row
    assert mod.resets == 1 and mod.n_low == 0 and mod.i_last == 0 and mod.mod.used == 0
    assert mod.draft([1, 5], 6) == []
    mod.accept(0)  # no draft, nothing to count
    assert mod.n_low == 0


def test_server_driving_truncates_after_the_drafters_own_rules():
    """The server truncates a draft to its remaining-tokens cap after ngram-mod has checked
    n_min and recorded the draft's length; acceptance is judged on that untruncated length."""
    chain = {(5, 6): 7, (6, 7): 8, (7, 8): 9, (8, 9): 10, (9, 10): 11}
    driven = ServerDriven(_mod_with(chain, 2, 5, 8))
    context = [1, 5, 6]  # prompt [1, 5], id_last 6
    assert driven.propose(context, 2) == [7, 8]
    assert driven.impl.n_draft_last == 5
    driven.accept(context, [7])  # 1/5 < 0.25 is low (1/2 would not be)
    assert driven.impl.n_low == 1
    assert driven.propose([1, 5, 99], 2) == []  # no draft this round ...
    driven.accept([1, 5, 99], [])  # ... so the server calls no accept
    driven.propose(context, 2)
    driven.accept(context, [7, 8])  # 2/5: not low, the streak ends
    driven.accept(context + [7, 8, 0], [])  # a round with nothing to draft (k = 0) calls none either
    assert driven.impl.n_low == 0


# ngram-map-k4v, size_n 2 and size_m 2: key (7, 8), m-grams A = (1, 2) and B = (3, 4).
A2_B1 = [0, 7, 8, 1, 2, 9, 7, 8, 1, 2, 9, 7, 8, 3, 4, 9, 9, 9, 7]  # + sampled 8: key (7, 8)
A2_B2 = [0, 7, 8, 1, 2, 9, 7, 8, 1, 2, 9, 7, 8, 3, 4, 9, 7, 8, 3, 4, 9, 9, 7]
A3 = [0, 7, 8, 1, 2, 9, 7, 8, 1, 2, 9, 7, 8, 1, 2, 9, 9, 9, 7]
LATER = [8, 9, 9, 7]  # appended for a second draft, whose key is (7, 8) again


def _k4v(history: list[int], min_hits: int = 1, hash_slots: int = 262144) -> NgramMapK4v:
    ngram_map = NgramMapK4v(2, 2, min_hits, hash_slots)
    ngram_map.begin(history)
    return ngram_map


def test_k4v_drafts_when_one_value_is_at_least_twice_the_others():
    """A twice, B once: 2 >= 2 * 1, a draft. Its tokens are those after the newest match of the
    key (B here), not the dominant value's, as llama.cpp takes them."""
    ngram_map = _k4v(A2_B1)
    assert ngram_map.draft(A2_B1, 8) == [3, 4]
    key = ngram_map.keys[0]
    assert (key.key_idx, key.key_num, key.stat_idx) == (11, 1, 11)
    assert [(v.value_idx, v.value_num) for v in key.values] == [(3, 2), (13, 1), (0, 0), (0, 0)]
    assert ngram_map.last_draft_created and ngram_map.last_draft_value_idx == 0


def test_k4v_refuses_when_no_value_dominates():
    ngram_map = _k4v(A2_B2)
    assert ngram_map.draft(A2_B2, 8) == []  # 2 < 2 * 2
    assert not ngram_map.last_draft_created


def test_k4v_counts_the_last_match_again_on_the_next_draft():
    """The statistics run from stat_idx to match_pos inclusive, so a second draft on the same
    match counts it twice: B reaches 2 and A no longer dominates."""
    ngram_map = _k4v(A2_B1)
    assert ngram_map.draft(A2_B1, 8) == [3, 4]
    assert ngram_map.draft([*A2_B1, *LATER], 8) == []
    assert [v.value_num for v in ngram_map.keys[0].values][:2] == [2, 2]


def test_k4v_min_hits():
    ngram_map = _k4v(A2_B1, min_hits=2)
    assert ngram_map.draft(A2_B1, 8) == []  # the key's first hit
    assert ngram_map.keys[0].key_num == 1
    assert ngram_map.draft([*A2_B1, *LATER], 8) == [3, 4]  # the second; found through the hash map


def test_k4v_draft_length_is_what_was_accepted_last():
    ngram_map = _k4v(A3)
    assert ngram_map.draft(A3, 8) == [1, 2]
    ngram_map.accept(1)
    assert ngram_map.draft([*A3, *LATER], 8) == [1]
    ngram_map.accept(0)
    assert ngram_map.draft([*A3, *LATER, *LATER], 8) == [] and ngram_map.last_draft_created


def test_k4v_a_colliding_key_stays_unfound():
    """The second draft looks the key up in the hash map and searches only the history not
    hashed yet: in a one-slot map another n-gram holds the slot, and the key is not found."""
    assert _k4v(A2_B1, min_hits=2).draft(A2_B1, 8) == []
    for slots, expected in ((262144, [3, 4]), (1, [])):
        ngram_map = _k4v(A2_B1, min_hits=2, hash_slots=slots)
        ngram_map.draft(A2_B1, 8)
        assert ngram_map.draft([*A2_B1, *LATER], 8) == expected


def test_k4v_needs_history():
    ngram_map = _k4v([7, 8, 1, 2, 7])
    assert ngram_map.draft([7, 8, 1, 2, 7], 8) == []  # fewer than 2 * size_n + size_m tokens


# End to end on the tiny models: both engines, greedy.

REPEATING = "1 2 3 4 5 6 7 8"  # the tiny target's greedy continuation repeats itself
RUNS = {
    "ngram-mod": {"depth": 8, "ngram_mod_n_match": 4, "ngram_mod_n_min": 1},
    "ngram-map-k4v": {"depth": 4, "ngram_map_size_n": 2},
}
NEW_TOKENS = 96


@pytest.fixture(scope="module", params=["mlx", "llama.cpp"])
def engine(request, tiny_models):
    engine = make_engine(request.param)
    engine.load(str(tiny_models.mlx_target if request.param == "mlx" else tiny_models.gguf_target))
    return engine


def _server_replay(method: str, prompt: list[int], tokens: list[int], params: dict) -> tuple[int, int]:
    """Drafted and accepted totals of llama-server's driving over a known greedy output: the
    caps and calls of tools/server, with no model (the target's tokens are `tokens`)."""
    drafter = ServerDriven(
        NgramMod(params["ngram_mod_n_match"], params["ngram_mod_n_min"], params["depth"])
        if method == "ngram-mod"
        else NgramMapK4v(params["ngram_map_size_n"], params["depth"], 1)
    )
    drafter.prefill(prompt)
    emitted, drafted, accepted = 1, 0, 0
    while emitted < len(tokens):
        context = prompt + tokens[:emitted]
        k = min(params["depth"], len(tokens) - emitted - 1)
        draft = drafter.propose(context, k) if k > 0 else []
        kept = 0
        while kept < len(draft) and draft[kept] == tokens[emitted + kept]:
            kept += 1
        drafter.accept(context, draft[:kept])
        drafted, accepted, emitted = drafted + len(draft), accepted + kept, emitted + kept + 1
    return drafted, accepted


@pytest.mark.parametrize("method", list(RUNS))
@pytest.mark.engine
def test_llama_cpp_drafters_are_lossless_and_draft(engine, method):
    prompt = engine.tokenize(REPEATING)
    baseline = engine.generate(Request(prompt, NEW_TOKENS)).tokens
    params = {k: v for k, v in RUNS[method].items() if k != "depth"}
    gen = engine.generate(
        Request(prompt, NEW_TOKENS, method=method, depth=RUNS[method]["depth"], settings=Settings(**params))
    )
    assert gen.tokens == baseline
    drafted, accepted = sum(r.drafted for r in gen.rounds), sum(r.accepted for r in gen.rounds)
    assert drafted > accepted > 0  # drafts accepted, and some rejected (rolled back)
    assert len(gen.tokens) == 1 + accepted + len(gen.rounds)
    emitted = 1
    for r in gen.rounds:  # never past the server's cap: depth, and n_predict remaining - 1
        assert r.drafted <= min(RUNS[method]["depth"], NEW_TOKENS - emitted - 1)
        emitted += r.accepted + 1
    assert (drafted, accepted) == _server_replay(method, list(prompt), baseline, RUNS[method])


@pytest.mark.parametrize("method", list(RUNS))
@pytest.mark.engine
def test_default_parameters_are_lossless(engine, method):
    prompt = engine.tokenize(REPEATING)
    baseline = engine.generate(Request(prompt, 48)).tokens
    depth = 64 if method == "ngram-mod" else 48  # llama.cpp's n_max and size_m
    assert engine.generate(Request(prompt, 48, method=method, depth=depth)).tokens == baseline


@pytest.mark.parametrize(
    "change,message",
    [
        ({"method": "ngram-mod", "ngram_mod_n_match": 0}, r"ngram_mod_n_match: must be at least 1, got 0"),
        ({"method": "ngram-mod", "ngram_mod_n_min": -1}, r"ngram_mod_n_min: must be at least 0, got -1"),
        ({"method": "ngram-map-k4v", "ngram_map_size_n": 1025}, r"ngram_map_size_n: must be at most 1024"),
        ({"method": "ngram-map-k4v", "ngram_map_min_hits": 0}, r"ngram_map_min_hits: must be at least 1"),
    ],
)
@pytest.mark.engine
def test_bad_ngram_parameters_are_refused(engine, change, message):
    with pytest.raises(EngineError, match=message):
        settings = {k: v for k, v in change.items() if k != "method"}
        engine.generate(Request((1, 2, 3), 4, method=change["method"], depth=2, settings=Settings(**settings)))

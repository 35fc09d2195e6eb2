"""The n-gram drafters of both engines' loops, in pure Python: prompt lookup (`ngram`) and
llama.cpp's `ngram-mod` and `ngram-map-k4v`, ported line by line from the llama.cpp commit that
our llama-cpp-python vendors (vendor/llama.cpp: common/ngram-mod.cpp, common/ngram-map.cpp,
common/speculative.cpp, tools/server/server-context.cpp). No library implements them: a port
of the C++ is the only way to run them in our own loops.

Every drafter has the engines' Drafter interface (base.py): `prefill(prompt)` after the
target's prompt pass, `propose(context, k)` before a verify, `accept(context, accepted)` after it.

How llama-server drives llama.cpp's drafters, and how our loops mirror it (`ServerDriven`):

- begin: `common_speculative_begin(spec, slot, prompt)` once per request when the prompt has been
  evaluated, before the first token is sampled (server-context.cpp, SLOT_STATE_DONE_PROMPT),
  with the prompt's tokens. Ours: `prefill(prompt)`.
- draft: each generating round the server sets the draft params (server-context.cpp, "determine
  which slots are generating and drafting"): `prompt` = every token in the slot so far except
  the newest sampled one, `id_last` = that newest token, `n_max` = `get_n_draft_max()` =
  min(n_ctx - n_tokens - 2, n_remaining - 1) where n_remaining = n_predict - tokens generated so
  far. When that is 0 or less the round drafts nothing and the drafter is not called. Ours:
  `k` = min(depth, max_new_tokens - generated - 1), propose() is not called when k is 0, and
  propose(context, k) runs the drafter on context[:-1] and context[-1]. (The n_ctx term is never
  the smaller for a server with our llama.cpp engine's context size: the engine refuses requests
  that need more than prompt + max_new_tokens + depth + 1 positions.)
- The drafter applies its own limits first: ngram-mod's n_max (--spec-ngram-mod-n-max) and its
  n_min (a draft shorter than n_min is dropped: common_speculative_impl_ngram_mod::draft_one),
  k4v's size_m (--spec-ngram-map-k4v-size-m); both are `Request.depth` here. Then
  `common_speculative_draft` truncates the draft to `n_max` (k): a draft of n_min or more may
  end up shorter than n_min near the end of a generation, and ngram-mod's acceptance statistics
  still count the untruncated length (`n_draft_last`), as llama.cpp's do. --spec-draft-n-max and
  --spec-draft-n-min apply to draft-model types only, never to these two.
- accept: after a verify of a non-empty draft the server calls
  `common_speculative_accept(spec, slot, accepted.size() - 1)`: the number of draft tokens the
  target kept. A round without a draft calls nothing. Ours: accept() with the kept prefix, which
  the drafter ignores after a round it did not draft.
- draft_n / draft_n_accepted in the server's timings are the sums of draft sizes and of kept
  tokens over the rounds: our Generation's drafted and accepted totals. One exception: a target
  whose memory the server cannot roll back partially (a full-seq-rm context, or a recurrent one
  rejecting more than its n_rs_seq snapshots) makes it restore a checkpoint and replay the kept
  tokens as the next round's "draft"; accept() then sees a different count. An attention-only
  target (the tiny llama GGUF) never takes that path.

Differences on purpose: llama-server keeps one ngram-mod table for all its slots and requests
(its `mod` is shared state, so a second request starts with the first one's n-grams); our drafter
object starts fresh for every generation, which is what a fresh server sees on its first
request. The k4v map's clean-up in `common_ngram_map_begin` (for a history that shrank between
requests) never runs on a fresh map and is not ported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# common_speculative_impl_ngram_mod: mod(params.ngram_mod.n_match, 4*1024*1024)
MOD_TABLE_SLOTS = 4 * 1024 * 1024
MOD_HASH_MULTIPLIER = 6364136223846793005  # common_ngram_mod::idx
MOD_EMPTY = -1  # common_ngram_mod::EMPTY
MOD_CHUNK_TOKENS = 32  # draft_one adds new n-grams once more than this many tokens are unindexed
MOD_OCCUPANCY_RESET = 0.25  # begin(): a table fuller than this is cleared
MOD_LOW_ACCEPTANCE = 0.25  # accept(): a round keeping less than this fraction is "low"
MOD_LOW_STREAK_RESET = 5  # ...and this many low rounds in a row clear the table
MAP_HASH_SLOTS = 262144  # COMMON_NGRAM_HASH_MAP_SIZE
MAP_HASH_MULTIPLIER = 2654435761  # LCG_FACTOR in common/ngram-map.cpp
MAP_MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES
MAP_MAX_VALUE_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT
_MASK64, _MASK32 = (1 << 64) - 1, (1 << 32) - 1


def ngram_propose(context: Sequence[int], n_min: int, n_max: int, depth: int) -> list[int]:
    """Prompt lookup: find the last n tokens of `context` earlier in it, longest n first
    (n_max down to n_min), and propose up to `depth` tokens that followed; [] when nothing
    matches. The most recent match with `depth` tokens after it wins, because nearby text is
    the better predictor (llama-cpp-python's LlamaPromptLookupDecoding takes the first match);
    a match too close to the end for that (in a short loop) gives way to an earlier one, and
    when no match has `depth` tokens after it, the one with the most does."""
    size = len(context)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = list(context[size - n :])
        best: list[int] = []
        # A match must be followed by at least one token that is not part of the suffix itself.
        for start in range(size - n - 1, -1, -1):
            if context[start] == suffix[0] and list(context[start : start + n]) == suffix:
                following = list(context[start + n : start + n + depth])
                if len(following) == depth:
                    return following
                if len(following) > len(best):
                    best = following
        if best:
            return best
    return []


class PromptLookup:
    """Method `ngram`: ngram_propose on the whole context each round; no state."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max

    def prefill(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int) -> list[int]:
        return ngram_propose(context, self.n_min, self.n_max, k)

    def accept(self, context: list[int], accepted: list[int]) -> None:
        pass


# ngram-mod: common/ngram-mod.cpp and common_speculative_impl_ngram_mod


def mod_hash(tokens: Sequence[int]) -> int:
    """common_ngram_mod::idx before the modulo: res = res * 6364136223846793005 + token over the
    n-gram, in size_t (64-bit unsigned) arithmetic."""
    res = 0
    for token in tokens:
        res = (res * MOD_HASH_MULTIPLIER + token) & _MASK64
    return res


def _mod_hashes(tokens: np.ndarray, first: int, count: int, n: int) -> np.ndarray:
    """mod_hash of the `count` n-grams starting at first, first+1, ... (uint64 wraps as size_t does)."""
    res = np.zeros(count, dtype=np.uint64)
    multiplier = np.uint64(MOD_HASH_MULTIPLIER)
    for i in range(n):
        res = res * multiplier + tokens[first + i : first + i + count]
    return res


class NgramModTable:
    """common_ngram_mod: an int32 table of `slots` entries; the slot of an n-gram (its hash
    modulo the size) holds the token that last followed an n-gram hashing there. Colliding
    n-grams share a slot: the later one overwrites, and a lookup cannot tell them apart."""

    def __init__(self, n: int, slots: int = MOD_TABLE_SLOTS):
        self.n = n
        self.entries = np.full(slots, MOD_EMPTY, dtype=np.int32)
        self.used = 0

    def size(self) -> int:
        return len(self.entries)

    def idx(self, tokens: Sequence[int]) -> int:
        return mod_hash(tokens[: self.n]) % len(self.entries)

    def add(self, tokens: Sequence[int]) -> None:
        """tokens[:n] is the n-gram, tokens[n] the token after it."""
        i = self.idx(tokens)
        if self.entries[i] == MOD_EMPTY:
            self.used += 1
        self.entries[i] = tokens[self.n]

    def add_range(self, tokens: Sequence[int], start: int, stop: int) -> None:
        """add(tokens[i:]) for i in start..stop-1, in that order, in one numpy pass: where two
        n-grams share a slot the later one's token stays, as sequential adds leave it."""
        count = stop - start
        if count <= 0:
            return
        array = np.asarray(tokens, dtype=np.uint64)
        slots = (_mod_hashes(array, start, count, self.n) % np.uint64(len(self.entries))).astype(np.int64)
        values = np.asarray(tokens[start + self.n : stop + self.n], dtype=np.int32)
        # The last add to each slot wins: the first occurrence in the reversed order.
        unique, first_reversed = np.unique(slots[::-1], return_index=True)
        last = count - 1 - first_reversed
        self.used += int(np.count_nonzero(self.entries[unique] == MOD_EMPTY))
        self.entries[unique] = values[last]

    def get(self, tokens: Sequence[int]) -> int:
        """The token stored for tokens[:n]'s slot, or MOD_EMPTY."""
        return int(self.entries[self.idx(tokens)])

    def reset(self) -> None:
        self.entries.fill(MOD_EMPTY)
        self.used = 0


class NgramMod:
    """common_speculative_impl_ngram_mod for one sequence: begin, draft, accept as llama.cpp
    has them (the table here is this object's own; see the module docstring)."""

    def __init__(self, n_match: int, n_min: int, n_max: int, slots: int = MOD_TABLE_SLOTS):
        self.mod = NgramModTable(n_match, slots)
        self.n_min, self.n_max = n_min, n_max
        self.i_last = 0  # the last position of the context added to the table
        self.n_draft_last = 0  # length of the last draft, before the server's truncation
        self.n_low = 0  # consecutive rounds with acceptance below MOD_LOW_ACCEPTANCE
        self.resets = 0  # table resets (occupancy or low acceptance), for tests and audits

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = self.n_draft_last = 0
        n = self.mod.n
        if len(prompt) < n:
            return
        self.mod.add_range(prompt, 0, len(prompt) - n)
        self.i_last = len(prompt) - n
        if self.mod.used / self.mod.size() > MOD_OCCUPANCY_RESET:
            self.mod.reset()  # i_last stays: the prompt's n-grams are not added again
            self.resets += 1

    def draft(self, prompt: Sequence[int], id_last: int) -> list[int]:
        """draft_one: chain table lookups from the last n_match tokens (prompt's and id_last);
        [] when the chain breaks before n_min tokens, else cut at the first empty slot."""
        self.n_draft_last = 0
        cur_len, n = len(prompt), self.mod.n
        if cur_len < n:
            return []
        if self.i_last + MOD_CHUNK_TOKENS < cur_len:  # new n-grams are added in chunks
            self.mod.add_range(prompt, self.i_last, cur_len - n)
            self.i_last = cur_len - n
        window = [*prompt[cur_len - n + 1 :], id_last]
        for i in range(self.n_max):
            token = self.mod.get(window[i:])
            if token == MOD_EMPTY:
                if i < self.n_min:
                    return []
                break
            window.append(token)
        result = window[n:]
        self.n_draft_last = len(result)
        return result

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last == 0:
            return
        if n_accepted / self.n_draft_last < MOD_LOW_ACCEPTANCE:
            self.n_low += 1
            if self.n_low >= MOD_LOW_STREAK_RESET:
                self.mod.reset()
                self.n_low = self.i_last = 0
                self.resets += 1
        else:
            self.n_low = 0


# ngram-map-k4v: common/ngram-map.cpp (key_only = false) and common_speculative_impl_ngram_map_k


def map_hash(tokens: Sequence[int], start: int, length: int) -> int:
    """common_ngram_map_hash: hash = hash * 2654435761 + token in uint32_t arithmetic."""
    h = 0
    for token in tokens[start : start + length]:
        h = (h * MAP_HASH_MULTIPLIER + token) & _MASK32
    return h


@dataclass
class MapValue:
    """common_ngram_map_value: an m-gram seen after a key (value_idx 0: unused slot)."""

    value_idx: int = 0
    value_num: int = 0
    n_accepted: int = -1


@dataclass
class MapKey:
    """common_ngram_map_key: a key n-gram, its hit count and up to MAP_MAX_VALUES values."""

    key_idx: int
    stat_idx: int = 0
    key_num: int = 0
    values: list[MapValue] = field(default_factory=list)


class NgramMapK4v:
    """common_ngram_map with key_only = false: keys of size_key tokens, the m-grams of size_value
    tokens seen after each (four at most), and a draft of the m-gram after the newest key's
    latest match when that key has min_hits hits and its most frequent value is at least twice
    as frequent as all the others together. A hash table (key_map) remembers where each key
    n-gram was seen; positions it cannot hold (collisions) are found by linear search only in
    the part of the history not hashed yet, so a colliding key can stay unfound, as in llama.cpp."""

    def __init__(self, size_key: int, size_value: int, min_hits: int, hash_slots: int = MAP_HASH_SLOTS):
        self.n, self.m, self.min_hits = size_key, size_value, min_hits
        self.keys: list[MapKey] = []
        self.key_map = np.zeros(hash_slots, dtype=np.int64)  # uint32 in llama.cpp; 0 = empty
        self.key_map_last_idx = 0
        self.size_last_begin = 0
        self.idx_last_check = 0
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """common_ngram_map_begin on a fresh map: remember where the prompt ends."""
        self.idx_last_check = self.size_last_begin = len(prompt)

    def _matches(self, inp: Sequence[int], j: int, key: list[int]) -> bool:
        return list(inp[j : j + self.n]) == key

    def _hash_positions(self, inp: Sequence[int], high: int, low: int) -> None:
        """Store j in key_map for j from `high` down to low+1, each only into an empty slot
        (so the first, highest j of each slot wins, and earlier entries stay)."""
        if high <= low:
            return
        count = high - low
        array = np.asarray(inp, dtype=np.uint32)
        h = np.zeros(count, dtype=np.uint32)
        positions = np.arange(high, low, -1)
        for k in range(self.n):
            h = h * np.uint32(MAP_HASH_MULTIPLIER) + array[positions + k]
        slots = (h % np.uint32(len(self.key_map))).astype(np.int64)
        unique, first = np.unique(slots, return_index=True)
        empty = self.key_map[unique] == 0
        self.key_map[unique[empty]] = positions[first[empty]]

    def draft(self, inp: Sequence[int], sampled: int) -> list[int]:
        """common_ngram_map_draft for k4v; [] when there is no draft."""
        self.last_draft_created = False
        self.last_draft_key_idx = self.last_draft_value_idx = 0
        cur_len, n, m = len(inp), self.n, self.m
        if cur_len < 2 * n + m:
            return []
        self.idx_last_check = cur_len
        key = [*inp[cur_len - n + 1 :], sampled]

        match_pos = 0
        idx_key = int(self.key_map[map_hash(key, 0, n) % len(self.key_map)])
        if idx_key != 0 and idx_key < cur_len - n - m - 1 and self._matches(inp, idx_key, key):
            match_pos = idx_key
        if match_pos == 0 and self.size_last_begin > n + m + 1:
            for j in range(self.size_last_begin - n - m - 1, self.key_map_last_idx, -1):
                if self._matches(inp, j, key):
                    match_pos = j
                    break
        if match_pos == 0:
            for j in range(cur_len - n - m - 1, max(self.size_last_begin, self.key_map_last_idx), -1):
                if self._matches(inp, j, key):
                    match_pos = j
                    break

        # Hash the n-grams not hashed yet, in the order searched above.
        if self.size_last_begin > n + m + 1:
            self._hash_positions(inp, self.size_last_begin - n - m - 1, self.key_map_last_idx)
        self._hash_positions(inp, cur_len - n - m - 1, max(self.size_last_begin, self.key_map_last_idx))
        self.key_map_last_idx = max(cur_len - n - m - 1, self.key_map_last_idx)

        if match_pos == 0:
            return []
        offset = next((i for i, k in enumerate(self.keys) if self._matches(inp, k.key_idx, key)), len(self.keys))
        if offset == len(self.keys):
            values = [MapValue(value_num=0, n_accepted=m) for _ in range(MAP_MAX_VALUES)]
            self.keys.append(MapKey(key_idx=match_pos, values=values))
        current = self.keys[offset]
        current.key_num = min(current.key_num + 1, MAP_MAX_VALUE_COUNT)
        if current.key_num < self.min_hits:
            return []

        # Count the m-grams after every occurrence of the key from stat_idx to match_pos (both
        # included: an occurrence at stat_idx is counted again, as llama.cpp counts it).
        for i in range(current.stat_idx, match_pos + 1):
            if not self._matches(inp, i, key):
                continue
            begin = i + n
            found = -1
            for v, value in enumerate(current.values):
                if value.value_idx == 0:  # an empty slot: a new m-gram
                    current.values[v] = MapValue(begin, 0, m)
                    found = v
                    break
                if list(inp[begin : begin + m]) == list(inp[value.value_idx : value.value_idx + m]):
                    found = v
                    break
            if found >= 0:
                current.values[found].value_num = min(current.values[found].value_num + 1, MAP_MAX_VALUE_COUNT)
        current.stat_idx = match_pos

        max_occur, slot_max = 0, 0
        for v, value in enumerate(current.values):
            if value.value_num > max_occur:
                max_occur, slot_max = value.value_num, v
        sum_occur = sum(value.value_num for v, value in enumerate(current.values) if v != slot_max)
        if sum_occur > 0 and max_occur < 2 * sum_occur:
            return []  # no value dominates

        # The tokens after this match (not after the chosen value's position), as many as that
        # value's tokens were accepted last time (m at first).
        n_draft = min(m, current.values[slot_max].n_accepted)
        self.last_draft_created = True
        self.last_draft_key_idx, self.last_draft_value_idx = offset, slot_max
        return list(inp[match_pos + n : match_pos + n + max(n_draft, 0)])

    def accept(self, n_accepted: int) -> None:
        """common_ngram_map_accept: the value drafted last remembers how many tokens were kept."""
        if self.last_draft_created:
            self.keys[self.last_draft_key_idx].values[self.last_draft_value_idx].n_accepted = n_accepted


class ServerDriven:
    """A llama.cpp n-gram implementation (begin/draft/accept) driven as llama-server drives it:
    see the module docstring."""

    def __init__(self, impl: NgramMod | NgramMapK4v):
        self.impl = impl
        self._drafted = False  # whether the last propose() drafted: only then does accept() count

    def prefill(self, prompt: list[int]) -> None:
        self.impl.begin(prompt)

    def propose(self, context: list[int], k: int) -> list[int]:
        draft = self.impl.draft(context[:-1], context[-1])
        self._drafted = bool(draft)
        return draft[:k]  # common_speculative_draft's truncation to dp.n_max

    def accept(self, context: list[int], accepted: list[int]) -> None:
        if self._drafted:
            self.impl.accept(len(accepted))
        self._drafted = False


def make_drafter(method: str, request) -> PromptLookup | ServerDriven:
    """The n-gram drafter of `method` ("ngram", "ngram-mod", "ngram-map-k4v") for a Request,
    fresh for one generation."""
    if method == "ngram":
        return PromptLookup(request.settings.ngram_n_min, request.settings.ngram_n_max)
    if method == "ngram-mod":
        settings = request.settings
        return ServerDriven(NgramMod(settings.ngram_mod_n_match, settings.ngram_mod_n_min, request.depth))
    if method == "ngram-map-k4v":
        settings = request.settings
        return ServerDriven(NgramMapK4v(settings.ngram_map_size_n, request.depth, settings.ngram_map_min_hits))
    raise ValueError(f"no n-gram drafter for method {method!r}")


NGRAM_METHODS = ("ngram", "ngram-mod", "ngram-map-k4v")

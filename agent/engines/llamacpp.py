"""llama.cpp engine: llama-cpp-python's low-level API, our own decode loop.

Every forward pass is one `llama_decode` of a batch we fill; greedy tokens come from llama.cpp's
greedy sampler inside that pass's graph on CUDA, else from the argmax of the logits row in place,
and sampled tokens from a llama.cpp sampler chain (_Chain, GREEDY); speculative rounds put the last emitted
token and the K proposals in one batch with logits for every row, keep the longest prefix
that matches the target's own samples, and drop the rest from the KV cache with
`llama_memory_seq_rm` (recurrent state: see `_Context`). Drafters share one interface
(base.Drafter): a draft model (`_DraftModel`), the target's own MTP head (llamacpp_mtp.py), the
n-gram drafters (ngram.py). llama-cpp-python's high-level `Llama` is used only for the reference
arms.

Runs are fixed-length: every end-of-generation token of the vocabulary (llama_vocab_is_eog) is
banned where the target samples, with a logit-bias sampler first in the chain, as llama-server
applies `ignore_eos` (common/common.cpp puts the EOG biases in the sampling params' logit_bias,
common/sampling.cpp adds them before the sampling steps). The server's draft samplers are built
without them (common/speculative.cpp: a top-k chain of their own), so ours are too. The
reference arms get the same ban through Llama.generate's logits_processor.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path

import llama_cpp as ll
import numpy as np
from llama_cpp import Llama  # imported before our log callback is set: importing it sets its own
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from specfleet import settings as declared
from specfleet.settings import Settings

from .. import prompts
from . import ENGINE_METHODS, llamacpp_lib, ngram
from . import llamacpp_mtp as mtp
from .base import (
    MAX_DEPTH,
    REFERENCE_METHODS,
    Drafter,
    EngineError,
    Generation,
    Margin,
    Request,
    Round,
    Sampler,
    make_generation,
    margin_problem,
    record_round,
    top_two,
    validate,
)
from .llamacpp_lib import backend, library_dir

GPU_LAYERS_ALL = 0x7FFFFFFF  # offload every layer (Metal on a Mac); ignored by CPU-only builds
VOCAB_SIZE_SLACK = 128  # llama.cpp's own draft check allows padded vocabularies to differ this much
GGML_LOG_LEVEL_ERROR = 3
# Recurrent-state snapshots the target keeps per decode call (llama_context_params.n_rs_seq), so
# that a verify batch of up to MAX_DEPTH proposals can be rolled back to any accepted prefix.
ROLLBACK_SNAPSHOTS = MAX_DEPTH
STATE_RECURRENT_ONLY = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # a hybrid's recurrent state, not its KV cache
# How greedy requests sample (_Chain): "device" runs llama.cpp's greedy sampler inside the forward
# pass's graph (backend sampling, llama_set_sampler) on the backends in DEVICE_GREEDY_BACKENDS and
# takes the argmax in place elsewhere; "in-place" takes the argmax of the logits row on the host;
# "chain" uses llama.cpp's CPU sampler chain (the way before issue 28). bench/overhead.py compares them.
GREEDY = "device"
GREEDY_MODES = ("device", "in-place", "chain")
# On the CPU backend the graph's argmax made a forward pass slower (49k vocabulary: 0.98 -> 1.33 ms,
# 151k: 2.8 -> 4.2 ms, 1 thread) than the in-place argmax it saves (4-35 us): CPU contexts keep that.
DEVICE_GREEDY_BACKENDS = frozenset({"cuda"})
MAX_ROW_VIEWS = 4 * (MAX_DEPTH + 1)  # numpy views of logits rows a chain keeps (a verify batch has up to MAX_DEPTH + 1)

_log = logging.getLogger(__name__)


def _address_of(function):
    """`function` (llama_get_logits_ith, llama_get_sampled_logits_ith: context, row -> float *)
    called through a prototype that returns the address as a Python int (0 for NULL), not a
    ctypes pointer object that `ctypes.addressof(pointer.contents)` must then take apart."""
    prototype = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
    return prototype(ctypes.cast(function, ctypes.c_void_p).value)


_logits_address = _address_of(ll.llama_get_logits_ith)
_sampled_logits_address = _address_of(ll.llama_get_sampled_logits_ith)


@ll.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs every load and context creation; keep only errors, through logging.
    if level == GGML_LOG_LEVEL_ERROR:
        _log.error(text.decode("utf-8", errors="replace").rstrip())


ll.llama_log_set(_quiet_log, ctypes.c_void_p(0))
ll.llama_backend_init()


def _peak_rss_bytes() -> int:
    """The process's peak resident set size: ru_maxrss is KiB on Linux and bytes on macOS.
    It never goes down, so it is the peak of the worker process so far, not of one run."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _ggml_build() -> dict[str, str]:
    """ggml's version and the llama.cpp commit it was built from, read from the loaded library."""
    for lib in sorted(library_dir(Path(ll.__file__).parent).glob("*ggml-base*")):
        try:
            ggml = ctypes.CDLL(str(lib))
            ggml.ggml_commit.restype = ggml.ggml_version.restype = ctypes.c_char_p
            return {"ggml": ggml.ggml_version().decode(), "llama.cpp.commit": ggml.ggml_commit().decode()}
        except (OSError, AttributeError):
            continue
    return {}


def _backend() -> str:
    """The compute backend the loaded llama.cpp runs on (llamacpp_lib.backend), "" if unreadable."""
    for lib in sorted(library_dir(Path(ll.__file__).parent).glob("libggml.*")):
        try:
            return backend(ctypes.CDLL(str(lib)))
        except (OSError, AttributeError):
            continue
    return ""


class _Context:
    """One model and its context, batch and KV cache; `n_past` positions are cached, holding `tokens`.

    A recurrent memory (Mamba, the GatedDeltaNet layers of hybrids like Qwen3.5) keeps one state,
    not one entry per position, so it cannot simply drop a suffix. llama.cpp rolls it back from
    per-token snapshots of the last decode call where the context keeps them (`snapshots`,
    n_rs_seq, for the archs that support it); otherwise truncate() restores the state saved by
    checkpoint() and re-decodes the kept tokens after it. Attention-only memories drop a suffix."""

    def __init__(
        self,
        path: str,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        n_threads_batch: int,
        flash_attn: bool,
        snapshots: int = 0,
        load_mtp: bool = False,
        declared_cparams: dict | None = None,
    ):
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = GPU_LAYERS_ALL
        mparams.use_extra_bufts = not llamacpp_lib.cpu_has_amx()  # ggml's AMX repack crashes (cpu_has_amx)
        mparams.load_mtp = load_mtp
        self.model = ll.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise EngineError(f"llama.cpp could not load {path}")
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_threads, cparams.n_threads_batch = n_threads, n_threads_batch
        cparams.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.n_rs_seq = snapshots
        cparams.n_outputs_max_per_seq = MAX_DEPTH + 1  # a verify batch's rows, for a sampler in the graph
        cparams.no_perf = True
        for name, (value, constant) in (declared_cparams or {}).items():  # specfleet/settings.py
            setattr(cparams, name, getattr(ll, constant + str(value).upper()) if constant else value)
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            ll.llama_model_free(self.model)
            raise EngineError(f"llama.cpp could not create a context for {path}")
        self.cparams = cparams  # an MTP context on this model copies them
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.end_tokens = [i for i in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, i)]
        self.n_embd = ll.llama_model_n_embd_out(self.model)
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        self._token, self._pos, self._logits = self.batch.token, self.batch.pos, self.batch.logits
        self.batch.n_seq_id[0], self.batch.seq_id[0][0] = 1, 0  # row 0's sequence, as decode() writes it
        self.n_batch, self.n_ctx, self.n_past = n_batch, n_ctx, 0
        self.recurrent = ll.llama_model_is_recurrent(self.model) or ll.llama_model_is_hybrid(self.model)
        self.snapshots = ll.llama_n_rs_seq(self.ctx)  # 0 where the arch cannot keep them
        self.tokens: list[int] = []
        self.last_decoded = 0  # tokens in the last llama_decode call: the span snapshots cover
        self.saved: tuple[int, ctypes.Array] | None = None  # (position, recurrent state) of checkpoint()
        self.keep_hidden = False
        self.hidden: np.ndarray | None = None  # h of every token of the last decode(), if keep_hidden
        self.device_sampler = None  # llama.cpp's greedy chain in this context's graph (sample_on_device)

    def decode(self, tokens: list[int], all_logits: bool = False) -> None:
        """Append `tokens` to the cache; logits for every row, or for the last one only."""
        if len(tokens) == 1 and not self.keep_hidden:
            self._step(tokens[0])
            return
        batch, rows = self.batch, []
        for first in range(0, len(tokens), self.n_batch):
            chunk = tokens[first : first + self.n_batch]
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = all_logits
            batch.logits[len(chunk) - 1] = True
            rc = ll.llama_decode(self.ctx, batch)
            if rc != 0:
                raise EngineError(f"llama_decode failed with status {rc} at position {self.n_past}")
            self.n_past += len(chunk)
            self.tokens += chunk
            self.last_decoded = len(chunk)
            if self.keep_hidden:
                rows.append(mtp.hidden_rows(self.ctx, len(chunk), self.n_embd))
        if rows:
            self.hidden = np.concatenate(rows)

    def _step(self, token: int) -> None:
        """decode() of one token, the decode loop's every step: the batch's row 0 keeps its
        sequence fields from earlier batches (every decode writes them alike), so only the token,
        its position and its logits flag are written, through pointers kept at the start."""
        self._token[0], self._pos[0], self._logits[0] = token, self.n_past, True
        self.batch.n_tokens = 1
        rc = ll.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise EngineError(f"llama_decode failed with status {rc} at position {self.n_past}")
        self.n_past += 1
        self.tokens.append(token)
        self.last_decoded = 1

    def set_hidden(self, on: bool) -> None:
        """Keep the final-normed hidden state of every decoded token in `hidden` (for MTP) or not."""
        if on != self.keep_hidden:
            mtp.set_hidden_output(self.ctx, on)
            self.keep_hidden, self.hidden = on, None

    def sample_on_device(self, on: bool) -> None:
        """Put llama.cpp's greedy sampler into the graph of this context's forward passes (on), so
        that every output row's argmax is taken where the logits are and read back as one token
        (llama_get_sampled_token_ith), or take it out (off: raw logits rows again). llama.cpp
        keeps the logits rows too (llama_get_sampled_logits_ith). Changing it rebuilds the
        context's graph reservation at the next decode."""
        if on == (self.device_sampler is not None):
            return
        if on:
            params = ll.llama_sampler_chain_default_params()
            params.no_perf = True
            chain = ll.llama_sampler_chain_init(params)
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
            if ll.llama_set_sampler(self.ctx, 0, chain):
                self.device_sampler = chain
            else:  # this backend cannot run it: logits rows as before
                ll.llama_sampler_free(chain)
            return
        ll.llama_set_sampler(self.ctx, 0, None)
        ll.llama_sampler_free(self.device_sampler)
        self.device_sampler = None

    def checkpoint(self) -> None:
        """Save the recurrent state at the current position, for truncate() to return to.
        Attention-only memories need none."""
        if not self.recurrent:
            return
        size = ll.llama_state_seq_get_size_ext(self.ctx, 0, STATE_RECURRENT_ONLY)
        state = self.saved[1] if self.saved and len(self.saved[1]) == size else (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data_ext(self.ctx, state, size, 0, STATE_RECURRENT_ONLY) != size:
            raise EngineError(f"llama.cpp could not save the recurrent state at position {self.n_past}")
        self.saved = (self.n_past, state)

    def truncate(self, n: int) -> None:
        """Forget cached positions from `n` on."""
        if n >= self.n_past:
            return
        # Snapshots of a recurrent state cover the last decode call short of its first token:
        # llama.cpp keeps none from before the call, and would return a stale one.
        drop = not self.recurrent or self.n_past - n < min(self.last_decoded, self.snapshots + 1)
        # llama.cpp returns false where it cannot drop the suffix; continuing would decode on
        # top of rejected draft tokens.
        if drop and ll.llama_memory_seq_rm(self.mem, 0, n, -1):
            self._cut(n)
        elif self.recurrent and self.saved is not None and self.saved[0] <= n:
            self._restore(n)
        else:
            raise EngineError(
                f"this model's memory cannot roll back to position {n} (llama_memory_seq_rm refused"
                f"{', and no checkpoint of its recurrent state' if self.recurrent else ''}): "
                "speculative methods need a cache that can drop rejected tokens"
            )

    def _restore(self, n: int) -> None:
        """Back to the checkpoint, then decode the tokens from there up to position `n` again."""
        position, state = self.saved
        restored = ll.llama_state_seq_set_data_ext(self.ctx, state, len(state), 0, STATE_RECURRENT_ONLY) == len(state)
        # The recurrent state is back at `position`; the attention cache still holds the suffix.
        if not restored or not ll.llama_memory_seq_rm(self.mem, 0, position, -1):
            raise EngineError(f"llama.cpp could not restore the recurrent state saved at position {position}")
        replay = self.tokens[position:n]
        self._cut(position)
        if replay:
            self.decode(replay)

    def _cut(self, n: int) -> None:
        self.n_past, self.last_decoded = n, 0  # snapshots are single-use: none left until the next decode
        del self.tokens[n:]
        if self.saved is not None and self.saved[0] > n:
            self.saved = None  # a checkpoint past the cache is no longer the state of its tokens

    def clear(self) -> None:
        ll.llama_memory_clear(self.mem, False)
        self.n_past, self.last_decoded, self.saved = 0, 0, None
        self.tokens = []

    def token_texts(self) -> list[bytes]:
        return [ll.llama_vocab_get_text(self.vocab, i) for i in range(self.n_vocab)]

    def close(self) -> None:
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ctx)
        if self.device_sampler is not None:  # the context only borrowed it
            ll.llama_sampler_free(self.device_sampler)
            self.device_sampler = None
        ll.llama_model_free(self.model)


class _Chain:
    """A llama.cpp sampler chain: greedy, or top-k, top-p, temperature and a seeded draw, in
    llama.cpp's usual order. Draft and verify each get one with the same settings; with
    `banned` (token ids of a vocabulary of n_vocab), a logit bias of -inf on them comes first.

    Greedy sampling skips the chain (GREEDY, unless "chain"): llama_sampler_sample fills a
    candidate array of the whole vocabulary (12 bytes a token), biases it and scans it, every
    token (about 150 us a token at a 49k vocabulary on the H200 machine's CPU, issue 28). Where
    the context runs llama.cpp's greedy sampler in its graph (_Context.sample_on_device) the
    token is read back as it chose it; elsewhere the argmax of the logits row, read in place
    through a numpy view of llama.cpp's own buffer (no copy), is the same token: the first
    maximum, as llama.cpp's greedy sampler picks it. Only where that token is banned is the row
    copied, the banned ids set to -inf, and the argmax taken again, as the logit-bias sampler
    would have it."""

    def __init__(self, sampler: Sampler, banned: list[int] | None = None, n_vocab: int = 0):
        if GREEDY not in GREEDY_MODES:
            raise EngineError(f"llamacpp.GREEDY is {GREEDY!r}; it must be one of {', '.join(GREEDY_MODES)}")
        self.in_place = sampler.greedy and GREEDY != "chain"
        self.banned = frozenset(banned or ())
        self._banned_ids = np.array(sorted(self.banned), dtype=np.intp)
        self._views: dict[tuple[int, int], np.ndarray] = {}  # (address, n_vocab) -> a view of that row
        self._vocab_sizes: dict[int, int] = {}  # id of a context without n_vocab -> its vocabulary size
        params = ll.llama_sampler_chain_default_params()
        params.no_perf = True
        self.chain = ll.llama_sampler_chain_init(params)
        if banned:
            biases = (ll.llama_logit_bias * len(banned))(*[ll.llama_logit_bias(t, float("-inf")) for t in banned])
            ll.llama_sampler_chain_add(self.chain, ll.llama_sampler_init_logit_bias(n_vocab, len(banned), biases))
        if sampler.greedy:
            ll.llama_sampler_chain_add(self.chain, ll.llama_sampler_init_greedy())
        else:  # the declared sampler rows in llama.cpp's order (top-k, top-p, ..., temperature, dist(seed))
            for row, value in declared.sampler_chain(sampler):
                init = getattr(ll, f"llama_sampler_init_{row.llama_sampler}")
                ll.llama_sampler_chain_add(self.chain, init(value, *row.llama_args))

    def sample(self, context: _Context, row: int = -1) -> int:
        if not self.in_place:
            return ll.llama_sampler_sample(self.chain, context.ctx, row)
        if getattr(context, "device_sampler", None) is not None:
            token = ll.llama_get_sampled_token_ith(context.ctx, row)
            if token >= 0 and token not in self.banned:
                return token
            logits = self.logits(context, row, _sampled_logits_address)
        else:
            logits = self.logits(context, row)
        token = int(logits.argmax())
        return self.unbanned(logits) if token in self.banned else token

    def unbanned(self, logits: np.ndarray) -> int:
        """The argmax of a logits row whose own argmax is banned: the row copied, the banned ids
        set to -inf, as the logit-bias sampler would have it."""
        masked = logits.copy()
        masked[self._banned_ids[self._banned_ids < len(masked)]] = -np.inf
        return int(masked.argmax())

    def logits(self, context, row: int = -1, getter=_logits_address) -> np.ndarray:
        """Output row `row` of the context's last decode as a float32 view of llama.cpp's buffer
        (`getter`: the raw logits, or the sampled logits where a sampler runs in the graph, as an
        address, _address_of): valid until the context decodes again. Views are kept per
        address, so a row costs one call and a dictionary lookup."""
        address = getter(context.ctx, row)
        if not address:
            raise EngineError(f"llama.cpp holds no logits for output row {row}")
        key = (address, getattr(context, "n_vocab", 0) or self._vocab_size(context))
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= MAX_ROW_VIEWS:  # the buffer moved (it grew): forget the old rows
                self._views.clear()
            view = self._views[key] = np.ctypeslib.as_array((ctypes.c_float * key[1]).from_address(address))
        return view

    def _vocab_size(self, context) -> int:
        """The vocabulary size of a context that does not carry it (the MTP head's)."""
        size = self._vocab_sizes.get(id(context))
        if size is None:
            model = ll.llama_get_model(context.ctx)
            size = self._vocab_sizes[id(context)] = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
        return size

    def free(self) -> None:
        ll.llama_sampler_free(self.chain)
        self._views.clear()


class _DraftModel:
    """A smaller model with the target's vocabulary. Its cache holds the first `cached`
    tokens of the context, then the `pending` proposals of the last round (all but its last),
    which the target may not keep. A recurrent draft returns to a checkpoint taken before
    them, so it keeps none."""

    def __init__(self, context: _Context, chain: _Chain):
        self.context, self.chain = context, chain
        self.cached = 0
        self.pending: list[int] = []

    def prefill(self, prompt: list[int]) -> None:
        self.context.clear()
        self.context.decode(prompt)
        self.cached, self.pending = len(prompt), []

    def propose(self, context: list[int], k: int) -> list[int]:
        kept = 0
        # The newest context token is always fed, never kept from the cache.
        while (
            not self.context.recurrent
            and kept < len(self.pending)
            and self.cached + kept < len(context) - 1
            and context[self.cached + kept] == self.pending[kept]
        ):
            kept += 1
        self.cached += kept
        self.context.truncate(self.cached)
        self.context.decode(context[self.cached :])
        if k > 1:
            self.context.checkpoint()  # the state before the proposals, which may be rejected
        tokens = [self.chain.sample(self.context)]
        while len(tokens) < k:
            self.context.decode(tokens[-1:])
            tokens.append(self.chain.sample(self.context))
        self.cached, self.pending = len(context), tokens[:-1]
        return tokens

    def accept(self, context: list[int], accepted: list[int]) -> None:
        """Nothing to do after a verify: propose() catches up with the context itself."""


@contextlib.contextmanager
def _no_repack_on_amx():
    """llama-cpp-python's Llama (the ref-* paths) built without weight repacking where the CPU has
    AMX, as the engine's own model is (llamacpp_lib.cpu_has_amx): Llama exposes no
    use_extra_bufts, so the default parameters it asks for are given with it off meanwhile."""
    if not llamacpp_lib.cpu_has_amx():
        yield
        return
    import llama_cpp.llama_cpp as low

    original = low.llama_model_default_params

    def without_repack():
        params = original()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = without_repack
    try:
        yield
    finally:
        low.llama_model_default_params = original


def _argmax_loop(
    target: _Context, chain: _Chain, n: int, start: float, synchronous: bool
) -> tuple[list[int], list[float]]:
    """The greedy baseline's decode loop with the argmax taken on the host (_Chain), after the
    prompt is decoded: `n` tokens and their times since `start`. The steps of `_Context.decode`
    of one token and `_Chain.sample`, written out with everything bound to locals first, because
    after a forward pass has streamed a large output matrix through the caches every operation of
    the step runs cold (bench/overhead.py sets the loop's time against one argmax over the same
    row): per token, one `llama_decode` and the argmax of a numpy view of llama.cpp's logits row
    into a 0-d int64 array, whose int32 half is the batch's row 0 token for the loop (its
    positions pointer NULL, so that llama.cpp numbers each token after its sequence's last): no
    store into the batch and no numpy scalar a token (at 151k, 5-13 us a token less than a
    ctypes store of the token and its position, measured side by side); the clock's raw
    readings, made relative to `start` after. Both pointers are put back when the loop ends.

    The row of a one-token decode is the start of the context's output buffer (llama_context::
    output_reserve puts the logits first and reallocates only to grow, which one-row decodes
    never need), so its view is made once from the prompt's row. Where the backend is
    `synchronous` (the CPU's: llama_decode returns with the logits copied) nothing else crosses
    into llama.cpp per token; elsewhere `llama_synchronize` does, as llama_get_logits_ith would.
    The row's address is asked again after the last token: had it moved, the run is refused."""
    decode, synchronize, clock = ll.llama_decode, ll.llama_synchronize, time.perf_counter
    ctx, batch, banned = target.ctx, target.batch, chain.banned
    address = _logits_address(ctx, -1)
    if not address:
        raise EngineError("llama.cpp holds no logits for the prompt's last row")
    logits = np.ctypeslib.as_array((ctypes.c_float * target.n_vocab).from_address(address))
    argmax, slot = logits.argmax, np.zeros((), dtype=np.int64)
    argmax(out=slot)
    token = int(slot)
    if token in banned:
        slot[()] = token = chain.unbanned(logits)
    tokens, times = [token], [clock()]
    batch.n_tokens, target._logits[0] = 1, True
    int32 = ctypes.POINTER(ctypes.c_int32)
    ids, positions = ctypes.cast(batch.token, int32), ctypes.cast(batch.pos, int32)  # the pointers, not views
    # Row 0's token is the argmax's own output: the int32 half of `slot` that holds its value.
    batch.token = ctypes.cast(slot.ctypes.data + (0 if sys.byteorder == "little" else 4), int32)
    batch.pos = None  # llama.cpp numbers each token after its sequence's last (llama_batch_allocr::init)
    try:
        for i in range(n - 1):
            if rc := decode(ctx, batch):
                raise EngineError(f"llama_decode failed with status {rc} at position {target.n_past + i}")
            if not synchronous:
                synchronize(ctx)
            argmax(out=slot)
            token = int(slot)
            if token in banned:
                slot[()] = token = chain.unbanned(logits)
            tokens.append(token)
            times.append(clock())
    finally:
        batch.token, batch.pos = ids, positions
    times = [t - start for t in times]
    if n > 1:
        target.tokens += tokens[:-1]
        target.n_past, target.last_decoded = target.n_past + n - 1, 1
        if _logits_address(ctx, -1) != address:
            raise EngineError(
                "llama.cpp moved its logits buffer during the decode loop; its tokens are not to be trusted"
            )
    return tokens, times


class LlamaCppEngine:
    name = "llama.cpp"
    methods = ENGINE_METHODS["llama.cpp"]

    def __init__(
        self,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        flash_attn: bool = True,
        settings: Settings | None = None,
    ):
        # Threads: llama-cpp-python's default (half the logical CPUs) for single-token passes, and
        # the same for batches (prompt, verify), as llama.cpp's own tools default them, not
        # llama-cpp-python's every logical CPU: a batch's threads meet at a barrier per op, and one
        # thread descheduled stalls them all (on a loaded 2-core machine a 5-row verify took
        # 0.2-2 s with 2 batch threads, 1-44 ms with 1; the H200's multi-pass arms ran 2-20x slower
        # beside another process with 16). The reference arms get the same. A job's declared
        # settings (specfleet/settings.py: threads, ...) set its context parameters.
        self.n_ctx, self.n_batch, self.flash_attn = n_ctx, n_batch, flash_attn
        self.declared_cparams = declared.llama_cparams(settings) if settings is not None else {}
        threads = self.declared_cparams.get("n_threads", (None, ""))[0]  # the reference Llama takes them too
        self.n_threads = n_threads or threads or max(multiprocessing.cpu_count() // 2, 1)
        self.n_threads_batch = n_threads_batch or threads or self.n_threads
        self._target: _Context | None = None
        self._draft: _Context | None = None
        self._mtp: mtp.MtpContext | None = None  # the target's MTP head, built on first use
        self._mtp_problem = ""  # why the target cannot serve method mtp
        self._target_path = ""
        self._references: dict[str, object] = {}
        self._device_backend: bool | None = None  # whether GREEDY "device" applies here, read once
        self._cpu_backend: bool | None = None  # whether llama_decode is synchronous here (_synchronous)

    def _open(self, path: str, snapshots: int = 0, load_mtp: bool = False) -> _Context:
        return _Context(
            path,
            self.n_ctx,
            self.n_batch,
            self.n_threads,
            self.n_threads_batch,
            self.flash_attn,
            snapshots,
            load_mtp,
            self.declared_cparams,
        )

    @staticmethod
    def _inspect(path: str) -> mtp.GgufInfo | None:
        """The file's layer facts; refuses a model llama.cpp would abort the process on."""
        info = mtp.read_gguf(path)
        if info is not None and info.load_problem():
            raise EngineError(info.load_problem())
        return info

    def load(self, target: str, draft: str | None = None) -> float:
        started = time.perf_counter()
        self.close()
        info = self._inspect(target)
        if draft is not None:
            self._inspect(draft)
        self._mtp_problem = info.mtp_problem() if info else f"method 'mtp' found no MTP head in {target}"
        # The target keeps recurrent-state snapshots for rollback, and loads its MTP head if it has one.
        self._target = self._open(target, ROLLBACK_SNAPSHOTS, load_mtp=not self._mtp_problem)
        self._target_path = target
        if draft is not None:
            self._draft = self._open(draft)
            problem = self._vocab_problem(self._target, self._draft)
            if problem:
                self._draft.close()
                self._draft = None
                raise EngineError(f"draft {draft} has another vocabulary than target {target}: {problem}")
        return time.perf_counter() - started

    @staticmethod
    def _vocab_problem(target: _Context, draft: _Context) -> str:
        """What makes the two vocabularies incompatible, as llama.cpp's speculative example
        checks it: size (within padding), BOS/EOS, and every shared token's text."""
        if abs(target.n_vocab - draft.n_vocab) > VOCAB_SIZE_SLACK:
            return f"{draft.n_vocab} tokens vs {target.n_vocab}"
        for what in ("bos", "eos"):
            fn = getattr(ll, f"llama_vocab_{what}")
            if fn(target.vocab) != fn(draft.vocab):
                return f"{what.upper()} token {fn(draft.vocab)} vs {fn(target.vocab)}"
        for i, (a, b) in enumerate(zip(target.token_texts(), draft.token_texts())):
            if a != b:
                return f"token {i} is {b!r} in the draft and {a!r} in the target"
        return ""

    def close(self) -> None:
        if self._mtp is not None:
            self._mtp.close()  # before the target's model, which it runs on
        for context in (self._target, self._draft):
            if context is not None:
                context.close()
        self._target = self._draft = self._mtp = None
        self._references.clear()

    def tokenize(self, text: str, parse_special: bool = False) -> tuple[int, ...]:
        target = self._loaded()
        data = text.encode("utf-8")
        add_bos = ll.llama_vocab_get_add_bos(target.vocab)
        size = len(data) + 2
        buffer = (ll.llama_token * size)()
        n = ll.llama_tokenize(target.vocab, data, len(data), buffer, size, add_bos, parse_special)
        if n < 0:
            raise EngineError(f"llama_tokenize needs room for {-n} tokens")
        return tuple(buffer[:n])

    def chat_template(self) -> str | None:
        """The GGUF's tokenizer.chat_template, None where it has none."""
        template = ll.llama_model_chat_template(self._loaded().model, None)
        return template.decode("utf-8") if template else None

    def chat_tokenize(self, chat: list[dict[str, str]], reasoning: str | None) -> tuple[int, ...]:
        """The chat rendered as llama.cpp renders it (common/chat.cpp): the template with jinja2
        (agent/prompts.py), the BOS text dropped from its start where the vocabulary adds BOS
        itself, then tokenized with special tokens parsed."""
        target = self._loaded()
        template = self.chat_template()
        if not template:
            raise EngineError(f"{self._target_path} has no chat template")

        def text(token: int) -> str:
            return ll.llama_vocab_get_text(target.vocab, token).decode("utf-8") if token >= 0 else ""

        bos, eos = text(ll.llama_vocab_bos(target.vocab)), text(ll.llama_vocab_eos(target.vocab))
        rendered = prompts.render(template, chat, bos, eos, reasoning)
        if bos and ll.llama_vocab_get_add_bos(target.vocab) and rendered.startswith(bos):
            rendered = rendered[len(bos) :]
        return self.tokenize(rendered, parse_special=True)

    def versions(self) -> dict[str, str]:
        return {"llama-cpp-python": ll.__version__, "llama.cpp": ll.llama_version().decode(), **_ggml_build()}

    def backend(self) -> str:
        return _backend()

    def _loaded(self) -> _Context:
        if self._target is None:
            raise EngineError("no model loaded: call load() first")
        return self._target

    def generate(self, request: Request) -> Generation:
        target = self._loaded()
        validate(request, self.name, self.methods, target.n_vocab, self._draft is not None)
        needed = len(request.prompt_tokens) + request.max_new_tokens + request.depth + 1
        if needed > self.n_ctx:
            raise EngineError(f"prompt, generation and draft need {needed} positions; the context has {self.n_ctx}")
        if request.method == "mtp" and self._mtp is None:
            if self._mtp_problem:
                raise EngineError(self._mtp_problem)
            self._mtp = mtp.MtpContext(target)
        self._sample_on_device(request.sampler.greedy and request.method not in REFERENCE_METHODS)
        if request.method == "baseline":
            gen = self._baseline(request)
        elif request.method in REFERENCE_METHODS:
            gen = self._reference(request)
        else:
            gen = self._speculative(request)
        gen.peak_memory_bytes = _peak_rss_bytes()
        return gen

    def _sample_on_device(self, greedy: bool) -> None:
        """Greedy sampling in the target's and draft's graphs where GREEDY and the backend call
        for it (module header), raw logits rows otherwise. (The MTP head samples in place.) The
        target's verify batches sample there too: on the H200, keeping them in place while its
        baseline sampled in the graph was slower in every arm (bench/README.md)."""
        if self._device_backend is None:
            self._device_backend = _backend() in DEVICE_GREEDY_BACKENDS
        on = greedy and GREEDY == "device" and self._device_backend
        for context in (self._target, self._draft):
            if context is not None:
                context.sample_on_device(on)

    def _synchronous(self) -> bool:
        """Whether llama_decode returns with its logits on the host (the CPU backend), read once."""
        if self._cpu_backend is None:
            self._cpu_backend = _backend() == "cpu"
        return self._cpu_backend

    def _verify_chain(self, sampler: Sampler) -> _Chain:
        """The target's sampler chain, end-of-generation tokens banned."""
        return _Chain(sampler, self._target.end_tokens, self._target.n_vocab)

    def _baseline(self, request: Request) -> Generation:
        target, chain = self._target, self._verify_chain(request.sampler)
        try:
            start = time.perf_counter()
            target.clear()
            target.decode(list(request.prompt_tokens))
            if chain.in_place and target.device_sampler is None:
                tokens, times = _argmax_loop(target, chain, request.max_new_tokens, start, self._synchronous())
            else:
                tokens, times = [], []
                while True:
                    tokens.append(chain.sample(target))
                    times.append(time.perf_counter() - start)
                    if len(tokens) == request.max_new_tokens:
                        break
                    target.decode(tokens[-1:])
        finally:
            chain.free()
        return make_generation(request, tokens, times)

    def _drafter(self, request: Request, chains: list[_Chain]) -> Drafter:
        """The request's drafter. Model drafters sample with a chain of the target's settings
        (added to `chains`, for the caller to free) without the end-of-generation ban, as
        llama-server's draft samplers do."""
        if request.method not in ("draft", "mtp"):
            return ngram.make_drafter(request.method, request)
        chains.append(_Chain(request.sampler))
        if request.method == "draft":
            return _DraftModel(self._draft, chains[-1])
        return mtp.MtpDrafter(self._mtp, self._target, chains[-1])

    def _speculative(self, request: Request) -> Generation:
        target, n, depth = self._target, request.max_new_tokens, request.depth
        prompt = list(request.prompt_tokens)
        chains = [self._verify_chain(request.sampler)]
        chain = chains[0]
        drafter = self._drafter(request, chains)
        rounds: list[Round] = []
        accepted_at, drafted_at = [0] * depth, [0] * depth
        target.set_hidden(request.method == "mtp")  # the MTP head reads the target's h rows
        try:
            start = time.perf_counter()
            target.clear()
            target.decode(prompt)
            y = chain.sample(target)
            drafter.prefill(prompt)
            context = prompt + [y]
            tokens, times = [y], [time.perf_counter() - start]

            while len(tokens) < n:
                t0 = time.perf_counter()
                k = min(depth, n - len(tokens) - 1)  # never draft past the last token wanted
                draft = drafter.propose(context, k) if k else []
                t1 = time.perf_counter()
                # The target scores the last emitted token and every proposal in one batch,
                # then samples row by row until its token differs from the proposal.
                kept = target.n_past + 1
                if draft and not target.snapshots:
                    target.checkpoint()  # a recurrent state without snapshots rolls back from here
                target.decode([context[-1], *draft], all_logits=True)
                a = 0
                token = chain.sample(target, 0)
                while a < len(draft) and token == draft[a]:
                    a += 1
                    token = chain.sample(target, a)
                target.truncate(kept + a)
                drafter.accept(context, draft[:a])
                emitted = draft[:a] + [token]
                t2 = time.perf_counter()

                rounds.append(record_round(drafted_at, accepted_at, draft, a, t1 - t0, t2 - t1))
                context += emitted
                tokens += emitted
                times += [t2 - start] * len(emitted)
        finally:
            target.set_hidden(False)
            for each in chains:
                each.free()
        return make_generation(request, tokens, times, rounds, accepted_at, drafted_at)

    def _reference_llama(self, method: str):
        """llama-cpp-python's Llama on the same file and settings, built on first use.
        Prompt lookup needs logits for every row (logits_all)."""
        if method not in self._references:
            with _no_repack_on_amx():
                self._references[method] = Llama(
                    model_path=self._target_path,
                    n_ctx=self.n_ctx,
                    n_batch=self.n_batch,
                    n_ubatch=self.n_batch,
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads_batch,
                    n_gpu_layers=-1,
                    flash_attn=self.flash_attn,
                    logits_all=method == "ref-ngram",
                    verbose=False,
                )
        return self._references[method]

    def _reference(self, request: Request) -> Generation:
        """Llama.generate, plain or with LlamaPromptLookupDecoding: the library's own path,
        end-of-generation tokens banned by a logits processor (which llama-cpp-python runs as a
        sampler at the head of its chain). Its lookup takes suffixes from ngram_max down to 1
        (it has no minimum)."""
        llm = self._reference_llama(request.method)
        llm.draft_model = (
            LlamaPromptLookupDecoding(max_ngram_size=request.settings.ngram_n_max, num_pred_tokens=request.depth)
            if request.method == "ref-ngram"
            else None
        )
        s = request.sampler
        llm.set_seed(s.seed)
        llm.reset()
        banned = np.array(self._target.end_tokens, dtype=np.intp)

        def ban(history, logits: np.ndarray) -> np.ndarray:
            logits[banned] = -np.inf
            return logits

        tokens, times = [], []
        start = time.perf_counter()
        for token in llm.generate(
            list(request.prompt_tokens),
            **{"min_p": 0.0, **declared.sampler_keywords(s)},  # the declared sampler rows; min_p off unless set
            repeat_penalty=1.0,
            logits_processor=[ban],
        ):
            tokens.append(token)
            times.append(time.perf_counter() - start)
            if len(tokens) == request.max_new_tokens:
                break
        return make_generation(request, tokens, times)

    def verify_cost(self, context_tokens: int, max_rows: int = 16, repeats: int = 5) -> list[float]:
        target = self._loaded()
        if context_tokens < 0 or not 1 <= max_rows <= self.n_batch or repeats < 1:
            raise EngineError(f"verify_cost needs context_tokens >= 0, 1 <= max_rows <= {self.n_batch}, repeats >= 1")
        if context_tokens + max_rows > self.n_ctx:
            raise EngineError(f"{context_tokens} + {max_rows} positions do not fit the context of {self.n_ctx}")
        ids = [i % target.n_vocab for i in range(context_tokens + max_rows)]
        self._sample_on_device(False)  # the forward passes alone
        target.clear()
        target.decode(ids[:context_tokens])
        target.checkpoint()  # a recurrent state rolls back from here
        medians = []
        for rows in range(1, max_rows + 1):
            seconds = []
            for repeat in range(repeats + 1):  # the first pass is a warm-up
                t0 = time.perf_counter()
                target.decode(ids[context_tokens : context_tokens + rows], all_logits=True)
                ll.llama_synchronize(target.ctx)
                elapsed = time.perf_counter() - t0
                target.truncate(context_tokens)
                if repeat:
                    seconds.append(elapsed)
            medians.append(statistics.median(seconds))
        return medians

    def logit_margin(self, tokens, position: int, rows: int = 1, pair: tuple[int, int] | None = None) -> Margin:
        """base.Engine.logit_margin: the prefix decoded, then its last `rows` tokens as one
        batch; the margin of that batch's last row. Leaves the cache empty."""
        target = self._loaded()
        problem = margin_problem(tokens, position, rows)
        if not problem and position > self.n_ctx:
            problem = f"logit_margin: {position} positions do not fit the context of {self.n_ctx}"
        if problem:
            raise EngineError(problem)
        self._sample_on_device(False)  # raw logits rows
        try:
            target.clear()
            if position > rows:
                target.decode(list(tokens[: position - rows]))
            target.decode(list(tokens[position - rows : position]), all_logits=True)
            pointer = ll.llama_get_logits_ith(target.ctx, -1)
            if not pointer:
                raise EngineError("llama.cpp holds no logits for the last row")
            return top_two(np.ctypeslib.as_array(pointer, shape=(target.n_vocab,)), target.end_tokens, pair)
        finally:
            target.clear()

    def detokenize(self, tokens) -> str:
        """The text of generated tokens (special tokens rendered, invalid UTF-8 replaced)."""
        target = self._loaded()
        pieces, buffer = [], ctypes.create_string_buffer(256)
        for token in tokens:
            n = ll.llama_token_to_piece(target.vocab, token, buffer, len(buffer), 0, True)
            pieces.append(buffer.raw[: max(n, 0)])
        return b"".join(pieces).decode("utf-8", errors="replace")

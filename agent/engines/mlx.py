"""MLX engine: mlx-lm's model classes and KV caches, our own decode loop.

Our loop mirrors mlx_lm.generate_step (same stream, same wired-memory limit, the next token
queued with async_eval before the current one is read) so that baseline costs what mlx-lm
costs, and adds speculative rounds with exact accounting: a drafter (base.Drafter: a draft
model, the target's own MTP head from agent/engines/mlx_mtp.py, or an n-gram drafter from
agent/engines/ngram.py) proposes up to K tokens, the target scores them all in one forward
pass, the longest prefix that matches the target's own samples is kept, and every cache goes
back to what was kept: attention caches are trimmed, recurrent ones (GatedDeltaNet, Mamba)
restored and fed the kept tokens again (`_Cache`).

Runs are fixed-length: the tokenizer's end-of-sequence tokens are banned (logit -inf) wherever
the target samples, in our loops and in the reference arms (a logits processor), as
llama-server's `ignore_eos` bans them; draft proposals are not banned, as the server's are not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx_lm.generate import generation_stream, stream_generate, wired_limit
from mlx_lm.models.cache import ArraysCache, make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import make_sampler

from specfleet import settings as declared

from .. import prompts
from . import ENGINE_METHODS, ngram
from .base import (
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
from .mlx_mtp import MtpDrafter, fix_layer_indices, lm_head, load_head, text_model

PREFILL_STEP_TOKENS = 2048  # mlx_lm.generate_step's default: bounds prefill memory on long prompts

SampleFn = Callable[[mx.array], mx.array]  # logits (rows, vocab) -> tokens (rows,)


def _ban(tokens: Sequence[int]) -> Callable[[mx.array], mx.array]:
    """logits (..., vocab) -> the same with `tokens` at -inf; the identity when there are none."""
    if not tokens:
        return lambda logits: logits
    masks: dict[int, mx.array] = {}  # by vocabulary width (a model's may be padded)

    def ban(logits: mx.array) -> mx.array:
        width = logits.shape[-1]
        if width not in masks:
            mask = np.zeros(width, dtype=bool)
            mask[[t for t in tokens if t < width]] = True
            masks[width] = mx.array(mask)
        return mx.where(masks[width], mx.array(float("-inf"), dtype=logits.dtype), logits)

    return ban


def _sample_fn(sampler: Sampler, banned: Sequence[int] = ()) -> SampleFn:
    """Greedy argmax, or mlx-lm's own sampler chain (top-p, top-k, temperature) so that draft,
    verify and the reference arms all truncate the same way; `banned` tokens never come out."""
    ban = _ban(banned)
    if sampler.greedy:
        return lambda logits: mx.argmax(ban(logits), axis=-1)
    chain = make_sampler(**declared.sampler_keywords(sampler))  # every declared sampler row (settings.py SAMPLER)

    def sample(logits: mx.array) -> mx.array:
        logits = ban(logits)
        return chain(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    return sample


def _forward(model, inputs: mx.array, cache, hidden: bool = False) -> tuple[mx.array, mx.array | None]:
    """Logits (1, n, vocab) for inputs (1, n); with `hidden`, also the trunk's final-normed
    hidden states (1, n, h) that an MTP head drafts from."""
    if not hidden:
        return model(inputs, cache=cache), None
    states = text_model(model)(inputs, cache)
    return lm_head(model)(states), states


def _prefill(model, cache, tokens: list[int], hidden: bool = False) -> tuple[mx.array, mx.array | None]:
    """Run the prompt through `model`, filling `cache`; return the last position's logits
    (1, vocab), and with `hidden` the hidden states of every prompt position (1, n, h)."""
    prompt, states = mx.array(tokens), []
    while prompt.size > PREFILL_STEP_TOKENS:
        logits, h = _forward(model, prompt[:PREFILL_STEP_TOKENS][None], cache, hidden)
        mx.eval([logits] if h is None else [logits, h])
        states.append(h)
        prompt = prompt[PREFILL_STEP_TOKENS:]
    logits, h = _forward(model, prompt[None], cache, hidden)
    return logits[:, -1, :], mx.concatenate([*states, h], axis=1) if hidden else None


class _Cache:
    """A model's prompt cache that can forget the last tokens fed to it. Attention caches are
    trimmed. Recurrent caches (ArraysCache: GatedDeltaNet's conv and SSM states, Mamba's)
    cannot drop positions: `mark()` keeps their state arrays (MLX arrays are immutable, so
    keeping a reference is a snapshot), and `rollback` restores them, trims the attention
    layers to the mark too, and feeds the kept tokens through the model again: exact, at the
    cost of a forward pass of the kept tokens whenever a draft is rejected."""

    def __init__(self, model):
        self.model = model
        self.layers = make_prompt_cache(model)
        self.recurrent = [isinstance(c, ArraysCache) for c in self.layers]
        odd = [type(c).__name__ for c, r in zip(self.layers, self.recurrent) if not r and not c.is_trimmable()]
        if odd:
            raise EngineError(f"speculative methods need caches that can roll back; this model has {', '.join(odd)}")
        self._saved: list | None = None

    def mark(self) -> None:
        if any(self.recurrent):
            self._saved = [list(c.cache) if r else None for c, r in zip(self.layers, self.recurrent)]

    def rollback(self, fed: int, kept: list[int]) -> None:
        """`fed` tokens went in since mark(); keep the first of them, `kept`."""
        if len(kept) == fed:
            return
        if not any(self.recurrent):
            trim_prompt_cache(self.layers, fed - len(kept))
            return
        for c, saved in zip(self.layers, self._saved):
            if saved is None:
                c.trim(fed)
            else:
                c.cache = list(saved)
        if kept:
            self.model(mx.array(kept)[None], cache=self.layers)


class _DraftModel:
    """A smaller model with the target's vocabulary, proposing greedily or by sampling with
    the target's sampler. Its cache holds the first `cached` tokens of the context, then what
    the last propose() fed: context tokens (`fed`) and the round's proposals but the last,
    which the target may not have kept."""

    def __init__(self, model, sample: SampleFn):
        self.model, self.sample = model, sample
        self.cache = _Cache(model)
        self.cached = 0
        self.fed: list[int] = []
        self.proposed: mx.array | None = None

    def prefill(self, prompt: list[int]) -> None:
        mx.eval(_prefill(self.model, self.cache.layers, prompt)[0])
        self.cached, self.proposed = len(prompt), None

    def propose(self, context: list[int], k: int) -> mx.array:
        """Queue k proposals after `context`; return them unevaluated, shape (k,)."""
        self._sync(context)
        self.cache.mark()
        self.fed = context[self.cached :]
        feed = mx.array(self.fed)
        proposed = []
        for _ in range(k):
            y = self.sample(self.model(feed[None], cache=self.cache.layers)[:, -1, :])
            mx.async_eval(y)
            proposed.append(y)
            feed = y
        self.cached = len(context)
        self.proposed = mx.concatenate(proposed)
        return self.proposed

    def _sync(self, context: list[int]) -> None:
        """Keep the cached proposals that the context now holds; forget the others."""
        if self.proposed is None:
            return
        pending = self.proposed.tolist()[:-1]  # read by the engine already: no new work
        kept = 0
        # The newest context token is always fed, never kept from the cache.
        while (
            kept < len(pending)
            and self.cached + kept < len(context) - 1
            and context[self.cached + kept] == pending[kept]
        ):
            kept += 1
        self.cache.rollback(len(self.fed) + len(pending), self.fed + pending[:kept])
        self.cached += kept
        self.proposed = None

    def accept(self, context: list[int], accepted: list[int]) -> None:
        """Nothing to do after a verify: propose() catches up with the context itself."""


class _Target:
    """The target model and its cache; with `keep_hidden`, `hidden` holds the trunk's hidden
    rows (1, n, h) of the last pass, for a drafter that reads them (the MTP head)."""

    def __init__(self, model, keep_hidden: bool):
        self.model, self.cache, self.keep_hidden = model, _Cache(model), keep_hidden
        self.hidden: mx.array | None = None

    def prefill(self, tokens: list[int]) -> mx.array:
        """The prompt pass: the last position's logits (1, vocab)."""
        logits, self.hidden = _prefill(self.model, self.cache.layers, tokens, self.keep_hidden)
        return logits

    def forward(self, inputs: mx.array) -> mx.array:
        """Logits (1, n, vocab) for inputs (1, n) on top of the cache."""
        logits, self.hidden = _forward(self.model, inputs, self.cache.layers, self.keep_hidden)
        return logits


class _Proposals:
    """A drafter proposing Python lists (agent/engines/ngram.py) as MLX arrays, like the model
    drafters' proposals."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter

    def prefill(self, prompt: list[int]) -> None:
        self.drafter.prefill(prompt)

    def propose(self, context: list[int], k: int) -> mx.array:
        return mx.array(self.drafter.propose(context, k), dtype=mx.int32)

    def accept(self, context: list[int], accepted: list[int]) -> None:
        self.drafter.accept(context, accepted)


class MlxEngine:
    name = "mlx"
    methods = ENGINE_METHODS["mlx"]

    def __init__(self) -> None:
        self._model = self._tokenizer = self._draft = self._head = None
        self._target = ""
        self._vocab_size = 0

    def load(self, target: str, draft: str | None = None) -> float:
        started = time.perf_counter()
        self._model, self._tokenizer = mlx_lm.load(target)
        fix_layer_indices(self._model)
        self._target, self._head = target, None
        self._vocab_size = len(self._tokenizer.get_vocab())
        self._draft = None
        if draft is not None:
            draft_model, draft_tokenizer = mlx_lm.load(draft)
            if draft_tokenizer.get_vocab() != self._tokenizer.get_vocab():
                raise EngineError(
                    f"draft {draft} has another vocabulary than target {target} "
                    f"({len(draft_tokenizer.get_vocab())} vs {self._vocab_size} tokens or different token texts)"
                )
            fix_layer_indices(draft_model)
            self._draft = draft_model
        return time.perf_counter() - started

    def _mtp_head(self):
        """The target's MTP head, loaded from its checkpoint on first use."""
        if self._head is None:
            self._head = load_head(self._model, self._target)
        return self._head

    def _require_loaded(self) -> None:
        if self._model is None:
            raise EngineError("no model loaded: call load() first")

    def tokenize(self, text: str) -> tuple[int, ...]:
        self._require_loaded()
        return tuple(self._tokenizer.encode(text))

    def chat_template(self) -> str | None:
        """The tokenizer's chat template, None where it has none."""
        self._require_loaded()
        return getattr(self._tokenizer, "chat_template", None) or None

    def chat_tokenize(self, chat: list[dict[str, str]], reasoning: str | None) -> tuple[int, ...]:
        """The tokenizer's own apply_chat_template (generation prompt added), tokenized as
        transformers does it: the rendered text's special tokens as written, none added."""
        self._require_loaded()
        rendered = self._tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False, **prompts.template_kwargs(reasoning)
        )
        return tuple(self._tokenizer.encode(rendered, add_special_tokens=False))

    def versions(self) -> dict[str, str]:
        return {"mlx": mx.__version__, "mlx-lm": mlx_lm.__version__, "mlx.device": str(mx.default_device())}

    def backend(self) -> str:
        """MLX's default device: "metal" or "cuda" (mlx[cuda]) on a GPU, else "cpu"."""
        if mx.default_device().type != mx.DeviceType.gpu:
            return "cpu"
        return "metal" if mx.metal.is_available() else "cuda"

    def generate(self, request: Request) -> Generation:
        self._require_loaded()
        validate(request, self.name, self.methods, self._vocab_size, self._draft is not None)
        mx.random.seed(request.sampler.seed)
        mx.reset_peak_memory()
        if request.method in ("ref-baseline", "ref-draft"):
            gen = self._reference(request)  # stream_generate sets its own stream and memory limit
        else:
            with wired_limit(self._model, [generation_stream]), mx.stream(generation_stream):
                gen = self._baseline(request) if request.method == "baseline" else self._speculative(request)
        # mx.get_peak_memory: the MLX allocator's high-water mark since the reset above,
        # weights included (they stay allocated).
        gen.peak_memory_bytes = mx.get_peak_memory()
        return gen

    def _end_tokens(self) -> list[int]:
        """The tokens banned in fixed-length runs: the tokenizer's end-of-sequence ids."""
        return sorted(self._tokenizer.eos_token_ids)

    def _baseline(self, request: Request) -> Generation:
        sample = _sample_fn(request.sampler, self._end_tokens())
        cache = make_prompt_cache(self._model)
        n = request.max_new_tokens
        tokens, times = [], []
        start = time.perf_counter()
        y = sample(_prefill(self._model, cache, list(request.prompt_tokens))[0])
        mx.async_eval(y)
        for i in range(n):
            if i + 1 < n:  # queue the next step before reading this token, as mlx-lm does
                next_y = sample(self._model(y[None], cache=cache)[:, -1, :])
                mx.async_eval(next_y)
            tokens.append(y.item())
            times.append(time.perf_counter() - start)
            if i + 1 < n:
                y = next_y
        return make_generation(request, tokens, times)

    def _drafter(self, request: Request, target: _Target) -> Drafter:
        """The request's drafter, proposing MLX arrays. Model drafters sample with the
        target's sampler settings but without the end-of-sequence ban, as llama-server's
        draft samplers do."""
        draft_sample = _sample_fn(request.sampler)
        if request.method == "draft":
            return _DraftModel(self._draft, draft_sample)
        if request.method == "mtp":
            return MtpDrafter(target, self._mtp_head(), draft_sample)
        return _Proposals(ngram.make_drafter(request.method, request))

    def _speculative(self, request: Request) -> Generation:
        n, depth = request.max_new_tokens, request.depth
        sample = _sample_fn(request.sampler, self._end_tokens())
        prompt = list(request.prompt_tokens)
        target = _Target(self._model, keep_hidden=request.method == "mtp")  # the MTP head reads h
        drafter = self._drafter(request, target)
        nothing = mx.array([], dtype=mx.int32)
        rounds: list[Round] = []
        accepted_at, drafted_at = [0] * depth, [0] * depth

        start = time.perf_counter()
        first = sample(target.prefill(prompt))
        mx.async_eval(first)
        drafter.prefill(prompt)  # queued behind the target's prompt pass
        y = first.item()
        context = prompt + [y]
        tokens, times = [y], [time.perf_counter() - start]

        while len(tokens) < n:
            t0 = time.perf_counter()
            k = min(depth, n - len(tokens) - 1)  # never draft past the last token wanted
            proposed = drafter.propose(context, k) if k else nothing
            mx.async_eval(proposed)
            # The target scores the last emitted token and every proposal in one pass. Its graph
            # is built while the draft computes, but evaluated only after the proposals are read:
            # MLX signals an evaluation's arrays when all of it is done, so proposals read behind
            # a queued verify pass would count the verify (and a pending rollback) as drafting.
            target.cache.mark()
            logits = target.forward(mx.concatenate([mx.array(context[-1:]), proposed])[None])
            verified = sample(logits[0])
            draft = proposed.tolist()
            t1 = time.perf_counter()
            verified = verified.tolist()
            a = 0
            while a < len(draft) and draft[a] == verified[a]:
                a += 1
            target.cache.rollback(len(draft) + 1, [context[-1], *draft[:a]])
            drafter.accept(context, draft[:a])
            emitted = draft[:a] + [verified[a]]
            t2 = time.perf_counter()

            rounds.append(record_round(drafted_at, accepted_at, draft, a, t1 - t0, t2 - t1))
            context += emitted
            tokens += emitted
            times += [t2 - start] * len(emitted)
        return make_generation(request, tokens, times, rounds, accepted_at, drafted_at)

    def _reference(self, request: Request) -> Generation:
        """mlx_lm.stream_generate, with and without its draft model: the library's own path,
        with the end-of-sequence ban as a logits processor (mlx-lm applies it to its draft
        model's sampling too)."""
        s = request.sampler
        extra = {"draft_model": self._draft, "num_draft_tokens": request.depth} if request.method == "ref-draft" else {}
        ban = _ban(self._end_tokens())
        tokens, times = [], []
        start = time.perf_counter()
        for response in stream_generate(
            self._model,
            self._tokenizer,
            list(request.prompt_tokens),
            max_tokens=request.max_new_tokens,
            sampler=make_sampler(**declared.sampler_keywords(s)),
            logits_processors=[lambda history, logits: ban(logits)],
            **extra,
        ):
            tokens.append(response.token)
            times.append(time.perf_counter() - start)
        return make_generation(request, tokens, times)

    def verify_cost(self, context_tokens: int, max_rows: int = 16, repeats: int = 5) -> list[float]:
        self._require_loaded()
        if context_tokens < 0 or not 1 <= max_rows <= 64 or repeats < 1:
            raise EngineError("verify_cost needs context_tokens >= 0, 1 <= max_rows <= 64, repeats >= 1")
        ids = [i % self._vocab_size for i in range(context_tokens + max_rows)]
        cache = _Cache(self._model)
        medians = []
        with wired_limit(self._model, [generation_stream]), mx.stream(generation_stream):
            if context_tokens:
                mx.eval(_prefill(self._model, cache.layers, ids[:context_tokens])[0])
            for rows in range(1, max_rows + 1):
                rows_in = mx.array(ids[context_tokens : context_tokens + rows])[None]
                seconds = []
                for repeat in range(repeats + 1):  # the first pass is a warm-up
                    cache.mark()
                    t0 = time.perf_counter()
                    mx.eval(self._model(rows_in, cache=cache.layers))
                    elapsed = time.perf_counter() - t0
                    cache.rollback(rows, [])
                    if repeat:
                        seconds.append(elapsed)
                medians.append(statistics.median(seconds))
        return medians

    def logit_margin(self, tokens, position: int, rows: int = 1, pair: tuple[int, int] | None = None) -> Margin:
        """base.Engine.logit_margin: the prefix prefilled, then its last `rows` tokens as one
        forward pass; the margin of that pass's last row."""
        self._require_loaded()
        problem = margin_problem(tokens, position, rows)
        if problem:
            raise EngineError(problem)
        cache = make_prompt_cache(self._model)
        with mx.stream(generation_stream):
            if position > rows:
                mx.eval(_prefill(self._model, cache, list(tokens[: position - rows]))[0])
            logits = self._model(mx.array(list(tokens[position - rows : position]))[None], cache=cache)[0, -1]
            row = np.array(logits.astype(mx.float32))
        return top_two(row, self._end_tokens(), pair)

    def detokenize(self, tokens) -> str:
        """The text of generated tokens, as the tokenizer decodes them."""
        self._require_loaded()
        return self._tokenizer.decode(list(tokens))

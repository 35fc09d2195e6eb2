"""The engine interface: load once, generate many times, report raw measurements.

Engines measure; they do not summarise. `agent/summary.py` turns a `Generation` into the
figures a run reports (tokens/s, latency percentiles, acceptance), so both engines are
summarised by the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from specfleet import settings as declared
from specfleet.record import (  # noqa: F401  (the shared vocabulary, re-exported for the engines)
    MAX_DEPTH,
    METHODS,
    REFERENCE_METHODS,
    SPECULATIVE_METHODS,
    VERIFY_COST,
    Sampler,
    Settings,
)
from specfleet.schemas import setting_problem, settings_problems

# A generated token whose id the engine counted but does not know: llama-server's stream holds a
# token back while its text is incomplete UTF-8 and sends it joined to the next, id dropped; an
# OpenAI stream carries text only. Comparisons of token lists (agent/divergence.py) skip it.
UNKNOWN_ID = -1


class EngineError(ValueError):
    """A request the engine cannot serve: unknown method, bad depth, incompatible models."""


@dataclass(frozen=True)
class Request:
    prompt_tokens: tuple[int, ...]
    # Exactly this many tokens are generated. End-of-generation tokens are banned (logit -inf) in
    # the target's sampling, as llama-server's `ignore_eos: true` bans them, so a run never ends
    # early and never emits one; drafts are not banned (the server's draft samplers are not).
    max_new_tokens: int
    method: str = "baseline"
    depth: int = 0  # draft depth K; 0 for baseline
    sampler: Sampler = Sampler()
    # The cell's declared settings (specfleet/settings.py): the drafters' parameters (prompt
    # lookup's ngram_n_min/n_max; llama.cpp's ngram-mod and ngram-map-k4v, whose longest draft is
    # the depth), and what the engine was built with (threads).
    settings: Settings = Settings()
    # Server engines: the arm's own server flags and, for `openai`, its command template.
    flags: tuple[str, ...] = ()
    command: str = ""


@dataclass(frozen=True)
class Round:
    """One verify step of the target: what was proposed, what was kept.

    A round emits `accepted + 1` tokens: the accepted draft tokens and the target's own token
    after them. The first token of a generation comes from prefill and belongs to no round, so
    for speculative methods len(tokens) == 1 + sum(accepted) + len(rounds). A round may draft
    nothing (no n-gram match, or one token left to generate): it is then a plain decode step.
    Baseline generations have no rounds."""

    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    proposed: tuple[int, ...] = ()  # the drafted tokens, for audits and cross-engine checks


@dataclass(frozen=True)
class ServerRun:
    """What a server engine knows of one generation beyond the client's timestamps: the server
    itself (version, command line) and its own accounting of the run. None where the server
    does not report it; a client cannot see a server's rounds, so drafted/accepted come from
    here (llama-server's `timings`; per position from its /metrics counters' deltas)."""

    system: str  # "llama-server", or the OpenAI-compatible server's name ("MTPLX", ...)
    version: str
    command: str  # shell-quoted argv the server was started with ("" for a server already running)
    # What every arm's server of the job shares, as recorded flags (RunRecord settings.server_flags,
    # a checked key): the same for a pair's baseline and arm, whose own flags are its method and depth.
    flags: str = ""
    decode_tokens_per_second: float | None = None
    prefill_seconds: float | None = None
    drafted: int | None = None
    accepted: int | None = None
    drafted_by_position: tuple[int, ...] = ()
    accepted_by_position: tuple[int, ...] = ()
    drafter_warm: bool | None = None  # stateful drafters only: did this run inherit their state?
    interleaving: str = ""  # "rotated" | "blocks"


@dataclass
class Generation:
    tokens: list[int]  # generated tokens, prompt excluded
    prompt_tokens: int
    prefill_seconds: float  # prompt forward pass (the draft model's too), first token sampled
    decode_seconds: float  # everything after the first token
    token_times_seconds: list[float]  # time from generation start at which each token was emitted
    peak_memory_bytes: int
    rounds: list[Round] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)  # accepted count at draft position i
    drafted_by_position: list[int] = field(default_factory=list)
    server: ServerRun | None = None  # server engines only


@dataclass(frozen=True)
class Margin:
    """The target's top two tokens at one position of a token sequence and their logit gap
    (end-of-generation tokens banned, as the target's sampling bans them): how near a tie the
    greedy choice there was."""

    first: int
    second: int
    margin: float  # logit[first] - logit[second], >= 0


def top_two(logits, banned: Sequence[int] = (), pair: tuple[int, int] | None = None) -> Margin:
    """The Margin of one logits row; `banned` ids take no part (logit -inf). With `pair` (a, b):
    Margin(a, b, logit[a] - logit[b]), signed, whatever their ranks."""
    row = np.array(logits, dtype=np.float64)
    if pair is not None:
        return Margin(pair[0], pair[1], float(row[pair[0]] - row[pair[1]]))
    if len(banned):
        ids = np.asarray(banned, dtype=np.intp)
        row[ids[ids < len(row)]] = -np.inf
    first = int(row.argmax())
    top = row[first]
    row[first] = -np.inf
    second = int(row.argmax())
    return Margin(first, second, float(top - row[second]))


def record_round(
    drafted_at: list[int], accepted_at: list[int], draft: Sequence[int], accepted: int, draft_s: float, verify_s: float
) -> Round:
    """Count one verify round of proposals `draft` into the per-position tallies and return
    its Round."""
    for i in range(len(draft)):
        drafted_at[i] += 1
        accepted_at[i] += i < accepted
    return Round(len(draft), accepted, draft_s, verify_s, tuple(draft))


def make_generation(
    request: Request,
    tokens: list[int],
    times: list[float],
    rounds: list[Round] | None = None,
    accepted_at: list[int] | None = None,
    drafted_at: list[int] | None = None,
) -> Generation:
    """A Generation from emission times measured from the start: the first token ends prefill.
    The engine fills in peak memory, which it measures its own way."""
    return Generation(
        tokens=tokens,
        prompt_tokens=len(request.prompt_tokens),
        prefill_seconds=times[0],
        decode_seconds=times[-1] - times[0],
        token_times_seconds=times,
        peak_memory_bytes=0,
        rounds=rounds or [],
        accepted_by_position=accepted_at or [],
        drafted_by_position=drafted_at or [],
    )


class Drafter(Protocol):
    """What proposes tokens in a speculative loop: a draft model, prompt lookup, an MTP head,
    llama.cpp's n-gram drafters. One object per generation; the engine calls, in order:
    prefill(prompt) once, after the target's prompt pass; then each round propose(context, k)
    (only when k >= 1), the target's verify, and accept(context, accepted). `context` is the
    prompt and every token emitted so far; its last token is the newest, emitted by the target
    and not yet in the target's cache. Drafters that read the target's hidden states (MTP) get
    the target from their constructor and read its rows of the last pass."""

    def prefill(self, prompt: list[int]) -> None: ...

    def propose(self, context: list[int], k: int):
        """At most k tokens to follow `context`: a list of ints, or in the MLX engine an
        unevaluated MLX array, so that drafting and the verify pass's graph overlap."""

    def accept(self, context: list[int], accepted: list[int]) -> None:
        """After the verify of this round's proposals: `accepted` is the prefix the target
        kept (the target's cache has been rolled back to it); `context` is as propose() saw it."""


class Engine(Protocol):
    """What every engine does: load once, tokenize, generate many times, name its versions.

    What only some engines can do is declared below as capabilities, one runtime-checkable
    Protocol each, which the measurement asks with `supports(engine, capability)`
    (agent/protocol.py, prompts.py, summary.py, divergence.py), never by probing for a name:
    `Closes` (servers to stop), `ReportsBackend`, `Interleaves`, `KeepsState`,
    `RestartsServers` (llama-server's arms), `ChatTemplates`, `Detokenizes`, `LogitMargins`
    (in-process engines and llama-server). An engine (or a test's engine) may switch a
    capability off by setting one of its methods to None on the instance."""

    name: str
    methods: tuple[str, ...]  # what generate() accepts, from METHODS and REFERENCE_METHODS

    def load(self, target: str, draft: str | None = None) -> float:
        """Load the target (and optional draft) model; return the seconds it took."""

    def tokenize(self, text: str) -> tuple[int, ...]:
        """The target's tokens for a prompt text (with BOS where the model expects it)."""

    def generate(self, request: Request) -> Generation: ...

    def versions(self) -> dict[str, str]: ...

    def verify_cost(self, context_tokens: int, max_rows: int = 16, repeats: int = 5) -> list[float]:
        """Median seconds of one target forward pass of 1..max_rows query rows (all rows'
        logits computed) on top of `context_tokens` cached tokens: element i is i+1 rows."""


@runtime_checkable
class Closes(Protocol):
    """An engine with something to release when the job ends (servers to stop, a model to free)."""

    def close(self) -> None: ...


@runtime_checkable
class ReportsBackend(Protocol):
    """An in-process engine that knows its compute backend ("metal", "cuda", "cpu")."""

    def backend(self) -> str: ...


@runtime_checkable
class Interleaves(Protocol):
    """A server engine that says how a job's arms can run: "rotated" (every arm's server up at
    once) or "blocks" (one arm's server at a time, every prompt)."""

    def interleaving(self, arms) -> str: ...


@runtime_checkable
class KeepsState(Protocol):
    """A server engine that knows whether an arm's drafter keeps state across requests (llama-server's
    ngram-mod, ngram-cache, ngram-map-k, ngram-map-k4v): such arms are measured fresh."""

    def keeps_state(self, arm) -> bool: ...


@runtime_checkable
class RestartsServers(Protocol):
    """A server engine that starts an arm's server afresh on request and counts the requests
    each arm's server has served since its start (server_state "fresh" and "warm")."""

    def restart(self, arm) -> None: ...

    def served(self, arm) -> int: ...


@runtime_checkable
class ChatTemplates(Protocol):
    """An engine that can read the model's chat template (None where the model has none)."""

    def chat_template(self) -> str | None: ...


@runtime_checkable
class Detokenizes(Protocol):
    """An engine that can turn tokens back into text (a run's text sample)."""

    def detokenize(self, tokens: Sequence[int]) -> str: ...


@runtime_checkable
class LogitMargins(Protocol):
    """An engine that can read the target's logits at a position (agent/divergence.py)."""

    def logit_margin(
        self, tokens: Sequence[int], position: int, rows: int = 1, pair: tuple[int, int] | None = None
    ) -> Margin:
        """The target's top-two logit margin for the token at `position` of `tokens` (its
        logits given tokens[:position]), computed with that position the last of a `rows`-row
        forward pass on top of the cached tokens before them: rows=1 is one-token decoding, as
        the baseline runs; rows=K+1 the verify batch of a depth-K speculative round. With `pair`
        (a, b), the signed gap logit[a] - logit[b] instead (top_two). agent/divergence.py labels
        a greedy divergence with it."""


def supports(engine, capability: type) -> bool:
    """Whether `engine` has `capability` (one of the runtime-checkable Protocols above): it is an
    instance of it and none of the capability's methods is switched off (None) on the engine.
    (Python 3.11's isinstance on a Protocol of methods only looks at the engine's class.)"""
    if not isinstance(engine, capability):
        return False
    methods = [name for name, member in vars(capability).items() if callable(member) and not name.startswith("_")]
    return all(getattr(engine, name, None) is not None for name in methods)


def margin_problem(tokens: Sequence[int], position: int, rows: int) -> str:
    """Why logit_margin cannot compute (tokens, position, rows); "" when it can."""
    if not 1 <= rows <= position <= len(tokens):
        return f"logit_margin needs 1 <= rows ({rows}) <= position ({position}) <= len(tokens) ({len(tokens)})"
    return ""


def validate(request: Request, engine: str, methods: Sequence[str], vocab_size: int, has_draft: bool) -> None:
    """Raise EngineError naming the problem if `engine` cannot serve `request`. The settings are
    checked by the declaration's own checker (a Settings is a plain dataclass); the sampler is not
    checked here: a Sampler refuses a bad value where it is made (specfleet/record.py, its bounds the
    declaration's)."""
    method, depth = request.method, request.depth
    if method not in METHODS + REFERENCE_METHODS:
        raise EngineError(f"unknown method {method!r}; known: {', '.join(METHODS + REFERENCE_METHODS)}")
    if method not in methods:
        raise EngineError(f"engine {engine} does not support method {method!r} yet; it supports: {', '.join(methods)}")
    if method in SPECULATIVE_METHODS:
        if not 1 <= depth <= MAX_DEPTH:
            raise EngineError(f"method {method!r} needs a draft depth from 1 to {MAX_DEPTH}, got {depth}")
    elif depth != 0:
        raise EngineError(f"method {method!r} takes depth 0, got {depth}")
    if method in ("draft", "ref-draft") and not has_draft:
        raise EngineError(f"method {method!r} needs a draft model: load(target, draft=...)")
    problems = settings_problems(request.settings, "")  # the declaration's own checker (its bounds llama.cpp's)
    if problems:
        raise EngineError("bad settings: " + "; ".join(problems))
    problems = declared.sampler_problems(request.sampler, engine)  # a sampler row this engine does not apply
    if problems:
        raise EngineError("bad sampler: " + "; ".join(problems))
    lo, hi = request.settings.ngram_n_min, request.settings.ngram_n_max
    if method in ("ngram", "ref-ngram") and not (lo is not None and hi is not None and lo <= hi):
        raise EngineError(f"ngram needs ngram_n_min <= ngram_n_max, got {lo} and {hi}")
    if not request.prompt_tokens:
        raise EngineError("the prompt is empty")
    bad = [t for t in request.prompt_tokens if not 0 <= t < vocab_size]
    if bad:
        raise EngineError(f"prompt tokens outside the vocabulary of {vocab_size}: {bad[:5]}")
    problem = setting_problem(declared.BY_NAME["max_new_tokens"], request.max_new_tokens)  # the row's bounds
    if problem:
        raise EngineError(f"max_new_tokens {problem}")

"""The engine interface: load once, generate many times, report raw measurements.

Engines measure; they do not summarise. `agent/metrics.py` turns a `Generation` into the
figures a run reports (tokens/s, latency percentiles, acceptance), so both engines are
summarised by the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

METHODS = ("baseline", "draft", "ngram", "mtp")


class EngineError(ValueError):
    """A request the engine cannot serve: unknown method, bad depth, incompatible models."""


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k truncation
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Request:
    prompt_tokens: tuple[int, ...]
    max_new_tokens: int
    method: str = "baseline"
    depth: int = 0  # draft depth K; 0 for baseline
    sampler: Sampler = Sampler()
    ngram_min: int = 1  # ngram method: shortest suffix to match
    ngram_max: int = 3  # ngram method: longest suffix to match


@dataclass(frozen=True)
class Round:
    """One verify step of the target: what was proposed, what was kept."""

    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float


@dataclass
class Generation:
    tokens: list[int]  # generated tokens, prompt excluded
    prompt_tokens: int
    prefill_seconds: float  # prompt forward pass, first token sampled
    decode_seconds: float  # everything after the first token
    token_times_seconds: list[float]  # time from generation start at which each token was emitted
    peak_memory_bytes: int
    rounds: list[Round] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)  # accepted count at draft position i
    drafted_by_position: list[int] = field(default_factory=list)


class Engine(Protocol):
    name: str

    def load(self, target: str, draft: str | None = None) -> float:
        """Load the target (and optional draft) model; return the seconds it took."""

    def generate(self, request: Request) -> Generation: ...

    def versions(self) -> dict[str, str]: ...

"""A run's prompt tokens: distinct context documents, then the prompt, never repetition.

`context_tokens` > 0 puts that many tokens of the job's documents (in order, each whole but the
last, which is cut) before the prompt, as llama-bench's `-d` puts a depth of context before its
generation. Nothing is ever repeated to reach a length: a set whose documents are too short for
the depth asked is an error naming both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

DOCUMENT_SEPARATOR = "\n\n"


class NotEnoughText(ValueError):
    """The documents hold fewer tokens than the context depth asked for."""


def _leading_special(tokenize: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
    """What the tokenizer puts before any text (BOS), from the tokens of an empty text."""
    return tuple(tokenize(""))


def context(tokenize: Callable[[str], Sequence[int]], documents: Sequence[str], context_tokens: int) -> tuple[int, ...]:
    """Exactly `context_tokens` tokens (BOS included) of the documents, joined in order and cut;
    () for no context. One tokenization of all the documents the job sent: they are bounded by
    the coordinator (specfleet/prompt_library.py)."""
    if context_tokens <= 0:
        return ()
    tokens = tuple(tokenize(DOCUMENT_SEPARATOR.join(documents) + DOCUMENT_SEPARATOR))
    if len(tokens) < context_tokens:
        raise NotEnoughText(
            f"a context of {context_tokens} tokens was asked for, but the {len(documents)} documents hold "
            f"{len(tokens)} tokens for this model's tokenizer"
        )
    return tokens[:context_tokens]


def build(tokenize: Callable[[str], Sequence[int]], prompt: str, prefix: tuple[int, ...]) -> tuple[int, ...]:
    """The prompt's tokens after a context `prefix` (from `context`): the prompt's own leading
    special tokens are dropped when the context already begins with them."""
    tokens = tuple(tokenize(prompt))
    if not prefix:
        return tokens
    special = _leading_special(tokenize)
    body = tokens[len(special) :] if special and tokens[: len(special)] == special else tokens
    return prefix + body

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


def build(
    tokenize: Callable[[str], Sequence[int]], prompt: str, documents: Sequence[str], context_tokens: int
) -> tuple[int, ...]:
    """The tokens of `context_tokens` of context (BOS included) followed by the prompt's."""
    tokens = tuple(tokenize(prompt))
    if context_tokens <= 0:
        return tokens
    special = _leading_special(tokenize)
    text, context = "", tuple(special)
    for doc in documents:
        text = f"{text}{doc}{DOCUMENT_SEPARATOR}"
        context = tuple(tokenize(text))
        if len(context) >= context_tokens:
            break
    if len(context) < context_tokens:
        raise NotEnoughText(
            f"a context of {context_tokens} tokens was asked for, but the {len(documents)} documents hold "
            f"{len(context)} tokens for this model's tokenizer"
        )
    body = tokens[len(special) :] if tokens[: len(special)] == special else tokens
    return context[:context_tokens] + body

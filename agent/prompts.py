"""A run's prompt tokens: distinct context documents, then the prompt, never repetition.

`context_tokens` > 0 puts that many tokens of the job's documents (in order, each whole but the
last, which is cut) before the prompt, as llama-bench's `-d` puts a depth of context before its
generation. Nothing is ever repeated to reach a length: a set whose documents are too short for
the depth asked is an error naming both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agent.engines.base import ChatTemplates, EngineError, supports

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


def build(
    tokenize: Callable[[str], Sequence[int]],
    prompt: str,
    prefix: tuple[int, ...],
    raw: Callable[[str], Sequence[int]] | None = None,
) -> tuple[int, ...]:
    """The prompt's tokens after a context `prefix` (from `context`): the prompt's own leading
    special tokens (what `raw`, the plain tokenizer, puts before any text) are dropped when the
    context already begins with them. `tokenize` may be a chat tokenizer (`tokenizer`)."""
    tokens = tuple(tokenize(prompt))
    if not prefix:
        return tokens
    special = _leading_special(raw or tokenize)
    body = tokens[len(special) :] if special and tokens[: len(special)] == special else tokens
    return prefix + body


# ---------------------------------------------------------------------------- chat templates
#
# A sweep's prompt_format (specfleet/settings.py): "chat" sends every prompt as a user message
# (after the sweep's system prompt, if any) through the model's own chat template with the
# generation prompt added; "raw" sends the text as it is; "auto" is chat where the model has a
# template. Each engine renders as its system does (llama.cpp: the GGUF's tokenizer.chat_template
# with jinja2 here, as llama.cpp renders it; llama-server: its own /apply-template; MLX: the
# tokenizer's apply_chat_template) through `chat_template()` and `chat_tokenize(messages,
# reasoning)`; their prompt tokens are compared as any other prompt's are. A context of documents
# (context_tokens) stays a raw prefix before the rendered chat, the same on every engine.

REASONING_SWITCH = "enable_thinking"  # the variable templates with a reasoning switch read (Qwen3, ...)


class PromptFormatError(EngineError):
    """A chat setting the model's template cannot honour (no template, no reasoning switch): the
    job fails with this one line, as for any request an engine cannot serve."""


def messages(prompt: str, system_prompt: str = "") -> list[dict[str, str]]:
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": prompt}
    ]


def gguf_chat_template(path: str) -> str | None:
    """A GGUF file's own tokenizer.chat_template (None where it has none): the model's template,
    which a server engine asks for rather than the server's, since llama-server falls back to a
    ChatML template of its own for a model without one."""
    import gguf

    field = gguf.GGUFReader(path).fields.get("tokenizer.chat_template")
    template = field.contents() if field is not None else None
    return template if isinstance(template, str) and template else None


def has_reasoning_switch(template: str | None) -> bool:
    return bool(template) and REASONING_SWITCH in template


def template_kwargs(reasoning: str | None) -> dict[str, bool]:
    """The template variables a resolved reasoning setting sets ({} where unset)."""
    return {} if reasoning is None else {REASONING_SWITCH: reasoning == "on"}


def render(template: str, chat: list[dict[str, str]], bos_token: str, eos_token: str, reasoning: str | None) -> str:
    """`template` rendered with jinja2 as llama.cpp and transformers render chat templates: a
    sandbox, trim_blocks and lstrip_blocks, the generation prompt added, raise_exception and
    strftime_now, the vocabulary's BOS and EOS texts; enable_thinking only where set."""
    import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template).render(
        messages=chat,
        add_generation_prompt=True,
        bos_token=bos_token,
        eos_token=eos_token,
        **template_kwargs(reasoning),
    )


def resolve(settings, template: str | None, model: str = "the model"):
    """`settings` with prompt_format and reasoning as a run will use them, for a model whose chat
    template is `template` (None: it has none); PromptFormatError where the sweep asks for what
    the template cannot do."""
    import dataclasses

    fmt = getattr(settings, "prompt_format", None) or "raw"
    if fmt == "auto":
        fmt = "chat" if template else "raw"
    if fmt == "chat" and not template:
        raise PromptFormatError(f"prompt_format chat: {model} has no chat template (use prompt_format raw)")
    reasoning = getattr(settings, "reasoning", None)
    if fmt == "raw":
        if getattr(settings, "system_prompt", ""):
            raise PromptFormatError("system_prompt needs prompt_format chat: a raw prompt has no system message")
        if reasoning is not None:
            raise PromptFormatError("reasoning needs prompt_format chat: a raw prompt has no reasoning switch")
    elif has_reasoning_switch(template):
        reasoning = reasoning or "on"  # the templates' default: enable_thinking undefined renders thinking on
    elif reasoning is not None:
        raise PromptFormatError(f"reasoning {reasoning}: the chat template of {model} has no reasoning switch")
    return dataclasses.replace(settings, prompt_format=fmt, reasoning=reasoning)


def tokenizer(engine, settings) -> Callable[[str], tuple[int, ...]]:
    """How a prompt's text becomes tokens under resolved `settings` (from `resolve`)."""
    if getattr(settings, "prompt_format", None) != "chat":
        return engine.tokenize
    system_prompt, reasoning = settings.system_prompt, settings.reasoning
    return lambda text: tuple(engine.chat_tokenize(messages(text, system_prompt), reasoning))


def resolved_spec(spec, engine):
    """A loaded engine's job spec with its prompt settings resolved against the model's template."""
    import dataclasses

    template = engine.chat_template() if supports(engine, ChatTemplates) else None
    model = spec.model.get("target", "the model") if isinstance(spec.model, dict) else "the model"
    return dataclasses.replace(spec, settings=resolve(spec.settings, template, model))

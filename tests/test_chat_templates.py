"""Chat templates (agent/prompts.py) and the settings that choose them: prompt_format, system_prompt,
reasoning (specfleet/settings.py). Pure functions: no engine, no process."""

from __future__ import annotations

import dataclasses

import pytest

from agent import prompts
from specfleet import settings as declared
from specfleet.record import SCHEMA_VERSION
from specfleet.schemas import setting_problem
from specfleet.settings import Settings

# SmolLM2-135M-Instruct's template (its GGUF's tokenizer.chat_template), ChatML with a default system message.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A template with a reasoning switch, as Qwen3's reads it.
THINKING = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and enable_thinking is false %}"
    "<think></think>{% endif %}{% endif %}"
)


def test_render_chatml_as_the_model_expects():
    text = prompts.render(CHATML, prompts.messages("What is 2+2?"), "<|im_start|>", "<|im_end|>", None)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = prompts.render(CHATML, prompts.messages("Hi", "Be terse."), "", "", None)
    assert with_system.startswith("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi")
    assert "SmolLM" not in with_system


def test_render_passes_the_reasoning_switch_and_bos():
    on = prompts.render(THINKING, prompts.messages("x"), "<s>", "</s>", "on")
    off = prompts.render(THINKING, prompts.messages("x"), "<s>", "</s>", "off")
    assert on == "<s><user>x</user>\n<assistant>"
    assert off == "<s><user>x</user>\n<assistant><think></think>"


def test_render_raise_exception_is_a_template_error():
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        prompts.render("{{ raise_exception('no system') }}", prompts.messages("x"), "", "", None)


def test_resolve_auto_chat_raw_and_refusals():
    auto = Settings()
    assert auto.prompt_format == "auto" and auto.system_prompt == "" and auto.reasoning is None
    assert prompts.resolve(auto, CHATML).prompt_format == "chat"
    assert prompts.resolve(auto, None).prompt_format == "raw"
    assert prompts.resolve(Settings(prompt_format="raw"), CHATML).prompt_format == "raw"
    with pytest.raises(prompts.PromptFormatError, match="has no chat template"):
        prompts.resolve(Settings(prompt_format="chat"), None, "tiny.gguf")
    with pytest.raises(prompts.PromptFormatError, match="system_prompt needs prompt_format chat"):
        prompts.resolve(Settings(prompt_format="raw", system_prompt="Be terse."), CHATML)
    with pytest.raises(prompts.PromptFormatError, match="no reasoning switch"):
        prompts.resolve(Settings(reasoning="off"), CHATML)
    # A template with a switch: the runs record it, on by default as the templates render it.
    assert prompts.resolve(auto, THINKING).reasoning == "on"
    assert prompts.resolve(Settings(reasoning="off"), THINKING).reasoning == "off"
    assert prompts.resolve(auto, CHATML).reasoning is None


def test_chat_tokens_after_a_context_keep_one_bos():
    """A context prefix stays raw before the rendered chat; the chat's BOS is not repeated."""

    def raw(text):
        return (1, *(ord(c) for c in text))

    def chat(text):
        return raw(f"[u]{text}[a]")

    prefix = prompts.context(raw, ["doc one", "doc two"], 6)
    assert prefix == raw("doc o")
    tokens = prompts.build(chat, "hi", prefix, raw)
    assert tokens == prefix + tuple(ord(c) for c in "[u]hi[a]")


class _Engine:
    def __init__(self, template):
        self.template, self.calls = template, []

    def chat_template(self):
        return self.template

    def tokenize(self, text):
        return (0, len(text))

    def chat_tokenize(self, chat, reasoning):
        self.calls.append((chat, reasoning))
        return (9, len(chat))


def test_tokenizer_follows_the_resolved_format():
    engine = _Engine(CHATML)
    settings = prompts.resolve(Settings(system_prompt="Be terse."), engine.chat_template())
    assert prompts.tokenizer(engine, settings)("hello") == (9, 2)
    assert engine.calls == [([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello"}], None)]
    raw = prompts.resolve(Settings(prompt_format="raw"), engine.chat_template())
    assert prompts.tokenizer(engine, raw)("hello") == (0, 5)


def test_settings_declare_the_prompt_format_rows():
    rows = {name: declared.BY_NAME[name] for name in ("prompt_format", "system_prompt", "reasoning")}
    for s in rows.values():
        assert s.recorded and s.checked and s.since == 4 <= SCHEMA_VERSION and s.sweep == s.name  # record schema 4
        assert s.name in declared.CHECKED
    assert setting_problem(rows["prompt_format"], "chat") == ""
    assert "must be one of auto, chat, raw, got 'markdown'" == setting_problem(rows["prompt_format"], "markdown")
    assert "must be one of on, off" in setting_problem(rows["reasoning"], "maybe")
    assert dataclasses.replace(Settings(), prompt_format="raw").prompt_format == "raw"


def test_a_sweep_file_sets_them():
    import yaml

    from specfleet import sweeps

    base = {
        "name": "chat",
        "models": {"llama.cpp": {"target": "m.gguf"}},
        "engines": ["llama.cpp"],
        "methods": {"ngram": [3]},
        "prompt_sets": ["qa"],
    }
    sweep = sweeps.parse_sweep(yaml.safe_dump({**base, "prompt_format": ["chat", "raw"], "system_prompt": "Be terse."}))
    cells = sweep.cells()
    assert sorted(c.settings.prompt_format for c in cells) == ["chat", "raw"]
    assert {c.settings.system_prompt for c in cells} == {"Be terse."}
    with pytest.raises(sweeps.SweepError, match="prompt_format"):
        sweeps.parse_sweep(yaml.safe_dump({**base, "prompt_format": "markdown"}))

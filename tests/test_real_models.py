"""A real model end to end: SmolLM2-135M-Instruct Q4_1, installed by `scripts/setup.sh
--real-models` (make test's set-up does it), converted to MLX by `specfleet models gguf-to-mlx`.
Skipped only where the models are not installed.

- the fleet (coordinator and agent processes, the CLI) sweeps it on llama.cpp through its chat
  template: every run records prompt_format chat and the template's system message, prompt lookup
  is lossless;
- llama.cpp's chat rendering (jinja2 here), llama-server's own (/apply-template) and the MLX
  tokenizer's apply_chat_template give the same tokens, and MLX's prompt lookup on the chat prompt
  is lossless (in this process: MLX's CPU backend prefills quantised weights a token at a time,
  about 15 s a run here, so MLX runs twice here instead of four times behind the fleet);
- through the template, prompt lookup accepts more on rag and code than on qa (raw text made the
  model loop on qa, and qa looked best).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from coordinator.store import open_readonly
from tests.support.processes import cli, spawn, start_coordinator, stop, wait_for_sweep

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("SPECFLEET_MODELS_DIR") or ROOT / ".data" / "models")
GGUF = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
MLX = MODELS / "SmolLM2-135M-Instruct-Q4_1-mlx"

NEW_TOKENS = 12
needs_models = pytest.mark.skipif(
    not (GGUF.is_file() and (MLX / "config.json").is_file()),
    reason=f"the real models are not installed in {MODELS}: scripts/setup.sh --real-models",
)


@needs_models
def test_fleet_sweeps_smollm2_through_its_chat_template(tmp_path):
    """The fleet's processes on a real model through its chat template, which no other test runs:
    the recorded format and system prompt, lossless prompt lookup."""
    data, agent_dir = tmp_path / "coordinator", tmp_path / "agent"
    doc = {
        "name": "real-smollm2",
        "models": {"llama.cpp": {"target": str(GGUF)}},
        "engines": ["llama.cpp"],
        # One cell, of the shortest prompt, no warm-up, 2 repeats of 2 arms (4 runs).
        "prompt_sets": ["qa"],
        "prompts": 1,
        "methods": {"ngram": [3]},
        "max_new_tokens": NEW_TOKENS,
        "warmup": 0,
        "repeats": 2,
        "threads": 1,  # llama.cpp's threads spin at their barriers: one thread is steady on a busy machine
    }
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(doc))
    coordinator, endpoints = start_coordinator(data)
    address = endpoints["grpc"]
    admin = ["--coordinator", address, "--data-dir", str(data)]
    agent = None
    try:
        token = cli("token", "create", "--ttl", "60", *admin).stdout.strip()
        cli("agent", "enrol", "--coordinator", address, "--token", token, "--name", "real", "--config-dir",
            str(agent_dir))  # fmt: skip
        agent = spawn("agent", "run", "--config-dir", str(agent_dir), log=tmp_path / "agent.log")
        sweep_id = cli("sweep", "submit", str(sweep), *admin).stdout.split()[1].rstrip(":")
        status = wait_for_sweep(address, data, sweep_id)
        assert "done" in status and "failed 0" in status, status + (tmp_path / "agent.log").read_text()[-3000:]
    finally:
        if agent is not None:
            stop(agent)
        stop(coordinator)
    con = open_readonly(data)
    runs = con.execute(
        "SELECT engine, method, prompt_id, prompt_tokens, generated_tokens, lossless, prompt_format, system_prompt,"
        " reasoning, target_reference FROM runs"
    ).df()
    con.close()
    assert set(runs.engine) == {"llama.cpp"} and set(runs.method) == {"baseline", "ngram"}
    assert (runs.prompt_format == "chat").all() and (runs.system_prompt == "").all() and runs.reasoning.isna().all()
    assert (runs.generated_tokens == NEW_TOKENS).all() and len(runs) == 4
    assert runs[runs.method == "ngram"].lossless.all()
    # The default system message of SmolLM2's template is in the prompt: far longer than the raw text.
    assert (runs.prompt_tokens > 40).all()


@needs_models
def test_three_renderings_of_the_template_agree():
    """A real chat template (tests/test_chat_templates.py's are hand-written) rendered by our jinja2,
    llama-server's /apply-template and the MLX tokenizer gives the same tokens, with and without a
    system prompt; and MLX's prompt lookup on the real model's chat prompt, as a run's settings
    resolve it, gives the greedy baseline's tokens."""
    from agent import prompts
    from agent.engines.base import Request
    from agent.engines.llama_server import LlamaServerEngine
    from agent.engines.llamacpp import LlamaCppEngine
    from agent.engines.mlx import MlxEngine
    from specfleet.prompt_library import prompt_sets
    from specfleet.settings import Settings

    texts = [p.text for name in ("qa", "rag", "code") for p in prompt_sets()[name].prompts[:2]]
    llama, mlx = LlamaCppEngine(), MlxEngine()
    llama.load(str(GGUF))
    mlx.load(str(MLX))
    server = LlamaServerEngine(flags=["-c", "8192"])
    try:
        server.load(str(GGUF))
        assert llama.chat_template() == mlx.chat_template() == server.chat_template()
        for system_prompt in ("", "You are a careful assistant."):
            for text in texts:
                chat = prompts.messages(text, system_prompt)
                ours = llama.chat_tokenize(chat, None)
                assert ours == mlx.chat_tokenize(chat, None) == server.chat_tokenize(chat, None), text[:60]
                assert ours[:3] == llama.tokenize("<|im_start|>system\n", parse_special=True)
        settings = prompts.resolve(Settings(), mlx.chat_template())
        assert settings.prompt_format == "chat"
        text = prompt_sets()["qa"].prompts[0].text
        tokens = prompts.tokenizer(mlx, settings)(text)
        assert tokens == prompts.tokenizer(llama, settings)(text)
        baseline = mlx.generate(Request(tokens, max_new_tokens=NEW_TOKENS, settings=settings))
        lookup = mlx.generate(Request(tokens, max_new_tokens=NEW_TOKENS, method="ngram", depth=3, settings=settings))
        assert lookup.tokens == baseline.tokens and len(baseline.tokens) == NEW_TOKENS
    finally:
        server.close()
        llama.close()


@needs_models
def test_prompt_lookup_accepts_more_on_rag_and_code_than_on_qa():
    """Issue 26's done-when on a real model through its chat template: prompt lookup's acceptance
    on rag and code exceeds qa's (raw text made SmolLM2 loop on qa, and qa looked best)."""
    from agent import prompts
    from agent.engines.base import Request
    from agent.engines.llamacpp import LlamaCppEngine
    from specfleet.prompt_library import prompt_sets
    from specfleet.settings import Settings

    engine = LlamaCppEngine(settings=Settings(threads=1))
    engine.load(str(GGUF))
    try:
        settings = prompts.resolve(Settings(), engine.chat_template())
        assert settings.prompt_format == "chat"
        tokenize = prompts.tokenizer(engine, settings)
        acceptance = {}
        for category in ("qa", "rag", "code"):
            drafted = accepted = 0
            for p in prompt_sets()[category].prompts[:3]:
                request = Request(tokenize(p.text), max_new_tokens=48, method="ngram", depth=3, settings=settings)
                gen = engine.generate(request)
                drafted += sum(r.drafted for r in gen.rounds)
                accepted += sum(r.accepted for r in gen.rounds)
            acceptance[category] = accepted / max(drafted, 1)
        assert acceptance["rag"] > acceptance["qa"] and acceptance["code"] > acceptance["qa"], acceptance
    finally:
        engine.close()


@needs_models
def test_openai_engine_sends_chat_completions(tmp_path, monkeypatch):
    """The openai engine on llama-server's /v1 endpoints: the chat's prompt tokens are what our
    llama.cpp rendering gives, and the run is a /v1/chat/completions stream of exactly the tokens asked."""
    from agent import prompts
    from agent.engines import openai_server
    from agent.engines.base import Request
    from agent.engines.llama_server import find_binary
    from agent.engines.llamacpp import LlamaCppEngine
    from agent.engines.openai_server import OpenAIServerEngine
    from specfleet.record import ServerSpec
    from specfleet.settings import Settings

    paths, stream = [], openai_server.loopback.stream_events

    def recording(port, path, body, *args, **kwargs):
        paths.append((path, sorted(body)))
        return stream(port, path, body, *args, **kwargs)

    monkeypatch.setattr(openai_server.loopback, "stream_events", recording)

    command = f"{find_binary()} -m {{model}} --port {{port}} -c 4096 -t 1 -tb 1"
    engine = OpenAIServerEngine(ServerSpec(command=command, system="llama-server-v1"), log_dir=str(tmp_path))
    llama = LlamaCppEngine(settings=Settings(threads=1))
    try:
        engine.load(str(GGUF))
        llama.load(str(GGUF))
        settings = prompts.resolve(Settings(system_prompt="Answer briefly."), engine.chat_template())
        assert settings.prompt_format == "chat"
        chat = prompts.messages("Name three primary colours.", settings.system_prompt)
        tokens = engine.chat_tokenize(chat, settings.reasoning)
        assert tokens == llama.chat_tokenize(chat, settings.reasoning)
        gen = engine.generate(Request(tokens, max_new_tokens=12, settings=settings))
        assert len(gen.tokens) == 12
        assert len(paths) == 1 and paths[0][0] == "/v1/chat/completions" and "messages" in paths[0][1], paths
        with pytest.raises(Exception, match="chat request carries messages"):
            engine.generate(Request((1, *tokens), max_new_tokens=4, settings=settings))
    finally:
        engine.close()
        llama.close()

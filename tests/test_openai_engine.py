"""Engine openai against real OpenAI-compatible servers: llama-server's /v1 endpoints (started
from command templates, or already running at a loopback URL) and mlx_lm.server (text prompts
only) on the tiny models; tests/support/fake_server.py stands only for servers that answer wrongly."""

import sys
from importlib import metadata

import pytest

from agent.engines import make_engine
from agent.engines.base import EngineError, Request
from agent.engines.llama_server import PROJECT_BUILD
from agent.engines.openai_server import command_version, expand, loopback_address, token_times
from agent.engines.server_process import ServerProcess, free_port
from agent.summary import summarise
from specfleet.record import Arm, ServerSpec
from tests.support.processes import FAKE_SERVER as FAKE
from tests.support.processes import gone, needs_llama_server

pytestmark = [pytest.mark.process]

BASELINE = f"{PROJECT_BUILD} -m {{model}} --port {{port}}"
MTP = f"{PROJECT_BUILD} -m {{model}} --port {{port}} --spec-type draft-mtp --spec-draft-n-max {{depth}}"
MEMORY = 16 * 2**30


@pytest.fixture
def engine(tmp_path):
    made = []

    def make(**spec):
        e = make_engine("openai", server=ServerSpec(**spec), memory_bytes=MEMORY, log_dir=str(tmp_path))
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def started(e) -> list[int]:
    return [x.process.proc.pid for x in e._endpoints.values() if x.process]


# ---------------------------------------------------------------- without a server


def test_only_loopback_urls_are_taken():
    assert loopback_address("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert loopback_address("http://localhost:1234/") == ("localhost", 1234)
    assert loopback_address("http://[::1]:8080") == ("::1", 8080)
    for url in ("http://10.0.0.7:8000", "http://example.com:8000", "https://127.0.0.1:8000"):
        with pytest.raises(EngineError, match="is not a plain http URL on this machine"):
            loopback_address(url)
    with pytest.raises(EngineError, match="without a path"):
        loopback_address("http://127.0.0.1:8000/v1")
    with pytest.raises(EngineError, match="not a plain http URL on this machine"):
        make_engine("openai", server=ServerSpec(system="vLLM", url="http://192.168.1.20:8000"))


def test_templates_need_a_port_and_known_placeholders():
    assert expand("my-server --depth {depth} --port {port} --model {model}", "m", 3, 9000) == [
        "my-server", "--depth", "3", "--port", "9000", "--model", "m",
    ]  # fmt: skip
    assert expand("optiq serve --model '{model}' --port={port}", "a b", 0, 1)[:4] == [
        "optiq",
        "serve",
        "--model",
        "a b",
    ]
    with pytest.raises(EngineError, match=r"has no \{port\}: the engine gives every server it starts a free"):
        make_engine("openai", server=ServerSpec(system="MTPLX", command="mtplx serve --mtp --depth 3"))
    with pytest.raises(EngineError, match=r"unknown placeholder\(s\) \{draft\}, \{host\}"):
        expand("x --host {host} --drafter {draft} --port {port}", "m", 0, 1)


def test_tokens_are_counted_at_their_events():
    assert token_times([0.1, 0.2, 0.3], 3) == [0.1, 0.2, 0.3]
    assert token_times([0.1, 0.2], 4) == [0.1, 0.2, 0.2, 0.2]  # several tokens in the last event
    assert token_times([0.1, 0.2, 0.3, 0.4], 2) == [0.1, 0.4]  # split text: the last token at the last event


def test_a_server_command_names_its_version(tmp_path):
    """What server_version records for an OpenAI-compatible server: its package's version where
    the command names one (python -m PACKAGE, or a console script), else its own --version."""
    assert command_version(["python3", "-m", "pytest", "--port", "1"]) == f"pytest {metadata.version('pytest')}"
    assert command_version(["/any/where/specfleet", "serve"]) == f"specfleet {metadata.version('specfleet')}"
    script = tmp_path / "myserver"
    script.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "myserver 1.2.3 (abc)" && exit 0\nexit 2\n')
    script.chmod(0o755)
    assert command_version([str(script), "--model", "x"]) == "myserver 1.2.3 (abc)"
    script.write_text("#!/bin/sh\nexit 2\n")
    assert command_version([str(script)]) == ""  # no version said: unknown, never guessed


# ---------------------------------------------------------------- real servers


@needs_llama_server
def test_llama_server_through_its_openai_endpoint_from_templates(engine, tiny_models):
    e = engine(system="llama-server (OpenAI API)", command=BASELINE)
    assert e.load(str(tiny_models.gguf_mtp_hybrid)) > 0
    assert e.versions() == {"openai.system": "llama-server (OpenAI API)", "openai.fingerprint": "b1-0c1e570"}
    prompt = e.tokenize("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n")
    assert prompt[0] == 510  # the server's /tokenize, BOS added
    arms = [Arm("baseline"), Arm("mtp", 3, command=MTP)]
    assert e.interleaving(arms) == "rotated"
    base, mtp = (e.generate(Request(prompt, 24, a.method, a.depth, command=a.command)) for a in arms)
    assert all(x.takes_ids for x in e._endpoints.values())  # llama-server completes token-id prompts
    assert len(base.tokens) == len(mtp.tokens) == 24 and base.tokens == mtp.tokens  # same text, as many tokens
    assert base.tokens[:-1] == [-1] * 23  # not ids: an OpenAI stream carries text
    assert mtp.server.command.endswith("--spec-type draft-mtp --spec-draft-n-max 3")
    assert mtp.server.drafted > 0 and 0 <= mtp.server.accepted <= mtp.server.drafted  # from its `timings`
    assert base.server.drafted is None and base.server.decode_tokens_per_second > 0
    for gen in (base, mtp):
        assert gen.server.system == "llama-server (OpenAI API)" and gen.server.version.endswith(
            " fingerprint b1-0c1e570"
        )
        assert gen.prefill_seconds > 0 and gen.decode_seconds > 0
        assert summarise(gen)["generated_tokens"] == 24
    pids = started(e)
    e.close()
    assert len(pids) == 2 and all(gone(pid) for pid in pids)


@needs_llama_server
def test_a_server_already_running_at_a_loopback_url_is_used_and_left_running(engine, tmp_path, tiny_models):
    port = free_port()
    argv = [str(PROJECT_BUILD), "-m", str(tiny_models.gguf_target), "--port", str(port)]
    with ServerProcess(argv, port, tmp_path / "running.log", "llama-server") as running:
        e = engine(system="LM Studio", url=f"http://localhost:{port}")
        e.load(str(tiny_models.gguf_target))
        gen = e.generate(Request(e.tokenize("Hello there"), 8))
        assert len(gen.tokens) == 8 and gen.server.command == "" and gen.server.system == "LM Studio"
        e.close()
        assert running.alive()


def test_a_text_only_server_gets_the_prompt_as_text(engine, tiny_models):
    """mlx_lm.server takes no token ids: the engine decodes them with the model's tokenizer."""
    command = f"{sys.executable} -m mlx_lm.server --model {{model}} --port {{port}}"
    e = engine(system="mlx_lm.server", command=command)
    e.load(str(tiny_models.mlx_target))
    (endpoint,) = e._endpoints.values()
    assert not endpoint.takes_ids and endpoint.fingerprint
    from transformers import AutoTokenizer

    text = "def fib(n):\n    return n"
    assert e.tokenize(text) == tuple(AutoTokenizer.from_pretrained(tiny_models.mlx_target)(text)["input_ids"])
    gen = e.generate(Request(e.tokenize(text), 8))
    assert len(gen.tokens) == 8 and gen.server.decode_tokens_per_second is None  # it sends no timings
    assert gen.tokens == e.generate(Request(e.tokenize(text), 8)).tokens


# ---------------------------------------------------------------- broken servers


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("openai-no-usage", "the stream carried no usage.completion_tokens"),
        ("openai-short", r"generated 2 tokens, not the 6 asked for \(finish_reason 'stop'\): it does not honour"),
        ("garbage", "did not answer 200 within 2 s"),
    ],
)
def test_a_server_answering_wrongly_fails_the_run_and_is_stopped(tmp_path, monkeypatch, mode, reason):
    monkeypatch.setenv("FAKE_SERVER_MODE", mode)
    spec = ServerSpec(system="fake", command=f"{sys.executable} {FAKE} --port {{port}}")
    e = make_engine("openai", server=spec, log_dir=str(tmp_path), health_timeout_seconds=2.0)
    pids = []
    try:
        with pytest.raises(EngineError, match=reason):
            e.load(str(tmp_path))
            pids = started(e)
            e.generate(Request((1, 2, 3), 6))
    finally:
        e.close()
    assert all(gone(pid) for pid in pids)

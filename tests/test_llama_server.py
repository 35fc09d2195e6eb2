"""Engine llama-server against the real llama-server built from the locked llama.cpp
(scripts/build-llama-cpp.sh), on the tiny models: the command line of every arm, the streamed
run and the server's own accounting, a server's state kept until the protocol restarts it, rotation or blocks,
and every way a server can fail. tests/support/fake_server.py stands in only for servers that answer
what a real llama-server never would."""

import os
import sys
from pathlib import Path

import pytest

from agent.engines import llama_server, make_engine, server_memory
from agent.engines.base import EngineError, Request
from agent.engines.llama_server import (
    PROJECT_BUILD,
    by_position,
    find_binary,
    parse_version,
    server_argv,
    spec_counters,
    version_label,
)
from agent.summary import summarise
from specfleet import settings as declared
from specfleet.record import Arm, Sampler
from tests.support.processes import FAKE_SERVER as FAKE
from tests.support.processes import gone, needs_llama_server

CAPTURED = Path(__file__).with_name("captured")
MEMORY = 16 * 2**30
pytestmark = [needs_llama_server, pytest.mark.process]


@pytest.fixture
def engine(tmp_path):
    made = []

    def make(**options):
        e = make_engine("llama-server", **{"memory_bytes": MEMORY, "log_dir": str(tmp_path), **options})
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def pids(e) -> list[int]:
    return [s.proc.pid for s in e._servers.values()]


# ---------------------------------------------------------------- without a server


def test_version_lines_of_both_formats_parse():
    linux = (CAPTURED / "llama-server-version-linux.txt").read_text()
    assert parse_version(linux) == {"release": "0.5.0-dev", "build": "1", "commit": "0c1e570"}
    assert version_label(parse_version(linux)) == "0.5.0-dev b1-0c1e570"
    mac = (CAPTURED / "llama-server-version-macos-b9330.txt").read_text()  # the seed's Homebrew build
    assert parse_version(mac) == {"build": "9330", "commit": "328874d"}
    assert version_label(parse_version(mac)) == "b9330-328874d"
    with pytest.raises(EngineError, match="printed no version line"):
        parse_version("llama-server: command not found")


def test_every_arm_gets_its_type_and_depth_flag_after_the_shared_flags():
    shared = ("-fa", "on", "-c", "65536", "--parallel", "1", "-ngl", "99")

    def argv(method, depth, arm=(), draft="d.gguf"):
        return server_argv("llama-server", "t.gguf", draft, 8080, shared, method, depth, arm)

    head = ["llama-server", "-m", "t.gguf"]
    tail = ["--host", "127.0.0.1", "--port", "8080", "--metrics", *shared]
    assert argv("baseline", 0) == head + tail
    assert argv("draft-mtp", 3) == head + tail + ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]
    assert argv("draft-simple", 4) == head + ["-md", "d.gguf"] + tail + [
        "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
    ]  # fmt: skip
    assert argv("draft-simple", 4, draft=None) == head + tail + [
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "4",
    ]
    assert argv("ngram-mod", 64, ("--spec-ngram-mod-n-match", "24")) == head + tail + [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "64", "--spec-ngram-mod-n-match", "24",
    ]  # fmt: skip
    for method, flag in [
        ("ngram-map-k4v", "--spec-ngram-map-k4v-size-m"),
        ("ngram-map-k", "--spec-ngram-map-k-size-m"),
        ("ngram-simple", "--spec-ngram-simple-size-m"),
    ]:
        assert argv(method, 8)[-4:] == ["--spec-type", method, flag, "8"]
    assert argv("draft-mtp,ngram-mod", 3)[-6:] == [
        "--spec-type", "draft-mtp,ngram-mod", "--spec-draft-n-max", "3", "--spec-ngram-mod-n-max", "3",
    ]  # fmt: skip
    assert argv("ngram-cache", 8)[-2:] == ["--spec-type", "ngram-cache"]
    with pytest.raises(EngineError, match="ngram-cache drafts a fixed 8 tokens"):
        argv("ngram-cache", 3)


def test_the_binary_is_the_option_then_path_then_this_checkout(tmp_path, monkeypatch):
    assert find_binary("/opt/homebrew/bin/llama-server") == Path("/opt/homebrew/bin/llama-server")
    on_path = tmp_path / "bin" / "llama-server"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{os.environ['PATH']}")
    assert find_binary() == on_path
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_binary() == PROJECT_BUILD
    monkeypatch.setattr(llama_server, "PROJECT_BUILD", tmp_path / "not-built" / "llama-server")
    assert find_binary() is None
    with pytest.raises(EngineError) as e:
        make_engine("llama-server")
    for place in ("--llama-server PATH", "not on PATH", "brew install llama.cpp", "not-built/llama-server"):
        assert place in str(e.value), e.value


def test_speculative_counters_and_their_deltas_by_position():
    counters = spec_counters((CAPTURED / "llama-server-metrics-draft-mtp.txt").read_text())
    assert counters["num_draft_tokens_total"] == 54 and counters["num_accepted_tokens_total"] == 12
    assert counters["num_drafts_total"] == 19
    assert by_position({}, counters) == (7, 3, 2)
    before = {"num_accepted_tokens_per_pos_total/0": 5.0, "num_accepted_tokens_per_pos_total/1": 3.0}
    assert by_position(before, counters) == (2, 0, 2)


def test_the_memory_estimate_of_one_server(tiny_models):
    target = str(tiny_models.gguf_target)
    shape = server_memory.read_shape(target)
    assert server_memory.context_of(["-fa", "on", "-c", "2048", "--ctx-size=1024"]) == 1024
    kv = 2048 * shape.layers * shape.kv_elements_per_token_per_layer * 2
    assert server_memory.server_bytes(target, None, "baseline", ["-c", "2048"]) == (
        os.path.getsize(target) + kv + server_memory.SERVER_OVERHEAD_BYTES
    )
    with_mtp = server_memory.server_bytes(target, None, "draft-mtp", ["-c", "2048"])
    assert with_mtp == os.path.getsize(target) + kv + kv // shape.layers + server_memory.SERVER_OVERHEAD_BYTES
    assert not server_memory.fits([1], None)  # memory unknown: never all at once


def test_greedy_is_argmax_and_sampled_runs_take_the_cells_sampler(engine):
    e = engine()
    greedy = e._body(Request((1, 2), 4))
    assert (greedy["temperature"], greedy["top_k"], greedy["top_p"], greedy["min_p"]) == (0.0, 1, 1.0, 0.0)
    assert greedy["ignore_eos"] and not greedy["cache_prompt"] and greedy["return_tokens"] and greedy["stream"]
    sampled = e._body(Request((1, 2), 4, sampler=Sampler(temperature=0.7, top_p=0.9, top_k=20, seed=5)))
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"], sampled["seed"]) == (0.7, 20, 0.9, 5)
    # llama.cpp's order: the truncations, then the temperature; every declared row llama-server samples by.
    assert sampled["samplers"][:2] == ["top_k", "top_p"] and sampled["samplers"][-1] == "temperature"
    assert set(sampled["samplers"]) == {row.server_sampler for row in declared.SAMPLER if row.server_sampler}
    assert sampled["min_p"] == 0.0  # llama-server's own default, 0.05, off unless the cell sets it
    assert e._body(Request((1, 2), 4, sampler=Sampler(temperature=0.7, min_p=0.1)))["min_p"] == 0.1


# ---------------------------------------------------------------- with the real server


def test_a_sampler_row_alone_reaches_the_real_server_xtc(engine, tiny_models):
    """XTC's probability, added to the sampler as one row of specfleet/settings.py and a migration:
    the real llama-server takes it (its request key, 'xtc' in the samplers chain). A sampled run
    with the same seed repeats token for token; with XTC at 1 (every token more likely than 0.1 but
    the least of them cut) the same seed gives other tokens."""
    e = engine()
    e.load(str(tiny_models.gguf_target))
    prompt = e.tokenize("The capital of France is")

    def tokens(xtc: float) -> list[int]:
        return e.generate(Request(prompt, 24, sampler=Sampler(temperature=1.0, seed=5, xtc_probability=xtc))).tokens

    off = tokens(0.0)
    assert len(off) == 24 and tokens(0.0) == off
    assert tokens(1.0) != off


def test_runs_are_timed_per_event_and_carry_the_servers_own_accounting(engine, tiny_models):
    e = engine()
    assert e.load(str(tiny_models.gguf_mtp_hybrid)) > 0
    prompt = e.tokenize("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n")
    assert prompt[0] == 510 and e.tokenize("") == (510,)  # BOS added, as the models expect
    assert e.versions() == {
        "llama-server.release": "0.5.0-dev",
        "llama-server.build": "1",
        "llama-server.commit": "0c1e570",
    }
    e.interleaving([Arm("baseline"), Arm("draft-mtp", 3)])
    base = e.generate(Request(prompt, 32))
    mtp = e.generate(Request(prompt, 32, "draft-mtp", 3))
    assert len(base.tokens) == len(mtp.tokens) == 32  # ignore_eos: exactly max_new_tokens
    assert base.tokens == mtp.tokens  # greedy: speculation changes nothing
    assert sum(t >= 0 for t in base.tokens) > 16  # real ids, but for those held back as partial UTF-8
    for gen in (base, mtp):
        assert gen.token_times_seconds == sorted(gen.token_times_seconds)
        assert gen.prefill_seconds == gen.token_times_seconds[0] > 0 and gen.decode_seconds > 0
        assert gen.server.system == "llama-server" and gen.server.version == "0.5.0-dev b1-0c1e570"
        assert gen.server.interleaving == "rotated" and gen.server.drafter_warm is None
        assert gen.server.decode_tokens_per_second > 0 and gen.server.prefill_seconds > 0
    assert base.server.command.endswith("--metrics") and base.server.drafted is None
    assert mtp.server.command.endswith("--metrics --spec-type draft-mtp --spec-draft-n-max 3")
    s = mtp.server
    assert s.drafted > 0 and 0 < s.accepted <= s.drafted
    assert len(s.accepted_by_position) == 3 and sum(s.accepted_by_position) == s.accepted
    assert len(set(s.drafted_by_position)) == 1 and s.drafted_by_position[0] >= s.accepted_by_position[0]
    fields = summarise(mtp)
    assert fields["tokens_drafted"] == s.drafted and fields["server_command"] == s.command
    assert len(fields["acceptance_by_position"]) == 3


def test_a_draft_model_arm_loads_its_draft(engine, tiny_models):
    e = engine()
    e.load(str(tiny_models.gguf_target), str(tiny_models.gguf_draft))
    prompt = e.tokenize("The quick brown fox jumps over the lazy dog.")
    gen = e.generate(Request(prompt, 16, "draft-simple", 2))
    assert f"-md {tiny_models.gguf_draft}" in gen.server.command and gen.server.drafted > 0
    assert gen.tokens == e.generate(Request(prompt, 16)).tokens


def test_a_stateful_drafter_keeps_its_state_until_the_protocol_restarts_its_server(engine, tiny_models):
    """ngram-mod's table outlives a request: kept, a repeated prompt is drafted from the earlier
    run's tokens and acceptance rises; restarted before every run (`restart`), every run starts
    the same. The engine never restarts a server on its own: the state is the protocol's."""
    flags = ("--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-min", "2")
    arm = Arm("ngram-mod", 16, flags)
    text = "The quick brown fox jumps over the lazy dog. A second, different sentence about a cat."
    results = {}
    for fresh in (True, False):
        e = engine()
        e.load(str(tiny_models.gguf_target))
        prompt = e.tokenize(text)
        runs, servers, served = [], set(), []
        for _ in range(3):
            if fresh:
                e.restart(arm)
            served.append(e.served(arm))
            gen = e.generate(Request(prompt, 64, "ngram-mod", 16, flags=flags))
            runs.append((gen.server.accepted, gen.server.drafter_warm))
            servers.add(e._servers[("ngram-mod", 16, flags)].proc.pid)
        results[fresh] = runs, len(servers), served
    fresh, kept = results[True], results[False]
    assert fresh == ([(fresh[0][0][0], False)] * 3, 3, [0, 0, 0])  # the same each time, from three servers
    (first, warm_first), *later = kept[0]
    assert kept[1:] == (1, [0, 1, 2]) and warm_first is False and all(warm for _, warm in later)
    assert all(accepted > first for accepted, _ in later), kept  # the table remembered


def test_rotated_keeps_every_arm_up_and_blocks_keeps_one(engine, tiny_models):
    arms = [Arm("baseline"), Arm("draft-mtp", 2), Arm("ngram-simple", 4)]
    for memory, plan, most_up in [(MEMORY, "rotated", 3), (2**20, "blocks", 1)]:
        e = engine(memory_bytes=memory)
        e.load(str(tiny_models.gguf_mtp_hybrid))
        prompt = e.tokenize("Hello there, general purpose tokens.")
        assert e.interleaving(arms) == plan
        up = []
        for arm in arms * 2:
            gen = e.generate(Request(prompt, 8, arm.method, arm.depth))
            assert gen.server.interleaving == plan
            up.append(sum(s.alive() for s in e._servers.values()))
        assert max(up) == most_up, (plan, up)


# ---------------------------------------------------------------- failures


def test_an_unknown_spec_type_is_refused_by_llama_server_itself(engine, tiny_models):
    e = engine()
    e.load(str(tiny_models.gguf_target))
    prompt = e.tokenize("Hello")
    with pytest.raises(EngineError) as err:
        e.generate(Request(prompt, 4, "draft-bogus", 2))
    assert "exited at start with status 1" in str(err.value)
    assert 'error while handling argument "--spec-type": unknown speculative type: draft-bogus' in str(err.value)
    assert ("draft-bogus", 2, ()) not in e._servers
    with pytest.raises(EngineError, match="ngram n-max must be between 0 and 1024"):  # an arm flag it refuses
        e.generate(Request(prompt, 4, "ngram-mod", 2, flags=("--spec-ngram-mod-n-max", "5000")))


def test_a_server_that_dies_mid_run_fails_the_run_and_nothing_is_left(engine, tiny_models):
    e = engine()
    e.load(str(tiny_models.gguf_target))
    prompt = e.tokenize("Hello")
    (pid,) = pids(e)
    os.kill(pid, 9)
    with pytest.raises(EngineError, match=r"died during the run \(killed by SIGKILL\)"):
        e.generate(Request(prompt, 4))
    e.close()
    assert gone(pid) and not e._servers


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("llama-no-timings", "the stream ended without a final event carrying timings"),
        ("llama-garbage", "streamed an event that is not JSON"),
        ("unhealthy", "did not answer 200 within 2 s"),
    ],
)
def test_a_server_answering_garbage_or_no_timings_fails_and_leaves_nothing(engine, tmp_path, monkeypatch, mode, reason):
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n" + Path(FAKE).read_text())
    binary.chmod(0o755)
    monkeypatch.setenv("FAKE_SERVER_MODE", mode)
    monkeypatch.setattr(llama_server, "parse_version", lambda text: {"build": "0", "commit": "fake"})
    e = engine(binary=str(binary), health_timeout_seconds=2.0)
    with pytest.raises(EngineError, match=reason):
        e.load("model.gguf")
        e.generate(Request((1, 2, 3), 4))
    started = pids(e)
    e.close()
    assert all(gone(pid) for pid in started)


def test_a_context_too_small_for_the_run_is_named(engine, tiny_models):
    e = engine(flags=("-c", "64"))  # llama-server raises it to its minimum, 256 per slot
    e.load(str(tiny_models.gguf_target))
    prompt = e.tokenize("A prompt of a few tokens.")
    with pytest.raises(EngineError, match=r"streamed \d+ tokens for n_predict 300 .*do not fit in its context \(-c\)"):
        e.generate(Request(prompt, 300))


def test_the_agents_llama_server_is_the_flag_then_the_variable_then_its_settings(tmp_path, monkeypatch):
    from agent import settings
    from agent.config import AgentConfig
    from agent.fingerprint import available_engines

    config = tmp_path / "agent"
    monkeypatch.delenv("SPECFLEET_LLAMA_SERVER", raising=False)

    def chosen(flag=None):
        return AgentConfig.load(config, {"llama_server": flag}).llama_server

    assert chosen() is None
    settings.save(config, llama_server=str(PROJECT_BUILD))
    assert chosen() == PROJECT_BUILD.resolve()
    other = tmp_path / "llama-server"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("SPECFLEET_LLAMA_SERVER", str(other))
    assert chosen() == other
    assert chosen(str(PROJECT_BUILD)) == PROJECT_BUILD.resolve()
    with pytest.raises(ValueError, match="llama_server from --llama-server: .* does not exist or is not an executable"):
        chosen(str(tmp_path / "typo"))
    assert available_engines(other)[-2:] == ["llama-server", "openai"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(llama_server, "PROJECT_BUILD", tmp_path / "not-built")
    # An agent with no llama-server takes no llama-server job; openai needs only its templates.
    assert "llama-server" not in available_engines(None) and available_engines(None)[-1] == "openai"


def test_a_job_in_blocks_through_the_protocol_gives_valid_records(engine, tiny_models):
    """The measurement protocol on this engine with arms that do not fit together: runs in blocks,
    every record valid, greedy speculation lossless, no server left once the job is done."""
    from agent.protocol import run_job
    from specfleet.record import JobSpec, ModelIdentity, Prompt, ServerSpec

    spec = JobSpec(
        engine="llama-server",
        model={"target": str(tiny_models.gguf_mtp_hybrid)},
        prompt_set="code",
        prompt_category="code",
        prompt_set_digest="cd" * 32,
        prompts=(Prompt("p1", "def add(a, b):\n    return a + b\n"), Prompt("p2", "The capital of France is")),
        arms=(Arm("baseline"), Arm("draft-mtp", 2)),
        server=ServerSpec(flags=("-c", "1024")),
        max_new_tokens=12,
        warmup=1,
        repeats=2,
    )
    e = engine(memory_bytes=2**20, flags=spec.server.flags)
    records = []
    target = ModelIdentity(reference="mtp-hybrid.gguf", digest="ab" * 32, context_length=4096)
    run_job(spec, e, records.append, job_id="job-1", attempt=1, target=target)
    assert len(records) == 2 * 2 * 2 and not e._servers  # prompts x arms x repeats; closed at the end
    for r in records:
        assert (r.system, r.interleaving, r.generated_tokens) == ("llama-server", "blocks", 12)
        assert r.lossless is True and r.server_version == "0.5.0-dev b1-0c1e570"
        assert "-c 1024" in r.server_command and r.server_decode_tokens_per_second > 0
    assert {r.tokens_drafted > 0 for r in records if r.method == "draft-mtp"} == {True}

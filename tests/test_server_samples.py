"""Server runs leave what in-process runs leave (issue 26): a text sample, and at a greedy
divergence the target's logit margin, so that a near-tie is labelled on a llama-server run as on
ours. Against the real llama-server (scripts/build-llama-cpp.sh) on the tiny models; the
in-process llama.cpp engine on the same GGUF and thread count gives the known answers."""

import pytest

from agent.divergence import Divergences
from agent.engines import make_engine
from agent.engines.base import EngineError, Request
from agent.engines.llama_server import PROJECT_BUILD, UNKNOWN_ID
from agent.protocol import run_job
from agent.summary import text_sample
from specfleet.record import Arm, JobSpec, ModelIdentity, Prompt, ServerSpec, Settings
from tests.support.processes import needs_llama_server

pytestmark = [needs_llama_server, pytest.mark.process, pytest.mark.engine]

ONE_THREAD = Settings(threads=1)
PROMPT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
NEW_TOKENS = 16


@pytest.fixture
def engines(tmp_path, tiny_models):
    """llama-server and the in-process llama.cpp engine, both on the tiny target at one thread."""
    server = make_engine(
        "llama-server", flags=("-c", "1024"), settings=ONE_THREAD, memory_bytes=16 * 2**30, log_dir=str(tmp_path)
    )
    ours = make_engine("llama.cpp", settings=ONE_THREAD)
    try:
        server.load(str(tiny_models.gguf_target))
        ours.load(str(tiny_models.gguf_target))
        yield server, ours
    finally:
        server.close()
        ours.close()


def test_a_llama_server_runs_text_is_the_in_process_engines_text_of_the_same_tokens(engines):
    server, ours = engines
    prompt = server.tokenize(PROMPT)
    streamed = server.generate(Request(prompt, NEW_TOKENS)).tokens
    reference = ours.generate(Request(prompt, NEW_TOKENS)).tokens
    known = [a for a, b in zip(streamed, reference) if a != UNKNOWN_ID]
    assert known == [b for a, b in zip(streamed, reference) if a != UNKNOWN_ID]  # one greedy output
    assert UNKNOWN_ID in streamed  # the tiny model's byte tokens: some ids held back by the stream
    # The streamed run's text (its ids held back) and the server's /detokenize of the full ids both
    # equal the in-process engine's text of the same tokens.
    assert text_sample(server, streamed) == text_sample(server, reference) == text_sample(ours, reference)
    assert text_sample(server, reference)  # not empty
    server.close()
    with pytest.raises(EngineError, match="no text kept"):  # no server up, and tokens never streamed
        server.detokenize([UNKNOWN_ID, 5])


def test_llama_servers_logit_margin_is_the_in_process_engines(engines):
    """Known answer: llama-server's n_probs give the same gap as llama.cpp's logits in process,
    one-token decoding and batches of 2 to 5 rows alike; its requests are counted as served."""
    server, ours = engines
    prompt = server.tokenize(PROMPT)
    sequence = list(prompt) + list(ours.generate(Request(prompt, NEW_TOKENS)).tokens)
    position = len(prompt) + 10
    served = server.served(Arm("baseline"))
    for rows in (1, 2, 3, 5):
        top = ours.logit_margin(sequence, position, rows)
        got = server.logit_margin(sequence, position, rows, pair=(top.first, top.second))
        assert (got.first, got.second) == (top.first, top.second)
        assert got.margin == pytest.approx(top.margin, abs=1e-4)
        assert server.logit_margin(sequence, position, rows).margin == pytest.approx(top.margin, abs=1e-4)
    assert server.served(Arm("baseline")) == served + 4 * 2 * 2  # two requests a margin
    # The least likely of 31 tokens (of 512) is not among the server's top 20.
    unlikely = max(range(0, 512, 17), key=lambda t: ours.logit_margin(sequence, position, 1, (top.first, t)).margin)
    with pytest.raises(EngineError, match=r"not among the top 20 at position"):
        server.logit_margin(sequence, position, 1, pair=(top.first, unlikely))
    with pytest.raises(EngineError, match="logit_margin needs"):
        server.logit_margin(sequence, 3, 5)
    served = server.served(Arm("baseline"))
    with pytest.raises(EngineError, match="a token of the pair is one whose id the stream held back"):
        server.logit_margin(sequence, position, 1, pair=(top.first, UNKNOWN_ID))
    assert server.served(Arm("baseline")) == served  # refused before any request


def test_held_back_ids_before_the_position_are_filled_by_the_servers_greedy_continuation(engines):
    """Known answer: a prefix with ids the stream held back (UNKNOWN_ID, as a streamed baseline
    has them) gives the margin of the full ids, filled by one greedy request and kept; a prefix
    whose known ids the continuation contradicts is refused, naming where."""
    server, ours = engines
    prompt = server.tokenize(PROMPT)
    sequence = list(prompt) + list(ours.generate(Request(prompt, NEW_TOKENS)).tokens)
    position = len(prompt) + 10
    held_back = list(sequence)
    for i in (len(prompt) + 2, len(prompt) + 3, position - 1):
        held_back[i] = UNKNOWN_ID
    top = ours.logit_margin(sequence, position, 1)
    served = server.served(Arm("baseline"))
    for rows in (1, 3):
        got = server.logit_margin(held_back, position, rows, pair=(top.first, top.second))
        assert got.margin == pytest.approx(ours.logit_margin(sequence, position, rows).margin, abs=1e-4)
    assert server.served(Arm("baseline")) == served + 1 + 2 * 2  # the fill once, two requests a margin
    wrong = list(held_back)
    wrong[position - 2] = (sequence[position - 2] + 1) % 512  # a known id the greedy path does not take
    with pytest.raises(EngineError, match=rf"cannot be filled: .* at token {position - 2} where the run has"):
        server.logit_margin(wrong, position, 1)


def test_a_divergence_on_a_server_run_is_labelled_by_the_servers_margin(engines):
    """A run that leaves the greedy reference for the second-best token: a near-tie when the
    threshold exceeds the server's margin there, a defect when it does not, the margin the same as
    the in-process engine's."""
    server, ours = engines
    prompt = server.tokenize(PROMPT)
    reference = list(ours.generate(Request(prompt, NEW_TOKENS)).tokens)
    at = 10
    second = ours.logit_margin(list(prompt) + reference, len(prompt) + at)
    diverged = reference[:at] + [second.second] + reference[at + 1 :]
    judged = {
        floor: Divergences(server, floor).judge(prompt, diverged, reference, "greedy reference", 3)
        for floor in (0.0, second.margin * 2)
    }
    defect, tie = judged[0.0], judged[second.margin * 2]
    assert (defect["divergence"], defect["lossless"], defect["divergence_position"]) == ("defect", False, at)
    assert (tie["divergence"], tie["lossless"]) == ("near-tie", None)
    for out in (defect, tie):
        assert out["divergence_margin"] == pytest.approx(second.margin, abs=1e-4)
        assert (out["divergence_token"], out["divergence_reference_token"]) == (second.second, second.first)
        assert out["divergence_cause"] == ""
    # The server's own streamed baseline as the reference, ids held back before the divergence
    # (the CUDA run's qa-02, bench/README.md): its margin is measured all the same.
    streamed = list(server.generate(Request(prompt, NEW_TOKENS)).tokens)
    at = max(i for i, t in enumerate(streamed) if t != UNKNOWN_ID and UNKNOWN_ID in streamed[:i])
    second = ours.logit_margin(list(prompt) + reference, len(prompt) + at)
    diverged = streamed[:at] + [second.second] + streamed[at + 1 :]
    out = Divergences(server, 0.0).judge(prompt, diverged, streamed, "greedy reference", 3)
    assert (out["divergence"], out["divergence_position"], out["divergence_cause"]) == ("defect", at, "")
    assert out["divergence_margin"] == pytest.approx(second.margin, abs=1e-4)


@pytest.mark.parametrize("engine_name", ["llama-server", "openai"])
def test_server_jobs_records_carry_text_samples(tmp_path, tiny_models, engine_name):
    """Through the measurement protocol: every prompt's first repeat carries its text (at most 512
    characters), for both server engines."""
    if engine_name == "llama-server":
        server = ServerSpec(flags=("-c", "1024"))
        engine = make_engine("llama-server", flags=server.flags, memory_bytes=16 * 2**30, log_dir=str(tmp_path))
    else:
        server = ServerSpec(system="llama-server-v1", command=f"{PROJECT_BUILD} -m {{model}} --port {{port}} -c 1024")
        engine = make_engine("openai", server=server, memory_bytes=16 * 2**30, log_dir=str(tmp_path))
    spec = JobSpec(
        engine=engine_name,
        model={"target": str(tiny_models.gguf_target)},
        prompt_set="code",
        prompt_category="code",
        prompt_set_digest="cd" * 32,
        prompts=(Prompt("p1", PROMPT), Prompt("p2", "The capital of France is")),
        arms=(Arm("baseline"),),
        server=server,
        max_new_tokens=12,
        warmup=0,
        repeats=2,
    )
    records = []
    target = ModelIdentity(reference="target.gguf", digest="ab" * 32, context_length=4096)
    try:
        run_job(spec, engine, records.append, job_id="job-1", attempt=1, target=target)
    finally:
        engine.close()
    assert len(records) == 2 * 2
    for r in records:
        if r.repeat == 0:
            assert r.text_sample and len(r.text_sample) <= 512, r
        else:
            assert r.text_sample is None
    first = {r.prompt_id: r.text_sample for r in records if r.repeat == 0}
    assert first["p1"] != first["p2"]

"""llama.cpp on the hybrid (GatedDeltaNet + attention) tiny Qwen3.5: method mtp and the
rollback of recurrent state that every speculative method needs there. Greedy output equals
baseline token for token; rejected proposals leave no trace in the recurrent state; models and
methods llama.cpp cannot serve are refused by name, without crashing the process."""

from __future__ import annotations

import ctypes

import llama_cpp
import pytest

from agent.engines import llamacpp, llamacpp_mtp, make_engine
from agent.engines.base import EngineError, Request, Sampler
from cli import tinymodels, tinymtp

pytestmark = [pytest.mark.engine]

NEW_TOKENS = 32
PROMPTS = (
    "Speculative decoding lets a small draft model propose several tokens that the large",
    "def accept(draft_tokens, target_tokens):\n    accepted = 0\n    for draft, target in zip(",
    "The fleet measures tokens per second, time to first token, acceptance by draft position",
)
# Repeats itself, so prompt lookup proposes a lot and the target rejects some of it.
REPETITIVE = 'for chip in ["M1", "M2", "M3", "M4"]:\n    print(chip)\nfor chip in ["M1", "M2", "M3", "M4"]:\n'
SAMPLED = Sampler(temperature=1.0, top_p=0.9, top_k=40, seed=7)
RECURRENT_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@pytest.fixture(scope="module")
def engine(tiny_models):
    engine = make_engine("llama.cpp")
    engine.load(str(tiny_models.gguf_mtp_hybrid), str(tiny_models.gguf_mtp_hybrid_draft))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(engine):
    return [engine.tokenize(text) for text in PROMPTS]


@pytest.fixture(scope="module")
def baselines(engine, prompts):
    return [engine.generate(Request(prompt, NEW_TOKENS)).tokens for prompt in prompts]


def _check_rounds(gen, depth: int) -> None:
    assert len(gen.tokens) == NEW_TOKENS == 1 + sum(r.accepted for r in gen.rounds) + len(gen.rounds)
    assert all(0 <= r.accepted <= r.drafted <= depth and len(r.proposed) == r.drafted for r in gen.rounds)
    assert all(r.draft_seconds >= 0 and r.verify_seconds > 0 for r in gen.rounds)
    assert sum(gen.drafted_by_position) == sum(r.drafted for r in gen.rounds)
    assert sum(gen.accepted_by_position) == sum(r.accepted for r in gen.rounds)


def _proposals(monkeypatch, drafter) -> list[tuple[list[int], list[int]]]:
    """Record (context, proposals) of every propose() call of a drafter class."""
    calls = []
    propose = drafter.propose

    def recording(self, context, k):
        tokens = propose(self, context, k)
        calls.append((list(context), tokens))
        return tokens

    monkeypatch.setattr(drafter, "propose", recording)
    return calls


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_mtp_greedy_is_lossless(engine, prompts, baselines, depth):
    accepted = drafted = 0
    for prompt, baseline in zip(prompts, baselines):
        gen = engine.generate(Request(prompt, NEW_TOKENS, method="mtp", depth=depth))
        assert gen.tokens == baseline
        _check_rounds(gen, depth)
        accepted += sum(r.accepted for r in gen.rounds)
        drafted += sum(r.drafted for r in gen.rounds)
    print(f"mtp depth {depth}: acceptance {accepted}/{drafted} = {accepted / drafted:.2f}")
    assert 0 < accepted < drafted


@pytest.mark.parametrize("method", ["draft", "ngram"])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_draft_and_ngram_greedy_are_lossless_on_a_hybrid(engine, prompts, baselines, method, depth):
    for prompt, baseline in zip(prompts, baselines):
        gen = engine.generate(Request(prompt, NEW_TOKENS, method=method, depth=depth))
        assert gen.tokens == baseline
        _check_rounds(gen, depth)


def test_rejected_proposals_leave_no_trace_in_the_recurrent_state(engine, monkeypatch):
    """Prompt lookup on repetitive text gets proposals rejected; output stays the baseline's.
    The same run with a rollback that drops the rejected tokens from the attention cache but
    leaves the recurrent state as they made it goes wrong: the test can fail."""
    prompt = engine.tokenize(REPETITIVE)
    baseline = engine.generate(Request(prompt, NEW_TOKENS)).tokens
    request = Request(prompt, NEW_TOKENS, method="ngram", depth=4)
    gen = engine.generate(request)
    assert any(r.accepted < r.drafted for r in gen.rounds)  # some proposals were rejected
    assert gen.tokens == baseline

    ctx, seq_rm = engine._target.ctx, llama_cpp.llama_memory_seq_rm

    def attention_only(mem, seq_id, p0, p1):
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, 0, RECURRENT_ONLY)
        state = (ctypes.c_uint8 * size)()
        llama_cpp.llama_state_seq_get_data_ext(ctx, state, size, 0, RECURRENT_ONLY)
        done = seq_rm(mem, seq_id, p0, p1)
        llama_cpp.llama_state_seq_set_data_ext(ctx, state, size, 0, RECURRENT_ONLY)
        return done

    monkeypatch.setattr(llama_cpp, "llama_memory_seq_rm", attention_only)
    assert engine.generate(request).tokens != baseline


@pytest.mark.parametrize("method,drafter", [("mtp", llamacpp_mtp.MtpDrafter), ("draft", llamacpp._DraftModel)])
def test_proposals_equal_a_fresh_start(engine, monkeypatch, method, drafter):
    """A draft's mistakes cost acceptance, not output, so token equality cannot show that the
    draft model's recurrent state and the MTP head's cache are rolled back right: each round's
    proposals must equal those of a new generation whose prompt is that round's context."""
    calls = _proposals(monkeypatch, drafter)
    engine.generate(Request(engine.tokenize(PROMPTS[0]), 24, method=method, depth=3))
    rounds = list(calls)
    assert len(rounds) > 5
    for context, proposed in rounds:
        calls.clear()
        # The newest context token is the target's own, so the new run's first token is it.
        engine.generate(Request(tuple(context[:-1]), len(proposed) + 2, method=method, depth=len(proposed)))
        assert calls[0] == (context, proposed)


def test_targets_without_snapshots_roll_back_from_checkpoints(tiny_models, monkeypatch):
    """Recurrent archs llama.cpp keeps no snapshots for restore a checkpoint of the recurrent
    state and decode the accepted tokens again; the MTP head reads their hidden states."""
    monkeypatch.setattr(llamacpp, "ROLLBACK_SNAPSHOTS", 0)
    engine = make_engine("llama.cpp")
    engine.load(str(tiny_models.gguf_mtp_hybrid))
    assert engine._target.recurrent and engine._target.snapshots == 0
    prompt = engine.tokenize(REPETITIVE)
    baseline = engine.generate(Request(prompt, NEW_TOKENS)).tokens
    for method in ("ngram", "mtp"):
        gen = engine.generate(Request(prompt, NEW_TOKENS, method=method, depth=3))
        assert gen.tokens == baseline
        assert any(r.accepted < r.drafted for r in gen.rounds)
    assert len(engine.verify_cost(8, max_rows=4, repeats=1)) == 4
    engine.close()


def test_a_failed_restore_is_refused(engine, monkeypatch):
    """The hybrid draft returns to its checkpoint each round; if llama.cpp does not restore
    it, the engine stops rather than draft from a wrong state."""
    monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data_ext", lambda ctx, src, size, seq, flags: size)
    with pytest.raises(EngineError, match="could not restore the recurrent state"):
        engine.generate(Request(engine.tokenize(PROMPTS[0]), NEW_TOKENS, method="draft", depth=3))


def test_mtp_on_a_model_without_an_mtp_head_is_refused(tiny_models):
    engine = make_engine("llama.cpp")
    engine.load(str(tiny_models.gguf_target), str(tiny_models.gguf_draft))  # loads: other methods work
    message = (
        r"method 'mtp' needs an MTP head: blk\.4\.nextn\.eh_proj\.weight, blk\.4\.nextn\.enorm\.weight, "
        r"blk\.4\.nextn\.hnorm\.weight not in target\.gguf"
    )
    with pytest.raises(EngineError, match=message):
        engine.generate(Request((1, 2, 3), 4, method="mtp", depth=2))
    assert len(engine.generate(Request((1, 2, 3), 4, method="draft", depth=2)).tokens) == 4
    engine.close()


def test_a_qwen35_without_both_kinds_of_layer_is_refused_at_load(tiny_models, tmp_path):
    """llama.cpp's qwen35 graph aborts the process on the first decode of a model whose layers
    are all full attention, or all recurrent."""
    message = r"mtp-dense\.gguf is a qwen35 model with no recurrent .*upstream assert GGML_ASSERT\(buffer\)"
    dense, hybrid = str(tiny_models.gguf_mtp_dense), str(tiny_models.gguf_mtp_hybrid)
    for target, draft in ((dense, None), (hybrid, dense)):  # as a target, and as a draft
        engine = make_engine("llama.cpp")
        with pytest.raises(EngineError, match=message):
            engine.load(target, draft)
        engine.close()
    shape = tinymtp.Qwen35Shape(layers=2, full_attention_interval=4, mtp_layers=0)  # layers 0 and 1 recurrent
    recurrent = tinymtp.write_gguf(
        tmp_path / "all-recurrent.gguf",
        shape,
        tinymtp.random_weights(shape, tinymodels.VOCAB_SIZE, 1, mtp=False),
        tinymodels.build_vocab(),
    )
    engine = make_engine("llama.cpp")
    with pytest.raises(EngineError, match=r"all-recurrent\.gguf is a qwen35 model with no full-attention layer"):
        engine.load(str(recurrent))
    engine.close()


@pytest.mark.parametrize("depth", [0, 65])
def test_mtp_needs_a_depth(engine, depth):
    with pytest.raises(EngineError, match=f"depth from 1 to 64, got {depth}"):
        engine.generate(Request((1, 2, 3), 4, method="mtp", depth=depth))


def test_sampled_mtp_is_reproducible(engine, prompts):
    request = Request(prompts[0], NEW_TOKENS, method="mtp", depth=3, sampler=SAMPLED)
    first, second = engine.generate(request), engine.generate(request)
    assert first.tokens == second.tokens
    assert [r.proposed for r in first.rounds] == [r.proposed for r in second.rounds]
    _check_rounds(first, 3)


EOS = tinymodels.VOCAB_SIZE - 1
EOS_PROMPT = "as by as of model else and"  # the hybrid's greedy continuation has EOS at position 13


def test_mtp_never_emits_eos(engine, monkeypatch):
    """The target's sampling bans end-of-generation tokens in every method, MTP's included."""
    prompt = engine.tokenize(EOS_PROMPT)
    baseline = engine.generate(Request(prompt, NEW_TOKENS)).tokens
    runs = [engine.generate(Request(prompt, NEW_TOKENS, method=m, depth=3)) for m in ("mtp", "draft", "ngram")]
    assert EOS not in baseline and all(gen.tokens == baseline for gen in runs)
    monkeypatch.setattr(engine._target, "end_tokens", [])
    assert engine.generate(Request(prompt, NEW_TOKENS)).tokens.index(EOS) == 13  # the ban is what kept it out

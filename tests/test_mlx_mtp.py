"""MLX engine on the tiny Qwen3.5-style models: MTP drafting and hybrid (GatedDeltaNet) rollback.

Every speculative method must give exactly the baseline's greedy tokens, on the dense and the
hybrid model; the rollback test shows that it would not if recurrent state were not restored.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from agent.engines import make_engine
from agent.engines import mlx as mlx_engine
from agent.engines.base import EngineError, Request, Sampler
from agent.summary import acceptance_flags

pytestmark = [pytest.mark.engine]

NEW_TOKENS = 24
TEXTS = (
    "def accept(draft_tokens, target_tokens):\n    accepted = 0\n    for draft, target in zip(",
    "Speculative decoding lets a small draft model propose several tokens that the large",
    'for chip in ["M1", "M2", "M3", "M4"]:\n    print(chip)\nfor chip in ["M1", "M2", "M3", "M4"]:\n',
)


def _load(path, draft=None):
    engine = make_engine("mlx")
    engine.load(str(path), str(draft) if draft else None)
    return engine


@pytest.fixture(scope="module")
def hybrid(tiny_models):
    return _load(tiny_models.mlx_mtp_hybrid, tiny_models.mlx_mtp_hybrid_draft)


@pytest.fixture(scope="module")
def dense(tiny_models):
    return _load(tiny_models.mlx_mtp_dense)


def _baselines(engine):
    prompts = [engine.tokenize(text) for text in TEXTS]
    return prompts, [engine.generate(Request(p, NEW_TOKENS)).tokens for p in prompts]


@pytest.mark.parametrize("variant", ["dense", "hybrid"])
def test_greedy_mtp_is_lossless_and_accounted(variant, request):
    engine = request.getfixturevalue(variant)
    prompts, baselines = _baselines(engine)
    drafted = accepted = 0
    for depth in (1, 2, 3, 4):
        for prompt, baseline in zip(prompts, baselines):
            gen = engine.generate(Request(prompt, NEW_TOKENS, method="mtp", depth=depth))
            assert gen.tokens == baseline, f"{variant} mtp depth {depth} differs from baseline"
            assert len(gen.tokens) == 1 + sum(r.accepted for r in gen.rounds) + len(gen.rounds)
            assert len(gen.accepted_by_position) == depth
            assert all(0 <= a <= d for a, d in zip(gen.accepted_by_position, gen.drafted_by_position))
            drafted += sum(r.drafted for r in gen.rounds)
            accepted += sum(r.accepted for r in gen.rounds)
    # The tiny head is useful but not perfect: some proposals are accepted, not all.
    assert 0.05 < accepted / drafted < 0.95


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_draft_and_ngram_are_lossless_on_the_hybrid(hybrid, method):
    prompts, baselines = _baselines(hybrid)
    rejected = 0
    for depth in (1, 3, 4):
        for prompt, baseline in zip(prompts, baselines):
            gen = hybrid.generate(Request(prompt, NEW_TOKENS, method=method, depth=depth))
            assert gen.tokens == baseline, f"{method} depth {depth} differs from baseline"
            rejected += sum(r.drafted > r.accepted for r in gen.rounds)
    assert rejected > 0  # rollbacks happened


def test_recurrent_state_rollback_is_what_keeps_the_hybrid_exact(hybrid, monkeypatch):
    """With the recurrent states left as the rejected proposals made them (attention layers
    still trimmed), the same runs drift from baseline: the test can fail."""
    prompts, baselines = _baselines(hybrid)
    run = [Request(p, NEW_TOKENS, method="draft", depth=3) for p in prompts]
    assert [hybrid.generate(r).tokens for r in run] == baselines

    def rollback_without_restore(self, fed, kept):
        for c, recurrent in zip(self.layers, self.recurrent):
            if not recurrent:
                c.trim(fed - len(kept))

    monkeypatch.setattr(mlx_engine._Cache, "rollback", rollback_without_restore)
    assert [hybrid.generate(r).tokens for r in run] != baselines


def test_sampled_mtp_is_reproducible(hybrid):
    prompt = hybrid.tokenize(TEXTS[1])
    sampled = Request(prompt, NEW_TOKENS, method="mtp", depth=2, sampler=Sampler(1.0, 0.9, 40, seed=7))
    assert hybrid.generate(sampled).tokens == hybrid.generate(sampled).tokens


def test_mtp_on_models_without_mtp_tensors_is_refused_by_name(tiny_models):
    llama = _load(tiny_models.mlx_target)
    with pytest.raises(EngineError, match="Qwen3.5-style model with an MTP block.*'llama'"):
        llama.generate(Request(llama.tokenize(TEXTS[0]), 4, method="mtp", depth=1))
    no_head = _load(tiny_models.mlx_mtp_hybrid_draft)
    with pytest.raises(EngineError, match=r"has no mtp\.fc\.weight, .*mtp\.layers\.0\.\*"):
        no_head.generate(Request(no_head.tokenize(TEXTS[0]), 4, method="mtp", depth=1))
    assert len(no_head.generate(Request(no_head.tokenize(TEXTS[0]), 4)).tokens) == 4  # baseline still runs


def test_a_random_mtp_head_collapses_and_the_run_is_flagged(tiny_models, tmp_path):
    """A head that does not belong to its trunk (here: random MTP weights, as when a
    converter drops the tensors and something re-initialises them) is almost never right."""
    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "random-head"
    shutil.copytree(tiny_models.mlx_mtp_hybrid, broken)
    weights = load_file(str(broken / "model.safetensors"))
    rng = np.random.default_rng(0)
    for name, array in weights.items():
        if name.startswith("mtp.") and array.ndim == 2:
            weights[name] = rng.standard_normal(array.shape).astype(np.float32)
    save_file(weights, str(broken / "model.safetensors"))

    engine = _load(broken)
    gen = engine.generate(Request(engine.tokenize(TEXTS[1]), 48, method="mtp", depth=3))
    flags = acceptance_flags("mtp", gen)
    assert flags["acceptance_collapsed"] is True, flags
    assert "norm convention" in flags["acceptance_reason"] and "MTP tensors" in flags["acceptance_reason"]

    good = _load(tiny_models.mlx_mtp_hybrid)
    gen = good.generate(Request(good.tokenize(TEXTS[1]), 48, method="mtp", depth=3))
    assert acceptance_flags("mtp", gen)["acceptance_collapsed"] is False


def test_verify_cost_rolls_back_on_the_hybrid(hybrid):
    seconds = hybrid.verify_cost(context_tokens=16, max_rows=4, repeats=2)
    assert len(seconds) == 4 and all(s > 0 for s in seconds)
    prompt = hybrid.tokenize(TEXTS[0])
    assert hybrid.generate(Request(prompt, 8)).tokens == hybrid.generate(Request(prompt, 8)).tokens


EOS = 511  # the tiny models' end-of-generation token
EOS_PROMPT = "as by as of model else and"  # the hybrid's greedy continuation has EOS at position 13


def test_mtp_never_emits_eos(hybrid, monkeypatch):
    """The target's sampling bans the tokenizer's EOS in every method, MTP's included."""
    prompt = hybrid.tokenize(EOS_PROMPT)
    baseline = hybrid.generate(Request(prompt, NEW_TOKENS)).tokens
    runs = [hybrid.generate(Request(prompt, NEW_TOKENS, method=m, depth=3)) for m in ("mtp", "draft", "ngram")]
    assert EOS not in baseline and all(gen.tokens == baseline for gen in runs)
    monkeypatch.setattr(hybrid, "_end_tokens", lambda: [])
    assert hybrid.generate(Request(prompt, NEW_TOKENS)).tokens.index(EOS) == 13  # the ban is what kept it out

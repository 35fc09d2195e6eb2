"""The tiny models: deterministic, idempotent, loadable by both libraries, the same weights
and tokenizer in both formats."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli import tiny, tinymodels
from cli.tiny import make_tiny

pytestmark = [pytest.mark.engine]

TEXT = "def lookup(context, n_min, n_max):\n    return context[-n:]  # M4 Pro: 42.0 tok/s\n\n"


def _files(directory):
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_two_builds_write_the_same_bytes(tmp_path):
    make_tiny(tmp_path / "a")
    make_tiny(tmp_path / "b")
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a.keys() == b.keys()
    assert [name for name in a if a[name] != b[name]] == []


def test_a_complete_directory_is_reused_and_a_damaged_one_rebuilt(tmp_path):
    models = make_tiny(tmp_path)
    weights = models.mlx_target / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert make_tiny(tmp_path) == models
    assert weights.stat().st_mtime_ns == stamp

    weights.write_bytes(weights.read_bytes()[:100])
    make_tiny(tmp_path)
    assert weights.stat().st_size > 100


def test_paths_and_vocabulary(tiny_models):
    for path in (tiny_models.mlx_target, tiny_models.mlx_draft):
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
            p.name for p in path.iterdir()
        }
    assert tiny_models.gguf_target.is_file() and tiny_models.gguf_draft.is_file()
    assert tiny_models.vocab_size == tinymodels.VOCAB_SIZE
    assert (tiny_models.bos_id, tiny_models.eos_id) == (tiny_models.vocab_size - 2, tiny_models.vocab_size - 1)
    config = json.loads((tiny_models.mlx_target / "config.json").read_text())
    assert config["vocab_size"] == tiny_models.vocab_size


def test_draft_is_the_targets_first_layers(tiny_models):
    from safetensors.numpy import load_file

    target = load_file(str(tiny_models.mlx_target / "model.safetensors"))
    draft = load_file(str(tiny_models.mlx_draft / "model.safetensors"))
    draft_layers = {name.split(".")[2] for name in draft if name.startswith("model.layers.")}
    assert draft_layers == {str(i) for i in range(tinymodels.DRAFT_LAYERS)}
    assert all(np.array_equal(draft[name], target[name]) for name in draft)
    assert len(target) > len(draft)


def test_both_libraries_tokenize_alike(tiny_models):
    import llama_cpp
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tiny_models.mlx_target / "tokenizer.json")).encode(TEXT).ids
    llm = llama_cpp.Llama(str(tiny_models.gguf_target), vocab_only=True, verbose=False)
    assert hf[0] == tiny_models.bos_id
    assert llm.tokenize(TEXT.encode(), add_bos=True) == hf
    assert llm.detokenize(hf[1:]).decode() == TEXT
    assert len(hf) < len(TEXT.encode()) * 0.8  # the merges do compress


def test_gguf_holds_the_same_weights(tiny_models):
    """The logits of every prompt position agree between mlx-lm on the safetensors and llama.cpp
    on the GGUF. Tolerance 0.02 (logits spread over about +-10): llama.cpp keeps its KV cache in
    float16, which moves logits by a few 1e-3. A wrong Q/K RoPE permutation, norm epsilon,
    RoPE base or tensor mapping moves them by whole units."""
    import llama_cpp
    import mlx.core as mx
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_models.mlx_target))
    ids = tokenizer.encode(TEXT)
    mlx_logits = np.array(model(mx.array([ids]))[0])
    llm = llama_cpp.Llama(str(tiny_models.gguf_target), logits_all=True, n_ctx=256, verbose=False)
    llm.eval(ids)
    gguf_logits = np.array(llm.scores[: len(ids)])
    assert mlx_logits.std() > 1.0
    assert np.abs(mlx_logits - gguf_logits).max() < 0.02


def test_main_prints_the_paths(tmp_path, capsys):
    assert tiny.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "gguf" / "target.gguf") in out and "mlx_draft" in out

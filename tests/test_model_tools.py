"""`specfleet models quantize` and `specfleet models gguf-to-mlx` (cli/quantize.py,
cli/gguf_to_mlx.py) on the tiny models: the converted MLX model computes what the tiny MLX model
computes and tokenizes as llama.cpp does; other architectures are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.processes import cli

pytestmark = [pytest.mark.engine, pytest.mark.process]


def test_gguf_to_mlx_matches_the_mlx_original_and_llama_cpp_tokens(tiny_models, tmp_path):
    import mlx.core as mx
    import mlx_lm

    from agent.engines.llamacpp import LlamaCppEngine
    from cli.gguf_to_mlx import convert

    out = convert(tiny_models.gguf_target, tmp_path / "mlx")
    converted, tokenizer = mlx_lm.load(str(out))
    original, original_tokenizer = mlx_lm.load(str(tiny_models.mlx_target))
    text = "def add(a, b):\n    return a + b  # 12345 tokens"
    engine = LlamaCppEngine()
    engine.load(str(tiny_models.gguf_target))
    try:
        ids = list(engine.tokenize(text))
    finally:
        engine.close()
    assert tokenizer.encode(text) == ids == original_tokenizer.encode(text)
    a = np.array(converted(mx.array([ids]))[0].astype(mx.float32))
    b = np.array(original(mx.array([ids]))[0].astype(mx.float32))
    assert a.shape == b.shape
    assert np.allclose(a, b, atol=1e-3, rtol=1e-3), float(np.abs(a - b).max())


def test_quantize_then_convert_keeps_q8_0_quantised(tiny_models, tmp_path):
    import gguf

    q8 = tmp_path / "target.Q8_0.gguf"
    cli("models", "quantize", str(tiny_models.gguf_target), str(q8), "Q8_0")
    types = {t.tensor_type.name for t in gguf.GGUFReader(str(q8)).tensors}
    assert "Q8_0" in types and types <= {"Q8_0", "F32", "F16"}
    cli("models", "gguf-to-mlx", str(q8), str(tmp_path / "mlx"))
    import json

    config = json.loads((tmp_path / "mlx" / "config.json").read_text())
    assert config["quantization"]["bits"] == 8 and config["rope_traditional"] is True
    bad = cli("models", "quantize", str(tiny_models.gguf_target), str(tmp_path / "x.gguf"), "Q9_9", check=False)
    assert bad.returncode != 0 and "unknown type 'Q9_9'" in bad.stderr


def test_other_architectures_are_refused_by_name(tiny_models, tmp_path):
    hybrid = tiny_models.gguf_target.parent / "mtp-hybrid.gguf"
    result = cli("models", "gguf-to-mlx", str(hybrid), str(tmp_path / "mlx"), check=False)
    assert result.returncode != 0
    assert "architecture 'qwen35'" in result.stderr and "supported: llama" in result.stderr
    assert not (tmp_path / "mlx").exists()

"""agent/model_identity.py on the project's real tiny models (tests/support/fixtures.py's tiny_models,
from SPECFLEET_TINY_DIR when set): both formats of one model agree, MTP is seen where the
weights hold it, quantised MLX copies count logical parameters, references carry no paths."""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct

import numpy as np
import pytest

from agent.model_identity import ModelUnreadable, identify
from agent.models import HashCache, Resolved, resolve
from specfleet.record import architecture_family

DIGEST = "ab" * 32
# (MLX directory, GGUF file) attribute pairs of TinyModels, and whether the model has an MTP head
PAIRS = {
    "target": ("mlx_target", "gguf_target", False),
    "draft": ("mlx_draft", "gguf_draft", False),
    "mtp-dense": ("mlx_mtp_dense", "gguf_mtp_dense", True),
    "mtp-hybrid": ("mlx_mtp_hybrid", "gguf_mtp_hybrid", True),
    "mtp-hybrid-draft": ("mlx_mtp_hybrid_draft", "gguf_mtp_hybrid_draft", False),
}


def ident(path, digest=DIGEST):
    return identify(resolve(str(path), []), digest)


def header(path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(length))
    h.pop("__metadata__", None)
    return h


@pytest.mark.parametrize("name", PAIRS)
def test_both_formats_of_one_model_agree(tiny_models, name):
    mlx_attr, gguf_attr, mtp = PAIRS[name]
    mlx, gg = ident(getattr(tiny_models, mlx_attr)), ident(getattr(tiny_models, gguf_attr))
    assert architecture_family(mlx.architecture) == architecture_family(gg.architecture)
    assert mlx.vocab_size == gg.vocab_size == tiny_models.vocab_size == 512
    assert mlx.context_length == gg.context_length == 4096
    assert mlx.parameters == gg.parameters > 0  # the same weights, the same count
    assert mlx.tensor_types == gg.tensor_types  # every tensor float32 in both: "F32:<n>"
    assert mlx.tensor_types.startswith("F32:") and "," not in mlx.tensor_types
    assert mlx.has_mtp is gg.has_mtp is mtp
    # the tiny models are float32 (config torch_dtype, GGUF general.file_type ALL_F32)
    assert (mlx.quantisation, gg.quantisation) == ("f32", "F32")
    assert (mlx.reference, gg.reference) == (name, f"{name}.gguf")
    assert mlx.source == gg.source == "local" and mlx.revision == gg.revision == ""
    assert mlx.digest == gg.digest == DIGEST
    assert gg.bytes == getattr(tiny_models, gguf_attr).stat().st_size


def test_architectures_are_what_the_files_name(tiny_models):
    assert ident(tiny_models.gguf_target).architecture == "llama"
    assert ident(tiny_models.mlx_target).architecture == "LlamaForCausalLM"
    assert ident(tiny_models.gguf_mtp_hybrid).architecture == "qwen35"
    assert ident(tiny_models.mlx_mtp_hybrid).architecture == "Qwen3_5ForCausalLM"
    assert architecture_family("Qwen3MoeForCausalLM") == architecture_family("qwen3moe") == "qwen3moe"


def test_parameter_count_is_the_sum_of_the_tensors(tiny_models):
    tensors = header(tiny_models.mlx_target / "model.safetensors")
    expected = sum(int(np.prod(t["shape"])) for t in tensors.values())
    assert ident(tiny_models.mlx_target).parameters == expected
    assert ident(tiny_models.mlx_target).tensor_types == f"F32:{len(tensors)}"


@pytest.mark.engine
def test_mlx_lm_quantised_copy_reports_4bit_g64_and_logical_parameters(tiny_models, tmp_path):
    convert = pytest.importorskip("mlx_lm").convert
    plain = ident(tiny_models.mlx_target)
    convert(str(tiny_models.mlx_target), mlx_path=str(tmp_path / "q4"), quantize=True, q_group_size=64, q_bits=4)
    q = ident(tmp_path / "q4")
    assert q.quantisation == "4bit-g64"
    assert q.parameters == plain.parameters  # packed uint32 hold 8 values each; scales/biases excluded
    assert "U32:" in q.tensor_types and q.bytes < plain.bytes / 3
    assert (q.architecture, q.vocab_size, q.context_length, q.has_mtp) == ("LlamaForCausalLM", 512, 4096, False)


@pytest.mark.engine
def test_mtp_follows_the_weights_not_the_config(tiny_models, tmp_path):
    """mlx_lm.convert drops the mtp.* tensors but keeps mtp_num_hidden_layers: 1 in config."""
    convert = pytest.importorskip("mlx_lm").convert
    convert(str(tiny_models.mlx_mtp_dense), mlx_path=str(tmp_path / "q4"), quantize=True, q_group_size=64, q_bits=4)
    assert json.loads((tmp_path / "q4" / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    q = ident(tmp_path / "q4")
    assert q.has_mtp is False and q.quantisation == "4bit-g64"
    full = header(tiny_models.mlx_mtp_dense / "model.safetensors")
    trunk = sum(int(np.prod(t["shape"])) for name, t in full.items() if not name.startswith("mtp."))
    assert q.parameters == trunk < ident(tiny_models.mlx_mtp_dense).parameters


def test_hand_packed_weights_with_a_per_module_override(tmp_path):
    """Packed tensors written without mlx: 4-bit by default, one module at 8 bits, a norm unquantised."""
    from safetensors.numpy import save_file

    d = tmp_path / "packed"
    d.mkdir()
    quant = {"group_size": 64, "bits": 4, "model.b": {"group_size": 64, "bits": 8}}
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "quantization": quant, "vocab_size": 8}))
    u32, f16 = np.uint32, np.float16
    tensors = {
        "model.a.weight": np.zeros((16, 128 * 4 // 32), u32),  # 16 x 128 at 4 bits
        "model.a.scales": np.zeros((16, 2), f16),
        "model.a.biases": np.zeros((16, 2), f16),
        "model.b.weight": np.zeros((16, 128 * 8 // 32), u32),  # 16 x 128 at 8 bits
        "model.b.scales": np.zeros((16, 2), f16),
        "model.b.biases": np.zeros((16, 2), f16),
        "model.norm.weight": np.zeros(128, f16),
    }
    save_file(tensors, str(d / "model.safetensors"))
    i = ident(d)
    assert i.parameters == 16 * 128 * 2 + 128
    assert (i.quantisation, i.tensor_types, i.architecture) == ("4bit-g64", "F16:5,U32:2", "llama")
    assert (i.context_length, i.vocab_size, i.has_mtp) == (0, 8, False)  # not stated: left at 0


def test_only_headers_are_read(tiny_models, tmp_path):
    """A safetensors file cut after its header still gives the full count: no tensor is loaded."""
    d = tmp_path / "cut"
    shutil.copytree(tiny_models.mlx_target, d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: 8 + struct.unpack("<Q", data[:8])[0]])
    assert ident(d).parameters == ident(tiny_models.mlx_target).parameters


def test_unreadable_header_leaves_counts_at_zero(tiny_models, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(tiny_models.mlx_target, d)
    (d / "model.safetensors").write_bytes(b"\xff" * 64)
    i = ident(d)
    assert (i.parameters, i.tensor_types, i.has_mtp) == (0, "", False)
    assert (i.architecture, i.vocab_size, i.quantisation) == ("LlamaForCausalLM", 512, "f32")


def test_hub_snapshot_reference_is_repo_id_and_revision_is_the_commit(tiny_models, tmp_path):
    snapshot = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc123"
    shutil.copytree(tiny_models.mlx_target, snapshot)
    files = tuple(sorted(p for p in snapshot.iterdir() if p.is_file()))
    model = Resolved("org/name", snapshot, "huggingface", files, sum(f.stat().st_size for f in files))
    hub = identify(model, DIGEST)
    assert (hub.reference, hub.revision, hub.source) == ("org/name", "abc123", "huggingface")
    local = ident(tiny_models.mlx_target)
    assert dataclasses.replace(hub, reference="target", revision="", source="local") == local


def test_references_are_bare_names(tiny_models):
    for path in tiny_models.paths().values():
        reference = ident(path).reference
        assert reference == path.name and "/" not in reference


def test_two_copies_at_different_paths_are_one_identity(tiny_models, tmp_path):
    cache = HashCache(tmp_path / "hashes.json")
    for source in (tiny_models.gguf_mtp_hybrid, tiny_models.mlx_mtp_hybrid):
        identities = []
        for where in ("a", "b/deeper"):
            copy = tmp_path / where / source.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, copy)
            model = resolve(str(copy), [])
            identities.append(identify(model, cache.digest(model)))
        assert identities[0] == identities[1] and identities[0].has_mtp


@pytest.mark.parametrize("content", [b"", b"GG", b"not a gguf at all" * 100, b"GGUF" + b"\xff" * 60])
def test_garbage_gguf_is_unreadable_and_named(tmp_path, content):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(content)
    with pytest.raises(ModelUnreadable, match=r"x\.gguf"):
        ident(bad)


def test_directory_without_config_is_unreadable(tiny_models, tmp_path):
    d = tmp_path / "noconfig"
    shutil.copytree(tiny_models.mlx_target, d)
    (d / "config.json").unlink()
    with pytest.raises(ModelUnreadable, match="noconfig.*config.json"):
        ident(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelUnreadable, match="noconfig/config.json"):
        ident(d)

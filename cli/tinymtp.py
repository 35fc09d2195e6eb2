"""Deterministic tiny Qwen3.5-style models with one MTP block, in both formats.

Two variants of the same recipe: `dense` (every trunk layer full attention) and `hybrid`
(GatedDeltaNet linear-attention layers 0 and 2, full attention 1 and 3: the real Qwen3.5/3.6
models have one full-attention layer in four), plus a layer-skip draft of the hybrid (its first
two layers, one of each kind: llama.cpp cannot run a qwen35 model without both) so that the
`draft` method has a hybrid target and a hybrid draft to roll back.

The hybrid's MLX directory holds the checkpoint the way Hugging Face ships Qwen3.5: `model.*`
and `mtp.*` tensors, RMSNorm weights stored zero-centred (the model multiplies by 1 + w),
conv1d kernels as (channels, 1, kernel). mlx-lm's `qwen3_5` loader recognises that form by its
conv1d kernels and shifts the norms; with no linear-attention layer there is no kernel to
recognise, so the dense variant is stored the way mlx-lm saves models (norms as plain
weights). mlx-lm drops the `mtp.*` tensors; our MLX engine loads them itself, with the same
convention as the trunk. The GGUF is what llama.cpp's converter writes (`qwen35`, the MTP
block as `blk.N.nextn.*`, norms as plain weights, A as -exp(A_log)).

The MTP head is built to be useful, not random: its `fc` passes the next token's embedding
through and mixes in a little of the trunk's hidden state, and its decoder layer writes into
the residual at a reduced scale. Since the trunk's prediction is dominated by the current
token's embedding, the head's guess for the token after next agrees with the target's often
but not always: MTP sees a realistic acceptance rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cli import tinymodels as tm

ROPE_THETA = 10_000_000.0
PARTIAL_ROTARY = 0.25
RMS_NORM_EPS = 1e-6
CONV_KERNEL = 4
FULL_ATTENTION_INTERVAL = 2  # hybrid: layers 1 and 3 are full attention, 0 and 2 GatedDeltaNet
SEED = 4321
# Scales that set acceptance (see the module docstring): the trunk's output projections, the
# MTP layer's output projections, and the share of the trunk's hidden state in the MTP input.
# With these, greedy MTP proposals are accepted about 40% of the time at depth 1 and 14% at
# depth 2 (cumulative), the layer-skip draft's 86% and 77% (MLX, four prompts, 48 tokens).
TRUNK_SCALE = 0.35
MTP_LAYER_SCALE = 0.1
MTP_HIDDEN_SCALE = 0.1
DRAFT_LAYERS = 2
DEEP_LAYER_SCALE = 0.3


@dataclass(frozen=True)
class Qwen35Shape:
    layers: int
    full_attention_interval: int  # 1: every layer full attention
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 256
    linear_heads: int = 2  # key heads = value heads, so no head regrouping between formats
    linear_head_dim: int = 32
    mtp_layers: int = 1

    def is_linear(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0

    @property
    def rope_dims(self) -> int:
        return int(self.head_dim * PARTIAL_ROTARY)

    @property
    def mrope_section(self) -> list[int]:
        """Qwen3.5's interleaved M-RoPE sections (t, h, w) summing to rope_dims / 2. For text
        every section has the same position, so it is plain RoPE on the first rope_dims."""
        half = self.rope_dims // 2
        return [half - 2 * (half // 3), half // 3, half // 3]


VARIANTS = {
    "dense": Qwen35Shape(layers=4, full_attention_interval=1),
    "hybrid": Qwen35Shape(layers=4, full_attention_interval=FULL_ATTENTION_INTERVAL),
}


def zero_centred(shape: Qwen35Shape) -> bool:
    """Whether the MLX checkpoint stores norms zero-centred (see the module docstring)."""
    return any(shape.is_linear(i) for i in range(shape.layers))


def random_weights(shape: Qwen35Shape, vocab_size: int, seed: int, mtp: bool = True) -> dict[str, np.ndarray]:
    """Hugging Face Qwen3.5 names and layouts, float32; norms zero-centred when
    `zero_centred(shape)`."""
    rng = np.random.default_rng(seed)
    shift = 0.0 if zero_centred(shape) else 1.0

    def linear(out_features: int, in_features: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((out_features, in_features)) * scale / np.sqrt(in_features)).astype(np.float32)

    def norm(size: int) -> np.ndarray:  # effective weight 1 + 0.1 N(0, 1)
        return (shift + 0.1 * rng.standard_normal(size)).astype(np.float32)

    h, hd = shape.hidden, shape.head_dim

    def attention(p: str, out_scale: float) -> dict[str, np.ndarray]:
        return {
            p + "self_attn.q_proj.weight": linear(shape.heads * hd * 2, h),  # per head: query, then gate
            p + "self_attn.k_proj.weight": linear(shape.kv_heads * hd, h),
            p + "self_attn.v_proj.weight": linear(shape.kv_heads * hd, h),
            p + "self_attn.o_proj.weight": linear(h, shape.heads * hd, out_scale),
            p + "self_attn.q_norm.weight": norm(hd),
            p + "self_attn.k_norm.weight": norm(hd),
        }

    def block(p: str, linear_attention: bool, out_scale: float) -> dict[str, np.ndarray]:
        weights = {p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h)}
        if linear_attention:
            key_dim = value_dim = shape.linear_heads * shape.linear_head_dim
            conv_dim = 2 * key_dim + value_dim
            a = "linear_attn."
            weights |= {
                p + a + "in_proj_qkv.weight": linear(conv_dim, h),
                p + a + "in_proj_z.weight": linear(value_dim, h),
                p + a + "in_proj_b.weight": linear(shape.linear_heads, h),
                p + a + "in_proj_a.weight": linear(shape.linear_heads, h),
                p + a + "conv1d.weight": linear(conv_dim, CONV_KERNEL)[:, None, :],
                p + a + "dt_bias": np.ones(shape.linear_heads, np.float32),
                p + a + "A_log": np.log(rng.uniform(1, 16, shape.linear_heads)).astype(np.float32),
                p + a + "norm.weight": (1.0 + 0.1 * rng.standard_normal(shape.linear_head_dim)).astype(np.float32),
                p + a + "out_proj.weight": linear(h, value_dim, out_scale),
            }
        else:
            weights |= attention(p, out_scale)
        weights |= {
            p + "mlp.gate_proj.weight": linear(shape.intermediate, h),
            p + "mlp.up_proj.weight": linear(shape.intermediate, h),
            p + "mlp.down_proj.weight": linear(h, shape.intermediate, out_scale),
        }
        return weights

    weights = {"model.embed_tokens.weight": rng.standard_normal((vocab_size, h)).astype(np.float32)}
    for i in range(shape.layers):
        weights |= block(f"model.layers.{i}.", shape.is_linear(i), TRUNK_SCALE)
    weights["model.norm.weight"] = norm(h)
    weights["lm_head.weight"] = linear(vocab_size, h, scale=3.0)
    if mtp:
        for i in range(shape.mtp_layers):
            weights |= block(f"mtp.layers.{i}.", False, MTP_LAYER_SCALE)
        # fc takes [embedding, hidden]: the embedding half passes the token through, the
        # hidden half adds a little of what the trunk knows.
        hidden_half = linear(h, h, MTP_HIDDEN_SCALE)
        weights["mtp.fc.weight"] = np.concatenate([np.eye(h, dtype=np.float32), hidden_half], axis=1)
        weights["mtp.pre_fc_norm_embedding.weight"] = norm(h)
        weights["mtp.pre_fc_norm_hidden.weight"] = norm(h)
        weights["mtp.norm.weight"] = norm(h)
    return weights


def layer_skip_draft(shape: Qwen35Shape, target: dict[str, np.ndarray]) -> tuple[dict, Qwen35Shape]:
    """The target's first DRAFT_LAYERS layers with its embedding, norm and head; no MTP."""
    draft_shape = Qwen35Shape(layers=DRAFT_LAYERS, full_attention_interval=shape.full_attention_interval, mtp_layers=0)
    draft = {
        name: array
        for name, array in target.items()
        if not name.startswith("mtp.")
        and (not name.startswith("model.layers.") or int(name.split(".")[2]) < DRAFT_LAYERS)
    }
    return draft, draft_shape


def deepen(shape: Qwen35Shape, weights: dict[str, np.ndarray]) -> None:
    """Scale down the layers a layer-skip draft leaves out, so that it agrees often."""
    for i in range(DRAFT_LAYERS, shape.layers):
        for name, array in weights.items():
            if name.startswith(f"model.layers.{i}.") and name.endswith(
                ("o_proj.weight", "out_proj.weight", "down_proj.weight")
            ):
                array *= np.float32(DEEP_LAYER_SCALE)


# --- MLX / Hugging Face layout -------------------------------------------------------------


def write_mlx(directory: Path, shape: Qwen35Shape, weights: dict[str, np.ndarray], vocab: tm.Vocab) -> Path:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tm._write_json(
        directory / "config.json",
        {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5",
            "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "linear_num_key_heads": shape.linear_heads,
            "linear_num_value_heads": shape.linear_heads,
            "linear_key_head_dim": shape.linear_head_dim,
            "linear_value_head_dim": shape.linear_head_dim,
            "linear_conv_kernel_dim": CONV_KERNEL,
            "full_attention_interval": shape.full_attention_interval,
            "layer_types": [
                "linear_attention" if shape.is_linear(i) else "full_attention" for i in range(shape.layers)
            ],
            "mtp_num_hidden_layers": shape.mtp_layers,
            "rms_norm_eps": RMS_NORM_EPS,
            "rope_parameters": {
                "type": "default",
                "rope_theta": ROPE_THETA,
                "partial_rotary_factor": PARTIAL_ROTARY,
                "mrope_section": shape.mrope_section,
                "mrope_interleaved": True,
            },
            "max_position_embeddings": tm.CONTEXT_LENGTH,
            "vocab_size": vocab.size,
            "tie_word_embeddings": False,
            "bos_token_id": vocab.bos_id,
            "eos_token_id": vocab.eos_id,
            "torch_dtype": "float32",
        },
    )
    save_file({name: weights[name] for name in sorted(weights)}, str(directory / "model.safetensors"))
    tm._write_tokenizer(directory, vocab)
    return directory


# --- GGUF (what convert_hf_to_gguf.py writes for Qwen3_5ForCausalLM) ------------------------

_BLOCK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_MTP_NAMES = {
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
}


# Names of the zero-centred RMSNorm weights: every norm but the linear attention's gated one,
# the MTP block's input norms included (the converter renames those to enorm/hnorm, then shifts).
_ZERO_CENTRED = ("norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")


def gguf_tensors(shape: Qwen35Shape, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF names and values: zero-centred norms shifted by one (the gated norm of the linear
    attention never is zero-centred), A stored as -exp(A_log), conv1d kernels squeezed."""
    shift = np.float32(1 if zero_centred(shape) else 0)

    def convert(hf_name: str, tensor: np.ndarray) -> np.ndarray:
        if hf_name.endswith("A_log"):
            return -np.exp(tensor)
        if hf_name.endswith("conv1d.weight"):
            return tensor[:, 0, :]
        if hf_name.endswith(_ZERO_CENTRED) and not hf_name.endswith("linear_attn.norm.weight"):
            return tensor + shift
        return tensor

    out = {"token_embd.weight": weights["model.embed_tokens.weight"]}
    for name, tensor in weights.items():
        parts = name.split(".")
        if name.startswith("model.layers."):
            out[f"blk.{parts[2]}.{_BLOCK_NAMES['.'.join(parts[3:])]}"] = convert(name, tensor)
        elif name.startswith("mtp.layers."):
            index = shape.layers + int(parts[2])
            out[f"blk.{index}.{_BLOCK_NAMES['.'.join(parts[3:])]}"] = convert(name, tensor)
        elif name in _MTP_NAMES:
            out[f"blk.{shape.layers}.{_MTP_NAMES[name]}"] = convert(name, tensor)
    out["output_norm.weight"] = convert("model.norm.weight", weights["model.norm.weight"])
    out["output.weight"] = weights["lm_head.weight"]
    return {name: np.ascontiguousarray(tensor, dtype=np.float32) for name, tensor in out.items()}


def write_gguf(path: Path, shape: Qwen35Shape, weights: dict[str, np.ndarray], vocab: tm.Vocab) -> Path:
    has_mtp = any(name.startswith("mtp.") for name in weights)
    blocks = shape.layers + (shape.mtp_layers if has_mtp else 0)
    writer = tm.open_gguf(path, "qwen35")
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.rope_dims)
    writer.add_rope_dimension_sections([*shape.mrope_section, 0])
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    writer.add_ssm_conv_kernel(CONV_KERNEL)
    writer.add_ssm_state_size(shape.linear_head_dim)
    writer.add_ssm_group_count(shape.linear_heads)
    writer.add_ssm_time_step_rank(shape.linear_heads)
    writer.add_ssm_inner_size(shape.linear_head_dim * shape.linear_heads)
    writer.add_full_attention_interval(shape.full_attention_interval)
    if has_mtp:
        writer.add_nextn_predict_layers(shape.mtp_layers)
    writer.add_vocab_size(vocab.size)
    tm.add_gguf_tokenizer(writer, vocab)
    for name, tensor in gguf_tensors(shape, weights).items():
        writer.add_tensor(name, tensor)
    return tm.close_gguf(writer, path)


def write_all(directory: Path, vocab: tm.Vocab) -> None:
    """mtp-dense, mtp-hybrid and mtp-hybrid-draft under `directory`."""
    for variant, shape in VARIANTS.items():
        weights = random_weights(shape, vocab.size, SEED)
        if variant == "hybrid":
            deepen(shape, weights)
            draft, draft_shape = layer_skip_draft(shape, weights)
            tm.write_model(directory, "mtp-hybrid-draft", draft_shape, draft, vocab, (write_mlx, write_gguf))
        tm.write_model(directory, f"mtp-{variant}", shape, weights, vocab, (write_mlx, write_gguf))

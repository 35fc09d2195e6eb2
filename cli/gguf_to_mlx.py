"""`specfleet models gguf-to-mlx SRC DST`: a llama-family GGUF as an MLX model directory.

`mx.load` reads a GGUF's tensors, Q4_0, Q4_1 and Q8_0 staying quantised (MLX's affine
quantisation, groups of 32, as scales and biases) and F16/F32 as they are; this module names
them as mlx-lm's llama model does, writes config.json (a per-layer `quantization` entry for every
quantised layer, since a GGUF mixes bit widths: SmolLM2's Q4_1 file has a Q8_0 embedding) and
builds the tokenizer with the `tokenizers` package from the GGUF's own vocabulary: byte-level BPE
(`tokenizer.ggml.model` gpt2) with the pre-tokenizer llama.cpp uses for its `tokenizer.ggml.pre`,
the control tokens as special tokens, BOS added only where the GGUF says so, and the GGUF's chat
template in tokenizer_config.json.

llama.cpp's converter stores the query and key projections with rotary pairs adjacent (it
permutes Hugging Face's halves layout); the MLX model uses traditional (adjacent-pair) RoPE
instead of permuting the quantised rows back: the same function, and no requantisation.

Anything else is refused by name: another architecture, another tensor type (K-quants and the
rest are not quantised the MLX way), a SentencePiece vocabulary, a pre-tokenizer not listed here.
Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ARCHITECTURES = ("llama",)
TENSOR_TYPES = {"F32": None, "F16": None, "BF16": None, "Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
GROUP_SIZE = 32  # GGUF's Q4_0/Q4_1/Q8_0 block size: mx.load's quantisation groups

# tokenizer.ggml.pre -> the pre-tokenizer llama.cpp applies (src/llama-vocab.cpp), as `tokenizers` spells it.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = ("default", "gpt-2", "smollm", "llama-bpe", "llama3")

# GGUF tensor names -> mlx-lm llama module paths.
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOKEN_TYPE_CONTROL = 3


class Unsupported(ValueError):
    """The GGUF is not one this converter makes an MLX model of (the message names why)."""


def _fields(reader) -> dict:
    out = {}
    for key, field in reader.fields.items():
        try:
            out[key] = field.contents()
        except Exception:  # a field gguf cannot decode is one we do not need
            continue
    return out


def _module_path(name: str) -> str:
    """The mlx-lm module path of a GGUF tensor name without its suffix ("blk.3.attn_q")."""
    if name == "token_embd":
        return "model.embed_tokens"
    if name == "output_norm":
        return "model.norm"
    if name == "output":
        return "lm_head"
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    raise Unsupported(f"tensor {name!r} is not one of a llama model")


def inspect(src: Path) -> tuple[dict, dict[str, str]]:
    """The GGUF's metadata and each tensor's type name; Unsupported where the converter refuses it."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    meta = _fields(reader)
    arch = meta.get("general.architecture", "")
    if arch not in ARCHITECTURES:
        raise Unsupported(
            f"{src.name}: architecture {arch!r} is not supported by gguf-to-mlx (supported: {', '.join(ARCHITECTURES)})"
        )
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    bad = sorted({ty for ty in types.values() if ty not in TENSOR_TYPES})
    if bad:
        raise Unsupported(
            f"{src.name}: tensor type {', '.join(bad)} is not one MLX loads (supported: {', '.join(TENSOR_TYPES)}); "
            "requantise it first: specfleet models quantize SRC DST Q8_0"
        )
    model = meta.get("tokenizer.ggml.model", "")
    if model != "gpt2":
        raise Unsupported(f"{src.name}: tokenizer model {model!r} is not supported (supported: gpt2 byte-level BPE)")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        supported = ", ".join(PRE_TOKENIZERS)
        raise Unsupported(f"{src.name}: pre-tokenizer {pre!r} is not supported (supported: {supported})")
    return meta, types


def build_tokenizer(meta: dict):
    """A `tokenizers.Tokenizer` equal to llama.cpp's for this GGUF's vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    kinds = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("llama-bpe", "llama3"):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, kinds) if k == TOKEN_TYPE_CONTROL]
    )
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], int(bos))]
        )
    return tok


def _config(meta: dict, arch: str, quantization: dict, tied: bool) -> dict:
    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_traditional": True,  # the GGUF's adjacent-pair layout (module docstring)
        "max_position_embeddings": int(get("context_length", 2048)),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": tied,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if quantization:
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": max(q["bits"] for q in quantization.values())}
        config["quantization"].update(quantization)
    return config


def convert(src: Path, dst: Path) -> Path:
    """Write the MLX model directory `dst` from the GGUF `src`; returns `dst`."""
    import mlx.core as mx

    src, dst = Path(src), Path(dst)
    meta, types = inspect(src)
    arch = meta["general.architecture"]
    tensors = mx.load(str(src))
    weights, quantization = {}, {}
    for name, array in tensors.items():
        base, _, suffix = name.rpartition(".")
        path = _module_path(base)
        weights[f"{path}.{suffix}"] = array
        bits = TENSOR_TYPES[types[f"{base}.weight"]]
        if bits is not None:
            quantization[path] = {"group_size": GROUP_SIZE, "bits": bits}
    tied = "lm_head.weight" not in weights
    tokenizer = build_tokenizer(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    special = {}
    for field, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id")):
        index = meta.get(f"tokenizer.ggml.{key}")
        if index is not None and 0 <= int(index) < len(tokens):
            special[field] = tokens[int(index)]
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{arch}.context_length", 2048)),
        **special,
    }
    if meta.get("tokenizer.chat_template"):
        tokenizer_config["chat_template"] = meta["tokenizer.chat_template"]

    partial = dst.with_name(dst.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    mx.save_safetensors(str(partial / "model.safetensors"), weights, metadata={"format": "mlx"})
    (partial / "config.json").write_text(json.dumps(_config(meta, arch, quantization, tied), indent=2) + "\n")
    tokenizer.save(str(partial / "tokenizer.json"))
    (partial / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (partial / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    partial.rename(dst)
    return dst

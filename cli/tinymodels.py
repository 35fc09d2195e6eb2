"""Deterministic tiny Llama models for tests and the demo, built offline.

The building blocks of cli/tiny.py's `make_tiny(directory)`, which writes a target and a
draft, each twice: as an MLX model directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) that `mlx_lm.load` accepts, and as a GGUF of the same float32
weights that llama.cpp loads. All four share one byte-level BPE vocabulary learned from a
built-in corpus, so token ids mean the same thing in every file.

The draft is the target's first `DRAFT_LAYERS` layers with the target's embedding, final
norm and output head: a layer-skip draft. The target's deeper layers write into the residual
stream at a reduced scale (`DEEP_LAYER_SCALE`), so the draft agrees with the target often but
not always, and speculative decoding sees a realistic acceptance rate instead of 0 (two
unrelated random models) or 1 (identical models). The draft costs about half the target's
layer compute.

Everything is seeded, so a build writes the same bytes every time; a manifest (cli/tiny.py)
records the builder (a digest of the builders' files) and file hashes so that a second call on a complete directory
returns at once, and models written by an older builder are rebuilt.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB_SIZE = 512  # 256 byte tokens + learned merges + BOS + EOS
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"  # a name llama.cpp recognises as end-of-generation

ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-5
CONTEXT_LENGTH = 4096

DRAFT_LAYERS = 2
# Scale of the deep layers' output projections. At 0.2 the layer-skip draft's first proposal
# matches the target's greedy token about 70% of the time (0.1: 90%, 0.35: 55%; measured over
# four prompts and 48 tokens), about what a good real draft model achieves.
DEEP_LAYER_SCALE = 0.2
TARGET_SEED = 1234


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


TARGET_SHAPE = LlamaShape(layers=4, hidden=128, heads=4, kv_heads=2, intermediate=256)


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]  # byte-level strings, index = token id
    merges: tuple[tuple[str, str], ...]
    bos_id: int
    eos_id: int

    @property
    def size(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class TinyModels:
    mlx_target: Path
    mlx_draft: Path
    gguf_target: Path
    gguf_draft: Path
    # Qwen3.5-style targets with one MTP block (cli/tinymtp.py), and a hybrid draft
    mlx_mtp_dense: Path
    mlx_mtp_hybrid: Path
    mlx_mtp_hybrid_draft: Path
    gguf_mtp_dense: Path
    gguf_mtp_hybrid: Path
    gguf_mtp_hybrid_draft: Path
    vocab_size: int
    bos_id: int
    eos_id: int

    def paths(self) -> dict[str, Path]:
        return {name: value for name, value in vars(self).items() if isinstance(value, Path)}


# A few kilobytes of prose and code: enough pairs to learn the merges, and the kind of text
# the demo prompts contain.
CORPUS = """\
Speculative decoding lets a small draft model propose several tokens that the large target
model then checks in a single forward pass. When the draft agrees with the target, the target
accepts the proposed tokens and the generation moves forward by more than one token per step.
When the draft is wrong, the target keeps the tokens up to the first mismatch, emits its own
token there, and the draft starts again from the corrected position. Under greedy sampling
the output is exactly the output of the target alone; only the time it takes changes.
The draft depth is the number of tokens the draft proposes in each round. A deeper draft can
win more tokens per round, but each extra token costs a draft step and a wider verify pass,
and the chance that every token is accepted falls with the depth. On Apple silicon the verify
pass is bound by memory bandwidth, so checking two or three tokens costs little more than one.
Prompt lookup, or n-gram drafting, needs no draft model at all: it searches the context for
the last few tokens and proposes what followed them before. It works well for code, for
summaries that quote their source, and for any text that repeats itself.
Multi-token prediction heads are extra layers trained to predict the tokens after the next
one. They share the target's trunk, so the draft costs a fraction of a layer.
The fleet measures tokens per second, time to first token, acceptance by draft position,
draft time and verify time apart, peak memory and the energy of every run, on every chip.

def accept(draft_tokens, target_tokens):
    accepted = 0
    for draft, target in zip(draft_tokens, target_tokens):
        if draft != target:
            break
        accepted += 1
    return accepted

def lookup(context, n_min, n_max, depth):
    for n in range(n_max, n_min - 1, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + depth]
    return []

for chip in ["M1", "M1 Pro", "M1 Max", "M2", "M2 Ultra", "M3", "M3 Max", "M4", "M4 Pro", "M5"]:
    print(f"{chip}: {tokens_per_second:.1f} tok/s, speedup {speedup:.2f}x at depth {depth}")
"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def build_vocab(size: int = VOCAB_SIZE) -> Vocab:
    """Learn byte-level BPE merges from CORPUS until the vocabulary has `size` tokens.

    Ties between equally frequent pairs go to the smallest pair, so the result never depends
    on dictionary order."""
    from tokenizers.pre_tokenizers import ByteLevel

    byte_chars = _bytes_to_unicode()
    tokens = [byte_chars[b] for b in range(256)]
    known = set(tokens)
    pieces = ByteLevel(add_prefix_space=False, use_regex=True).pre_tokenize_str(CORPUS)
    words = Counter(piece for piece, _ in pieces)
    split = {word: list(word) for word in words}
    merges: list[tuple[str, str]] = []
    while len(tokens) < size - 2:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            parts = split[word]
            for pair in zip(parts, parts[1:]):
                pairs[pair] += count
        if not pairs:
            raise ValueError(f"corpus too small for a vocabulary of {size} tokens")
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        merged = best[0] + best[1]
        # Two different pairs can spell the same string; the merge is still needed, the token
        # is not added twice.
        if merged not in known:
            known.add(merged)
            tokens.append(merged)
        for word, parts in split.items():
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            split[word] = out
    tokens += [BOS_TOKEN, EOS_TOKEN]
    return Vocab(tuple(tokens), tuple(merges), bos_id=len(tokens) - 2, eos_id=len(tokens) - 1)


def random_weights(shape: LlamaShape, vocab_size: int, seed: int) -> dict[str, np.ndarray]:
    """Hugging Face Llama tensor names and layouts, float32, scaled so that activations stay
    near unit size and the output logits spread over a few units (clear greedy choices that
    both engines agree on, but not a one-hot distribution for sampling)."""
    rng = np.random.default_rng(seed)

    def linear(out_features: int, in_features: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((out_features, in_features)) * scale / np.sqrt(in_features)).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    h, hd = shape.hidden, shape.head_dim
    weights = {"model.embed_tokens.weight": rng.standard_normal((vocab_size, h)).astype(np.float32)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = norm(h)
        weights[p + "self_attn.q_proj.weight"] = linear(shape.heads * hd, h)
        weights[p + "self_attn.k_proj.weight"] = linear(shape.kv_heads * hd, h)
        weights[p + "self_attn.v_proj.weight"] = linear(shape.kv_heads * hd, h)
        weights[p + "self_attn.o_proj.weight"] = linear(h, shape.heads * hd)
        weights[p + "post_attention_layernorm.weight"] = norm(h)
        weights[p + "mlp.gate_proj.weight"] = linear(shape.intermediate, h)
        weights[p + "mlp.up_proj.weight"] = linear(shape.intermediate, h)
        weights[p + "mlp.down_proj.weight"] = linear(h, shape.intermediate)
    weights["model.norm.weight"] = norm(h)
    weights["lm_head.weight"] = linear(vocab_size, h, scale=3.0)
    return weights


def layer_skip_pair(shape: LlamaShape, vocab_size: int, seed: int) -> tuple[dict, dict, LlamaShape]:
    """Target weights, and draft weights made of the target's first DRAFT_LAYERS layers."""
    target = random_weights(shape, vocab_size, seed)
    for i in range(DRAFT_LAYERS, shape.layers):
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            target[f"model.layers.{i}.{name}"] *= np.float32(DEEP_LAYER_SCALE)
    draft_shape = LlamaShape(DRAFT_LAYERS, shape.hidden, shape.heads, shape.kv_heads, shape.intermediate)
    draft = {
        name: array
        for name, array in target.items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < DRAFT_LAYERS
    }
    return target, draft, draft_shape


# --- MLX / Hugging Face layout -------------------------------------------------------------


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _tokenizer_json(vocab: Vocab) -> dict:
    special = {vocab.bos_id, vocab.eos_id}
    bos = vocab.tokens[vocab.bos_id]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": vocab.tokens[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i in sorted(special)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        # Llama-style: every encoded text starts with BOS (llama.cpp: tokenizer.ggml.add_bos_token).
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [vocab.bos_id], "tokens": [bos]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(vocab.tokens)},
            "merges": [[a, b] for a, b in vocab.merges],
        },
    }


def _write_tokenizer(directory: Path, vocab: Vocab) -> None:
    _write_json(directory / "tokenizer.json", _tokenizer_json(vocab))
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": CONTEXT_LENGTH,
        },
    )


def write_mlx(directory: Path, shape: LlamaShape, weights: dict[str, np.ndarray], vocab: Vocab) -> Path:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    _write_json(
        directory / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "rms_norm_eps": RMS_NORM_EPS,
            "rope_theta": ROPE_THETA,
            "max_position_embeddings": CONTEXT_LENGTH,
            "vocab_size": vocab.size,
            "tie_word_embeddings": False,
            "bos_token_id": vocab.bos_id,
            "eos_token_id": vocab.eos_id,
            "torch_dtype": "float32",
        },
    )
    save_file(
        {name: weights[name] for name in sorted(weights)},
        str(directory / "model.safetensors"),
        metadata={"format": "mlx"},
    )
    _write_tokenizer(directory, vocab)
    return directory


# --- GGUF ----------------------------------------------------------------------------------

_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _rope_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face Llama rotates the two halves of each head (MLX's non-traditional RoPE);
    llama.cpp's llama architecture rotates adjacent pairs. Reorder the Q/K output rows so the
    same rotation is applied, exactly as convert_hf_to_gguf.py does."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def add_gguf_tokenizer(writer, vocab: Vocab) -> None:
    """The shared byte-level BPE vocabulary as llama.cpp's gpt2 tokenizer."""
    import gguf

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the same split regex as the ByteLevel pre-tokenizer
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if i in (vocab.bos_id, vocab.eos_id) else gguf.TokenType.NORMAL
            for i in range(vocab.size)
        ]
    )
    writer.add_token_merges([f"{a} {b}" for a, b in vocab.merges])
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def open_gguf(path: Path, arch: str):
    """A GGUF writer for a float32 model of `arch` at `path`, its first keys written."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name(path.stem)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT_LENGTH)
    return writer


def close_gguf(writer, path: Path) -> Path:
    """Write the header, keys and tensors added to `writer` into its file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gguf(path: Path, shape: LlamaShape, weights: dict[str, np.ndarray], vocab: Vocab) -> Path:
    writer = open_gguf(path, "llama")
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    writer.add_vocab_size(vocab.size)

    add_gguf_tokenizer(writer, vocab)

    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(shape.layers):
        for hf_name, gguf_name in _GGUF_NAMES.items():
            tensor = weights[f"model.layers.{i}.{hf_name}"]
            if hf_name == "self_attn.q_proj.weight":
                tensor = _rope_permute(tensor, shape.heads)
            elif hf_name == "self_attn.k_proj.weight":
                tensor = _rope_permute(tensor, shape.kv_heads)
            writer.add_tensor(f"blk.{i}.{gguf_name}", np.ascontiguousarray(tensor))
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights["lm_head.weight"])
    return close_gguf(writer, path)


def write_model(
    directory: Path, name: str, shape, weights: dict[str, np.ndarray], vocab: Vocab, writers=(write_mlx, write_gguf)
) -> tuple[Path, Path]:
    """Write one model in both formats, with `writers` (MLX, GGUF) for its architecture:
    `directory/mlx/<name>/` and `directory/gguf/<name>.gguf`."""
    mlx_writer, gguf_writer = writers
    return (
        mlx_writer(directory / "mlx" / name, shape, weights, vocab),
        gguf_writer(directory / "gguf" / f"{name}.gguf", shape, weights, vocab),
    )

"""What a model's weights say about themselves: a `ModelIdentity` read from the files.

`identify(model, digest)` reads a GGUF file's metadata and tensor infos (gguf.GGUFReader
memory-maps the file and touches no tensor data), or an MLX / Hugging Face directory's
config.json and safetensors headers. No tensor is loaded, so a 40 GB model takes milliseconds.
A field the files do not state stays at its default (0 or ""): nothing is guessed. A file that
is not a GGUF, or a directory without a readable config.json, raises `ModelUnreadable`.

has_mtp follows the tensors, not the config: mlx_lm.convert keeps `mtp_num_hidden_layers: 1`
in a Qwen3.5 config while it drops the `mtp.*` weights, and such a model has no MTP head.
"""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from pathlib import Path

from agent.models import Resolved
from specfleet.record import ModelIdentity

MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header is JSON; real ones are a few MB at most
_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
# Tensor names of an MTP / next-token-prediction block: Qwen3.5's `mtp.*`, llama.cpp's
# `blk.N.nextn.*`, DeepSeek-V3's `model.layers.61.eh_proj` / `.enorm` / `.hnorm`.
_MTP_RE = re.compile(r"(^|\.)(mtp|nextn)\.|\.(eh_proj|enorm|hnorm)\.")


class ModelUnreadable(ValueError):
    """The model's files are not what they claim to be; the message names the file and why."""


def identify(model: Resolved, digest: str) -> ModelIdentity:
    """The identity of `model`, with `digest` (HashCache.digest).

    reference: the Hugging Face repo id with the snapshot's commit as revision, or the local
    file's or directory's bare name (never a path, which differs between machines)."""
    if model.source == "huggingface":
        reference = model.reference
        revision = model.path.name if model.path.parent.name == "snapshots" else ""
    else:
        reference, revision = model.path.name, ""
    fields = _read_gguf(model.path) if model.path.is_file() else _read_directory(model.path)
    return ModelIdentity(
        reference=reference,
        revision=revision,
        digest=digest,
        bytes=model.size_bytes,
        source=model.source,
        **fields,
    )


def _type_counts(types: list[str]) -> str:
    return ",".join(f"{name}:{count}" for name, count in sorted(Counter(types).items()))


# ---------------------------------------------------------------- GGUF


def _read_gguf(path: Path) -> dict:
    """Architecture, sizes, file type and tensor census of a GGUF file."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as e:  # the reader fails on garbage with any of several error types
        raise ModelUnreadable(f"{path.name} is not a valid GGUF file: {type(e).__name__}: {e}") from None

    def value(key: str):
        field = reader.fields.get(key)
        return field.contents() if field is not None and field.types else None

    arch = value("general.architecture") or ""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = value(f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else 0)
    types = [gguf.GGMLQuantizationType(t.tensor_type).name for t in reader.tensors]
    quantisation = ""
    file_type = value("general.file_type")
    if isinstance(file_type, int):
        try:  # GUESSED (1024) marks a type llama.cpp inferred; the type is the rest
            name = gguf.LlamaFileType(file_type & ~gguf.LlamaFileType.GUESSED).name
            quantisation = name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass  # a type newer than this gguf package: fall back to the tensors
    if not quantisation:
        matrices = [types[i] for i, t in enumerate(reader.tensors) if len(t.shape) >= 2]
        quantisation = Counter(matrices).most_common(1)[0][0] if matrices else ""
    split = value("split.count") or 1
    return {
        "architecture": arch,
        "vocab_size": int(vocab),
        "context_length": int(value(f"{arch}.context_length") or 0),
        "quantisation": quantisation,
        # A split GGUF's other parts hold more tensors: a count of this part alone would be wrong.
        "parameters": sum(int(t.n_elements) for t in reader.tensors) if split == 1 else 0,
        "tensor_types": _type_counts(types) if split == 1 else "",
        "has_mtp": any(_MTP_RE.search(t.name) for t in reader.tensors),
    }


# ---------------------------------------------------------------- MLX / Hugging Face


def _safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", ...} from a safetensors header. Read by hand (8-byte
    little-endian length, then that much JSON) rather than with safetensors.safe_open, so that
    nothing but the header is read and no framework is imported."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"header of {length} bytes")
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    if not all(isinstance(t, dict) and {"dtype", "shape"} <= t.keys() for t in header.values()):
        raise ValueError("header entry without dtype and shape")
    return header


def _quantisation_label(q: dict) -> str:
    """{"bits": 4, "group_size": 64} -> "4bit-g64"; a non-affine mode is appended."""
    if "bits" not in q:
        return str(q.get("quant_method", ""))
    label = f"{q['bits']}bit" + (f"-g{q['group_size']}" if q.get("group_size") else "")
    mode = q.get("mode", "affine")
    return label if mode == "affine" else f"{label}-{mode}"


def _read_directory(path: Path) -> dict:
    """config.json for what the model is, safetensors headers for what its tensors are."""
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelUnreadable(f"{path.name} is a directory without config.json") from None
    except (OSError, ValueError) as e:
        raise ModelUnreadable(f"{path.name}/config.json is not readable JSON: {e}") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}

    def setting(key: str):
        return config.get(key, text.get(key))

    quant = config.get("quantization") or config.get("quantization_config") or {}
    quant = quant if isinstance(quant, dict) else {}
    tensors: dict[str, dict] | None = {}
    for file in sorted(path.glob("*.safetensors")):
        try:
            tensors |= _safetensors_header(file)
        except (OSError, ValueError, struct.error):
            tensors = None  # one unreadable shard: no count at all rather than a partial one
            break

    parameters, types, matrices = 0, [], []
    for name, info in (tensors or {}).items():
        count = 1
        for dim in info["shape"]:
            count *= dim
        module = name.rsplit(".", 1)[0]
        packed = {module + ".weight", module + ".qweight"} & tensors.keys()  # MLX; GPTQ / AWQ
        if quant and packed and name.endswith((".scales", ".biases", ".qzeros", ".g_idx")):
            types.append(info["dtype"])
            continue  # quantisation constants, not parameters
        if quant and info["dtype"] in ("U32", "I32") and module + ".scales" in tensors:
            override = quant.get(module)  # mixed quantisation: per-module bits
            count = count * 32 // (override if isinstance(override, dict) else quant).get("bits", 32)
        parameters += count
        types.append(info["dtype"])
        if len(info["shape"]) >= 2:
            matrices.append(info["dtype"])

    dtype = setting("torch_dtype") or setting("dtype")
    if quant:
        quantisation = _quantisation_label(quant)
    elif dtype in _DTYPES:
        quantisation = _DTYPES[dtype]
    else:
        quantisation = Counter(matrices).most_common(1)[0][0].lower() if matrices else ""
    architectures = config.get("architectures") or [config.get("model_type", "")]
    return {
        "architecture": str(architectures[0] or ""),
        "vocab_size": int(setting("vocab_size") or 0),
        "context_length": int(setting("max_position_embeddings") or 0),
        "quantisation": quantisation,
        "parameters": parameters if tensors else 0,
        "tensor_types": _type_counts(types) if tensors else "",
        "has_mtp": any(_MTP_RE.search(name) for name in tensors or {}),
    }

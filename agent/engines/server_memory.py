"""Whether a cell's llama-server arms fit in memory all at once: the choice between keeping every
arm's server up and rotating through them run by run ("rotated"), or running the arms one after
another with one server up at a time ("blocks").

One server's estimate, in bytes: its model files (the target, and the draft model when the arm
loads one with -md), a KV cache for its context (-c/--ctx-size, else the model's own context
length) at f16 for every layer of the target (and of the draft), one more target layer's worth for
draft-mtp's MTP context, and SERVER_OVERHEAD_BYTES for compute buffers. It is deliberately
high: hybrid models keep KV for their attention layers only, and a quantised cache (-ctk/-ctv)
is smaller. The arms fit when their sum is at most USABLE_MEMORY_FRACTION of the machine's memory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import gguf

SERVER_OVERHEAD_BYTES = 1 << 30  # compute buffers, the HTTP server, the process itself
# Metal lets one process wire about two thirds to three quarters of unified memory
# (recommendedMaxWorkingSetSize); the lower figure leaves room for the OS.
USABLE_MEMORY_FRACTION = 2 / 3
KV_BYTES_PER_ELEMENT = 2  # llama-server's default cache type, f16
CONTEXT_FLAGS = ("-c", "--ctx-size")


@dataclass(frozen=True)
class ModelShape:
    """What a GGUF says about the size of its KV cache."""

    layers: int
    kv_elements_per_token_per_layer: int  # n_head_kv * (key_length + value_length)
    context_length: int


def read_shape(path: str) -> ModelShape:
    """The KV-cache shape of a GGUF file, read from its metadata (not its weights)."""
    fields = gguf.GGUFReader(path).fields

    def value(key: str, default=0):
        field = fields.get(key)
        if field is None:
            return default
        content = field.contents()
        return max(content) if isinstance(content, list) else content  # per-layer arrays: the largest

    arch = value("general.architecture", "")
    heads = value(f"{arch}.attention.head_count", 1) or 1
    heads_kv = value(f"{arch}.attention.head_count_kv", heads) or heads
    head_dim = value(f"{arch}.embedding_length") // heads
    key_length = value(f"{arch}.attention.key_length", head_dim) or head_dim
    value_length = value(f"{arch}.attention.value_length", head_dim) or head_dim
    return ModelShape(
        layers=value(f"{arch}.block_count"),
        kv_elements_per_token_per_layer=heads_kv * (key_length + value_length),
        context_length=value(f"{arch}.context_length"),
    )


def context_of(flags: Sequence[str]) -> int:
    """The -c/--ctx-size given in server flags (the last one wins, as in llama.cpp's parser); 0 if
    none (llama-server then takes the model's own context length)."""
    context = 0
    for i, flag in enumerate(flags):
        if flag in CONTEXT_FLAGS and i + 1 < len(flags):
            context = int(flags[i + 1])
        elif flag.startswith("--ctx-size="):
            context = int(flag.split("=", 1)[1])
    return context


def kv_bytes(shape: ModelShape, context: int, layers: int | None = None) -> int:
    tokens = context or shape.context_length
    return (
        tokens
        * (shape.layers if layers is None else layers)
        * shape.kv_elements_per_token_per_layer
        * (KV_BYTES_PER_ELEMENT)
    )


def server_bytes(target: str, draft: str | None, method: str, flags: Sequence[str]) -> int:
    """The estimated memory of one llama-server: `draft` is the -md model this arm loads (None if
    it loads none), `flags` every flag it is started with."""
    context = context_of(flags)
    target_shape = read_shape(target)
    total = os.path.getsize(target) + kv_bytes(target_shape, context) + SERVER_OVERHEAD_BYTES
    if draft:
        total += os.path.getsize(draft) + kv_bytes(read_shape(draft), context)
    if "draft-mtp" in method.split(","):
        total += kv_bytes(target_shape, context, layers=1)
    return total


def fits(server_estimates: Sequence[int], memory_bytes: int | None) -> bool:
    """Whether servers of these estimates can all be up at once; never when the memory is unknown."""
    return bool(memory_bytes) and sum(server_estimates) <= memory_bytes * USABLE_MEMORY_FRACTION

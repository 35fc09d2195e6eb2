"""Multi-token prediction for the llama.cpp engine, driven as llama.cpp's own draft-mtp
(common/speculative.cpp) drives it, plus what a GGUF's metadata says about serving it.

An MTP head (Qwen3.5's `blk.N.nextn.*` block after the N trunk layers) reads a token and the
trunk's final-normed hidden state h at the position before it, and predicts the token after.
llama.cpp runs it in a second context on the target's model (LLAMA_CONTEXT_TYPE_MTP) whose KV
cache holds the MTP layer only; each entry of its batches is a token paired with an h row.
At every position p that cache must hold token x_p paired with the target's h at p-1 (x_0
with zeros): the drafter feeds it the prompt after prefill and the accepted tokens after each
verify ("catch-up"). Proposals beyond the first chain the head on its own h output, since the
models have one MTP block.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll
import llama_cpp.llama_cpp_ext as ext
import numpy as np

from .base import EngineError

QWEN35_ARCHES = ("qwen35", "qwen35moe")
QWEN35_FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default when the GGUF has no interval
MTP_TENSORS = ("eh_proj", "enorm", "hnorm")  # the nextn tensors llama.cpp's MTP graph requires


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file says about its layers, read without loading its weights."""

    name: str  # the file name, for messages
    arch: str
    trunk_layers: int  # block_count less the MTP blocks stored after the trunk
    mtp_layers: int
    recurrent_layers: int  # qwen35 family: trunk layers with recurrent state, as llama.cpp counts them
    tensors: frozenset[str]

    def load_problem(self) -> str:
        """Why llama.cpp cannot run this model at all ("" if it can)."""
        if self.arch in QWEN35_ARCHES and self.recurrent_layers in (0, self.trunk_layers):
            missing = "recurrent (GatedDeltaNet)" if self.recurrent_layers == 0 else "full-attention"
            return (
                f"{self.name} is a {self.arch} model with no {missing} layer: llama.cpp's {self.arch} graph "
                "needs layers of both kinds, and its first llama_decode would abort the process "
                "(upstream assert GGML_ASSERT(buffer) in llm_graph_input_mem_hybrid::set_input)"
            )
        return ""

    def mtp_problem(self) -> str:
        """Why method mtp cannot run on this target ("" if it can)."""
        missing = [
            name
            for name in (f"blk.{self.trunk_layers}.nextn.{tensor}.weight" for tensor in MTP_TENSORS)
            if name not in self.tensors
        ]
        if missing:
            return f"method 'mtp' needs an MTP head: {', '.join(missing)} not in {self.name}"
        if self.mtp_layers != 1:
            return f"method 'mtp' drives one MTP head; {self.name} has {self.mtp_layers}"
        return ""


def read_gguf(path: str) -> GgufInfo | None:
    """The layer facts of a GGUF file; None if it cannot be read as one (llama.cpp then
    reports its own error on load)."""
    try:
        meta, tensors = _gguf_header(path)
    except (OSError, ValueError, KeyError, struct.error):
        return None
    arch = meta.get("general.architecture", "")
    mtp_layers = meta.get(f"{arch}.nextn_predict_layers", 0)
    trunk_layers = meta.get(f"{arch}.block_count", 0) - mtp_layers
    recurrent = 0
    if arch in QWEN35_ARCHES:
        # As llama.cpp's qwen35 loader decides it: an explicit per-layer list, else every
        # full_attention_interval-th layer is full attention and the others recurrent.
        layers = meta.get(f"{arch}.attention.recurrent_layers")
        if layers is None:
            interval = meta.get(f"{arch}.full_attention_interval", QWEN35_FULL_ATTENTION_INTERVAL)
            layers = [(i + 1) % interval != 0 for i in range(trunk_layers)]
        recurrent = sum(bool(x) for x in layers[:trunk_layers])
    return GgufInfo(Path(path).name, arch, trunk_layers, mtp_layers, recurrent, frozenset(tensors))


# GGUF value types (ggml's gguf.h): struct formats of the scalars, then string and array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _gguf_header(path: str) -> tuple[dict[str, object], list[str]]:
    """A GGUF file's metadata (string arrays, i.e. the tokenizer's, left out) and tensor names.
    The gguf package's reader takes seconds on a large vocabulary; this skims past it."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        offset = 0

        def read(fmt: str) -> tuple:
            nonlocal offset
            values = struct.unpack_from("<" + fmt, data, offset)
            offset += struct.calcsize("<" + fmt)
            return values

        def string() -> str:
            nonlocal offset
            (size,) = read("Q")
            offset += size
            return data[offset - size : offset].decode("utf-8", errors="replace")

        def value(kind: int) -> object:
            nonlocal offset
            if kind == _STRING:
                return string()
            if kind != _ARRAY:
                return read(_SCALARS[kind])[0]
            item, count = read("IQ")
            if item != _STRING:
                return list(read(f"{count}{_SCALARS[item]}"))
            for _ in range(count):
                (size,) = read("Q")
                offset += size
            return None

        magic, version, n_tensors, n_kv = read("4sIQQ")
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path} is not a GGUF file")
        meta = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(read("I")[0])
        names = []
        for _ in range(n_tensors):
            names.append(string())
            (dims,) = read("I")
            read(f"{dims}QIQ")  # shape, type, offset
    return meta, names


def set_hidden_output(ctx, on: bool) -> None:
    """Make a target context output h for every token of a batch (unmasked), not only for rows with logits."""
    ext.llama_set_embeddings_nextn(ctx, on, False)


def hidden_rows(ctx, n_rows: int, n_embd: int) -> np.ndarray:
    """A copy of the h rows of the last decoded batch of a target context, one per token."""
    rows = ext.llama_get_embeddings_nextn(ctx)
    if not rows:
        raise EngineError("llama.cpp returned no hidden states (nextn embeddings) for the target's batch")
    return np.ctypeslib.as_array(rows, shape=(n_rows, n_embd)).copy()


class MtpContext:
    """The MTP head's context on the target's model, with the target's settings. Every batch
    entry is a token at a position with an h row; `n_past` positions are cached."""

    def __init__(self, target):
        cparams = type(target.cparams).from_buffer_copy(target.cparams)
        cparams.ctx_type = ll.LLAMA_CONTEXT_TYPE_MTP
        cparams.ctx_other = target.ctx
        cparams.n_rs_seq = 0  # its cache is attention only
        self.ctx = ll.llama_init_from_model(target.model, cparams)
        if not self.ctx:
            raise EngineError("llama.cpp could not create an MTP context for the target")
        # h of the rows with logits, which chained drafting feeds back as the next step's h.
        ext.llama_set_embeddings_nextn(self.ctx, True, True)
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_ext_init(self.ctx)
        self.n_batch, self.n_embd, self.n_past = cparams.n_batch, target.n_embd, 0

    def decode(self, tokens: list[int], first: int, states: list[np.ndarray], output: bool = False) -> None:
        """Append `tokens` at positions first, first+1, ... paired with the h rows `states`;
        logits and h for the last one if `output`."""
        pos = ll.llama_pos()
        for start in range(0, len(tokens), self.n_batch):
            ll.llama_batch_ext_clear(self.batch)
            for i, token in enumerate(tokens[start : start + self.n_batch]):
                row = np.ascontiguousarray(states[start + i], dtype=np.float32)
                embd = ll.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.size)
                pos.value = first + start + i
                idx = ll.llama_batch_ext_add_token(self.batch, 0, token)
                # set_embd_token copies the row into the batch
                if not (
                    idx >= 0
                    and ll.llama_batch_ext_set_pos(self.batch, idx, ctypes.byref(pos))
                    and ll.llama_batch_ext_set_embd_token(self.batch, idx, embd)
                ):
                    raise EngineError(f"could not add token {token} at position {pos.value} to the MTP batch")
                ll.llama_batch_ext_set_output_logits(self.batch, idx, output and start + i == len(tokens) - 1)
            rc = ll.llama_process(self.ctx, ll.LLAMA_PROCESS_TYPE_DECODE, self.batch)
            if rc != 0:
                raise EngineError(f"llama_process failed with status {rc} in the MTP context at position {first}")
        self.n_past = first + len(tokens)

    def hidden(self) -> np.ndarray:
        """The head's own h for the last token decoded with `output`. (llama.cpp's masked copy
        takes the first rows of the batch's h, which is right for draft steps: one token.)"""
        row = ext.llama_get_embeddings_nextn_ith(self.ctx, -1)
        if not row:
            raise EngineError("llama.cpp returned no hidden state for the MTP head's last step")
        return np.ctypeslib.as_array(row, shape=(self.n_embd,)).copy()

    def truncate(self, n: int) -> None:
        if n < self.n_past:
            if not ll.llama_memory_seq_rm(self.mem, 0, n, -1):
                raise EngineError(f"the MTP context cannot roll back to position {n}")
            self.n_past = n

    def clear(self) -> None:
        ll.llama_memory_clear(self.mem, False)
        self.n_past = 0

    def close(self) -> None:
        ll.llama_batch_ext_free(self.batch)
        ll.llama_free(self.ctx)


class MtpDrafter:
    """The MTP head in the role the draft model has in the `draft` method. `h_last` is the
    target's h at its newest cached position, which pairs with the next token to draft from.
    The target context must output h rows (`hidden`) for every batch while this drafts."""

    def __init__(self, head: MtpContext, target, chain):
        self.head, self.target, self.chain = head, target, chain
        self.h_last: np.ndarray | None = None

    def prefill(self, prompt: list[int]) -> None:
        """After the target's prefill: catch up the prompt, each token with the h before it."""
        rows = self.target.hidden
        self.head.clear()
        self.head.decode(prompt, 0, [np.zeros_like(rows[0]), *rows[:-1]])
        self.h_last = rows[-1]

    def propose(self, context: list[int], k: int) -> list[int]:
        """Draft k tokens after context[-1] (the token at position p, not yet verified)."""
        p = len(context) - 1
        self.head.decode(context[-1:], p, [self.h_last], output=True)
        tokens = [self.chain.sample(self.head)]
        while len(tokens) < k:
            self.head.decode(tokens[-1:], p + len(tokens), [self.head.hidden()], output=True)
            tokens.append(self.chain.sample(self.head))
        # Position p holds (context[-1], h_last), as catch-up would write it; the rest goes.
        self.head.truncate(p + 1)
        return tokens

    def accept(self, context: list[int], accepted: list[int]) -> None:
        """After the target verified [context[-1], proposals...] and rolled back: catch up the
        accepted proposals, each with the target's h before it from that verify batch."""
        p, rows = len(context) - 1, self.target.hidden
        tokens, states = [context[-1], *accepted], [self.h_last, *rows[: len(accepted)]]
        done = self.head.n_past - p  # 1 when propose() wrote position p, 0 when nothing was drafted
        if tokens[done:]:
            self.head.decode(tokens[done:], p + done, states[done:])
        self.h_last = rows[len(accepted)]

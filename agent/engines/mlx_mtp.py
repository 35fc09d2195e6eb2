"""Our MTP head for Qwen3.5-style MLX models, and the drafter that chains it.

mlx-lm loads Qwen3.5/3.6 checkpoints but drops their `mtp.*` tensors. We read them from the
checkpoint's safetensors ourselves and build the block with mlx-lm's own Qwen3.5 layers:

    h' = norm(layer(fc([enorm(embed(x_{p+1})), hnorm(h_p)])))     logits = lm_head(h')

where h_p is the trunk's final-normed hidden state at position p (llama.cpp's convention for
`qwen35`, so both engines draft the same tokens) and the embedding and LM head are the
trunk's. The head has its own KV cache over every position of the context; a depth beyond
one chains the head on its own output (h' feeds the next step), as llama.cpp does.

Norm convention: Hugging Face Qwen3.5 checkpoints store RMSNorm weights zero-centred (the
model multiplies by 1 + w). mlx-lm shifts the trunk's norms when it sees such a checkpoint;
the MTP block's norms get the same treatment here, or its proposals collapse.
"""

from __future__ import annotations

import glob
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .base import EngineError

# The tensors a Qwen3.5 MTP block cannot work without (one layer's worth is checked).
REQUIRED = ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight")


def text_model(model):
    """The Qwen3.5 text model (embed_tokens, layers, norm) inside an mlx-lm model, or None."""
    language = getattr(model, "language_model", None)
    inner = getattr(language, "model", None)
    return inner if inner is not None and hasattr(inner, "embed_tokens") and hasattr(inner, "norm") else None


def lm_head(model):
    """The output projection of an mlx-lm Qwen3.5 model (tied to the embedding or not)."""
    language = model.language_model
    return language.lm_head if hasattr(language, "lm_head") else text_model(model).embed_tokens.as_linear


def fix_layer_indices(model) -> None:
    """mlx-lm's qwen3_5 assumes layer 0 is linear attention and layer 3 full attention when it
    picks the caches that make its masks; with every layer full attention (or a two-layer
    draft) that indexes the wrong cache or none. Point them at the real first layers."""
    inner = text_model(model)
    if inner is None or not hasattr(inner, "ssm_idx"):
        return
    linear = [layer.is_linear for layer in inner.layers]
    inner.ssm_idx = linear.index(True) if True in linear else None
    inner.fa_idx = linear.index(False) if False in linear else None


# Zero-centred RMSNorm weights in a Hugging Face Qwen3.5 MTP block (its gated norm has none).
_NORMS = (
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
)


def _checkpoint_tensors(path: Path) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for file in sorted(glob.glob(str(path / "*.safetensors"))):
        weights.update(mx.load(file))
    return weights


class MtpHead(nn.Module):
    def __init__(self, args):
        from mlx_lm.models.qwen3_5 import DecoderLayer

        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        # A full-attention decoder layer: mlx-lm decides the kind from the layer index.
        full = args.full_attention_interval - 1
        self.layers = [DecoderLayer(args, layer_idx=full)]
        self.norm = nn.RMSNorm(h, eps=eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache) -> mx.array:
        from mlx_lm.models.base import create_attention_mask

        x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)], axis=-1))
        x = self.layers[0](x, mask=create_attention_mask(x, cache), cache=cache)
        return self.norm(x)


def load_head(model, path: str) -> MtpHead:
    """The MTP block of the checkpoint at `path` for the loaded mlx-lm `model`; EngineError
    naming what is missing when the checkpoint or the model has none."""
    inner = text_model(model)
    if inner is None or getattr(model, "model_type", "") not in ("qwen3_5", "qwen3_5_moe"):
        raise EngineError(
            f"method 'mtp' needs a Qwen3.5-style model with an MTP block; {path} is a "
            f"{getattr(model, 'model_type', 'unknown')!r} model"
        )
    if getattr(model.language_model.args, "num_experts", 0):
        raise EngineError(f"method 'mtp' on MLX supports dense Qwen3.5 MTP blocks; {path} is a mixture of experts")
    checkpoint = _checkpoint_tensors(Path(path))
    tensors = {name.split("mtp.", 1)[1]: array for name, array in checkpoint.items() if "mtp." in name}
    missing = [name for name in REQUIRED if name.removeprefix("mtp.") not in tensors]
    if not any(name.startswith("layers.") for name in tensors):
        missing.append("mtp.layers.0.*")
    if missing:
        raise EngineError(
            f"method 'mtp' needs the model's MTP tensors; {path} has no {', '.join(missing)} "
            "(a checkpoint converted without its MTP block, e.g. by mlx_lm.convert, lacks them)"
        )
    layers = {name.split(".")[1] for name in tensors if name.startswith("layers.")}
    if len(layers) != 1:
        raise EngineError(
            f"Qwen3.5 has one MTP layer; {path} has {len(layers)} (mtp.layers.{{{','.join(sorted(layers))}}})"
        )
    head = MtpHead(model.language_model.args)
    # mlx-lm shifts zero-centred norms only when it sees Hugging Face conv1d kernels (the
    # same test here), so the head follows the convention the trunk was loaded with.
    if any("conv1d.weight" in name and array.shape[-1] != 1 for name, array in checkpoint.items()):
        tensors = {
            name: array + 1.0 if name.endswith(_NORMS) and array.ndim == 1 else array for name, array in tensors.items()
        }
    head.load_weights(list(tensors.items()), strict=True)
    head.set_dtype(inner.embed_tokens.weight.dtype)
    mx.eval(head.parameters())
    return head


class MtpDrafter:
    """Drafts with the MTP head. Its cache holds the head's KV for positions 0..P of the
    context, each computed from (token p, the trunk's hidden state at p - 1, zeros before the
    first); `pending` is the trunk's hidden state at P, which the next draft pairs with the
    newest token. `target` is the engine's target (mlx._Target): its `model`, and its `hidden`
    rows of the last pass, which the engine keeps while this drafts. Proposals stay lazy (MLX
    arrays) until the engine reads them.
    """

    def __init__(self, target, head: MtpHead, sample):
        from mlx_lm.models.cache import KVCache

        self.target, self.head, self.sample = target, head, sample
        self.inner, self.logits = text_model(target.model), lm_head(target.model)
        self.cache = KVCache()
        self.pending: mx.array | None = None

    def _step(self, tokens: mx.array, hidden: mx.array) -> mx.array:
        """The head's output rows (1, n, h) for tokens (n,) paired with hidden rows (1, n, h)."""
        return self.head(self.inner.embed_tokens(tokens[None]), hidden, self.cache)

    def prefill(self, prompt: list[int]) -> None:
        """After the target's prompt pass (hidden rows (1, N, h)): the head's cache covers the prompt."""
        hidden = self.target.hidden
        shifted = mx.concatenate([mx.zeros_like(hidden[:, :1]), hidden[:, :-1]], axis=1)
        mx.eval(self._step(mx.array(prompt), shifted))  # part of prefill, as a draft model's is
        self.pending = hidden[:, -1:]

    def propose(self, context: list[int], k: int) -> mx.array:
        """k proposals after the newest token context[-1] (not yet in the target's cache), shape
        (k,). One head drafts every position: step i feeds the proposal of step i - 1 with the
        head's own output there (chained drafting)."""
        token, hidden, proposed = mx.array(context[-1:]), self.pending, []
        for _ in range(k):
            hidden = self._step(token, hidden)
            token = self.sample(self.logits(hidden[:, -1, :]))
            proposed.append(token)
        # Position P (the newest token with the trunk's state) is what accept() would write:
        # it stays; the positions of proposals, drafted from the head's own states, go.
        self.cache.trim(k - 1)
        return mx.concatenate(proposed)

    def accept(self, context: list[int], accepted: list[int]) -> None:
        """After a verify pass: the accepted proposals, with the target's hidden rows of that
        pass for the newest token and the accepted proposals. (With nothing proposed, which
        happens only for the last token of a generation, the head's cache is not needed again.)"""
        hidden = self.target.hidden[:, : len(accepted) + 1]
        if accepted:
            mx.eval(self._step(mx.array(accepted), hidden[:, :-1]))  # timed with the verify, as in llama.cpp
        self.pending = hidden[:, -1:]

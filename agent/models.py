"""Which model files a job may use, where they are, whether they fit, and their SHA-256.

A model reference is a local path (a GGUF file or an MLX model directory) or a Hugging Face
repository id ("org/name") resolved through huggingface_hub's cache. Local paths must lie
inside one of the agent's model directories (symlinks resolved first); Hugging Face models
live in the hub cache, which is always allowed. With no model directory configured the agent
takes local paths anywhere and says so at start and in its status: set --model-dir on any
machine that is not yours alone.

Hashes are cached by path, size and modification time, so a 40 GB model is hashed once, not
once per job.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

HF_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Unified memory a model may take: the rest is for macOS, the KV cache and activations.
# macOS lets the GPU wire about 3/4 of memory by default (iogpu.wired_limit_mb).
MEMORY_FRACTION = 0.75
MODEL_OVERHEAD = 1.2  # weights x this: KV cache and activations of a benchmark-sized context
HASH_CHUNK_BYTES = 8 * 2**20


class ModelRefused(Exception):
    """This agent will not run the job; the message says why (it reaches the coordinator)."""


@dataclass(frozen=True)
class Resolved:
    reference: str  # as the job named it
    path: Path  # the local file or directory
    source: str  # "local" | "huggingface"
    files: tuple[Path, ...]  # every file that belongs to the model
    size_bytes: int


def hf_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _model_files(path: Path) -> tuple[Path, ...]:
    if path.is_file():
        return (path,)
    return tuple(sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")))


def _inside(path: Path, directories: list[Path]) -> bool:
    return any(path == d or d in path.parents for d in directories)


def resolve(
    reference: str, model_dirs: list[Path], allow_download: bool = False, hf_cache: Path | None = None
) -> Resolved:
    """Where the model named `reference` is on this machine; ModelRefused when it may not be
    used or is not there."""
    if not reference:
        raise ModelRefused("the job names no model")
    local = Path(reference).expanduser()
    if local.is_absolute() or reference.startswith(".") or local.exists() or not HF_ID_RE.match(reference):
        real = local.resolve()
        allowed = [d.expanduser().resolve() for d in model_dirs]
        if allowed and not _inside(real, allowed):
            raise ModelRefused(
                f"model path {reference} is outside this agent's model directories "
                f"({', '.join(str(d) for d in allowed)}); add one with `specfleet agent run --model-dir DIR`"
            )
        if not real.exists():
            raise ModelRefused(f"model path {reference} does not exist on this agent")
        files = _model_files(real)
        if not files:
            raise ModelRefused(f"model directory {reference} holds no files")
        return Resolved(reference, real, "local", files, sum(f.stat().st_size for f in files))
    return _resolve_hf(reference, allow_download, hf_cache)


def _resolve_hf(repo_id: str, allow_download: bool, hf_cache: Path | None) -> Resolved:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(repo_id, cache_dir=hf_cache, local_files_only=not allow_download))
    except LocalEntryNotFoundError:
        raise ModelRefused(
            f"Hugging Face model {repo_id} is not in this agent's cache ({hf_cache or hf_cache_dir()}); "
            f"download it on this machine first (`hf download {repo_id}`)"
        ) from None
    except Exception as e:  # invalid id, network, permissions: say which
        raise ModelRefused(f"Hugging Face model {repo_id} could not be resolved: {type(e).__name__}: {e}") from None
    files = tuple(p for p in _model_files(snapshot))
    if not files:
        raise ModelRefused(f"Hugging Face model {repo_id}: its cached snapshot {snapshot} is empty")
    # Snapshot entries are symlinks into blobs/: sizes and hashes are the blobs'.
    return Resolved(repo_id, snapshot, "huggingface", files, sum(f.stat().st_size for f in files))


def check_fits(models: list[Resolved], memory_bytes: int, declared_gb: float | None = None) -> None:
    """Refuse before loading anything when the models cannot fit in this machine's memory."""
    if memory_bytes <= 0:
        return  # memory unknown here: nothing to judge by (the fingerprint lists it unavailable)
    budget = memory_bytes * MEMORY_FRACTION
    weights = sum(m.size_bytes for m in models)
    needed = weights * MODEL_OVERHEAD
    if declared_gb is not None:
        needed = max(needed, declared_gb * 2**30)
    if needed > budget:
        names = " + ".join(f"{m.reference} ({m.size_bytes / 2**30:.1f} GiB)" for m in models)
        raise ModelRefused(
            f"model too big for this machine: {names} need about {needed / 2**30:.1f} GiB, but only "
            f"{budget / 2**30:.1f} GiB of its {memory_bytes / 2**30:.1f} GiB may be used for models"
        )


class HashCache:
    """SHA-256 of files, remembered by (path, size, mtime) in a JSON file."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            self._entries = json.loads(path.read_text())
        except (OSError, ValueError):
            self._entries = {}
        self.computed = 0  # files actually read (for tests and logs)

    def sha256(self, file: Path) -> str:
        st = file.stat()
        key = str(file.resolve())
        stamp = [st.st_size, st.st_mtime_ns]
        with self._lock:
            entry = self._entries.get(key)
            if entry and entry["stamp"] == stamp:
                return entry["sha256"]
        h = hashlib.sha256()
        with open(file, "rb") as f:
            while chunk := f.read(HASH_CHUNK_BYTES):
                h.update(chunk)
        digest = h.hexdigest()
        with self._lock:
            self.computed += 1
            self._entries[key] = {"stamp": stamp, "sha256": digest}
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._entries))
            os.replace(tmp, self.path)
        return digest

    def file_digests(self, model: Resolved) -> dict[str, str]:
        """Each file's SHA-256, by its name inside the model (the file's name for a GGUF)."""
        return {str(f.relative_to(model.path)) if f != model.path else f.name: self.sha256(f) for f in model.files}

    def digest(self, model: Resolved) -> str:
        """The model's content digest: SHA-256 over "name:sha256" lines of its files, sorted. The
        same weights give the same digest wherever they lie."""
        lines = "".join(f"{name}:{d}\n" for name, d in sorted(self.file_digests(model).items()))
        return hashlib.sha256(lines.encode()).hexdigest()

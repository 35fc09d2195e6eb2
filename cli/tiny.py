"""The tiny models, built once under a directory with a manifest (`make_tiny`): the target and
draft of cli/tinymodels.py, then the MTP models of cli/tinymtp.py, which build on it; apart from
both so that neither imports the other. `python -m cli.tiny DIR` builds them and prints the paths."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from cli import tinymtp
from cli.tinymodels import (
    TARGET_SEED,
    TARGET_SHAPE,
    TinyModels,
    _write_json,
    build_vocab,
    layer_skip_pair,
    write_model,
)

# Any edit of the builders makes a new builder, so models from an older one never survive a
# change (a rebuild takes a second or two).
BUILDER_VERSION = hashlib.sha256(
    b"".join((Path(__file__).parent / name).read_bytes() for name in ("tiny.py", "tinymodels.py", "tinymtp.py"))
).hexdigest()[:16]
MANIFEST = "manifest.json"


# --- the pair, with a manifest -------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _result(directory: Path, vocab_size: int, bos_id: int, eos_id: int) -> TinyModels:
    return TinyModels(
        mlx_target=directory / "mlx" / "target",
        mlx_draft=directory / "mlx" / "draft",
        gguf_target=directory / "gguf" / "target.gguf",
        gguf_draft=directory / "gguf" / "draft.gguf",
        mlx_mtp_dense=directory / "mlx" / "mtp-dense",
        mlx_mtp_hybrid=directory / "mlx" / "mtp-hybrid",
        mlx_mtp_hybrid_draft=directory / "mlx" / "mtp-hybrid-draft",
        gguf_mtp_dense=directory / "gguf" / "mtp-dense.gguf",
        gguf_mtp_hybrid=directory / "gguf" / "mtp-hybrid.gguf",
        gguf_mtp_hybrid_draft=directory / "gguf" / "mtp-hybrid-draft.gguf",
        vocab_size=vocab_size,
        bos_id=bos_id,
        eos_id=eos_id,
    )


def _complete(directory: Path) -> TinyModels | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("builder_version") != BUILDER_VERSION:
        return None
    files = manifest.get("files", {})
    if not files or any(
        not (directory / name).is_file() or _sha256(directory / name) != digest for name, digest in files.items()
    ):
        return None
    return _result(directory, manifest["vocab_size"], manifest["bos_id"], manifest["eos_id"])


def make_tiny(directory: Path) -> TinyModels:
    """Build (or find already built) the tiny models under `directory`."""
    directory = Path(directory)
    found = _complete(directory)
    if found is not None:
        return found
    vocab = build_vocab()
    target, draft, draft_shape = layer_skip_pair(TARGET_SHAPE, vocab.size, TARGET_SEED)
    write_model(directory, "target", TARGET_SHAPE, target, vocab)
    write_model(directory, "draft", draft_shape, draft, vocab)
    tinymtp.write_all(directory, vocab)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    # The manifest is written last, so an interrupted build is rebuilt on the next call.
    _write_json(
        directory / MANIFEST,
        {
            "builder_version": BUILDER_VERSION,
            "vocab_size": vocab.size,
            "bos_id": vocab.bos_id,
            "eos_id": vocab.eos_id,
            "files": {str(p.relative_to(directory)): _sha256(p) for p in files},
        },
    )
    return _result(directory, vocab.size, vocab.bos_id, vocab.eos_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the deterministic tiny target and draft models.")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    models = make_tiny(args.directory)
    for name, path in models.paths().items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

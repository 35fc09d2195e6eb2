"""Model resolution: local paths inside the model directories, Hugging Face ids through a fake
local hub cache (nothing is downloaded), file hashes cached by path+size+mtime, and models
too big for memory refused before anything is loaded."""

import hashlib
import os

import pytest

from agent.models import HashCache, ModelRefused, check_fits, resolve

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def fake_hub(cache, repo_id="mlx-community/Tiny-4bit", files=None):
    """The layout huggingface_hub keeps: refs/main -> commit, snapshots/<commit>/* -> ../../blobs/<sha>."""
    files = files or {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\x00" * 1024}
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_local_paths_inside_and_outside_the_model_directories(tmp_path):
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    (models / "tiny").mkdir(parents=True)
    (models / "tiny" / "config.json").write_text("{}")
    (models / "tiny" / "model.safetensors").write_bytes(b"w" * 100)
    elsewhere.mkdir()
    (elsewhere / "secret.gguf").write_bytes(b"x")

    m = resolve(str(models / "tiny"), [models])
    assert (
        m.source == "local"
        and m.size_bytes == 102
        and [f.name for f in m.files]
        == [
            "config.json",
            "model.safetensors",
        ]
    )
    with pytest.raises(ModelRefused, match="outside this agent's model directories"):
        resolve(str(elsewhere / "secret.gguf"), [models])
    # A symlink inside a model directory that points out of it is judged by where it points.
    (models / "escape.gguf").symlink_to(elsewhere / "secret.gguf")
    with pytest.raises(ModelRefused, match="outside"):
        resolve(str(models / "escape.gguf"), [models])
    with pytest.raises(ModelRefused, match="outside"):
        resolve(str(models / ".." / "elsewhere" / "secret.gguf"), [models])
    with pytest.raises(ModelRefused, match="does not exist"):
        resolve(str(models / "missing.gguf"), [models])
    with pytest.raises(ModelRefused, match="names no model"):
        resolve("", [models])
    # No model directory configured: any existing path is taken (documented default).
    assert resolve(str(elsewhere / "secret.gguf"), []).size_bytes == 1


def test_hugging_face_ids_resolve_through_the_local_cache_without_downloading(tmp_path):
    snapshot = fake_hub(tmp_path / "hub")
    m = resolve("mlx-community/Tiny-4bit", [tmp_path / "models"], hf_cache=tmp_path / "hub")
    assert m.source == "huggingface" and m.path == snapshot
    assert m.size_bytes == 1024 + len(b'{"model_type": "llama"}')
    with pytest.raises(ModelRefused, match="is not in this agent's cache .*hf download mlx-community/Other"):
        resolve("mlx-community/Other", [], hf_cache=tmp_path / "hub")


def test_hashes_are_recorded_and_cached_by_path_size_and_mtime(tmp_path):
    snapshot = fake_hub(tmp_path / "hub")
    m = resolve("mlx-community/Tiny-4bit", [], hf_cache=tmp_path / "hub")
    cache = HashCache(tmp_path / "hashes.json")
    files = cache.file_digests(m)
    digest = cache.digest(m)
    expected = hashlib.sha256(b"\x00" * 1024).hexdigest()
    assert files["model.safetensors"] == expected
    assert len(files) == 2 and len(digest) == 64
    assert cache.computed == 2

    again = HashCache(tmp_path / "hashes.json")  # a new agent life reads the cache from disk
    assert again.digest(m) == digest and again.computed == 0

    weights = (snapshot / "model.safetensors").resolve()
    weights.write_bytes(b"\x01" * 1024)  # same size, new mtime: rehashed
    os.utime(weights, ns=(1, 1))
    changed = again.digest(m)
    assert again.computed == 1 and changed != digest


def test_a_model_too_big_for_memory_is_refused_before_loading(tmp_path):
    huge = tmp_path / "huge.gguf"
    with open(huge, "wb") as f:
        f.truncate(200 * 2**30)  # sparse: 200 GiB on paper, nothing on disk, never read
    m = resolve(str(huge), [tmp_path])
    with pytest.raises(ModelRefused, match=r"model too big for this machine: .*huge.gguf \(200.0 GiB\)"):
        check_fits([m], memory_bytes=64 * 2**30)
    check_fits([m], memory_bytes=512 * 2**30)
    small = tmp_path / "small.gguf"
    small.write_bytes(b"x" * 1000)
    s = resolve(str(small), [tmp_path])
    check_fits([s], memory_bytes=16 * 2**30)
    with pytest.raises(ModelRefused, match="need about 40.0 GiB"):
        check_fits([s], memory_bytes=16 * 2**30, declared_gb=40)  # the sweep's models.<engine>.memory_gb
    check_fits([m], memory_bytes=0)  # memory unknown: nothing to judge by

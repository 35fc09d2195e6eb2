"""scripts/build-llama-cpp.sh checks its own shared (CUDA) build: a library that exports a private
libstdc++ (std::locale::classic), or uses the C++ runtime without linking libstdc++.so.6 where the
compilers link it dynamically, fails the build (issue 28: such a libggml-cuda.so crashed every
in-process load after protobuf or numpy had loaded the system libstdc++.so.6).

The libraries here are small stand-ins compiled with the system g++ in the three ways that
matter: linked against libstdc++.so.6 (what the build must produce), a static libstdc++ exported
(what the H200 image's /opt/gcc wrappers produced), and a static one kept private."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "build-llama-cpp.sh"
SOURCE = """
#include <locale>
#include <sstream>
extern "C" int digits(long v) {
    std::ostringstream o;
    o.imbue(std::locale::classic());
    o << v;
    return (int)o.str().size();
}
"""

pytestmark = [
    pytest.mark.process,  # compilers and the build script run as processes
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("g++", "gcc", "nm", "readelf", "c++filt")),
        reason="needs g++, nm, readelf and c++filt",
    ),
]


def _library(tmp_path: Path, name: str, *flags: str, link_with: str = "g++") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    source, obj = tmp_path / f"{name}.cpp", tmp_path / f"{name}.o"
    source.write_text(SOURCE)
    subprocess.run(["g++", "-c", "-fPIC", "-O1", str(source), "-o", str(obj)], check=True)
    real = directory / "libggml-cuda.so.0.9.0"
    subprocess.run([link_with, "-shared", *flags, str(obj), "-o", str(real)], check=True)
    (directory / "libggml-cuda.so").symlink_to(real.name)  # the soname link is skipped, not checked twice
    return directory


def _check(directory: Path, runtime: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--check", str(directory), runtime], capture_output=True, text=True, timeout=60
    )


def test_a_library_linking_the_shared_runtime_passes(tmp_path):
    lib = _library(tmp_path, "shared")
    result = _check(lib, "dynamic")
    assert result.returncode == 0, result.stderr
    assert "libggml-cuda.so.0.9.0" in result.stdout and "libstdc++.so.6" in result.stdout
    assert result.stdout.count("check:") == 1


def test_an_exported_static_runtime_fails(tmp_path):
    lib = _library(tmp_path, "exported", "-static-libstdc++")
    for runtime in ("dynamic", "static"):
        result = _check(lib, runtime)
        assert result.returncode == 1
        assert "exports std::locale::classic" in result.stderr


def test_a_private_static_runtime_passes(tmp_path):
    lib = _library(tmp_path, "private", "-static-libstdc++", "-Wl,--exclude-libs,ALL")
    assert _check(lib, "static").returncode == 0
    assert _check(lib, "dynamic").returncode == 0  # nothing taken from outside: no dependency needed


def test_a_missing_runtime_dependency_fails_where_it_should_be_dynamic(tmp_path):
    lib = _library(tmp_path, "missing", link_with="gcc")  # C++ objects linked without libstdc++
    result = _check(lib, "dynamic")
    assert result.returncode == 1
    assert "does not link libstdc++.so.6" in result.stderr
    assert _check(lib, "static").returncode == 0


def test_an_empty_directory_fails(tmp_path):
    result = _check(tmp_path, "dynamic")
    assert result.returncode == 1
    assert "no shared libraries" in result.stderr

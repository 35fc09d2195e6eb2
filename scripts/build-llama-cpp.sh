#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-bench` from the very source the locked
# llama-cpp-python vendors (the same commit as the in-process engine), once per lock.
#
# The sdist named in uv.lock is downloaded and checked against the lock's sha256; the build lands
# in a cache outside the checkout (keyed by that hash and the accelerator), like uv's cached
# wheel, so a fresh clone on the same machine reuses it and only the symlink .data/llama.cpp is
# made again. CPU build by default: static, no web UI and no download at build time; about 7
# minutes on 2 cores the first time.
#
# SPECFLEET_ACCEL=cuda (or `--accel cuda`) builds for NVIDIA GPUs instead: ggml's CUDA backend
# for SPECFLEET_CUDA_ARCHITECTURES (default "native": the GPUs of this machine), as shared
# libraries beside the two programs in bin/. The in-process engine then loads that libllama
# (agent/engines/llamacpp_lib.py points llama-cpp-python's LLAMA_CPP_LIB_PATH at it), so the
# in-process engine, llama-server and llama-bench all run one CUDA build of one commit. About
# 5 minutes on 16 cores for one architecture. Needs nvcc (CUDA 12 or later) on PATH.
#
# SPECFLEET_LLAMA_SRC=DIR builds from an unpacked llama.cpp source tree instead of the sdist,
# for a machine that cannot download (it must be the lock's vendor/llama.cpp: nothing checks
# that); SPECFLEET_LLAMA_COMMIT names its commit where the tree carries no git metadata.
set -euo pipefail
cd "$(dirname "$0")/.."

accel="${SPECFLEET_ACCEL:-cpu}"
if [ "${1:-}" = "--accel" ]; then accel="${2:?--accel needs cpu or cuda}"; fi
case "$accel" in
    cpu) accel_flags=(-DBUILD_SHARED_LIBS=OFF); suffix="" ;;
    cuda)
        command -v nvcc >/dev/null 2>&1 || { echo "build-llama-cpp: SPECFLEET_ACCEL=cuda needs nvcc on PATH" >&2; exit 1; }
        accel_flags=(-DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON
            "-DCMAKE_CUDA_ARCHITECTURES=${SPECFLEET_CUDA_ARCHITECTURES:-native}")
        suffix="-cuda" ;;
    *) echo "build-llama-cpp: SPECFLEET_ACCEL is '$accel'; it must be cpu or cuda" >&2; exit 1 ;;
esac

read -r url sha < <(python3 - <<'PY'
import tomllib
lock = tomllib.load(open("uv.lock", "rb"))
pkg = next(p for p in lock["package"] if p["name"] == "llama-cpp-python")
print(pkg["sdist"]["url"], pkg["sdist"]["hash"].removeprefix("sha256:"))
PY
)
cache="${SPECFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specfleet}/llama.cpp/${sha:0:16}$suffix"
link=.data/llama.cpp

if [ ! -x "$cache/bin/llama-server" ] || [ ! -x "$cache/bin/llama-bench" ]; then
    echo "setup: building llama-server and llama-bench ($accel) from $(basename "$url") (once; minutes)"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    if [ -n "${SPECFLEET_LLAMA_SRC:-}" ]; then
        src="$(cd "$SPECFLEET_LLAMA_SRC" && pwd)"
    else
        curl -fsSL --retry 3 -o "$work/sdist.tar.gz" "$url"
        echo "$sha  $work/sdist.tar.gz" | sha256sum --check --quiet
        tar -xzf "$work/sdist.tar.gz" -C "$work"
        # The sdist carries the submodule's git metadata, so the build records the real commit.
        src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
    fi
    if [ -n "${SPECFLEET_LLAMA_COMMIT:-}" ]; then  # llama.cpp's build info and ggml's (ggml_commit)
        sed -i "s/set(BUILD_COMMIT \"unknown\")/set(BUILD_COMMIT \"$SPECFLEET_LLAMA_COMMIT\")/" "$src/cmake/build-info.cmake"
        sed -i "s/set(GGML_BUILD_COMMIT \"unknown\")/set(GGML_BUILD_COMMIT \"$SPECFLEET_LLAMA_COMMIT\")/" "$src/ggml/CMakeLists.txt"
    fi
    cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${accel_flags[@]}" \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
        >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
    cmake --build "$work/build" --target llama-server llama-bench llama \
        -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
    mkdir -p "$cache.tmp/bin"
    # A shared build's libraries (libllama, libggml*) sit beside the programs, found through $ORIGIN.
    cp -P "$work/build/bin/llama-server" "$work/build/bin/llama-bench" "$cache.tmp/bin/"
    find "$work/build/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -P {} "$cache.tmp/bin/" \;
    echo "$accel" >"$cache.tmp/accel.txt"
    "$cache.tmp/bin/llama-server" --version >"$cache.tmp/version.txt" 2>&1
    rm -rf "$cache" && mv "$cache.tmp" "$cache"
fi
mkdir -p .data
ln -sfn "$cache" "$link"

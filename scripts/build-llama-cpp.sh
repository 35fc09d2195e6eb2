#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-bench` from the very source the locked
# llama-cpp-python vendors (the same commit as the in-process engine), once per lock.
#
# The sdist named in uv.lock is downloaded and checked against the lock's sha256; the build lands
# in a cache outside the checkout (keyed by that hash), like uv's cached wheel, so a fresh clone
# on the same machine reuses it and only the symlink .data/llama.cpp is made again. CPU build,
# static, no web UI and no download at build time. About 7 minutes on 2 cores the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r url sha < <(python3 - <<'EOF'
import tomllib
lock = tomllib.load(open("uv.lock", "rb"))
pkg = next(p for p in lock["package"] if p["name"] == "llama-cpp-python")
print(pkg["sdist"]["url"], pkg["sdist"]["hash"].removeprefix("sha256:"))
EOF
)
cache="${SPECFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specfleet}/llama.cpp/${sha:0:16}"
link=.data/llama.cpp

if [ ! -x "$cache/bin/llama-server" ] || [ ! -x "$cache/bin/llama-bench" ]; then
    echo "setup: building llama-server and llama-bench from $(basename "$url") (once; minutes)"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    curl -fsSL --retry 3 -o "$work/sdist.tar.gz" "$url"
    echo "$sha  $work/sdist.tar.gz" | sha256sum --check --quiet
    tar -xzf "$work/sdist.tar.gz" -C "$work"
    src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
    # The sdist carries the submodule's git metadata, so the build records the real commit.
    cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
        >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
    cmake --build "$work/build" --target llama-server llama-bench \
        -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
    mkdir -p "$cache.tmp/bin"
    cp "$work/build/bin/llama-server" "$work/build/bin/llama-bench" "$cache.tmp/bin/"
    "$cache.tmp/bin/llama-server" --version >"$cache.tmp/version.txt" 2>&1
    rm -rf "$cache" && mv "$cache.tmp" "$cache"
fi
mkdir -p .data
ln -sfn "$cache" "$link"

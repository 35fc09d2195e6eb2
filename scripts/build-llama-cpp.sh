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
# The CUDA build's C++ runtime. Its five shared libraries must use the process's one libstdc++:
# a copy linked into them and exported (std::locale::classic, num_put<char>::id, ...) mixes
# with the system libstdc++.so.6 that protobuf and numpy load first, and llama_model_load
# crashes in its first `ostream << long` (issue 28). So the host compilers (CC, CXX and
# CUDAHOSTCXX, which nvcc compiles and links through) must link libstdc++ dynamically: where the
# environment's cannot (wrappers whose library directory holds only libstdc++.a, like the
# H200 image's /opt/gcc/bin), /usr/bin/gcc and /usr/bin/g++ are used instead; where neither
# can, the static copy is kept private (-Wl,--exclude-libs,ALL). The build then checks its own
# output (`--check DIR dynamic|static`, below): no library exports std::locale::classic, and
# each links libstdc++.so.6 where the compilers link it dynamically. The compilers and their
# versions, and each library's NEEDED entries, go into the build's version.txt.
#
# NCCL: ggml's CUDA backend links NVIDIA's NCCL (GGML_CUDA_NCCL, on by default) where CMake finds
# it, for tensor splits across several GPUs; one GPU never calls it. Whether this build links
# libnccl.so.2 is in version.txt's NEEDED lines (bench/README.md, "NVIDIA H200", says what the
# H200 image's build linked). SPECFLEET_CUDA_NCCL=OFF builds without it.
#
# SPECFLEET_LLAMA_SRC=DIR builds from an unpacked llama.cpp source tree instead of the sdist,
# for a machine that cannot download (it must be the lock's vendor/llama.cpp: nothing checks
# that); SPECFLEET_LLAMA_COMMIT names its commit where the tree carries no git metadata.
set -euo pipefail
cd "$(dirname "$0")/.."

# True where C++ compiler $1 links libstdc++ dynamically: a shared library it links from a line
# of C++ depends on libstdc++.so.6 (a wrapper that finds only libstdc++.a, or adds
# -static-libstdc++, makes one that does not).
links_libstdcxx_dynamically() {
    local probe needed=""
    probe="$(mktemp -d)"
    printf '#include <string>\nstd::string probe(const char *s) { return s; }\n' >"$probe/probe.cpp"
    if "$1" -shared -fPIC "$probe/probe.cpp" -o "$probe/libprobe.so" >/dev/null 2>&1; then
        needed="$(readelf -d "$probe/libprobe.so")"
    fi
    rm -rf "$probe"
    [[ "$needed" == *"[libstdc++.so.6]"* ]]
}

# Checks a shared build's libraries in $1 (issue 28): none may export the C++ runtime's
# std::locale::classic (a private libstdc++ leaking out), and with $2 = dynamic each library that
# takes C++ runtime symbols from outside (std::, operator new, exceptions) must link
# libstdc++.so.6. One line per library; status 1 if any fails.
check_shared_build() {
    local dir="$1" expect="$2" lib status=0 defined undefined needed
    local found=0
    for lib in "$dir"/lib*.so*; do
        [ -f "$lib" ] && [ ! -L "$lib" ] || continue  # the real file, not its soname links
        found=1
        defined="$(nm -D --defined-only "$lib" | c++filt)"
        undefined="$(nm -D --undefined-only "$lib")"
        needed=" $(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
        echo "check: $(basename "$lib"): $(grep -c ' std::' <<<"$defined" || true) std:: symbols exported;" \
            "NEEDED:$needed"
        if grep -qF 'std::locale::classic()' <<<"$defined"; then
            echo "build-llama-cpp: $lib exports std::locale::classic: it carries a private libstdc++" \
                "that clashes with the process's libstdc++.so.6 (issue 28)" >&2
            status=1
        fi
        if [ "$expect" = dynamic ] && [[ "$needed" != *" libstdc++.so.6 "* ]] &&
            grep -qE ' (_Z[^ ]*St|_Zn[wa]|_Zd[la]|__gxx_personality|__cxa_(throw|begin_catch|guard))' <<<"$undefined"; then
            echo "build-llama-cpp: $lib uses the C++ runtime but does not link libstdc++.so.6" >&2
            status=1
        fi
    done
    [ "$found" = 1 ] || { echo "build-llama-cpp: no shared libraries in $dir to check" >&2; return 1; }
    return $status
}

if [ "${1:-}" = "--check" ]; then  # scripts/build-llama-cpp.sh --check DIR [dynamic|static]
    check_shared_build "${2:?--check needs a directory}" "${3:-dynamic}"
    exit
fi

accel="${SPECFLEET_ACCEL:-cpu}"
if [ "${1:-}" = "--accel" ]; then accel="${2:?--accel needs cpu or cuda}"; fi
runtime=""  # how the shared build links libstdc++: dynamic, or static kept private
case "$accel" in
    cpu) accel_flags=(-DBUILD_SHARED_LIBS=OFF); suffix="" ;;
    cuda)
        command -v nvcc >/dev/null 2>&1 || { echo "build-llama-cpp: SPECFLEET_ACCEL=cuda needs nvcc on PATH" >&2; exit 1; }
        # Host compilers that link libstdc++ dynamically (see the header): the environment's,
        # else the system's; failing both, the environment's with their static copy kept private.
        cxx="${CXX:-c++}"
        if links_libstdcxx_dynamically "$cxx"; then
            runtime=dynamic
        elif [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ] && links_libstdcxx_dynamically /usr/bin/g++; then
            echo "setup: $cxx links only a static libstdc++; building with /usr/bin/gcc and /usr/bin/g++"
            export CC=/usr/bin/gcc CXX=/usr/bin/g++
            runtime=dynamic
        else
            echo "setup: no host compiler links libstdc++ dynamically; keeping $cxx's static copy private"
            runtime=static
        fi
        export CXX="${CXX:-c++}"
        if [ -z "${CUDAHOSTCXX:-}" ] || { [ "$runtime" = dynamic ] && ! links_libstdcxx_dynamically "$CUDAHOSTCXX"; }; then
            export CUDAHOSTCXX="$CXX"
        fi
        accel_flags=(-DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON
            "-DCMAKE_CUDA_ARCHITECTURES=${SPECFLEET_CUDA_ARCHITECTURES:-native}"
            "-DGGML_CUDA_NCCL=${SPECFLEET_CUDA_NCCL:-ON}"
            # A static archive's symbols (libstdc++.a, libgcc.a) stay inside each library.
            "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL")
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

# A shared build cached before the check existed (or by other compilers) is built again if it fails it.
if [ -n "$runtime" ] && [ -x "$cache/bin/llama-server" ] && ! check_shared_build "$cache/bin" "$runtime" >/dev/null 2>&1; then
    echo "setup: the cached build in $cache fails the C++ runtime check (issue 28); building it again"
    rm -rf "$cache"
fi
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
    {
        "$cache.tmp/bin/llama-server" --version 2>&1
        # The compilers CMake used (its cache), and their versions.
        for lang in C CXX CUDA; do
            compiler="$(sed -n "s/^CMAKE_${lang}_COMPILER:[A-Z]*=//p" "$work/build/CMakeCache.txt")"
            [ -z "$compiler" ] && continue
            version="$("$compiler" --version 2>&1 | grep -m1 -i 'release' || "$compiler" --version 2>&1 | head -1)"
            echo "compiler $lang: $compiler -> $(readlink -f "$compiler" || echo "$compiler") ($version)"
        done
        host="$(sed -n 's/^CMAKE_CUDA_HOST_COMPILER:[A-Z]*=//p' "$work/build/CMakeCache.txt")"
        [ -n "$host" ] && echo "compiler CUDA host: $host -> $(readlink -f "$host") ($("$host" --version 2>&1 | head -1))"
        [ -n "$runtime" ] && echo "libstdc++: $runtime"
        if [ "$accel" = cuda ]; then
            for lib in "$cache.tmp"/bin/lib*.so*; do
                [ -L "$lib" ] || echo "NEEDED $(basename "$lib"): $(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
            done
        fi
    } >"$cache.tmp/version.txt"
    if [ -n "$runtime" ]; then
        check_shared_build "$cache.tmp/bin" "$runtime" || { rm -rf "$cache.tmp"; exit 1; }
    fi
    rm -rf "$cache" && mv "$cache.tmp" "$cache"
fi
mkdir -p .data
ln -sfn "$cache" "$link"

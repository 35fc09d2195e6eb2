#!/usr/bin/env bash
# Makes .gpu/, what a call to the lent NVIDIA H200 machine carries for bench/h200.sh (git-ignored;
# bench/README.md, "NVIDIA H200", says how it travels). One command, from the repository root:
#
#   scripts/device-payload.sh [--build DIR] [--source] [--no-mlx]
#
# It holds, each made from the lock (uv.lock) so that the device runs what this checkout runs:
#   llama.cpp-src.tar.xz  the llama.cpp source the locked llama-cpp-python vendors (its sdist,
#                         downloaded once into SPECFLEET_CACHE and checked against the lock's
#                         sha256), stripped of models, docs, tests, examples and the backends other
#                         than the CPU's and CUDA's; llama.cpp.commit beside it names its commit
#                         (the stripped tree has no git metadata). Only where no packed build is
#                         given, or with --source: a call that unpacks a build never reads it.
#   py/                   llama-cpp-python's Python package and its dist-info (without its bundled
#                         CPU libraries: the device loads the CUDA build through LLAMA_CPP_LIB_PATH);
#                         without the dist-info agent/fingerprint.engine_versions() finds no
#                         llama-cpp-python there and the agent enrols without llama.cpp.
#   site-*.tar.xz         the locked versions of the wheels the device's image lacks or has too old,
#                         for its Python (DEVICE_PYTHON, 3.12; this checkout's is 3.11, whose compiled
#                         wheels do not load there), downloaded with `pip download --only-binary
#                         :all:` and unpacked: core (duckdb, gguf, grpcio, grpcio-health-checking,
#                         protobuf, diskcache), pydantic (pydantic, pydantic-core, annotated-types,
#                         typing-inspection, typing-extensions) and mlx (mlx, mlx-cpu, mlx-lm: MLX on
#                         the CPU; --no-mlx leaves it out).
#   build/                the CUDA build a `pack` stage returned (its build.tar.xz.* parts, from
#                         --build DIR: the files_at folder of that call), for the `unpack` stage.
#
# Then it prints the payload's size, and the working tree's that travels with it, against the
# 64 MiB a call may carry, and exits 1 past it (the payload stays, to be trimmed).
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT_BYTES=$((64 * 1024 * 1024))
DEVICE_PYTHON="${DEVICE_PYTHON:-3.12}"
PLATFORMS=(manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
CORE=(duckdb gguf grpcio grpcio-health-checking protobuf diskcache)
PYDANTIC=(pydantic pydantic-core annotated-types typing-inspection typing-extensions)
MLX=(mlx mlx-cpu mlx-lm)
out=.gpu
cache="${SPECFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specfleet}"

build_dir="" source=0 mlx=1
while [ $# -gt 0 ]; do
    case "$1" in
        --build) build_dir="${2:?--build needs the folder holding build.tar.xz.* parts}"; shift 2 ;;
        --source) source=1; shift ;;
        --no-mlx) mlx=0; shift ;;
        *) echo "device-payload: unknown argument '$1' (--build DIR, --source, --no-mlx)" >&2; exit 2 ;;
    esac
done
if [ -n "$build_dir" ] && ! ls "$build_dir"/build.tar.xz.* >/dev/null 2>&1; then
    echo "device-payload: --build $build_dir holds no build.tar.xz.* parts (what bench/h200.sh pack returns)" >&2
    exit 2
fi
[ -z "$build_dir" ] && [ ! -d "$out/build" ] && source=1  # nothing to unpack: the call builds

# The locked version of each distribution named, "name==version" per line.
locked() {
    python3 - "$@" <<'PY'
import sys, tomllib
versions = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
missing = [n for n in sys.argv[1:] if n not in versions]
if missing:
    sys.exit(f"device-payload: uv.lock locks no {', '.join(missing)}")
print("\n".join(f"{n}=={versions[n]}" for n in sys.argv[1:]))
PY
}

# Wheels of the locked versions for the device's Python, unpacked into one site tar.xz.
site() {
    local name="$1" wheels stage
    shift
    wheels="$cache/device-wheels/py$DEVICE_PYTHON"
    mkdir -p "$wheels"
    local platform_args=()
    for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
    # shellcheck disable=SC2046
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
        --python-version "$DEVICE_PYTHON" --implementation cp "${platform_args[@]}" \
        -d "$wheels" $(locked "$@") 2> >(grep -v "is ignored: it is neither" >&2)
    stage="$(mktemp -d)"
    for spec in $(locked "$@"); do
        local dist="${spec%%==*}" version="${spec##*==}" wheel
        wheel="$(ls "$wheels"/"${dist//-/_}"-"$version"-*.whl 2>/dev/null | head -1)"
        [ -n "$wheel" ] || { echo "device-payload: no wheel of $spec in $wheels" >&2; exit 1; }
        python3 -m zipfile -e "$wheel" "$stage"
    done
    find "$stage" -name __pycache__ -prune -exec rm -rf {} +
    tar -C "$stage" -cf - . | xz -T0 -6 >"$out/site-$name.tar.xz"
    rm -rf "$stage"
    echo "device-payload: site-$name.tar.xz: $(locked "$@" | tr '\n' ' ')"
}

# The locked llama-cpp-python's vendored llama.cpp, stripped, and its commit.
llama_source() {
    local url sha sdist work src
    read -r url sha < <(python3 - <<'PY'
import tomllib
pkg = next(p for p in tomllib.load(open("uv.lock", "rb"))["package"] if p["name"] == "llama-cpp-python")
print(pkg["sdist"]["url"], pkg["sdist"]["hash"].removeprefix("sha256:"))
PY
    )
    sdist="$cache/sdists/$(basename "$url")"
    if ! echo "$sha  $sdist" | sha256sum --check --quiet 2>/dev/null; then
        mkdir -p "$cache/sdists"
        curl -fsSL --retry 3 -o "$sdist.tmp" "$url"
        echo "$sha  $sdist.tmp" | sha256sum --check --quiet
        mv "$sdist.tmp" "$sdist"
    fi
    work="$(mktemp -d)"
    tar -xzf "$sdist" -C "$work"
    src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
    git -C "$src" rev-parse --short=7 HEAD 2>/dev/null >"$out/llama.cpp.commit" ||
        sed -n 's/.*"commit": *"\([0-9a-f]\{7\}\).*/\1/p' "$src/../../llama_cpp/__init__.py" >"$out/llama.cpp.commit" || true
    [ -s "$out/llama.cpp.commit" ] || { echo "device-payload: cannot tell the commit of $src" >&2; exit 1; }
    # scripts/ stays: tools/ui (a dependency of llama-server) runs scripts/ui-assets.cmake even with the UI off
    rm -rf "$src"/{.git,models,docs,tests,examples,media,gguf-py,.devops,ci,benches,prompts,grammars,pocs}
    for backend in "$src"/ggml/src/ggml-*/; do
        case "$(basename "$backend")" in ggml-cpu | ggml-cuda) ;; *) rm -rf "$backend" ;; esac
    done
    tar -C "$src/.." -cf - llama.cpp | xz -T0 -6 >"$out/llama.cpp-src.tar.xz"
    rm -rf "$work"
    echo "device-payload: llama.cpp-src.tar.xz: $(basename "$url"), commit $(cat "$out/llama.cpp.commit")"
}

mkdir -p "$out"
rm -f "$out"/site-*.tar.xz
if [ "$source" = 1 ]; then llama_source; else rm -f "$out/llama.cpp-src.tar.xz" "$out/llama.cpp.commit"; fi

package="$(.venv/bin/python -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent)')"
rm -rf "$out/py" && mkdir -p "$out/py"
cp -r "$package" "$out/py/" && rm -rf "$out/py/llama_cpp/lib"
cp -r "$package"/../llama_cpp_python-*.dist-info "$out/py/"
find "$out/py" -name __pycache__ -prune -exec rm -rf {} +
echo "device-payload: py/: llama_cpp $(sed -n 's/^Version: //p' "$out"/py/llama_cpp_python-*.dist-info/METADATA) with its dist-info"

site core "${CORE[@]}"
site pydantic "${PYDANTIC[@]}"
[ "$mlx" = 1 ] && site mlx "${MLX[@]}"

if [ -n "$build_dir" ]; then
    rm -rf "$out/build" && mkdir -p "$out/build"
    cp "$build_dir"/build.tar.xz.* "$out/build/"
fi
[ -d "$out/build" ] && echo "device-payload: build/: $(ls "$out/build" | tr '\n' ' ')"

payload=$(du -sb "$out" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "device-payload: $out is $(mib "$payload"), the working tree $(mib "$tree"): $(mib $((payload + tree))) of the $(mib $LIMIT_BYTES) a call carries"
if [ $((payload + tree)) -gt $LIMIT_BYTES ]; then
    echo "device-payload: REFUSED: over the limit; leave the source out (a packed build needs none) or --no-mlx" >&2
    exit 1
fi

#!/usr/bin/env bash
# The runs on the lent NVIDIA H200 machine (bench/README.md, "NVIDIA H200"), from the repository
# root there, with what .gpu/ carries: made on this machine by scripts/device-payload.sh (its header
# says what it holds: the stripped llama.cpp source of the lock or the CUDA build a `pack` stage
# returned, llama-cpp-python's package with its dist-info, and the locked wheels for the device's
# Python unpacked into .gpu/site-*.tar.xz). The machine reaches no network, and everything on it is
# gone 30 s after a call. Everything printed goes to $OUT/log.txt.
#   bench/h200.sh check     what the runs import, their versions, and the engines the agent would enrol with
#   bench/h200.sh capture   nvidia-smi, NVML and powercap readings into $OUT (tests/captured/)
#   bench/h200.sh build     scripts/build-llama-cpp.sh with SPECFLEET_ACCEL=cuda for sm_90 (about 5 min on 16
#                           cores), with the image's own CC/CXX/CUDAHOSTCXX, and what the build links (NCCL)
#   bench/h200.sh pack      that build into $OUT, in 15 MB parts
#   bench/h200.sh unpack    a build packed by an earlier call, from .gpu/build/, checked again
#   bench/h200.sh crash     issue 28's crash, tried as a user would: protobuf first, numpy first, nothing first
#   bench/h200.sh lossless  bench/h200/lossless.py: our greedy arms against the baseline, in place and through the chain
#   bench/h200.sh parity    bench/h200/parity.py: our greedy baseline against llama-server's, setting by setting
#   bench/h200.sh fadiag    bench/h200/fa_diag.py: the tiny model with flash attention, ours against llama-bench
#                           by threads and threading settings (its head size has no CUDA flash-attention kernel)
#   bench/h200.sh tiny      the tiny models alone
#   bench/h200.sh models    the tiny models (deterministic: the same digests as anywhere) and bench/shaped.py's
#   bench/h200.sh tests     the project's engine tests on the GPU (tests/test_engines.py, its MTP, n-gram
#                           and server-parity ones, the energy, fingerprint and build-check tests)
#   bench/h200.sh overhead  bench/overhead.py (SmolLM2-135M's layers for the 49k and 151k models)
#   bench/h200.sh sweep     the demo's sweeps through a coordinator and an agent (bench/gpu_sweep.py) into $OUT/sweep
#                           (SWEEP_NAMES: some of them; SWEEP_SECONDS: its deadline; OVERHEAD_ARGS: overhead's flags)
set -uo pipefail
started=$(date +%s)  # stages that run long stop before the call's CALL_SECONDS (default 570) run out
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 SPECFLEET_CACHE=/tmp/specfleet-cache NCCL_NVLS_ENABLE=0
export PYTHONPATH="$PWD:$PWD/.gpu/py:/tmp/site" SPECFLEET_TINY_DIR=/tmp/tiny SHAPED=/tmp/shaped
mkdir -p /tmp/site
for site in .gpu/site*.tar.xz; do tar -xJf "$site" -C /tmp/site || echo "h200: $site unpack failed"; done
sha=$(python3 -c 'import tomllib; p=[p for p in tomllib.load(open("uv.lock","rb"))["package"] if p["name"]=="llama-cpp-python"][0]; print(p["sdist"]["hash"][7:23])')
build="$SPECFLEET_CACHE/llama.cpp/$sha-cuda"
export LLAMA_CPP_LIB_PATH="$build/bin" PATH="$build/bin:$PATH"
left() { echo $(( ${CALL_SECONDS:-570} - $(date +%s) + started )); }
for stage in "$@"; do
    echo "=== $stage $(date -u +%T) ($(left) s left)"
    if [ "$(left)" -lt 45 ]; then echo "h200: $stage skipped: the call's time is nearly out"; continue; fi
    case "$stage" in
    check)
        python3 - <<'PY'
import importlib, importlib.metadata as md, sys
print("python", sys.version.split()[0])
for module, dist in (("duckdb", "duckdb"), ("grpc", "grpcio"), ("google.protobuf", "protobuf"), ("pydantic", "pydantic"),
                     ("pydantic_core", "pydantic-core"), ("gguf", "gguf"), ("numpy", "numpy"), ("mlx.core", "mlx"),
                     ("mlx_lm", "mlx-lm"), ("transformers", "transformers"), ("llama_cpp", "llama-cpp-python")):
    try:
        importlib.import_module(module)
        where = "imports"
    except Exception as e:
        where = f"DOES NOT IMPORT: {type(e).__name__}: {e}"
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        version = "NO METADATA"
    print(f"  {module:16} {dist} {version}: {where}")
from agent.fingerprint import available_engines, engine_problems
print("engines the agent enrols with:", available_engines())
for engine, problem in engine_problems().items():
    print(f"  {engine}: {problem}")
PY
        ;;
    capture)
        {
            nvidia-smi
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,power.limit,power.max_limit,pci.bus_id --format=csv,noheader,nounits
            ls -la /sys/class/powercap/ 2>&1
            python3 -m pip list 2>/dev/null | grep -iE '^(grpcio|protobuf|numpy|pyarrow|pandas|pyyaml|scipy|prometheus|nvidia-ml-py|tokenizers|safetensors|duckdb) '
            nproc; uname -r
        } >"$OUT/captures.txt" 2>&1 ;;
    build)
        mkdir -p /tmp/src && tar -xJf .gpu/llama.cpp-src.tar.xz -C /tmp/src  # scripts/device-payload.sh
        echo "image compilers: CC=${CC:-} CXX=${CXX:-} CUDAHOSTCXX=${CUDAHOSTCXX:-}"
        for c in "${CXX:-c++}" /usr/bin/g++; do
            echo "$c: $("$c" --version 2>&1 | head -1); libstdc++.so: $("$c" -print-file-name=libstdc++.so)"
        done
        SPECFLEET_ACCEL=cuda SPECFLEET_CUDA_ARCHITECTURES=90-real CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
            SPECFLEET_LLAMA_SRC=/tmp/src/llama.cpp SPECFLEET_LLAMA_COMMIT="$(cat .gpu/llama.cpp.commit)" \
            scripts/build-llama-cpp.sh || echo "h200: BUILD FAILED ($?)"
        ls -la "$build/bin"; cat "$build/version.txt"
        scripts/build-llama-cpp.sh --check "$build/bin" dynamic; echo "check status $?"
        echo "ldd libggml-cuda.so:"; ldd "$build/bin/libggml-cuda.so" | grep -iE 'nccl|stdc|cudart|cublas|gcc_s|not found'
        readelf -d "$build/bin/libggml-cuda.so" | grep -E 'RUNPATH|RPATH' ;;
    pack)
        tar -C "$SPECFLEET_CACHE/llama.cpp" -cf - "$sha-cuda" | xz -T0 -6 | split -b 15M - "$OUT/build.tar.xz."
        ls -la "$OUT"/build.tar.xz.* ;;
    unpack)
        mkdir -p "$SPECFLEET_CACHE/llama.cpp" .data
        cat .gpu/build/build.tar.xz.* | xz -d -T0 | tar -x -C "$SPECFLEET_CACHE/llama.cpp"
        ln -sfn "$build" .data/llama.cpp
        scripts/build-llama-cpp.sh --check "$build/bin" dynamic >/dev/null; echo "check status $?" ;;
    crash)
        python3 -m cli.tiny "$SPECFLEET_TINY_DIR" >/dev/null
        for first in google._upb._message numpy ""; do
            timeout 60 python3 -X faulthandler - "$first" "$SPECFLEET_TINY_DIR/gguf/target.gguf" <<'PY' 2>&1 | tail -4
import importlib, sys
first, model = sys.argv[1:]
if first:
    importlib.import_module(first)
from agent.engines import make_engine
from agent.engines.base import Request
engine = make_engine("llama.cpp")
engine.load(model)
gen = engine.generate(Request(engine.tokenize("Speculative decoding"), 16))
print(f"{first or 'nothing'} imported first: loaded and generated on {engine.backend()}: {gen.tokens[:8]}")
PY
            echo "status ${PIPESTATUS[0]}"
        done ;;
    lossless)
        timeout 60 python3 bench/h200/lossless.py "$SPECFLEET_TINY_DIR" ;;
    parity)
        timeout 150 python3 bench/h200/parity.py "$SPECFLEET_TINY_DIR" ;;
    fadiag)
        timeout $(( $(left) - 20 )) python3 bench/h200/fa_diag.py "$SPECFLEET_TINY_DIR" --rounds "${ROUNDS:-3}" ;;
    tiny)
        python3 -m cli.tiny "$SPECFLEET_TINY_DIR" >/dev/null ;;
    models)
        python3 -m cli.tiny "$SPECFLEET_TINY_DIR" >/dev/null
        python3 bench/shaped.py "$SHAPED" --trunk smol ;;
    tests)
        timeout $(( $(left) > 300 ? 240 : $(left) - 60 )) python3 -X faulthandler -m pytest -q -rfE -p no:cacheprovider \
            -o addopts="" tests/test_engines.py tests/test_llamacpp_mtp.py tests/test_mtp_agreement.py \
            tests/test_ngram_drafters.py tests/test_server_parity.py \
            tests/test_energy.py tests/test_fingerprint.py tests/test_build_check.py 2>&1 | tail -40
        echo "pytest status ${PIPESTATUS[0]}" ;;
    overhead)
        timeout $(( $(left) - 20 )) python3 bench/overhead.py --models "$SPECFLEET_TINY_DIR" --shaped "$SHAPED" \
            --trunk "${TRUNK:-smol}" --repeats "${REPEATS:-7}" ${OVERHEAD_ARGS:-} ;;
    sweep)
        budget=$(( ${SWEEP_SECONDS:-$(( $(left) - 30 ))} ))
        timeout $(( budget + 25 )) python3 bench/gpu_sweep.py --models "$SPECFLEET_TINY_DIR" --out "${SWEEP_OUT:-$OUT/sweep}" \
            --deadline "$budget" --sweeps "${SWEEP_NAMES:-}" ;;
    esac
done
echo "=== end $(date -u +%T)"

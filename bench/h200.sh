#!/usr/bin/env bash
# The runs on the lent NVIDIA H200 machine (bench/README.md, "NVIDIA H200"), from the repository
# root there, with what .gpu/ carries (git-excluded: the llama.cpp source of the lock, stripped of
# models, docs, tests and other backends; llama-cpp-python's Python package, from this machine's
# .venv; wheels the image lacks or has too old: duckdb, gguf, grpcio, grpcio-health-checking,
# diskcache). The machine reaches no network, and everything on it is gone 30 s after a call.
#   bench/h200.sh capture   nvidia-smi, NVML and powercap readings into $OUT (tests/captured/)
#   bench/h200.sh build     scripts/build-llama-cpp.sh with SPECFLEET_ACCEL=cuda for sm_90 (5.5 min, 16 cores)
#   bench/h200.sh pack      that build into $OUT, in 15 MB parts
#   bench/h200.sh models    the tiny models (deterministic: the same digests as anywhere)
#   bench/h200.sh tests     the accelerator's tests on the GPU: tests/test_energy.py, test_fingerprint.py
#   bench/h200.sh overhead  bench/overhead.py and llama-bench on the tiny models
#   bench/h200.sh sweep     the demo's llama.cpp sweeps through a coordinator and an agent (bench/gpu_sweep.py)
set -uo pipefail
started=$(date +%s)  # the sweep exports what is done before the call's CALL_SECONDS (default 570) run out
export PYTHONUNBUFFERED=1 SPECFLEET_CACHE=/tmp/specfleet-cache
export PYTHONPATH="$PWD:$PWD/.gpu/py:/tmp/site" SPECFLEET_TINY_DIR=/tmp/tiny
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl $(ls .gpu/whl2/*.whl 2>/dev/null) >/dev/null 2>&1 || echo "h200: wheel install failed"
sha=$(python3 -c 'import tomllib; p=[p for p in tomllib.load(open("uv.lock","rb"))["package"] if p["name"]=="llama-cpp-python"][0]; print(p["sdist"]["hash"][7:23])')
build="$SPECFLEET_CACHE/llama.cpp/$sha-cuda"
export LLAMA_CPP_LIB_PATH="$build/bin" PATH="$build/bin:$PATH"
for stage in "$@"; do
    echo "=== $stage $(date -u +%T)"
    case "$stage" in
    capture)
        {
            nvidia-smi
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,power.limit,power.max_limit,pci.bus_id --format=csv,noheader,nounits
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,power.limit --format=csv
            nvidia-smi --help-query-gpu | grep -iE '^"(cuda|driver|clocks.max|power|enforced)' | head -30
            ls -la /sys/class/powercap/ 2>&1; find /sys/class/powercap/ -maxdepth 2 -name 'energy_uj' -exec sh -c 'echo {}; cat {}' \; 2>&1 | head
            python3 -m pip list 2>/dev/null | grep -iE '^(grpcio|protobuf|numpy|pyarrow|pandas|pyyaml|scipy|prometheus|nvidia-ml-py|tokenizers|safetensors|duckdb) '
            nproc; uname -r
        } >"$OUT/captures.txt" 2>&1
        nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1
        python3 .gpu/nvml_probe.py >>"$OUT/captures.txt" 2>&1 ;;
    build)
        mkdir -p /tmp/src && tar -xJf .gpu/llama.cpp-src.tar.xz -C /tmp/src
        SPECFLEET_ACCEL=cuda SPECFLEET_CUDA_ARCHITECTURES=90 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
            SPECFLEET_LLAMA_SRC=/tmp/src/llama_cpp_python-0.3.36/vendor/llama.cpp SPECFLEET_LLAMA_COMMIT=0c1e570 \
            scripts/build-llama-cpp.sh
        ls -la "$build/bin"; cat "$build/version.txt"
        mkdir -p .data && ln -sfn "$build" .data/llama.cpp ;;
    pack)
        tar -C "$SPECFLEET_CACHE/llama.cpp" -cJf - "$sha-cuda" | split -b 15M - "$OUT/build.tar.xz." ;;
    models)
        python3 -m specfleet.tinymodels "$SPECFLEET_TINY_DIR" >/dev/null ;;
    tests)
        timeout 120 python3 -X faulthandler -m pytest -v -p no:cacheprovider tests/test_energy.py tests/test_fingerprint.py \
            >"$OUT/tests.txt" 2>&1; echo "pytest status $?"; grep -E "PASS|FAIL|SKIP|Fatal|File \"/work|rror" "$OUT/tests.txt" | head -40 ;;
    overhead)
        for m in target draft mtp-hybrid; do
            for fa in 0 1; do
                llama-bench -m "$SPECFLEET_TINY_DIR/gguf/$m.gguf" -p 0 -n 128 -ngl 99 -fa $fa -t 8 -r 5 2>&1 | grep -E 'tg128'
            done
        done
        timeout 240 python3 bench/overhead.py --models "$SPECFLEET_TINY_DIR" --repeats 7 2>&1 | tee "$OUT/overhead.txt" ;;
    sweep)
        left=$(( ${CALL_SECONDS:-570} - $(date +%s) + started - 30 ))
        timeout $(( left + 25 )) python3 bench/gpu_sweep.py --models "$SPECFLEET_TINY_DIR" --out "$OUT" \
            --deadline "$left" 2>&1 | tee "$OUT/sweep.txt" ;;
    esac
done
echo "=== end $(date -u +%T)"

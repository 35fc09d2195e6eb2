#!/usr/bin/env bash
# Everything specfleet needs on a fresh machine, idempotent and quick the second time:
# uv (pinned), the locked environment in .venv (llama-cpp-python is built from source once;
# uv keeps the built wheel in its cache, so later syncs reuse it), llama-server and llama-bench
# built from the same llama.cpp source (scripts/build-llama-cpp.sh, cached likewise), and the
# tiny models. SPECFLEET_ACCEL=cuda builds llama.cpp for NVIDIA GPUs (scripts/build-llama-cpp.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}"

# Debian packages the tests drive for real: Prometheus scrapes a coordinator in
# tests/test_prometheus.py; headless Chromium renders the dashboard in tests/test_browser.py.
APT_PACKAGES=(prometheus chromium)
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
if [ -z "$uv_bin" ] || [ "$("$uv_bin" --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    echo "setup: installing uv $UV_VERSION"
    python3 -m pip install --quiet --user "uv==$UV_VERSION"
    uv_bin="$(python3 -m site --user-base)/bin/uv"
fi

# --frozen: install exactly the lock file, never re-resolve.
"$uv_bin" sync --frozen --quiet
scripts/build-llama-cpp.sh
.venv/bin/specfleet models make-tiny .data/tiny >/dev/null

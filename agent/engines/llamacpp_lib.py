"""Which llama.cpp library the in-process engine loads, and which compute backend it runs on.

llama-cpp-python loads the library it bundles (a CPU build on Linux, Metal on a Mac) unless
LLAMA_CPP_LIB_PATH names another directory. scripts/build-llama-cpp.sh with SPECFLEET_ACCEL=cuda
leaves a shared CUDA build of the same llama.cpp commit, libllama.so beside llama-server, in
.data/llama.cpp/bin: `use_project_build()` points llama-cpp-python there (unless the variable is
already set) before llama_cpp is first imported, so the engine and llama-server run one build.
A CPU build of that script is static and holds no libllama.so: nothing changes then.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

PROJECT_BIN = Path(__file__).resolve().parents[2] / ".data" / "llama.cpp" / "bin"
CPUINFO = Path("/proc/cpuinfo")
LIB_PATH_VARIABLE = "LLAMA_CPP_LIB_PATH"
DEVICE_TYPE_CPU = 0  # enum ggml_backend_dev_type (ggml-backend.h): CPU, GPU, IGPU, ACCEL, META


def use_project_build(bin_dir: Path = PROJECT_BIN, environ=os.environ) -> Path | None:
    """Point llama-cpp-python at a shared build in `bin_dir`; the directory it will load from,
    or None where it keeps its own (no such build, or LLAMA_CPP_LIB_PATH already set)."""
    if LIB_PATH_VARIABLE in environ or not (bin_dir / "libllama.so").exists():
        return None
    environ[LIB_PATH_VARIABLE] = str(bin_dir)
    return bin_dir


def library_dir(package_dir: Path) -> Path:
    """The directory llama_cpp (installed in `package_dir`) loads its libraries from."""
    override = os.environ.get(LIB_PATH_VARIABLE)
    return Path(override) if override else package_dir / "lib"


def backend(ggml: ctypes.CDLL) -> str:
    """The backend of the first non-CPU device ggml registered ("cuda", "metal", ...), else "cpu".
    `ggml` is the loaded libggml; a CUDA build on a machine without a GPU registers no CUDA device."""
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(device) != DEVICE_TYPE_CPU:
            return ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(device)).decode().lower()
    return "cpu"


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has Intel AMX (Sapphire Rapids and later: `amx_int8` in /proc/cpuinfo's
    flags). ggml's CPU backend repacks quantised weights into an AMX buffer there, and its AMX
    matrix product segfaults in llama_decode on such machines (llama.cpp issue 20824, open
    upstream; seen here with SmolLM2's Q4_1 at a prompt-lookup verify): the engines then run
    without weight repacking (the in-process engine's use_extra_bufts off, llama-server's and
    llama-bench's --no-repack / --repack 0), both alike so that their figures stay comparable. False
    where there is no /proc/cpuinfo (a Mac: no AMX; Apple's matrix units are another thing)."""
    if cpuinfo is None:
        return _this_cpu_has_amx()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return "amx_int8" in line.partition(":")[2].split()
    return False


@functools.cache
def _this_cpu_has_amx() -> bool:
    """cpu_has_amx of this machine's /proc/cpuinfo, read once per process (every model load and
    server start asks)."""
    try:
        return cpu_has_amx(CPUINFO.read_text())
    except OSError:
        return False

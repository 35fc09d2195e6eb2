"""What machine this is. macOS readings come from sysctl, sw_vers and ioreg; Linux readings
from /proc and nvidia-smi (each NVIDIA GPU's model, memory, driver, CUDA version, maximum
clocks and power limit). Every reading that cannot be taken is listed as unavailable,
never guessed. Parsers are pure functions of command output so they can be tested on
captured text.

The chip is what the machine's runs are compared by: the Apple chip on a Mac, the CPU model on
Linux, and on a Linux machine with an NVIDIA GPU whose llama.cpp is a CUDA build (the engines'
forward passes run on the GPU there) the first GPU's model, "NVIDIA H200"; the host CPU's model
is then kept as the model_identifier.

A machine is its hardware, never its enrolment: `hardware_digest` is the SHA-256 of the ids
that no re-enrolment or reinstall of the agent changes (macOS: IOPlatformUUID; Linux: DMI
product_uuid, else /etc/machine-id, and each NVIDIA GPU's UUID). The raw ids never leave this
machine; the coordinator salts the digest with the fleet's own salt before it stores anything
(coordinator/agents.py machine_of), so two fleets cannot join their machines."""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from agent.engines.llamacpp_lib import library_dir
from protos.specfleet.v1 import fleet_pb2 as pb

# Memory bandwidth in GB/s by chip and GPU-core bin, from Apple's published specifications.
BANDWIDTH_GBPS = {
    ("Apple M1", 7): 68.25,
    ("Apple M1", 8): 68.25,
    ("Apple M1 Pro", 14): 200,
    ("Apple M1 Pro", 16): 200,
    ("Apple M1 Max", 24): 400,
    ("Apple M1 Max", 32): 400,
    ("Apple M1 Ultra", 48): 800,
    ("Apple M1 Ultra", 64): 800,
    ("Apple M2", 8): 100,
    ("Apple M2", 10): 100,
    ("Apple M2 Pro", 16): 200,
    ("Apple M2 Pro", 19): 200,
    ("Apple M2 Max", 30): 400,
    ("Apple M2 Max", 38): 400,
    ("Apple M2 Ultra", 60): 800,
    ("Apple M2 Ultra", 76): 800,
    ("Apple M3", 8): 100,
    ("Apple M3", 10): 100,
    ("Apple M3 Pro", 14): 150,
    ("Apple M3 Pro", 18): 150,
    ("Apple M3 Max", 30): 300,
    ("Apple M3 Max", 40): 400,
    ("Apple M3 Ultra", 60): 819,
    ("Apple M3 Ultra", 80): 819,
    ("Apple M4", 8): 120,
    ("Apple M4", 10): 120,
    ("Apple M4 Pro", 16): 273,
    ("Apple M4 Pro", 20): 273,
    ("Apple M4 Max", 32): 410,
    ("Apple M4 Max", 40): 546,
    ("Apple M5", 10): 153,
}


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl key key ...` output ("key: value" lines) as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_ioreg_gpu_cores(text: str) -> int | None:
    """`ioreg -rc AGXAccelerator -d 1` output: the "gpu-core-count" property."""
    m = re.search(r'"gpu-core-count"\s*=\s*(\d+)', text)
    return int(m.group(1)) if m else None


def parse_cpuinfo_model(text: str) -> str | None:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return None


def parse_meminfo_bytes(text: str) -> int | None:
    m = re.search(r"^MemTotal:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


# What the fingerprint asks nvidia-smi of each GPU, in this order (parse_nvidia_smi's fields).
NVIDIA_SMI_QUERY = (
    "name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,power.limit,power.max_limit,pci.bus_id,uuid"
)
NVIDIA_UUID_FIELD = 8  # the query's ninth field: "GPU-8a0e..." (an older capture may lack it)


def parse_nvidia_smi(text: str, cuda: str = "") -> list[str]:
    """`nvidia-smi --query-gpu=NVIDIA_SMI_QUERY --format=csv,noheader,nounits` output: one line
    per GPU, "NVIDIA H200, 143771 MiB, driver 580.159.04, CUDA 13.0, SM 1980 MHz, memory 3201 MHz,
    power limit 700 W". `cuda` is the driver's CUDA version (parse_nvidia_smi_cuda). A value
    nvidia-smi reports as "[N/A]" or "[Not Supported]" is left out, never guessed."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6 or not fields[0]:
            continue
        name, memory, driver, sm, mem_clock, power = fields[:6]
        parts = [name]
        known = [
            (memory, "{} MiB"),
            (driver, "driver {}"),
            (cuda, "CUDA {}"),
            (sm, "SM {} MHz"),
            (mem_clock, "memory {} MHz"),
            (_watts(power), "power limit {} W"),
        ]
        parts += [form.format(value) for value, form in known if value and not value.startswith("[")]
        gpus.append(", ".join(parts))
    return gpus


def parse_nvidia_gpu_uuids(text: str) -> list[str]:
    """The GPU UUIDs ("GPU-...") of NVIDIA_SMI_QUERY's output, one per GPU that reports one."""
    fields = (line.split(",") for line in text.splitlines())
    return [f[NVIDIA_UUID_FIELD].strip() for f in fields if len(f) > NVIDIA_UUID_FIELD and f[NVIDIA_UUID_FIELD].strip()]


def parse_ioreg_platform_uuid(text: str) -> str | None:
    """`ioreg -rd1 -c IOPlatformExpertDevice` output: the "IOPlatformUUID" property."""
    m = re.search(r'"IOPlatformUUID"\s*=\s*"([^"]+)"', text)
    return m.group(1) if m else None


def hardware_digest(ids: list[str]) -> str:
    """The SHA-256 (hex) of a machine's hardware ids ("kind:value", order-free), "" without any."""
    if not ids:
        return ""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def linux_hardware_ids(root: Path, gpu_uuids: list[str]) -> list[str]:
    """The board's DMI product_uuid (readable by root only on most systems), else the OS's
    /etc/machine-id, and every NVIDIA GPU's UUID: what tells this Linux machine from another."""
    ids = []
    for kind, path in (("product_uuid", "sys/class/dmi/id/product_uuid"), ("machine-id", "etc/machine-id")):
        try:
            value = (root / path).read_text().strip()
        except OSError:
            continue
        if value:
            ids.append(f"{kind}:{value.lower()}")
            break
    return ids + [f"gpu:{u}" for u in gpu_uuids]


def parse_nvidia_smi_cuda(text: str) -> str:
    """The "CUDA Version: 13.0" of plain `nvidia-smi` output's header, or ""."""
    m = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return m.group(1) if m else ""


def gpu_model(gpu: str) -> str:
    """The model name of a parse_nvidia_smi entry: "NVIDIA H200, 143771 MiB, ..." -> "NVIDIA H200"."""
    return gpu.split(",", 1)[0].strip()


def _watts(text: str) -> str:
    try:
        return f"{float(text):g}"
    except ValueError:
        return text


def run_command(cmd: list[str]) -> str | None:
    """A command's standard output, or None when the command is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def llama_cpp_commit() -> str | None:
    """The llama.cpp commit of the ggml library llama-cpp-python loads (its own, or the build
    LLAMA_CPP_LIB_PATH names), read without importing llama_cpp, which would load the backend."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for lib in sorted(library_dir(Path(location)).glob("*ggml-base*")):
            try:
                ggml = ctypes.CDLL(str(lib))
                ggml.ggml_commit.restype = ctypes.c_char_p
                return ggml.ggml_commit().decode()
            except (OSError, AttributeError):
                continue
    return None


def cuda_build() -> bool:
    """Whether the llama.cpp that llama-cpp-python loads (its own, or the build LLAMA_CPP_LIB_PATH
    names) has ggml's CUDA backend library, read without importing llama_cpp."""
    spec = importlib.util.find_spec("llama_cpp")
    locations = spec.submodule_search_locations if spec is not None else None
    return any(any(library_dir(Path(where)).glob("libggml-cuda*")) for where in locations or ())


# The in-process engines this checkout is installed with (pyproject's dependencies): the modules
# each imports and the distributions whose versions its runs record.
IN_PROCESS_ENGINES = {
    "mlx": (("mlx.core", "mlx_lm"), ("mlx", "mlx-lm")),
    "llama.cpp": (("llama_cpp",), ("llama-cpp-python",)),
}
IMPORT_PROBE_SECONDS = 120.0
ROOT = Path(__file__).resolve().parents[1]


def engine_versions() -> dict[str, str]:
    out = {}
    for dist in ("mlx", "mlx-lm", "llama-cpp-python"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    if "llama-cpp-python" in out and (commit := llama_cpp_commit()):
        out["llama.cpp.commit"] = commit
    return out


def import_problem(modules: tuple[str, ...]) -> str:
    """Why `modules` do not import in a fresh Python process (this one's interpreter and
    environment; llama.cpp pointed at this checkout's build as the engines point it), or ""
    where they do. A child process, because a native library that fails to load can take the
    process with it, and importing the engines' libraries here would load them for nothing."""
    code = (
        "import importlib, sys\n"
        "from agent.engines.llamacpp_lib import use_project_build\n"
        "use_project_build()\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException as e:\n"
        "        sys.exit(f'{name} does not import: {type(e).__name__}: {e}')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *modules],
            capture_output=True,
            text=True,
            timeout=IMPORT_PROBE_SECONDS,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return f"{', '.join(modules)} did not import within {IMPORT_PROBE_SECONDS:g} s"
    if done.returncode == 0:
        return ""
    lines = (done.stderr.strip() or f"exited with status {done.returncode}").splitlines()
    return lines[-1] if lines[-1].startswith(modules) else f"{', '.join(modules)} do not import: {lines[-1]}"


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that does not import
        return False


def engine_problems(engines: dict = IN_PROCESS_ENGINES, probe=import_problem) -> dict[str, str]:
    """Why each in-process engine cannot run on this machine, by name; engines that can run are
    absent. An engine runs where its distributions have installed metadata (its runs record their
    versions, and the fingerprint's engine_versions come from it), its native module imports and
    its other modules are installed: a
    package copied without its dist-info imports but reports no version, and one whose native
    library will not load has metadata but does not import; both are named here, with the import
    error, instead of the engine simply missing from enrolment."""
    problems = {}
    for engine, (modules, dists) in engines.items():
        missing = []
        for dist in dists:
            try:
                importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                missing.append(dist)
        reasons = [f"no installed metadata (dist-info) for {', '.join(missing)}"] if missing else []
        # The first module holds the native library, imported in a child; the rest are pure
        # Python, found without importing them (mlx_lm's import takes seconds: transformers).
        if problem := probe(modules[:1]):
            reasons.append(problem)
        reasons += [f"{m} is not installed (no module of that name)" for m in modules[1:] if not _found(m)]
        if reasons:
            problems[engine] = "; ".join(reasons)
    return problems


def available_engines(llama_server: Path | None = None, problems: dict[str, str] | None = None) -> list[str]:
    """The engines this machine runs, as enrolment tells the coordinator: the in-process ones
    without a problem (engine_problems, unless given), llama-server where a binary is found
    (`llama_server`, the agent's --llama-server; else PATH; else this checkout's build), and
    openai, a client that needs only what its jobs' command templates name."""
    from agent.engines.llama_server import find_binary  # cheap: no engine library is imported

    problems = engine_problems() if problems is None else problems
    engines = [engine for engine in IN_PROCESS_ENGINES if engine not in problems]
    binary = find_binary(str(llama_server) if llama_server else None)
    if binary is not None and os.access(binary, os.X_OK):
        engines.append("llama-server")
    return engines + ["openai"]


def fingerprint(platform: str = sys.platform, run=None, root: Path = Path("/"), cuda=cuda_build) -> pb.Fingerprint:
    """This machine's fingerprint; `run` (a command runner), `root` and `cuda` (whether llama.cpp
    is a CUDA build) let tests feed captured output."""
    run = run or run_command
    fp = pb.Fingerprint(hostname=socket.gethostname(), cpu_cores=os.cpu_count() or 0, engine_versions=engine_versions())
    if platform == "darwin":
        _macos(fp, run)
    else:
        _linux(fp, run, root, cuda)
    return fp


def _macos(fp: pb.Fingerprint, run=run_command) -> None:
    fp.os = "macos"
    fp.os_version = (run(["sw_vers", "-productVersion"]) or "").strip()
    keys = [
        "machdep.cpu.brand_string",
        "hw.memsize",
        "hw.model",
        "hw.perflevel0.physicalcpu",
        "hw.perflevel1.physicalcpu",
    ]
    values = parse_sysctl(run(["sysctl", *keys]) or "")
    fp.chip = values.get("machdep.cpu.brand_string", "")
    fp.memory_bytes = _int(values.get("hw.memsize"))
    fp.model_identifier = values.get("hw.model", "")
    fp.performance_cores = _int(values.get("hw.perflevel0.physicalcpu"))
    fp.efficiency_cores = _int(values.get("hw.perflevel1.physicalcpu"))
    fp.gpu_cores = parse_ioreg_gpu_cores(run(["ioreg", "-rc", "AGXAccelerator", "-d", "1"]) or "") or 0
    platform_uuid = parse_ioreg_platform_uuid(run(["ioreg", "-rd1", "-c", "IOPlatformExpertDevice"]) or "")
    fp.hardware_digest = hardware_digest([f"IOPlatformUUID:{platform_uuid}"] if platform_uuid else [])
    bandwidth = BANDWIDTH_GBPS.get((fp.chip, fp.gpu_cores))
    if bandwidth:
        fp.memory_bandwidth_bytes_per_second = bandwidth * 1e9
    for name, missing in [
        ("os_version", not fp.os_version),
        ("chip", not fp.chip),
        ("memory", not fp.memory_bytes),
        ("model_identifier", not fp.model_identifier),
        ("gpu_cores", not fp.gpu_cores),
        ("performance_cores", not fp.performance_cores),
        ("efficiency_cores", not fp.efficiency_cores),
        ("memory_bandwidth", not bandwidth),
        ("hardware_id", not fp.hardware_digest),
    ]:
        if missing:
            fp.unavailable.append(name)


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _linux(fp: pb.Fingerprint, run=run_command, root: Path = Path("/"), cuda=cuda_build) -> None:
    fp.os = platform.system().lower() or "linux"
    fp.os_version = platform.release()
    cpuinfo = (root / "proc/cpuinfo").read_text() if (root / "proc/cpuinfo").exists() else ""
    meminfo = (root / "proc/meminfo").read_text() if (root / "proc/meminfo").exists() else ""
    fp.chip = parse_cpuinfo_model(cpuinfo) or platform.processor() or ""
    fp.memory_bytes = parse_meminfo_bytes(meminfo) or 0
    smi = run(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"])
    if smi:
        fp.gpus.extend(parse_nvidia_smi(smi, parse_nvidia_smi_cuda(run(["nvidia-smi"]) or "")))
    fp.hardware_digest = hardware_digest(linux_hardware_ids(root, parse_nvidia_gpu_uuids(smi or "")))
    if fp.gpus and cuda():  # the runs are the GPU's: it names the chip (module docstring)
        fp.model_identifier, fp.chip = fp.chip, gpu_model(fp.gpus[0])
    # Apple-only readings do not exist here: say so instead of reporting zeros as facts.
    fp.unavailable.extend(["gpu_cores", "performance_cores", "efficiency_cores", "memory_bandwidth"])
    if not fp.model_identifier:
        fp.unavailable.append("model_identifier")
    if not fp.chip:
        fp.unavailable.append("chip")
    if not fp.memory_bytes:
        fp.unavailable.append("memory")
    if not fp.hardware_digest:
        fp.unavailable.append("hardware_id")

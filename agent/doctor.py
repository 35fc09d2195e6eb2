"""`specfleet agent doctor`: should this machine measure now? Each check gives a verdict (ok,
warn, fail, unavailable), what it saw and, when it is not ok, how to fix it; a failed check
makes the command exit non-zero.

Readings reuse agent/environment.py (pmset, sysctl and vm_stat on macOS, /proc and /sys on
Linux) and agent/fingerprint.py; other processes' CPU use and free disk come from psutil. A
macOS-only check on another platform says "not available on this platform"; a reading that
cannot be taken is unavailable, never a guess. The coordinator checks call AgentService.Ping
with the agent's stored credential: the coordinator's answer says whether it is reachable and
the credential valid, and its timestamp gives the clock offset.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from agent import environment
from agent.config import load_field
from agent.credentials import AgentIdentity
from agent.engines.base import EngineError
from agent.engines.llama_server import find_binary, read_version, version_label
from agent.environment import UNAVAILABLE
from agent.fingerprint import IN_PROCESS_ENGINES, engine_versions, run_command
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet import client as api

OK, WARN, FAIL, NOT_AVAILABLE = "ok", "warn", "fail", "unavailable"
NOT_HERE = "not available on this platform"
CPU_SHARE_LIMIT = 0.25  # of the whole machine's CPU, by any one other process
CPU_SAMPLE_SECONDS = 1.0
DISK_FAIL_BYTES = 2 * 2**30  # a spool and a model's hash cache need room; models need far more
DISK_WARN_BYTES = 20 * 2**30
CLOCK_WARN_SECONDS = 1.0  # runs' start times are the agent's clock; the dashboard orders them
CLOCK_FAIL_SECONDS = 30.0
PING_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # OK | WARN | FAIL | NOT_AVAILABLE
    detail: str
    fix: str = ""


# ---------------------------------------------------------------- machine


@dataclass(frozen=True)
class Busy:
    pid: int
    name: str
    share: float  # of the whole machine's CPU, 0..1


def busy_processes(
    exclude: set[int],
    seconds: float = CPU_SAMPLE_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    limit: float = CPU_SHARE_LIMIT,
) -> list[Busy]:
    """Processes (but `exclude`) that used more than `limit` of the machine's CPU over `seconds`,
    busiest first."""
    procs = [p for p in psutil.process_iter(["name"]) if p.pid not in exclude]
    for p in procs:
        try:
            p.cpu_percent(None)  # starts each process's interval
        except psutil.Error:
            pass
    sleep(seconds)
    cores = psutil.cpu_count() or 1
    busy = []
    for p in procs:
        try:
            share = p.cpu_percent(None) / 100.0 / cores
        except psutil.Error:  # gone, or not ours to read
            continue
        if share > limit:
            busy.append(Busy(p.pid, p.info["name"] or "?", share))
    return sorted(busy, key=lambda b: -b.share)


def check_cpu(busy: list[Busy]) -> Check:
    if not busy:
        return Check("other processes", OK, f"none uses more than {CPU_SHARE_LIMIT:.0%} of the CPU")
    named = ", ".join(f"{b.name} (pid {b.pid}) {b.share:.0%}" for b in busy[:5])
    return Check(
        "other processes",
        FAIL,
        f"{named} of the CPU",
        "quit or pause them before measuring: they compete with the benchmark for cores and memory bandwidth",
    )


def check_swap(sample: environment.Sample) -> Check:
    used = sample.get("swap_used_bytes", UNAVAILABLE)
    if used == UNAVAILABLE:
        return Check("swap", NOT_AVAILABLE, "swap use could not be read")
    if int(used) == 0:
        return Check("swap", OK, "no swap in use")
    return Check(
        "swap",
        WARN,
        f"{int(used) / 2**20:.0f} MiB of swap in use",
        "close memory-hungry applications (or restart) so that models are not paged out while measuring",
    )


def check_disk(paths: list[Path]) -> Check:
    """The least free space among `paths` (a path not made yet: the disk it will be made on)."""
    free = {}
    for path in paths:
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        try:
            free[existing] = psutil.disk_usage(str(existing)).free
        except (OSError, TypeError):  # unreadable, or nothing of it exists
            continue
    if not free:
        return Check("free disk", NOT_AVAILABLE, "no disk found for " + ", ".join(map(str, paths)))
    path, least = min(free.items(), key=lambda item: item[1])
    detail = f"{least / 2**30:.1f} GiB free at {path}"
    if least < DISK_FAIL_BYTES:
        return Check("free disk", FAIL, detail, f"free at least {DISK_FAIL_BYTES / 2**30:.0f} GiB there")
    if least < DISK_WARN_BYTES:
        return Check("free disk", WARN, detail, "models and their servers' logs need room: free some space")
    return Check("free disk", OK, detail)


def check_power_source(sample: environment.Sample) -> Check:
    source = sample.get("power_source", UNAVAILABLE)
    if source == UNAVAILABLE:
        return Check("power source", NOT_AVAILABLE, "the power source could not be read")
    if source in ("ac", "no-battery"):
        return Check("power source", OK, "AC power" if source == "ac" else "no battery (mains)")
    if source == "battery":
        return Check("power source", FAIL, "on battery", "plug the Mac in: on battery the agent starts no job")
    return Check("power source", WARN, f"on {source} power", "run on mains power: runs are flagged as not nominal")


def check_low_power(sample: environment.Sample, platform: str) -> Check:
    mode = sample.get("low_power_mode", UNAVAILABLE)
    if mode == UNAVAILABLE:
        return Check("low-power mode", NOT_AVAILABLE, NOT_HERE if platform != "darwin" else "pmset shows no such mode")
    if mode == "on":
        return Check(
            "low-power mode",
            FAIL,
            "on",
            "turn it off (System Settings > Battery > Low Power Mode, or `sudo pmset -a lowpowermode 0`)",
        )
    return Check("low-power mode", OK, "off")


def check_power_mode(sample: environment.Sample, platform: str, has_high_power: bool) -> Check:
    """The energy mode runs are recorded with (a checked key). On a Mac that has High Power Mode,
    Automatic is a warning: the same Mac has been reported 2.5-3x faster in High Power."""
    mode = sample.get("power_mode", UNAVAILABLE)
    if mode == UNAVAILABLE:
        return Check("power mode", NOT_AVAILABLE, NOT_HERE if platform != "darwin" else "pmset shows no power mode")
    detail = f"{mode} (recorded on every run; runs of different modes are never pooled)"
    if mode in ("low", "low-power"):
        return Check("power mode", FAIL, detail, "choose Automatic or High Power: Low Power slows the chip down")
    if platform == "darwin" and mode == "automatic" and has_high_power:
        return Check(
            "power mode",
            WARN,
            detail,
            "for the fastest figures choose High Power (System Settings > Battery > Energy Mode, or "
            "`sudo pmset -a powermode 2`); keep one mode for runs you mean to compare",
        )
    return Check("power mode", OK, detail)


def check_thermal(sample: environment.Sample) -> Check:
    state = sample.get("thermal", UNAVAILABLE)
    if state == UNAVAILABLE:
        return Check("thermal state", NOT_AVAILABLE, "no thermal reading here")
    if state == "nominal":
        return Check("thermal state", OK, "nominal")
    return Check("thermal state", FAIL, state, "let the machine cool down (and give it air) before measuring")


def check_thermal_pressure(sample: environment.Sample, platform: str) -> Check:
    """thermald's pressure level (agent/environment.py): the SoC's, GPU included, which pmset's CPU
    limit does not show; anything but nominal fails, as the protocol flags such a run."""
    level = sample.get("thermal_pressure", UNAVAILABLE)
    if level == UNAVAILABLE:
        return Check("thermal pressure", NOT_AVAILABLE, NOT_HERE if platform != "darwin" else "notifyutil gave none")
    if level == "nominal":
        return Check("thermal pressure", OK, "nominal")
    return Check(
        "thermal pressure",
        FAIL,
        f"{level}: macOS is throttling the SoC (GPU included)",
        "let the machine cool down (and give it air) before measuring",
    )


# ---------------------------------------------------------------- software


def check_engines(versions: dict[str, str], import_module: Callable = importlib.import_module) -> list[Check]:
    """One check per in-process engine: its libraries import, and their distributions report
    versions (fingerprint.engine_problems: without either the agent enrols without the engine)."""
    checks = []
    for engine, (modules, dists) in IN_PROCESS_ENGINES.items():
        try:
            for module in modules:
                import_module(module)
        except Exception as e:  # an import error, or a native library that will not load
            checks.append(
                Check(
                    f"engine {engine}",
                    FAIL,
                    f"{module} does not import: {type(e).__name__}: {e}",
                    "reinstall specfleet's dependencies (`uv sync`); jobs for this engine are refused meanwhile",
                )
            )
            continue
        missing = [dist for dist in dists if dist not in versions]
        if missing:
            checks.append(
                Check(
                    f"engine {engine}",
                    FAIL,
                    f"{', '.join(modules)} import, but {', '.join(missing)} has no installed metadata (dist-info): "
                    "its runs would record no version, so the agent enrols without this engine",
                    "install the distribution with its dist-info (`uv sync`; scripts/device-payload.sh copies it)",
                )
            )
            continue
        shown = {k: v for k, v in versions.items() if k.startswith(engine.split(".")[0])}
        checks.append(Check(f"engine {engine}", OK, " ".join(f"{k} {v}" for k, v in sorted(shown.items()))))
    return checks


def metal_device() -> str | None:
    """The Metal device's name as MLX sees it, or None when MLX has no Metal device."""
    import mlx.core as mx

    if not mx.metal.is_available():
        return None
    info = mx.metal.device_info()
    return str(info.get("device_name") or info.get("architecture") or "Metal device")


def check_metal(platform: str, probe: Callable[[], str | None] = metal_device) -> Check:
    if platform != "darwin":
        return Check("Metal device", NOT_AVAILABLE, NOT_HERE)
    try:
        device = probe()
    except Exception as e:
        return Check("Metal device", FAIL, f"MLX could not query Metal: {type(e).__name__}: {e}", "reinstall mlx")
    if device is None:
        return Check("Metal device", FAIL, "MLX sees no Metal device", "run the agent in a logged-in user session")
    return Check("Metal device", OK, device)


def check_llama_server(binary: Path | None) -> Check:
    """The llama-server that llama-server jobs would run, and its version."""
    if binary is None:
        return Check(
            "engine llama-server",
            WARN,
            "no llama-server found (not on PATH, none configured): llama-server jobs are refused",
            "`brew install llama.cpp`, or give `specfleet agent run` --llama-server PATH",
        )
    try:
        version = version_label(read_version(binary))
    except EngineError as e:
        return Check("engine llama-server", FAIL, str(e), "reinstall or rebuild it")
    return Check("engine llama-server", OK, f"{binary} {version}")


def check_model_dirs(dirs: list[Path], problem: str | None) -> Check:
    """`problem`: why the configured directories could not be had (agent/config.py, field model_dirs)."""
    if problem is not None:
        return Check("model directories", FAIL, problem, "create it, or enrol (or run) with the right --model-dir")
    if not dirs:
        return Check(
            "model directories",
            WARN,
            "none configured: jobs may name model files anywhere on this machine",
            "give `specfleet agent run` (or enrol) --model-dir DIR",
        )
    unreadable = [d for d in dirs if not os.access(d, os.R_OK | os.X_OK)]
    if unreadable:
        return Check(
            "model directories",
            FAIL,
            "not readable: " + ", ".join(map(str, unreadable)),
            "give the agent's user read access (chmod u+rx)",
        )
    return Check("model directories", OK, ", ".join(map(str, dirs)) + " readable")


# ---------------------------------------------------------------- coordinator


def check_coordinator(config_dir: Path, clock: Callable[[], float] = time.time) -> list[Check]:
    """Reachable and the credential valid, then the clock offset from the coordinator's answer."""
    try:
        identity = AgentIdentity.load(config_dir)
    except (OSError, ValueError) as e:
        return [Check("coordinator", FAIL, str(e), "enrol: `specfleet agent enrol --coordinator HOST:PORT --token T`")]
    client = api.AgentApi(api.channel(identity.coordinator, **identity.tls_files()), identity.credential)
    try:
        resp, offset, within = clock_offset(client, clock)
    except grpc.RpcError as e:
        code = e.code()
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return [
                Check(
                    "coordinator",
                    FAIL,
                    f"{identity.coordinator} refused the credential of {identity.name}: {e.details()}",
                    "enrol again with a new token (`specfleet token create` on the coordinator's host)",
                )
            ]
        return [
            Check(
                "coordinator",
                FAIL,
                f"{identity.coordinator} unreachable: {code.name}: {e.details()}",
                "start the coordinator, or check the address and the network (and TLS files) in agent.json",
            )
        ]
    finally:
        client.close()
    checks = [Check("coordinator", OK, f"{identity.coordinator} knows this agent as {resp.name} ({resp.agent_id})")]
    detail = f"{offset:+.3f} s from the coordinator's (within {within:.3f} s)"
    fix = CLOCK_FIX
    if abs(offset) > CLOCK_FAIL_SECONDS:
        checks.append(Check("clock offset", FAIL, detail, fix + "; the agent starts no job meanwhile"))
    elif abs(offset) > CLOCK_WARN_SECONDS:
        checks.append(Check("clock offset", WARN, detail, fix))
    else:
        checks.append(Check("clock offset", OK, detail))
    return checks


CLOCK_FIX = "turn on network time (System Settings > General > Date & Time, or `sudo timedatectl set-ntp true`)"
CLOCK_RECHECK_SECONDS = 300.0  # how often a running agent measures its clock's offset again


def clock_offset(client: api.AgentApi, clock: Callable[[], float] = time.time) -> tuple[pb.PingResponse, float, float]:
    """(the coordinator's Ping answer, this clock's offset from the coordinator's in seconds
    (positive: the coordinator's is ahead), the offset's uncertainty: half the round trip)."""
    sent = clock()
    resp = client.ping(PING_TIMEOUT_SECONDS)
    received = clock()
    return resp, resp.server_time_unix_seconds - (sent + received) / 2, (received - sent) / 2


def clock_hold(
    client: api.AgentApi, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
) -> Callable[[], str]:
    """The agent's clock check (Agent.clock_hold), asked before each job: why it holds its jobs
    (its clock more than CLOCK_FAIL_SECONDS off the coordinator's, beyond the measurement's
    uncertainty: every run it measured would carry impossible times), "" when it does not. The
    offset is measured again every CLOCK_RECHECK_SECONDS, and at every ask while it holds; a
    coordinator that does not answer the Ping holds nothing (the job's own calls fail anyway)."""
    last = {"at": -math.inf, "reason": ""}

    def reason() -> str:
        if last["reason"] or monotonic() - last["at"] >= CLOCK_RECHECK_SECONDS:
            try:
                _, offset, within = clock_offset(client, clock)
            except grpc.RpcError:
                return last["reason"]
            last["at"] = monotonic()
            off = abs(offset) - within > CLOCK_FAIL_SECONDS
            last["reason"] = (
                f"this clock is {-offset:+.1f} s off the coordinator's (at most {CLOCK_FAIL_SECONDS:g} s): {CLOCK_FIX}"
                if off
                else ""
            )
        return last["reason"]

    return reason


# ---------------------------------------------------------------- all


def has_high_power_mode(run=run_command) -> bool:
    """Whether this Mac's pmset offers `powermode` (Macs that have High Power Mode print it)."""
    return "powermode" in (run(["pmset", "-g"]) or "").replace("lowpowermode", "")


def run_checks(
    config_dir: Path, model_dir_flags: list[str], llama_server_flag: str | None, platform: str = sys.platform
) -> list[Check]:
    """Every check, in the order `report` prints them."""
    sample = environment.sample()
    try:
        dirs, problem = list(load_field("model_dirs", config_dir, {"model_dirs": model_dir_flags})), None
    except ValueError as e:
        dirs, problem = [], str(e)
    try:
        chosen = load_field("llama_server", config_dir, {"llama_server": llama_server_flag})
        binary = find_binary(str(chosen) if chosen else None)
        server = check_llama_server(binary)
    except ValueError as e:
        server = Check("engine llama-server", FAIL, str(e), "fix --llama-server or settings.json's llama_server")
    return [
        check_cpu(busy_processes({os.getpid()})),
        check_swap(sample),
        check_disk([config_dir, *dirs, Path.home() / ".cache" / "huggingface"]),
        check_power_source(sample),
        check_low_power(sample, platform),
        check_power_mode(sample, platform, platform == "darwin" and has_high_power_mode()),
        check_thermal(sample),
        check_thermal_pressure(sample, platform),
        *check_engines(engine_versions()),
        server,
        check_metal(platform),
        check_model_dirs(dirs, problem),
        *check_coordinator(config_dir),
    ]


def report(checks: list[Check]) -> str:
    """One line per check, its fix on the next line when it is not ok."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.verdict:11} {c.name:{width}}  {c.detail}")
        if c.fix and c.verdict in (WARN, FAIL):
            lines.append(f"{'':11} {'':{width}}  fix: {c.fix}")
    failed = sum(c.verdict == FAIL for c in checks)
    lines.append(f"{failed} check(s) failed" if failed else "no check failed")
    return "\n".join(lines)


# ---------------------------------------------------------------- the agent's hold

# The checks of what the machine is doing now, which the agent's poll loop runs before it asks
# for a job (agent/poll.py): a "fail" among them holds its jobs until it passes; `agent run
# --ignore-doctor` overrides. The software and coordinator checks are the operator's, at `agent
# doctor`: they do not change from one job to the next.


def machine_checks(
    paths: list[Path], exclude: set[int], sample: Callable[[], environment.Sample] = environment.sample
) -> list[Check]:
    """The machine-state checks: other processes on the CPU, swap, free disk at `paths`, thermal
    state and thermal pressure."""
    reading = sample()
    return [
        check_cpu(busy_processes(exclude)),
        check_swap(reading),
        check_disk(paths),
        check_thermal(reading),
        check_thermal_pressure(reading, sys.platform),
    ]


def hold_reason(checks: list[Check]) -> str:
    """Why the agent holds its jobs: its failed checks, on one line; "" when none failed."""
    failed = [f"{c.name}: {c.detail}" for c in checks if c.verdict == FAIL]
    return ("agent doctor fails: " + "; ".join(failed)) if failed else ""


def agent_hold(config_dir: Path, model_dirs: list[Path]) -> Callable[[], str]:
    """The agent's hold check (Agent.doctor_hold): machine_checks' hold_reason, the agent's own
    process and its children left out of the CPU check."""

    def reason() -> str:
        me = psutil.Process()
        exclude = {me.pid, *(p.pid for p in me.children(recursive=True))}
        return hold_reason(machine_checks([config_dir, *model_dirs], exclude))

    return reason

"""Was the machine quiet? Readings taken before and after every run, and the agent's rule for
not starting a job at all (on battery, in low-power mode).

Every reading is a string; one that cannot be taken here is "unavailable", never guessed.
`reading` turns a sample into the run record's typed `Environment` (None where unavailable).
macOS readings come from pmset, notifyutil (thermald's pressure level), sysctl and vm_stat;
Linux readings from /proc and /sys (under a root directory that tests point at a fake tree).
Parsers are pure functions of command output or file text, tested on captured output
(tests/captured/).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from agent.fingerprint import run_command
from specfleet.record import Environment

UNAVAILABLE = "unavailable"
KEYS = (
    "thermal",
    "thermal_pressure",
    "power_source",
    "low_power_mode",
    "power_mode",
    "loadavg_1m",
    "memory_available_bytes",
    "swap_used_bytes",
)
# pmset's `powermode N` (System Settings > Battery or Energy: Energy Mode), in Apple's words.
POWER_MODES = {0: "automatic", 1: "low", 2: "high"}
# thermald's pressure levels (OSThermalNotification.h, kOSThermalPressureLevel*), which it posts
# as `com.apple.system.thermalpressurelevel`: the level macOS throttles the SoC by, GPU included
# (powermetrics' "Current pressure level"); pmset's CPU_Speed_Limit speaks of the CPU only.
THERMAL_PRESSURE_KEY = "com.apple.system.thermalpressurelevel"
THERMAL_PRESSURE_LEVELS = {0: "nominal", 1: "moderate", 2: "heavy", 3: "trapping", 4: "sleeping"}
# A benchmark on a CPU backend keeps every core busy by itself, so a 1-minute load of one task
# per core is the measurement's own; half a core's worth of runnable work beyond that, on every
# core, is another process competing with it.
LOAD_PER_CORE_LIMIT = 1.5
MIN_AVAILABLE_MEMORY_FRACTION = 0.05
SWAP_GROWTH_LIMIT_BYTES = 64 * 2**20  # swapping this much during one run means memory pressure

Sample = dict[str, str]


# ---------------------------------------------------------------- macOS parsers


def parse_pmset_therm(text: str) -> str | None:
    """`pmset -g therm`: "nominal", "throttled: CPU_Speed_Limit=N", "warning: ..." or None."""
    limits = re.findall(r"CPU_Speed_Limit\s*=\s*(\d+)", text)
    if limits and int(limits[-1]) < 100:
        return f"throttled: CPU_Speed_Limit={limits[-1]}"
    warning = re.search(r"^.*(thermal|performance) warning level (?:set to|=)\s*(\d+).*$", text, re.M | re.I)
    if warning and int(warning.group(2)) > 0:
        return f"warning: {warning.group(1).lower()} warning level {warning.group(2)}"
    if limits or re.search(r"No thermal warning level has been recorded", text):
        return "nominal"
    return None


def parse_thermal_pressure(text: str) -> str | None:
    """`notifyutil -g com.apple.system.thermalpressurelevel` ("com.apple.system.thermalpressurelevel
    2"): the level's name, "level N" for one the header does not name, or None."""
    m = re.search(rf"^{re.escape(THERMAL_PRESSURE_KEY)}\s+(\d+)\s*$", text, re.M)
    if not m:
        return None
    return THERMAL_PRESSURE_LEVELS.get(int(m.group(1)), f"level {m.group(1)}")


def parse_pmset_batt(text: str) -> str | None:
    """`pmset -g batt`: "ac", "battery", "ups", "no-battery" or None."""
    m = re.search(r"Now drawing from '([^']+)'", text)
    if m:
        return {"AC Power": "ac", "Battery Power": "battery", "UPS Power": "ups"}.get(m.group(1), m.group(1).lower())
    if "No batteries available" in text:
        return "no-battery"
    return None


def parse_pmset_lowpowermode(text: str) -> str | None:
    """`pmset -g`: "on"/"off" from `lowpowermode N` (or `powermode N`, where 1 is low power)."""
    m = re.search(r"^\s*(?:lowpowermode|powermode)\s+(\d+)", text, re.M)
    if not m:
        return None
    return "on" if int(m.group(1)) == 1 else "off"


def parse_pmset_powermode(text: str) -> str | None:
    """`pmset -g`: the energy mode, "automatic", "low" or "high" (High Power Mode), from
    `powermode N`; a Mac without High Power Mode prints `lowpowermode N` only, whose modes are
    "low" and "automatic"; where both are printed, `lowpowermode 1` wins (low power is on).
    None when neither line is there."""
    low = re.search(r"^\s*lowpowermode\s+(\d+)", text, re.M)
    mode = re.search(r"^\s*powermode\s+(\d+)", text, re.M)
    if low and int(low.group(1)) == 1:
        return "low"
    if mode:
        return POWER_MODES.get(int(mode.group(1)), f"powermode {mode.group(1)}")
    return "automatic" if low else None


def _megabytes(value: str, unit: str) -> float:
    return float(value.replace(",", ".")) * {"K": 2**10, "M": 2**20, "G": 2**30}[unit.upper()]


def parse_swapusage(text: str) -> int | None:
    """`sysctl vm.swapusage`: bytes of swap in use."""
    m = re.search(r"used\s*=\s*([\d.,]+)([KMG])", text)
    return int(_megabytes(m.group(1), m.group(2))) if m else None


def parse_vm_stat_available(text: str) -> int | None:
    """`vm_stat`: bytes free, inactive or speculative (what can be had without swapping)."""
    page = re.search(r"page size of (\d+) bytes", text)
    if not page:
        return None
    total = 0
    found = False
    for label in ("Pages free", "Pages inactive", "Pages speculative"):
        m = re.search(rf"^{label}:\s+(\d+)\.", text, re.M)
        if m:
            total += int(m.group(1))
            found = True
    return total * int(page.group(1)) if found else None


# ---------------------------------------------------------------- Linux parsers


def parse_loadavg(text: str) -> float | None:
    """/proc/loadavg: the 1-minute load average."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes by field name."""
    out = {}
    for m in re.finditer(r"^(\w+):\s+(\d+)(?: kB)?$", text, re.M):
        out[m.group(1)] = int(m.group(2)) * 1024
    return out


def linux_power_source(supplies: dict[str, dict[str, str]]) -> str:
    """From /sys/class/power_supply/<name>/{type,online,status}: "ac", "battery" or "no-battery"."""
    if not supplies:
        return "no-battery"
    mains = [s for s in supplies.values() if s.get("type") in ("Mains", "USB", "USB_C", "USB_PD")]
    batteries = [s for s in supplies.values() if s.get("type") == "Battery"]
    if any(s.get("online") == "1" for s in mains):
        return "ac"
    if any(s.get("status") == "Discharging" for s in batteries):
        return "battery"
    if mains:  # mains supplies reported, none online
        return "battery" if batteries else UNAVAILABLE
    return "no-battery" if not batteries else UNAVAILABLE


def linux_thermal(zones: list[dict[str, str]]) -> str | None:
    """Zones with `temp` (millidegrees) and trip points {trip_point_N_type, trip_point_N_temp}:
    "nominal" unless a zone is at or above its lowest passive/hot trip point; None without zones."""
    readable = [z for z in zones if z.get("temp", "").lstrip("-").isdigit()]
    if not readable:
        return None
    for z in readable:
        temp = int(z["temp"])
        trips = [
            int(z[key.replace("_type", "_temp")])
            for key, kind in z.items()
            if key.endswith("_type")
            and kind in ("passive", "hot", "critical")
            and z.get(key.replace("_type", "_temp"), "").isdigit()
        ]
        if trips and temp >= min(trips):
            return f"hot: {z.get('type', 'zone')} at {temp / 1000:.1f} C (trip point {min(trips) / 1000:.1f} C)"
    return "nominal"


# ---------------------------------------------------------------- sampling


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _or_unavailable(value) -> str:
    if value is None:
        return UNAVAILABLE
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def sample_macos(run: Callable[[list[str]], str | None] = run_command) -> Sample:
    swap = run(["sysctl", "vm.swapusage"]) or ""
    settings = run(["pmset", "-g"]) or ""
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "thermal": _or_unavailable(parse_pmset_therm(run(["pmset", "-g", "therm"]) or "")),
        "thermal_pressure": _or_unavailable(
            parse_thermal_pressure(run(["notifyutil", "-g", THERMAL_PRESSURE_KEY]) or "")
        ),
        "power_source": _or_unavailable(parse_pmset_batt(run(["pmset", "-g", "batt"]) or "")),
        "low_power_mode": _or_unavailable(parse_pmset_lowpowermode(settings)),
        "power_mode": _or_unavailable(parse_pmset_powermode(settings)),
        "loadavg_1m": _or_unavailable(load),
        "memory_available_bytes": _or_unavailable(parse_vm_stat_available(run(["vm_stat"]) or "")),
        "swap_used_bytes": _or_unavailable(parse_swapusage(swap)),
    }


def sample_linux(root: Path = Path("/")) -> Sample:
    supplies = {}
    supply_dir = root / "sys/class/power_supply"
    if supply_dir.is_dir():
        for d in sorted(supply_dir.iterdir()):
            supplies[d.name] = {k: (_read(d / k) or "").strip() for k in ("type", "online", "status")}
    zones = []
    thermal_dir = root / "sys/class/thermal"
    if thermal_dir.is_dir():
        for d in sorted(thermal_dir.glob("thermal_zone*")):
            zones.append({f.name: (_read(f) or "").strip() for f in d.iterdir() if f.is_file()})
    profile = (_read(root / "sys/firmware/acpi/platform_profile") or "").strip()
    meminfo = parse_meminfo(_read(root / "proc/meminfo") or "")
    swap_used = meminfo["SwapTotal"] - meminfo["SwapFree"] if {"SwapTotal", "SwapFree"} <= meminfo.keys() else None
    return {
        "thermal": _or_unavailable(linux_thermal(zones)),
        "thermal_pressure": UNAVAILABLE,  # macOS thermald's; Linux's trip points are in "thermal"
        "power_source": linux_power_source(supplies) if supply_dir.is_dir() else UNAVAILABLE,
        "low_power_mode": ("on" if profile == "low-power" else "off") if profile else UNAVAILABLE,
        "power_mode": profile or UNAVAILABLE,  # the ACPI platform profile's own name ("balanced")
        "loadavg_1m": _or_unavailable(parse_loadavg(_read(root / "proc/loadavg") or "")),
        "memory_available_bytes": _or_unavailable(meminfo.get("MemAvailable")),
        "swap_used_bytes": _or_unavailable(swap_used),
    }


def sample() -> Sample:
    """The readings of this machine now."""
    return sample_macos() if sys.platform == "darwin" else sample_linux()


# ---------------------------------------------------------------- judgements


def not_nominal(s: Sample, cpu_count: int | None = None, memory_total_bytes: int | None = None) -> list[str]:
    """Reasons a single sample is not a quiet machine; [] when nominal or unknown."""
    reasons = []
    if s.get("thermal", UNAVAILABLE) not in ("nominal", UNAVAILABLE):
        reasons.append(f"thermal {s['thermal']}")
    if s.get("thermal_pressure", UNAVAILABLE) not in ("nominal", UNAVAILABLE):
        reasons.append(f"thermal pressure {s['thermal_pressure']} (the SoC, GPU included, is being throttled)")
    if s.get("power_source") in ("battery", "ups"):
        reasons.append(f"on {s['power_source']} power")
    if s.get("low_power_mode") == "on":
        reasons.append("low-power mode on")
    cpu_count = cpu_count or os.cpu_count()
    if cpu_count and s.get("loadavg_1m", UNAVAILABLE) != UNAVAILABLE:
        if float(s["loadavg_1m"]) > cpu_count * LOAD_PER_CORE_LIMIT:
            reasons.append(
                f"load average {s['loadavg_1m']} above {cpu_count * LOAD_PER_CORE_LIMIT:g} "
                f"({LOAD_PER_CORE_LIMIT:g} per core on {cpu_count} cores)"
            )
    if memory_total_bytes and s.get("memory_available_bytes", UNAVAILABLE) != UNAVAILABLE:
        if int(s["memory_available_bytes"]) < memory_total_bytes * MIN_AVAILABLE_MEMORY_FRACTION:
            reasons.append(f"only {int(s['memory_available_bytes']) / 2**20:.0f} MiB of memory available")
    return reasons


def power_mode(s: Sample) -> str | None:
    """The sample's power mode as the run record keeps it: None where unavailable."""
    mode = s.get("power_mode", UNAVAILABLE)
    return None if mode == UNAVAILABLE else mode


def reading(s: Sample) -> Environment:
    """A sample as the run record's typed reading: None where it was unavailable."""

    def value(key, cast):
        raw = s.get(key, UNAVAILABLE)
        return None if raw == UNAVAILABLE else cast(raw)

    return Environment(
        thermal=value("thermal", str),
        thermal_pressure=value("thermal_pressure", str),
        power_source=value("power_source", str),
        low_power_mode=value("low_power_mode", lambda v: v == "on"),
        loadavg_1m=value("loadavg_1m", float),
        memory_available_bytes=value("memory_available_bytes", int),
        swap_used_bytes=value("swap_used_bytes", int),
    )


# Readings without which a run cannot be called nominal: with any of them unavailable (and
# nothing else wrong) the run is unknown, not nominal.
DECIDING_KEYS = ("thermal", "power_source")


def judge(before: Sample, after: Sample, cpu_count=None, memory_total_bytes=None) -> tuple[bool | None, list[str]]:
    """(nominal, reasons) for one run: False with the reasons when a reading before or after
    was not quiet, the power mode changed or swap grew; None (unknown) when nothing was wrong but a deciding reading
    was unavailable; else True."""
    reasons = []
    for when, s in (("before", before), ("after", after)):
        reasons += [f"{when}: {r}" for r in not_nominal(s, cpu_count, memory_total_bytes)]
    modes = (before.get("power_mode", UNAVAILABLE), after.get("power_mode", UNAVAILABLE))
    if UNAVAILABLE not in modes and modes[0] != modes[1]:
        reasons.append(f"power mode changed from {modes[0]} to {modes[1]} during the run")
    swap = (before.get("swap_used_bytes", UNAVAILABLE), after.get("swap_used_bytes", UNAVAILABLE))
    if UNAVAILABLE not in swap:
        grown = int(swap[1]) - int(swap[0])
        if grown > SWAP_GROWTH_LIMIT_BYTES:
            reasons.append(f"swap grew by {grown / 2**20:.0f} MiB during the run")
    if reasons:
        return False, reasons
    if any(s.get(k, UNAVAILABLE) == UNAVAILABLE for s in (before, after) for k in DECIDING_KEYS):
        return None, []
    return True, []


def refusal_reason(s: Sample) -> str | None:
    """Why the agent should not start a job now (battery, low-power mode), or None."""
    if s.get("power_source") == "battery":
        return "on battery power: jobs start only on AC power (run the agent with --allow-battery to override)"
    if s.get("low_power_mode") == "on":
        return "low-power mode is on: jobs start only with it off (run the agent with --allow-battery to override)"
    return None

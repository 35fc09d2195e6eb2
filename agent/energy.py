"""Energy a run draws, from the machine's own cumulative energy counter.

Counters, tried in this order by `detect()`:

    nvml  NVIDIA's total-energy counter of every GPU (nvmlDeviceGetTotalEnergyConsumption,
          millijoules since the driver loaded), through the nvidia-ml-py package. On the lent
          H200 it advances every 100 ms (tests/captured/linux-h200-nvml-energy.txt).
    rapl  Linux RAPL package domains under /sys/class/powercap (intel-rapl:N/energy_uj,
          microjoules, wrapping at max_energy_range_uj), where this user may read them (recent
          kernels make energy_uj root-only).

    ioreport  macOS (Apple silicon): IOReport's "Energy Model" channels through zeus-apple-silicon
          (`AppleEnergyMonitor`, no sudo), read as a begin/end window around the run: CPU, GPU,
          ANE and DRAM energy apart, in millijoules. The run's energy is their sum; the parts
          are recorded beside it (energy_cpu_joules, ...). A part the chip does not report is
          None and left out of the sum (GPU SRAM, which the library reports apart, is not
          added). IOReport's values are Apple's model-based estimates at 1 mJ resolution (the
          library's README), system-wide like the other counters. Chosen over macmon-lib
          because it gives energy over the run's own window (joules, what energy per token
          needs) rather than power samples to integrate, and the DRAM channel too; the Zeus
          project keeps it.

`detect()` returns None on a machine where no counter is readable (and on a Mac without the
package), so a run records no energy rather than a guess.

A counter ticks coarsely (NVML every 100 ms, longer than a tiny model's run), so `Meter.measure`
waits for a tick before the run and for the first tick after it, and charges the run the average
power between those two ticks times its own duration. The counters cover the whole device or
package, not one process: other work on the machine in that window is counted too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

POWERCAP = Path("/sys/class/powercap")
TICK_TIMEOUT_SECONDS = 0.5  # a counter that has not moved for this long is stuck: no reading
POLL_SECONDS = 0.001

T = TypeVar("T")


@dataclass(frozen=True)
class Counter:
    """A cumulative energy counter: `read()` gives joules since some origin, never decreasing."""

    source: str  # specfleet/record.py ENERGY_SOURCES
    read: Callable[[], float]


def nvml_counter() -> Counter | None:
    """The sum of every NVIDIA GPU's energy counter, or None without NVML or a GPU that has one."""
    try:
        import pynvml  # nvidia-ml-py; absent on a Mac
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        for handle in handles:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # NVML_ERROR_NOT_SUPPORTED on older GPUs
    except pynvml.NVMLError:
        return None
    if not handles:
        return None
    return Counter("nvml", lambda: sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles) / 1000.0)


def rapl_domains(root: Path = POWERCAP) -> list[tuple[Path, int]]:
    """(energy_uj file, wrap range in microjoules) of each readable RAPL package domain
    (intel-rapl:N, not its sub-zones intel-rapl:N:M, which the package already counts)."""
    domains = []
    for zone in sorted(root.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:
            continue
        try:
            int((zone / "energy_uj").read_text())
            wrap = int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            continue  # unreadable by this user, or not a counter
        domains.append((zone / "energy_uj", wrap))
    return domains


def rapl_counter(root: Path = POWERCAP) -> Counter | None:
    """The sum of the RAPL package counters, unwrapped, or None where none is readable."""
    domains = rapl_domains(root)
    if not domains:
        return None
    last = [int(path.read_text()) for path, _ in domains]
    total = [0]

    def read() -> float:
        for i, (path, wrap) in enumerate(domains):
            now = int(path.read_text())
            total[0] += now - last[i] if now >= last[i] else now + wrap - last[i]
            last[i] = now
        return total[0] / 1e6

    return Counter("rapl", read)


def detect() -> Counter | IOReportWindows | None:
    """The first readable counter of this machine (IOReport, NVML, then RAPL), or None."""
    return ioreport_windows() or nvml_counter() or rapl_counter()


# AppleEnergyMetrics' fields (millijoules) -> the parts a run record keeps (joules).
IOREPORT_PARTS = {"cpu_total_mj": "cpu", "gpu_mj": "gpu", "ane_mj": "ane", "dram_mj": "dram"}


@dataclass(frozen=True)
class Energy:
    source: str
    joules: float
    parts: tuple[tuple[str, float], ...] = ()  # ("cpu", J), ("gpu", J), ...: IOReport's split

    def record_fields(self) -> dict[str, float]:
        """The run record's split fields (energy_cpu_joules, ...): those the counter gave."""
        return {f"energy_{part}_joules": joules for part, joules in self.parts}


class IOReportWindows:
    """zeus-apple-silicon's AppleEnergyMonitor: one begin/end window around each run. `monitor`
    is the library's object (the boundary the Linux tests replace)."""

    source = "ioreport"

    def __init__(self, monitor):
        self.monitor = monitor

    def measure(self, fn: Callable[[], T]) -> tuple[T, Energy | None]:
        self.monitor.begin_window("specfleet-run", restart=True)
        try:
            result = fn()
        finally:
            metrics = self.monitor.end_window("specfleet-run")
        return result, ioreport_energy(metrics)


def ioreport_energy(metrics) -> Energy | None:
    """An AppleEnergyMetrics window as the run's energy: the sum of the parts it reports, each
    in joules; None when it reports none."""
    parts = tuple(
        (part, getattr(metrics, field) / 1000.0)
        for field, part in IOREPORT_PARTS.items()
        if getattr(metrics, field, None) is not None
    )
    if not parts:
        return None
    return Energy("ioreport", sum(joules for _, joules in parts), parts)


def ioreport_windows() -> IOReportWindows | None:
    """IOReport's energy windows on an Apple-silicon Mac with zeus-apple-silicon, else None."""
    try:
        from zeus_apple_silicon import AppleEnergyMonitor  # only on macOS arm64 (pyproject.toml)
    except ImportError:
        return None
    try:
        return IOReportWindows(AppleEnergyMonitor())
    except RuntimeError:  # IOReport's energy group not there (a virtual machine)
        return None


class Meter:
    """Energy per run from one counter or IOReport's windows; `clock` and `sleep` are injectable
    for tests."""

    def __init__(self, counter: Counter | IOReportWindows | None, clock=time.perf_counter, sleep=time.sleep):
        self.counter, self.clock, self.sleep = counter, clock, sleep

    def _tick(self) -> tuple[float, float] | None:
        """(counter value, time) just after the counter next moves, or None if it does not."""
        first = self.counter.read()
        deadline = self.clock() + TICK_TIMEOUT_SECONDS
        while self.clock() < deadline:
            value = self.counter.read()
            if value != first:
                return value, self.clock()
            self.sleep(POLL_SECONDS)
        return None

    def measure(self, fn: Callable[[], T]) -> tuple[T, Energy | None]:
        """fn()'s result and the energy it drew: the average power between the counter's ticks
        before and after it, times fn's own duration. None without a counter or on a stuck one."""
        if self.counter is None:
            return fn(), None
        if isinstance(self.counter, IOReportWindows):  # a window of its own: no ticks to wait for
            return self.counter.measure(fn)
        before = self._tick()
        start = self.clock()
        result = fn()
        seconds = self.clock() - start
        after = self._tick() if before is not None else None
        if before is None or after is None or after[1] <= before[1] or after[0] < before[0]:
            return result, None
        watts = (after[0] - before[0]) / (after[1] - before[1])
        return result, Energy(self.counter.source, watts * seconds)

"""How steady was the machine's CPU while a benchmark ran?

A small process repeats one fixed piece of pure-Python work (about 0.14 ms) every 4 ms and
records the CPU time each piece took: about 4% of one core. On a steady machine every piece
costs about the same; when the machine itself slows down (other tenants of the host, clock
changes), pieces cost several times their median for a while, in every process at once. Such
slow spells set the tail latencies of anything measured beside them, so benchmarks print
them next to their p99.

    with NoiseProbe() as probe:  # started ahead: a spawned process takes a moment to start
        start = time.perf_counter()
        ...  # the measured run
        end = time.perf_counter()
    print(probe.summary(start, end))

Alone, `.venv/bin/python bench/noise.py --seconds 20` prints the same line for an idle machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from dataclasses import dataclass

PERIOD_SECONDS = 0.004
SLOW_FACTOR = 3.0  # a piece costing this many times the median is slow
SPELL_GAP_SECONDS = 0.05  # slow pieces closer than this belong to one spell


def _piece() -> int:
    total = 0
    for k in range(2500):
        total += k
    return total


def _probe(stop, results) -> None:
    samples = []  # (started at, CPU seconds the piece took)
    while not stop.is_set():
        at, cpu = time.perf_counter(), time.thread_time()
        _piece()
        samples.append((at, time.thread_time() - cpu))
        time.sleep(PERIOD_SECONDS)
    results.send(samples)


@dataclass(frozen=True)
class Noise:
    seconds: float
    pieces: int
    spells_ms: list[float]  # the length of each slow spell, first to last slow piece

    def summary(self) -> str:
        if not self.pieces:
            return "machine noise: not measured"
        if not self.spells_ms:
            return f"machine noise: no piece of fixed work took {SLOW_FACTOR:g}x its median in {self.seconds:.0f}s"
        slow = sum(self.spells_ms) / 1000
        return (
            f"machine noise: fixed work ran >= {SLOW_FACTOR:g}x slower in {len(self.spells_ms)} spells in "
            f"{self.seconds:.0f}s, median {statistics.median(self.spells_ms):.0f} ms, longest "
            f"{max(self.spells_ms):.0f} ms ({100 * slow / self.seconds:.1f}% of the time)"
        )


def analyse(samples: list[tuple[float, float]]) -> Noise:
    """Group the pieces that took SLOW_FACTOR times the median into spells."""
    if len(samples) < 2:
        return Noise(0.0, 0, [])
    median = statistics.median(cpu for _, cpu in samples)
    spells: list[list[float]] = []  # [first, last] start time of slow pieces
    for at, cpu in samples:
        if cpu < SLOW_FACTOR * median:
            continue
        if spells and at - spells[-1][1] < SPELL_GAP_SECONDS:
            spells[-1][1] = at + cpu
        else:
            spells.append([at, at + cpu])
    seconds = samples[-1][0] - samples[0][0]
    return Noise(seconds, len(samples), [(last - first) * 1000 for first, last in spells])


class NoiseProbe:
    """Runs the probe in its own process between `__enter__` and `__exit__`."""

    def __enter__(self) -> NoiseProbe:
        context = multiprocessing.get_context("spawn")  # no copy of the caller's threads or loop
        self._stop = context.Event()
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_probe, args=(self._stop, sender), daemon=True)
        self._process.start()
        self.samples: list[tuple[float, float]] = []
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._results.poll(30):
            self.samples = self._results.recv()
        self._process.join(timeout=10)

    def summary(self, start: float = float("-inf"), end: float = float("inf")) -> str:
        """The noise between `start` and `end` (time.perf_counter(): the same clock in every process)."""
        return analyse([(at, cpu) for at, cpu in self.samples if start <= at <= end]).summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with NoiseProbe() as probe:
        time.sleep(1)  # the probe's start-up
        start = time.perf_counter()
        time.sleep(args.seconds)
    print(probe.summary(start, start + args.seconds))


if __name__ == "__main__":
    main()

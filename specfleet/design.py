"""Arm orders balanced for carry-over: a Williams design.

Each row is one repeat's order of the arms. Over all rows every arm appears in every position
equally often and follows every other arm equally often, so that what one arm leaves behind
(heat, caches, memory) weighs on every other arm alike. An even number of arms needs n rows; an
odd number needs 2n (the rows and their mirror images). Written here because the construction is
a few lines and no statistics library we use ships it.
"""

from __future__ import annotations

import math


def williams(n: int) -> list[list[int]]:
    """Orders of arms 0..n-1, one per row: n rows for even n, 2n for odd n (one row for n = 1)."""
    if n < 1:
        raise ValueError(f"a design needs at least one arm, got {n}")
    if n == 1:
        return [[0]]
    # First row 0, 1, n-1, 2, n-2, ...; row r adds r to every entry (mod n).
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [list(reversed(row)) for row in rows]
    return rows


def rounded_repeats(repeats: int, arms: int) -> int:
    """The repeats a job runs: `repeats` rounded up to complete the design's rows."""
    rows = len(williams(arms))
    return math.ceil(repeats / rows) * rows

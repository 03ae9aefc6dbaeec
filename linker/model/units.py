"""Times and counts in words people read: "13.34 s", "14.35 ms", "850 µs". O(1) each."""

from __future__ import annotations

import math


def format_us(us: float, unit: str = "") -> str:
    """A duration given in µs, in the unit that keeps it readable: µs below 1 ms, ms below 10 s,
    else s ("13.34 s", "842.1 ms", "86 µs", "2.5 µs"). ``unit`` ("us", "ms", "s") forces one, with
    a fixed number of decimals, for columns that line up. NaN -> "n/a"."""
    if math.isnan(us):
        return "n/a"
    forced = bool(unit)
    unit = unit or unit_for(us)
    value = us / {"us": 1.0, "ms": 1_000.0, "s": 1_000_000.0}[unit]
    size = abs(value)
    if unit == "us":
        digits = 0 if size >= 10 or value == int(value) else 1
    elif forced:
        digits = 2
    else:
        digits = 2 if size < 100 else 1 if size < 1000 else 0
    return f"{value:,.{digits}f} {'µs' if unit == 'us' else unit}"


def unit_for(us: float) -> str:
    """The unit ``format_us`` would choose for ``us`` (to print a column in one unit)."""
    magnitude = abs(us)
    return "us" if magnitude < 1_000 else "ms" if magnitude < 10_000_000 else "s"

"""Times and counts in words people read: "13.34 s", "14.35 ms", "850 µs". O(1) each."""

from __future__ import annotations


def format_us(us: float, unit: str = "") -> str:
    """A duration given in µs, in the unit that keeps it readable: µs below 1 ms, ms below 10 s,
    else s; 4 significant digits at most ("13.34 s", "842.1 ms", "12.5 µs"). ``unit`` ("us", "ms",
    "s") forces one (for columns that should line up). NaN -> "n/a"."""
    if us != us:
        return "n/a"
    magnitude = abs(us)
    if not unit:
        unit = "us" if magnitude < 1_000 else "ms" if magnitude < 10_000_000 else "s"
    value = us / {"us": 1.0, "ms": 1_000.0, "s": 1_000_000.0}[unit]
    label = {"us": "µs", "ms": "ms", "s": "s"}[unit]
    size = abs(value)
    digits = 0 if size >= 1000 or size == 0 else 1 if size >= 100 else 2 if size >= 1 else 3
    if unit == "us" and size >= 100:
        digits = 0
    return f"{value:,.{digits}f} {label}"


def unit_for(us: float) -> str:
    """The unit ``format_us`` would choose for ``us`` (to print a column in one unit)."""
    magnitude = abs(us)
    return "us" if magnitude < 1_000 else "ms" if magnitude < 10_000_000 else "s"

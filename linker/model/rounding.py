"""Rounding to the nanosecond as Python's ``round(x, 3)`` does it, over numpy arrays.

The ET+ JSON writes a non-integral µs time rounded to 3 decimals; ``round_3`` gives, value for
value, the double ``round(x, 3)`` gives, for a whole column at once. Used by the build's exclusive
durations (``link.durations``) and the plan's JSON fields (``plan.json_fields``).
"""

from __future__ import annotations

import numpy as np


def round_3(x: np.ndarray) -> np.ndarray:
    """``round(v, 3)`` of each value, exactly as Python rounds it: the double nearest ``k / 1000``,
    k the integer nearest ``1000 v`` (ties to even) on v's exact binary value. A new array.

    Worked in integers: v = N * 2^(e-53) with N an integer below 2^53 (``frexp``), so
    1000 v = 125 N / 2^(50-e) and k is that quotient rounded. From 2^43 on a value is its own
    rounding (its neighbours lie 2^-9 > 0.001 away: epoch µs timestamps), and so are NaN and the
    infinities, as ``round`` leaves them; below 2^-13, 1000 v rounds to 0. O(n)."""
    rounded = np.array(x, dtype=np.float64)
    small = np.abs(rounded) < 2.0 ** 43  # False for NaN and the infinities
    values = rounded[small]
    mantissa, exponent = np.frexp(values)
    numerator = np.ldexp(mantissa, 53).astype(np.int64) * 125  # |.| < 2^60
    shift = np.clip(50 - exponent, 7, 62).astype(np.int64)  # 7 near 2^43, 62 below 2^-12
    quotient = numerator >> shift  # floor division by 2^shift
    remainder = numerator - (quotient << shift)
    half = np.left_shift(1, shift - 1)
    k = quotient + ((remainder > half) | ((remainder == half) & (quotient % 2 == 1)))
    near = k / 1000.0  # |k| < 2^53: exact, and the division rounds once
    near[np.abs(values) < 2.0 ** -13] = 0.0
    rounded[small] = np.copysign(near, values)  # a negative value rounding to 0 gives -0.0, as round does
    return rounded

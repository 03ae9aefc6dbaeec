"""``model.rounding.round_3`` against Python's own ``round(x, 3)``, value for value (the oracle is
the interpreter's correctly rounded decimal conversion, not a re-statement of the integer rule)."""

from __future__ import annotations

import math
import random

import numpy as np

from linker.model.rounding import round_3
from linker.plan.json_fields import _us, us_at


def _values(seed: int, count: int) -> list[float]:
    """Values of every kind the writers round: µs durations with more decimals than 3, decimals
    that end in 5 (halves in decimal, not in binary), exact binary halves of a ns, epoch-µs
    timestamps on both sides of 2^43, negatives, tiny values."""
    rng = random.Random(seed)
    makers = [
        lambda: rng.uniform(0, 1e4),
        lambda: round(rng.uniform(0, 1e4), 4),
        lambda: rng.randrange(-10**7, 10**7) / 2000,
        lambda: rng.uniform(1e12, 9e12),
        lambda: round(rng.uniform(4e12, 9e12), 4),
        lambda: rng.uniform(1.6e15, 1.8e15),
        lambda: -rng.uniform(0, 1e13),
        lambda: rng.uniform(-1e-2, 1e-2) * 10.0 ** -rng.randrange(0, 12),
        lambda: float(rng.randrange(0, 10**6)),
    ]
    return [rng.choice(makers)() for _ in range(count)]


EDGES = [0.0, -0.0, 0.0005, 0.0015, 0.0625, -0.0625, 2.675, 1.0005, 2.0 ** -13, 2.0 ** -14, 5e-4, -5e-4,
         2.0 ** 43, 2.0 ** 43 - 2.0 ** -10, 2.0 ** 42 + 2.0 ** -10, 1e300, -1e300, 5e-324]


def test_round_3_is_pythons_round_value_for_value():
    values = _values(1, 200_000) + EDGES
    got = round_3(np.array(values)).tolist()
    expected = [round(v, 3) for v in values]
    wrong = [(v, g, e) for v, g, e in zip(values, got, expected) if repr(g) != repr(e)]
    assert not wrong, wrong[:5]


def test_round_3_leaves_nan_and_the_infinities_as_round_does():
    got = round_3(np.array([math.nan, math.inf, -math.inf, 1.23456]))
    assert math.isnan(got[0]) and got[1] == math.inf and got[2] == -math.inf and got[3] == round(1.23456, 3)


def test_us_at_writes_what_the_one_value_rule_writes():
    """The JSON fields' column rounding (``us_at``, ints where integral, shared numbers where a
    column repeats) against ``_us`` a value at a time, types included."""
    values = _values(2, 50_000) + EDGES
    repeated = [random.Random(3).choice([0.0, 1.5, 2.0, 3.1234567, -0.0004]) for _ in range(50_000)]
    for column in (values, repeated):
        got = us_at(column, range(len(column)))
        assert [repr(v) for v in got] == [repr(_us(v)) for v in column]

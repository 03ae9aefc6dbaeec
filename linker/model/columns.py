"""Small operations over plain columns (lists of values), with their loops in C where possible.

Used by the matchers and the GPU attribution on columns of a million entries or more, where a
Python-level loop per entry is most of the cost.
"""

from __future__ import annotations

from itertools import islice
from operator import lt
from typing import Hashable, Sequence


def unique_positions(values: Sequence[Hashable], drop: tuple = (None,)) -> dict:
    """Value -> its position in ``values``, for the values that occur exactly once, leaving out
    those in ``drop`` (by equality: ``0`` also drops ``False``). Iteration follows first occurrence.

    O(n): two ``dict(zip(...))`` passes in C when every value is distinct, plus one Python pass
    over the distinct values when some repeat."""
    last = dict(zip(values, range(len(values))))
    if len(last) < len(values):  # some value repeats: keep those whose first position is the last
        first = dict(zip(reversed(values), range(len(values) - 1, -1, -1)))
        last = {value: position for value, position in last.items() if first[value] == position}
    for value in drop:
        last.pop(value, None)
    return last


def ascending(values: Sequence) -> bool:
    """True when each value is below the next (a column already in strict order, the usual case
    of start times and ids, which a caller then need not sort). O(n), one C pass."""
    return all(map(lt, values, islice(values, 1, None)))

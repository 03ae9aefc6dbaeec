"""Exclusive durations of Kineto CPU events.

``exclusive_dur`` = ``dur`` minus the union of the direct children's intervals (clipped to the
parent), never negative. Children arrive in start order, so the union is merged on the fly:
one pass, O(n).
"""

from __future__ import annotations

from typing import Sequence

from .kineto_reader import KinetoEvent


def exclusive_durations(events: Sequence[KinetoEvent], parents: Sequence[int]) -> list[float]:
    exclusive = [e.dur for e in events]
    covered_until = [e.ts for e in events]  # per parent: end of the children's union so far
    for i, event in enumerate(events):
        p = parents[i]
        if p < 0:
            continue
        parent = events[p]
        start = max(event.ts, covered_until[p])
        end = min(event.ts + event.dur, parent.ts + parent.dur)
        if end > start:
            exclusive[p] -= end - start
            covered_until[p] = end
    return [x if x > 0 else 0.0 for x in exclusive]

"""Exclusive durations of Kineto CPU events, and the nesting they rest on, in one sweep.

``exclusive_dur`` = ``dur`` minus the union of the direct children's intervals, never negative.
An event that outlasts its parent (an asynchronous collective's record that ends when the work
completes, long after the call that started it returned) is clipped to its parent's end, for its
own exclusive time and as a parent: the thread left it when its parent returned, and what the
thread ran next belongs to the ops enclosing that. Children arrive in start order, so the union is
merged on the fly.

``nest_cpu_events`` finds the nesting parents (the rule of ``intervals.nesting_parents``) and the
exclusive durations together, reading each event's fields once: on a large trace the attribute
reads of a few hundred thousand events are most of the cost. With those parents the direct
children of one event never overlap (a child starting inside an earlier sibling would be that
sibling's child), so each child's clipped length is subtracted as it comes. O(n).

The nesting of a whole trace's CPU events is computed once per link (``link.recipe.link``, or
beside the read by the Kineto child: ``schedule.kineto_child``) and passed on as a value.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from linker.model.rounding import round_3
from linker.read.kineto import KinetoEvent

_NEVER = float("inf")  # the end of the sweep's bottom sentinel: no event closes it


@dataclass
class CpuNesting:
    """Per Kineto CPU event: nesting parent (-1 at top level), exclusive duration, end
    (``ts + dur``). The end column serves later checks (the link's nesting check, the cover index)
    without reading the events again; it is a machine array (8 bytes an event: the nesting is kept
    with its trace)."""

    parents: list[int]
    exclusive: list[float]
    end: array
    # ``rounded_exclusive(exclusive)`` when it was made beside the reading (``schedule.kineto_child``,
    # on the core the parent does not use), else None: the ET+ build rounds what it writes.
    rounded: list[float] | None = None


def rounded_exclusive(exclusive: list[float]) -> list[float]:
    """Each exclusive duration rounded to 3 decimals (ns), as the ET+ writes a non-integral one
    (``round(x, 3)``, as ``model.rounding.round_3`` gives it for the column). O(n)."""
    return round_3(np.asarray(exclusive, dtype=np.float64)).tolist()


def nest_cpu_events(events: Sequence[KinetoEvent]) -> CpuNesting:
    """``nesting_parents(events)`` and the exclusive durations of ``events`` (sorted as
    ``cpu_events``) in one stack sweep. The stack holds (index, end) pairs below the open event
    ``top``; its bottom is a sentinel never closed."""
    parents: list[int] = []
    exclusive: list[float] = []
    ends: list[float] = []
    add_parent, add_exclusive, add_end = parents.append, exclusive.append, ends.append
    stack: list[tuple] = []
    push, pop = stack.append, stack.pop
    top, top_end = -1, _NEVER
    pid = tid = None
    for i, event in enumerate(events):
        start = event.ts
        dur = event.dur
        end = start + dur
        if event.tid != tid or event.pid != pid:  # a new thread: nothing open
            pid, tid = event.pid, event.tid
            stack.clear()
            top, top_end = -1, _NEVER
        # Touching ends: with integer-µs timestamps a zero-length event at its parent's last
        # microsecond reads ts == parent end; it is a child. A longer one there is a sibling.
        # (``stack`` empty: ``top`` is the sentinel, met only by an infinite start; kept.)
        while top_end < start or (top_end == start and dur > 0 and stack):
            top, top_end = pop()
        add_parent(top)
        add_end(end)
        if end > top_end:  # it outlasts its parent: the thread left it when the parent returned
            end = top_end
            dur = end - start
        add_exclusive(dur)
        if top >= 0:
            inside = end - start  # the child's time in its parent
            if inside > 0:
                exclusive[top] -= inside
        push((top, top_end))
        top, top_end = i, end
    if min(exclusive, default=1.0) <= 0:
        exclusive = [x if x > 0 else 0.0 for x in exclusive]
    return CpuNesting(parents, exclusive, array("d", ends))


def linked_ancestors(parents: Sequence[int], linked: np.ndarray) -> np.ndarray:
    """Per Kineto CPU event, its nearest enclosing event that an op is linked to (``linked``: a
    boolean per event), passing over events no op is linked to (-1: none). An op the ET lost
    (activation checkpointing recomputes the forward inside a backward op, and the ET lacks some of
    the recomputed ops Kineto holds, hanging their children under the backward op) is no event's
    parent here: what ran inside it ran inside the op around it. Array passes, one per level of
    unlinked events: O(n · depth)."""
    up = np.append(np.asarray(parents, dtype=np.int64), -1)  # [-1]: none
    flagged = np.append(np.asarray(linked, dtype=bool), False)
    above = up[:-1].copy()
    lost = (above >= 0) & ~flagged[above]
    while lost.any():
        above[lost] = up[above[lost]]
        lost = (above >= 0) & ~flagged[above]
    return above


def with_lost_time(exclusive: list[float], above: np.ndarray, linked: np.ndarray) -> list[float]:
    """``exclusive`` with the own time of each event no op is linked to (``linked``: a boolean per
    event) added to its nearest linked ancestor's (``above``: ``linked_ancestors``): the ET hangs
    a lost op's children under the op around it, so for the ET that op's own time is the enclosing
    op's exclusive time, and it lies where it ran, around those children. Unchanged (the same
    list) when no such event lies in a linked one. O(n)."""
    lost = np.flatnonzero(~np.asarray(linked, dtype=bool) & (above >= 0))
    if not len(lost):
        return exclusive
    total = np.asarray(exclusive, dtype=np.float64).copy()
    np.add.at(total, above[lost], total[lost])
    return total.tolist()

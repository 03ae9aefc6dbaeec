"""Interval structure of Kineto CPU events: threads, nesting, and "which op covers time t".

All functions take ``cpu_events`` sorted as ``KinetoTrace`` keeps them: by (pid, tid, ts, -dur).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

from linker.read.kineto import KinetoEvent

ThreadKey = tuple  # (pid, tid) of a Kineto thread

# Slack allowed when checking that one event's interval lies in another's (µs): float rounding.
NESTING_SLACK_US = 0.001


def lies_within(inner: KinetoEvent, outer: KinetoEvent, slack: float = NESTING_SLACK_US) -> bool:
    """True when ``inner``'s interval lies inside ``outer``'s, up to ``slack`` µs at each end."""
    return outer.ts - slack <= inner.ts and inner.ts + inner.dur <= outer.ts + outer.dur + slack


def group_by_thread(events: Sequence[KinetoEvent]) -> dict[ThreadKey, list[int]]:
    """Thread (pid, tid) -> indices of its events, in start order. O(n)."""
    threads: dict[ThreadKey, list[int]] = {}
    for i, event in enumerate(events):
        threads.setdefault((event.pid, event.tid), []).append(i)
    return threads


def nesting_parents(events: Sequence[KinetoEvent], skip: Sequence[bool] | None = None) -> list[int]:
    """Parent of each event: the innermost earlier event on the same thread still running at its
    start (a zero-length event at a parent's end included), an event that outlasts its own parent
    counting as ended with it (``durations``); -1 for a top-level event. Events with ``skip[i]`` true are neither parents nor given
    one (-1). One stack sweep per thread: O(n)."""
    parents = [-1] * len(events)
    stack: list[tuple[int, float]] = []  # (event, its end clipped to its parent's)
    key = None
    for i, event in enumerate(events):
        if (event.pid, event.tid) != key:
            key = (event.pid, event.tid)
            stack.clear()
        if skip is not None and skip[i]:
            continue
        start = event.ts
        while stack:
            end = stack[-1][1]
            # Touching ends: with integer-µs timestamps a zero-length event at its parent's last
            # microsecond reads ts == parent end; it is a child. A longer one there is a sibling.
            if end < start or (end == start and event.dur > 0):
                stack.pop()
            else:
                break
        end = start + event.dur
        if stack:
            parents[i] = stack[-1][0]
            end = min(end, stack[-1][1])  # an event that outlasts its parent encloses nothing after it
        stack.append((i, end))
    return parents


@dataclass(frozen=True)
class TimePoint:
    """A query: the thread and time of, e.g., a kernel launch."""

    pid: int | str
    tid: int | str
    ts: float


@dataclass
class CoverIndex:
    """What ``innermost_covering`` sweeps, kept: each thread's span of positions in the events
    (threads contiguous, starts ascending within one), every event's start and end, and
    ``below[e]``: the event under ``e`` on the sweep's stack when ``e`` was pushed (-1: none).
    The stack right after pushing ``e`` is then ``e, below[e], below[below[e]], ...``."""

    spans: dict[ThreadKey, tuple[int, int]]
    starts: list[float]
    ends: Sequence[float]
    below: list[int]


def cover_index(events: Sequence[KinetoEvent], ends: Sequence[float] | None = None) -> CoverIndex | None:
    """The ``CoverIndex`` of ``events`` (sorted per thread by start, as ``cpu_events``), or None
    when a thread's events are not contiguous (pid 1 and "1" sorted together). ``ends``: each
    event's ``ts + dur`` when already at hand (kept, not copied). One sweep: O(n)."""
    spans: dict[ThreadKey, tuple[int, int]] = {}
    starts = [event.ts for event in events]
    if ends is None:
        ends = [event.ts + event.dur for event in events]
    below = [-1] * len(events)
    key, first = None, 0
    stack: list[int] = []
    push, pop = stack.append, stack.pop
    for i, event in enumerate(events):
        if (event.pid, event.tid) != key:
            if key is not None:
                spans[key] = (first, i)
            key, first = (event.pid, event.tid), i
            if key in spans:
                return None
            stack.clear()
        start = starts[i]
        while stack and ends[stack[-1]] <= start:
            pop()
        if stack:
            below[i] = stack[-1]
        push(i)
    if key is not None:
        spans[key] = (first, len(events))
    return CoverIndex(spans, starts, ends, below)


def innermost_covering(events: Sequence[KinetoEvent], points: Sequence[TimePoint],
                       index: CoverIndex | None = None) -> list[int]:
    """For each point, the innermost event on its thread with ``ts <= point.ts <= ts + dur``, or -1.

    With an ``index`` of ``events`` (``cover_index``): per point a bisection among its thread's
    starts, then down the stack the sweep would hold until an event still running: O(q log n)
    plus the stack depths. Without: points and events are swept together per thread in time order
    (an event starting at the point's time covers it), O((n + q) log(n + q)).
    """
    if index is not None:
        return _covering_from_index(index, points)
    return _covering_by_sweep(events, points)


def _covering_from_index(index: CoverIndex, points: Sequence[TimePoint]) -> list[int]:
    spans, starts, ends, below = index.spans, index.starts, index.ends, index.below
    answer = []
    for point in points:
        span = spans.get((point.pid, point.tid))
        e = -1
        if span is not None:
            t = point.ts
            e = bisect_right(starts, t, span[0], span[1]) - 1
            if e < span[0]:
                e = -1
            while e >= 0 and ends[e] < t:
                e = below[e]
        answer.append(e)
    return answer


def _covering_by_sweep(events: Sequence[KinetoEvent], points: Sequence[TimePoint]) -> list[int]:
    by_thread: dict[ThreadKey, list[int]] = {}
    for q, point in enumerate(points):
        by_thread.setdefault((point.pid, point.tid), []).append(q)
    answer = [-1] * len(points)
    if not by_thread:
        return answer
    thread_events = group_by_thread(events)
    for key, queries in by_thread.items():
        indices = thread_events.get(key)
        if not indices:
            continue
        queries.sort(key=lambda q: points[q].ts)
        stack: list[int] = []
        e = 0
        for q in queries:
            t = points[q].ts
            while e < len(indices) and events[indices[e]].ts <= t:
                start = events[indices[e]].ts
                while stack and events[stack[-1]].ts + events[stack[-1]].dur <= start:
                    stack.pop()
                stack.append(indices[e])
                e += 1
            while stack and events[stack[-1]].ts + events[stack[-1]].dur < t:
                stack.pop()
            if stack:
                answer[q] = stack[-1]
    return answer

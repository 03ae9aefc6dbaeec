"""Interval structure of Kineto CPU events: threads, nesting, and "which op covers time t".

All functions take ``cpu_events`` sorted as ``KinetoTrace`` keeps them: by (pid, tid, ts, -dur).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .kineto_reader import KinetoEvent

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
    start (a zero-length event at a parent's end included); -1 for a top-level event. Events with ``skip[i]`` true are neither parents nor given
    one (-1). One stack sweep per thread: O(n)."""
    parents = [-1] * len(events)
    stack: list[int] = []
    key = None
    for i, event in enumerate(events):
        if (event.pid, event.tid) != key:
            key = (event.pid, event.tid)
            stack.clear()
        if skip is not None and skip[i]:
            continue
        start = event.ts
        while stack:
            end = events[stack[-1]].ts + events[stack[-1]].dur
            # Touching ends: with integer-µs timestamps a zero-length event at its parent's last
            # microsecond reads ts == parent end; it is a child. A longer one there is a sibling.
            if end < start or (end == start and event.dur > 0):
                stack.pop()
            else:
                break
        if stack:
            parents[i] = stack[-1]
        stack.append(i)
    return parents


@dataclass(frozen=True)
class TimePoint:
    """A query: the thread and time of, e.g., a kernel launch."""

    pid: int | str
    tid: int | str
    ts: float


def innermost_covering(events: Sequence[KinetoEvent], points: Sequence[TimePoint]) -> list[int]:
    """For each point, the innermost event on its thread with ``ts <= point.ts <= ts + dur``, or -1.

    Points and events are swept together per thread in time order (an event starting at the
    point's time covers it). O((n + q) log(n + q)).
    """
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

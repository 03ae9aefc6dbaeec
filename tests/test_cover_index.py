"""``intervals.innermost_covering`` from a ``CoverIndex`` against the per-call sweep and against
the definition (the innermost event of the point's thread with ts <= t <= ts + dur)."""

from __future__ import annotations

import random

import pytest

from linker.link.durations import nest_cpu_events
from linker.link.intervals import TimePoint, cover_index, innermost_covering
from linker.read.kineto import KinetoEvent, cpu_event_order


def _nested_events(rng: random.Random, threads: list[tuple], per_thread: int, integral: bool) -> list[KinetoEvent]:
    """Random call trees per thread: children inside parents, siblings in order, ties (touching
    ends, zero lengths, equal starts) frequent when ``integral``."""
    events = []
    for pid, tid in threads:
        t = 100.0
        open_ends: list[float] = []
        for _ in range(per_thread):
            while open_ends and (rng.random() < 0.4 or open_ends[-1] - t < 2):
                t = max(t, open_ends.pop())
            t += rng.choice((0, 0, 1, 2, 5)) if integral else rng.random() * 3
            room = (open_ends[-1] - t) if open_ends else 60.0
            dur = rng.choice((0, 1, 2, 5, 10, 30)) if integral else rng.random() * 30
            dur = max(0.0, min(dur, room))
            events.append(KinetoEvent(ph="X", cat="cpu_op", name="op", pid=pid, tid=tid, ts=float(t), dur=float(dur)))
            open_ends.append(t + dur)
    events.sort(key=cpu_event_order)
    return events


def _by_definition(events: list[KinetoEvent], by_thread: dict, point: TimePoint) -> set[int]:
    """The events of the point's thread covering it (``by_thread``: thread -> its event indices):
    the acceptable answers, checked for innermost by the caller."""
    return {i for i in by_thread.get((point.pid, point.tid), ())
            if events[i].ts <= point.ts <= events[i].ts + events[i].dur}


@pytest.mark.parametrize("integral", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_index_answers_as_the_sweep_does(seed, integral):
    rng = random.Random(seed)
    threads = [(1, 1), (1, 2), (7, "worker"), (2, 1)]
    events = _nested_events(rng, threads, 300, integral)
    index = cover_index(events)
    assert index is not None
    points = [TimePoint(*rng.choice(threads + [(9, 9)]), float(rng.randint(90, 2000)) + rng.choice((0, 0.5)))
              for _ in range(3000)]
    points += [TimePoint(e.pid, e.tid, e.ts) for e in events[::7]] + [TimePoint(e.pid, e.tid, e.ts + e.dur) for e in events[::5]]
    swept = innermost_covering(events, points)
    indexed = innermost_covering(events, points, index)
    assert indexed == swept
    by_thread: dict = {}
    for i, event in enumerate(events):
        by_thread.setdefault((event.pid, event.tid), []).append(i)
    found = 0
    for point, e in zip(points, indexed):
        covering = _by_definition(events, by_thread, point)
        if e < 0:
            assert not covering
            continue
        found += 1
        assert e in covering
        # innermost: every other covering event starts before it, or at its start and ends no earlier
        assert all(events[c].ts <= events[e].ts for c in covering)
    assert found > len(points) // 3


def test_threads_not_contiguous_give_no_index():
    """pid 1 and "1" sort together (by their text): the sweep is used then."""
    events = [KinetoEvent(ph="X", cat="cpu_op", name="a", pid=pid, tid=1, ts=ts, dur=1.0)
              for pid, ts in ((1, 1.0), ("1", 2.0), (1, 3.0))]
    assert cover_index(events) is None
    assert innermost_covering(events, [TimePoint(1, 1, 3.5)], None) == [2]


def test_the_index_on_the_nestings_ends_is_the_index_on_the_events():
    """Linking builds the index on the nesting's end column (``attribute_gpu_ops``): the same index."""
    events = _nested_events(random.Random(3), [(1, 1), (1, 2)], 50, True)
    from_ends = cover_index(events, nest_cpu_events(events).end)
    plain = cover_index(events)
    assert (from_ends.spans, from_ends.starts, list(from_ends.ends), from_ends.below) == (
        plain.spans, plain.starts, list(plain.ends), plain.below)

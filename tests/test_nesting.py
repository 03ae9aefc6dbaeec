"""The link stage's column passes give what the per-event definitions give.

``durations.nest_cpu_events`` (nesting and exclusive times in one sweep) against
``intervals.nesting_parents`` + ``exclusive_durations`` below (the general union-merging
definition, for any parents); ``report.nesting_violations`` against ``intervals.lies_within`` pair by pair;
``link.op_of_event`` against the plain inverse, and the report's unlinked events found with it.
Random events with integer-µs times (ties, zero-length events, touching ends) and fractional
ones, on several threads.
"""

from __future__ import annotations

import random

import pytest

from linker.link.durations import nest_cpu_events
from linker.link.intervals import lies_within, nesting_parents
from linker.read.kineto import CpuColumns, KinetoEvent, cpu_event_order
from linker.link.recipe import op_of_event
from linker.link.report import nesting_violations


def exclusive_durations(events: list[KinetoEvent], parents: list[int]) -> list[float]:
    """Per event: its time up to its end or its parent's (clipped) end, whichever comes first,
    less the union of its children's time inside it (>= 0), for any ``parents`` (parents before
    children, children in start order). One pass, O(n)."""
    ends = [e.ts + e.dur for e in events]
    for i, p in enumerate(parents):
        if p >= 0 and ends[i] > ends[p]:
            ends[i] = ends[p]
    exclusive = [e.dur if ends[i] == e.ts + e.dur else ends[i] - e.ts for i, e in enumerate(events)]
    covered_until = [e.ts for e in events]  # per parent: end of the children's union so far
    for i, event in enumerate(events):
        p = parents[i]
        if p < 0:
            continue
        start = max(event.ts, covered_until[p])
        end = ends[i]
        if end > start:
            exclusive[p] -= end - start
            covered_until[p] = end
    return [x if x > 0 else 0.0 for x in exclusive]


def random_events(rng: random.Random, n: int, integer: bool) -> list[KinetoEvent]:
    events = []
    for _ in range(n):
        ts = rng.randrange(0, 200) if integer else rng.uniform(0, 200)
        dur = rng.choice([0, 0, 1, rng.randrange(0, 60)]) if integer else rng.choice([0.0, rng.uniform(0, 60)])
        events.append(KinetoEvent(ph="X", cat="cpu_op", name=f"op{rng.randrange(5)}",
                                  pid=rng.choice([1, 2]), tid=rng.choice([7, 8, 9]), ts=float(ts), dur=float(dur)))
    events.sort(key=cpu_event_order)
    return events


@pytest.mark.parametrize("seed", range(40))
def test_one_sweep_gives_the_nesting_and_exclusive_times(seed):
    rng = random.Random(seed)
    events = random_events(rng, rng.randrange(0, 300), integer=seed % 2 == 0)
    nesting = nest_cpu_events(events)
    assert nesting.parents == nesting_parents(events)
    assert nesting.exclusive == exclusive_durations(events, nesting.parents)
    assert nesting.end.tolist() == [e.ts + e.dur for e in events]


def test_touching_ends_and_clipped_children():
    events = [KinetoEvent(name=n, pid=1, tid=1, ts=ts, dur=dur) for n, ts, dur in [
        ("parent", 0.0, 10.0), ("a", 2.0, 3.0), ("b", 5.0, 0.0), ("c", 5.0, 7.0), ("d", 12.0, 1.0)]]
    nesting = nest_cpu_events(events)
    # b (zero-length, at a's end) is a's child; c starts at a's end: a's sibling, clipped at 10,
    # for its parent's exclusive time and its own.
    assert nesting.parents == [-1, 0, 1, 0, -1]
    assert nesting.exclusive == [10.0 - 3.0 - 5.0, 3.0, 0.0, 5.0, 1.0]


def test_an_event_that_outlasts_its_parent_encloses_nothing_after_the_parent_returned():
    """The shape of a public MTIA trace: an asynchronous collective's record (``hccl:all_to_all``)
    starts inside the call that issued it and ends 2.5 s later, when the work completed; the
    thread meanwhile returned from the call and ran the forward pass. The forward is the step's
    child, not the collective's, and the collective's own time ends with its caller's."""
    events = [KinetoEvent(name=n, pid=1, tid=1, ts=ts, dur=dur) for n, ts, dur in [
        ("step", 0.0, 1000.0), ("alltoall_base", 10.0, 40.0), ("hccl:all_to_all", 30.0, 900.0),
        ("record", 35.0, 5.0), ("forward", 60.0, 800.0), ("mm", 70.0, 100.0), ("backward", 930.0, 60.0)]]
    nesting = nest_cpu_events(events)
    assert nesting.parents == [-1, 0, 1, 2, 0, 4, 0] == nesting_parents(events)
    # step: 1000 less its children alltoall_base (40), forward (800) and backward (60)
    assert nesting.exclusive == [100.0, 40.0 - 20.0, 20.0 - 5.0, 5.0, 800.0 - 100.0, 100.0, 60.0]
    assert nesting.end.tolist() == [1000.0, 50.0, 930.0, 40.0, 860.0, 170.0, 990.0]  # the measured ends


class _Et:
    def __init__(self, parents):
        self._parents = parents
        self.names = ["aten::op"] * len(parents)

    def parent_index(self):
        return self._parents


class _Kineto:
    def __init__(self, events):
        self.cpu_events = events

    def cpu_columns(self):
        return CpuColumns.of(self.cpu_events)


@pytest.mark.parametrize("seed", range(20))
def test_nesting_violations_over_columns(seed):
    rng = random.Random(seed)
    events = random_events(rng, 200, integer=seed % 2 == 0)
    ops = 150
    parents = [-1] + [rng.randrange(-1, i) for i in range(1, ops)]
    event_of_op = [rng.choice([-1, rng.randrange(len(events))]) for _ in range(ops)]
    expected = sum(1 for i, p in enumerate(parents) if p >= 0 and event_of_op[i] >= 0 and event_of_op[p] >= 0
                   and not lies_within(events[event_of_op[i]], events[event_of_op[p]]))
    nesting = nest_cpu_events(events)
    assert nesting_violations(_Et(parents), _Kineto(events), event_of_op) == expected
    assert nesting_violations(_Et(parents), _Kineto(events), event_of_op, (nesting.parents, nesting.end)) == expected
    # ops nested as their events are: the end check alone
    event_of_op = [rng.choice([-1, rng.randrange(len(events))]) for _ in range(len(events))]
    parents = [-1] * len(events)
    for i, e in enumerate(event_of_op):
        if e >= 0 and nesting.parents[e] >= 0 and rng.random() < 0.8:
            parents[i] = event_of_op.index(nesting.parents[e]) if nesting.parents[e] in event_of_op else -1
    expected = sum(1 for i, p in enumerate(parents) if p >= 0 and event_of_op[i] >= 0 and event_of_op[p] >= 0
                   and not lies_within(events[event_of_op[i]], events[event_of_op[p]]))
    assert nesting_violations(_Et(parents), _Kineto(events), event_of_op) == expected
    assert nesting_violations(_Et(parents), _Kineto(events), event_of_op, (nesting.parents, nesting.end)) == expected


@pytest.mark.parametrize("seed", range(10))
def test_op_of_event_inverts_event_of_op(seed):
    rng = random.Random(seed)
    event_of_op = [rng.choice([-1, rng.randrange(50)]) for _ in range(rng.randrange(0, 80))]
    expected = [-1] * 50
    for i, e in enumerate(event_of_op):
        if e >= 0:
            expected[e] = i
    assert op_of_event(event_of_op, 50) == expected


@pytest.mark.parametrize("seed", range(10))
def test_unlinked_events_from_the_inverse(seed):
    from linker.link.report import _unlinked_events

    rng = random.Random(seed)
    events = 40
    event_of_op = [rng.choice([-1, rng.randrange(events)]) for _ in range(rng.randrange(0, 80))]
    if seed == 0:
        event_of_op = list(range(events)) + [-1]  # every event linked
    inverse = op_of_event(event_of_op, events)
    for window in (range(events), sorted(rng.sample(range(events), 15))):
        expected = [i for i in window if i not in set(event_of_op)]
        assert _unlinked_events(event_of_op, window, events, None) == expected
        assert _unlinked_events(event_of_op, window, events, inverse) == expected


def test_infinite_times_do_not_break_the_sweep():
    inf = float("inf")
    events = [KinetoEvent(name="a", pid=1, tid=1, ts=0.0, dur=inf), KinetoEvent(name="b", pid=1, tid=1, ts=inf, dur=1.0),
              KinetoEvent(name="c", pid=1, tid=1, ts=inf, dur=0.0)]
    assert nest_cpu_events(events).parents == nesting_parents(events)

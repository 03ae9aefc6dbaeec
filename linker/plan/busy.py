"""Busy time of every CPU op: what a simulator should hold its resource for.

A trace-driven simulator (ASTRA-sim through Chakra's FeederV3) runs a node after its ``ctrl_deps``
(the parent) and ``data_deps`` finish, one node per resource at a time, for ``duration_micros``.
Inclusive time would count nested time once per nesting level; exclusive time (Chakra's converter
writes it) still counts time the op sat blocked. This module computes, per ET node:

- ``blocked``: the part of the op's exclusive time it was waiting, not working:
  * blocking runtime calls Kineto records inside it (innermost linked op covering the call):
    ``cudaDeviceSynchronize`` / ``cudaStreamSynchronize`` / ``cudaEventSynchronize`` (cu*, hip*),
    synchronous ``cudaMemcpy`` / ``hipMemcpy``, and a ``cudaMemcpyAsync`` whose copy finished
    before the call returned, allowing for the CPU/GPU clock skew the trace shows (a pageable-memory
    copy: synchronous in effect; ``clocks``). The whole call counts; the op's own time after the
    call is cut off as a piece (``_handoffs``), which the synchronize's edge releases.
  * waits for another thread (``join``): the main thread sits in an op's exclusive time (e.g.
    ``## backward ##`` while the autograd engine thread runs, ``join_workers`` while workers run)
    or in a gap between its ops (Python's ``loss.backward()`` is no op), while a burst of another
    thread's ops ends there. Blocked = from the later of the burst's start and the start of that
    idle segment, to the burst's end.
- ``host_gap``: time on a thread that no linked op covers (Python between ops), minus any part of it
  that is a join wait. It is *folded* into the node that precedes the gap in the thread's
  simulation order (its start order, which is the ET pre-order): that node is the last to run
  before the gap in a replay, so the gap lands exactly where it occurred without adding nodes
  (node ids, counts and the JSON/.et correspondence stay as they were). The idle time before a
  worker thread's first op, when it began while its spawning op still ran, is folded into the
  worker's ET thread root (``spawn``; see below). When GPU work launched before the trace (no
  launch event) started before the main thread's first op, that lead is folded into the main
  thread's root (``pre_trace_lead``): the host was busy with untraced work meanwhile. The host
  time between the end of a wait for a CPU collective and the op that reads its result lay
  before that op: a piece of no busy time holds it there (``_resume_pieces``).
- ``deferred`` / ``pieces`` (``plan.later_pieces``): a replay runs an op's busy time before its
  first child, so the op's node keeps only the part of its exclusive time before that child; each
  later piece (between children, after the last) becomes a node of its own, the same op's time,
  run right after the op that precedes the piece in the thread's start order, less the blocked
  time lying in it (a wait stays a wait).
- ``sim`` = max(0, exclusive − blocked) − deferred + host_gap (unlinked nodes: host_gap only,
  usually 0); with its pieces, an op's busy time is its exclusive time less its blocked time.

Cross-thread structure (``cross`` edges), found from the ET threads and the Kineto times, never
from adjacency alone: the *main* thread is the one holding the earliest linked op; every other
thread's ops are cut into *bursts*, a burst being the maximal run of that thread's top-level
(uncovered) ops that begin after the same main-thread op S (the last main op started before them).
- ``fork`` S → the burst's first op: the burst was started by the main thread's progress up to S.
  When S was still running at the burst's start, S spawned it (``threading.Thread.start`` inside
  S): for the thread's first burst the edge goes from the main op before S to the worker's thread
  root, whose ``host_gap`` is the burst's offset into S; for a later burst it comes from the last
  main op that had ended by then (S and its enclosing ops had not: waiting for them would delay
  the burst past its measured start).
- ``join`` burst's last op → the part of the op W the main thread waited in that ran after the
  burst, when W's own time went on after it (W's stretch is cut where the burst ended:
  ``resumed_at``), else the first main op starting after the burst ends (W itself when none
  does), when the burst ended while the main thread was idle (in an op's exclusive time, or
  between ops). Blocked: the union, per idle segment, of the bursts' overlap. A burst holding a
  CPU collective is joined so only when the main thread sat in the call that issued it (its wait
  is otherwise at the op that reads its result: ``_collective_waits``).
- ``join`` (hand-back): when the main thread waited in an op W's exclusive time from the burst's
  start until W's next child began while the burst still ran (the autograd engine hands CPU work
  back to the calling thread), the wait up to that child is blocked and the burst's op that
  finished last before it gets an edge to it (not for a collective's worker).

Cost: O(n log n) for n ET nodes (sorting per thread, bisects for the main-thread lookups, ancestor
walks bounded by tree depth; ``later_pieces`` one bisect per op in C passes), O(n) floats of memory.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, fields
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from linker.link.intervals import TimePoint, cover_index, innermost_covering
from linker.link.recipe import op_of_event
from linker.model.columns import ascending
from linker.plan.clocks import blocking_copies, clock_skew
from linker.plan.later_pieces import HANDOFF_CUT_MIN_US, BlockedStretch, Handoff, Pieces, later_pieces

FORK, JOIN = "fork", "join"

# Runtime calls that wait for GPU work, by kind: the synchronizes block the calling thread; a
# stream-wait-event makes a stream wait (the CPU goes on). ``plan.deps`` turns them into edges.
DEVICE_SYNC, STREAM_SYNC, STREAM_WAIT_EVENT = "device_sync", "stream_sync", "stream_wait_event"
WAIT_CALLS = {
    "cudaDeviceSynchronize": DEVICE_SYNC, "cuCtxSynchronize": DEVICE_SYNC, "hipDeviceSynchronize": DEVICE_SYNC,
    "cudaStreamSynchronize": STREAM_SYNC, "cuStreamSynchronize": STREAM_SYNC, "hipStreamSynchronize": STREAM_SYNC,
    "cudaEventSynchronize": STREAM_SYNC, "cuEventSynchronize": STREAM_SYNC, "hipEventSynchronize": STREAM_SYNC,
    "cudaStreamWaitEvent": STREAM_WAIT_EVENT, "cuStreamWaitEvent": STREAM_WAIT_EVENT,
    "hipStreamWaitEvent": STREAM_WAIT_EVENT,
}
# Runtime calls that block the calling thread until GPU work finishes.
SYNC_CALLS = frozenset(name for name, kind in WAIT_CALLS.items() if kind != STREAM_WAIT_EVENT)
# Copies: synchronous ones, and asynchronous ones that blocked (``clocks``: the rule, with the skew).


class CrossEdge(NamedTuple):
    """A cross-thread edge: ``source`` and ``target`` ET indices, ``cause`` ``fork`` or ``join``."""

    source: int
    target: int
    cause: str


class Resume(NamedTuple):
    """Host time the main thread ran between the end of its wait for a collective and the op that
    read its result (``BusyTimes.resumes``): the main-thread ``position`` of the op before it, the
    op it waited in (``waiter``, -1: a gap), where that host time began and how long it was (µs)."""

    position: int
    waiter: int
    begin: float
    host: float


class NewPiece(NamedTuple):
    """A piece of no busy time to add (``_add_pieces``): the op it is of (``owner``), the op it
    runs after, where it begins and the host gap it holds (µs)."""

    owner: int
    after: int
    begin: float
    host_gap: float


@dataclass(eq=False)
class BusyTimes:
    """Per ET node (index = position in ``et.nodes``): blocked, host gap and simulated busy µs.

    ``cross``: the cross-thread edges (``CrossEdge``: cause ``fork``/``join``).
    ``main_tid``: the ET thread taken as the main thread (None without linked ops).
    ``blocking_copies``: GPU link indices (into ``EtPlus.gpu_links``) launched by a copy call that
    returned only after the copy finished, allowing for the trace's clock skew (``clocks``): the
    thread waited for that GPU op (a ``sync`` edge).
    """

    blocked: np.ndarray  # columns (float64 µs), one entry per ET node
    host_gap: np.ndarray
    sim: np.ndarray
    cross: list[CrossEdge] = field(default_factory=list)
    main_tid: int | None = None
    blocking_copies: list[int] = field(default_factory=list)
    clock_skew: dict = field(default_factory=dict)  # ``clocks.ClockSkew.summary`` (GPU traces)
    consumed_at: dict[int, float] = field(default_factory=dict)  # CPU collective -> its consumer's start
    # ``later_pieces``: exclusive µs an op runs after its first child (taken out of it), and those
    # pieces as nodes of their own (``Pieces``), run where the thread ran them
    deferred: np.ndarray = field(default_factory=lambda: np.empty(0))
    pieces: Pieces = field(default_factory=Pieces)
    trailing_gap: dict[int, float] = field(default_factory=dict)  # op -> the host gap after it (``_host_gaps``)
    # join edges into the op the main thread waited in: (source, target) -> when the wait ended;
    # the op's stretch is cut there and the edge goes to the part after it (``deps``)
    resumed_at: dict[tuple[int, int], float] = field(default_factory=dict)
    # a consumer whose thread waited for a collective before it -> the host time it ran before the
    # consumer (``Resume``): ``_resume_pieces``
    resumes: dict[int, Resume] = field(default_factory=dict)
    resume_joins: set[tuple[int, int]] = field(default_factory=set)  # (collective, consumer)
    # a CPU send whose transfer began in its call, before its record -> where (the call's start)
    begun_at: dict[int, float] = field(default_factory=dict)
    # a worker's thread root (no measured start of its own) spawned by a main op -> that op's start,
    # where its replay begins (its host gap carries it to the thread's first op): a fork into it
    # comes from what the main thread had run by then
    spawned_at: dict[int, float] = field(default_factory=dict)

    def __eq__(self, other) -> bool:
        if not isinstance(other, BusyTimes):
            return False
        for name in (column.name for column in fields(self)):
            mine, theirs = getattr(self, name), getattr(other, name)
            if not (np.array_equal(mine, theirs) if isinstance(mine, np.ndarray) else mine == theirs):
                return False
        return True


@dataclass
class Timeline:
    """One ET thread's linked ops in start order, with their measured start and end (µs)."""

    ops: list[int]
    starts: list[float]
    ends: list[float]
    _frontier: list[float] | None = None

    def frontier(self) -> list[float]:
        """frontier[p]: the latest end among ops 0..p (computed once)."""
        if self._frontier is None:
            self._frontier = list(accumulate(self.ends, max))
        return self._frontier


def blocking_calls(et_plus, copies: list[int] | None = None) -> list:
    """The Kineto runtime calls that block their thread, inside the linked window if any;
    ``copies``: the blocking copies' link indices (``clocks.blocking_copies``), found if not given."""
    window = et_plus.result.window
    calls = [event for event in et_plus.result.kineto.runtime_events
             if event.name in SYNC_CALLS and (window is None or window.contains(event.ts))]
    if copies is None:
        copies = blocking_copies(et_plus.gpu_links, clock_skew(et_plus.gpu_links))
    calls += [et_plus.gpu_links[k].launch for k in copies]
    return calls


def ops_covering(et_plus, calls: list) -> list[int]:
    """For each runtime call, the innermost linked ET op covering it (-1 if none).
    O(n + w log n) for w calls (the cover index the GPU attribution built; else one built here)."""
    if not calls:
        return []
    result = et_plus.result
    events = result.kineto.cpu_events
    op_of = _op_of_event(result)
    points = [TimePoint(call.pid, call.tid, call.ts) for call in calls]
    covering = []
    cover = result.gpu.cover if result.gpu.cover is not None else cover_index(events)
    for e in innermost_covering(events, points, cover):
        while e >= 0 and op_of[e] < 0:
            e = result.parents[e]
        covering.append(op_of[e] if e >= 0 else -1)
    return covering


def _op_of_event(result) -> list[int]:
    """Per Kineto CPU event, its linked op or -1: the link's, or made here for a result that
    lacks it. O(1), else O(n)."""
    if result.op_of_event is not None:
        return result.op_of_event
    return op_of_event(result.match.event_of_op, len(result.parents))


def _start_order(ops: list[int], starts: list[float], ends: list[float],
                 ids: list[int]) -> tuple[list[int], list[float]]:
    """``ops`` sorted by (start, -end, id, index), and their starts: one sort by start, then each
    run of equal starts (integer-µs traces) by (-end, id, index). O(m log m); O(m) C passes for
    ops given in order of strictly increasing start (then left as they are)."""
    at = [starts[i] for i in ops]
    if ascending(at):
        return list(ops), at
    ops = sorted(ops, key=starts.__getitem__)
    at = [starts[i] for i in ops]
    if ascending(at):
        return ops, at
    run_start = run_end = None
    for p in [p for p in range(1, len(ops)) if at[p] == at[p - 1]]:  # p starts where p - 1 starts
        if run_start is None or at[p] != at[run_start]:
            if run_start is not None:
                _sort_tie(ops, run_start, run_end, ends, ids)
            run_start = p - 1
        run_end = p + 1
    if run_start is not None:
        _sort_tie(ops, run_start, run_end, ends, ids)
    return ops, at


def _sort_tie(ops: list[int], start: int, end: int, ends: list[float], ids: list[int]) -> None:
    """Equal starts: longest first, then by id, then by index (repeated ids: the input order of
    ``ops`` must not matter)."""
    ops[start:end] = sorted(ops[start:end], key=lambda i: (-ends[i], ids[i], i))


def _timelines(et, starts: list[float], ends: list[float], linked: list[bool], roots: list[int],
               near_start_order: list[int] | None = None) -> dict[int, Timeline]:
    """Per ET thread (in order of first op by index), its linked non-root ops in start order."""
    is_op = list(linked)
    for i in roots:
        is_op[i] = False
    tid = et.tid
    numbers = np.flatnonzero(is_op).tolist()
    thread_order = list(dict.fromkeys(tid[i] for i in numbers))
    ops = numbers if near_start_order is None else [i for i in near_start_order if is_op[i]]
    if len(thread_order) == 1:
        by_thread = {thread_order[0]: ops}
    else:
        by_thread = {t: [] for t in thread_order}
        for i in ops:
            by_thread[tid[i]].append(i)
    timelines = {}
    for t, members in by_thread.items():
        members, member_starts = _start_order(members, starts, ends, et.ids)
        timelines[t] = Timeline(members, member_starts, [ends[i] for i in members])
    return timelines


def _thread_roots(et, roots: list[int]) -> dict[int, int]:
    """ET thread number -> index of that thread's root node (nested layouts have them)."""
    by_tid = {}
    for i in roots:
        if et.tid[i] and et.tid[i] not in by_tid:
            by_tid[et.tid[i]] = i
    return by_tid


class MainThread:
    """Lookups on the main thread's timeline: which op was running, or last started, at time t."""

    def __init__(self, timeline: Timeline, parent_index: list[int], linked: list[bool]):
        self.timeline = timeline
        self.parent_index = parent_index
        self.linked = linked
        self._position: dict[int, int] | None = None

    @property
    def position(self) -> dict[int, int]:
        """ET index -> position on the main timeline; built on first use (other threads' bursts)."""
        if self._position is None:
            self._position = dict(zip(self.timeline.ops, range(len(self.timeline.ops))))
        return self._position

    @property
    def frontier(self) -> list[float]:
        """frontier[p]: latest end among ops 0..p."""
        return self.timeline.frontier()

    def last_started(self, t: float) -> int:
        """Position of the last op started at or before t (-1 if none)."""
        return bisect_right(self.timeline.starts, t) - 1

    def first_starting(self, t: float) -> int:
        """ET index of the first op starting at or after t (-1 if none)."""
        p = bisect_left(self.timeline.starts, t)
        return self.timeline.ops[p] if p < len(self.timeline.ops) else -1

    def idle_segment(self, t: float) -> IdleSegment | None:
        """Where the main thread was at time t when not inside a linked op's child: the waiting op
        W (or a gap between ops) and the idle segment around t. None before its first op or when
        an op is running its own child at t. O(depth)."""
        p = self.last_started(t)
        if p < 0:
            return None
        tl = self.timeline
        nxt = p + 1
        resume = tl.ops[nxt] if nxt < len(tl.ops) else -1
        resume_ts = tl.starts[nxt] if nxt < len(tl.ops) else math.inf
        node, child = tl.ops[p], -1
        while node >= 0:
            q = self.position.get(node)
            if q is not None and tl.ends[q] >= t:
                start = tl.starts[q] if child < 0 else tl.ends[self.position[child]]
                end = min(tl.ends[q], resume_ts)
                return IdleSegment(node, p, start, end, resume, inside=resume_ts < tl.ends[q])
            if q is not None:
                child = node
            node = self.parent_index[node]
            while node >= 0 and node not in self.position:
                node = self.parent_index[node] if not self.linked[node] else -1
        return IdleSegment(-1, p, self.frontier[p], resume_ts, resume, inside=False)


@dataclass
class IdleSegment:
    """A stretch of main-thread time inside op ``waiter``'s exclusive time (or, waiter -1, a gap
    after position ``position``), from ``start`` to ``end``; ``resume``: the main op starting at
    ``end`` (-1 none); ``inside``: that op is the waiter's child (the waiter goes on after it)."""

    waiter: int
    position: int
    start: float
    end: float
    resume: int
    inside: bool

    @property
    def key(self) -> tuple:
        return (self.waiter, self.start) if self.waiter >= 0 else (-1, self.position)


@dataclass
class SegmentWait:
    """The main thread's wait for other work (another thread's burst, a CPU collective, a send or
    receive) inside one ``IdleSegment``: the segment's ``waiter`` and ``position``, and the union
    of the waits found there, from ``start`` to ``end`` (µs). Not ``DependencyPlan.waits``, which
    are dependency edges."""

    waiter: int
    position: int
    start: float
    end: float


def compute_busy(et_plus, exclusive_of_op: list[float], near_start_order: list[int] | None = None,
                 collectives: dict | None = None, lost: list[int] | None = None,
                 communication_starts: dict[int, float] | None = None,
                 handed_with_previous: set[int] | None = None) -> BusyTimes:
    """Blocked time, host gaps, simulated durations and fork/join edges (module docstring).
    ``near_start_order``: the ET nodes in an order close to start order (the tree pre-order),
    which makes sorting each thread's ops by start cheap; any order gives the same result.
    ``collectives``: the CPU collectives, sends and receives (``cpu_comm.cpu_collectives``): the
    main thread's wait for each (``_collective_waits``, ``_point_to_point_waits``);
    ``lost``: the calls that issued collectives the ET lacks (``cpu_comm.lost_issuers``): the wait
    for each runs where it occurred, before its consumer (``_lost_collective_waits``);
    ``communication_starts``: collective -> where its communication began, when ops its worker ran
    for it came first (``cpu_comm.communication_stretches``): its place on its thread, after them;
    ``handed_with_previous``: ops handed to their thread with the op before them, whatever the main
    thread ran in between (those ops after the first, and the collective: one burst)."""
    et, result = et_plus.et, et_plus.result
    n = len(et.nodes)
    starts, ends = et_plus.op_times if et_plus.op_times is not None else _event_times(result)
    if communication_starts:
        starts = list(starts)
        for i, start in communication_starts.items():
            starts[i] = start
    linked = (~np.isnan(np.asarray(starts, dtype=np.float64))).tolist()  # a measured start
    busy = BusyTimes(np.zeros(n), np.zeros(n), np.zeros(n))
    call_waits = _blocking_call_waits(et_plus, busy)
    blocked_at = list(call_waits)  # every blocked stretch
    point_to_point = _point_to_point(collectives)
    on_timeline = _off_timeline(linked, point_to_point)
    timelines = _timelines(et, starts, ends, on_timeline, et.root_positions(), near_start_order)
    segment_waits: dict[tuple, SegmentWait] = {}  # by the key of the main-thread idle segment it lies in
    burst_firsts: set[int] = set()
    if timelines:
        _thread_waits(et_plus, busy, timelines, (starts, ends, linked), collectives, point_to_point, lost,
                      segment_waits, burst_firsts, handed_with_previous or frozenset())
    blocked_at += _sends_begun_in_their_call(et, collectives, timelines.get(busy.main_tid), starts, busy)
    gap_waits = _held_waits(busy, segment_waits, blocked_at)
    for tid, timeline in timelines.items():
        _host_gaps(busy, timeline, gap_waits if tid == busy.main_tid else None, burst_firsts)
    launches = [Handoff(link.et_index, link.launch.ts, link.event.ts) for link in et_plus.gpu_links
                if link.launch is not None and link.et_index >= 0]
    parent_op = nesting_parent_ops(et_plus)
    handoffs, forked_in_gaps = _handoffs(busy, launches, call_waits, parent_op, starts, ends, linked)
    busy.deferred, busy.pieces = later_pieces(timelines.values(), parent_op, ends,
                                              exclusive_of_op, busy.blocked, blocked_at, n,
                                              frozenset(collectives or ()), handoffs)
    _gaps_after_pieces(busy)
    if forked_in_gaps:
        wait_spans = {wait.position: (wait.start, wait.end) for wait in segment_waits.values() if wait.waiter < 0}
        _split_gaps(busy, timelines[busy.main_tid], [Handoff(-1, -math.inf, t) for t in forked_in_gaps],
                    wait_spans)
    _split_gaps_at_late_launches(busy, timelines, launches, ends)
    if busy.resumes:
        forks = sorted(starts[target] for _, target, cause in busy.cross if cause == FORK and linked[target])
        _resume_pieces(busy, timelines[busy.main_tid], forks)
    _sim_times(busy, exclusive_of_op, linked)
    return busy


def _held_waits(busy: BusyTimes, segment_waits: dict[tuple, SegmentWait],
                blocked_at: list[BlockedStretch]) -> dict[int, float]:
    """The main thread's waits (``segment_waits``, by segment key) taken where they were held: in
    an op, its blocked time (and a blocked stretch in ``blocked_at``); in a gap after main-thread
    position p, returned as p -> the µs of join wait inside that gap."""
    gap_waits: dict[int, float] = {}
    for wait in segment_waits.values():
        waiter, position, lo, hi = wait.waiter, wait.position, wait.start, wait.end
        if waiter >= 0:
            busy.blocked[waiter] += hi - lo
            blocked_at.append(BlockedStretch(waiter, lo, hi - lo))
        else:
            gap_waits[position] = gap_waits.get(position, 0.0) + hi - lo
    return gap_waits


def _blocking_call_waits(et_plus, busy: BusyTimes) -> list[BlockedStretch]:
    """The blocking runtime calls' waits (module docstring): each call's time is blocked time of
    the innermost linked op covering it (``busy.blocked``); also sets ``busy``'s clock skew and
    blocking copies. Returns each call's ``BlockedStretch``. O(calls log n)."""
    skew = clock_skew(et_plus.gpu_links) if et_plus.gpu_links else None
    busy.clock_skew = skew.summary() if skew is not None else {}
    busy.blocking_copies = blocking_copies(et_plus.gpu_links, skew) if skew is not None else []
    calls = blocking_calls(et_plus, busy.blocking_copies)
    blocked_at = []
    for call, op in zip(calls, ops_covering(et_plus, calls)):
        if op >= 0:
            busy.blocked[op] += call.dur
            blocked_at.append(BlockedStretch(op, call.ts, call.dur))
    return blocked_at


def _thread_waits(et_plus, busy: BusyTimes, timelines: dict, times: tuple, collectives: dict | None,
                  point_to_point: list[int], lost: list[int] | None, segment_waits: dict, burst_firsts: set[int],
                  handed_with_previous: set[int] = frozenset()) -> None:
    """The main thread (the one holding the earliest linked op: ``busy.main_tid``) and its waits
    for the other threads: for CPU collectives (``_collective_waits``, ``_lost_collective_waits``)
    and for its sends and receives (``point_to_point``, among ``collectives``: ``_point_to_point_waits``),
    for the other threads' bursts (``_cross_thread``; their fork and join edges), and the lead of
    GPU work launched before the trace (``_pre_trace_lead``). ``times``: (starts, ends, linked)
    per ET node; ``handed_with_previous``: see ``compute_busy``. Fills ``segment_waits`` and
    ``burst_firsts``."""
    et = et_plus.et
    starts, ends, linked = times
    main_tid = min(timelines, key=lambda tid: (timelines[tid].starts[0], tid))
    busy.main_tid = main_tid
    main = MainThread(timelines[main_tid], et.parent_index(), linked)
    thread_roots = _thread_roots(et, et.root_positions())
    transfers = set(point_to_point)
    collectives = {i: attrs for i, attrs in (collectives or {}).items() if i not in transfers}
    waiters = _collective_waits(et_plus, collectives, main, starts, ends, segment_waits, busy) if collectives else {}
    if lost:
        _lost_collective_waits(et, collectives, lost, main, starts, ends, segment_waits, busy)
    if point_to_point:
        _point_to_point_waits(point_to_point, et.tid, main, starts, ends, segment_waits, busy)
    for tid, timeline in timelines.items():
        if tid != main_tid:
            _cross_thread(main, timeline, thread_roots.get(tid, -1), segment_waits, busy, burst_firsts, waiters,
                          handed_with_previous)
    lead_skew = clock_skew(et_plus.gpu_links, unqueued=True) if et_plus.gpu_links else None
    _pre_trace_lead(et_plus, timelines[main_tid].starts[0], thread_roots.get(main_tid, -1), busy, lead_skew)


def _handoffs(busy: BusyTimes, launches: list[Handoff], call_waits: list[BlockedStretch],
              parent_op: list[int], starts: list[float], ends: list[float], linked: list[bool]
              ) -> tuple[list[Handoff], list[float]]:
    """Where each op's stretch is cut (``later_pieces``' ``handoffs``): its launches; for a fork,
    the main thread's stretch running at the burst's start (``_running_at``); for a join into the
    op the main thread waited in, that op where it resumed; for a blocking call (``call_waits``),
    where the call returned (the op's
    time after it is a piece the synchronize's edge releases: ``plan.waits``). Also the starts of
    the bursts forked in a host gap (no op running then). O(launches + calls + cross edges x
    depth)."""
    handoffs = list(launches)
    handoffs += [Handoff(op, where + length, where + length) for op, where, length in call_waits]
    forked_in_gaps: list[float] = []
    for source, target, cause in busy.cross:
        if cause == FORK and linked[target]:
            running = _running_at(source, starts[target], parent_op, starts, ends)
            if running >= 0:
                handoffs.append(Handoff(running, starts[target], starts[target]))
            else:
                forked_in_gaps.append(starts[target])
    for (_, waiter), resumed in busy.resumed_at.items():
        handoffs.append(Handoff(waiter, resumed, resumed))
    return handoffs, forked_in_gaps


def _running_at(op: int, t: float, parent_op: list[int], starts: list[float], ends: list[float]) -> int:
    """The op of ``op``'s thread whose time holds measured time ``t``: ``op`` itself or the nearest
    enclosing op (``parent_op``) still running then; -1 when none is (a gap between ops). A fork
    from ``op`` comes from what its thread ran by ``t`` (``deps.OpParts.ran_before``): the stretch
    of that op holding ``t`` is cut there. O(depth)."""
    while op >= 0 and not starts[op] <= t < ends[op]:
        op = parent_op[op]
    return op


def _gaps_after_pieces(busy: BusyTimes) -> None:
    """A host gap follows every later piece the thread ran after the op before it (the pieces end
    where the next op starts or an op ends; the gap begins where every op had ended): it moves from
    that op to the last of those pieces (``Pieces.host_gap``), the node a replay runs just before
    the gap. O(p) in C, a step per gap."""
    pieces = busy.pieces
    pieces.host_gap = np.zeros(len(pieces))
    last_of = pieces.last_after()
    for after, trailing in busy.trailing_gap.items():
        j = last_of.get(after)
        gap = min(trailing, busy.host_gap[after])
        if j is not None and gap > 0:
            pieces.host_gap[j] = gap
            busy.host_gap[after] -= gap


def _split_gaps_at_late_launches(busy: BusyTimes, timelines: dict, launches: list[Handoff],
                                 ends: list[float]) -> None:
    """A GPU op that began after its launching op ended, in the host gap folded into that op's
    last node, waited for the gap only up to its start: split the gap there (``_split_gaps``),
    thread by thread. Only launches whose GPU op began after the op's end are looked at; the op's
    thread is found for those alone. O(n) once such launches exist, plus the splits."""
    late = [launch for launch in launches if launch.work_start > ends[launch.op]]
    if not late:
        return
    wanted = {launch.op for launch in late}
    thread_of = {op: tid for tid, timeline in timelines.items() for op in timeline.ops if op in wanted}
    by_thread: dict[int, list[Handoff]] = {}
    for launch in late:
        if launch.op in thread_of:
            by_thread.setdefault(thread_of[launch.op], []).append(launch)
    for tid, handoffs in by_thread.items():
        _split_gaps(busy, timelines[tid], handoffs, {})


def _resume_after(busy: BusyTimes, consumer: int, segment: IdleSegment, begin: float, host: float) -> None:
    """Note that the main thread, idle in ``segment`` waiting for a collective, ran ``host`` µs of
    host time from ``begin`` up to ``consumer`` (``_resume_pieces`` makes the node of it). Two
    notes for one consumer end at its start: the earlier begin holds both."""
    if host <= 0:
        return
    held = busy.resumes.get(consumer)
    if held is None or host > held.host:
        busy.resumes[consumer] = Resume(segment.position, segment.waiter, begin, host)


def _resume_pieces(busy: BusyTimes, timeline: Timeline, forks: list[float]) -> None:
    """The host time between the end of a wait for a collective and the op that read its result
    (``resumes``) lay before that op: a piece of no busy time holds it (``length`` 0,
    ``host_gap`` that time), run right before the consumer, of the op the thread waited in, else
    of the op whose node held the thread's time before the gap (the last piece after the op before
    it, or that op). The joins of the collectives it waited for go to that piece (``resumed_at``):
    a replay resumes the thread when they end, runs the host time, then the consumer, as measured,
    and the consumer's node holds its own time alone. Before, the consumer's node held that time
    as its ``host_gap``, which reads as time after the op. A burst of another thread that began
    inside that host time (``forks``: the bursts' starts, sorted; a gloo worker taking the next
    collective as the thread woke) waited for it up to its start only, as in any host gap
    (``_split_gaps``): the time is cut there, each part a piece of its own, so the fork comes from
    the part before it. O(r log f + p log p) for r such waits and f forks."""
    pieces = busy.pieces
    last_of = pieces.last_after()
    owners = pieces.owner.tolist()
    added: list[NewPiece] = []
    piece_of: dict[int, tuple[int, float]] = {}  # consumer -> (the piece's op, its begin)
    for consumer, (position, waiter, begin, host) in busy.resumes.items():
        after = timeline.ops[position]
        j = last_of.get(after)
        owner = waiter if waiter >= 0 else (owners[j] if j is not None else after)
        cuts = forks[bisect_right(forks, begin):bisect_left(forks, begin + host)]
        bounds = [begin] + sorted(set(cuts)) + [begin + host]
        added += [NewPiece(owner, after, lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]
        piece_of[consumer] = (owner, begin)
    _add_pieces(busy, added)
    cross: list[CrossEdge] = []
    for source, target, cause in busy.cross:
        if cause == JOIN and target in piece_of and (source, target) in busy.resume_joins:
            owner, begin = piece_of[target]
            busy.resumed_at[(source, owner)] = begin
            target = owner
        cross.append(CrossEdge(source, target, cause))
    busy.cross = cross


def _add_pieces(busy: BusyTimes, added: list[NewPiece]) -> None:
    """Add pieces of no busy time (``NewPiece``) to ``busy.pieces`` in begin order (ties: the
    pieces there first). O(p log p)."""
    if not added:
        return
    pieces = busy.pieces
    owner, after, begin, gap = (np.array(column) for column in zip(*added))
    more = {"owner": owner, "after": after, "begin": begin, "end": begin, "length": np.zeros(len(added)),
            "host_gap": gap}
    order = np.argsort(np.concatenate((pieces.begin, begin)), kind="stable")  # begin order, ties as they were
    for name, rows in more.items():
        column = getattr(pieces, name)
        setattr(pieces, name, np.concatenate((column, rows.astype(column.dtype)))[order])


def _split_gaps(busy: BusyTimes, timeline: Timeline, handoffs: list[Handoff],
                gap_waits: dict[int, tuple[float, float]]) -> None:
    """Work handed off by a thread (a worker's burst it forked, a GPU op it launched) that began
    in a host gap of the thread (Python between ops, folded into the node before the gap) waited
    for the gap's host time before its start only. The rest goes to a node of its own: a piece of
    no busy time of the same op, right after the node that held the gap (``Pieces``: ``length``
    0, ``host_gap`` the rest), so the edge comes from the node before it
    (``deps.OpParts.ran_before`` / ``before``) and every op's busy time is unchanged.
    ``handoffs``: the op that launched the work, where its call began and where the work began
    (``Handoff``); op -1 for a fork (any fork in a gap splits it); a launch splits only the gap its
    own op's node holds (the kernel's edge comes from there). Hand-offs in one gap split it in time order; the
    host time between two points is their distance less the gap's join wait (``gap_waits``:
    position -> the wait's span) lying between them. O(h log m + p log p) for h hand-offs, m ops
    of the thread and p pieces, paid only where a hand-off lies in a gap."""
    pieces = busy.pieces
    last_of = pieces.last_after()
    frontier = timeline.frontier()
    by_gap: dict[int, set[float]] = {}
    for launcher, call, t in handoffs:
        p = bisect_right(timeline.starts, t)
        if not 0 < p < len(timeline.ops) or frontier[p - 1] >= t:
            continue
        if launcher >= 0:
            holder = _gap_holder(busy, last_of, timeline.ops[p - 1])
            if holder is None or holder.owner != launcher or holder.begin > call:
                continue
        by_gap.setdefault(p, set()).add(t)
    added: list[NewPiece] = []
    for p, times in by_gap.items():
        op = timeline.ops[p - 1]
        holder = _gap_holder(busy, last_of, op)
        if holder is None:
            continue
        wait = gap_waits.get(p - 1, (0.0, 0.0))
        cursor, left, splits = frontier[p - 1], holder.held, []  # splits: (where, host time before it)
        for t in sorted(times):
            keep = min(left, _host_time(cursor, t, wait))
            if left - keep <= 0:
                break
            splits.append((t, keep))
            cursor, left = t, left - keep
        if not splits:
            continue
        _set_held(busy, holder, splits[0][1])  # the holder keeps the host time up to the first split
        gaps_after = [keep for _, keep in splits[1:]] + [left]  # each new piece: up to the next split
        added += [NewPiece(holder.owner, op, t, gap) for (t, _), gap in zip(splits, gaps_after)]
    _add_pieces(busy, added)


class GapHolder(NamedTuple):
    """The node holding the host gap after an op: the last piece the thread ran after it
    (``piece`` its index) or the op's own node (``piece`` None); the op whose node or piece it is,
    where it began (-inf for an op's own node: a launch call is never before it), and the gap."""

    piece: int | None
    owner: int
    begin: float
    held: float


def _gap_holder(busy: BusyTimes, last_of: dict[int, int], op: int) -> GapHolder | None:
    """The ``GapHolder`` of the host gap after ``op``; None when no gap is held there."""
    j = last_of.get(op)
    pieces = busy.pieces
    if j is not None and pieces.host_gap[j] > 0:
        return GapHolder(j, int(pieces.owner[j]), float(pieces.begin[j]), float(pieces.host_gap[j]))
    if op in busy.trailing_gap and busy.host_gap[op] > 0:
        return GapHolder(None, op, -math.inf, busy.host_gap[op])
    return None


def _set_held(busy: BusyTimes, holder: GapHolder, gap: float) -> None:
    """Set the host gap the holder's node holds."""
    if holder.piece is None:
        busy.host_gap[holder.owner] = gap
    else:
        busy.pieces.host_gap[holder.piece] = gap


def _host_time(a: float, b: float, wait: tuple[float, float]) -> float:
    """Host time of a gap from ``a`` to ``b``: their distance less the join wait inside it."""
    return max(0.0, (b - a) - max(0.0, min(b, wait[1]) - max(a, wait[0])))


def _event_times(result) -> tuple[list[float], list[float]]:
    """Start and end (µs) of each ET node's linked Kineto event (NaN when unlinked): C passes."""
    columns = result.kineto.cpu_columns()
    ts = list(columns.ts)
    end = [t + d for t, d in zip(ts, columns.dur)]
    ts.append(math.nan)  # event -1: unlinked
    end.append(math.nan)
    event_of_op = result.match.event_of_op
    return [ts[event] for event in event_of_op], [end[event] for event in event_of_op]


def _sim_times(busy: BusyTimes, exclusive_of_op: list[float], linked: list[bool]) -> None:
    """Blocked capped at the exclusive time (linked nodes), then sim = exclusive - blocked -
    deferred + host gap for every node, as array passes (an unlinked node's exclusive time is 0
    and nothing is deferred from it: sim = host gap; where all three are 0, sim is the exclusive
    time itself). The deferred time is the op's pieces' (``busy.pieces``). O(n)."""
    exclusive = np.asarray(exclusive_of_op, dtype=np.float64)
    blocked = busy.blocked
    over = np.asarray(linked, dtype=bool) & (blocked > exclusive)
    blocked[over] = exclusive[over]
    busy.sim = exclusive - blocked - busy.deferred + busy.host_gap
    pieces = busy.pieces
    pieces.sim = pieces.length + pieces.host_gap  # host_gap: ``_gaps_after_pieces``


def _pre_trace_lead(et_plus, main_first: float, main_root: int, busy: BusyTimes, skew=None) -> None:
    """When GPU work launched before the trace (GPU nodes without a launch) started before the
    main thread's first linked op, the host was busy with untraced work for that long: fold the lead
    into the main thread's root (``host_gap``), so a replay issues the traced ops that much after
    the untraced GPU work begins, as measured. The GPU start is read on the host's clock: less the
    local skew (``clocks.clock_skew(..., unqueued=True)``: an estimate free of queueing, since it is
    added here; ``skew`` None: equal clocks). O(g)."""
    if main_root < 0:
        return
    earliest = min((link.event.ts for link in et_plus.gpu_links if link.before_trace),
                   default=math.inf)
    if earliest < math.inf and skew is not None:
        earliest -= skew.at(earliest)
    if earliest < main_first:
        busy.host_gap[main_root] += main_first - earliest


@dataclass
class Burst:
    """A run of a non-main thread's ops (``_bursts``): its ``first`` and ``last`` positions on the
    thread's timeline, its ``start`` and ``end`` (µs), and the main-thread position of the op
    last started before it (``source``, -1: none)."""

    first: int
    last: int
    start: float
    end: float
    source: int


def _bursts(timeline: Timeline, main: MainThread, handed_with_previous: set[int] = frozenset()) -> list[Burst]:
    """The thread's bursts: its top-level ops that began after the same main-thread op, an op of
    ``handed_with_previous`` in the burst of the op before it whatever the main thread ran."""
    bursts: list[Burst] = []
    frontier = -math.inf
    for p, (start, end) in enumerate(zip(timeline.starts, timeline.ends)):
        top = start >= frontier
        source = main.last_started(start)
        if top and (not bursts or (bursts[-1].source != source and timeline.ops[p] not in handed_with_previous)):
            bursts.append(Burst(p, p, start, end, source))
        else:
            bursts[-1].last = p
            bursts[-1].end = max(bursts[-1].end, end)
        frontier = max(frontier, end)
    return bursts


def _collective_waits(et_plus, collectives: dict, main: MainThread, starts: list[float], ends: list[float],
                      segment_waits: dict, busy: BusyTimes) -> set[int]:
    """The main thread's waits for CPU collectives, found from their consumers on it
    (``cpu_comm.consumers``): a ``join`` edge collective -> consumer, and the idle stretch before
    the consumer — from the later of the thread's last activity and the collective's issue (its
    issuing call's end: a worker that picked it up late kept the thread waiting too, and the replay
    holds that pickup in the collective's start), to the consumer's start — as a wait, when the
    collective had not ended before that stretch. The
    thread was woken when the last collective it waited for ended: the latest end (each capped
    at its consumer's start) of the collectives that ended during the stretch. What follows that
    end (on a loaded host, milliseconds) is host time before the consumer (``_resume_after``: a
    piece of its own, which the joins release), so a replay resumes the thread that long after
    that end, as measured, instead of running it before.
    A collective with a wait op (``cpu_comm.wait_ops``: functional collectives) that began after
    it ended has that op as its consumer; one that began before holds the wait itself.
    Returns, per collective, the op in which the thread may have waited for it when its worker's
    burst ended (``_cross_thread``): its wait op when the thread sat in it, else the call that
    issued it (a call that returns only when the
    collective is done holds the wait in its own time), or None for a collective whose record
    function ended after its consumer began (no join from the worker's end: it is not when the
    result was there); a collective with neither is absent. O(m) parses for the main-thread ops
    swept, O(c log c) for c collectives."""
    from linker.plan.cpu_comm import consumers, issuing_calls, wait_ops  # a sibling idea of the plan wing

    et = et_plus.et
    issued = issuing_calls(et_plus, collectives)
    tl = main.timeline
    timed = {i: starts[i] for i in collectives if not math.isnan(starts[i])}
    issued_at = {i: min(start, starts[issued[i]]) if i in issued else start for i, start in timed.items()}
    waited = wait_ops(et, collectives, tl.ops, tl.starts, issued_at, issued)
    sat_in = {i: op for i, op in waited.items() if starts[op] < ends[i]}  # the thread waited in it
    found = consumers(et, {i: attrs for i, attrs in collectives.items() if i not in waited}, tl.ops, tl.starts, timed,
                      issued)
    found.update((i, op) for i, op in waited.items() if i not in sat_in)
    done = {i: min(ends[i], starts[found[i]]) if i in found else ends[i] for i in timed}
    done_at = sorted(done.values())
    for collective, consumer in found.items():
        busy.cross.append(CrossEdge(collective, consumer, JOIN))
        at = starts[consumer]
        busy.consumed_at[collective] = at
        idle = _idle_before(main, consumer, at)
        if idle is None:
            continue
        segment, last_end = idle
        call = issued.get(collective, -1)  # waiting began once the call had issued it (picked up or not)
        since = ends[call] if call >= 0 and not math.isnan(ends[call]) else starts[collective]
        lo, hi = max(segment.start, last_end, min(since, starts[collective])), done[collective]
        if hi > lo:  # it waited; woken when the last collective it waited for ended, or later
            _add_wait(segment_waits, segment, lo, at)
            idle_from = max(segment.start, last_end)
            woken = done_at[bisect_right(done_at, at) - 1]  # the latest end at or before the consumer
            busy.resume_joins.add((collective, consumer))
            if woken > idle_from:
                _resume_after(busy, consumer, segment, woken, at - woken)
    waiters: dict[int, int | None] = dict(issued)
    waiters.update((i, None) for i, consumer in found.items() if ends[i] > starts[consumer])
    waiters.update(sat_in)
    return waiters


def _point_to_point(collectives: dict | None) -> list[int]:
    """The sends and receives among ``collectives`` (``cpu_comm``)."""
    from linker.plan.cpu_comm import is_point_to_point  # a sibling idea of the plan wing

    return [i for i, attrs in (collectives or {}).items() if is_point_to_point(attrs)]


def _sends_begun_in_their_call(et, collectives: dict | None, main: Timeline | None, starts: list[float],
                               busy: BusyTimes) -> list[BlockedStretch]:
    """The ``BlockedStretch`` of the call, added to its blocked time, for each CPU send on the main thread
    whose transfer began in the call that issued it: gloo's ``c10d::send`` writes the bytes to the
    transport before it makes the record (a send of 1 MB: 5.8 ms of its call, the record made at its
    end, after the receive had ended). The call's time before the record, when nothing else of its
    thread began in it, is the transfer's: blocked time of the call, and the send busy from the
    call's start (``begun_at``, ``cpu_comm.hold_for_measured_duration``). O(s log m) for s sends."""
    from linker.plan.cpu_comm import is_send  # a sibling idea of the plan wing

    found = []
    if main is None:
        return found
    parent_index = et.parent_index()
    for i, attrs in (collectives or {}).items():
        call = parent_index[i]
        if not is_send(attrs) or et.tid[i] != busy.main_tid or call < 0 or not starts[call] < starts[i]:
            continue
        first = bisect_right(main.starts, starts[call])
        if first < len(main.starts) and main.starts[first] < starts[i]:
            continue  # the call ran an op of its own first
        found.append(BlockedStretch(call, starts[call], starts[i] - starts[call]))
        busy.blocked[call] += starts[i] - starts[call]
        busy.begun_at[i] = starts[call]
    return found


def _off_timeline(linked: list[bool], point_to_point: list[int]) -> list[bool]:
    """Which ops go on their thread's timeline: the linked ones but the sends' and receives'
    records, which span what their thread did meanwhile (``linked`` itself when there are none)."""
    if not point_to_point:
        return linked
    on_timeline = list(linked)
    for i in point_to_point:
        on_timeline[i] = False
    return on_timeline


def _point_to_point_waits(point_to_point: list[int], tid: list[int], main: MainThread, starts: list[float],
                          ends: list[float], segment_waits: dict, busy: BusyTimes) -> None:
    """The main thread's waits for its CPU sends and receives (``cpu_comm``). The record ends when
    the thread that waited for the transfer saw it done, so where the thread was at that end is
    where it waited: idle inside op W since its last activity (at the earliest the record's
    start), or in a host gap; that stretch is a wait, and a ``join`` edge from the transfer goes
    to W's part after the end (``resumed_at``), or, when W ends right after it or the thread sat
    in a gap, to the op it went on to. A record that ended while the thread ran an op's child
    (none of its ops waited for it) gets a ``join`` to the first op starting after it only; a
    record of another thread than the main one, neither (its waits are not looked for).
    O(s (log m + depth)) for s records, m main-thread ops."""
    for i in point_to_point:
        if math.isnan(starts[i]) or tid[i] != busy.main_tid:
            continue
        end = ends[i]
        segment = main.idle_segment(end)
        if segment is None:
            target = main.first_starting(end)
            if target >= 0:
                busy.cross.append(CrossEdge(i, target, JOIN))
            continue
        if end > segment.start:
            _add_wait(segment_waits, segment, max(starts[i], segment.start), end)
        _join_where_it_went_on(busy, i, segment, end)


def _join_where_it_went_on(busy: BusyTimes, source: int, segment: IdleSegment, end: float, spawner: int = -1) -> None:
    """A ``join`` from ``source`` to where the main thread went on after it sat idle in
    ``segment`` until ``end``: the op it waited in, to its part after ``end`` (``resumed_at``: that
    op's stretch is cut there), when that op's own time went on after the wait (more than
    ``HANDOFF_CUT_MIN_US``), or when no op followed and the op is not ``spawner`` (the op that
    started the worker whose work ended: it ran on, it did not wait); else the op it resumed at
    (none: no edge)."""
    in_waiter = segment.waiter >= 0 and (segment.end - end > HANDOFF_CUT_MIN_US
                                         or (segment.resume < 0 and segment.waiter != spawner))
    target = segment.waiter if in_waiter else segment.resume
    if target >= 0:
        busy.cross.append(CrossEdge(source, target, JOIN))
        if in_waiter:
            busy.resumed_at[(source, target)] = end


def _idle_before(main: MainThread, consumer: int, at: float):
    """(the main thread's idle segment that ``consumer``, starting at ``at``, resumes; the latest
    end at or before ``at`` among the ``SEARCH_LIMIT`` ops before it), or None when the consumer
    does not end an idle segment. O(SEARCH_LIMIT)."""
    tl = main.timeline
    q = main.position[consumer]
    last_end = max((tl.ends[p] for p in range(q - 1, max(-1, q - 1 - SEARCH_LIMIT), -1) if tl.ends[p] <= at),
                   default=-math.inf)
    segment = main.idle_segment(math.nextafter(at, -math.inf))
    if segment is None or segment.resume != consumer:
        return None
    return segment, last_end


def _lost_collective_waits(et, collectives: dict, lost: list[int], main: MainThread, starts: list[float],
                           ends: list[float], segment_waits: dict, busy: BusyTimes) -> None:
    """The main thread's waits for collectives the ET lost (their issuing calls ``lost``): no
    node holds such a wait, so the idle stretch before the op that reads the call's tensors (its
    consumer, found as ``cpu_comm.consumers`` finds one, from the call's end) is taken out of the
    op (or gap) it sat in and held before the consumer (``_resume_after``: a piece of no busy
    time): the replay runs it where it occurred, at the end of the step, instead of before the
    step's children. Only the part after
    the last recorded collective that ended in that stretch: until then the thread waited for that
    one too (its join holds it). O(m) parses for the main-thread ops swept."""
    from linker.plan.cpu_comm import consumers

    tl = main.timeline
    timed = {i: ends[i] for i in lost if not math.isnan(ends[i]) and i in main.position}
    found = consumers(et, {i: None for i in timed}, tl.ops, tl.starts, timed)
    done_at = sorted(min(ends[i], busy.consumed_at.get(i, ends[i])) for i in (collectives or ())
                     if not math.isnan(ends[i]))
    for call, consumer in found.items():
        at = starts[consumer]
        idle = _idle_before(main, consumer, at)
        if idle is None:
            continue
        segment, last_end = idle
        p = bisect_right(done_at, at) - 1  # a recorded collective that ended meanwhile held the wait until then
        lo = max(segment.start, last_end, ends[call], done_at[p] if p >= 0 else -math.inf)
        if at > lo:
            _add_wait(segment_waits, segment, lo, at)
            _resume_after(busy, consumer, segment, lo, at - lo)


def _cross_thread(main: MainThread, timeline: Timeline, root: int, segment_waits: dict,
                  busy: BusyTimes, burst_firsts: set[int], waiters: dict[int, int | None] | None = None,
                  handed_with_previous: set[int] = frozenset()) -> None:
    """Fork and join edges for one non-main thread's bursts; the main thread's waits go to
    ``segment_waits`` (by segment key: ``SegmentWait``). A burst holding a
    CPU collective of ``waiters`` (``_collective_waits``) gets a join here only when the main
    thread sat, as it ended, in the call that issued it, or in an op around that call which it
    went on to straight from the call (``_waited_in``), and never the hand-back below (a
    collective's worker hands the thread no work): elsewhere the thread did not wait for it
    there (DDP's backward computes on while a bucket's all-reduce runs); its wait, if any, is the
    consumer's."""
    tl = main.timeline
    issued_ends = sorted(tl.ends[main.position[call]] for call in set((waiters or {}).values())
                         if call is not None and call in main.position)
    for number, burst in enumerate(_bursts(timeline, main, handed_with_previous)):
        first, last, start, end, source = burst.first, burst.last, burst.start, burst.end, burst.source
        first_op, last_op = timeline.ops[first], timeline.ops[last]
        burst_firsts.add(first_op)
        at_start, at_end = main.idle_segment(start), main.idle_segment(end)
        joined_in = None
        held = [waiters[op] for op in timeline.ops[first:last + 1] if op in waiters] if waiters else []
        if held:
            end = _handed_back_at(timeline, first, last, waiters)
            at_start, at_end = None, main.idle_segment(end)
            if at_end is not None and not any(_waited_in(main, at_end, call, issued_ends) for call in held):
                at_end = None
        if at_end is not None and end > at_end.start:
            _add_wait(segment_waits, at_end, max(start, at_end.start), end)
            _join_where_it_went_on(busy, last_op, at_end, end, tl.ops[source] if source >= 0 else -1)
            joined_in = at_end.waiter
        if (at_start is not None and at_start.inside and at_start.waiter >= 0
                and (at_end is None or at_start.key != at_end.key)):
            # the main thread waited in W until this thread handed it work (W's next child)
            _add_wait(segment_waits, at_start, start, at_start.end)
            handed = _last_ended_before(timeline, first, last, at_start.end)
            if handed >= 0:
                busy.cross.append(CrossEdge(handed, at_start.resume, JOIN))
        if source < 0:
            continue
        spawner = tl.ops[source]
        if number == 0 and root >= 0 and tl.ends[source] > start and joined_in != spawner:
            busy.host_gap[root] += start - tl.starts[source]
            if source > 0:
                busy.cross.append(CrossEdge(tl.ops[source - 1], root, FORK))
                busy.spawned_at[root] = tl.starts[source]
        elif tl.ends[source] <= start:
            busy.cross.append(CrossEdge(spawner, first_op, FORK))
        else:  # the main op was still running: the burst follows the last main op that had ended
            done = _last_ended_position(tl, source, start)
            if done >= 0:
                busy.cross.append(CrossEdge(tl.ops[done], first_op, FORK))


SEARCH_LIMIT = 64  # main-thread ops looked back at for the last one that had ended
CALL_RETURN_SLACK_US = 1.0  # a stretch that begins within this of a call's end begins as the call returns


def _handed_back_at(timeline: Timeline, first: int, last: int, collectives) -> float:
    """When the work of a burst holding CPU collectives (``collectives``) was done: the latest,
    over its collectives, of the end of the last op the worker ran inside the collective's record
    after it began communicating (gloo's copy of each rank's part out of an ``all_gather``), else
    of the record's end. The waiting thread is woken there; the record itself closes a little
    later (the backend completes the work inside it). The ops inside a record are those after it
    in start order up to the first that starts at or after its end. O(burst + ops inside)."""
    done = -math.inf
    for p in range(first, last + 1):
        if timeline.ops[p] in collectives:
            record_end = timeline.ends[p]
            q = p + 1
            while q <= last and timeline.starts[q] < record_end:
                q += 1
            inside = timeline.ends[p + 1:q]
            done = max(done, max(inside) if inside else record_end)
    return done


def _waited_in(main: MainThread, segment: IdleSegment, call: int | None, issued_ends: list[float]) -> bool:
    """True when the main thread, idle in ``segment`` as a worker's collective ended, was waiting
    for the collective ``call`` issued (``call``: its issuing call, None when no wait is held
    there; ``issued_ends``: where the thread's calls that issued collectives returned, sorted):
    the segment is inside the call itself, or inside an op around the call that the thread sat in
    from the return of a call that issued a collective (this one or a later one: nothing ran
    between). FSDP waits so for its ``all_gather`` inside ``FSDP::all_gather``, ZeroRedundancy-
    Optimizer for its broadcasts at the end of its step: ``work.wait()`` has no record function
    of its own. O(depth + log calls)."""
    if call is None or segment.waiter < 0:
        return segment.waiter == call
    if segment.waiter == call:
        return True
    k = bisect_left(issued_ends, segment.start - CALL_RETURN_SLACK_US)
    if k == len(issued_ends) or issued_ends[k] > segment.start + CALL_RETURN_SLACK_US:
        return False
    node = main.parent_index[call]
    while node >= 0 and node != segment.waiter:
        node = main.parent_index[node]
    return node == segment.waiter


def _last_ended_position(tl: Timeline, source: int, t: float) -> int:
    """The latest main-thread position at or before ``source`` whose op had ended by t (-1 if
    none within ``SEARCH_LIMIT`` positions: the enclosing ops of a running op are skipped)."""
    for p in range(source, max(-1, source - SEARCH_LIMIT), -1):
        if tl.ends[p] <= t:
            return p
    return -1


def _add_wait(segment_waits: dict, segment: IdleSegment, lo: float, hi: float) -> None:
    """Record that the main thread waited from ``lo`` to ``hi`` in ``segment``: a new
    ``SegmentWait``, or the segment's one widened to cover both."""
    wait = segment_waits.get(segment.key)
    if wait is None:
        segment_waits[segment.key] = SegmentWait(segment.waiter, segment.position, lo, hi)
    else:
        wait.start, wait.end = min(wait.start, lo), max(wait.end, hi)


def _last_ended_before(timeline: Timeline, first: int, last: int, t: float) -> int:
    """The op of positions first..last with the latest end at or before t (-1 if none)."""
    best, best_end = -1, -math.inf
    for p in range(first, last + 1):
        end = timeline.ends[p]
        if best_end < end <= t:
            best, best_end = timeline.ops[p], end
    return best


def _host_gaps(busy: BusyTimes, timeline: Timeline, gap_waits: dict[int, float] | None,
               burst_firsts: set[int]) -> None:
    """Fold uncovered time between a thread's ops into the op before the gap (minus join waits):
    the gaps are where an op starts after every earlier op ended (a column pass finds them)."""
    ops, starts = timeline.ops, timeline.starts
    frontier = timeline.frontier()  # frontier[p - 1]: latest end before op p
    for p in [p for p in range(1, len(ops)) if starts[p] > frontier[p - 1]]:
        if ops[p] in burst_firsts:
            continue
        gap = starts[p] - frontier[p - 1]
        if gap_waits is not None:
            gap -= gap_waits.get(p - 1, 0.0)
        if gap > 0:
            busy.host_gap[ops[p - 1]] += gap
            busy.trailing_gap[ops[p - 1]] = busy.trailing_gap.get(ops[p - 1], 0.0) + gap


def nesting_parent_ops(et_plus) -> list[int]:
    """Per ET node, the linked op of its Kineto event's nearest enclosing event that has one
    (-1: unlinked or top level), passing over events no op is linked to: an op the ET lost
    (``LinkResult.linked_ancestors``), whose own time is the enclosing op's exclusive time
    (``link.etplus.op_exclusive_times``), so the later pieces of that op are cut around the lost
    op's children too. Array passes and the inverse of ``event_of_op``: O(n + E), O(E · depth)
    when the ET lost ops."""
    result = et_plus.result
    op_of = np.append(np.asarray(_op_of_event(result), dtype=np.int64), -1)  # [-1]: no event
    above = np.append(result.linked_ancestors(), -1)
    return op_of[above[np.asarray(result.match.event_of_op, dtype=np.int64)]].tolist()

"""Later pieces: an op's exclusive time after its first child, as nodes of their own.

A replay runs an op's busy time before its first child, so the op keeps only the part of its
exclusive time before that child; each later piece (between children, after the last) becomes a
node of its own (``Pieces``): the same op's time, run where the thread ran it, right after the op
that precedes the piece in the thread's start order, less the blocked time lying in it (a wait
stays a wait). Every microsecond stays on the op that spent it. The rule and its reasons:
docs/durations.md. ``busy.compute_busy`` calls ``later_pieces`` with its per-thread timelines;
``deps.plan_dependencies`` threads the pieces into the thread chains. Cost: see ``later_pieces``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np


# A hand-off whose work began less than this before its stretch of the handing op ended leaves
# the stretch whole: a microsecond is the ``.et``'s unit, and a cut that fine changes no replay.
HANDOFF_CUT_MIN_US = 1.0


@dataclass(eq=False)
class Pieces:
    """The later pieces of the ops, one entry each (index j), in ``begin`` order (ties, on
    other threads: in the order found, thread by thread): columns, numpy arrays.

    ``owner[j]``: the ET index of the op whose exclusive time it is; ``after[j]``: the ET index of
    the op the thread ran just before it (the last op started before the piece began: the last of
    the previous child's subtree in start order); ``begin[j]`` / ``end[j]``: where it lies on the
    measured timeline (µs), ``length[j]``: its busy µs (``end - begin`` less the blocked time in
    it, at most what its op has left). Pieces of no busy time are left out. ``host_gap[j]``: the
    host time between ops that follows the piece (``busy``), and ``sim[j]``: its busy time plus
    that gap, what a replay holds the CPU for (both set by ``busy``)."""

    owner: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    after: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    begin: np.ndarray = field(default_factory=lambda: np.empty(0))
    end: np.ndarray = field(default_factory=lambda: np.empty(0))
    length: np.ndarray = field(default_factory=lambda: np.empty(0))
    host_gap: np.ndarray = field(default_factory=lambda: np.empty(0))
    sim: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __len__(self) -> int:
        return len(self.owner)

    def last_after(self) -> dict[int, int]:
        """Op -> index of the last piece run after it (the pieces are in begin order). O(p)."""
        return dict(zip(self.after.tolist(), range(len(self))))

    def at(self, op: int, begin: float) -> int:
        """Index of ``op``'s piece beginning at ``begin`` (-1 if none). O(log p + ties)."""
        j = int(np.searchsorted(self.begin, begin, side="left"))
        while j < len(self) and self.begin[j] == begin:
            if self.owner[j] == op:
                return j
            j += 1
        return -1

    def __eq__(self, other) -> bool:
        return isinstance(other, Pieces) and all(
            np.array_equal(getattr(self, column.name), getattr(other, column.name)) for column in fields(self))


NO_OPS, NO_TIMES = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)


class Handoff(NamedTuple):
    """Work an op handed off: the ``op`` (-1: none, the thread was between ops), where it handed
    the work off (``at``: its launch call's start, a fork's time) and where the work began
    (``work_start``), µs."""

    op: int
    at: float
    work_start: float


class BlockedStretch(NamedTuple):
    """A stretch of an op's time in which it sat blocked (a blocking call, a wait for other work):
    the ``op``, where the stretch began and how long it lasted (µs)."""

    op: int
    start: float
    length: float


def later_pieces(timelines, parent_op: list[int], ends_of: list[float], exclusive_of_op: list[float],
                 blocked_of: list[float], blocked_at: list[BlockedStretch], n: int,
                 skip: frozenset = frozenset(), handoffs: list[Handoff] = ()
                 ) -> tuple[np.ndarray, Pieces]:
    """Each op's exclusive time after its first child, as pieces a replay runs where they lay.

    A replay runs an op's busy time before its first child (which depends on it), but the measured
    exclusive time lies in pieces: before the first child, between children, after the last one.
    The op keeps the first piece. Each later piece begins where a child q ends and lasts until the
    thread's next op starts or the op ends; it runs after the op that precedes it in the thread's
    start order (the last op started before q's end: the last of q's subtree in the ET pre-order a
    replay follows). Blocked time stays a wait where it was: a
    blocked stretch (``blocked_at``: ``BlockedStretch``, the op's blocking calls and waits) lying in a
    moved piece is left out of what moves. What moves from an op never exceeds its exclusive time
    less its blocked time (``blocked_of``): a piece may hold a Kineto child no op is linked to,
    which is not exclusive time; an op's pieces then move in time order until that is used up.

    A stretch of an op (its own part before its first child, or a piece) is also cut where the op
    handed off work that began before the stretch ended (``cut_at_handoffs``): a GPU op it
    launched, or another thread's burst it forked. The edge to that work comes from the part of
    the op that ran up to the hand-off, so a kernel waits for what its launcher had done by then,
    not for the rest of the stretch (nor for the call itself: a copy from pageable memory runs
    during its call), and a worker's burst for what the main thread had run when it began.

    ``timelines``: per thread, the linked ops in start order (``Timeline``); ``parent_op``: each
    op's enclosing linked op by the Kineto nesting (``nesting_parent_ops``); ``ends_of``: each
    op's measured end; ``skip``: ops whose pieces stay on them and that no piece follows (CPU
    collectives: their busy time comes from their measured interval); ``handoffs``: ``Handoff``
    records: the start of the launch call and of the GPU op for each GPU op with a launch call,
    the burst's start twice for a fork. Returns ``deferred`` per
    ET node (µs taken out of an op: the sum of its pieces) and the ``Pieces``; per thread the
    total busy time is unchanged.

    Cost: O(m log m) per thread of m ops in numpy passes (one binary search per op), a step per
    child ending where the next op starts, O(b) for b blocked stretches and O(h log h) for h
    hand-offs; O(n) numbers. No scan per op.
    """
    parent = np.asarray(parent_op, dtype=np.int64)
    op_end = np.asarray(ends_of, dtype=np.float64)
    found = [_thread_pieces(timeline, parent, op_end) for timeline in timelines]
    owners, targets, begins, finishes = (np.concatenate([piece[k] for piece in found] or [empty])
                                         for k, empty in enumerate((NO_OPS, NO_OPS, NO_TIMES, NO_TIMES)))
    if skip:
        skipped = np.sort(np.fromiter(skip, dtype=np.int64, count=len(skip)))
        kept = ~(_among(owners, skipped) | _among(targets, skipped))
        owners, targets, begins, finishes = owners[kept], targets[kept], begins[kept], finishes[kept]
    handoffs = [h for h in handoffs if h[0] not in skip]
    if handoffs:
        owners, targets, begins, finishes = cut_at_handoffs(owners, targets, begins, finishes, handoffs,
                                                            _own_parts(timelines, parent, op_end, handoffs))
        order = np.argsort(begins, kind="stable")
        owners, targets, begins, finishes = owners[order], targets[order], begins[order], finishes[order]
    lengths = finishes - begins
    _leave_waits_in_place(owners, lengths, begins, blocked_at)
    deferred = np.bincount(owners, weights=lengths, minlength=n)  # adds in piece order, as a loop would
    room = np.asarray(exclusive_of_op, dtype=np.float64) - np.asarray(blocked_of, dtype=np.float64)
    held, runs = _pieces_of(owners, np.flatnonzero(deferred > room))
    for owner, (first, last) in runs.items():
        # pieces holding unlinked Kineto children: the op's pieces take in time order what it has
        left = max(0.0, float(room[owner]))
        pieces = held[first:last]
        for j in pieces.tolist():
            lengths[j] = min(lengths[j], left)
            left -= lengths[j]
        deferred[owner] = sum(lengths[pieces].tolist())
    kept = np.flatnonzero(lengths > 0.0)
    kept = kept[np.argsort(begins[kept], kind="stable")]
    pieces = Pieces(*(column[kept] for column in (owners, targets, begins, finishes, lengths)))
    return deferred, pieces


def _thread_pieces(timeline, parent: np.ndarray, op_end: np.ndarray) -> tuple[np.ndarray, ...]:
    """The later pieces of one thread's ops, in the order of the children that begin them:
    (owner, the op run just before, begin, finish) columns. A piece begins where a child of a
    linked op ends and finishes where the thread's next op starts or its op ends, whichever is
    first; empty ones are left out. O(m log m) for m ops."""
    ops = np.asarray(timeline.ops, dtype=np.int64)
    starts = np.asarray(timeline.starts, dtype=np.float64)
    in_op = parent[ops] >= 0
    child = ops[in_op]  # each child of a linked op ends a piece of it
    owner = parent[child]
    begin = np.asarray(timeline.ends, dtype=np.float64)[in_op]
    next_op = np.searchsorted(starts, begin, side="left")  # the thread's next op starting then or later
    next_start = np.append(starts, np.inf)
    _past_the_child(next_op, begin, child, ops, next_start, parent)
    finish = np.minimum(next_start[next_op], op_end[owner])
    found = finish > begin
    # The op started last before the piece began: a piece of positive length ends at a start after
    # its child's end, hence after the child's own start, so ``next_op`` > the child's position.
    return owner[found], ops[next_op[found] - 1], begin[found], finish[found]


def _past_the_child(next_op: np.ndarray, begin: np.ndarray, child: np.ndarray, ops: np.ndarray,
                    next_start: np.ndarray, parent: np.ndarray) -> None:
    """Move each ``next_op[k]`` (the first position of the thread starting at or after ``begin[k]``,
    child ``child[k]``'s end) past that child and the ops inside it starting exactly at its end: a
    child of no duration starts at its own end, and an op of no duration at the end of its parent
    (``aten::zero_`` closing ``aten::zeros``) is not the op the thread ran next either; taking
    them for it left the gap after the child on the parent's first part. Only positions whose op
    starts exactly at the child's end are looked at (few), each with an ancestor walk bounded by
    the tree's depth. O(m) to find them."""
    for k in np.flatnonzero(next_start[next_op] == begin).tolist():
        position, end, ancestor = int(next_op[k]), begin[k], int(child[k])
        while next_start[position] == end and (ops[position] == ancestor or _inside(int(ops[position]), ancestor, parent)):
            position += 1
        next_op[k] = position


def _inside(op: int, ancestor: int, parent) -> bool:
    """Whether ``ancestor`` encloses ``op`` by the Kineto nesting (``parent``, -1 at the top)."""
    op = parent[op]
    while op >= 0:
        if op == ancestor:
            return True
        op = parent[op]
    return False


def _own_parts(timelines, parent: np.ndarray, op_end: np.ndarray,
               handoffs: list[Handoff]) -> dict[int, tuple[float, float]]:
    """Each op that handed work off -> its own part: from its start to its first child's start
    (its end when it has none). O(m log m) over the threads' m ops in numpy passes."""
    handing = _ops_of(handoffs)
    parts: dict[int, tuple[float, float]] = {}
    for timeline in timelines:
        ops = np.asarray(timeline.ops, dtype=np.int64)
        wanted = np.flatnonzero(_among(ops, handing))
        if not len(wanted):
            continue
        starts = np.asarray(timeline.starts, dtype=np.float64)
        parents, first_child = np.unique(parent[ops], return_index=True)  # each parent's first child here
        handed = ops[wanted]
        k = np.minimum(np.searchsorted(parents, handed), len(parents) - 1)
        own_end = np.where(parents[k] == handed, np.minimum(op_end[handed], starts[first_child[k]]), op_end[handed])
        parts.update(zip(handed.tolist(), zip(starts[wanted].tolist(), own_end.tolist())))
    return parts


def cut_at_handoffs(owners: np.ndarray, targets: np.ndarray, begins: np.ndarray, finishes: np.ndarray,
                    handoffs: list[Handoff], own_parts: dict[int, tuple[float, float]]
                    ) -> tuple[np.ndarray, ...]:
    """Cut the stretches of an op where it handed off work (a launch call, a fork) that began
    before the stretch ended (by more than ``HANDOFF_CUT_MIN_US``): the stretch is the op's own
    part (``own_parts``) or one of its pieces (index j of the columns); a cut where the hand-off
    began ends the stretch there and makes the rest, the call included, a piece of its own (same
    op; following what the stretch followed: the op itself for its own part, ``targets[j]`` for a
    piece), appended to the columns, which are returned. The edge to the work then comes from the
    part that ran up to the hand-off (``deps.OpParts.before`` / ``ran_before``). The hand-offs of a
    stretch are taken latest first, so each is checked against the part it ends up in.
    O(h log h + p) for h hand-offs and p pieces."""
    stretches: dict[int, list[tuple[float, float, int]]] = {}  # op -> (begin, end, piece j or -1)
    for op, (begin, end) in own_parts.items():
        stretches[op] = [(begin, end, -1)]
    for j in np.flatnonzero(_among(owners, _ops_of(handoffs))).tolist():
        stretches.setdefault(int(owners[j]), []).append((float(begins[j]), float(finishes[j]), j))
    for op_stretches in stretches.values():
        op_stretches.sort()
    by_stretch: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for op, call, work_start in handoffs:  # ``Handoff``: the call is where it handed the work off
        op_stretches = stretches.get(op)
        if op_stretches is None:
            continue
        k = bisect_right(op_stretches, (call, math.inf, math.inf)) - 1
        if k < 0 or not call < op_stretches[k][1]:
            continue  # the call begins outside the op's own time (in a child, or after the stretch)
        by_stretch.setdefault((op, k), []).append((call, work_start))
    finishes = finishes.copy()
    cut_owner: list[int] = []
    cut_target: list[int] = []
    cut_begin: list[float] = []
    cut_finish: list[float] = []
    for (op, k), calls in by_stretch.items():
        begin, end, j = stretches[op][k]
        follows = op if j < 0 else int(targets[j])
        for call, work_start in sorted(calls, reverse=True):
            if call <= begin or end - work_start <= HANDOFF_CUT_MIN_US or call >= end:
                continue
            cut_owner.append(op)
            cut_target.append(follows)
            cut_begin.append(call)
            cut_finish.append(end)
            end = call
        if j >= 0:
            finishes[j] = end
    return (np.concatenate((owners, np.array(cut_owner, dtype=np.int64))),
            np.concatenate((targets, np.array(cut_target, dtype=np.int64))),
            np.concatenate((begins, np.array(cut_begin, dtype=np.float64))),
            np.concatenate((finishes, np.array(cut_finish, dtype=np.float64))))


def _ops_of(rows: list[Handoff] | list[BlockedStretch]) -> np.ndarray:
    """The distinct ops of ``rows``, sorted. O(r log r)."""
    ops = np.sort(np.fromiter((row.op for row in rows), dtype=np.int64, count=len(rows)))
    return ops[np.append(True, ops[1:] != ops[:-1])] if len(ops) else ops  # np.unique imports numpy.ma: 20 ms


def _among(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is one of ``members`` (sorted, distinct): ``np.isin`` without the
    sort it falls back to for many members (``np.unique``, which imports numpy.ma: 20 ms).
    O(v log m)."""
    if not len(members):
        return np.zeros(len(values), dtype=bool)
    k = np.minimum(np.searchsorted(members, values), len(members) - 1)
    return members[k] == values


def _pieces_of(owners: np.ndarray, ops: np.ndarray) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    """The pieces of ``ops`` (sorted, distinct): their indices grouped by op, each op's in piece
    order, and op -> (first, last) of its run in them (ops without pieces left out). O(p + k log k)
    for p pieces, k of them of those ops."""
    held = np.flatnonzero(_among(owners, ops))
    held = held[np.argsort(owners[held], kind="stable")]
    first = np.searchsorted(owners[held], ops, side="left")
    last = np.searchsorted(owners[held], ops, side="right")
    return held, {op: (a, b) for op, a, b in zip(ops.tolist(), first.tolist(), last.tolist()) if a < b}


def _leave_waits_in_place(owners: np.ndarray, lengths: np.ndarray, begins: np.ndarray,
                          blocked_at: list[BlockedStretch]) -> None:
    """Shorten each piece (in ``lengths``, in place) by the blocked time of its op lying inside it
    (a wait is not busy time wherever it lies): a blocked stretch takes its overlap out of every
    piece it spans (a wait cut where the op resumed after several threads' ends spans the pieces
    between those ends). O(p + b log p) for p pieces and b blocked stretches, plus the pieces a
    stretch spans."""
    if not blocked_at or not len(owners):
        return
    held, runs = _pieces_of(owners, _ops_of(blocked_at))
    marks = begins[held].tolist()
    ends = (begins[held] + lengths[held]).tolist()
    held = held.tolist()
    for op, where, length in blocked_at:
        if op not in runs:
            continue
        first, last = runs[op]
        until = where + length
        k = max(first, bisect_right(marks, where, first, last) - 1)
        while k < last and marks[k] < until:
            overlap = min(ends[k], until) - max(marks[k], where)
            if overlap > 0:
                lengths[held[k]] = max(0.0, lengths[held[k]] - overlap)
            k += 1

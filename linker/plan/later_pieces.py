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
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import gt, not_, sub


# A hand-off whose work began less than this before its stretch of the handing op ended leaves
# the stretch whole: a microsecond is the ``.et``'s unit, and a cut that fine changes no replay.
HANDOFF_CUT_MIN_US = 1.0


@dataclass
class Pieces:
    """The later pieces of the ops, one entry each (index j), in ``begin`` order (ties, on
    other threads: in the order found, thread by thread).

    ``owner[j]``: the ET index of the op whose exclusive time it is; ``after[j]``: the ET index of
    the op the thread ran just before it (the last op started before the piece began: the last of
    the previous child's subtree in start order); ``begin[j]`` / ``end[j]``: where it lies on the
    measured timeline (µs), ``length[j]``: its busy µs (``end - begin`` less the blocked time in
    it, at most what its op has left). Pieces of no busy time are left out. ``host_gap[j]``: the
    host time between ops that follows the piece (``busy``), and ``sim[j]``: its busy time plus
    that gap, what a replay holds the CPU for (both set by ``busy``)."""

    owner: list[int] = field(default_factory=list)
    after: list[int] = field(default_factory=list)
    begin: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    length: list[float] = field(default_factory=list)
    host_gap: list[float] = field(default_factory=list)
    sim: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.owner)


def later_pieces(timelines, parent_op: list[int], ends_of: list[float], exclusive_of_op: list[float],
                 blocked_of: list[float], blocked_at: list[tuple[int, float, float]], n: int,
                 skip: frozenset = frozenset(), handoffs: list[tuple[int, float, float]] = ()
                 ) -> tuple[list[float], Pieces]:
    """Each op's exclusive time after its first child, as pieces a replay runs where they lay.

    A replay runs an op's busy time before its first child (which depends on it), but the measured
    exclusive time lies in pieces: before the first child, between children, after the last one.
    The op keeps the first piece. Each later piece begins where a child q ends and lasts until the
    thread's next op starts or the op ends; it runs after the op that precedes it in the thread's
    start order (the last op started before q's end: the last of q's subtree in the ET pre-order a
    replay follows). Blocked time stays a wait where it was: a
    blocked stretch (``blocked_at``: (op, where, µs), the op's blocking calls and waits) lying in a
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
    collectives: their busy time comes from their measured interval); ``handoffs``: (op, where it
    handed the work off, where the work began): the start of the launch call and of the GPU op for
    each GPU op with a launch call, the burst's start twice for a fork. Returns ``deferred`` per
    ET node (µs taken out of an op: the sum of its pieces) and the ``Pieces``; per thread the
    total busy time is unchanged.

    Cost: O(m log m) per thread of m ops in C passes (one bisect per op), a loop over the pieces
    found, O(b) for b blocked stretches and O(h log h) for h hand-offs; O(n) floats. No scan per op.
    """
    owners: list[int] = []
    targets: list[int] = []
    lengths: list[float] = []
    starts_at: list[float] = []
    finishes: list[float] = []
    own_parts: dict[int, tuple[float, float]] = {}  # op -> its own part (start, first child's start or end)
    for timeline in timelines:
        if handoffs:
            own_parts.update(_own_parts(timeline, parent_op, ends_of))
        ops, starts, ends = timeline.ops, timeline.starts, timeline.ends
        owner = list(map(parent_op.__getitem__, ops))
        if min(owner, default=-1) >= 0:  # every op in some linked op (the usual case)
            begin, own, child = ends, owner, ops  # a piece begins where a child ends; its op
        else:
            children = [i for i, parent in enumerate(owner) if parent >= 0]  # positions with a parent op
            if not children:
                continue
            begin, own, child = ([column[i] for i in children] for column in (ends, owner, ops))
        after = list(map(bisect_left, repeat(starts), begin))  # the thread's next op starting then or later
        next_start = starts + [math.inf]
        _past_the_child(after, begin, child, ops, next_start, parent_op)
        finish = list(map(min, map(next_start.__getitem__, after), map(ends_of.__getitem__, own)))
        length = list(map(sub, finish, begin))
        if not all(map(gt, length, repeat(0.0))):  # else (the usual case) every child ends a piece
            found = list(compress(range(len(length)), map(gt, length, repeat(0.0))))
            after, own, length, begin, finish = (list(map(column.__getitem__, found))
                                                 for column in (after, own, length, begin, finish))
        # The op started last before the piece began: a piece of positive length ends at a start
        # after its child's end, hence after the child's own start: ``after`` > the child, and
        # ``ops[after - 1]`` is ``op_before[after]`` (``op_before[0]`` is never read).
        op_before = [-1] + ops
        owners += own
        targets += map(op_before.__getitem__, after)
        lengths += length
        starts_at += begin
        finishes += finish
    if skip:
        kept = [j for j in compress(range(len(owners)), map(not_, map(skip.__contains__, owners)))
                if targets[j] not in skip]
        owners, targets, lengths, starts_at, finishes = ([column[j] for j in kept] for column in
                                                         (owners, targets, lengths, starts_at, finishes))
    if handoffs:
        cut_at_handoffs(owners, targets, starts_at, finishes, [h for h in handoffs if h[0] not in skip], own_parts)
        order = sorted(range(len(owners)), key=starts_at.__getitem__)
        owners, targets, starts_at, finishes = ([column[j] for j in order] for column in
                                                (owners, targets, starts_at, finishes))
        lengths = [finish - begin for begin, finish in zip(starts_at, finishes)]
    _leave_waits_in_place(owners, lengths, starts_at, blocked_at)
    deferred = [0.0] * n
    for owner, length in zip(owners, lengths):
        deferred[owner] += length
    over = set(compress(range(n), map(gt, deferred, map(sub, exclusive_of_op, blocked_of))))
    if over:  # pieces holding unlinked Kineto children: an op's pieces take in time order what it has
        for owner, pieces in _pieces_of(owners, over).items():
            left = max(0.0, exclusive_of_op[owner] - blocked_of[owner])
            for j in pieces:
                lengths[j] = min(lengths[j], left)
                left -= lengths[j]
            deferred[owner] = sum(lengths[j] for j in pieces)
    kept = sorted(compress(range(len(owners)), map(gt, lengths, repeat(0.0))), key=starts_at.__getitem__)
    pieces = Pieces(*([column[j] for j in kept] for column in (owners, targets, starts_at, finishes, lengths)))
    return deferred, pieces


def _past_the_child(after: list[int], begin: list[float], child: list[int], ops: list[int],
                    next_start: list[float], parent_op: list[int]) -> None:
    """Move each ``after[k]`` (the first position of the thread starting at or after ``begin[k]``,
    child ``child[k]``'s end) past that child and the ops inside it starting exactly at its end: a
    child of no duration starts at its own end, and an op of no duration at the end of its parent
    (``aten::zero_`` closing ``aten::zeros``) is not the op the thread ran next either; taking
    them for it left the gap after the child on the parent's first part. Only positions whose op
    starts exactly at the child's end are looked at (few), each with an ancestor walk bounded by
    the tree's depth. ``next_start``: the thread's op starts, then inf. O(m) to find them."""
    for k in [k for k, (start, end) in enumerate(zip(map(next_start.__getitem__, after), begin)) if start == end]:
        position = after[k]
        while next_start[position] == begin[k] and (
                ops[position] == child[k] or _inside(ops[position], child[k], parent_op)):
            position += 1
        after[k] = position


def _inside(op: int, ancestor: int, parent_op: list[int]) -> bool:
    """Whether ``ancestor`` encloses ``op`` by the Kineto nesting (``parent_op``, -1 at the top)."""
    op = parent_op[op]
    while op >= 0:
        if op == ancestor:
            return True
        op = parent_op[op]
    return False


def _own_parts(timeline, parent_op: list[int], ends_of: list[float]) -> dict[int, tuple[float, float]]:
    """Each op of a thread -> its own part: from its start to its first child's start (its end when
    it has none). O(m) over the thread's m ops in start order."""
    parts = {op: (start, ends_of[op]) for op, start in zip(timeline.ops, timeline.starts)}
    seen: set[int] = set()
    for op, start in zip(timeline.ops, timeline.starts):
        parent = parent_op[op]
        if parent >= 0 and parent not in seen and parent in parts:
            seen.add(parent)
            parts[parent] = (parts[parent][0], min(parts[parent][1], start))
    return parts


def cut_at_handoffs(owners: list[int], targets: list[int], begins: list[float], finishes: list[float],
                    handoffs: list[tuple[int, float, float]], own_parts: dict[int, tuple[float, float]]) -> None:
    """Cut the stretches of an op where it handed off work (a launch call, a fork) that began
    before the stretch ended (by more than ``HANDOFF_CUT_MIN_US``): the stretch is the op's own
    part (``own_parts``) or one of its pieces (index j of the columns); a cut where the hand-off
    began ends the stretch there and makes the rest, the call included, a piece of its own (same
    op; following what the stretch followed: the op itself for its own part, ``targets[j]`` for a
    piece), appended to the columns. The edge to the work then comes from the part that ran up to
    the hand-off (``deps.OpParts.before`` / ``ran_before``). The hand-offs of a stretch are taken
    latest first, so each is checked against the part it ends up in. O(h log h + p) for h
    hand-offs and p pieces."""
    if not handoffs:
        return
    stretches: dict[int, list[tuple[float, float, int]]] = {}  # op -> (begin, end, piece j or -1)
    for op, (begin, end) in own_parts.items():
        stretches[op] = [(begin, end, -1)]
    for j, op in enumerate(owners):
        stretches.setdefault(op, []).append((begins[j], finishes[j], j))
    for op_stretches in stretches.values():
        op_stretches.sort()
    by_stretch: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for op, call, work_start in handoffs:
        op_stretches = stretches.get(op)
        if op_stretches is None:
            continue
        k = bisect_right(op_stretches, (call, math.inf, math.inf)) - 1
        if k < 0 or not call < op_stretches[k][1]:
            continue  # the call begins outside the op's own time (in a child, or after the stretch)
        by_stretch.setdefault((op, k), []).append((call, work_start))
    for (op, k), calls in by_stretch.items():
        begin, end, j = stretches[op][k]
        follows = op if j < 0 else targets[j]
        for call, work_start in sorted(calls, reverse=True):
            if call <= begin or end - work_start <= HANDOFF_CUT_MIN_US or call >= end:
                continue
            owners.append(op)
            targets.append(follows)
            begins.append(call)
            finishes.append(end)
            end = call
        if j >= 0:
            finishes[j] = end


def _pieces_of(owners: list[int], wanted: set[int]) -> dict[int, list[int]]:
    """The pieces (indices into ``owners``) of each op in ``wanted``, in time order (a parent's
    children end in order). One C pass over the pieces and a loop over those kept."""
    pieces_of: dict[int, list[int]] = {}
    for j in compress(range(len(owners)), map(wanted.__contains__, owners)):
        pieces_of.setdefault(owners[j], []).append(j)
    return pieces_of


def _leave_waits_in_place(owners: list[int], lengths: list[float], starts_at: list[float],
                          blocked_at: list[tuple[int, float, float]]) -> None:
    """Shorten each piece by the blocked time of its op lying inside it (a wait is not busy time
    wherever it lies): a blocked stretch takes its overlap out of every piece it spans (a wait cut
    where the op resumed after several threads' ends spans the pieces between those ends).
    O(p + b log p) for p pieces and b blocked stretches, plus the pieces a stretch spans."""
    if not blocked_at or not owners:
        return
    pieces_of = _pieces_of(owners, {op for op, _, _ in blocked_at})
    marks_of = {op: [starts_at[j] for j in pieces] for op, pieces in pieces_of.items()}
    ends_of = {op: [starts_at[j] + lengths[j] for j in pieces] for op, pieces in pieces_of.items()}
    for op, where, length in blocked_at:
        pieces = pieces_of.get(op)
        if pieces is None:
            continue
        marks, ends, until = marks_of[op], ends_of[op], where + length
        k = max(0, bisect_right(marks, where) - 1)
        while k < len(pieces) and marks[k] < until:
            overlap = min(ends[k], until) - max(marks[k], where)
            if overlap > 0:
                lengths[pieces[k]] = max(0.0, lengths[pieces[k]] - overlap)
            k += 1

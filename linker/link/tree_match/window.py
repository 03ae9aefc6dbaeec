"""Which stretch of Kineto roots the ET lands on when Kineto holds clearly more (extra iterations,
annotations). Cost: O(m + n + WINDOW_POINTS * CHAIN_REACH * CHAIN_LOOKBACK).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from linker.link.tree_match.forest import IndexedForest
from linker.link.tree_match.sequences import candidate_pairs, longest_chain

WINDOW_POINTS = 20_000
"""About the most candidate root pairs chained to choose the Kineto window."""

WINDOW_HEAD = 512
"""ET roots whose labels place the ET within a longer Kineto forest."""

WINDOW_SLACK = 2
"""Extra Kineto roots on each side of the chosen window."""


def choose_kineto_window(et: IndexedForest, kineto: IndexedForest) -> tuple[int, int]:
    """Range [start, end) of Kineto roots (positions in kineto.roots) the ET roots are aligned with.

    Only when Kineto holds clearly more than the ET (more roots, and more nodes than a copy of the ET
    with extra events could explain: extra iterations or annotations) is a stretch chosen.  The
    labels of the first WINDOW_HEAD ET roots and equal Kineto root labels give candidate points
    (rarest labels first, about WINDOW_POINTS, candidate_pairs), chained with offsets measured in
    nodes (pre-order index; longest_chain): missing events make the offset drift slowly, a jump to
    another copy of an iteration moves it by a whole iteration.  The longest chain (earliest on a
    tie, so of identical copies the first) places the ET's start; the ET's node count, scaled by the
    node density the chain shows, places its end.
    O(m + n + WINDOW_POINTS * CHAIN_REACH * CHAIN_LOOKBACK) time, O(m + n + points) memory."""
    ra, rb = et.roots, kineto.roots
    m, n = len(ra), len(rb)
    et_nodes, kineto_nodes = len(et.label), len(kineto.label)
    if n <= m + 2 + m // 16 or kineto_nodes <= et_nodes + et_nodes // 4 + 64:
        return 0, n
    at_a: dict[int, list[int]] = {}
    for p in range(min(m, WINDOW_HEAD)):
        at_a.setdefault(et.label[ra[p]], []).append(p)
    at_b: dict[int, list[int]] = {}
    for q, y in enumerate(rb):
        if kineto.label[y] in at_a:
            at_b.setdefault(kineto.label[y], []).append(q)
    chain = longest_chain(candidate_pairs(at_a, at_b, WINDOW_POINTS), ra, rb)
    if not chain:
        return 0, n
    (p0, q0), (p1, q1) = chain[0], chain[-1]
    density = 1.0
    if ra[p1] - ra[p0] >= 64:
        density = min(2.0, max(0.5, (rb[q1] - rb[q0]) / (ra[p1] - ra[p0])))
    start_node = rb[q0] - (ra[p0] - ra[0]) * density
    end_node = rb[q0] + (et_nodes - ra[p0]) * density
    start = max(0, bisect_right(rb, start_node) - 1 - WINDOW_SLACK)
    end = min(n, bisect_left(rb, end_node) + WINDOW_SLACK)
    return start, max(start, end)

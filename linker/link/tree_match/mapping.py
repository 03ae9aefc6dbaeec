"""The final pass over a pairing: drop pairs until it is an ordered tree mapping, and group the
unpaired nodes into maximal unmatched subtrees. Cost: O(n log n).
"""

from __future__ import annotations

from linker.link.align import longest_increasing_chain
from linker.link.tree_match.forest import IndexedForest
from linker.link.tree_match.result import UnmatchedSubtree

def _nearest_paired_ancestor(forest: IndexedForest, pair: list[int]) -> list[int]:
    """For each node, its closest proper ancestor that is paired, or -1.  O(n)."""
    parent = forest.parent
    out = [-1] * len(parent)
    for i, p in enumerate(parent):
        if p >= 0:
            out[i] = p if pair[p] >= 0 else out[p]
    return out


def enforce_tree_mapping(et: IndexedForest, kineto: IndexedForest, pair_et: list[int],
                         pair_kineto: list[int]) -> int:
    """Drop pairs until the pairing is an ordered tree mapping; return how many were dropped.

    Ancestor rule: the nearest paired ancestors of the two nodes of a pair must be paired with each
    other (both -1 for none); checked for all pairs, repeated until stable (one or two O(n) rounds in
    practice).  Order rule: pairs sorted by ET index must have increasing Kineto index; the longest such
    chain is kept, O(n log n).  Dropping a consistent pair keeps the others consistent.  (A pair
    whose Kineto node points elsewhere, which the matcher never makes, would be dropped first.)"""
    dropped = 0
    for x, y in enumerate(pair_et):
        if y >= 0 and pair_kineto[y] != x:
            pair_et[x] = -1
            dropped += 1
    for y, x in enumerate(pair_kineto):
        if x >= 0 and pair_et[x] != y:
            pair_kineto[y] = -1
    while True:
        up_a = _nearest_paired_ancestor(et, pair_et)
        up_b = _nearest_paired_ancestor(kineto, pair_kineto)
        bad = []
        for x, y in enumerate(pair_et):
            if y >= 0:
                ax = up_a[x]
                if (pair_et[ax] if ax >= 0 else -1) != up_b[y]:
                    bad.append(x)
        if not bad:
            break
        for x in bad:
            pair_kineto[pair_et[x]] = -1
            pair_et[x] = -1
        dropped += len(bad)
    points = [(x, y) for x, y in enumerate(pair_et) if y >= 0]
    if any(points[k][1] > points[k + 1][1] for k in range(len(points) - 1)):
        keep = set(longest_increasing_chain(points))
        for x, y in points:
            if (x, y) not in keep:
                pair_et[x] = -1
                pair_kineto[y] = -1
                dropped += 1
    return dropped


def unmatched_subtrees(forest: IndexedForest, pair: list[int], names: list[str], side: str,
                       lo: int, hi: int) -> list[UnmatchedSubtree]:
    """Maximal connected groups of unpaired nodes inside [lo, hi): an unpaired node whose parent is
    paired (or a root) heads a group holding it and every unpaired node reachable from it through
    unpaired children.  A node missing on the other side whose children were paired is a group of
    one; an extra or unmatched subtree is one group of its size.  O(hi - lo)."""
    parent = forest.parent
    head = {}  # node -> head of its group, for unpaired nodes
    count: dict[int, int] = {}
    for i in range(lo, hi):
        if pair[i] >= 0:
            continue
        p = parent[i]
        h = head.get(p, i) if p >= lo else i
        head[i] = h
        count[h] = count.get(h, 0) + 1
    return [UnmatchedSubtree(side=side, root=h, label=names[h], size=c) for h, c in count.items()]

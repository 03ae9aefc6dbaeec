"""The forest matcher: a stack of tasks over disjoint subtrees (sibling sequences to align, or
subtrees below max_depth to align by order), the pairing being built, and ``match_forests`` tying
indexing, window, matcher and the final mapping pass together (method in the package docstring).
Cost: O(n + gap work); memory O(n) plus bounded DP tables.
"""

from __future__ import annotations

from dataclasses import asdict

from linker.link.tree_match.edit_distance import keyroot_cells, postorder_forest, tree_edit_pairs
from linker.link.tree_match.forest import IndexedForest, OrderedForest, children, index_forest, owner, preorder_of
from linker.link.tree_match.items import GapSolver
from linker.link.tree_match.mapping import enforce_tree_mapping, unmatched_subtrees
from linker.link.tree_match.result import ET_SIDE, KINETO_SIDE, ForestMatch, MatchStats
from linker.link.tree_match.sequences import align_tokens
from linker.link.tree_match.window import choose_kineto_window

# Leftover gaps -----------------------------------------------------------------------------------
TED_CELL_CAP = 60_000
"""Largest leftover gap (product of the key-root subtree sizes of both sides) given an exact ordered
tree edit distance."""

GAP_PREORDER_CAP = 500
"""A leftover gap too large for the tree edit distance is aligned on pre-order labels when its
subtrees hold at most this many nodes per side; otherwise it stays unpaired (gaps_unresolved)."""

# Task kinds and how a pair was made ---------------------------------------------------------------
_SIBLINGS = 0  # align two sibling sequences structurally
_ORDER = 1  # align the pre-order label sequences of subtrees below max_depth

_HOW_IDENTICAL = 1
_HOW_ALIGNED = 2
_HOW_ORDER = 3


class _Matcher:
    """The two indexed forests, the pairing being built (pair_et, pair_kineto: partner index or -1;
    how: _HOW_* per paired ET node) and a stack of pending tasks.

    A task is (_SIBLINGS, et items, kineto items): two sequences of sibling subtrees to align, or
    (_ORDER, et items, kineto items): subtrees below max_depth, aligned on pre-order labels.  Tasks
    cover disjoint subtrees, so each node is decided once: total work O(n + gap work)."""

    def __init__(self, et: IndexedForest, kineto: IndexedForest, max_depth: int) -> None:
        self.et = et
        self.kineto = kineto
        self.max_depth = max_depth
        self.pair_et = [-1] * len(et.label)
        self.pair_kineto = [-1] * len(kineto.label)
        self.how = bytearray(len(et.label))
        self.stats = MatchStats()
        self.gaps = GapSolver(et, kineto, self.stats)
        self.tasks: list[tuple[int, list[int], list[int]]] = []

    def run(self) -> None:
        """Process tasks until none is left."""
        while self.tasks:
            kind, xs, ys = self.tasks.pop()
            if kind == _SIBLINGS:
                self._siblings(xs, ys)
            else:
                self._by_order(xs, ys, _HOW_ORDER)

    # pairing primitives -----------------------------------------------------------------------
    def _pair_identical(self, x: int, y: int) -> None:
        """Pair the identical subtrees of x and y node by node (same pre-order offsets).  O(size)."""
        s = self.et.size[x]
        self.pair_et[x:x + s] = range(y, y + s)
        self.pair_kineto[y:y + s] = range(x, x + s)
        self.how[x:x + s] = bytes([_HOW_IDENTICAL]) * s

    def _pair_same_label(self, x: int, y: int) -> None:
        """Pair x and y (equal labels) and schedule their descendants."""
        et, kineto = self.et, self.kineto
        if et.shape[x] == kineto.shape[y]:
            self._pair_identical(x, y)
            return
        self.pair_et[x] = y
        self.pair_kineto[y] = x
        self.how[x] = _HOW_ALIGNED
        if et.size[x] == 1 or kineto.size[y] == 1:
            return
        kind = _ORDER if et.depth[x] >= self.max_depth else _SIBLINGS
        self.tasks.append((kind, children(et, x), children(kineto, y)))

    # region handlers --------------------------------------------------------------------------
    def _siblings(self, xs: list[int], ys: list[int]) -> None:
        """Align two sibling sequences on their labels (subtree shapes serve as extra anchors in long
        gaps; gaps are solved by GapSolver.solve); equal-label pairs are paired wholesale when their
        subtrees are identical, otherwise their children are aligned next; items left untouched on
        both sides of a stretch go to _gap."""
        et, kineto = self.et, self.kineto
        label_a, label_b, shape_a, shape_b = et.label, kineto.label, et.shape, kineto.shape
        pairs = align_tokens([label_a[x] for x in xs], [label_b[y] for y in ys], xs, ys, self.stats,
                             [shape_a[x] for x in xs], [shape_b[y] for y in ys], self.gaps.solve)
        for x, y in pairs:
            self._pair_same_label(x, y)
        if len(pairs) == len(xs) == len(ys):
            return
        item_a = {x: i for i, x in enumerate(xs)}
        item_b = {y: j for j, y in enumerate(ys)}
        last_a = last_b = -1
        touched = [(owner(et, x, item_a), owner(kineto, y, item_b)) for x, y in pairs]
        touched.append((len(xs), len(ys)))
        for i, j in touched:
            if i > last_a + 1 and j > last_b + 1:
                self._gap(xs[last_a + 1:i], ys[last_b + 1:j])
            last_a, last_b = max(last_a, i), max(last_b, j)

    def _gap(self, xs: list[int], ys: list[int]) -> None:
        """Siblings the sibling alignment left untouched, facing each other (both sides non-empty),
        e.g. nested missing nodes or an ambiguous run.  A small gap gets an exact ordered tree edit
        distance, run on the forests and on their mirror images; only the pairs both optima agree on
        are kept.  A larger one has its pre-order label sequences aligned if they are short enough
        (GAP_PREORDER_CAP), else it stays unpaired and is counted.  O(TED_CELL_CAP) or O(alignment)."""
        et, kineto = self.et, self.kineto
        if all(et.size[x] == 1 for x in xs) and all(kineto.size[y] == 1 for y in ys):
            return  # leaves only: the label alignment that left them unpaired is all there is
        nodes_a = sum(et.size[x] for x in xs)
        nodes_b = sum(kineto.size[y] for y in ys)
        if nodes_a * nodes_b <= TED_CELL_CAP:  # key-root cells are at least the node counts
            fa = postorder_forest(et, xs, mirror=False)
            fb = postorder_forest(kineto, ys, mirror=False)
            cells = keyroot_cells(fa) * keyroot_cells(fb)
            if cells <= TED_CELL_CAP:
                self.stats.ted_cells += 2 * cells
                forward = tree_edit_pairs(fa, fb)
                backward = set(tree_edit_pairs(postorder_forest(et, xs, mirror=True),
                                               postorder_forest(kineto, ys, mirror=True)))
                pair_et, pair_kineto, mark = self.pair_et, self.pair_kineto, self.how
                for x, y in forward:
                    if (x, y) in backward:
                        pair_et[x] = y
                        pair_kineto[y] = x
                        mark[x] = _HOW_ALIGNED
                    else:
                        self.stats.ambiguous_unpaired += 1
                return
        if nodes_a <= GAP_PREORDER_CAP and nodes_b <= GAP_PREORDER_CAP:
            self._by_order(xs, ys, _HOW_ALIGNED)
        else:
            self.stats.gaps_unresolved += 1

    def _by_order(self, xs: list[int], ys: list[int], how: int) -> None:
        """Pair the nodes of two subtree sequences by aligning their pre-order label sequences."""
        et, kineto = self.et, self.kineto
        pa = preorder_of(et, xs)
        pb = preorder_of(kineto, ys)
        la, lb = et.label, kineto.label
        pairs = align_tokens([la[p] for p in pa], [lb[q] for q in pb], pa, pb, self.stats)
        pair_et, pair_kineto, mark = self.pair_et, self.pair_kineto, self.how
        for x, y in pairs:
            pair_et[x] = y
            pair_kineto[y] = x
            mark[x] = how


def _paired_span(kineto: IndexedForest, pair_kineto: list[int]) -> tuple[int, int]:
    """[start, end) pre-order range from the first to the last Kineto root holding a pair (at least
    one pair exists).  O(Kineto nodes)."""
    first_root = last_root = -1
    for r in kineto.roots:
        end_r = r + kineto.size[r]
        if any(pair_kineto[k] >= 0 for k in range(r, end_r)):
            if first_root < 0:
                first_root = r
            last_root = r
    return first_root, last_root + kineto.size[last_root]

def match_forests(et: OrderedForest, kineto: OrderedForest, max_depth: int = 10) -> ForestMatch:
    """Pair the nodes of an ET forest with the nodes of a Kineto forest by structure (see the module
    docstring for the method and ForestMatch for the result).

    The Kineto roots may hold more than the ET (extra iterations or annotations): the ET roots are
    aligned with the best-matching stretch of Kineto roots, the Kineto roots outside it cost nothing.
    Nodes deeper than max_depth (roots have depth 0) are paired by order under their paired ancestor.
    Deterministic.  Time O(n log n + size of the differences) typical, memory O(n) plus bounded DP
    tables; raises ValueError on malformed input or a negative max_depth."""
    if max_depth < 0:
        raise ValueError("max_depth must be >= 0")
    label_ids: dict[str, int] = {}
    shape_ids: dict[tuple[int, ...], int] = {}
    ia = index_forest(et, label_ids, shape_ids)
    ib = index_forest(kineto, label_ids, shape_ids)
    del shape_ids
    matcher = _Matcher(ia, ib, max_depth)
    start, end = choose_kineto_window(ia, ib)
    if ia.roots and end > start:
        matcher.tasks.append((_SIBLINGS, ia.roots, ib.roots[start:end]))
    matcher.run()
    pair_et, pair_kineto = matcher.pair_et, matcher.pair_kineto
    dropped = enforce_tree_mapping(ia, ib, pair_et, pair_kineto)

    pairs = [(x, y) for x, y in enumerate(pair_et) if y >= 0]
    span = _paired_span(ib, pair_kineto) if pairs else (0, 0)
    counts = [0, 0, 0, 0]
    how = matcher.how
    for x, _ in pairs:
        counts[how[x]] += 1
    kineto_in_span = span[1] - span[0]
    unmatched = (unmatched_subtrees(ia, pair_et, et.labels, ET_SIDE, 0, len(pair_et))
                 + unmatched_subtrees(ib, pair_kineto, kineto.labels, KINETO_SIDE, *span))
    unmatched.sort(key=lambda u: (-u.size, u.side, u.root))
    stats = matcher.stats
    stats.paired_identical, stats.paired_aligned = counts[_HOW_IDENTICAL], counts[_HOW_ALIGNED]
    stats.paired_by_order, stats.inconsistent_dropped = counts[_HOW_ORDER], dropped
    return ForestMatch(
        pairs=pairs,
        edit_cost=(len(pair_et) - len(pairs)) + (kineto_in_span - len(pairs)),
        tree_nodes=(len(pair_et), len(pair_kineto)),
        unmatched_subtrees=unmatched,
        kineto_span=span,
        **asdict(stats),
    )

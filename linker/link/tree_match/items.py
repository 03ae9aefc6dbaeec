"""The gap solver of a sibling alignment: items whose label the other side lacks are opened (their
children stand in their place), then the item DP aligns the two sequences, where an item of either
side may also be opened inside the DP (one level of ordered tree edit distance on items).
Cost: O(m * n) C steps per gap (m * band with a band) + O(candidate cells) Python steps.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate

from linker.link.tree_match.forest import IndexedForest, children, labels_with_children, owner
from linker.link.tree_match.result import MatchStats
from linker.link.tree_match.sequences import GAP_SOLVE_CELLS, MAX_EXPANSION_NESTING, align_earliest


class GapSolver:
    """Solves the gaps of one match_forests call's sibling alignments; counts work in ``stats``.
    ``expansion_nesting``: how deep the current gap's expanded items were expanded again."""

    def __init__(self, et: IndexedForest, kineto: IndexedForest, stats: MatchStats) -> None:
        self.et = et
        self.kineto = kineto
        self.stats = stats
        self.expansion_nesting = 0

    def solve(self, xs: list[int], ys: list[int], mirror: bool,
              band: int | None = None) -> list[tuple[int, int, int, int]]:
        """Gap solver of a sibling alignment: expand items missing on the other side (_expand_absent),
        then align with item_dp (banded when band is given and nothing was expanded); an expanded gap
        too large for that is aligned again with align_earliest, whose gaps come back here (at most
        MAX_EXPANSION_NESTING levels deep; deeper, nothing is expanded any more).  Returns
        (i, j, x, y) sorted, i and j being the indices of the original items x and y descend from."""
        et, kineto, stats = self.et, self.kineto, self.stats
        if self.expansion_nesting >= MAX_EXPANSION_NESTING:
            return item_dp(et, kineto, xs, ys, mirror, stats, band)
        ex, ey, origin_a, origin_b = self._expand_absent(xs, ys, mirror)
        if ex is xs and ey is ys:
            return item_dp(et, kineto, xs, ys, mirror, stats, band)
        if len(ex) * len(ey) <= GAP_SOLVE_CELLS:
            return [(origin_a[i], origin_b[j], x, y) for i, j, x, y in item_dp(et, kineto, ex, ey, mirror, stats)]
        where_a = dict(zip(ex, origin_a))
        where_b = dict(zip(ey, origin_b))
        self.expansion_nesting += 1
        try:
            pairs = align_earliest([et.label[x] for x in ex], [kineto.label[y] for y in ey], ex, ey,
                                   stats, [et.shape[x] for x in ex], [kineto.shape[y] for y in ey],
                                   self.solve, mirror)
        finally:
            self.expansion_nesting -= 1
        found = [(owner(et, x, where_a), owner(kineto, y, where_b), x, y) for x, y in pairs]
        found.sort()
        return found

    def _expand_absent(self, xs: list[int], ys: list[int],
                       mirror: bool) -> tuple[list[int], list[int], list[int], list[int]]:
        """Replace every item whose label occurs neither among the other side's items nor among their
        children by its children, one level, ET side first, then the Kineto side against the new ET
        items: a node missing on one side (an ET node whose Kineto event is missing, an extra Kineto
        annotation, a relabelled node) has its children stand in its place.  A label found among the
        other side's children is left to item_dp's opening.  Returns the new lists and, for each new
        item, the index of the original item it descends from.  O(items + their children)."""
        et, kineto = self.et, self.kineto
        origin_a, origin_b = list(range(len(xs))), list(range(len(ys)))
        label_a, label_b, size_a, size_b = et.label, kineto.label, et.size, kineto.size
        labels_b = {label_b[y] for y in ys}
        if any(label_a[x] not in labels_b and size_a[x] > 1 for x in xs):
            xs, origin_a = _expand(et, xs, origin_a, labels_with_children(kineto, ys), mirror)
        labels_a = {label_a[x] for x in xs}
        if any(label_b[y] not in labels_a and size_b[y] > 1 for y in ys):
            ys, origin_b = _expand(kineto, ys, origin_b, labels_with_children(et, xs), mirror)
        return xs, ys, origin_a, origin_b


def _expand(forest: IndexedForest, items: list[int], origin: list[int], other_labels: set[int],
            mirror: bool) -> tuple[list[int], list[int]]:
    """items with each non-leaf item whose label is not in other_labels replaced by its children
    (reversed when mirror), and the matching origin list.  O(items + children)."""
    new_items: list[int] = []
    new_origin: list[int] = []
    for x, o in zip(items, origin):
        if forest.label[x] in other_labels or forest.size[x] == 1:
            new_items.append(x)
            new_origin.append(o)
        else:
            kids = children(forest, x)
            new_items.extend(kids[::-1] if mirror else kids)
            new_origin.extend([o] * len(kids))
    return new_items, new_origin


def item_dp(et: IndexedForest, kineto: IndexedForest, xs: list[int], ys: list[int], mirror: bool,
            stats: MatchStats, band: int | None = None) -> list[tuple[int, int, int, int]]:
    """Earliest optimal alignment of two sibling sequences where, besides pairing equal labels, an
    item of either side may be *opened*: treated as a missing node whose children stand in its
    place (greedily paired, in order, with the next items of the other side; a child may be
    skipped).  This is one level of ordered tree edit distance, on items instead of nodes.
    Returns (i, j, x, y): node x (xs[i] or a child of it) paired with node y (ys[j] or a child).

    Score of a pair: 2 * size for identical subtrees, 2 * min(sizes) - 1 otherwise (an upper bound
    of what the recursion can pair, identical preferred on ties).  An opened item stays unpaired.
    mirror: xs, ys are reversed, so children are taken reversed too.  band: when given, pairs are
    only considered within band columns of the diagonal from (0, 0) to (m, n).
    Each row is one pass in C (running maximum) plus Python work only at the columns where a pair
    or an opening is possible: O(m * n) C steps (m * band with a band) + O(candidate cells)."""
    gap = _ItemGap(et, kineto, xs, ys, mirror)
    lo, hi = _band_limits(len(xs), len(ys), band)
    stats.item_cells += sum(hi[i] - lo[i] + 1 for i in range(len(xs)))
    return _trace_back(gap, _fill_table(gap, lo, hi))


Opening = tuple[int, int, list[tuple[int, int, int, int]]]
"""What opening an item pairs: (score, items of the other side used, the pairs (i, j, x, y))."""


class _ItemGap:
    """The two item sequences of one gap as the item DP reads them: labels per item, children
    (reversed when mirror) and their labels, the columns (ys positions) per label and per child label,
    and the openings computed so far (``open_a``/``open_b``, cached).  O(items + children) to build."""

    def __init__(self, et: IndexedForest, kineto: IndexedForest, xs: list[int], ys: list[int],
                 mirror: bool) -> None:
        self.et, self.kineto, self.xs, self.ys = et, kineto, xs, ys
        label_a, label_b, size_a, size_b = et.label, kineto.label, et.size, kineto.size

        def kids(forest: IndexedForest, node: int) -> list[int]:
            found = children(forest, node)
            return found[::-1] if mirror else found

        self.la = [label_a[x] for x in xs]
        self.lb = [label_b[y] for y in ys]
        self.kids_a = [kids(et, x) if size_a[x] > 1 else None for x in xs]
        self.kids_b = [kids(kineto, y) if size_b[y] > 1 else None for y in ys]
        self.kid_labels_a = [None if k is None else {label_a[c] for c in k} for k in self.kids_a]
        self.kid_labels_b = [None if k is None else {label_b[c] for c in k} for k in self.kids_b]
        self.columns_of: dict[int, list[int]] = {}  # label -> columns j with that label
        for j, t in enumerate(self.lb):
            self.columns_of.setdefault(t, []).append(j)
        self.opener_columns: dict[int, list[int]] = {}  # label -> columns j whose children have it
        for j, labels in enumerate(self.kid_labels_b):
            for t in labels or ():
                self.opener_columns.setdefault(t, []).append(j)
        self.column_shape = [kineto.shape[y] for y in ys]
        self.column_size = [size_b[y] for y in ys]
        self.opened: dict[tuple[int, int, int], Opening] = {}

    def score(self, x: int, y: int) -> int:
        """2 * size for identical subtrees, 2 * min(sizes) - 1 otherwise."""
        et, kineto = self.et, self.kineto
        if et.shape[x] == kineto.shape[y]:
            return 2 * et.size[x]
        return 2 * min(et.size[x], kineto.size[y]) - 1

    def open_a(self, i: int, j: int) -> Opening:
        """xs[i] opened: its children paired greedily, in order, with ys[j], ys[j + 1], ..."""
        return self.opened.get((0, i, j)) or self._open(0, i, j)

    def open_b(self, i: int, j: int) -> Opening:
        """ys[j] opened: its children paired greedily, in order, with xs[i], xs[i + 1], ..."""
        return self.opened.get((1, i, j)) or self._open(1, i, j)

    def _open(self, side: int, i: int, j: int) -> Opening:
        """The opening of xs[i] (side 0) or ys[j] (side 1), computed and cached."""
        et_side = side == 0
        if et_side:
            kids, labels, other_labels, others, start = self.kids_a[i], self.et.label, self.lb, self.ys, j
        else:
            kids, labels, other_labels, others, start = self.kids_b[j], self.kineto.label, self.la, self.xs, i
        u, total, made = start, 0, []
        for c in kids:
            if u < len(others) and labels[c] == other_labels[u]:
                x, y = (c, others[u]) if et_side else (others[u], c)
                total += self.score(x, y)
                made.append((i, u, x, y) if et_side else (u, j, x, y))
                u += 1
        opening = self.opened[(side, i, j)] = (total, u - start, made)
        return opening


def _band_limits(m: int, n: int, band: int | None) -> tuple[list[int], list[int]]:
    """Per row i, the first and last column computed: all of them, or band columns either side of
    the diagonal from (0, 0) to (m, n).  O(m)."""
    if band is None:
        return [0] * m, [n - 1] * m
    centre = [(i * n) // m for i in range(m)]
    return [max(0, c - band) for c in centre], [min(n - 1, c + band) for c in centre]


def _fill_table(gap: _ItemGap, lo: list[int], hi: list[int]) -> list[list[int]]:
    """table[i][j]: best score of xs[i:] against ys[j:]; full-width rows, computed within [lo, hi]
    (a cell outside it is a lower bound: 0 or a running maximum).  Each row: one running maximum in
    C plus Python work at the columns where a pair or an opening is possible."""
    xs, la, kid_labels_a = gap.xs, gap.la, gap.kid_labels_a
    shape_a, size_a = gap.et.shape, gap.et.size
    columns_of, opener_columns = gap.columns_of, gap.opener_columns
    column_shape, column_size = gap.column_shape, gap.column_size
    open_a, open_b = gap.open_a, gap.open_b
    m, n = len(xs), len(gap.ys)
    table = [[0] * (n + 2) for _ in range(m + 2)]
    for i in range(m - 1, -1, -1):
        nxt = table[i + 1]
        first, last = lo[i], hi[i]
        cells = nxt[first:last + 1]
        ai, xi = la[i], xs[i]
        shape_i, size_i = shape_a[xi], size_a[xi]
        columns = columns_of.get(ai)
        if columns:
            for j in columns[bisect_left(columns, first):bisect_right(columns, last)]:
                if column_shape[j] == shape_i:
                    w = 2 * size_i + nxt[j + 1]
                else:
                    w = 2 * min(size_i, column_size[j]) - 1 + nxt[j + 1]
                if w > cells[j - first]:
                    cells[j - first] = w
        for t in kid_labels_a[i] or ():
            columns = columns_of.get(t)
            if columns:
                for j in columns[bisect_left(columns, first):bisect_right(columns, last)]:
                    total, used, _ = open_a(i, j)
                    w = total + nxt[j + used]
                    if w > cells[j - first]:
                        cells[j - first] = w
        columns = opener_columns.get(ai)
        if columns:
            for j in columns[bisect_left(columns, first):bisect_right(columns, last)]:
                total, used, _ = open_b(i, j)
                w = total + table[i + used][j + 1]
                if w > cells[j - first]:
                    cells[j - first] = w
        cells.reverse()
        running = list(accumulate(cells, max))
        running.reverse()
        table[i][first:last + 1] = running
    return table


def _trace_back(gap: _ItemGap, table: list[list[int]]) -> list[tuple[int, int, int, int]]:
    """The earliest optimal alignment in a filled table, as (i, j, x, y) pairs.  O(m + n)."""
    xs, ys, la, lb = gap.xs, gap.ys, gap.la, gap.lb
    kid_labels_a, kid_labels_b, score = gap.kid_labels_a, gap.kid_labels_b, gap.score
    open_a, open_b = gap.open_a, gap.open_b
    m, n = len(xs), len(ys)
    out: list[tuple[int, int, int, int]] = []
    i = j = 0
    while i < m and j < n:
        v = table[i][j]
        if v == 0:
            break
        if la[i] == lb[j] and v == score(xs[i], ys[j]) + table[i + 1][j + 1]:
            out.append((i, j, xs[i], ys[j]))
            i += 1
            j += 1
            continue
        if kid_labels_a[i] is not None and lb[j] in kid_labels_a[i]:
            total, used, made = open_a(i, j)
            if v == total + table[i + 1][j + used]:
                out.extend(made)
                i += 1
                j += used
                continue
        if kid_labels_b[j] is not None and la[i] in kid_labels_b[j]:
            total, used, made = open_b(i, j)
            if v == total + table[i + used][j + 1]:
                out.extend(made)
                i += used
                j += 1
                continue
        if table[i][j + 1] == v:
            j += 1
        else:
            i += 1
    return out

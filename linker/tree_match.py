"""Structural (approximate) matching of two ordered, labelled forests.

LINKING.md method 3: pair the ops of an ET call tree with the events of a Kineto call tree when
record-function ids and a plain order walk cannot be used.  The result is an *ordered tree mapping*,
the kind ordered tree edit distance produces: pairs only join equal labels, and for any two pairs
(a, b), (c, d): a is an ancestor of c iff b is an ancestor of d, and a precedes c in pre-order iff b
precedes d.  Wrong pairs are worse than missing ones, so whatever cannot be told apart is left
unpaired and counted.

How it works (n = nodes of both forests):

1. Indexing, O(n): pre-order validation, subtree sizes (the subtree of i is the index range
   [i, i + size[i])), depths, and a canonical *shape id* per subtree (label + ordered child shape
   ids, interned in one dict shared by both forests).  Equal shape ids mean identical labelled
   subtrees, paired wholesale by a slice assignment.
2. If Kineto holds clearly more than the ET (extra iterations, annotations), the stretch of Kineto
   roots the ET lands on is chosen by chaining equal root labels whose offset in pre-order positions
   drifts slowly (_choose_kineto_window); Kineto roots outside it cost nothing (semi-global).
3. Top-down from the roots (explicit task stack), two sibling sequences are aligned on labels.  The
   common prefix/suffix and anchors (labels unique to both sides, subtree shapes unique to both
   sides, rare labels chained along one diagonal) cut them into gaps, so work follows the
   differences, not the sizes.  A gap is solved by the item DP: an ordered alignment where a pair
   scores by subtree size (identical subtrees most) and an item of either side may be *opened*,
   i.e. treated as a node missing on that side whose children stand in its place, which is exactly
   what a missing Kineto event does (one level of ordered tree edit distance).  Items whose label is
   absent from the other side are opened beforehand.  Large gaps are solved within a band around the
   diagonal or, failing that, chunk by chunk (counted).
4. Every sequence alignment is run twice, biased to the earliest and to the latest matches (the
   latter on the reversed sequences), and only the pairs both agree on are kept: which copy of a run
   of identical siblings went missing cannot be known, so such a run stays unpaired instead of being
   guessed.  A common prefix or suffix that ends inside a periodic run is handed back to the gap.
5. A non-identical pair gets its children aligned next (3).  Siblings left untouched on both sides of
   a gap get an exact Zhang-Shasha ordered tree edit distance when small (run on the mirrored
   forests too, keeping the agreed pairs), else their pre-order label sequences are aligned if short.
6. Below max_depth, the descendants of a paired node are aligned by order only: their pre-order
   label sequences, with the same two-sided alignment.
7. A final O(n) pass drops any pair breaking the ancestor or order rule, so the contract holds
   whatever the heuristics above did.

Why not networkx: the trees are ordered and labelled; general (unordered) graph isomorphism or graph
edit distance solves a much harder problem (exponential; the original tool exhausted 12 GB on 1.7k
nodes).  Nothing here needs a general graph algorithm.

Everything is iterative (explicit stacks; the gap solver nests at most MAX_EXPANSION_NESTING calls),
so trees thousands of levels deep are fine.  Memory: a few integer lists per node, O(n), plus DP
tables bounded by the caps below.  DP rows use itertools.accumulate for their running maximum, so the
Python work per row is proportional to the cells where a pair is possible.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from .align import longest_increasing_chain
from itertools import accumulate

ET_SIDE = "et"
KINETO_SIDE = "kineto"

# Sequence alignment ------------------------------------------------------------------------------
SMALL_GAP_CELLS = 256
"""Gaps up to this many cells (items x items) go straight to the gap solver, without anchoring."""

SECONDARY_ANCHOR_CELLS = 256
"""Gaps above this many cells without a unique label may be cut at subtrees of unique shape."""

GAP_SOLVE_CELLS = 4_096
"""Largest sibling gap solved by the item DP without a band."""

BAND_MIN = 8
"""Band half-width of a banded item DP: BAND_MIN + 2 * |m - n| + (m + n) / 64."""

BAND_CELL_CAP = 40_000
"""Largest banded item DP (cells)."""

LCS_CELL_CAP = 250_000
"""Largest LCS table (cells) for one gap of a pre-order label alignment."""

MAX_PERIOD = 16
"""Longest period of a repeated run checked when a common prefix or suffix ends inside the run."""

RARE_POINTS = 8_000
"""About the most candidate pairs of rare tokens chained to anchor a large gap."""

LOCAL_RADIUS = 64
"""A rare-token anchor's token must not occur again within this many positions on either side."""

CHAIN_REACH = 3
"""Offset buckets on each side searched for a chain predecessor."""

CHAIN_LOOKBACK = 4
"""Latest points per offset bucket considered as chain predecessors."""

CHUNK_ITEMS = 1_024
"""Items per chunk of the chunked fallback alignment of sibling sequences (banded item DP)."""

CHUNK_TOKENS = 256
"""Tokens per chunk of the chunked fallback alignment of pre-order label sequences (LCS)."""

CHUNK_MARGIN = 32
"""Extra columns, and minimum band half-width, of a chunk of the chunked fallback."""

MAX_EXPANSION_NESTING = 3
"""How many times a gap's expanded items may be expanded again within one sibling alignment."""

# Leftover gaps -----------------------------------------------------------------------------------
TED_CELL_CAP = 60_000
"""Largest leftover gap (product of the key-root subtree sizes of both sides) given an exact ordered
tree edit distance."""

GAP_PREORDER_CAP = 500
"""A leftover gap too large for the tree edit distance is aligned on pre-order labels when its
subtrees hold at most this many nodes per side; otherwise it stays unpaired (gaps_unresolved)."""

# Kineto window -----------------------------------------------------------------------------------
WINDOW_POINTS = 20_000
"""About the most candidate root pairs chained to choose the Kineto window."""

WINDOW_HEAD = 512
"""ET roots whose labels place the ET within a longer Kineto forest."""

WINDOW_SLACK = 2
"""Extra Kineto roots on each side of the chosen window."""

# Task kinds and how a pair was made ---------------------------------------------------------------
_SIBLINGS = 0  # align two sibling sequences structurally
_ORDER = 1  # align the pre-order label sequences of subtrees below max_depth

_HOW_IDENTICAL = 1
_HOW_ALIGNED = 2
_HOW_ORDER = 3


@dataclass
class OrderedForest:
    """A rooted, ordered, labelled forest in pre-order.

    labels[i]: op name of node i; parent[i]: index of its parent, or -1 for a root.
    Nodes are in pre-order (a parent before its children; siblings in execution order)."""

    labels: list[str]
    parent: list[int]


@dataclass(frozen=True, slots=True)
class UnmatchedSubtree:
    """A maximal connected group of unpaired nodes: its root is unpaired and its parent is paired (or
    it is a root); it holds the unpaired nodes reachable from the root through unpaired children.
    A node missing on the other side whose children were paired is a group of size 1; an extra or
    unmatched subtree is one group of its full size.

    side: ET_SIDE or KINETO_SIDE; root: pre-order index of the group's root in that forest; label:
    the root's label; size: number of nodes in the group."""

    side: str
    root: int
    label: str
    size: int


@dataclass
class ForestMatch:
    """Result of match_forests.

    pairs: (et index, kineto index), sorted by et index; each index occurs at most once; labels equal;
      together an ordered tree mapping (see module docstring).
    edit_cost: insertions + deletions needed: unpaired ET nodes + unpaired Kineto nodes inside
      kineto_span (Kineto roots before/after the stretch the ET landed on are free).  No relabels.
    tree_nodes: (ET nodes, Kineto nodes) of the whole input forests.
    unmatched_subtrees: groups of unpaired nodes (UnmatchedSubtree), ET side and Kineto side (inside
      kineto_span), largest first.
    kineto_span: [start, end) pre-order index range of the Kineto roots the ET landed on (from the first
      to the last Kineto root holding a pair); (0, 0) when nothing is paired.
    paired_identical: pairs made wholesale from identical subtrees (same shape id).
    paired_aligned: other pairs made by the structural alignment (sibling alignment, item DP, tree
      edit distance, pre-order alignment of a leftover gap).
    paired_by_order: pairs made below max_depth by pre-order label alignment under a paired ancestor.
    item_cells: cells of the sibling item DP (_Matcher._item_dp) computed in total.
    ted_cells: tree edit distance table cells computed in total (small leftover gaps).
    dp_cells: LCS table cells computed in total (pre-order alignments, rare-token anchors).
    chunked_fallbacks: gaps too large for one exact alignment and without anchors, aligned chunk by
      chunk instead (each chunk exactly, within a band; see _chunked).
    ambiguous_unpaired: candidate pairs left out because the earliest and latest optimal alignments
      disagreed on them (e.g. a run of identical siblings with one copy missing).
    gaps_unresolved: leftover gaps too large for both the tree edit distance and the pre-order
      alignment; their nodes stay unpaired.
    inconsistent_dropped: pairs dropped by the final ancestor/order check.
    """

    pairs: list[tuple[int, int]]
    edit_cost: int
    tree_nodes: tuple[int, int]
    unmatched_subtrees: list[UnmatchedSubtree]
    kineto_span: tuple[int, int] = (0, 0)
    paired_identical: int = 0
    paired_aligned: int = 0
    paired_by_order: int = 0
    item_cells: int = 0
    ted_cells: int = 0
    dp_cells: int = 0
    chunked_fallbacks: int = 0
    ambiguous_unpaired: int = 0
    gaps_unresolved: int = 0
    inconsistent_dropped: int = 0


# --------------------------------------------------------------------------------------------------
# Indexing
# --------------------------------------------------------------------------------------------------

@dataclass
class _IndexedForest:
    """Per-node arrays derived from an OrderedForest (all indexed by pre-order position).

    label: interned label id; size: nodes in the subtree (the subtree of i is [i, i + size[i]));
    depth: 0 for roots; shape: interned id of the labelled ordered subtree; roots: root indices."""

    label: list[int]
    parent: list[int]
    size: list[int]
    depth: list[int]
    shape: list[int]
    roots: list[int]


@dataclass
class _Stats:
    """Work and outcome counters of one match_forests call (copied into ForestMatch)."""

    gaps_unresolved: int = 0
    item_cells: int = 0
    ted_cells: int = 0
    dp_cells: int = 0
    chunked_fallbacks: int = 0
    ambiguous_unpaired: int = 0


def _index_forest(forest: OrderedForest, label_ids: dict[str, int],
                  shape_ids: dict[tuple[int, ...], int]) -> _IndexedForest:
    """Validate the pre-order layout and compute label/size/depth/shape arrays.  O(n) time and memory.

    label_ids and shape_ids are shared between both forests so ids compare across them.
    Raises ValueError when parent[] does not describe a forest in pre-order."""
    labels, parent = forest.labels, forest.parent
    n = len(labels)
    if len(parent) != n:
        raise ValueError(f"labels has {n} entries but parent has {len(parent)}")
    label = [label_ids.setdefault(name, len(label_ids)) for name in labels]
    depth = [0] * n
    path: list[int] = []  # current root-to-node path
    for i in range(n):
        p = parent[i]
        if p < -1 or p >= i:
            raise ValueError(f"node {i}: parent {p} is not an earlier node (input must be in pre-order)")
        if p == -1:
            path.clear()
        else:
            while path and path[-1] != p:
                path.pop()
            if not path:
                raise ValueError(f"node {i}: parent {p} is not on the current path (not pre-order)")
        depth[i] = len(path)
        path.append(i)
    size = [1] * n
    for i in range(n - 1, 0, -1):
        p = parent[i]
        if p >= 0:
            size[p] += size[i]
    shape = [0] * n
    for i in range(n - 1, -1, -1):
        end = i + size[i]
        c = i + 1
        if c == end:
            key: tuple[int, ...] = (label[i],)
        else:
            kids = [label[i]]
            while c < end:
                kids.append(shape[c])
                c += size[c]
            key = tuple(kids)
        shape[i] = shape_ids.setdefault(key, len(shape_ids))
    roots = []
    r = 0
    while r < n:
        roots.append(r)
        r += size[r]
    return _IndexedForest(label=label, parent=list(parent), size=size, depth=depth, shape=shape,
                          roots=roots)


def _children(forest: _IndexedForest, node: int) -> list[int]:
    """Children of node in order.  O(number of children) via subtree sizes."""
    size = forest.size
    out = []
    c = node + 1
    end = node + size[node]
    while c < end:
        out.append(c)
        c += size[c]
    return out


def _preorder_of(forest: _IndexedForest, items: list[int]) -> list[int]:
    """All nodes of the subtrees rooted at items, in pre-order.  O(total size)."""
    size = forest.size
    out: list[int] = []
    for x in items:
        out.extend(range(x, x + size[x]))
    return out


def _labels_with_children(forest: _IndexedForest, items: list[int]) -> set[int]:
    """Labels of items and of their children.  O(items + children)."""
    found = set()
    label = forest.label
    for x in items:
        found.add(label[x])
        found.update(label[c] for c in _children(forest, x))
    return found


def _owner(forest: _IndexedForest, node: int, index_of: dict[int, int]) -> int:
    """index_of[a] for the nearest ancestor-or-self a of node that is a key of index_of.
    O(levels walked)."""
    while node not in index_of:
        node = forest.parent[node]
    return index_of[node]


# --------------------------------------------------------------------------------------------------
# Sequence alignment
# --------------------------------------------------------------------------------------------------

def _lcs_earliest(a: list, b: list, i0: int, i1: int, j0: int, j1: int, stats: _Stats,
                  out: list[tuple[int, int]]) -> None:
    """Append to out the pairs (i, j), a[i] == b[j], of the longest common subsequence of a[i0:i1] and
    b[j0:j1] that takes every match as early as possible.  Each table row is a running maximum in C
    plus Python work at the columns equal to a[i] only: O(m * n) C steps + O(equal cells)."""
    m, n = i1 - i0, j1 - j0
    if m <= 0 or n <= 0:
        return
    stats.dp_cells += m * n
    bs = b[j0:j1]
    columns_of: dict = {}
    for j, t in enumerate(bs):
        columns_of.setdefault(t, []).append(j)
    # suf[i][j] = LCS length of a[i0+i:i1] and bs[j:]
    suf: list[list[int]] = [None] * (m + 1)  # type: ignore[list-item]
    suf[m] = [0] * (n + 1)
    for i in range(m - 1, -1, -1):
        nxt = suf[i + 1]
        cells = nxt[:n]
        for j in columns_of.get(a[i0 + i], ()):
            if nxt[j + 1] + 1 > cells[j]:
                cells[j] = nxt[j + 1] + 1
        cells.reverse()
        row = list(accumulate(cells, max))
        row.reverse()
        row.append(0)
        suf[i] = row
    i = j = 0
    while i < m and j < n:
        here = suf[i][j]
        if here == 0:
            break
        if a[i0 + i] == bs[j] and suf[i + 1][j + 1] + 1 == here:
            out.append((i0 + i, j0 + j))
            i += 1
            j += 1
        elif suf[i][j + 1] == here:
            j += 1
        else:
            i += 1


def _unique_anchors(a: list, b: list, i0: int, i1: int, j0: int, j1: int) -> list[tuple[int, int]]:
    """Pairs of positions of tokens occurring exactly once in a[i0:i1] and once in b[j0:j1], reduced
    to an increasing chain (patience diff anchors).  O(m + n + k log k)."""
    count_a: dict = {}
    for i in range(i0, i1):
        t = a[i]
        count_a[t] = count_a.get(t, 0) + 1
    where_b: dict = {}
    for j in range(j0, j1):
        t = b[j]
        if count_a.get(t) == 1:
            where_b[t] = -1 if t in where_b else j
    points = []
    for i in range(i0, i1):
        t = a[i]
        if count_a[t] == 1:
            j = where_b.get(t, -1)
            if j >= 0:
                points.append((i, j))
    return longest_increasing_chain(points) if points else []


def _neighbour_agrees(a: list, b: list, i: int, j: int) -> bool:
    """True when the tokens just before (or just after) positions i of a and j of b are equal (or both
    missing).  A secondary anchor (equal subtree shape) whose neighbours both disagree is more likely a
    coincidence (a subtree that lost a node now looks like a neighbour) than a true pair.  O(1)."""
    before = (a[i - 1] == b[j - 1]) if i and j else (i == 0 and j == 0)
    if before:
        return True
    if i + 1 < len(a) and j + 1 < len(b):
        return a[i + 1] == b[j + 1]
    return i + 1 == len(a) and j + 1 == len(b)


def _periodic_start(a: list, lo: int, end: int, hi: int) -> int:
    """The tokens a[lo:end] were paired as a common prefix and a[end:hi] (maybe empty) follows.
    If the end of the prefix is a repetition of period P <= MAX_PERIOD that the next tokens continue
    (a missing copy could then sit anywhere in the run), return where that periodic run starts, so
    the caller hands the run back to the gap; else return end.  O(MAX_PERIOD^2 + run)."""
    for period in range(1, min(MAX_PERIOD, end - lo) + 1):
        ahead = min(period, hi - end)
        if ahead and a[end:end + ahead] == a[end - period:end - period + ahead]:
            start = end - period
            while start > lo and a[start - 1] == a[start - 1 + period]:
                start -= 1
            return start
    return end


def _common_ends(a: list, b: list, i0: int, i1: int, j0: int, j1: int) -> tuple[int, int]:
    """Lengths (p, s) of the common prefix and suffix of a[i0:i1] and b[j0:j1] to pair directly:
    a periodic run that continues into the unpaired middle on either side is left to the middle
    (_periodic_start), so that both alignment passes see it.  O(p + s + MAX_PERIOD^2)."""
    p = 0
    lim = min(i1 - i0, j1 - j0)
    while p < lim and a[i0 + p] == b[j0 + p]:
        p += 1
    if p == i1 - i0 and p == j1 - j0:
        return p, 0
    if p:
        p = min(_periodic_start(a, i0, i0 + p, i1) - i0, _periodic_start(b, j0, j0 + p, j1) - j0)
    s = 0
    lim = min(i1 - i0, j1 - j0) - p
    while s < lim and a[i1 - 1 - s] == b[j1 - 1 - s]:
        s += 1
    if s:
        lo_a, lo_b = max(i0 + p, i1 - s - MAX_PERIOD), max(j0 + p, j1 - s - MAX_PERIOD)
        ra, rb = a[lo_a:i1][::-1], b[lo_b:j1][::-1]
        s = min(_periodic_start(ra, 0, s, len(ra)), _periodic_start(rb, 0, s, len(rb)))
    return p, s


def _drift_ok(offset_from: int, offset_to: int, distance: int) -> bool:
    """Whether an alignment offset may move from offset_from to offset_to over `distance` positions:
    by at most 8 + a quarter of the distance (missing or extra elements shift it one by one)."""
    return abs(offset_to - offset_from) <= 8 + abs(distance) // 4


def _longest_chain(points: list[tuple[int, int]], pos_a, pos_b,
                   corners: tuple[tuple[int, int], tuple[int, int]] | None = None
                   ) -> list[tuple[int, int]]:
    """Longest chain of candidate pairs (p, q), increasing in both, whose offset pos_b[q] - pos_a[p]
    drifts slowly (_drift_ok, capped at CHAIN_REACH offset buckets) between consecutive pairs: drift
    comes from missing or extra elements, while a jump to another copy of a repeated stretch (e.g. the
    next iteration) moves the offset by a whole copy and breaks the chain.  With corners
    ((a, b) start, (a, b) end positions), the chain must also start and end within drift of them, so
    that of several copies the one lined up with the ends is taken.  Offset buckets are a quarter of
    the mean b-side spacing of the points wide; predecessors are looked up among the CHAIN_LOOKBACK
    latest points of the buckets within reach; the earliest longest chain wins.
    O(points * CHAIN_REACH * CHAIN_LOOKBACK) time, O(points) memory."""
    if not points:
        return []
    points = sorted(points, key=lambda pq: (pq[1], pq[0]))
    spots = {q for _, q in points}
    spread = pos_b[points[-1][1]] - pos_b[points[0][1]]
    bucket = max(16, spread // (4 * len(spots)))
    offsets = [pos_b[q] - pos_a[p] for p, q in points]
    at_b = [pos_b[q] for _, q in points]
    length = [0] * len(points)  # 0: cannot be part of a chain
    before = [-1] * len(points)
    buckets: dict[int, list[int]] = {}
    reach = CHAIN_REACH * bucket
    best = -1
    for k, (p, q) in enumerate(points):
        offset, here = offsets[k], at_b[k]
        if corners is None or _drift_ok(corners[0][1] - corners[0][0], offset, here - corners[0][1]):
            length[k] = 1
        home = offset // bucket
        for near in range(home - CHAIN_REACH, home + CHAIN_REACH + 1):
            for back in buckets.get(near, ())[-CHAIN_LOOKBACK:]:
                if length[back] >= length[k] and points[back][0] < p and points[back][1] < q:
                    drift = abs(offset - offsets[back])
                    if drift <= reach and drift <= 8 + (here - at_b[back]) // 4:  # _drift_ok
                        length[k] = length[back] + 1
                        before[k] = back
        if length[k]:
            buckets.setdefault(home, []).append(k)
            ends_ok = corners is None or _drift_ok(offset, corners[1][1] - corners[1][0],
                                                   corners[1][1] - here)
            if ends_ok and (best < 0 or length[k] > length[best]):
                best = k
    chain = []
    k = best
    while k >= 0:
        chain.append(points[k])
        k = before[k]
    chain.reverse()
    return chain


def _candidate_pairs(where_a: dict, where_b: dict, budget: int) -> list[tuple[int, int]]:
    """Pairs (p, q) of positions of equal tokens (where_a/where_b: token -> sorted positions), rarest
    tokens first, about `budget` pairs at most; a token that would overflow the budget contributes
    every k-th of its positions on the a side (first and last included) instead.  O(budget)."""
    points: list[tuple[int, int]] = []
    for t in sorted(where_b, key=lambda t: (len(where_a[t]) * len(where_b[t]), t)):
        room = budget - len(points)
        if room <= 0:
            break
        on_a, on_b = where_a[t], where_b[t]
        if len(on_a) * len(on_b) > room:
            stride = -(-len(on_a) * len(on_b) // room)
            on_a = on_a[::stride] + ([on_a[-1]] if (len(on_a) - 1) % stride else [])
        points.extend((p, q) for p in on_a for q in on_b)
    return points


def _locally_unique(a: list, i: int, lo: int, hi: int) -> bool:
    """True when a[i] does not occur again within LOCAL_RADIUS positions (inside [lo, hi)).  A chain
    only places a pair near the right diagonal; an anchor must also be unmistakable where it stands.
    O(LOCAL_RADIUS)."""
    t = a[i]
    for k in range(max(lo, i - LOCAL_RADIUS), min(hi, i + LOCAL_RADIUS + 1)):
        if k != i and a[k] == t:
            return False
    return True


def _rare_anchors(a: list, b: list, xs: list[int], ys: list[int], i0: int, i1: int, j0: int,
                  j1: int, mirror: bool) -> list[tuple[int, int]]:
    """Anchors for a large gap without unique tokens (e.g. repeated iterations).

    Positions are the node indices xs, ys (pre-order: a missing node shifts them by one only;
    negated when mirror, as the lists are then reversed).  Candidates are pairs of equal tokens lying
    within a corridor around the straight line between the gap's corners (as wide as the difference
    of the two spans, plus 64), rarest tokens first, about RARE_POINTS of them; they are chained
    (_longest_chain, tied to the corners) so that they follow one diagonal, and only pairs whose
    token is unique within LOCAL_RADIUS on both sides are kept (_locally_unique).
    O(m + n + RARE_POINTS * (log + CHAIN_REACH * CHAIN_LOOKBACK))."""
    if mirror:
        xs, ys = [-x for x in xs], [-y for y in ys]
    where_a: dict = {}
    for i in range(i0, i1):
        where_a.setdefault(a[i], []).append(i)
    where_b: dict = {}
    for j in range(j0, j1):
        if b[j] in where_a:
            where_b.setdefault(b[j], []).append(j)
    start_a, start_b, end_a, end_b = xs[i0], ys[j0], xs[i1 - 1], ys[j1 - 1]
    ratio = (end_b - start_b) / (end_a - start_a) if end_a > start_a else 1.0
    corridor = 64 + abs((end_b - start_b) - (end_a - start_a))
    points: list[tuple[int, int]] = []
    for t in sorted(where_b, key=lambda t: (len(where_a[t]) * len(where_b[t]), t)):
        if len(points) >= RARE_POINTS:
            break
        on_b = where_b[t]
        at_b = [ys[j] for j in on_b]
        for i in where_a[t]:
            expected = start_b + (xs[i] - start_a) * ratio
            lo = bisect_left(at_b, expected - corridor)
            hi = bisect_right(at_b, expected + corridor)
            points.extend((i, on_b[k]) for k in range(lo, hi))
            if len(points) >= RARE_POINTS:
                break
    chain = _longest_chain(points, xs, ys, ((start_a, start_b), (end_a, end_b)))
    return [(i, j) for i, j in chain
            if _locally_unique(a, i, i0, i1) and _locally_unique(b, j, j0, j1)]


def _chunked(i0: int, i1: int, j0: int, j1: int, chunk: int, solve: Callable,
             out: list[tuple[int, int, int, int]]) -> None:
    """Fallback for a gap too large to solve at once and without anchors (e.g. many repeated
    iterations): solve `chunk` tokens of a against the proportional stretch of b (plus a margin) with
    a band around that chunk's diagonal, keep the pairs in the first half of the chunk, restart after
    the last kept pair.  A chunk much longer than any repetition period keeps the kept half stable.
    solve(i0, i1, j0, j1, band) -> [(i, j, x, y)] sorted, positions absolute; appends to out.
    O((m / chunk) * chunk * band) cells."""
    while i0 < i1 and j0 < j1:
        ratio = (j1 - j0) / (i1 - i0)
        rows = min(chunk, i1 - i0)
        cols = min(j1 - j0, int(rows * ratio) + CHUNK_MARGIN)
        band = CHUNK_MARGIN + abs(cols - rows)
        local = solve(i0, i0 + rows, j0, j0 + cols, band)
        if i0 + rows == i1 and j0 + cols == j1:
            out.extend(local)
            return
        kept = [t for t in local if t[0] < i0 + rows // 2]
        if kept:
            out.extend(kept)
            i0 = max(t[0] for t in kept) + 1
            j0 = max(t[1] for t in kept) + 1
        else:
            i0 += rows // 2
            j0 += max(1, int(rows // 2 * ratio))


def _align_earliest(a: list, b: list, xs: list[int], ys: list[int], stats: _Stats,
                    sa: list | None = None, sb: list | None = None,
                    solve_gap: Callable | None = None, mirror: bool = False) -> list[tuple[int, int]]:
    """One order-preserving pairing of the nodes xs (tokens a) with the nodes ys (tokens b), biased to
    the earliest matches, as node pairs (unsorted).

    Work is bounded by the differences: the common prefix, then anchors cut the problem into gaps:
    tokens unique to both sides, else (gaps above SECONDARY_ANCHOR_CELLS) secondary tokens sa/sb
    unique to both sides (finer tokens, e.g. subtree shapes, whose equality implies equal primary
    tokens) whose neighbours agree.  A gap without anchors is solved exactly: by solve_gap(xs part,
    ys part, mirror, band) -> [(i, j, x, y)] when given, up to GAP_SOLVE_CELLS cells, then restricted
    to a band around the diagonal up to BAND_CELL_CAP cells; else by an LCS table up to LCS_CELL_CAP
    cells.  A larger gap is cut by rare-token anchors (_rare_anchors), else aligned chunk by chunk
    (_chunked, counted as a fallback).
    Cost: O(m + n) for near-identical inputs; O((m + n) log + gap work) in general."""
    found: list[tuple[int, int, int, int]] = []  # (i, j, x, y); x = -1 means (xs[i], ys[j])

    def solve(i0: int, i1: int, j0: int, j1: int,
              band: int | None = None) -> list[tuple[int, int, int, int]]:
        if solve_gap is not None:
            return [(i0 + i, j0 + j, x, y)
                    for i, j, x, y in solve_gap(xs[i0:i1], ys[j0:j1], mirror, band)]
        pos: list[tuple[int, int]] = []
        _lcs_earliest(a, b, i0, i1, j0, j1, stats, pos)
        return [(i, j, -1, -1) for i, j in pos]

    stack = [(0, len(a), 0, len(b))]
    while stack:
        i0, i1, j0, j1 = stack.pop()
        p, s = _common_ends(a, b, i0, i1, j0, j1)
        for k in range(p):
            found.append((i0 + k, j0 + k, -1, -1))
        for k in range(1, s + 1):
            found.append((i1 - k, j1 - k, -1, -1))
        i0 += p
        j0 += p
        i1 -= s
        j1 -= s
        if i0 >= i1 or j0 >= j1:
            continue
        cells = (i1 - i0) * (j1 - j0)
        if cells <= SMALL_GAP_CELLS:
            found.extend(solve(i0, i1, j0, j1))
            continue
        anchors = _unique_anchors(a, b, i0, i1, j0, j1)
        if not anchors and sa is not None and cells > SECONDARY_ANCHOR_CELLS:
            anchors = [(i, j) for i, j in _unique_anchors(sa, sb, i0, i1, j0, j1)
                       if _neighbour_agrees(a, b, i, j)]
        band = BAND_MIN + abs((i1 - i0) - (j1 - j0)) + (i1 - i0 + j1 - j0) // 64
        if solve_gap is not None:
            exact, banded = cells <= GAP_SOLVE_CELLS, (i1 - i0) * (2 * band + 1) <= BAND_CELL_CAP
        else:
            exact, banded = cells <= LCS_CELL_CAP, False
        if not anchors and not exact and not banded:
            anchors = _rare_anchors(a, b, xs, ys, i0, i1, j0, j1, mirror)
        if anchors:
            found.extend((i, j, -1, -1) for i, j in anchors)
            pi, pj = i0, j0
            for i, j in anchors:
                if i > pi or j > pj:
                    stack.append((pi, i, pj, j))
                pi, pj = i + 1, j + 1
            if pi < i1 or pj < j1:
                stack.append((pi, i1, pj, j1))
        elif exact:
            found.extend(solve(i0, i1, j0, j1))
        elif banded:
            found.extend(solve(i0, i1, j0, j1, band))
        else:
            stats.chunked_fallbacks += 1
            chunk = CHUNK_ITEMS if solve_gap is not None else CHUNK_TOKENS
            _chunked(i0, i1, j0, j1, chunk, solve, found)
    return [(xs[i], ys[j]) if x < 0 else (x, y) for i, j, x, y in found]


def _align_tokens(a: list, b: list, xs: list[int], ys: list[int], stats: _Stats,
                  sa: list | None = None, sb: list | None = None,
                  solve_gap: Callable | None = None) -> list[tuple[int, int]]:
    """Node pairs (x, y), sorted by x, on which the earliest-biased and the latest-biased alignments
    of xs (tokens a) and ys (tokens b) agree; the latter is the earliest alignment of the reversed
    lists (solve_gap is then called with mirror=True and must reverse children lists too).

    A pair the two disagree on can slide (e.g. which copy of a run of identical siblings is missing
    cannot be known): it is left out and counted in stats.ambiguous_unpaired.
    Cost: O(m) when a == b, else twice _align_earliest."""
    if a == b:
        return list(zip(xs, ys))
    early = _align_earliest(a, b, xs, ys, stats, sa, sb, solve_gap, False)
    late = set(_align_earliest(a[::-1], b[::-1], xs[::-1], ys[::-1], stats,
                               None if sa is None else sa[::-1], None if sb is None else sb[::-1],
                               solve_gap, True))
    certain = [p for p in early if p in late]
    stats.ambiguous_unpaired += len(early) - len(certain)
    certain.sort()
    return certain


# --------------------------------------------------------------------------------------------------
# Ordered tree edit distance (Zhang-Shasha) for small leftover gaps
# --------------------------------------------------------------------------------------------------

_NO_MATCH = 3
"""Cost of mapping two nodes with different labels: more than deleting one and inserting the other
(2), so such a mapping never occurs in an optimum."""


@dataclass
class _PostorderForest:
    """A small forest under a virtual root, numbered 1..n in postorder (n is the virtual root).

    label[k]: label id (-1 for the virtual root); leftmost[k]: postorder number of the leftmost leaf of
    k's subtree; origin[k]: index in the full forest (-1 for the virtual root); keyroots: Zhang-Shasha
    key roots (highest node of each distinct leftmost leaf), ascending.  Index 0 is unused."""

    label: list[int]
    leftmost: list[int]
    origin: list[int]
    keyroots: list[int]


def _postorder_forest(forest: _IndexedForest, items: list[int], mirror: bool) -> _PostorderForest:
    """Postorder numbering of the subtrees rooted at items (children and items reversed when mirror)
    under a virtual root.  Uses post(v) = pre(v) + size(v) - 1 - depth(v).  O(total size)."""
    total = 1 + sum(forest.size[x] for x in items)
    label = [0] * (total + 1)
    leftmost = [0] * (total + 1)
    origin = [-1] * (total + 1)
    label[total] = -1
    leftmost[total] = 1
    size = forest.size
    pre = 0
    stack = [(x, 1) for x in (items if mirror else reversed(items))]
    while stack:
        x, depth = stack.pop()
        pre += 1
        post = pre + size[x] - 1 - depth + 1  # 1-based
        label[post] = forest.label[x]
        leftmost[post] = post - size[x] + 1
        origin[post] = x
        kids = _children(forest, x)
        stack.extend((c, depth + 1) for c in (kids if mirror else reversed(kids)))
    last: dict[int, int] = {}
    for k in range(1, total + 1):
        last[leftmost[k]] = k
    return _PostorderForest(label, leftmost, origin, sorted(last.values()))


def _keyroot_cells(f: _PostorderForest) -> int:
    """Sum of the subtree sizes of the key roots: the rows (or columns) one side adds to the work."""
    return sum(k - f.leftmost[k] + 1 for k in f.keyroots)


def _forest_distance(a: _PostorderForest, b: _PostorderForest, i: int, j: int,
                     tree_distance: list[list[int]], fill: bool) -> list[list[int]]:
    """Zhang-Shasha forest distance table between the subtrees of i (in a) and j (in b), unit insert
    and delete costs, label-equal matches free.  fd[x][y] is the distance between the first x nodes
    (postorder) of i's subtree and the first y of j's.  When fill, records tree distances of node pairs
    whose subtrees are whole prefixes.  O(size(i) * size(j))."""
    la, lb, l1, l2 = a.label, b.label, a.leftmost, b.leftmost
    li, lj = l1[i], l2[j]
    rows, cols = i - li + 2, j - lj + 2
    fd = [list(range(cols))]
    for x in range(1, rows):
        gx = li + x - 1
        ax = la[gx]
        up = fd[x - 1]
        row = [x] * cols
        x_whole = l1[gx] == li
        base = fd[l1[gx] - li]
        tdx = tree_distance[gx]
        for y in range(1, cols):
            gy = lj + y - 1
            v = up[y] + 1
            w = row[y - 1] + 1
            if w < v:
                v = w
            ly = l2[gy]
            if x_whole and ly == lj:
                w = up[y - 1] + (0 if ax == lb[gy] else _NO_MATCH)
                if w < v:
                    v = w
                if fill:
                    tdx[gy] = v
            else:
                w = base[ly - lj] + tdx[gy]
                if w < v:
                    v = w
            row[y] = v
        fd.append(row)
    return fd


def _tree_edit_pairs(a: _PostorderForest, b: _PostorderForest) -> list[tuple[int, int]]:
    """An optimal ordered tree edit mapping (insert/delete cost 1, only equal labels mapped) between
    two postorder forests, as pairs of original indices.  Traceback prefers deleting, then inserting,
    the last node, so matches lean towards the start.  O(keyroot_cells(a) * keyroot_cells(b))."""
    n1, n2 = len(a.label) - 1, len(b.label) - 1
    tree_distance = [[0] * (n2 + 1) for _ in range(n1 + 1)]
    for i in a.keyroots:
        for j in b.keyroots:
            _forest_distance(a, b, i, j, tree_distance, True)
    l1, l2 = a.leftmost, b.leftmost
    pairs: list[tuple[int, int]] = []
    stack = [(n1, n2)]
    while stack:
        i, j = stack.pop()
        fd = _forest_distance(a, b, i, j, tree_distance, False)
        li, lj = l1[i], l2[j]
        x, y = i - li + 1, j - lj + 1
        while x > 0 and y > 0:
            gx, gy = li + x - 1, lj + y - 1
            here = fd[x][y]
            if here == fd[x - 1][y] + 1:
                x -= 1
            elif here == fd[x][y - 1] + 1:
                y -= 1
            elif l1[gx] == li and l2[gy] == lj:
                if a.origin[gx] >= 0:
                    pairs.append((a.origin[gx], b.origin[gy]))
                x -= 1
                y -= 1
            else:
                stack.append((gx, gy))
                x, y = l1[gx] - li, l2[gy] - lj
    return pairs


# --------------------------------------------------------------------------------------------------
# Forest matcher
# --------------------------------------------------------------------------------------------------

class _Matcher:
    """The two indexed forests, the pairing being built (pair_et, pair_kineto: partner index or -1;
    how: _HOW_* per paired ET node) and a stack of pending tasks.

    A task is (_SIBLINGS, et items, kineto items): two sequences of sibling subtrees to align, or
    (_ORDER, et items, kineto items): subtrees below max_depth, aligned on pre-order labels.  Tasks
    cover disjoint subtrees, so each node is decided once: total work O(n + gap work)."""

    def __init__(self, et: _IndexedForest, kineto: _IndexedForest, max_depth: int) -> None:
        self.et = et
        self.kineto = kineto
        self.max_depth = max_depth
        self.pair_et = [-1] * len(et.label)
        self.pair_kineto = [-1] * len(kineto.label)
        self.how = bytearray(len(et.label))
        self.stats = _Stats()
        self.expansion_nesting = 0
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
        self.tasks.append((kind, _children(et, x), _children(kineto, y)))

    # region handlers --------------------------------------------------------------------------
    def _siblings(self, xs: list[int], ys: list[int]) -> None:
        """Align two sibling sequences on their labels (subtree shapes serve as extra anchors in long
        gaps; gaps are solved by _item_dp); equal-label pairs are paired wholesale when their subtrees
        are identical, otherwise their children are aligned next; items left untouched on both sides
        of a stretch go to _gap."""
        et, kineto = self.et, self.kineto
        label_a, label_b, shape_a, shape_b = et.label, kineto.label, et.shape, kineto.shape
        pairs = _align_tokens([label_a[x] for x in xs], [label_b[y] for y in ys], xs, ys, self.stats,
                              [shape_a[x] for x in xs], [shape_b[y] for y in ys], self._solve_gap)
        for x, y in pairs:
            self._pair_same_label(x, y)
        if len(pairs) == len(xs) == len(ys):
            return
        item_a = {x: i for i, x in enumerate(xs)}
        item_b = {y: j for j, y in enumerate(ys)}
        last_a = last_b = -1
        touched = [(_owner(et, x, item_a), _owner(kineto, y, item_b)) for x, y in pairs]
        touched.append((len(xs), len(ys)))
        for i, j in touched:
            if i > last_a + 1 and j > last_b + 1:
                self._gap(xs[last_a + 1:i], ys[last_b + 1:j])
            last_a, last_b = max(last_a, i), max(last_b, j)

    def _expand_absent(self, xs: list[int], ys: list[int],
                       mirror: bool) -> tuple[list[int], list[int], list[int], list[int]]:
        """Replace every item whose label occurs neither among the other side's items nor among their
        children by its children, one level, ET side first, then the Kineto side against the new ET
        items: a node missing on one side (an ET node whose Kineto event is missing, an extra Kineto
        annotation, a relabelled node) has its children stand in its place.  A label found among the
        other side's children is left to _item_dp's opening.  Returns the new lists and, for each new
        item, the index of the original item it descends from.  O(items + their children)."""
        et, kineto = self.et, self.kineto
        origin_a, origin_b = list(range(len(xs))), list(range(len(ys)))
        label_a, label_b, size_a, size_b = et.label, kineto.label, et.size, kineto.size
        labels_b = {label_b[y] for y in ys}
        if any(label_a[x] not in labels_b and size_a[x] > 1 for x in xs):
            xs, origin_a = self._expand(et, xs, origin_a, _labels_with_children(kineto, ys), mirror)
        labels_a = {label_a[x] for x in xs}
        if any(label_b[y] not in labels_a and size_b[y] > 1 for y in ys):
            ys, origin_b = self._expand(kineto, ys, origin_b, _labels_with_children(et, xs), mirror)
        return xs, ys, origin_a, origin_b

    @staticmethod
    def _expand(forest: _IndexedForest, items: list[int], origin: list[int], other_labels: set[int],
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
                kids = _children(forest, x)
                new_items.extend(kids[::-1] if mirror else kids)
                new_origin.extend([o] * len(kids))
        return new_items, new_origin

    def _solve_gap(self, xs: list[int], ys: list[int], mirror: bool,
                   band: int | None = None) -> list[tuple[int, int, int, int]]:
        """Gap solver of a sibling alignment: expand items missing on the other side (_expand_absent),
        then align with _item_dp (banded when band is given and nothing was expanded); an expanded gap
        too large for that is aligned again with _align_earliest, whose gaps come back here (at most
        MAX_EXPANSION_NESTING levels deep; deeper, nothing is expanded any more).  Returns
        (i, j, x, y) sorted, i and j being the indices of the original items x and y descend from."""
        if self.expansion_nesting >= MAX_EXPANSION_NESTING:
            return self._item_dp(xs, ys, mirror, band)
        ex, ey, origin_a, origin_b = self._expand_absent(xs, ys, mirror)
        if ex is xs and ey is ys:
            return self._item_dp(xs, ys, mirror, band)
        if len(ex) * len(ey) <= GAP_SOLVE_CELLS:
            return [(origin_a[i], origin_b[j], x, y) for i, j, x, y in self._item_dp(ex, ey, mirror)]
        et, kineto = self.et, self.kineto
        where_a = dict(zip(ex, origin_a))
        where_b = dict(zip(ey, origin_b))
        self.expansion_nesting += 1
        try:
            pairs = _align_earliest([et.label[x] for x in ex], [kineto.label[y] for y in ey], ex, ey,
                                    self.stats, [et.shape[x] for x in ex], [kineto.shape[y] for y in ey],
                                    self._solve_gap, mirror)
        finally:
            self.expansion_nesting -= 1
        found = [(_owner(et, x, where_a), _owner(kineto, y, where_b), x, y) for x, y in pairs]
        found.sort()
        return found

    def _item_dp(self, xs: list[int], ys: list[int], mirror: bool,
                 band: int | None = None) -> list[tuple[int, int, int, int]]:
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
        et, kineto = self.et, self.kineto
        m, n = len(xs), len(ys)
        label_a, label_b, shape_a, shape_b = et.label, kineto.label, et.shape, kineto.shape
        size_a, size_b = et.size, kineto.size

        def score(x: int, y: int) -> int:
            if shape_a[x] == shape_b[y]:
                return 2 * size_a[x]
            return 2 * min(size_a[x], size_b[y]) - 1

        def kids(forest: _IndexedForest, node: int) -> list[int]:
            found = _children(forest, node)
            return found[::-1] if mirror else found

        la = [label_a[x] for x in xs]
        lb = [label_b[y] for y in ys]
        kids_a = [kids(et, x) if size_a[x] > 1 else None for x in xs]
        kids_b = [kids(kineto, y) if size_b[y] > 1 else None for y in ys]
        kid_labels_a = [None if k is None else {label_a[c] for c in k} for k in kids_a]
        kid_labels_b = [None if k is None else {label_b[c] for c in k} for k in kids_b]
        columns_of: dict[int, list[int]] = {}  # label -> columns j with that label
        for j, t in enumerate(lb):
            columns_of.setdefault(t, []).append(j)
        opener_columns: dict[int, list[int]] = {}  # label -> columns j whose children have it
        for j, labels in enumerate(kid_labels_b):
            for t in labels or ():
                opener_columns.setdefault(t, []).append(j)
        column_shape = [shape_b[y] for y in ys]
        column_size = [size_b[y] for y in ys]
        opened: dict[tuple[int, int, int], tuple[int, int, list[tuple[int, int, int, int]]]] = {}

        def open_a(i: int, j: int) -> tuple[int, int, list[tuple[int, int, int, int]]]:
            key = (0, i, j)
            if key not in opened:
                u, total, made = j, 0, []
                for c in kids_a[i]:
                    if u < n and label_a[c] == lb[u]:
                        total += score(c, ys[u])
                        made.append((i, u, c, ys[u]))
                        u += 1
                opened[key] = (total, u - j, made)
            return opened[key]

        def open_b(i: int, j: int) -> tuple[int, int, list[tuple[int, int, int, int]]]:
            key = (1, i, j)
            if key not in opened:
                u, total, made = i, 0, []
                for c in kids_b[j]:
                    if u < m and label_b[c] == la[u]:
                        total += score(xs[u], c)
                        made.append((u, j, xs[u], c))
                        u += 1
                opened[key] = (total, u - i, made)
            return opened[key]

        if band is None:
            lo, hi = [0] * m, [n - 1] * m
        else:
            centre = [(i * n) // m for i in range(m)]
            lo = [max(0, c - band) for c in centre]
            hi = [min(n - 1, c + band) for c in centre]
        self.stats.item_cells += sum(hi[i] - lo[i] + 1 for i in range(m))
        # table[i][j]: best score of xs[i:] against ys[j:]; full-width rows, computed within the band
        # (a cell outside it is a lower bound: 0 or a running maximum).
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
            fa = _postorder_forest(et, xs, mirror=False)
            fb = _postorder_forest(kineto, ys, mirror=False)
            cells = _keyroot_cells(fa) * _keyroot_cells(fb)
            if cells <= TED_CELL_CAP:
                self.stats.ted_cells += 2 * cells
                forward = _tree_edit_pairs(fa, fb)
                backward = set(_tree_edit_pairs(_postorder_forest(et, xs, mirror=True),
                                                _postorder_forest(kineto, ys, mirror=True)))
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
        pa = _preorder_of(et, xs)
        pb = _preorder_of(kineto, ys)
        la, lb = et.label, kineto.label
        pairs = _align_tokens([la[p] for p in pa], [lb[q] for q in pb], pa, pb, self.stats)
        pair_et, pair_kineto, mark = self.pair_et, self.pair_kineto, self.how
        for x, y in pairs:
            pair_et[x] = y
            pair_kineto[y] = x
            mark[x] = how


def _choose_kineto_window(et: _IndexedForest, kineto: _IndexedForest) -> tuple[int, int]:
    """Range [start, end) of Kineto roots (positions in kineto.roots) the ET roots are aligned with.

    Only when Kineto holds clearly more than the ET (more roots, and more nodes than a copy of the ET
    with extra events could explain: extra iterations or annotations) is a stretch chosen.  The
    labels of the first WINDOW_HEAD ET roots and equal Kineto root labels give candidate points
    (rarest labels first, about WINDOW_POINTS, _candidate_pairs), chained with offsets measured in
    nodes (pre-order index; _longest_chain): missing events make the offset drift slowly, a jump to
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
    chain = _longest_chain(_candidate_pairs(at_a, at_b, WINDOW_POINTS), ra, rb)
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


def _nearest_paired_ancestor(forest: _IndexedForest, pair: list[int]) -> list[int]:
    """For each node, its closest proper ancestor that is paired, or -1.  O(n)."""
    parent = forest.parent
    out = [-1] * len(parent)
    for i, p in enumerate(parent):
        if p >= 0:
            out[i] = p if pair[p] >= 0 else out[p]
    return out


def _enforce_tree_mapping(et: _IndexedForest, kineto: _IndexedForest, pair_et: list[int],
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


def _unmatched_subtrees(forest: _IndexedForest, pair: list[int], names: list[str], side: str,
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
    ia = _index_forest(et, label_ids, shape_ids)
    ib = _index_forest(kineto, label_ids, shape_ids)
    del shape_ids
    matcher = _Matcher(ia, ib, max_depth)
    start, end = _choose_kineto_window(ia, ib)
    if ia.roots and end > start:
        matcher.tasks.append((_SIBLINGS, ia.roots, ib.roots[start:end]))
    matcher.run()
    pair_et, pair_kineto = matcher.pair_et, matcher.pair_kineto
    dropped = _enforce_tree_mapping(ia, ib, pair_et, pair_kineto)

    pairs = [(x, y) for x, y in enumerate(pair_et) if y >= 0]
    span = (0, 0)
    if pairs:
        first_root = last_root = -1
        for r in ib.roots:
            end_r = r + ib.size[r]
            if any(pair_kineto[k] >= 0 for k in range(r, end_r)):
                if first_root < 0:
                    first_root = r
                last_root = r
        span = (first_root, last_root + ib.size[last_root])
    counts = [0, 0, 0, 0]
    how = matcher.how
    for x, _ in pairs:
        counts[how[x]] += 1
    kineto_in_span = span[1] - span[0]
    unmatched = (_unmatched_subtrees(ia, pair_et, et.labels, ET_SIDE, 0, len(pair_et))
                 + _unmatched_subtrees(ib, pair_kineto, kineto.labels, KINETO_SIDE, *span))
    unmatched.sort(key=lambda u: (-u.size, u.side, u.root))
    stats = matcher.stats
    return ForestMatch(
        pairs=pairs,
        edit_cost=(len(pair_et) - len(pairs)) + (kineto_in_span - len(pairs)),
        tree_nodes=(len(pair_et), len(pair_kineto)),
        unmatched_subtrees=unmatched,
        kineto_span=span,
        paired_identical=counts[_HOW_IDENTICAL],
        paired_aligned=counts[_HOW_ALIGNED],
        paired_by_order=counts[_HOW_ORDER],
        item_cells=stats.item_cells,
        ted_cells=stats.ted_cells,
        dp_cells=stats.dp_cells,
        chunked_fallbacks=stats.chunked_fallbacks,
        ambiguous_unpaired=stats.ambiguous_unpaired,
        gaps_unresolved=stats.gaps_unresolved,
        inconsistent_dropped=dropped,
    )

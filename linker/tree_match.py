"""Structural (approximate) matching of two ordered, labelled forests.

This is LINKING.md method 3: pair the ops of an ET call tree with the events of a Kineto call tree
when neither record-function ids nor a plain order walk can be used.  The result is an *ordered
tree mapping* (the kind ordered tree edit distance produces): pairs only join equal labels, and for
any two pairs (a, b), (c, d): a is an ancestor of c iff b is an ancestor of d, and a precedes c in
pre-order iff b precedes d.

How it scales (n = nodes of both forests, d = nodes that differ):

1. Every subtree gets a canonical *shape id* (label + ordered child shape ids, interned in one dict
   shared by both forests) in one bottom-up pass, O(n).  Equal ids mean identical labelled subtrees,
   which are paired wholesale: in pre-order the two subtrees are the same index ranges, so pairing is a
   slice assignment.
2. Children lists of two paired nodes are aligned on their shape ids with a diff (common prefix and
   suffix, anchors on ids unique to both sides, recursively inside the gaps), so work is linear in the
   list plus the size of the gaps.
3. Only the gaps between anchors get a real alignment: equal label sequences pair position by
   position (and recurse); small gaps are aligned on their pre-order label sequences (deleting a node
   and promoting its children keeps the pre-order of the rest, so this recovers missing Kineto events);
   large gaps are aligned on the labels of their items and the unpaired items are *opened* (replaced
   by their children), i.e. treated as deleted nodes, which is one step of a forest edit distance.
4. Every exact alignment is an LCS table of at most DP_CELL_CAP cells, computed twice: once biased to
   the earliest matches and once to the latest.  Only pairs both agree on are kept, so a run of
   identical siblings where one copy is missing (which copy went missing is unknowable) stays unpaired
   instead of being guessed.  Larger tables fall back to a chunked alignment, and are counted.
5. Below ``max_depth`` the descendants of a paired node are aligned by order (pre-order labels) only.
6. A final O(n) pass drops any pair that would break the ancestor or order constraints, so the
   contract holds whatever the heuristics above did.

Why not networkx: the trees are ordered and labelled, so general (unordered) graph isomorphism or
graph edit distance solves a much harder problem than needed (exponential; the original tool ran out
of 12 GB on 1.7k nodes).  Nothing here needs a general graph algorithm.

Everything is iterative (explicit stacks): trees can be thousands of levels deep.  Memory is a few
integer lists per node, O(n), plus DP tables bounded by DP_CELL_CAP.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate
from dataclasses import dataclass

ET_SIDE = "et"
KINETO_SIDE = "kineto"

TED_CELL_CAP = 60_000
"""Largest gap (product of the key-root subtree sizes of both sides) given an exact tree edit distance."""

GAP_PREORDER_CAP = 3_000
"""A gap whose subtrees hold at most this many nodes per side is aligned on pre-order labels."""

SMALL_GAP_CELLS = 256
"""Gaps up to this many cells skip anchoring and go straight to the gap solver."""

SECONDARY_ANCHOR_CELLS = 256
"""Gaps above this many cells without a unique label may be cut at subtrees of unique shape."""


GAP_SOLVE_CELLS = 4_096
"""Largest gap without anchors solved exactly and unbanded (item DP or LCS table)."""

BAND_MIN = 16
"""Half-width of the band of a banded gap alignment, plus twice the length difference of the sides."""

BAND_CELL_CAP = 40_000
"""Largest banded gap alignment (cells)."""

MAX_PERIOD = 16
"""Longest period of a repeated run checked when a common prefix or suffix ends inside the run."""

WINDOW_POINTS = 20_000
"""Most candidate root pairs chained to choose the Kineto window."""


RARE_POINTS = 2_000
"""Most candidate pairs of rare tokens chained to anchor a large gap."""

LOCAL_RADIUS = 64
"""A rare-token anchor's token must not occur again within this many positions on either side."""

CHAIN_REACH = 2
"""Offset buckets on each side searched for a chain predecessor."""

CHAIN_LOOKBACK = 4
"""Latest points per offset bucket considered as chain predecessors."""

CHUNK_ITEMS = 1_024
"""Items per chunk of the chunked fallback alignment of sibling sequences (banded item DP)."""

CHUNK_TOKENS = 256
"""Tokens per chunk of the chunked fallback alignment of pre-order label sequences (LCS)."""

CHUNK_MARGIN = 32
"""Extra columns, and minimum band half-width, of a chunk of the chunked fallback."""

_SIBLINGS = 0
_ORDER = 1

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
    """A maximal subtree none of whose nodes is paired.

    side: ET_SIDE or KINETO_SIDE; root: pre-order index of its root in that forest; label: the root's
    label; size: number of nodes in the subtree."""

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
    unmatched_subtrees: maximal fully unpaired subtrees, ET side and Kineto side (inside kineto_span),
      largest first.
    kineto_span: [start, end) pre-order index range of the Kineto roots the ET landed on (from the first
      to the last Kineto root holding a pair); (0, 0) when nothing is paired.
    paired_identical: pairs made wholesale from identical subtrees (same shape id).
    paired_aligned: pairs made by gap alignment above max_depth (label DP, pre-order alignment).
    paired_by_order: pairs made below max_depth by pre-order label alignment under a paired ancestor.
    item_cells: cells of the sibling DP with opening (_item_dp) computed in total.
    ted_cells: tree edit distance table cells computed in total (small gaps).
    dp_cells: LCS table cells computed in total.
    chunked_fallbacks: gaps too large for one exact alignment and without anchors, aligned chunk by
      chunk instead (each chunk exactly, within a band; see _chunked).
    ambiguous_unpaired: candidate pairs left out because the earliest and latest optimal alignments
      disagreed on them (e.g. a run of identical siblings with one copy missing).
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
    inconsistent_dropped: int = 0


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


# --------------------------------------------------------------------------------------------------
# Sequence alignment of token lists
# --------------------------------------------------------------------------------------------------

def _increasing_chain(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest subsequence of points (sorted by first coordinate, distinct) whose second coordinate
    strictly increases.  O(k log k)."""
    tails: list[int] = []
    tail_at: list[int] = []
    prev = [-1] * len(points)
    for k, (_, j) in enumerate(points):
        pos = bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_at.append(k)
        else:
            tails[pos] = j
            tail_at[pos] = k
        prev[k] = tail_at[pos - 1] if pos else -1
    out = []
    k = tail_at[-1] if tail_at else -1
    while k != -1:
        out.append(points[k])
        k = prev[k]
    out.reverse()
    return out


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
    return _increasing_chain(points) if points else []


def _neighbour_agrees(a: list, b: list, i: int, j: int) -> bool:
    """True when the tokens just before (or just after) positions i of a and j of b are equal (or both
    missing).  A secondary anchor (equal subtree shape) whose neighbours both disagree is more likely a
    coincidence (a subtree that lost a node now looks like a neighbour) than a true pair.  O(1)."""
    before = (a[i - 1] == b[j - 1]) if i and j else (i == 0 and j == 0)
    if before:
        return True
    return (a[i + 1] == b[j + 1]) if i + 1 < len(a) and j + 1 < len(b) else (i + 1 == len(a) and j + 1 == len(b))


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
                   corners: tuple[tuple[int, int], tuple[int, int]] | None = None) -> list[tuple[int, int]]:
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
    length = [0] * len(points)  # 0: cannot be part of a chain
    before = [-1] * len(points)
    buckets: dict[int, list[int]] = {}
    best = -1
    for k, (p, q) in enumerate(points):
        offset = pos_b[q] - pos_a[p]
        if corners is None or _drift_ok(corners[0][1] - corners[0][0], offset, pos_b[q] - corners[0][1]):
            length[k] = 1
        home = offset // bucket
        for near in range(home - CHAIN_REACH, home + CHAIN_REACH + 1):
            for back in buckets.get(near, ())[-CHAIN_LOOKBACK:]:
                p0, q0 = points[back]
                if length[back] and p0 < p and q0 < q and length[back] + 1 > length[k]:
                    offset0 = pos_b[q0] - pos_a[p0]
                    if (abs(offset - offset0) <= CHAIN_REACH * bucket
                            and _drift_ok(offset0, offset, pos_b[q] - pos_b[q0])):
                        length[k] = length[back] + 1
                        before[k] = back
        if length[k]:
            buckets.setdefault(home, []).append(k)
            if (best < 0 or length[k] > length[best]) and (
                    corners is None or _drift_ok(offset, corners[1][1] - corners[1][0], corners[1][1] - pos_b[q])):
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
    """Anchors for a large gap without unique tokens (e.g. repeated iterations): pairs of equal
    tokens, rarest tokens first, about RARE_POINTS of them (_candidate_pairs), chained
    (_longest_chain, offsets measured on the node indices xs, ys: pre-order positions, which a missing
    node shifts by one only) so that they stay near one diagonal, keeping the pairs whose token is unique
    within LOCAL_RADIUS on both sides (_locally_unique).  O(m + n + RARE_POINTS * CHAIN_REACH * CHAIN_LOOKBACK)."""
    where_a: dict = {}
    for i in range(i0, i1):
        where_a.setdefault(a[i], []).append(i)
    where_b: dict = {}
    for j in range(j0, j1):
        if b[j] in where_a:
            where_b.setdefault(b[j], []).append(j)
    points = _candidate_pairs(where_a, where_b, RARE_POINTS)
    if mirror:  # reversed lists: node indices decrease, chain on their negation
        xs, ys = [-x for x in xs], [-y for y in ys]
    chain = _longest_chain(points, xs, ys, ((xs[i0], ys[j0]), (xs[i1 - 1], ys[j1 - 1])))
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
    tokens) whose neighbours agree.  A gap without anchors is solved exactly when it has at most
    GAP_SOLVE_CELLS cells: by solve_gap(xs part, ys part, mirror, band) -> [(i, j, x, y)] when given,
    else by an LCS table.  A larger gap is solved by solve_gap restricted to a band around the
    diagonal when that fits in BAND_CELL_CAP cells, else cut by rare-token anchors (_rare_anchors),
    else aligned chunk by chunk (_chunked, counted as a fallback).
    Cost: O(m + n) for near-identical inputs; O((m + n) log + gap work) in general."""
    found: list[tuple[int, int, int, int]] = []  # (i, j, x, y); x = -1 means (xs[i], ys[j])

    def solve(i0: int, i1: int, j0: int, j1: int, band: int | None = None) -> list[tuple[int, int, int, int]]:
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
        band = BAND_MIN + 2 * abs((i1 - i0) - (j1 - j0)) + (i1 - i0 + j1 - j0) // 64
        banded = solve_gap is not None and (i1 - i0) * (2 * band + 1) <= BAND_CELL_CAP
        if not anchors and cells > GAP_SOLVE_CELLS and not banded:
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
        elif cells <= GAP_SOLVE_CELLS:
            found.extend(solve(i0, i1, j0, j1))
        elif banded:
            found.extend(solve(i0, i1, j0, j1, band))
        else:
            stats.chunked_fallbacks += 1
            _chunked(i0, i1, j0, j1, CHUNK_ITEMS if solve_gap is not None else CHUNK_TOKENS, solve, found)
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


def _gaps(pairs: list[tuple[int, int]], m: int, n: int):
    """Yield (i0, i1, j0, j1) for the unpaired stretches around sorted pairs (possibly empty sides)."""
    pi = pj = 0
    for i, j in pairs:
        if i > pi or j > pj:
            yield pi, i, pj, j
        pi, pj = i + 1, j + 1
    if pi < m or pj < n:
        yield pi, m, pj, n


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


def _label_overlap(la: list[int], lb: list[int]) -> int:
    """Size of the multiset intersection of two label lists.  O(len(la) + len(lb))."""
    count: dict[int, int] = {}
    for t in la:
        count[t] = count.get(t, 0) + 1
    common = 0
    for t in lb:
        c = count.get(t, 0)
        if c:
            count[t] = c - 1
            common += 1
    return common


# --------------------------------------------------------------------------------------------------
# Ordered tree edit distance (Zhang-Shasha) for small gaps
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
    """Holds the two indexed forests, the pairing being built and a stack of pending regions.

    A region is either (SIBLINGS, et items, kineto items): two sequences of sibling subtrees to align,
    or (ORDER, et items, kineto items): subtrees below max_depth, aligned on pre-order labels.
    Regions are disjoint, so each node is decided once: total work O(n + gap work)."""

    def __init__(self, et: _IndexedForest, kineto: _IndexedForest, max_depth: int) -> None:
        self.et = et
        self.kineto = kineto
        self.max_depth = max_depth
        self.pair_et = [-1] * len(et.label)
        self.pair_kineto = [-1] * len(kineto.label)
        self.how = bytearray(len(et.label))
        self.stats = _Stats()
        self.tasks: list[tuple[int, list[int], list[int]]] = []

    def run(self) -> None:
        while self.tasks:
            kind, xs, ys = self.tasks.pop()
            if kind == _SIBLINGS:
                self._siblings(xs, ys)
            else:
                self._by_order(xs, ys, _HOW_ORDER)

    # pairing primitives -----------------------------------------------------------------------
    def _pair_identical(self, x: int, y: int) -> None:
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
        if min(et.depth[x] for x in xs) > self.max_depth:
            self._by_order(xs, ys, _HOW_ORDER)
            return
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
        too large for that is aligned again with _align_earliest.  Returns (i, j, x, y) sorted, i and j
        being the indices of the original items x and y descend from."""
        ex, ey, origin_a, origin_b = self._expand_absent(xs, ys, mirror)
        if len(ex) == len(xs) and len(ey) == len(ys):
            return self._item_dp(xs, ys, mirror, band)
        if len(ex) * len(ey) <= GAP_SOLVE_CELLS:
            return [(origin_a[i], origin_b[j], x, y) for i, j, x, y in self._item_dp(ex, ey, mirror)]
        et, kineto = self.et, self.kineto
        where_a = dict(zip(ex, origin_a))
        where_b = dict(zip(ey, origin_b))
        pairs = _align_earliest([et.label[x] for x in ex], [kineto.label[y] for y in ey], ex, ey,
                                self.stats, [et.shape[x] for x in ex], [kineto.shape[y] for y in ey],
                                self._solve_gap, mirror)
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
        """Siblings left untouched facing each other (both sides non-empty).  Small gaps get an exact
        ordered tree edit distance (run on the forests and on their mirror images; only pairs both
        optima agree on are kept); otherwise their pre-order label sequences are aligned when not too
        long; else they are opened (_open).  Deleting a node and promoting its children, which is what a
        missing Kineto event does, is an edit operation of all three."""
        et, kineto = self.et, self.kineto
        if all(et.size[x] == 1 for x in xs) and all(kineto.size[y] == 1 for y in ys):
            return  # leaves only: the label alignment that left them unpaired is all there is
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
        if (sum(et.size[x] for x in xs) <= GAP_PREORDER_CAP
                and sum(kineto.size[y] for y in ys) <= GAP_PREORDER_CAP):
            self._by_order(xs, ys, _HOW_ALIGNED)
        else:
            self._open(xs, ys)

    def _open(self, xs: list[int], ys: list[int]) -> None:
        """Unpaired items facing each other: treat the items of one side (or both) as deleted nodes,
        replace them by their children and align again.  The side(s) opened are those whose children
        share most labels with the other side; nothing is opened when no labels would be shared."""
        et, kineto = self.et, self.kineto
        open_a = [c for x in xs for c in (_children(et, x) or [x])]
        open_b = [c for y in ys for c in (_children(kineto, y) or [y])]
        can_a = len(open_a) != len(xs) or any(et.size[x] > 1 for x in xs)
        can_b = len(open_b) != len(ys) or any(kineto.size[y] > 1 for y in ys)
        la = [et.label[x] for x in xs]
        lb = [kineto.label[y] for y in ys]
        options = []
        if can_a:
            options.append((_label_overlap([et.label[x] for x in open_a], lb), 2, open_a, ys))
        if can_b:
            options.append((_label_overlap(la, [kineto.label[y] for y in open_b]), 1, xs, open_b))
        if can_a and can_b:
            options.append((_label_overlap([et.label[x] for x in open_a],
                                           [kineto.label[y] for y in open_b]), 0, open_a, open_b))
        if not options:
            return
        best = max(options, key=lambda o: (o[0], o[1]))
        if best[0] > 0:
            self.tasks.append((_SIBLINGS, best[2], best[3]))

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
    with extra events could explain: extra iterations or annotations) is a stretch chosen: equal root
    labels give candidate points (ET root p, Kineto root q), rarest labels first, about
    WINDOW_POINTS of them (_candidate_pairs), chained with offsets measured in nodes (pre-order
    index; _longest_chain): missing events make the offset drift slowly, a jump to another copy of an
    iteration moves it by a whole iteration.  The longest chain (earliest on a tie) gives the
    stretch, widened by the ET roots before its first and after its last point plus a small slack.
    O(m + n + WINDOW_POINTS * CHAIN_REACH * CHAIN_LOOKBACK) time, O(m + n + points) memory."""
    ra, rb = et.roots, kineto.roots
    m, n = len(ra), len(rb)
    slack = 2 + m // 16
    et_nodes, kineto_nodes = len(et.label), len(kineto.label)
    if n <= m + slack or kineto_nodes <= et_nodes + et_nodes // 4 + 64:
        return 0, n
    at_a: dict[int, list[int]] = {}
    for p, x in enumerate(ra):
        at_a.setdefault(et.label[x], []).append(p)
    at_b: dict[int, list[int]] = {}
    for q, y in enumerate(rb):
        if kineto.label[y] in at_a:
            at_b.setdefault(kineto.label[y], []).append(q)
    if not at_b:
        return 0, n
    chain = _longest_chain(_candidate_pairs(at_a, at_b, WINDOW_POINTS), ra, rb)
    first_p, first_q = chain[0]
    last_p, last_q = chain[-1]
    start = max(0, first_q - first_p - slack)
    end = min(n, last_q + (m - 1 - last_p) + 1 + slack)
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
    chain is kept, O(n log n).  Dropping a consistent pair keeps the others consistent."""
    dropped = 0
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
        keep = set(_increasing_chain(points))
        for x, y in points:
            if (x, y) not in keep:
                pair_et[x] = -1
                pair_kineto[y] = -1
                dropped += 1
    return dropped


def _unmatched_subtrees(forest: _IndexedForest, pair: list[int], names: list[str], side: str,
                        lo: int, hi: int) -> list[UnmatchedSubtree]:
    """Maximal subtrees inside [lo, hi) with no paired node.  O(n)."""
    parent, size = forest.parent, forest.size
    touched = bytearray(len(parent))  # 1 if the subtree holds a pair
    for i in range(hi - 1, lo - 1, -1):
        if pair[i] >= 0:
            touched[i] = 1
        if touched[i]:
            p = parent[i]
            if p >= 0:
                touched[p] = 1
    out = []
    for i in range(lo, hi):
        if not touched[i]:
            p = parent[i]
            if p < 0 or touched[p]:
                out.append(UnmatchedSubtree(side=side, root=i, label=names[i], size=size[i]))
    return out


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
        inconsistent_dropped=dropped,
    )

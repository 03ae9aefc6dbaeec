"""Order-preserving alignment of two token sequences (sibling labels or pre-order labels), biased
to the earliest or the latest matches, and the pairs both agree on (``align_tokens``).

Work follows the differences: common ends, anchors (unique tokens, unique subtree shapes, rare
tokens chained along one diagonal) cut the sequences into gaps, each solved exactly (a caller's
gap solver or an LCS), within a band, or chunk by chunk. Cost: O(m + n) for near-identical inputs,
O((m + n) log + gap work) in general; DP tables bounded by the caps below.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate

from linker.link.align import longest_increasing_chain
from linker.link.tree_match.result import MatchStats

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


def _lcs_earliest(a: list, b: list, i0: int, i1: int, j0: int, j1: int, stats: MatchStats,
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


def longest_chain(points: list[tuple[int, int]], pos_a, pos_b,
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


def candidate_pairs(where_a: dict, where_b: dict, budget: int) -> list[tuple[int, int]]:
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
    (longest_chain, tied to the corners) so that they follow one diagonal, and only pairs whose
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
    chain = longest_chain(points, xs, ys, ((start_a, start_b), (end_a, end_b)))
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


def align_earliest(a: list, b: list, xs: list[int], ys: list[int], stats: MatchStats,
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
        i0, i1, j0, j1 = _pair_common_ends(a, b, *stack.pop(), found)
        if i0 >= i1 or j0 >= j1:
            continue
        if (i1 - i0) * (j1 - j0) <= SMALL_GAP_CELLS:
            found.extend(solve(i0, i1, j0, j1))
            continue
        anchors, exact, banded, band = _gap_plan(a, b, xs, ys, sa, sb, (i0, i1, j0, j1), solve_gap is not None, mirror)
        if anchors:
            found.extend((i, j, -1, -1) for i, j in anchors)
            stack.extend(_between_anchors(anchors, i0, i1, j0, j1))
        elif exact:
            found.extend(solve(i0, i1, j0, j1))
        elif banded:
            found.extend(solve(i0, i1, j0, j1, band))
        else:
            stats.chunked_fallbacks += 1
            chunk = CHUNK_ITEMS if solve_gap is not None else CHUNK_TOKENS
            _chunked(i0, i1, j0, j1, chunk, solve, found)
    return [(xs[i], ys[j]) if x < 0 else (x, y) for i, j, x, y in found]


def _pair_common_ends(a: list, b: list, i0: int, i1: int, j0: int, j1: int,
                      found: list) -> tuple[int, int, int, int]:
    """Pairs the common prefix and suffix of a[i0:i1] and b[j0:j1] (into ``found``, as
    ``align_earliest`` keeps them); returns the bounds of what lies between them."""
    p, s = _common_ends(a, b, i0, i1, j0, j1)
    found.extend((i0 + k, j0 + k, -1, -1) for k in range(p))
    found.extend((i1 - k, j1 - k, -1, -1) for k in range(1, s + 1))
    return i0 + p, i1 - s, j0 + p, j1 - s


def _gap_plan(a: list, b: list, xs: list[int], ys: list[int], sa: list | None, sb: list | None,
              gap: tuple[int, int, int, int], gap_solver: bool, mirror: bool) -> tuple[list, bool, bool, int]:
    """How ``align_earliest`` aligns the gap a[i0:i1] x b[j0:j1]: its anchors (tokens unique to
    both sides; else, above SECONDARY_ANCHOR_CELLS, secondary tokens unique to both sides whose
    neighbours agree; else, when the gap can be solved neither exactly nor in a band, rare
    tokens), whether it can be solved exactly, whether in a band, and that band's half-width
    (``gap_solver``: a solve_gap is given, else the LCS table's caps apply)."""
    i0, i1, j0, j1 = gap
    cells = (i1 - i0) * (j1 - j0)
    anchors = _unique_anchors(a, b, i0, i1, j0, j1)
    if not anchors and sa is not None and cells > SECONDARY_ANCHOR_CELLS:
        anchors = [(i, j) for i, j in _unique_anchors(sa, sb, i0, i1, j0, j1) if _neighbour_agrees(a, b, i, j)]
    band = BAND_MIN + abs((i1 - i0) - (j1 - j0)) + (i1 - i0 + j1 - j0) // 64
    if gap_solver:
        exact, banded = cells <= GAP_SOLVE_CELLS, (i1 - i0) * (2 * band + 1) <= BAND_CELL_CAP
    else:
        exact, banded = cells <= LCS_CELL_CAP, False
    if not anchors and not exact and not banded:
        anchors = _rare_anchors(a, b, xs, ys, i0, i1, j0, j1, mirror)
    return anchors, exact, banded, band


def _between_anchors(anchors: list[tuple[int, int]], i0: int, i1: int, j0: int, j1: int) -> list[tuple]:
    """The gaps (i0, i1, j0, j1) between consecutive anchors and around them, in order, the empty
    ones left out."""
    gaps = []
    pi, pj = i0, j0
    for i, j in anchors:
        if i > pi or j > pj:
            gaps.append((pi, i, pj, j))
        pi, pj = i + 1, j + 1
    if pi < i1 or pj < j1:
        gaps.append((pi, i1, pj, j1))
    return gaps


def align_tokens(a: list, b: list, xs: list[int], ys: list[int], stats: MatchStats,
                 sa: list | None = None, sb: list | None = None,
                 solve_gap: Callable | None = None) -> list[tuple[int, int]]:
    """Node pairs (x, y), sorted by x, on which the earliest-biased and the latest-biased alignments
    of xs (tokens a) and ys (tokens b) agree; the latter is the earliest alignment of the reversed
    lists (solve_gap is then called with mirror=True and must reverse children lists too).

    A pair the two disagree on can slide (e.g. which copy of a run of identical siblings is missing
    cannot be known): it is left out and counted in stats.ambiguous_unpaired.
    Cost: O(m) when a == b, else twice align_earliest."""
    if a == b:
        return list(zip(xs, ys))
    early = align_earliest(a, b, xs, ys, stats, sa, sb, solve_gap, False)
    late = set(align_earliest(a[::-1], b[::-1], xs[::-1], ys[::-1], stats,
                              None if sa is None else sa[::-1], None if sb is None else sb[::-1],
                              solve_gap, True))
    certain = [p for p in early if p in late]
    stats.ambiguous_unpaired += len(early) - len(certain)
    certain.sort()
    return certain

"""Order-preserving alignment of two name sequences (the core of exact matching).

``align_sequences(a, b)`` returns pairs ``(i, j)`` with ``a[i] == b[j]``, strictly increasing in both
``i`` and ``j`` (a common subsequence: pairs never cross, never pair different names). It recovers a
constant shift as well as local insertions and deletions, in near-linear time on the sequences
traces produce (long identical stretches with scattered differences):

1. common prefix and suffix are paired directly (O(n));
2. a region small enough (``dp_cells``) is solved exactly by longest-common-subsequence DP;
3. a larger one is split at anchors — names (then n-grams) occurring exactly once on each side,
   kept when they agree in order (longest increasing subsequence) — and the pieces are solved again;
4. a large region with no anchor (e.g. 48 identical layers) is walked in step, re-synchronising after
   each difference at the nearest point (smallest skip on both sides) where the names agree,
   preferring, among equally near points, the longest agreeing run (up to ``run``), found through a position index (cost per difference O(window · log n)).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from typing import Hashable, Sequence

DEFAULT_DP_CELLS = 200_000
RESYNC_WINDOWS = (16, 256, 4096)


def align_sequences(
    a: Sequence[Hashable], b: Sequence[Hashable], dp_cells: int = DEFAULT_DP_CELLS, run: int = 8
) -> list[tuple[int, int]]:
    """Pair equal items of ``a`` and ``b`` in order. See the module docstring for method and cost."""
    pairs: list[tuple[int, int]] = []
    regions = [(0, len(a), 0, len(b))]
    while regions:
        alo, ahi, blo, bhi = regions.pop()
        while alo < ahi and blo < bhi and a[alo] == b[blo]:
            pairs.append((alo, blo))
            alo += 1
            blo += 1
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
            ahi -= 1
            bhi -= 1
            pairs.append((ahi, bhi))
        if alo == ahi or blo == bhi:
            continue
        if (ahi - alo) * (bhi - blo) <= dp_cells:
            pairs.extend(_lcs(a, b, alo, ahi, blo, bhi))
            continue
        anchors = _anchors(a, b, alo, ahi, blo, bhi)
        if anchors:
            prev_i, prev_j = alo, blo
            for i, j, length in anchors:
                regions.append((prev_i, i, prev_j, j))
                pairs.extend((i + k, j + k) for k in range(length))
                prev_i, prev_j = i + length, j + length
            regions.append((prev_i, ahi, prev_j, bhi))
            continue
        pairs.extend(_resync_walk(a, b, alo, ahi, blo, bhi, run))
    pairs.sort()
    return pairs


def _lcs(a, b, alo, ahi, blo, bhi) -> list[tuple[int, int]]:
    """Exact LCS of a[alo:ahi] and b[blo:bhi] by DP. O(n·m) time and memory."""
    n, m = ahi - alo, bhi - blo
    rows = [[0] * (m + 1)]
    for i in range(n):
        ai = a[alo + i]
        prev = rows[-1]
        row = [0] * (m + 1)
        for j in range(m):
            if ai == b[blo + j]:
                row[j + 1] = prev[j] + 1
            else:
                left, up = row[j], prev[j + 1]
                row[j + 1] = left if left >= up else up
        rows.append(row)
    out = []
    i, j = n, m
    while i and j:
        if a[alo + i - 1] == b[blo + j - 1] and rows[i][j] == rows[i - 1][j - 1] + 1:
            out.append((alo + i - 1, blo + j - 1))
            i -= 1
            j -= 1
        elif rows[i - 1][j] >= rows[i][j - 1]:
            i -= 1
        else:
            j -= 1
    out.reverse()
    return out


def _anchors(a, b, alo, ahi, blo, bhi) -> list[tuple[int, int, int]]:
    """Unique-on-both-sides items (then n-grams of length 4, 16) agreeing in order: (i, j, len)."""
    for k in (1, 4, 16):
        if ahi - alo < k or bhi - blo < k:
            break
        if k == 1:
            a_keys = [a[i] for i in range(alo, ahi)]
            b_keys = [b[j] for j in range(blo, bhi)]
        else:
            a_keys = [tuple(a[i:i + k]) for i in range(alo, ahi - k + 1)]
            b_keys = [tuple(b[j:j + k]) for j in range(blo, bhi - k + 1)]
        a_count = Counter(a_keys)
        b_count = Counter(b_keys)
        b_pos = {key: blo + j for j, key in enumerate(b_keys) if b_count[key] == 1 and a_count[key] == 1}
        if not b_pos:
            continue
        candidates = [(alo + i, b_pos[key]) for i, key in enumerate(a_keys) if key in b_pos]
        chain = longest_increasing_chain(candidates)
        anchors: list[tuple[int, int, int]] = []
        last_i = last_j = -1
        for i, j in chain:  # n-gram anchors may overlap: keep the non-overlapping ones
            if i >= last_i and j >= last_j:
                anchors.append((i, j, k))
                last_i, last_j = i + k, j + k
        if anchors:
            return anchors
    return []


def longest_increasing_chain(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest chain of points strictly increasing in both coordinates (points sorted by the
    first, distinct there). O(k log k)."""
    tails: list[int] = []  # tails[L] = smallest j ending a chain of length L+1
    tail_at: list[int] = []
    back = [-1] * len(points)
    for idx, (_, j) in enumerate(points):
        pos = bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_at.append(idx)
        else:
            tails[pos] = j
            tail_at[pos] = idx
        back[idx] = tail_at[pos - 1] if pos else -1
    chain = []
    idx = tail_at[-1] if tail_at else -1
    while idx >= 0:
        chain.append(points[idx])
        idx = back[idx]
    chain.reverse()
    return chain


def _resync_walk(a, b, alo, ahi, blo, bhi, run) -> list[tuple[int, int]]:
    """Walk both sequences in step; after a difference jump to the nearest agreeing run."""
    positions: dict = {}
    for j in range(blo, bhi):
        positions.setdefault(b[j], []).append(j)
    out = []
    i, j = alo, blo
    while i < ahi and j < bhi:
        if a[i] == b[j]:
            out.append((i, j))
            i += 1
            j += 1
            continue
        jump = None
        for window in RESYNC_WINDOWS:
            jump = _nearest_resync(a, b, i, ahi, j, bhi, positions, window, run)
            if jump is not None:
                break
        if jump is None:  # nothing agrees ahead on the a side: a[i] has no partner
            i += 1
            continue
        i, j = jump
    return out


def _nearest_resync(a, b, i, ahi, j, bhi, positions, window, run):
    """The re-synchronisation point (i + x, j + y) with a[i+x] == b[j+y], x, y < window, of least
    skip x + y; among equally near ones, the one starting the longest agreeing run (up to ``run``)."""
    best = None
    best_key = (2 * window, 0)
    for x in range(min(window, ahi - i)):
        if x > best_key[0]:
            break
        occurrences = positions.get(a[i + x])
        if not occurrences:
            continue
        k = bisect_left(occurrences, j)
        while k < len(occurrences):
            y = occurrences[k] - j
            if y >= window or x + y > best_key[0]:
                break
            limit = min(run, ahi - i - x, bhi - j - y)
            agree = 1
            while agree < limit and a[i + x + agree] == b[j + y + agree]:
                agree += 1
            key = (x + y, -agree)
            if key < best_key:
                best, best_key = (i + x, j + y), key
            k += 1
    return best


def gaps_between(pairs: list[tuple[int, int]], n: int, m: int):
    """The stretches an alignment left open: ``(a_lo, a_hi, b_lo, b_hi)`` before the first pair,
    between consecutive pairs and after the last, for pairs increasing in both coordinates over
    sequences of lengths ``n`` and ``m``. Stretches empty on either side are skipped. O(pairs)."""
    prev_a = prev_b = -1
    for a, b in pairs + [(n, m)]:
        if a - prev_a > 1 and b - prev_b > 1:
            yield prev_a + 1, a, prev_b + 1, b
        prev_a, prev_b = a, b


def _runs(seq: Sequence[Hashable]) -> list[int]:
    """For each position, the start of the run of equal consecutive items it belongs to."""
    starts = []
    for i, item in enumerate(seq):
        starts.append(starts[-1] if i and item == seq[i - 1] else i)
    return starts


def split_ambiguous_runs(
    a: Sequence[Hashable], b: Sequence[Hashable], pairs: list[tuple[int, int]]
) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
    """Take out pairs inside runs of equal consecutive names whose lengths differ between sides.

    When the ET has ``X X X`` where Kineto has ``X X``, names cannot tell which X is missing, and
    any choice risks a wrong link. Returns the pairs kept and the ambiguous regions
    ``(a_lo, a_hi, b_lo, b_hi)`` (one run on each side), which a caller may settle with more
    evidence than names (e.g. tensor shapes). O(n + m).
    """
    run_a, run_b = _runs(a), _runs(b)
    len_a: dict[int, int] = {}
    for s in run_a:
        len_a[s] = len_a.get(s, 0) + 1
    len_b: dict[int, int] = {}
    for s in run_b:
        len_b[s] = len_b.get(s, 0) + 1
    partner_of_a_run: dict[int, int] = {}
    partner_of_b_run: dict[int, int] = {}
    conflicting: set[int] = set()
    for i, j in pairs:
        ra, rb = run_a[i], run_b[j]
        if len_a[ra] == 1 and len_b[rb] == 1:
            continue
        partner_a = partner_of_a_run.setdefault(ra, rb)  # both first partners are recorded
        partner_b = partner_of_b_run.setdefault(rb, ra)
        if partner_a != rb or partner_b != ra:
            conflicting.add(ra)
            conflicting.add(partner_b)
    ambiguous = {ra for ra, rb in partner_of_a_run.items() if len_a[ra] != len_b[rb]} - conflicting
    if not ambiguous and not conflicting:
        return pairs, []
    dropped = ambiguous | conflicting
    kept = [(i, j) for i, j in pairs if run_a[i] not in dropped]
    regions = [(ra, ra + len_a[ra], partner_of_a_run[ra], partner_of_a_run[ra] + len_b[partner_of_a_run[ra]])
               for ra in sorted(ambiguous)]
    return kept, regions


def align_both_ways(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int, int]]:
    """The pairs on which aligning forwards and aligning the reversed sequences agree.

    Where a block repeats (``x y z x y z x y z``) and one copy lost an item, names cannot tell which
    copy it was: a forward alignment places the gap in one copy, a backward one in another, and the
    pairs between those places differ. Keeping only the pairs both agree on leaves those unlinked
    (a missing link beats a wrong one) and keeps everything elsewhere. Cost: two alignments.
    """
    forward = align_sequences(a, b)
    n, m = len(a), len(b)
    if len(forward) == n == m:  # everything paired in order: the only alignment there is
        return forward
    backward = {(n - 1 - i, m - 1 - j) for i, j in align_sequences(a[::-1], b[::-1])}
    return [pair for pair in forward if pair in backward]


def drop_ambiguous_runs(
    a: Sequence[Hashable], b: Sequence[Hashable], pairs: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """``split_ambiguous_runs`` without the regions: the pairs that names alone make certain."""
    return split_ambiguous_runs(a, b, pairs)[0]

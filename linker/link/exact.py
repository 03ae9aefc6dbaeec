"""Method 2: exact match by execution order, per thread (``--exact-match``).

Per paired thread, ET ops in start order (by id) and Kineto events in start order are aligned as
name sequences (``align.align_sequences``): equal names only, never crossing, recovering shifts
and local insertions/deletions. Cost: near-linear in the number of events.
"""

from __future__ import annotations

import msgspec

from linker.link.align import align_both_ways, drop_ambiguous_runs, gaps_between
from linker.read.et import ExecutionTrace
from linker.link.intervals import group_by_thread, lies_within
from linker.read.kineto import KinetoTrace
from linker.link.threads import OpMatch, pair_threads


def kineto_threads_in(kineto: KinetoTrace, keep: list[bool] | None) -> dict:
    """Kineto thread -> its event indices in start order, restricted to ``keep`` when given."""
    threads = group_by_thread(kineto.cpu_events)
    if keep is None:
        return threads
    restricted = {k: [i for i in idx if keep[i]] for k, idx in threads.items()}
    return {k: idx for k, idx in restricted.items() if idx}


def match_by_order(et: ExecutionTrace, kineto: KinetoTrace, keep: list[bool] | None = None) -> OpMatch:
    """Pair ET ops with Kineto events (only those with ``keep[i]``, when given) by order."""
    et_threads = et.threads()
    k_threads = kineto_threads_in(kineto, keep)
    pairs, unpaired = pair_threads(et_threads, k_threads, et, kineto)
    event_of_op = [-1] * len(et)
    for pair in pairs:
        ops = et_threads[pair.et_tid]
        evs = k_threads[pair.kineto_thread]
        aligned = align_names(et, kineto, ops, evs)
        for x, y in aligned:
            event_of_op[ops[x]] = evs[y]
        pair.linked = len(aligned)
    _align_leftover_threads(et, kineto, et_threads, k_threads, pairs, event_of_op)
    dropped = drop_links_outside_parent(et, kineto, event_of_op)
    match = OpMatch("exact", event_of_op, pairs, unpaired)
    match.stats["links_dropped_outside_parent"] = dropped
    if unpaired:
        match.notes.append(f"ET threads {unpaired} have no Kineto counterpart (Kineto recorded fewer threads)")
    return match


def _align_leftover_threads(et, kineto, et_threads, k_threads, pairs, event_of_op) -> None:
    """Second pass: Kineto threads left unpaired (a few events an ET thread recorded under another
    OS thread) are aligned against the still-unmatched ops of the ET thread sharing most names
    with them. Only unmatched ops are candidates, so first-pass links never change."""
    events = kineto.cpu_events
    paired = {p.kineto_thread for p in pairs}
    leftovers = [k for k in k_threads if k not in paired]
    if not leftovers:
        return
    for key in leftovers:
        evs = k_threads[key]
        names = {events[j].name for j in evs}
        best_tid, best_ops, best_shared = None, [], 0
        for tid, ops in et_threads.items():
            free = [i for i in ops if event_of_op[i] < 0]
            shared = sum(1 for i in free if et.names[i] in names)
            if shared > best_shared:
                best_tid, best_ops, best_shared = tid, free, shared
        if best_tid is None:
            continue
        for x, y in align_names(et, kineto, best_ops, evs):
            event_of_op[best_ops[x]] = evs[y]


def drop_links_outside_parent(et: ExecutionTrace, kineto: KinetoTrace, event_of_op: list[int]) -> int:
    """Unlink ops whose event does not lie inside the event of their nearest linked ET ancestor.

    Names alone cannot tell which of two same-name neighbours a missing event was; the call
    structure can: a link that puts a child outside its parent's interval is wrong, and a missing
    link is better than a wrong one. Ancestors are visited first (ids are in start order). O(n).
    Returns how many links were dropped.
    """
    events = kineto.cpu_events
    parent_index = et.parent_index()
    anchor = [-1] * len(et)  # nearest linked ancestor's event, per node
    dropped = 0
    for i in sorted(range(len(et)), key=et.ids.__getitem__):
        p = parent_index[i]
        outer = -1
        if p >= 0:
            outer = event_of_op[p] if event_of_op[p] >= 0 else anchor[p]
        anchor[i] = outer
        e = event_of_op[i]
        if e < 0 or outer < 0:
            continue
        if not lies_within(events[e], events[outer]):
            event_of_op[i] = -1
            dropped += 1
    return dropped


# Pairs on each side of a difference that are re-examined with shapes.
SHAPE_CONTEXT = 16


def align_names(et: ExecutionTrace, kineto: KinetoTrace, ops: list[int], evs: list[int]) -> list[tuple[int, int]]:
    """Align ET ops ``ops`` with Kineto events ``evs`` (both in start order).

    Names first: where the two sequences agree the pairs are certain. Around each difference
    (``SHAPE_CONTEXT`` pairs either side), when Kineto recorded input shapes, the stretch is aligned
    again on (name, input tensor shapes), which tells same-name neighbours apart, and what that
    leaves is aligned on names alone (shapes recorded differently on the two sides must not cost
    links). Runs of same-token neighbours whose lengths differ are left out: a missing link beats a
    wrong one. Shapes are decoded only inside those stretches.
    """
    events = kineto.cpu_events
    names_a = [et.names[i] for i in ops]
    names_b = [events[j].name for j in evs]
    by_name = align_both_ways(names_a, names_b)
    if not _has_shapes(events, evs):
        return drop_ambiguous_runs(names_a, names_b, by_name)
    pairs: list[tuple[int, int]] = []
    for lo, hi, certain in _difference_zones(by_name, len(ops), len(evs)):
        if certain:
            pairs.extend(by_name[lo:hi])
            continue
        a_lo = by_name[lo - 1][0] + 1 if lo > 0 else 0
        b_lo = by_name[lo - 1][1] + 1 if lo > 0 else 0
        a_hi = by_name[hi][0] if hi < len(by_name) else len(ops)
        b_hi = by_name[hi][1] if hi < len(by_name) else len(evs)
        zone = _align_with_shapes(et, events, ops[a_lo:a_hi], evs[b_lo:b_hi],
                                  names_a[a_lo:a_hi], names_b[b_lo:b_hi])
        pairs.extend((a_lo + x, b_lo + y) for x, y in zone)
    return pairs


def _difference_zones(pairs: list[tuple[int, int]], n: int, m: int):
    """Cut ``pairs`` into stretches: (lo, hi, certain). A stretch is uncertain when it lies within
    ``SHAPE_CONTEXT`` pairs of a place where either sequence skips an item."""
    marks = []
    prev_i = prev_j = -1
    for k, (i, j) in enumerate(pairs + [(n, m)]):
        if i - prev_i > 1 or j - prev_j > 1:
            marks.append(k)
        prev_i, prev_j = i, j
    zones = []
    for k in marks:
        lo, hi = max(0, k - SHAPE_CONTEXT), min(len(pairs), k + SHAPE_CONTEXT)
        if zones and lo <= zones[-1][1]:
            zones[-1][1] = max(zones[-1][1], hi)
        else:
            zones.append([lo, hi])
    out, start = [], 0
    for lo, hi in zones:
        if lo > start:
            out.append((start, lo, True))
        out.append((lo, hi, False))
        start = hi
    if start < len(pairs) or not out:
        out.append((start, len(pairs), True))
    return out


def _align_with_shapes(et, events, ops, evs, names_a, names_b) -> list[tuple[int, int]]:
    keys_a = [(names_a[x], shape_key(et.input_shapes(i))) for x, i in enumerate(ops)]
    keys_b = [(names_b[y], shape_key(_decode(events[j].args.input_dims))) for y, j in enumerate(evs)]
    pairs = drop_ambiguous_runs(keys_a, keys_b, align_both_ways(keys_a, keys_b))
    for a_lo, a_hi, b_lo, b_hi in list(gaps_between(pairs, len(ops), len(evs))):
        gap_a, gap_b = names_a[a_lo:a_hi], names_b[b_lo:b_hi]
        gap = drop_ambiguous_runs(gap_a, gap_b, align_both_ways(gap_a, gap_b))
        pairs.extend((a_lo + x, b_lo + y) for x, y in gap)
    pairs.sort()
    return pairs


def _has_shapes(events, evs: list[int]) -> bool:
    """True when most of these Kineto events carry ``Input Dims`` (recorded with record_shapes)."""
    sample = evs[:: max(1, len(evs) // 200)]
    with_dims = sum(1 for j in sample if bytes(events[j].args.input_dims) != b"null")
    return with_dims >= 0.5 * len(sample)


def _decode(raw: msgspec.Raw):
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def shape_key(shapes) -> tuple | None:
    """The tensor shapes among an op's inputs (lists of ints), as a hashable key; None if unknown."""
    if not isinstance(shapes, list):
        return None
    return tuple(tuple(shape) for shape in shapes
                 if type(shape) is list and shape and type(shape[0]) is int)

"""Method 2: exact match by execution order, per thread (``--exact-match``).

Per paired thread, ET ops in start order (by id) and Kineto events in start order are aligned as
name sequences (``align.align_sequences``): equal names only, never crossing, recovering shifts
and local insertions/deletions. Cost: near-linear in the number of events.
"""

from __future__ import annotations

from .align import align_sequences
from .et_reader import ExecutionTrace
from .intervals import group_by_thread
from .kineto_reader import KinetoTrace
from .match import OpMatch, pair_threads


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
    events = kineto.cpu_events
    event_of_op = [-1] * len(et)
    for pair in pairs:
        ops = et_threads[pair.et_tid]
        evs = k_threads[pair.kineto_thread]
        aligned = align_sequences([et.names[i] for i in ops], [events[j].name for j in evs])
        for a, b in aligned:
            event_of_op[ops[a]] = evs[b]
        pair.linked = len(aligned)
    _align_leftover_threads(et, kineto, et_threads, k_threads, pairs, event_of_op)
    match = OpMatch("exact", event_of_op, pairs, unpaired)
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
        for a, b in align_sequences([et.names[i] for i in best_ops], [events[j].name for j in evs]):
            event_of_op[best_ops[a]] = evs[b]

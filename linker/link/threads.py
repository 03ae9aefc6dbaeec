"""What every matching method produces, and the thread pairing that order/structure methods share."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from linker.read.et import ExecutionTrace
from linker.link.intervals import ThreadKey
from linker.read.kineto import KinetoTrace


@dataclass
class ThreadPair:
    """An ET thread number paired with a Kineto (pid, tid), and how well their ops agree."""

    et_tid: int
    kineto_thread: ThreadKey
    et_ops: int
    kineto_events: int
    shared_names: int  # size of the name-multiset intersection
    linked: int = 0


@dataclass
class OpMatch:
    """ET op -> Kineto CPU event, as one method found it.

    ``event_of_op[i]`` is the index into ``kineto.cpu_events`` of ET node ``i``'s event, or -1.
    ``threads`` lists the thread pairs used (empty for rf_id joins); ``unpaired_et_threads`` the
    ET threads with no Kineto counterpart. ``notes`` explain choices for the report.
    """

    method: str
    event_of_op: list[int]
    threads: list[ThreadPair] = field(default_factory=list)
    unpaired_et_threads: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    @property
    def linked(self) -> int:
        return sum(1 for e in self.event_of_op if e >= 0)


# A thread pair needs at least this share of the smaller side's ops in common.
MIN_THREAD_OVERLAP = 0.2


def pair_threads(
    et_threads: dict[int, list[int]],
    kineto_threads: dict[ThreadKey, list[int]],
    et: ExecutionTrace,
    kineto: KinetoTrace,
) -> tuple[list[ThreadPair], list[int]]:
    """Pair ET threads with Kineto threads by content (ET thread numbers are not OS tids).

    Score = size of the intersection of the two name multisets; pairs are taken greedily from the
    highest score down, each thread used once, and kept only when the overlap is at least
    ``MIN_THREAD_OVERLAP`` of the smaller thread. Cost O(T_et · T_k · distinct names).
    Returns the pairs and the ET thread numbers left unpaired.
    """
    events = kineto.cpu_events
    et_counts = {t: Counter(et.names[i] for i in ops) for t, ops in et_threads.items()}
    k_counts = {k: Counter(events[i].name for i in idx) for k, idx in kineto_threads.items()}
    candidates = []
    for t, ec in et_counts.items():
        for k, kc in k_counts.items():
            small, large = (ec, kc) if len(ec) < len(kc) else (kc, ec)
            shared = sum(min(n, large[name]) for name, n in small.items())
            smaller = min(len(et_threads[t]), len(kineto_threads[k]))
            if shared and shared >= MIN_THREAD_OVERLAP * smaller:
                candidates.append((shared, -t, str(k), t, k))
    candidates.sort(reverse=True)
    pairs, used_et, used_k = [], set(), set()
    for shared, _, _, t, k in candidates:
        if t in used_et or k in used_k:
            continue
        used_et.add(t)
        used_k.add(k)
        pairs.append(ThreadPair(t, k, len(et_threads[t]), len(kineto_threads[k]), shared))
    pairs.sort(key=lambda p: p.et_tid)
    return pairs, sorted(t for t in et_threads if t not in used_et)

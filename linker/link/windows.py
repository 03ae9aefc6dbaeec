"""Which stretch of the Kineto timeline the ET covers (iteration windows, docs/linking.md).

A Kineto export may hold many iterations while the ET holds one (``param_linear``: 40 vs 1). Before
matching by order or structure, the Kineto CPU events are cut to one consistent window chosen by
content. Candidate segments come from, in order of preference:

1. ``--annotation NAME``: a segment ends when an event whose name contains NAME ends;
2. ``ProfilerStep#N`` events: each step is a segment (when the ET holds steps of the same names,
   exactly those are chosen);
3. automatically: on the Kineto thread that matches the ET's main thread, the top-level events are
   cut before each occurrence of the iteration's first op, located through the first top-level
   name that occurs once per iteration in the ET.

A window is the run of consecutive segments whose size best fits the ET; among windows the one whose
name multiset agrees best with the ET's ops wins. Cost: O(n log n) over the Kineto CPU events.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from statistics import median

from linker.model.errors import OptionError
from linker.read.et import ExecutionTrace
from linker.link.intervals import group_by_thread, nesting_parents
from linker.read.kineto import KinetoTrace

# Kineto holding more than this many times the ET's op count means "several iterations".
WINDOW_RATIO = 1.5


@dataclass
class Segment:
    start: float
    end: float
    label: str


@dataclass
class Window:
    """The chosen stretch ``[start, end)`` of the Kineto timeline and why it was chosen."""

    start: float
    end: float
    label: str
    source: str  # "annotation", "profiler_step", "auto", "user"
    index: int  # index of its first segment among ``candidates``
    segments: int  # how many consecutive segments it spans
    candidates: int  # how many segments were found
    score: float  # name-multiset agreement with the ET, 0..1
    scores: list[float] = field(default_factory=list)

    def contains(self, ts: float) -> bool:
        return self.start <= ts < self.end


def _overlap(a: Counter, b: Counter) -> int:
    if len(a) > len(b):
        a, b = b, a
    return sum(min(count, b[name]) for name, count in a.items())


def annotation_segments(kineto: KinetoTrace, annotation: str) -> list[Segment]:
    """Segments ending where an event whose name contains ``annotation`` ends."""
    ends = sorted({e.end for e in kineto.cpu_events if annotation in e.name})
    segments = []
    start = min(e.ts for e in kineto.cpu_events)
    for end in ends:
        if end > start:
            segments.append(Segment(start, end, f"segment ending with '{annotation}'"))
            start = end
    return segments


def step_segments(kineto: KinetoTrace) -> list[Segment]:
    steps = [e for e in kineto.cpu_events if e.name.startswith("ProfilerStep#")]
    steps.sort(key=lambda e: e.ts)
    return [Segment(e.ts, e.end, e.name) for e in steps]


def auto_segments(et: ExecutionTrace, kineto: KinetoTrace) -> list[Segment]:
    """Segments starting at each repetition of the ET main thread's top-level sequence."""
    threads = et.threads()
    if not threads:
        return []
    main_tid = min(threads, key=lambda t: et.ids[threads[t][0]])
    main_ops = threads[main_tid]
    root_ids = {et.ids[i] for i in et.root_positions()}
    et_top = [et.names[i] for i in main_ops if et.parent[i] in root_ids]
    if not et_top:
        return []
    et_top_counts = Counter(et_top)
    kthreads = group_by_thread(kineto.cpu_events)
    events = kineto.cpu_events
    skip = [e.name.startswith("ProfilerStep#") for e in events]
    parents = nesting_parents(events, skip)
    best_key, k_top = None, []
    for key, indices in kthreads.items():
        top = [i for i in indices if parents[i] < 0 and not skip[i]]
        score = _overlap(et_top_counts, Counter(events[i].name for i in top))
        if best_key is None or score > best_key:
            best_key, k_top = score, top
    k_counts = Counter(events[i].name for i in k_top)
    for p, name in enumerate(et_top):
        if et_top_counts[name] == 1 and k_counts[name] >= 2:
            break
    else:
        return []
    starts = []
    for q, i in enumerate(k_top):
        if events[i].name == name and q - p >= 0:
            starts.append(events[k_top[q - p]].ts)
    last_end = max(e.end for e in events)
    segments = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else last_end + 1.0
        segments.append(Segment(start, end, f"iteration {k} (cut at '{et_top[0]}', located by '{name}')"))
    return segments


def choose_window(
    et: ExecutionTrace, kineto: KinetoTrace, annotation: str | None = None, pick: int | None = None
) -> Window | None:
    """The Kineto window to link the ET against, or None when the whole trace is the window.

    ``pick`` selects a window by index (the user's choice) instead of by content.
    """
    op_indices = et.op_indices()
    if annotation is None and pick is None and len(kineto.cpu_events) <= WINDOW_RATIO * len(op_indices):
        return None
    segments, source = _iteration_segments(et, kineto, annotation)
    if len(segments) < 2 and pick is None:
        return None
    if not segments:
        raise OptionError(f"--window {pick}: {kineto.path} has no iteration windows to choose from "
                          "(no ProfilerStep events, no repeated iteration)")
    segments.sort(key=lambda s: s.start)
    per_segment = _names_per_segment(kineto.cpu_events, segments)
    et_names = Counter(et.names[i] for i in op_indices)
    if source == "profiler_step" and pick is None:
        named = _window_of_named_steps(et_names, len(op_indices), segments, per_segment)
        if named is not None:
            return named
    return _best_window(et_names, len(op_indices), segments, per_segment, source, pick, kineto.path)


def _iteration_segments(et: ExecutionTrace, kineto: KinetoTrace, annotation: str | None) -> tuple[list[Segment], str]:
    """The trace's iterations and how they were found: cut at the ``annotation`` (an OptionError
    when it matches nothing), else the profiler's steps, else repeats of the ET's top ops."""
    if annotation is not None:
        segments = annotation_segments(kineto, annotation)
        if not segments:
            raise OptionError(f"--annotation {annotation!r} matches no Kineto CPU event of {kineto.path}")
        return segments, "annotation"
    segments = step_segments(kineto)
    if len(segments) >= 2:
        return segments, "profiler_step"
    return auto_segments(et, kineto), "auto"


def _names_per_segment(events, segments: list[Segment]) -> list[Counter]:
    """Per segment (sorted by start), how many CPU events of each name start in it. O(e log s)."""
    starts = [s.start for s in segments]
    per_segment = [Counter() for _ in segments]
    for e in events:
        k = bisect_right(starts, e.ts) - 1
        if k >= 0 and e.ts < segments[k].end:
            per_segment[k][e.name] += 1
    return per_segment


def _window_score(et_names: Counter, ops: int, per_segment: list[Counter], first: int, last: int) -> float:
    """How well segments ``first`` to ``last`` hold the ET's ops: the names they share, over the
    larger of the two op counts."""
    window = Counter()
    for k in range(first, last + 1):
        window.update(per_segment[k])
    return _overlap(et_names, window) / max(ops, sum(window.values()), 1)


def _window_of_named_steps(et_names: Counter, ops: int, segments: list[Segment],
                           per_segment: list[Counter]) -> Window | None:
    """The profiler steps the ET itself names (an op named as a step's label: the ET holds these
    very steps), first to last; None when it names none."""
    named = [k for k, s in enumerate(segments) if s.label in et_names]
    if not named:
        return None
    first, last = named[0], named[-1]
    score = _window_score(et_names, ops, per_segment, first, last)
    return Window(segments[first].start, segments[last].end, ", ".join(segments[k].label for k in named),
                  "profiler_step", first, last - first + 1, len(segments), score, [score])


def _best_window(et_names: Counter, ops: int, segments: list[Segment], per_segment: list[Counter], source: str,
                 pick: int | None, path) -> Window:
    """The run of as many segments as the ET has ops (by the median segment's size) that best
    holds the ET's ops (the earliest of equals), or the run ``pick`` (an OptionError when there is
    no such run)."""
    sizes = [sum(c.values()) for c in per_segment]
    typical = median(s for s in sizes) if sizes else 0
    span = max(1, min(len(segments), round(ops / typical))) if typical else 1
    scores = [_window_score(et_names, ops, per_segment, first, first + span - 1)
              for first in range(len(segments) - span + 1)]
    if pick is not None:
        if not 0 <= pick < len(scores):
            raise OptionError(f"--window {pick} does not exist: {path} has {len(scores)} windows "
                              f"(0 to {len(scores) - 1})")
        best, source = pick, "user"
    else:
        best = max(range(len(scores)), key=lambda k: (scores[k], -k))
    last = best + span - 1
    label = segments[best].label if span == 1 else f"{segments[best].label} .. {segments[last].label}"
    return Window(segments[best].start, segments[last].end, label, source, best, span,
                  len(segments), scores[best], scores)

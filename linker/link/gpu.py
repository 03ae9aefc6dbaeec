"""Attach every GPU op (kernel, memcpy, memset) to the CPU event that launched it.

For each GPU op: its launch is the runtime/driver event with the same ``correlation`` (a CUDA/HIP
graph launch carries many GPU ops on one correlation; each of them finds the one launch). Failing
that, a GPU op whose correlation is below the smallest launch correlation in the file was launched
before profiling started (no launch event was recorded): counted as ``before_trace``. Otherwise
the launch is the one with the same ``External id`` (or, in traces that give GPU ops their
enclosing op's External id, that CPU op directly); failing that, the host end of the ``ac2g`` flow
with the GPU op's correlation (or External id) as flow id.

The launching event is the innermost Kineto CPU event (``cpu_op`` / ``user_annotation``) on the
launch's thread covering the launch time (one sweep per thread, ``intervals``); when that event
has no node in the host graph, the nearest enclosing event that has one is used. A launch that no
CPU event covers is looked up among the ``python_function`` events (sorted only then, only on the
threads concerned): the innermost one covering it is recorded, and a host graph that has a node for
it (the Kineto-only graph adds one, ``link.kineto_only``) gets the GPU op under it.

``Accounting`` turns the outcome into disjoint reasons, in words, that add up to the GPU event
count of the file. Cost: O((n + g) log(n + g)) for n CPU events and g GPU ops.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

from linker.model.columns import unique_positions
from linker.link.intervals import CoverIndex, TimePoint, cover_index, innermost_covering
from linker.read.kineto import GRAPH_LAUNCH_NAMES, LAUNCH_NAMES, KinetoEvent, KinetoTrace

# How a GPU op found its launch.
VIA_CORRELATION = "correlation"
VIA_EXTERNAL_ID = "external_id"
VIA_FLOW = "flow"
# Why a GPU op could not be attributed.
BEFORE_TRACE = "before_trace"
NO_LAUNCH = "no_launch"
LAUNCH_OUTSIDE_OPS = "launch_outside_cpu_ops"
LAUNCH_IN_PYTHON_ONLY = "launch_in_python_function_only"
LAUNCH_OUTSIDE_LINKED_OPS = "launch_outside_linked_ops"
OUTSIDE_WINDOW = "outside_window"
# Where an attributed GPU op was put (by the category of the CPU event it hangs under).
UNDER_OP = "under_op"
UNDER_GRAPH_OP = "under_graph_launch_op"
UNDER_ANNOTATION = "under_annotation"
UNDER_PYTHON_FUNCTION = "under_python_function"
UNDER_PROCESS_ROOT = "before_trace_under_process_root"

# The accounting reasons in report order, with the words the report uses.
REASON_WORDS = {
    UNDER_OP: "attached under the CPU op that launched it",
    UNDER_GRAPH_OP: "attached under the CPU op that launched its CUDA/HIP graph",
    UNDER_ANNOTATION: "attached under the user annotation around its launch",
    UNDER_PYTHON_FUNCTION: "attached under the Python function around its launch "
                           "(launched outside any op or annotation)",
    UNDER_PROCESS_ROOT: "launched before the trace started (no launch event; its correlation is below "
                        "the first recorded launch): written under the process root, in stream order",
    BEFORE_TRACE: "launched before the trace started (no launch event; its correlation is below "
                  "the first recorded launch)",
    NO_LAUNCH: "no launch event in the trace",
    LAUNCH_OUTSIDE_OPS: "launch outside any op, annotation or Python function",
    LAUNCH_IN_PYTHON_ONLY: "launch inside a Python function only, which the host graph has no node for",
    LAUNCH_OUTSIDE_LINKED_OPS: "launch inside ops the host graph has no node for",
    OUTSIDE_WINDOW: "launched outside the linked iteration window",
}


@dataclass(slots=True)
class GpuLink:
    """One GPU op and what it was attached to (``et_index`` -1 when not attributed).

    ``cpu_event``: innermost covering Kineto CPU event (-1 if none); ``python_event``: when no
    CPU event covers the launch, the innermost covering ``python_function`` event (the event
    itself), else None. (Slots: one per GPU op, millions on large traces.)
    """

    event: KinetoEvent
    launch: KinetoEvent | None
    via: str | None
    cpu_event: int
    et_index: int
    problem: str | None = None
    python_event: KinetoEvent | None = None
    placement: str | None = None  # one of the UNDER_* reasons when attributed

    @property
    def before_trace(self) -> bool:
        """Launched before the trace started and adopted under the process root (no launch edge)."""
        return self.placement == UNDER_PROCESS_ROOT


@dataclass
class GpuAttribution:
    links: list[GpuLink]
    via_counts: Counter = field(default_factory=Counter)
    problem_counts: Counter = field(default_factory=Counter)
    placement_counts: Counter = field(default_factory=Counter)
    unknown_launch_names: Counter = field(default_factory=Counter)
    launch_names: Counter = field(default_factory=Counter)  # GPU ops per launch call name
    outside_window: int = 0  # GPU ops launched outside the linked window: left out
    graph_launches: int = 0  # distinct graph-launch calls that carried GPU ops
    graph_gpu_ops: int = 0  # GPU ops carried by them
    # The cover index of the CPU events the attribution built (None without GPU ops): the plan's
    # busy times look up the blocking calls in it.
    cover: CoverIndex | None = None

    @property
    def attributed(self) -> int:
        return sum(1 for link in self.links if link.et_index >= 0)

    def accounting(self) -> dict[str, int]:
        """Reason -> GPU ops, disjoint, every GPU op of the file once (zero counts left out)."""
        counts = Counter(self.placement_counts) + Counter(self.problem_counts)
        counts[OUTSIDE_WINDOW] += self.outside_window
        return {reason: counts[reason] for reason in REASON_WORDS if counts[reason]}


def adopt_before_trace(result: GpuAttribution, root_index: int) -> int:
    """Put every GPU op launched before the trace started under the host graph's process root
    (``root_index``), so the replay runs it on its stream ahead of the traced work there, as it ran.
    Such an op has no launch: its stream order (issue time = its own start) is all that orders it.
    Returns the count adopted. O(g)."""
    if root_index < 0:
        return 0
    adopted = 0
    for link in result.links:
        if link.problem == BEFORE_TRACE:
            link.problem, link.et_index, link.placement = None, root_index, UNDER_PROCESS_ROOT
            adopted += 1
    if adopted:
        result.problem_counts[BEFORE_TRACE] -= adopted
        if not result.problem_counts[BEFORE_TRACE]:
            del result.problem_counts[BEFORE_TRACE]
        result.placement_counts[UNDER_PROCESS_ROOT] += adopted
    return adopted


def _unique_index(events, key) -> dict:
    """key(event) -> event, for the keys other than None that exactly one event has. O(n)."""
    return {value: events[p] for value, p in unique_positions([key(e) for e in events]).items()}


def _host_flow_end(kineto: KinetoTrace, flow_id, index: "_LaunchIndex") -> TimePoint | None:
    for end in kineto.flows.get(flow_id, ()):
        if (end.pid, end.tid) in index.host_threads:
            return TimePoint(end.pid, end.tid, end.ts)
    return None


class _LaunchIndex:
    """The lookups that lead from a GPU op to its launch, built once per trace: by correlation at
    once, O(r); those of the rarer ways (External id, flows) the first time a GPU op needs them,
    O(n) each (traces whose GPU ops all find their launch by correlation never build them)."""

    def __init__(self, kineto: KinetoTrace):
        self.kineto = kineto
        self.by_correlation = {e.args.correlation: e for e in kineto.runtime_events
                               if e.args.correlation is not None}
        numeric = [c for c in self.by_correlation if isinstance(c, int)]
        self.first_correlation = min(numeric) if numeric else None

    @cached_property
    def runtime_by_ext(self) -> dict:
        return _unique_index(self.kineto.runtime_events, lambda e: e.args.external_id)

    @cached_property
    def cpu_by_ext(self) -> dict:
        return unique_positions([e.args.external_id for e in self.kineto.cpu_events])

    @cached_property
    def host_threads(self) -> set:
        return {(e.pid, e.tid) for e in self.kineto.cpu_events}


def _find_launch(g: KinetoEvent, index: _LaunchIndex, kineto: KinetoTrace) -> tuple[GpuLink, TimePoint | None]:
    """The GPU op's launch (or direct CPU event) and the host point to look up; O(1) expected."""
    corr, ext = g.args.correlation, g.args.external_id
    link = GpuLink(g, None, None, -1, -1)
    launch = index.by_correlation.get(corr) if corr is not None else None
    if launch is not None:
        link.via, link.launch = VIA_CORRELATION, launch
        return link, TimePoint(launch.pid, launch.tid, launch.ts)
    if (isinstance(corr, int) and index.first_correlation is not None
            and corr < index.first_correlation):
        link.problem = BEFORE_TRACE
        return link, None
    if ext is not None and ext in index.runtime_by_ext:
        launch = index.runtime_by_ext[ext]
        link.via, link.launch = VIA_EXTERNAL_ID, launch
        return link, TimePoint(launch.pid, launch.tid, launch.ts)
    if ext is not None and ext in index.cpu_by_ext:
        link.via, link.cpu_event = VIA_EXTERNAL_ID, index.cpu_by_ext[ext]
        return link, None
    for flow_id in (corr, ext):
        if flow_id is not None:
            point = _host_flow_end(kineto, flow_id, index)
            if point is not None:
                link.via = VIA_FLOW
                return link, point
    return link, None


def innermost_python_functions(kineto: KinetoTrace, points: list[TimePoint]) -> list[KinetoEvent | None]:
    """For each point, the innermost ``python_function`` event on its thread covering it (or None).

    Only the python events of the points' threads are sorted: O(p log p + q log q)."""
    if not points or not kineto.python_events:
        return [None] * len(points)
    threads = {(p.pid, p.tid) for p in points}
    events = [e for e in kineto.python_events if (e.pid, e.tid) in threads]
    events.sort(key=lambda e: (str(e.pid), str(e.tid), e.ts, -e.dur))
    return [events[i] if i >= 0 else None for i in innermost_covering(events, points)]


def uncovered_launch_points(kineto: KinetoTrace) -> list[TimePoint]:
    """Host points of launches that no CPU event covers (one per launch call). O((n + g) log(n + g))."""
    index = _LaunchIndex(kineto)
    seen, points = set(), []
    for g in kineto.gpu_events:
        link, point = _find_launch(g, index, kineto)
        if point is not None and point not in seen:
            seen.add(point)
            points.append(point)
    events = kineto.cpu_events
    covering = innermost_covering(events, points, cover_index(events))
    return [p for p, e in zip(points, covering) if e < 0]


def attribute_gpu_ops(
    kineto: KinetoTrace, op_of_event: list[int], nesting, window=None
) -> GpuAttribution:
    """Attribute every GPU op of ``kineto``. ``op_of_event[e]``: host-graph index linked to CPU
    event ``e`` (or -1); ``nesting``: the CPU events' ``durations.CpuNesting`` (parents, ends). With a
    ``window`` (an object with ``contains(ts)``), GPU ops launched outside it (or, without a
    launch, running outside it) are left out and only counted."""
    result = GpuAttribution([])
    if not kineto.gpu_events:  # a CPU-only trace: nothing to attribute, no index to build
        return result
    index = _LaunchIndex(kineto)
    points: list[TimePoint] = []
    point_of_link: list[int] = []
    graph_correlations = set()
    for g in kineto.gpu_events:
        link, point = _find_launch(g, index, kineto)
        launch = link.launch
        if launch is not None and launch.name not in LAUNCH_NAMES:
            result.unknown_launch_names[launch.name] += 1
        if window is not None and not window.contains(point.ts if point is not None else g.ts):
            result.outside_window += 1
            continue
        if launch is not None:
            result.launch_names[launch.name] += 1
            if launch.name in GRAPH_LAUNCH_NAMES:
                graph_correlations.add(launch.args.correlation)
                result.graph_gpu_ops += 1
        if point is not None:
            points.append(point)
            point_of_link.append(len(result.links))
        result.links.append(link)
    result.graph_launches = len(graph_correlations)

    parents = nesting.parents
    result.cover = cover_index(kineto.cpu_events, nesting.end)
    for q, e in zip(point_of_link, innermost_covering(kineto.cpu_events, points, result.cover)):
        result.links[q].cpu_event = e
    _look_up_python_functions(kineto, result.links, points, point_of_link)
    for link in result.links:
        _settle(link, op_of_event, parents, kineto.cpu_events)
        if link.problem:
            result.problem_counts[link.problem] += 1
        else:
            result.via_counts[link.via] += 1
            result.placement_counts[link.placement] += 1
    return result


def _look_up_python_functions(kineto, links, points, point_of_link) -> None:
    """For launches that no CPU event covers, record the innermost covering python function."""
    uncovered = [q for q in range(len(points)) if links[point_of_link[q]].cpu_event < 0]
    if not uncovered:
        return
    found = innermost_python_functions(kineto, [points[q] for q in uncovered])
    for q, event in zip(uncovered, found):
        links[point_of_link[q]].python_event = event


def _settle(link: GpuLink, op_of_event, parents, cpu_events) -> None:
    """Set ``et_index`` and ``placement``, or ``problem``, from the CPU event found."""
    if link.problem:
        return
    if link.via is None:
        link.problem = NO_LAUNCH
        return
    if link.cpu_event < 0:
        link.problem = LAUNCH_IN_PYTHON_ONLY if link.python_event is not None else LAUNCH_OUTSIDE_OPS
        return
    e = link.cpu_event
    while e >= 0 and op_of_event[e] < 0:
        e = parents[e]
    if e < 0:
        link.problem = LAUNCH_OUTSIDE_LINKED_OPS
        return
    link.et_index = op_of_event[e]
    cat = cpu_events[e].cat
    if cat == "user_annotation":
        link.placement = UNDER_ANNOTATION
    elif cat == "python_function":
        link.placement = UNDER_PYTHON_FUNCTION
    elif link.launch is not None and link.launch.name in GRAPH_LAUNCH_NAMES:
        link.placement = UNDER_GRAPH_OP
    else:
        link.placement = UNDER_OP

"""Attach every GPU op (kernel, memcpy, memset) to the CPU op that launched it.

For each GPU op: its launch is the runtime/driver event with the same ``correlation``; failing
that, the one with the same ``External id`` (or, in traces that give GPU ops their enclosing op's
External id, that CPU op directly); failing that, the host end of the ``ac2g`` flow with the GPU
op's correlation (or External id) as flow id. The launching op is the innermost Kineto CPU event on
the launch's thread covering the launch time (one sweep per thread, ``intervals``); when that event
has no ET node, the nearest enclosing event that has one is used. Cost: O((n + g) log(n + g)).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .intervals import TimePoint, innermost_covering
from .kineto_reader import LAUNCH_NAMES, KinetoEvent, KinetoTrace

# How a GPU op found its launch.
VIA_CORRELATION = "correlation"
VIA_EXTERNAL_ID = "external_id"
VIA_FLOW = "flow"
# Why a GPU op could not be attributed.
NO_LAUNCH = "no_launch"
LAUNCH_OUTSIDE_OPS = "launch_outside_cpu_ops"
LAUNCH_OUTSIDE_LINKED_OPS = "launch_outside_linked_ops"


@dataclass
class GpuLink:
    """One GPU op and what it was attached to (``et_index`` -1 when not attributed)."""

    event: KinetoEvent
    launch: KinetoEvent | None
    via: str | None
    cpu_event: int  # innermost covering Kineto CPU event, -1 if none
    et_index: int
    problem: str | None = None


@dataclass
class GpuAttribution:
    links: list[GpuLink]
    via_counts: Counter = field(default_factory=Counter)
    problem_counts: Counter = field(default_factory=Counter)
    unknown_launch_names: Counter = field(default_factory=Counter)
    outside_window: int = 0  # GPU ops launched outside the linked window: left out

    @property
    def attributed(self) -> int:
        return sum(1 for link in self.links if link.et_index >= 0)


def _unique_index(events, key) -> dict:
    counts = Counter(key(e) for e in events)
    return {key(e): e for e in events if key(e) is not None and counts[key(e)] == 1}


def _host_flow_end(kineto: KinetoTrace, flow_id, host_threads: set) -> TimePoint | None:
    for end in kineto.flows.get(flow_id, ()):
        if (end.pid, end.tid) in host_threads:
            return TimePoint(end.pid, end.tid, end.ts)
    return None


def attribute_gpu_ops(
    kineto: KinetoTrace, op_of_event: list[int], parents: list[int], window=None
) -> GpuAttribution:
    """Attribute every GPU op of ``kineto``. ``op_of_event[e]``: ET index linked to CPU event ``e``
    (or -1); ``parents``: the Kineto nesting parents of the CPU events. With a ``window`` (an object
    with ``contains(ts)``), GPU ops launched outside it (or, without a launch, running outside it)
    are left out and only counted."""
    cpu = kineto.cpu_events
    by_correlation = {e.args.correlation: e for e in kineto.runtime_events if e.args.correlation is not None}
    runtime_by_ext = _unique_index(kineto.runtime_events, lambda e: e.args.external_id)
    cpu_by_ext = {}
    ext_counts = Counter(e.args.external_id for e in cpu)
    for i, e in enumerate(cpu):
        if e.args.external_id is not None and ext_counts[e.args.external_id] == 1:
            cpu_by_ext[e.args.external_id] = i
    host_threads = {(e.pid, e.tid) for e in cpu}

    result = GpuAttribution([])
    points: list[TimePoint] = []
    point_of_link: list[int] = []
    for g in kineto.gpu_events:
        corr, ext = g.args.correlation, g.args.external_id
        link = GpuLink(g, None, None, -1, -1)
        launch = by_correlation.get(corr) if corr is not None else None
        point = None
        if launch is not None:
            link.via = VIA_CORRELATION
        elif ext is not None and ext in runtime_by_ext:
            launch, link.via = runtime_by_ext[ext], VIA_EXTERNAL_ID
        elif ext is not None and ext in cpu_by_ext:
            link.via, link.cpu_event = VIA_EXTERNAL_ID, cpu_by_ext[ext]
        else:
            for flow_id in (corr, ext):
                if flow_id is not None:
                    point = _host_flow_end(kineto, flow_id, host_threads)
                    if point is not None:
                        link.via = VIA_FLOW
                        break
        link.launch = launch
        if launch is not None:
            point = TimePoint(launch.pid, launch.tid, launch.ts)
            if launch.name not in LAUNCH_NAMES:
                result.unknown_launch_names[launch.name] += 1
        if window is not None and not window.contains(point.ts if point is not None else g.ts):
            result.outside_window += 1
            continue
        if point is not None:
            points.append(point)
            point_of_link.append(len(result.links))
        result.links.append(link)

    for q, e in zip(point_of_link, innermost_covering(cpu, points)):
        result.links[q].cpu_event = e

    for link in result.links:
        if link.via is None:
            link.problem = NO_LAUNCH
        elif link.cpu_event < 0:
            link.problem = LAUNCH_OUTSIDE_OPS
        else:
            e = link.cpu_event
            while e >= 0 and op_of_event[e] < 0:
                e = parents[e]
            if e < 0:
                link.problem = LAUNCH_OUTSIDE_LINKED_OPS
            else:
                link.et_index = op_of_event[e]
        if link.problem:
            result.problem_counts[link.problem] += 1
        else:
            result.via_counts[link.via] += 1
    return result

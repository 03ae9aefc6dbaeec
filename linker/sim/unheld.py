"""GPU waits the graph does not hold: measured time a replay cannot reproduce from the file alone.

A replay starts a node as soon as its dependencies have finished and its unit is free. On the
measured timeline a GPU or communication op sometimes started well after everything the graph makes
it wait for had finished: it waited for something the trace did not record (work queued before
profiling started, another process on the device, an event recorded by a call outside the trace,
peers of a collective launched before the trace). The replay starts such an op at once, so the
simulated step comes out short by up to that wait.

For each timed GPU / communication node u: ``ready`` = the latest end among its timed
dependencies (its launching CPU op, stream predecessor, waited-on ops...; an untimed root such as
the process root counts as the rank's measured start; an op with an untimed dependency that has
dependencies of its own, such as a collective's meeting node in an ASTRA-sim workload copy, has no
known ``ready`` and is left out), each ending as the replay ends it: its measured
start plus its duration in the file (a CPU op's busy time, not its measured span: an annotation
that spans the whole trace releases its kernels when its own node ends, in the replay as in this
estimate), and ``wait`` = max(0, start(u) - ready). Using the CPU launcher's node *end* makes
``wait`` a lower bound: the launch call lies somewhere inside that op. A CPU op's end is read on
the GPU's clock: plus the local skew the graph shows
(``graph_clock_skew``, the ``plan.clocks`` estimate from launch gaps), so a GPU clock ahead of the
host's is not taken for a wait. CPU collectives (gloo, MPI, UCC, on a CPU thread) are left out:
the replay starts them as late after their dependencies as their worker picked them up.
A stream's waits never overlap (its predecessor is a dependency), so a stream's total is time that
stream sat idle with its next op's dependencies met. ``unheld_gpu_wait`` reports, per rank, the
largest per-stream total (a lower bound of what the replay drops), the streams, and the largest
single waits; ``unheld_note`` words it for a rank whose replay came out short. Cost: O(n + E) over
one graph.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

from linker.model.units import format_us
from linker.plan.clocks import NEIGHBOURS, ClockSkew
from linker.sim.graph import COMM, CPU, GPU, SimGraph, lane_label

LARGEST = 3


@dataclass
class StreamWait:
    lane: str
    us: float
    ops: int  # ops that waited


@dataclass
class UnheldWait:
    """One rank's GPU waits the graph does not explain (µs)."""

    rank: int
    us: float  # the largest per-stream total
    streams: list[StreamWait] = field(default_factory=list)  # streams with waits, largest first
    largest: list[dict] = field(default_factory=list)  # {id, name, lane, us, cause}, largest first


def graph_clock_skew(graph: SimGraph) -> ClockSkew:
    """The CPU/GPU clock skew the graph shows (``plan.clocks``): each GPU op's start minus its
    launching CPU op's start (its CPU dependency; the launch call lies inside that op, so these gaps
    bound the skew from above less tightly than the call's own), for the ops whose GPU
    dependencies had all ended by then (the others' gaps hold queueing as well); none (equal
    clocks) when fewer than ``NEIGHBOURS`` such ops exist. O(n + E)."""
    launches = []
    start, dur, kind, lane = graph.start, graph.measured_dur, graph.kind, graph.lane
    for u in range(len(graph)):
        if kind[u] != GPU or math.isnan(start[u]) or graph.lane_keys[lane[u]][0] == "cpu":
            continue
        deps = [d for d in graph.deps_of(u) if not math.isnan(start[d])]
        launcher = [d for d in deps if kind[d] not in (GPU, COMM)]
        if not launcher:
            continue
        s = max(start[d] for d in launcher)
        if any(start[d] + dur[d] > s for d in deps if kind[d] in (GPU, COMM)):
            continue  # queued behind GPU work: its gap holds the queueing too
        launches.append((s, start[u] - s))
    if len(launches) < NEIGHBOURS:  # too few to tell a skew from a wait
        return ClockSkew()
    launches.sort()
    return ClockSkew([ts for ts, _ in launches], [gap for _, gap in launches])


# Why a GPU op waited, as far as the graph tells (``gpu_waits``): it has no timed host op among its
# dependencies (launched before the trace began, or by a call the trace did not record); a kernel of
# another stream of its device ran when it became ready and it started as that kernel was ending
# (``_other_stream_holder``): the device was busy with it, or the op depended on it through
# something the trace did not record; its stream had been told to wait for an event
# (an ``event_wait`` edge, ``plan.waits``) and the op still started after the op the graph ties that
# event to had ended: the event was recorded by work the trace does not show (another process's
# stream, work before the trace); or everything it depends on had finished and its stream sat idle
# all the same.
LAUNCHED_BEFORE_TRACE, UNEXPLAINED_GPU_IDLE = "launched_before_trace", "unexplained_gpu_idle"
UNTRACED_EVENT, OTHER_STREAM_KERNEL = "untraced_event", "other_stream_kernel"
# A kernel's last stretch, as a share of its time, in which an op that waited for the device may
# start: a kernel of many waves frees the device's SMs as its last blocks end, so the op starts
# before the kernel's end (up to 94 us before the end of a 6.4 ms kernel on an HTA trace), or just
# after it (``DEVICE_FREED_US``).
LAST_WAVE_SHARE, DEVICE_FREED_US = 0.05, 5.0
_EVENT_WAIT = "event_wait"  # the plan's cause for a stream's wait on an event (``plan.dependency_plan``)
# A host op that started after everything it depends on had finished in the replay's terms: the
# thread was held by something the graph does not hold (a blocking call that waited for GPU work
# outside the trace, another thread holding the interpreter).
UNEXPLAINED_HOST_WAIT = "unexplained_host_wait"
# A wait shorter than this is timing noise, not a wait: a ``.et`` holds whole µs, so a dependency's
# end (start and duration each rounded) and an op's start can disagree by up to 1.5 µs where there
# was no wait at all; replayed as waits, such crumbs add up along a chain (2-3% on CPU traces).
HOLD_MIN_US = 2.0
WAIT_CAUSES = (LAUNCHED_BEFORE_TRACE, OTHER_STREAM_KERNEL, UNTRACED_EVENT, UNEXPLAINED_GPU_IDLE, UNEXPLAINED_HOST_WAIT)


def gpu_waits(graph: SimGraph, min_us: float = HOLD_MIN_US, through_wait_nodes: bool = False
              ) -> list[tuple[int, float, str]]:
    """(node, wait µs, cause) of every timed GPU / communication op of ``graph`` that started at
    least ``min_us`` after everything it depends on had finished (the module's ``wait``), in node
    order; the cause is one of ``WAIT_CAUSES``. An op after a wait node of the file
    (``SimGraph.wait_nodes``) is left out (its wait is in the file), or, ``through_wait_nodes``,
    measured as if the wait node were not there (a replay that gives wait nodes no time). O(n + E)."""
    return [(u, wait, cause) for u, wait, cause, _ in _gpu_waits(graph, min_us, through_wait_nodes)]


def device_holds(graph: SimGraph) -> list[tuple[int, int]]:
    """(kernel, holder) for each wait of ``gpu_waits`` whose cause is ``OTHER_STREAM_KERNEL``: the
    kernel of another stream of its device that held the device until the kernel started
    (``_other_stream_holder``), in node order. ``sim.device_edges`` turns each into a dependency of
    the kernel on the part of its holder that ran until then. O(n + E + waits x streams x log
    kernels)."""
    return [(u, holder) for u, _, cause, holder in _gpu_waits(graph, HOLD_MIN_US, False)
            if cause == OTHER_STREAM_KERNEL]


def _gpu_waits(graph: SimGraph, min_us: float, through_wait_nodes: bool) -> list[tuple[int, float, str, int]]:
    """``gpu_waits``' rows, each with the kernel of another stream that held the device until it
    started (-1 unless the cause is ``OTHER_STREAM_KERNEL``)."""
    first, _ = graph.measured_span()
    if math.isnan(first):
        return []
    start, dur, kind = graph.start, graph.duration, graph.kind  # a dependency ends as the replay ends it
    skew = graph_clock_skew(graph)
    kernels: dict | None = None  # made at the first wait: ``_kernels_by_stream``
    found = []
    for u in range(len(graph)):
        if kind[u] not in (GPU, COMM) or math.isnan(start[u]) or graph.lane_keys[graph.lane[u]][0] == "cpu":
            continue  # a CPU collective's pickup is replayed (``engine._cpu_pickups``)
        ready, launched, known, after_event = first, False, True, False
        for d in graph.deps_of(u):
            if d in graph.wait_nodes:  # its wait is in the file already
                if through_wait_nodes:
                    continue
                known = False
                break
            s = start[d]
            if not math.isnan(s):
                end = s + dur[d]
                if kind[d] not in (GPU, COMM):  # a host time: read on the GPU's clock
                    end += skew.at(s)
                    launched = True
                elif graph.edge_cause(u, d) == _EVENT_WAIT:
                    after_event = True
                ready = max(ready, end)
            elif len(graph.deps_of(d)):  # an untimed node after others: when it ended is not known
                known = False
                break
        if not known:
            continue
        wait = start[u] - ready
        if wait >= min_us:
            holder = -1
            if not launched:
                cause = LAUNCHED_BEFORE_TRACE
            else:
                kernels = _kernels_by_stream(graph) if kernels is None else kernels
                holder = _other_stream_holder(graph, kernels, u, ready)
                cause = (OTHER_STREAM_KERNEL if holder >= 0
                         else UNTRACED_EVENT if after_event else UNEXPLAINED_GPU_IDLE)
            found.append((u, wait, cause, holder))
    return found


def _is_kernel(graph: SimGraph, u: int) -> bool:
    """A timed op on a GPU stream that runs on the SMs: not a copy or a set (CUPTI's names
    "Memcpy ..." / "Memset ...", which copy engines run)."""
    return (graph.kind[u] in (GPU, COMM) and graph.lane_keys[graph.lane[u]][0] == "gpu"
            and not math.isnan(graph.start[u]) and not graph.names[u].startswith(("Memcpy", "Memset")))


def _kernels_by_stream(graph: SimGraph) -> dict[tuple, dict[object, tuple[list[float], list[int]]]]:
    """Per device, per stream: its kernels' starts in order and the kernels (a stream runs one at
    a time, so the one running at a time is the last that started before it). O(n log n)."""
    by_stream: dict[tuple, list[tuple[float, int]]] = {}
    for u in range(len(graph)):
        if _is_kernel(graph, u):
            _, device, stream = graph.lane_keys[graph.lane[u]]
            by_stream.setdefault((device, stream), []).append((graph.start[u], u))
    kernels: dict = {}
    for (device, stream), ops in by_stream.items():
        ops.sort()
        kernels.setdefault(device, {})[stream] = ([s for s, _ in ops], [u for _, u in ops])
    return kernels


def _other_stream_holder(graph: SimGraph, kernels: dict, u: int, ready: float) -> int:
    """The kernel of another stream of u's device that was running when kernel u became ready
    (``ready``) and was ending as u started: u started in its last ``LAST_WAVE_SHARE`` of its time
    or up to ``DEVICE_FREED_US`` after it; -1 for none. Either the device was busy with that kernel
    (one of many waves holds every SM until its last blocks end; which SMs u needed the trace does
    not say) or u depended on it through something the trace did not record (an event recorded by
    a call outside it): the link's graph holds no edge either way; the output gets one
    (``sim.device_edges``). O(streams of the device x log kernels)."""
    if not _is_kernel(graph, u):
        return -1
    _, device, stream = graph.lane_keys[graph.lane[u]]
    began = graph.start[u]
    for other, (starts, ops) in kernels.get(device, {}).items():
        if other == stream:
            continue
        k = bisect_right(starts, ready + HOLD_MIN_US) - 1  # the kernel of that stream running at ``ready``
        if k < 0:
            continue
        holder = ops[k]
        end = starts[k] + graph.measured_dur[holder]
        if end > ready and end - LAST_WAVE_SHARE * graph.measured_dur[holder] <= began <= end + DEVICE_FREED_US:
            return holder
    return -1


def host_waits(graph: SimGraph, min_us: float = HOLD_MIN_US, through_wait_nodes: bool = False
               ) -> list[tuple[int, float, str]]:
    """(node, wait µs, ``UNEXPLAINED_HOST_WAIT``) of every timed CPU op of ``graph`` that started at
    least ``min_us`` after each of its dependencies ended as the replay ends it (measured start
    plus duration in the file; the rank's measured start for an untimed root) *and* after the last
    GPU or communication op of the rank that ended before it: a thread blocked until GPU work of
    the trace finished waited for something the graph holds (a synchronize's or a blocking copy's
    edge, which may lead to a later op than this one), so only the time after the last such end
    is unexplained. In node order. Left out: an op with an untimed dependency that has
    dependencies of its own (when it ended is not known), an op after a communication node, and
    every op of a rank with CPU collectives (gloo, MPI, UCC): its threads wait for them in ways the
    replay's collective rules already place (``engine._cpu_pickups``, the job's matching, a
    collective the ET lost), so a hold would count those waits twice. Wait nodes of the file: as
    in ``gpu_waits``. O(n + E + g log g)."""
    first, _ = graph.measured_span()
    if math.isnan(first) or any(graph.lane_keys[graph.lane[u]][0] == "cpu" for u in graph.comm):
        return []
    start, dur, kind = graph.start, graph.duration, graph.kind
    device_ends = sorted(start[u] + graph.measured_dur[u] for u in range(len(graph))
                         if kind[u] in (GPU, COMM) and not math.isnan(start[u]))
    found = []
    for u in range(len(graph)):
        if kind[u] != CPU or math.isnan(start[u]):
            continue
        ready, known = first, True
        for d in graph.deps_of(u):
            if d in graph.wait_nodes and through_wait_nodes:
                continue
            s = start[d]
            if kind[d] == COMM or (math.isnan(s) and len(graph.deps_of(d))) or d in graph.wait_nodes:
                known = False
                break
            if not math.isnan(s):
                ready = max(ready, s + dur[d])
        if not known or start[u] - ready < min_us:
            continue
        before = bisect_right(device_ends, start[u])
        if before:
            ready = max(ready, device_ends[before - 1])
        wait = start[u] - ready
        if wait >= min_us:
            found.append((u, wait, UNEXPLAINED_HOST_WAIT))
    return found


def unheld_gpu_wait(graph: SimGraph, min_us: float = 1.0) -> UnheldWait:
    """The waits of ``graph``'s GPU / communication ops that no dependency explains (waits under
    ``min_us`` are ignored as timing noise)."""
    result = UnheldWait(graph.rank, 0.0)
    by_lane: dict[int, list[float]] = {}
    waits = gpu_waits(graph, min_us)
    for u, wait, _ in waits:
        total = by_lane.setdefault(graph.lane[u], [0.0, 0])
        total[0] += wait
        total[1] += 1
    result.streams = sorted((StreamWait(lane_label(graph.lane_keys[lane]), round(total, 1), count)
                             for lane, (total, count) in by_lane.items()), key=lambda s: -s.us)
    result.us = result.streams[0].us if result.streams else 0.0
    largest = sorted(((wait, u, cause) for u, wait, cause in waits), reverse=True)[:LARGEST]
    result.largest = [{"id": graph.ids[u], "name": graph.names[u], "lane": lane_label(graph.lane_keys[graph.lane[u]]),
                       "us": round(wait, 1), "cause": cause} for wait, u, cause in largest]
    return result


SHORT = 0.97  # a replay below this share of the measured step is short enough to explain


def unheld_note(wait: UnheldWait, measured_us: float, simulated_us: float, job: bool) -> str | None:
    """The report's note when the replay of the rank is short (below ``SHORT`` of its measured
    step) and the waits are a visible share (>= 1%) of the measured step."""
    if measured_us <= 0 or simulated_us >= SHORT * measured_us or wait.us < 0.01 * measured_us:
        return None
    top = wait.streams[0]
    largest = ", ".join(f"{w['name'][:60]!r} (id {w['id']}) {format_us(w['us'])} ({w['cause']})" for w in wait.largest)
    return (f"{'rank ' + str(wait.rank) + ': ' if job else ''}the measured step holds at least "
            f"{format_us(wait.us)} ({wait.us / measured_us:.0%}) the graph cannot reproduce: GPU ops that "
            f"started after everything they depend on had finished ({top.lane}: {top.ops} ops waited "
            f"{format_us(top.us)} in all; largest: {largest}). They waited for something the graph does not "
            f"hold (a wait the trace did not record or that could not be placed, work queued before "
            f"profiling started, another stream's kernel holding the device, other processes, peer ranks); "
            f"the replay starts them at once, so it can run short by up to that much")

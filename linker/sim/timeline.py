"""The measured and the simulated timeline of a replay as comparable bars, per rank and lane.

What ``et-link simulate --html`` draws (``linker.sim.view``) and what the library's tables hold;
plain data, no plotting library. Both sides use the same lanes ("cpu thread 1", "gpu 0 stream 7")
and one time axis (µs from the replay's 0: each rank's measured times are shifted so its first
measured op starts when the rank is released in the replay, as in ``--trace-out``).

The measured side is shown the way the simulator sees it:
- nested CPU ops become *exclusive* pieces: the parts of an op's interval that none of its
  children on the same lane covers (a parent and its children never overlap on a lane);
- of a node's measured time, the first ``duration`` µs the simulator replays (a CPU op: ``busy``
  pieces in time order; the rest ``wait``, e.g. a synchronize blocked on the GPU) count as busy.
  A GPU node's wait comes first: a collective's kernel waits for the slowest peer, then transfers
  (in a job, its transfer is the shortest member's kernel, as the replay takes it).
The simulated side: each node from its start to its end (``busy``); a collective's unit held
while waiting for peers, from its issue to its start (``wait``). ``critical`` marks the nodes
on the critical path.

Divergence points (computed here, from start times only): on each lane, the *landmarks* are
the nodes nothing else nests in on that lane (GPU nodes, CPU leaves); a landmark's *drift* is
its simulated minus its measured start (a matched collective's simulated start: its issue, when
its rank arrived), and its *jump* the drift minus the previous landmark's
on the lane (the first's: minus 0). A lane's jumps add up to its last landmark's drift, so the
largest jumps say where the replay gains or loses time against the measurement. Points are the
largest ``|jump|`` per rank, at least ``max(1% of the rank's measured step, 10 µs)``.

Cost: O(n log n) per rank (a sort of each lane by start), O(n) memory for n nodes.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from linker.sim.engine import Replay
from linker.sim.graph import KIND_NAMES, META, SimGraph, lane_label

BUSY, WAIT = "busy", "wait"
MEASURED, SIMULATED = "measured", "simulated"
DIVERGENCE_POINTS = 8
DIVERGENCE_MIN_US = 10.0
DIVERGENCE_SHARE = 0.01


class Bars:
    """Columns of bars on one rank's timeline, one entry per bar: ``side`` (measured/simulated),
    ``lane`` (its name), ``start``/``end`` (µs on the shared axis, ``array('d')``), ``state``
    (busy/wait), ``node`` (local node number, ``array('q')``), ``critical`` (1 on the critical path,
    else 0: a bytearray). A million bars take about 50 MB: the numbers unboxed, the strings shared."""

    def __init__(self) -> None:
        self.side: list[str] = []
        self.lane: list[str] = []
        self.start = array("d")
        self.end = array("d")
        self.state: list[str] = []
        self.node = array("q")
        self.critical = bytearray()

    def add(self, side: str, lane: str, start: float, end: float, state: str, node: int, critical: bool) -> None:
        self.side.append(side)
        self.lane.append(lane)
        self.start.append(start)
        self.end.append(end)
        self.state.append(state)
        self.node.append(node)
        self.critical.append(critical)

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class Divergence:
    """A landmark where the replay gains (``jump_us`` < 0) or loses (> 0) time against the
    measurement on its lane; ``drift_us``: simulated minus measured start there."""

    rank: int
    lane: str
    node: int  # local node number
    node_id: int
    name: str
    measured_start: float
    simulated_start: float
    drift_us: float
    jump_us: float


@dataclass
class RankTimeline:
    """One rank: its lanes (sorted: CPU threads, then GPU streams), its bars, its divergence points."""

    rank: int
    file: str
    lanes: list[str]
    bars: Bars
    divergences: list[Divergence]
    graph: SimGraph
    release_us: float


def _critical_nodes(rp: Replay, path) -> set[int]:
    return {step.node for step in path}


def _measured_shift(rp: Replay, r: int) -> float:
    """What to subtract from rank r's measured starts to put them on the replay's axis (NaN when untimed)."""
    first, _ = rp.graphs[r].measured_span()
    return first - rp.release[r]


def _transfer(rp: Replay, u: int) -> float:
    """The unscaled time the replay takes for node u's work: a matched collective's shortest member."""
    g = rp.groups.group_of[u] if len(rp.groups.group_of) else -1
    if g < 0:
        graph, local = rp.local(u)
        return graph.duration[local]
    return min(rp.local(m)[0].duration[rp.local(m)[1]] for m in rp.groups.members[g])


def exclusive_pieces(intervals: list[tuple[float, float, int]]) -> tuple[list[tuple[int, float, float]], set[int]]:
    """The exclusive pieces of nested intervals on one lane and the nodes that hold another.

    ``intervals``: (start, end, node). Returns ([(node, start, end)] in time order, parents). A
    child that outlasts its parent is cut at the parent's end. O(k log k) for k intervals."""
    pieces: list[tuple[int, float, float]] = []
    parents: set[int] = set()
    stack: list[tuple[int, float]] = []  # (node, end)
    cursor = 0.0
    for s, e, node in sorted(intervals, key=lambda item: (item[0], -item[1], item[2])):
        while stack and stack[-1][1] <= s:
            top, top_end = stack.pop()
            if cursor < top_end:
                pieces.append((top, cursor, top_end))
            cursor = max(cursor, top_end)
        if stack:
            top, top_end = stack[-1]
            if cursor < s:
                pieces.append((top, cursor, s))
            parents.add(top)
            e = min(e, top_end)
        stack.append((node, e))
        cursor = s
    while stack:
        top, top_end = stack.pop()
        if cursor < top_end:
            pieces.append((top, cursor, top_end))
        cursor = max(cursor, top_end)
    return pieces, parents


def _measured_bars(rp: Replay, r: int, critical: set[int], bars: Bars) -> set[int]:
    """Add rank r's measured bars; return the landmark nodes (nothing nests in them on their lane)."""
    graph, base = rp.graphs[r], rp.offsets[r]
    shift = _measured_shift(rp, r)
    landmarks: set[int] = set()
    if math.isnan(shift):
        return landmarks
    labels = [lane_label(key) for key in graph.lane_keys]
    by_lane: dict[int, list[tuple[float, float, int]]] = {}
    for u, (s, d, kind) in enumerate(zip(graph.start, graph.measured_dur, graph.kind)):
        if not math.isnan(s) and kind != META:
            by_lane.setdefault(graph.lane[u], []).append((s - shift, s - shift + d, u))
    for lane, intervals in by_lane.items():
        label = labels[lane]
        if graph.lane_keys[lane][0] == "cpu":
            pieces, parents = exclusive_pieces(intervals)
            landmarks.update(u for _, _, u in intervals if u not in parents)
            left: dict[int, float] = {}  # busy µs each node has left to show
            for u, s, e in pieces:
                busy = left.setdefault(u, graph.duration[u])
                take = min(busy, e - s)
                if take > 0:
                    bars.add(MEASURED, label, s, s + take, BUSY, u, base + u in critical)
                    left[u] = busy - take
                if s + take < e:
                    bars.add(MEASURED, label, s + take, e, WAIT, u, base + u in critical)
        else:
            for s, e, u in intervals:
                landmarks.add(u)
                busy = min(_transfer(rp, base + u), e - s)
                if e - busy > s:
                    bars.add(MEASURED, label, s, e - busy, WAIT, u, base + u in critical)
                if busy > 0:
                    bars.add(MEASURED, label, e - busy, e, BUSY, u, base + u in critical)
    return landmarks


def _simulated_bars(rp: Replay, r: int, critical: set[int], bars: Bars) -> None:
    graph, base = rp.graphs[r], rp.offsets[r]
    labels = [lane_label(key) for key in graph.lane_keys]
    group_of = rp.groups.group_of
    for u, kind in enumerate(graph.kind):
        g = base + u
        e = rp.end[g]
        if kind == META or math.isnan(e):
            continue
        label = labels[graph.lane[u]]
        on_path = g in critical
        if group_of[g] >= 0 and rp.start[g] > rp.issue[g]:
            bars.add(SIMULATED, label, rp.issue[g], rp.start[g], WAIT, u, on_path)
        if e > rp.start[g]:  # a wait node of the file is a wait, not busy time
            bars.add(SIMULATED, label, rp.start[g], e, WAIT if u in graph.wait_nodes else BUSY, u, on_path)


def divergence_points(rp: Replay, r: int, landmarks: set[int], limit: int = DIVERGENCE_POINTS) -> list[Divergence]:
    """The largest drift jumps of rank r's landmarks (see the module docstring). O(k log k)."""
    graph, base = rp.graphs[r], rp.offsets[r]
    shift = _measured_shift(rp, r)
    if math.isnan(shift):
        return []
    floor = max(DIVERGENCE_SHARE * graph.measured_step(), DIVERGENCE_MIN_US)
    by_lane: dict[int, list[int]] = {}
    group_of = rp.groups.group_of
    # A matched collective is compared where its rank arrived: its issue (its start includes the wait
    # for peers, which its measured start does not).
    begin = {u: rp.issue[base + u] if group_of[base + u] >= 0 else rp.start[base + u] for u in landmarks}
    for u in landmarks:
        if not math.isnan(begin[u]):
            by_lane.setdefault(graph.lane[u], []).append(u)
    found: list[Divergence] = []
    for lane, nodes in by_lane.items():
        label = lane_label(graph.lane_keys[lane])
        previous = 0.0
        for u in sorted(nodes, key=lambda u: (graph.start[u], u)):
            measured = graph.start[u] - shift
            simulated = begin[u]
            drift = simulated - measured
            jump = drift - previous
            previous = drift
            if abs(jump) >= floor:
                found.append(Divergence(graph.rank, label, u, graph.ids[u], graph.names[u], measured, simulated,
                                        drift, jump))
    found.sort(key=lambda d: (-abs(d.jump_us), d.measured_start))
    return found[:limit]


def _lane_order(graph: SimGraph) -> list[str]:
    return [lane_label(key) for key in sorted(graph.lane_keys)]


def rank_timelines(rp: Replay, path) -> list[RankTimeline]:
    """Every rank's bars and divergence points; ``path``: the critical path (``critical_path``)."""
    critical = _critical_nodes(rp, path)
    timelines = []
    for r, graph in enumerate(rp.graphs):
        bars = Bars()
        landmarks = _measured_bars(rp, r, critical, bars)
        _simulated_bars(rp, r, critical, bars)
        timelines.append(RankTimeline(graph.rank, graph.path, _lane_order(graph), bars,
                                      divergence_points(rp, r, landmarks), graph, rp.release[r]))
    return timelines


def kind_of(graph: SimGraph, u: int) -> str:
    """"cpu", "gpu", "comm" or "metadata" for local node u."""
    return KIND_NAMES[graph.kind[u]]

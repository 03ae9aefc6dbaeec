"""A kernel that waited for another stream's kernel to free the device, as a dependency.

On the measured timeline a kernel sometimes became ready (its launch, its stream's previous op
and its events all done) and still waited, then started as a kernel of another stream of its
device was ending: in that kernel's last ``unheld.LAST_WAVE_SHARE`` of its time, or up to
``unheld.DEVICE_FREED_US`` after it (``unheld.device_holds``; docs/fidelity.md, "Waits the
graph explains"). The device was full: a kernel of many waves holds every SM until its last
blocks end. The trace holds the cause, the other kernel, so the output carries it as an edge
(cause ``other_stream_kernel``), not as a wait node of fixed length: a what-if that speeds the
other kernel up starts the waiting one earlier, and ``--waits explained`` replays it too.

The edge cannot come from the whole holder: the waiting kernel started before the holder ended,
and no dependency may require an order the measured timeline contradicts. So the holder is cut
where the waiting kernel started: it keeps its id and its first part (its busy time becomes that
part; its measured time stays), and each later part becomes a piece (``write.node_edits.Piece``,
its parent and ``continues`` the kernel, after the part before it by ``stream_order``), as a host
op's later pieces are (docs/durations.md). The waiting kernel depends on the part that ended as it started;
whatever depended on the holder depends on its last part, which ends where the holder ended. A
waiting kernel that started after (or within ``MIN_PART_US`` of) the holder's end depends on the
holder itself, uncut. A communication kernel is never cut (its node is a collective): a kernel it
held gets an edge only when it started at its end.

Cost: one ``gpu_waits`` pass, O(n + E) numpy for the holders' dependents, O(h log h) for h holds;
``edited_graph`` O(n + E), where reading the rewritten file back took 3-4 s on a 150k-node GPU
output.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

import numpy as np

from linker.sim.graph import COMM, SimGraph
from linker.sim.unheld import OTHER_STREAM_KERNEL, device_holds
from linker.write.node_edits import NodeEdit, Piece

MIN_PART_US = 1.0  # a .et's unit: a part shorter than this is not cut off
STREAM_ORDER = "stream_order"  # the plan's cause for a stream's previous op (``plan.dependency_plan``)
PARENT = "parent"  # a ``ctrl_deps`` dependency, as ``sim.load`` names it


def device_edges(graph: SimGraph) -> tuple[dict[int, NodeEdit], list[Piece]]:
    """The edits (node id -> ``NodeEdit``) and the pieces that give each kernel of
    ``unheld.device_holds(graph)`` its edge from the part of its holder that ran until it started
    (module docstring); pieces take ids above the graph's largest. Empty when there are none."""
    by_holder: dict[int, list[int]] = {}
    for u, holder in device_holds(graph):
        if holder not in graph.deps_of(u):
            by_holder.setdefault(holder, []).append(u)
    if not by_holder:
        return {}, []
    dependents = _dependents(graph, sorted(by_holder))
    edits: dict[int, NodeEdit] = {}
    pieces: list[Piece] = []
    next_id = max(graph.ids) + 1
    for holder, held in sorted(by_holder.items(), key=lambda item: graph.ids[item[0]]):  # ids as in any format
        length = graph.measured_dur[holder]
        offsets = {u: graph.start[u] - graph.start[holder] for u in held}
        cuts = [] if graph.kind[holder] == COMM else _cuts(sorted(offsets.values()), length)
        parts = [graph.ids[holder]] + list(range(next_id, next_id + len(cuts)))
        next_id += len(cuts)
        bounds = cuts + [length]
        for k, cut in enumerate(cuts):
            pieces.append(Piece(parts[k + 1], graph.ids[holder], cut, bounds[k + 1] - cut, parts[k], STREAM_ORDER))
        if cuts:
            edits.setdefault(graph.ids[holder], NodeEdit()).busy = cuts[0]
            for v in dependents.get(holder, ()):
                edits.setdefault(graph.ids[v], NodeEdit()).repoint[graph.ids[holder]] = parts[-1]
        for u, offset in offsets.items():
            if offset >= length - MIN_PART_US:
                part = len(cuts)  # it started as the holder ended: after its last part
            else:
                part = bisect_right(cuts, offset)  # the part that ended at the cut made where it started
                if part == 0 or offset - cuts[part - 1] >= MIN_PART_US:
                    continue  # a communication kernel held it, mid-way: no part ended there
                part -= 1
            edits.setdefault(graph.ids[u], NodeEdit()).add.append((parts[part], OTHER_STREAM_KERNEL))
    return edits, pieces


def _cuts(offsets: list[float], length: float) -> list[float]:
    """Where to cut a holder of measured ``length``: each sorted offset at least ``MIN_PART_US``
    from its start, its end and the cut before."""
    cuts: list[float] = []
    for offset in offsets:
        if MIN_PART_US <= offset <= length - MIN_PART_US and (not cuts or offset - cuts[-1] >= MIN_PART_US):
            cuts.append(offset)
    return cuts


def _dependents(graph: SimGraph, holders: list[int]) -> dict[int, list[int]]:
    """Holder -> the nodes that depend on it, in node order. O(n + E) in numpy."""
    deps = np.frombuffer(graph.dep_nodes, dtype=np.int64)
    owner = np.repeat(np.arange(len(graph), dtype=np.int64), np.diff(np.frombuffer(graph.dep_offsets, dtype=np.int64)))
    hit = np.isin(deps, np.asarray(holders, dtype=np.int64))
    found: dict[int, list[int]] = {}
    for d, u in zip(deps[hit].tolist(), owner[hit].tolist()):
        found.setdefault(d, []).append(u)
    return found


def edited_graph(graph: SimGraph, edits: dict[int, NodeEdit], pieces: list[Piece]) -> SimGraph:
    """``graph`` as its file reads once ``edits`` and ``pieces`` are written into it
    (``write.node_edits``), without reading it again: the columns copied, busy times and
    dependencies changed, the pieces appended after the nodes (each on its node's unit, timed where
    it lay). O(n + E)."""
    index = {node_id: u for u, node_id in enumerate(graph.ids)}
    index.update((piece.id, len(graph) + j) for j, piece in enumerate(pieces))  # appended after the nodes
    causes = _Causes(graph)
    duration, offsets, nodes, dep_cause = _edited_dependencies(graph, edits, index, causes)
    ids, names, kind = array("q", graph.ids), list(graph.names), bytearray(graph.kind)
    start, measured, lane = array("d", graph.start), array("d", graph.measured_dur), array("q", graph.lane)
    continues = dict(graph.continues)
    for piece in pieces:
        u = index[piece.continues]
        continues[len(ids)] = piece.continues
        ids.append(piece.id)
        names.append(graph.names[u])
        kind.append(graph.kind[u])
        duration.append(piece.micros)
        start.append(graph.start[u] + piece.offset)
        measured.append(piece.micros)
        lane.append(graph.lane[u])
        if piece.after != piece.continues:  # its parent (``ctrl_deps``) is its node, as written
            nodes.append(u)
            dep_cause.append(causes.code(PARENT))
        nodes.append(index[piece.after])
        dep_cause.append(causes.code(piece.cause))
        offsets.append(len(nodes))
    if not causes.named and not pieces:
        dep_cause = bytearray()  # the file still names no cause
    return SimGraph(graph.path, graph.rank, ids, names, kind, duration, start, measured, lane, graph.lane_keys,
                    offsets, nodes, list(graph.missing_deps), dict(graph.comm), list(graph.notes), dep_cause,
                    causes.names, dict(graph.host_gap), continues, dict(graph.wait_nodes))


class _Causes:
    """A graph's cause names, grown as edits name new ones. ``named``: whether its file names any
    (a hand-made file may not; its edges then read back as "", but for the pieces', written with
    their causes)."""

    def __init__(self, graph: SimGraph):
        self.names = list(graph.cause_names)
        self._code = {name: k for k, name in enumerate(self.names)}
        self.named = bool(graph.dep_cause)

    def code(self, name: str) -> int:
        if name not in self._code:
            self._code[name] = len(self.names)
            self.names.append(name)
        return self._code[name]

    def of_added(self, name: str) -> int:
        """The code an added dependency of a node reads back with (unnamed where the file names none)."""
        return self.code(name if self.named else "")


def _edited_dependencies(graph: SimGraph, edits: dict[int, NodeEdit], index: dict[int, int], causes: _Causes
                         ) -> tuple[array, array, array, bytearray]:
    """The busy times and the dependency CSR (offsets, nodes, cause codes) of ``graph``'s nodes with
    ``edits`` applied (``index``: id -> node number, the pieces' included). O(n + E)."""
    by_node = {index[node_id]: edit for node_id, edit in edits.items()}
    unnamed = causes.code("")
    duration = array("d", graph.duration)
    offsets, nodes, dep_cause = array("q", [0]), array("q"), bytearray()
    old_offsets, old_nodes, old_causes = graph.dep_offsets, graph.dep_nodes, graph.dep_cause
    for u in range(len(graph)):
        lo, hi = old_offsets[u], old_offsets[u + 1]
        edit = by_node.get(u)
        if edit is None:
            nodes.extend(old_nodes[lo:hi])
            dep_cause.extend(old_causes[lo:hi] if causes.named else bytes([unnamed]) * (hi - lo))
            offsets.append(len(nodes))
            continue
        if edit.busy is not None:
            duration[u] = edit.busy
        for k in range(lo, hi):
            dep = graph.ids[old_nodes[k]]
            nodes.append(index[edit.repoint.get(dep, dep)])
            dep_cause.append(old_causes[k] if causes.named else unnamed)
        for dep, cause in edit.add:
            nodes.append(index[dep])
            dep_cause.append(causes.of_added(cause))
        offsets.append(len(nodes))
    return duration, offsets, nodes, dep_cause

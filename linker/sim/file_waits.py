"""What an output with GPU ops gains after its link, when it is read back: first, as dependencies,
the kernels that waited for another stream's kernel to free the device (``write_device_edges``,
``sim.device_edges``; under either ``--waits``); then, under ``--waits measured``, the measured
waits no dependency explains, as wait nodes (``write.wait_nodes``), so that a simulator fed the
file alone (ASTRA-sim) replays the step as measured (docs/fidelity.md, "Waits in the files").

Which ops: those ``engine.measured_holds`` finds (``unheld.gpu_waits`` and ``unheld.host_waits``:
an op that started, as measured, after everything it depends on had finished), kept where the
op's unit ran nothing else while it waited (``quiet_unit_holds``): a wait node occupies its unit,
as every node does in ASTRA-sim. How long: not the wait as measured (that would add to lateness
the replay already has: 1.09 on a DDP trace of ROCm kernels) but what it takes for the op to
start at its measured start when the rank is replayed as ASTRA-sim runs it: the rank is replayed
with a wait node before each kept op (``with_wait_nodes``), each lasting, once its unit takes it,
until its op's measured start (``engine.replay``'s ``wait_floors``). Waits that come out under
``MIN_WAIT_US`` are left out. Both replays issue each unit's ready nodes in the order they became
ready (``engine.BY_READY``), not by smallest id as ASTRA-sim (and ``simulate``) do: a wait node's id
is above every other, so under id order it would queue behind every op ready on its unit, and its
length would shrink by the time the model's one GPU unit spends on other streams' kernels that, as
measured, ran beside the held op; the held op then starts at its measured start only where the
replay keeps that queueing too. Measured (docs/fidelity.md, "ASTRA-sim's issue order"): sized in
ready order, the sweep's compile + CUDA graphs trace replays at 0.997 in ASTRA-sim and in
``simulate``; sized in id order, 0.972 in both. Each file is sized from its own values, so the JSON and the ``.et``
of one link can differ by a few wait nodes at the edges.

Written only into outputs with GPU or communication ops: on a CPU-only trace the host waits
changed no replay measured (the shared CPU pairs and fixtures replay within 1e-4 with or without
them), while finding them costs reading the output again (10-15 s on the 360k-node CPU pair).
Cost: one read of the output (``load_graph``), O(n + E) to find the device's holds and the waits,
two replays of the rank, and one copy of the file when any edge or wait is written.
"""

from __future__ import annotations

import math
import os
from array import array
from bisect import bisect_left
from itertools import accumulate

from linker.schedule import Schedule
from linker.model.waits import MEASURED_WAITS, wants_file_waits
from linker.sim.device_edges import device_edges, edited_graph
from linker.sim.engine import ASTRA_SIM, BY_READY, Scale, measured_holds, replay
from linker.sim.graph import CPU, GPU, NO_TIME, SimGraph
from linker.sim.load import load_graph
from linker.model.units import format_us
from linker.write.output_edits import edit_and_add_waits, edit_nodes
from linker.write.wait_nodes import WAIT_NODE_NAME, Wait

MIN_WAIT_US = 1.0  # a .et's unit: shorter waits round away in one format and not the other


def waits_to_write(graph: SimGraph) -> list[Wait]:
    """The wait nodes ``graph`` (one rank's output, read back) should carry, in node order. O(n + E)
    and one replay of the rank with a wait node before each held op."""
    holds = quiet_unit_holds(graph, measured_holds([graph]))
    if not holds:
        return []
    first, _ = graph.measured_span()
    waited, held_of = with_wait_nodes(graph, holds)
    floors = {w: graph.start[u] - first for w, u in held_of.items()}
    sized = replay([waited], ASTRA_SIM, Scale(), None, None, None, wait_floors=floors, issue_order=BY_READY)
    waits = [Wait(graph.ids[u], sized.duration[w], holds[u][1], holds[u][0]) for w, u in held_of.items()]
    return [wait for wait in waits if wait.micros >= MIN_WAIT_US]


def quiet_unit_holds(graph: SimGraph, holds: dict) -> dict:
    """The holds whose unit ran nothing else while they held their op: replayed as measured (the
    holds floating, on no unit), the unit was idle from the op's dependencies' end to its measured
    start, and no other hold kept so far lay there. A wait node runs on its unit, so a wait that
    shared its unit with other work (another thread of the rank, another stream) would hold that
    work up too. O(n log n)."""
    if not holds:
        return {}
    rp = replay([graph], ASTRA_SIM, Scale(), None, None, holds, issue_order=BY_READY)
    spans: dict[int, list[tuple[float, float]]] = {}
    for u, unit in enumerate(rp.unit_of):
        s, e = rp.start[u], rp.end[u]
        if unit >= 0 and not math.isnan(e) and e > s:
            spans.setdefault(unit, []).append((s, e))
    starts, ends = {}, {}
    for unit, pairs in spans.items():
        pairs.sort()
        starts[unit] = [s for s, _ in pairs]
        ends[unit] = list(accumulate((e for _, e in pairs), max))  # the latest end so far
    kept, kept_until = {}, {}
    for u in sorted((u for u in holds if u in rp.held_from), key=rp.held_from.__getitem__):
        unit, lo, hi = rp.unit_of[u], rp.held_from[u], rp.ready[u]
        k = bisect_left(starts.get(unit, ()), hi) - 1  # the last node of the unit starting before hi
        if kept_until.get(unit, -math.inf) > lo or k >= 0 and ends[unit][k] > lo:
            continue
        kept[u], kept_until[unit] = holds[u], hi
    return kept


def with_wait_nodes(graph: SimGraph, holds: dict) -> tuple[SimGraph, dict[int, int]]:
    """A copy of ``graph`` with a wait node (no duration yet) for each node of ``holds``, appended
    after its nodes: on that node's unit (a GPU node's stream, a host node's thread), after its
    dependencies, the node after it; and which node each wait node holds. The columns are copied
    and the dependency lists of the held nodes grown by one. O(n + E)."""
    held = sorted(holds)
    n, k = len(graph), len(held)
    wait_of = {u: n + j for j, u in enumerate(held)}
    offsets, nodes = array("q", [0]), array("q")
    old_offsets, old_nodes = graph.dep_offsets, graph.dep_nodes
    for u in range(n):
        nodes.extend(old_nodes[old_offsets[u]:old_offsets[u + 1]])
        w = wait_of.get(u)
        if w is not None:
            nodes.append(w)
        offsets.append(len(nodes))
    for u in held:  # each wait node: after what its op depends on
        nodes.extend(old_nodes[old_offsets[u]:old_offsets[u + 1]])
        offsets.append(len(nodes))
    kinds = bytearray(CPU if graph.kind[u] == CPU or graph.lane_keys[graph.lane[u]][0] == "cpu" else GPU
                      for u in held)
    waited = SimGraph(graph.path, graph.rank, graph.ids + array("q", range(max(graph.ids) + 1, max(graph.ids) + 1 + k)),
                      graph.names + [WAIT_NODE_NAME] * k, graph.kind + kinds, graph.duration + array("d", [0.0]) * k,
                      graph.start + array("d", [NO_TIME]) * k, graph.measured_dur + array("d", [0.0]) * k,
                      graph.lane + array("q", (graph.lane[u] for u in held)), graph.lane_keys, offsets, nodes,
                      list(graph.missing_deps), dict(graph.comm))
    waited.wait_nodes = {n + j: holds[u][1] for j, u in enumerate(held)}
    return waited, {n + j: u for j, u in enumerate(held)}


def write_device_edges(path: str | os.PathLike, schedule: Schedule | None = None) -> tuple[int, SimGraph]:
    """Read the output at ``path`` back (``schedule``: how, ``load_graph``'s; serial by default) and
    write into it, as dependencies, the kernels that waited for another stream's kernel to free
    the device (``sim.device_edges``); returns how many kernels got such an edge and the graph as
    the file now holds it (``device_edges.edited_graph``: not read again). Raises TraceInputError when it
    cannot be read or written (the output is then left as it was)."""
    edits, pieces, graph = _device_edited(load_graph(path, 0, schedule))
    edit_nodes(path, edits, pieces)
    return _edges(edits), graph


def _device_edited(graph: SimGraph) -> tuple[dict, list, SimGraph]:
    """The device's holds of ``graph`` as edits and pieces (``sim.device_edges``) and the graph
    with them (``graph`` itself when there are none)."""
    edits, pieces = device_edges(graph)
    return edits, pieces, edited_graph(graph, edits, pieces) if edits else graph


def _edges(edits: dict) -> int:
    """The dependencies ``edits`` add: one per kernel that waited for another stream's kernel."""
    return sum(len(edit.add) for edit in edits.values())


def waits_in_words(waits: list[Wait]) -> str:
    """The wait nodes written, by cause, with how many and how long they last in the file:
    "other_stream_kernel 3 (1.20 ms), unexplained_gpu_idle 12 (40 µs)", the longest cause first.
    O(len(waits))."""
    by_cause: dict[str, list[float]] = {}
    for wait in waits:
        total = by_cause.setdefault(wait.cause, [0, 0.0])
        total[0] += 1
        total[1] += wait.micros
    return ", ".join(f"{cause} {count} ({format_us(us)})"
                     for cause, (count, us) in sorted(by_cause.items(), key=lambda item: -item[1][1]))


def write_wait_step(path: str | os.PathLike, waits: str, schedule: Schedule | None = None
                    ) -> tuple[int, list[Wait]]:
    """The wait step on the output at ``path`` (module docstring): read back once, the device's
    holds found as dependencies (as ``write_device_edges`` writes them), then, when ``waits`` is
    "measured", the measured waits on the graph so edited (``waits_to_write``),
    and the file rewritten once with both (``output_edits.edit_and_add_waits``). Returns how many
    kernels got an edge and the waits written. ``schedule``: ``load_graph``'s."""
    edits, pieces, graph = _device_edited(load_graph(path, 0, schedule))
    found = waits_to_write(graph) if waits == MEASURED_WAITS else []
    edit_and_add_waits(path, edits, pieces, found, max(graph.ids) + 1)
    return _edges(edits), found


def add_file_waits(outcome, waits: str, schedule: Schedule | None = None, *, keep_link: bool = True) -> int:
    """After a link (``pipeline.PairOutcome``, its ``et_plus`` still held): the wait step
    (``write_wait_step``) on an output with GPU or communication ops (module docstring); returns
    the wait nodes written. ``keep_link`` False: the link's state (``outcome.et_plus``) is let go
    before the output is read back, so that the read-back's memory comes in its place, not on
    top of it (a batch worker's way, which needs it no more; the command line does the same
    before its own ``write_wait_step``: on a 1 M-row Nsight Systems capture linked to JSON, a
    peak of 3.1 GB instead of 4.4 GB)."""
    if not wants_file_waits(outcome, waits):
        return 0
    if not keep_link:
        outcome.et_plus = None
    return len(write_wait_step(outcome.output, waits, schedule)[1])

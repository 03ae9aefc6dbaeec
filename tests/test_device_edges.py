"""A kernel that waited for another stream's kernel to free the device gets a dependency on the part
of that kernel that ran until it started (``sim.device_edges``, ``write.node_edits``)."""

from __future__ import annotations

import gzip
import math

import orjson
import pytest

import linker
from conftest import shared_trace
from linker.pipeline import link_pair
from linker.sim.device_edges import device_edges, edited_graph
from linker.sim.engine import LANES, replay
from linker.sim.file_waits import write_device_edges
from linker.sim.load import load_graph
from sim_graphs import coll, cpu, gpu, write_et


def _busy_device(path, holder=gpu, held_at=1090):
    """cpu 1 (100-110) launches kernel 2 on stream 7 (110-1110, 1000 µs), then kernel 4 after it on
    stream 7 (1110-1120), and kernel 3 on stream 8: ready at 110, it ran from ``held_at``."""
    return write_et(path, [cpu(1, 10, start=100), holder(2, 1000, deps=[1], stream=7, start=110),
                           gpu(3, 10, deps=[1], stream=8, start=held_at),
                           gpu(4, 10, deps=[2, 1], stream=7, start=1110)])


def _node(graph, node_id):
    return list(graph.ids).index(node_id)


def test_the_holder_is_cut_where_the_waiting_kernel_started(tmp_path):
    """Kernel 3 started at 1090, in the last twentieth of kernel 2: kernel 2 keeps 110-1090 (980 µs
    busy, its measured 1000 kept), a piece continuing it runs 1090-1110 after it, kernel 3 depends
    on kernel 2 (``other_stream_kernel``) and kernel 4, which depended on kernel 2, on the piece.
    The graph alone (no holds) then starts kernel 3 at 1090 - 100 = 990, as measured; before, at 10."""
    path = _busy_device(tmp_path / "busy.et")
    before = replay([load_graph(path)], LANES)
    assert before.start[_node(before.graphs[0], 3)] == 10
    edges, graph = write_device_edges(path)
    assert edges == 1
    two, three, four = (_node(graph, i) for i in (2, 3, 4))
    (piece,) = graph.continues
    assert graph.continues[piece] == 2 and graph.ids[piece] == 5  # above the file's ids
    assert (graph.duration[two], graph.measured_dur[two]) == (980, 1000)
    assert (graph.start[piece], graph.duration[piece], graph.lane_keys[graph.lane[piece]]) == (1090, 20, ("gpu", 0, 7))
    assert list(graph.deps_of(piece)) == [two] and graph.edge_cause(piece, two) == "stream_order"
    assert two in graph.deps_of(three)  # (these hand-made nodes name no causes, so the edge names none)
    assert piece in graph.deps_of(four) and two not in graph.deps_of(four)
    rp = replay([graph], LANES)
    assert (rp.start[three], rp.start[piece], rp.end[piece], rp.start[four]) == (990, 990, 1010, 1010)
    report = linker.simulate(path, model="lanes", waits="explained").report
    assert report.ratio == 1.0 and report.waits.by_cause == {}


def _as_read(graph) -> dict:
    """A graph's nodes by id: name, kind, unit, busy, measured start and time, its dependencies'
    ids with their causes, the op it continues."""
    lanes = [graph.lane_keys[lane] for lane in graph.lane]
    start = [None if math.isnan(s) else s for s in graph.start]  # an untimed node's NaN, comparable
    deps = [sorted((graph.ids[d], graph.edge_cause(u, d)) for d in graph.deps_of(u)) for u in range(len(graph))]
    return {graph.ids[u]: (graph.names[u], graph.kind[u], lanes[u], graph.duration[u], start[u],
                           graph.measured_dur[u], deps[u], graph.continues.get(u))
            for u in range(len(graph))}


def test_the_edited_graph_is_the_file_read_again(tmp_path):
    """``write_device_edges`` hands on the graph it edited instead of reading the file again: the
    same nodes, times, dependencies and causes as ``load_graph`` reads from the rewritten file."""
    path = _busy_device(tmp_path / "busy.et")
    graph = load_graph(path)
    edits, pieces = device_edges(graph)
    _, edited = write_device_edges(path)
    assert _as_read(edited) == _as_read(load_graph(path)) == _as_read(edited_graph(graph, edits, pieces))


def test_a_faster_holder_starts_the_kernel_it_held_earlier(tmp_path):
    """What the edge buys over a wait of fixed length: with GPU work at half its time, kernel 2's first
    part runs 10-500 (from cpu 1's end), so kernel 3 starts at 500; held as a measured wait instead
    (the file without the edge), it would still wait its 980 µs after its launch: 990."""
    path = _busy_device(tmp_path / "fast.et")
    held = linker.simulate(path, model="lanes", scale="gpu=0.5").replay
    assert held.start[_node(held.graphs[0], 3)] == 990
    write_device_edges(path)
    rp = linker.simulate(path, model="lanes", scale="gpu=0.5").replay
    assert rp.start[_node(rp.graphs[0], 3)] == 500


def _frame_order(path) -> list[tuple[int, list[int]]]:
    """A ``.et``'s nodes in file order: (id, the ids it depends on)."""
    from linker.model import et_def_pb2 as pb
    from linker.write.chakra_wire import iter_frames

    nodes = [pb.Node.FromString(frame.payload) for frame in iter_frames(path) if frame.index]
    return [(node.id, [*node.data_deps, *node.ctrl_deps]) for node in nodes]


def _out_of_order(path) -> list[tuple[int, int]]:
    """(node, dependency) pairs of a ``.et`` where the dependency comes later in the file."""
    order = _frame_order(path)
    position = {node_id: k for k, (node_id, _) in enumerate(order)}
    return [(node_id, dep) for node_id, deps in order for dep in deps if position.get(dep, -1) > position[node_id]]


def test_the_file_stays_in_a_topological_order(tmp_path):
    """Kernel 3, written before the kernel that held it, gains a dependency on it: the rewrite holds
    kernel 3 back until kernel 2 and its piece are written; the piece comes right after kernel 2,
    before kernel 4, which now depends on it."""
    path = write_et(tmp_path / "order.et", [cpu(1, 10, start=100), gpu(3, 10, deps=[1], stream=8, start=1090),
                                            gpu(2, 1000, deps=[1], stream=7, start=110),
                                            gpu(4, 10, deps=[2, 1], stream=7, start=1110)])
    assert [node_id for node_id, _ in _frame_order(path)] == [1, 3, 2, 4]
    assert write_device_edges(path)[0] == 1
    assert [node_id for node_id, _ in _frame_order(path)] == [1, 2, 5, 3, 4]
    assert not _out_of_order(path)


def test_a_kernel_that_started_as_the_holder_ended_depends_on_it_whole(tmp_path):
    """Kernel 3 started at 1112, 2 µs after kernel 2 ended: an edge from kernel 2, nothing cut."""
    path = _busy_device(tmp_path / "after.et", held_at=1112)
    assert write_device_edges(path)[0] == 1
    graph = load_graph(path)
    assert not graph.continues and graph.duration[_node(graph, 2)] == 1000
    assert _node(graph, 2) in graph.deps_of(_node(graph, 3))


def test_a_communication_kernel_is_never_cut(tmp_path):
    """A collective held kernel 3 until 1090, 20 µs before its end: its node is a collective, so it is
    not cut and kernel 3's wait stays a measured wait (the file unchanged)."""
    path = _busy_device(tmp_path / "coll.et", holder=coll)
    before = path.read_bytes()
    assert write_device_edges(path)[0] == 0
    assert path.read_bytes() == before
    assert linker.simulate(path, model="lanes").report.waits.by_cause == {"other_stream_kernel": 980.0}


def _kernel_durations(kineto) -> dict[int, float]:
    """The GPU kernels of a Kineto trace, read from the file itself: correlation -> dur (µs)."""
    events = orjson.loads(gzip.decompress(kineto.read_bytes()))["traceEvents"]
    return {e["args"]["correlation"]: e["dur"] for e in events
            if e.get("ph") == "X" and e.get("cat") == "kernel" and "correlation" in e.get("args", {})}


def test_a_public_trace_holds_its_device_waits_as_edges(tmp_path):
    """HTA's ``trace_diff`` control trace: kernels of stream 20 that waited for a stream-7 kernel's
    last wave. Each such edge comes from a part that ended as its kernel started (up to 1 µs after:
    no part is cut shorter; up to 5 µs before, for a kernel that started just after the other
    ended); each cut kernel's parts add up to its ``dur`` in the Kineto file; the graph handed on
    to the wait step is the file read again; the ``.et`` holds the same pieces and stays in a
    topological order; and the graph alone (``--waits explained``, lanes) replays at least 0.95
    of the step (0.940 before: the waits were delays)."""
    kineto = shared_trace("sweep", "hta__trace_diff__control__control.json.gz")
    out = link_pair(None, kineto, tmp_path / "control.json").output  # the link's own output, then the edges
    _, edited = write_device_edges(out)
    assert _as_read(edited) == _as_read(load_graph(out))
    assert not device_edges(edited)[0]  # written once: nothing more to add
    nodes = {node["id"]: node for node in orjson.loads(out.read_bytes())["nodes"]}
    held = [(node, dep) for node in nodes.values()
            for dep, cause in zip(node.get("data_deps", []), node.get("data_dep_causes", []))
            if cause == "other_stream_kernel"]
    assert len(held) >= 10
    for node, dep in held:
        part = nodes[dep]
        assert part["stream"] != node["stream"] and part["device"] == node["device"]
        assert -1.0 <= node["ts"] - (part["ts"] + part["sim_dur"]) <= 5.0  # DEVICE_FREED_US after it at most
    measured = _kernel_durations(kineto)
    parts: dict[int, float] = {}
    for node in nodes.values():
        if "continues" in node and "stream" in node:
            parts[node["continues"]] = parts.get(node["continues"], 0.0) + node["sim_dur"]
    assert parts
    for holder, later in parts.items():
        assert nodes[holder]["sim_dur"] + later == pytest.approx(measured[nodes[holder]["correlation"]], abs=1e-6)
    assert linker.simulate(out, model="lanes", waits="explained").report.ratio >= 0.95
    et = link_pair(None, kineto, tmp_path / "control.et").output
    _, graph = write_device_edges(et)
    assert {graph.ids[u]: op for u, op in graph.continues.items() if graph.lane_keys[graph.lane[u]][0] == "gpu"} == \
        {node_id: node["continues"] for node_id, node in nodes.items() if "continues" in node and "stream" in node}
    assert not _out_of_order(et)  # every dependency before its dependent, as written

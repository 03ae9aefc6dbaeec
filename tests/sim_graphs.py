"""Small Chakra ``.et`` graphs written by the tests, for replays whose times are computed by hand.

``cpu``, ``gpu``, ``coll``, ``send``, ``recv`` build node specs; ``write_et`` writes them through
``linker.write.chakra_wire.EtWriter``, so the replay reads them with its real reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import EtWriter, make_attr


@dataclass
class Spec:
    id: int
    name: str
    type: int
    dur: int
    deps: tuple = ()
    ctrl: tuple = ()
    start: int = 0
    attrs: list = field(default_factory=list)


def cpu(node_id: int, dur: int, deps=(), tid: int = 1, start: int = 0, name: str | None = None, ctrl=()) -> Spec:
    return Spec(node_id, name or f"cpu{node_id}", pb.COMP_NODE, dur, tuple(deps), tuple(ctrl), start,
                [make_attr("is_cpu_op", True), make_attr("tid", tid)])


def gpu(node_id: int, dur: int, deps=(), stream: int = 7, start: int = 0, name: str | None = None) -> Spec:
    return Spec(node_id, name or f"kernel{node_id}", pb.COMP_NODE, dur, tuple(deps), (), start,
                [make_attr("is_cpu_op", False), make_attr("tid", 1), make_attr("stream", stream),
                 make_attr("device", 0)])


def coll(node_id: int, dur: int, deps=(), pg: str = "0", comm_type: int = pb.ALL_REDUCE, start: int = 0,
         name: str | None = None, stream: int = 20) -> Spec:
    return Spec(node_id, name or f"ncclKernel_AllReduce{node_id}", pb.COMM_COLL_NODE, dur, tuple(deps), (), start,
                [make_attr("is_cpu_op", False), make_attr("stream", stream), make_attr("device", 0),
                 make_attr("comm_type", comm_type), make_attr("comm_size", 1024), make_attr("pg_name", pg)])


def cpu_coll(node_id: int, dur: int, deps=(), pg: str = "0", start: int = 0, tid: int = 2) -> Spec:
    """A CPU backend's collective (gloo): a communication node on worker thread ``tid``."""
    return Spec(node_id, f"gloo:all_reduce{node_id}", pb.COMM_COLL_NODE, dur, tuple(deps), (), start,
                [make_attr("is_cpu_op", False), make_attr("tid", tid), make_attr("comm_type", pb.ALL_REDUCE),
                 make_attr("comm_size", 1024), make_attr("pg_name", pg)])


def send(node_id: int, dur: int, dst: int, deps=(), start: int = 0) -> Spec:
    return Spec(node_id, f"send{node_id}", pb.COMM_SEND_NODE, dur, tuple(deps), (), start,
                [make_attr("is_cpu_op", False), make_attr("stream", 20), make_attr("comm_dst", dst),
                 make_attr("comm_size", 64)])


def recv(node_id: int, dur: int, src: int, deps=(), start: int = 0) -> Spec:
    return Spec(node_id, f"recv{node_id}", pb.COMM_RECV_NODE, dur, tuple(deps), (), start,
                [make_attr("is_cpu_op", False), make_attr("stream", 20), make_attr("comm_src", src),
                 make_attr("comm_size", 64)])


def write_et(path: Path, specs: list[Spec]) -> Path:
    with EtWriter(path) as writer:
        writer.write_metadata(pb.GlobalMetadata(version="0.0.4"))
        for spec in specs:
            node = pb.Node(id=spec.id, name=spec.name, type=spec.type, duration_micros=spec.dur,
                           start_time_micros=spec.start)
            node.data_deps.extend(spec.deps)
            node.ctrl_deps.extend(spec.ctrl)
            node.attr.extend(spec.attrs)
            writer.write_node(node)
    return path

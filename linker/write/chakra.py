"""Write the ET+ as a Chakra protobuf trace (``.et``, ``.et.gz``) that Chakra tools and ASTRA-sim read.

Output (docs/formats.md): one ``GlobalMetadata`` (``version`` plus the ET header's ``schema``, ``pid``,
``time``, ``start_ts``, ``finish_ts``), then one ``Node`` per ET node and per GPU op, streamed one at a
time through ``chakra_io.EtWriter`` (temporary file renamed at the end: no file on failure; the
input paths are refused as output).

Node types:
- CPU ops (every ET node, roots included) and kernels / memcpys / memsets: ``COMP_NODE``;
- ``## process_group:init ##``: ``METADATA_NODE``;
- NCCL/RCCL collective kernels: ``COMM_COLL_NODE`` with ``comm_type`` (from the kernel name, e.g.
  ``ncclKernel_AllReduce_…``; for ``SendRecv`` / generic kernels from the launching ``nccl:*`` op,
  its ``record_param_comms`` collective name, its ``c10d::*`` op, or Kineto's "Collective name"),
  ``comm_size`` (bytes of the collective op's input tensors, else Kineto "In msg nelems" × dtype
  size) and ``pg_name``: the job-wide group id, PyTorch's numeric group name + 1 (Kineto "Process
  Group Name", record_param_comms' pg name, mapped through ``## process_group:init ##`` when it is a
  description; the world group "0" -> "1" when the trace does not say), see ``chakra_comm``;
- ``SendRecv`` kernels under a send / recv op: ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with the peer
  (``comm_dst`` / ``comm_src``: the rank argument of record_param_comms, mapped to a global rank
  through the process group's ranks when known), this rank on the other side when Kineto names it,
  ``comm_tag`` when the ``c10d::send``/``recv`` op carries one, and ``comm_size``.
  A communication kernel whose kind, size or peer cannot be determined is written as a
  ``COMP_NODE`` (its duration kept) and counted in the summary, never invented.

Dependencies (every id referenced exists; the graph is acyclic by construction):
- ``ctrl_deps`` = the parent (a GPU op's parent is its launching CPU op). The process root's
  self-parent and parents missing from the ET are dropped.
- ``data_deps``: per ET thread a serial chain in start order. Start order is the pre-order of the
  ET tree with siblings by id (ET ids are given at op start), which is the linked-``ts`` order for
  linked ops and places unlinked ops by id; a parent always precedes its children, so the chain
  never contradicts a ctrl edge. Each GPU op depends on its launching CPU op and on the previous
  op (by GPU start time) on the same (device, stream).
- Waits, when Kineto shows the runtime call and the call lies inside a linked ET op W (the
  innermost linked op covering it); the GPU op "waited on" is chosen in issue (launch) order,
  which on a FIFO stream is also completion order and is immune to GPU/CPU clock skew:
  * ``cudaDeviceSynchronize`` (and ``cuCtxSynchronize``, ``hipDeviceSynchronize``): on every
    stream, the last GPU op issued before the call;
  * ``cudaStreamSynchronize`` / ``cudaEventSynchronize`` (cu*/hip* too): the stream named in the
    call's args when Kineto records it, else the stream of the last GPU op the same CPU thread
    issued before the call; the last GPU op issued on that stream before the call;
  * ``cudaStreamWaitEvent`` (Kineto records neither the event nor the streams): the waiting stream
    is that of the next GPU op the same thread issues after the call; the event's stream is the
    stream, other than the waiting one, of the thread's most recent launch before the call; the
    op waited on is the last op issued on that stream before the call.
  A blocking synchronize's edge goes to the first linked op of W's thread that starts after the
  call returns (the thread went on only then), or to W when none does; a synchronous copy (a
  ``cudaMemcpy``, or a ``cudaMemcpyAsync`` that returned after its copy ended) likewise makes the
  op after the call wait for the copy. A ``cudaStreamWaitEvent`` blocks no thread: its edge goes to
  the next GPU op the thread issued (the stream that waited). Edges that would go backward in the
  write order, waits outside any linked op, outside the linked window, or without an op to wait
  on are counted and skipped.
- Cross-thread ``fork`` / ``join`` edges and the collective order per process group
  (``chakra_deps``, ``busy``). Every data dependency carries its cause in the ``string_list``
  attribute ``data_dep_causes`` (same length and order as ``data_deps``).

Durations: ``duration_micros`` is the node's busy time (``busy``): a CPU op's exclusive time minus
its blocked time plus the host gap folded into it; a GPU op's duration. Linked CPU ops also carry
``inclusive_dur_micros`` (measured), ``exclusive_dur_micros``, ``blocked_micros`` and, when there
is one, ``host_gap_micros`` (int64 µs, rounded); a thread root that carries a worker's start
offset has ``host_gap_micros`` too.

The rules live in two modules of their own: ``chakra_comm`` (communication attributes) and
``chakra_deps`` (dependencies, waits, write order); this module turns nodes into messages.

Nodes are written in a topological order of these dependencies (every dependency before its
dependent), ties broken by time, so streaming readers can resolve dependencies as they go.
Cost: O((n + g) log(n + g)) time for n ET nodes and g GPU ops; memory O(n + g) small ints besides
the ET+ itself (no second copy of the graph): each node message is built, written and dropped.
Messages are encoded ``CHUNK_NODES`` at a time by ``chakra_encode.NodeFrames``: CPU ops straight to
wire bytes, what repeats (op names, IO shapes/types, attribute combinations) encoded once and kept
as bytes; GPU ops through protobuf (``gpu_message``). ``node_messages`` is the plain path, one node
at a time (``chakra_encode.cpu_node_bytes``): the tests check both give the same bytes. Chunks are
written (and gzip-compressed) by a writer thread while the next ones are encoded (``EtWriter``'s
``background``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterator

import msgspec

from linker.write import et_def_pb2 as pb
from linker.plan.comm import WORLD_GROUP_ID, CommAttrs, IOParts, is_int
from linker.plan.deps import DependencyPlan, WriteSummary, dependency_plan
from linker.write.chakra_encode import (_TYPE_NAMES, AttrEncoder, AttrSpec, NodeFrames, attr_spec,  # noqa: F401 (attr_spec: API)
                            busy_attrs, cpu_node_bytes, cpu_node_type)
from linker.write.chakra_wire import EtWriter, make_attr
from linker.read.et import FLAT, EtNode
from linker.link.etplus import EtPlus, GpuNode

log = logging.getLogger("et_link")

# Chakra schema version this writer targets (the ET schema suffix "chakra.0.0.4").
CHAKRA_SCHEMA_VERSION = "0.0.4"

# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------


def metadata_message(et_plus: EtPlus) -> pb.GlobalMetadata:
    """``GlobalMetadata``: ``version`` plus the ET header fields that are present."""
    header = et_plus.et.header
    metadata = pb.GlobalMetadata(version=CHAKRA_SCHEMA_VERSION)
    for name, kind in (("schema", "string_val"), ("pid", "uint64_val"), ("time", "string_val"),
                       ("start_ts", "uint64_val"), ("finish_ts", "uint64_val")):
        value = getattr(header, name, msgspec.UNSET)
        if value is msgspec.UNSET or value is None:
            continue
        if kind == "uint64_val" and (not is_int(value) or value < 0):
            metadata.attr.append(make_attr(name, str(value), "string_val"))
        else:
            metadata.attr.append(make_attr(name, value, kind))
    return metadata


def _text(raw: Any) -> str:
    """Raw JSON bytes (``msgspec.Raw`` or bytes) as text; "" when absent."""
    if raw is None or raw is msgspec.UNSET:
        return ""
    return str(raw, "utf-8", "replace")


def _io_info(target: pb.IOInfo, values: Any, shapes: Any, types: Any, strides: Any = None) -> None:
    target.values = _text(values)
    target.shapes = _text(shapes)
    target.types = _text(types)
    if strides is not None:
        target.strides = _text(strides)


_IO_DECODER = msgspec.json.Decoder(IOParts)


def fill_io(message: pb.Node, node: EtNode | GpuNode, flat: bool) -> None:
    """Set ``inputs``/``outputs`` as IOInfo holding the node's own JSON text of values, shapes,
    types (and strides when present). Cost: O(size of the raw inputs/outputs)."""
    if flat:
        if node.inputs is not msgspec.UNSET:
            _io_info(message.inputs, node.inputs, node.input_shapes, node.input_types)
        if node.outputs is not msgspec.UNSET:
            _io_info(message.outputs, node.outputs, node.output_shapes, node.output_types)
        return
    for raw, target in ((node.inputs, message.inputs), (node.outputs, message.outputs)):
        if raw is msgspec.UNSET or raw is None:
            continue
        try:
            parts = _IO_DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            target.values = _text(raw)
            continue
        _io_info(target, parts.values, parts.shapes, parts.types, parts.strides if len(parts.strides) else None)


def _set_times(message: pb.Node, ts: Any, dur: Any) -> None:
    if ts is not msgspec.UNSET and ts is not None:
        message.start_time_micros = max(0, round(ts))
    if dur is not msgspec.UNSET and dur is not None:
        message.duration_micros = max(0, round(dur))


def gpu_attrs(node: GpuNode, tid: int, comm: CommAttrs | None) -> Iterator[AttrSpec]:
    """``is_cpu_op`` false, the launcher's ``tid``, placement ids, then the comm attributes."""
    yield "is_cpu_op", "bool_val", False
    yield "tid", "int64_val", tid
    for name in ("stream", "device", "correlation"):
        value = getattr(node, name)
        if is_int(value):
            yield name, "int64_val", value
    if comm is None or comm.node_type == pb.COMP_NODE:
        return
    if comm.comm_type is not None:
        yield "comm_type", "int64_val", comm.comm_type
    yield "comm_size", "int64_val", comm.comm_size
    for name in ("comm_src", "comm_dst", "comm_tag"):
        value = getattr(comm, name)
        if value is not None:
            yield name, "int64_val", value
    yield "pg_name", "string_val", comm.pg_name or WORLD_GROUP_ID


def _dependency_ids(plan: DependencyPlan, u: int, ids) -> tuple[list[int], list[int], list[str]]:
    """ctrl ids, data ids and the cause of each data dependency of node u."""
    ctrl = [ids[plan.ctrl[u]]] if plan.ctrl[u] >= 0 else []
    deps = plan.data_deps(u)
    return ctrl, [ids[d] for d, _ in deps], [cause for _, cause in deps]


class _Ids:
    """Node id of a node number (ET ids, then GPU node ids) without a combined list."""

    def __init__(self, et_plus: EtPlus):
        self._cpu = et_plus.et.ids
        self._gpu = et_plus.gpu_nodes
        self._n = len(self._cpu)

    def __getitem__(self, u: int) -> int:
        return self._cpu[u] if u < self._n else self._gpu[u - self._n].id


def gpu_message(et_plus: EtPlus, plan: DependencyPlan, summary: WriteSummary, u: int, ids,
                attrs: AttrEncoder) -> pb.Node:
    """The ``Node`` of GPU op u (node number ``plan.cpu_count + k``), counted into ``summary``."""
    ctrl, data, causes = _dependency_ids(plan, u, ids)
    k = u - plan.cpu_count
    node, link = et_plus.gpu_nodes[k], et_plus.gpu_links[k]
    comm = plan.comm[k]
    node_type = comm.node_type if comm is not None else pb.COMP_NODE
    message = pb.Node(id=node.id, name=node.name, type=node_type, ctrl_deps=ctrl, data_deps=data)
    _set_times(message, node.ts, node.dur)
    fill_io(message, node, et_plus.et.layout == FLAT)
    message.MergeFromString(attrs.encode_all(gpu_attrs(node, et_plus.et.tid[link.et_index], comm)))
    if causes:
        message.MergeFromString(attrs.encode(("data_dep_causes", "string_list", tuple(causes))))
    summary.counts_by_type[_TYPE_NAMES[message.type]] += 1
    return message


def cpu_comm_message(et_plus: EtPlus, plan: DependencyPlan, summary: WriteSummary, u: int, ids,
                     attrs: AttrEncoder) -> pb.Node:
    """The ``Node`` of a CPU collective (ET node u, ``plan.cpu_comm``; ``plan.cpu_comm``'s module
    says which): a communication node with ``is_cpu_op`` false, its measured thread as ``tid``, its
    comm attributes, its measured duration, its dependencies and their causes; its ET inputs and
    outputs are kept, its other ET attributes are not (they describe a CPU op)."""
    ctrl, data, causes = _dependency_ids(plan, u, ids)
    node, comm = et_plus.et.nodes[u], plan.cpu_comm[u]
    message = pb.Node(id=node.id, name=node.name, type=comm.node_type, ctrl_deps=ctrl, data_deps=data)
    _set_times(message, node.ts, plan.busy.sim[u])
    fill_io(message, node, et_plus.et.layout == FLAT)
    specs = [("is_cpu_op", "bool_val", False), ("tid", "int64_val", et_plus.et.tid[u])]
    if comm.comm_type is not None:
        specs.append(("comm_type", "int64_val", comm.comm_type))
    specs += [("comm_size", "int64_val", comm.comm_size), ("pg_name", "string_val", comm.pg_name or WORLD_GROUP_ID)]
    if comm.seq is not None:  # its issue number in the group (``plan.cpu_comm``): ranks pair collectives by it
        specs.append(("comm_seq", "int64_val", comm.seq))
    message.MergeFromString(attrs.encode_all(iter(specs)) + attrs.int64_attrs(busy_attrs(plan, u, node)))
    if causes:
        message.MergeFromString(attrs.encode(("data_dep_causes", "string_list", tuple(causes))))
    summary.counts_by_type[_TYPE_NAMES[message.type]] += 1
    return message


def node_messages(et_plus: EtPlus, plan: DependencyPlan, summary: WriteSummary,
                  order: list[int] | None = None) -> Iterator[pb.Node | bytes]:
    """The plain path: one ``Node`` per ET node and GPU op, in ``plan.order`` (or ``order``),
    built on demand: CPU ops as wire bytes (``cpu_node_bytes``: duration the busy time, then the
    op's own attributes, its time split and its dependency causes), GPU ops as messages. The
    writer uses ``node_frames``, which gives the same bytes faster."""
    et = et_plus.et
    flat = et.layout == FLAT
    ids = _Ids(et_plus)
    attrs = AttrEncoder()
    for u in plan.order if order is None else order:
        if u >= plan.cpu_count:
            yield gpu_message(et_plus, plan, summary, u, ids, attrs)
            continue
        if u in plan.cpu_comm:
            yield cpu_comm_message(et_plus, plan, summary, u, ids, attrs)
            continue
        ctrl, data, causes = _dependency_ids(plan, u, ids)
        causes_attr = attrs.encode(("data_dep_causes", "string_list", tuple(causes))) if causes else b""
        node = et.nodes[u]
        node_type = cpu_node_type(node)
        summary.counts_by_type[_TYPE_NAMES[node_type]] += 1
        extra = attrs.int64_attrs(busy_attrs(plan, u, node)) + causes_attr
        yield cpu_node_bytes(node, node_type, ctrl, data, plan.busy.sim[u], flat, attrs, extra)


def node_frames(et_plus: EtPlus, plan: DependencyPlan, summary: WriteSummary, pre_encoded=None) -> NodeFrames:
    """The chunked encoder of ``et_plus``'s nodes (GPU ops through ``gpu_message``; the ET's own
    fields from ``pre_encoded`` when given: ``chakra_ahead``)."""
    ids = _Ids(et_plus)

    def gpu_payload(u: int, attrs: AttrEncoder) -> bytes:
        if u < plan.cpu_count:  # a CPU collective (``plan.cpu_comm``)
            return cpu_comm_message(et_plus, plan, summary, u, ids, attrs).SerializeToString()
        return gpu_message(et_plus, plan, summary, u, ids, attrs).SerializeToString()

    return NodeFrames(et_plus, plan, summary, gpu_payload, pre_encoded)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


# Nodes encoded per chunk (one join, one write): about a MB of output.
CHUNK_NODES = 2048


def write_chakra_trace(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = (),
                       pre_encoded=None) -> WriteSummary:
    """Write ``et_plus`` to ``path`` as a Chakra trace (gzip when it ends in ``.gz``) and return
    what was written. Atomic: on any error no file appears and an existing ``path`` is kept;
    ``protected`` paths (the inputs) are refused. Nodes are encoded ``CHUNK_NODES`` at a time;
    ``pre_encoded``: the ET's own fields of each op, already encoded (``chakra_ahead.PreEncoded``).
    Cost: see the module docstring."""
    started = time.perf_counter()
    summary = WriteSummary(str(path))
    plan = dependency_plan(et_plus, summary)
    frames = node_frames(et_plus, plan, summary, pre_encoded)
    order = plan.order
    with EtWriter(path, protected, background=True) as writer:
        writer.write_metadata(metadata_message(et_plus))
        for start in range(0, len(order), CHUNK_NODES):
            chunk = order[start:start + CHUNK_NODES]
            encoded = frames.chunk(chunk)
            writer.write_frames_bytes(encoded, len(chunk))
            if start == 0:  # the file's size, extrapolated from the first chunk (a guess it forgives)
                writer.reserve(len(encoded) * len(order) // len(chunk) + (1 << 16))
        summary.nodes = writer.nodes_written
    summary.seconds = time.perf_counter() - started
    return summary


def write_et_plus_chakra(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = (),
                         pre_encoded=None) -> None:
    """Pipeline entry point: ``write_chakra_trace`` and log its summary."""
    summary = write_chakra_trace(et_plus, path, protected, pre_encoded)
    types = ", ".join(f"{name} {count}" for name, count in sorted(summary.counts_by_type.items()))
    log.info("wrote Chakra trace %s: %d nodes (%s) in %.2fs", path, summary.nodes, types, summary.seconds)
    log.info("waits: %d edges (%d moved past the launching op), skipped %s",
             summary.wait_edges, summary.wait_edges_redirected, dict(summary.waits_skipped) or "none")
    if summary.comm_unresolved:
        log.info("communication kernels written as COMP_NODE: %s", dict(summary.comm_unresolved))
    if summary.ctrl_deps_dropped:
        log.info("%d parents missing from the ET: ctrl_deps dropped", summary.ctrl_deps_dropped)

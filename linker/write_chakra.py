"""Write the ET+ as a Chakra protobuf trace (``.et``, ``.et.gz``) that Chakra tools and ASTRA-sim read.

Output (FORMATS.md §4): one ``GlobalMetadata`` (``version`` plus the ET header's ``schema``, ``pid``,
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
CPU op messages are encoded straight to wire bytes (``cpu_node_bytes``; attributes that repeat are
cached as bytes by ``AttrEncoder``), GPU ops through protobuf; from ``PARALLEL_MIN_NODES`` nodes
the tail of the write order is encoded by a forked child while this process encodes the head.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import time
from typing import Any, Iterator

import msgspec
import orjson

from . import et_def_pb2 as pb
from .chakra_comm import PROCESS_GROUP_INIT, WORLD_GROUP_ID, CommAttrs, _IOParts, _is_int
from .chakra_deps import DependencyPlan, WriteSummary, dependency_plan
from .chakra_io import EtWriter, encode_varint, make_attr
from .et_reader import FLAT, EtNode, decode_attr_values
from .etplus import EtPlus, GpuNode

log = logging.getLogger("et_link")

# Chakra schema version this writer targets (the ET schema suffix "chakra.0.0.4").
CHAKRA_SCHEMA_VERSION = "0.0.4"
MAX_INT64 = (1 << 63) - 1

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
        if kind == "uint64_val" and (not _is_int(value) or value < 0):
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


_IO_DECODER = msgspec.json.Decoder(_IOParts)


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


AttrSpec = tuple  # (name, AttributeProto value kind, value)


def attr_spec(name: str, value: Any) -> AttrSpec | None:
    """How an ET attribute value is stored: ints as int64 (uint64 beyond int64), floats double,
    bools, strings, int/str lists; anything else as its JSON text. None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return name, "bool_val", value
    if isinstance(value, int):
        return name, "int64_val" if -MAX_INT64 - 1 <= value <= MAX_INT64 else "uint64_val", value
    if isinstance(value, float):
        return name, "double_val", value
    if isinstance(value, str):
        return name, "string_val", value
    if isinstance(value, list) and value:
        if all(_is_int(v) and -MAX_INT64 - 1 <= v <= MAX_INT64 for v in value):
            return name, "int64_list", tuple(value)
        if all(isinstance(v, str) for v in value):
            return name, "string_list", tuple(value)
    return name, "string_val", orjson.dumps(value).decode()


class AttrEncoder:
    """Serialises node attributes as ``Node.attr`` wire bytes, caching what repeats.

    Most attributes repeat from op to op (``scope`` 7, ``tid`` 1, ``op_schema`` strings...): a
    CPU op's attributes other than its per-op ids (``rf_id``, ``seq_id``) are encoded once per
    distinct combination and merged into each node with one ``MergeFromString``, several times
    faster than building ``AttributeProto`` objects per node. ``int64_val`` attributes (the per-op
    ids among them) are encoded directly: ``Node.attr`` (field 10, length-delimited) holding
    ``name`` (field 1) and ``int64_val`` (field 9, varint of the two's complement). Each cache
    holds at most ``max_entries`` items.
    """

    def __init__(self, max_entries: int = 1 << 16):
        self._specs: dict[AttrSpec, bytes] = {}
        self._blobs: dict[tuple, bytes] = {}
        self._name_fields: dict[str, bytes] = {}
        self._max_entries = max_entries
        self._is_cpu_op: bytes | None = None

    def _int64_attr(self, name: str, value: int) -> bytes:
        head = self._name_fields.get(name)  # the name field and the int64_val tag
        if head is None:
            encoded_name = name.encode("utf-8")
            head = self._name_fields[name] = b"\x0a" + encode_varint(len(encoded_name)) + encoded_name + b"\x48"
        varint = encode_varint(value if value >= 0 else value & 0xFFFF_FFFF_FFFF_FFFF)
        return b"\x52" + encode_varint(len(head) + len(varint)) + head + varint

    def int64_attrs(self, pairs: list[tuple[str, int]]) -> bytes:
        """``Node.attr`` bytes of (name, int) pairs known to fit int64 (no spec, no cache)."""
        return b"".join([self._int64_attr(name, value) for name, value in pairs])

    def encode(self, spec: AttrSpec) -> bytes:
        """Wire bytes of one attribute as a ``Node.attr`` field."""
        name, kind, value = spec
        if kind == "int64_val":
            return self._int64_attr(name, value)
        encoded = self._specs.get(spec)
        if encoded is None:
            holder = pb.Node()
            holder.attr.append(make_attr(name, value, kind))
            encoded = holder.SerializeToString()
            if len(self._specs) < self._max_entries:
                self._specs[spec] = encoded
        return encoded

    def encode_all(self, specs: Iterator[AttrSpec]) -> bytes:
        return b"".join(self.encode(spec) for spec in specs)

    def cpu_attr_bytes(self, node: EtNode, flat: bool) -> bytes:
        """``is_cpu_op`` true, the op's ``rf_id`` / ``seq_id``, then its other ET attributes. O(#attrs)."""
        own: list = []
        shared_pairs: list = []
        for pair in _cpu_attr_pairs(node, flat):
            (own if pair[0] in _PER_OP_ATTRS else shared_pairs).append(pair)
        shared = tuple(shared_pairs)
        try:
            blob = self._blobs.get(shared)
            cacheable = True
        except TypeError:  # a list value: not hashable
            blob, cacheable = None, False
        if blob is None:
            blob = self.encode_all(_specs_of(shared))
            if cacheable and len(self._blobs) < self._max_entries:
                self._blobs[shared] = blob
        if self._is_cpu_op is None:
            self._is_cpu_op = self.encode(_IS_CPU_OP)
        if all(type(value) is int and -MAX_INT64 - 1 <= value <= MAX_INT64 for _, value in own):
            own_bytes = self.int64_attrs(own)  # the usual rf_id / seq_id: what attr_spec gives them
        else:
            own_bytes = self.encode_all(_specs_of(own))
        return self._is_cpu_op + own_bytes + blob


_IS_CPU_OP = ("is_cpu_op", "bool_val", True)
_FLAT_ATTRS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema")
_PER_OP_ATTRS = frozenset({"rf_id", "seq_id"})  # about unique per op: not cached in combination


def _cpu_attr_pairs(node: EtNode, flat: bool) -> list[tuple[str, Any]]:
    """The ET node's own metadata as (name, value), in file order (flat keys or ``attrs``)."""
    if flat:
        pairs = [(name, getattr(node, name)) for name in _FLAT_ATTRS]
        return [(name, value) for name, value in pairs if value is not msgspec.UNSET and value is not None]
    if node.attrs is msgspec.UNSET:
        return []
    return [(attr.name, attr.value) for attr in decode_attr_values(node)
            if attr.value is not None and attr.name != "is_cpu_op"]


def _specs_of(pairs) -> Iterator[AttrSpec]:
    for name, value in pairs:
        spec = attr_spec(name, value)
        if spec is not None:
            yield spec


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
        if _is_int(value):
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


def _micros(value: float) -> int:
    return max(0, round(value))


def busy_attrs(plan: DependencyPlan, i: int, node: EtNode) -> list[tuple[str, int]]:
    """The measured and simulated time split of a linked CPU op (int64 µs, rounded), as
    (name, value) of ``int64_val`` attributes."""
    busy = plan.busy
    gap = busy.host_gap[i]
    pairs = []
    if node.ts is not msgspec.UNSET:
        pairs = [("inclusive_dur_micros", _micros(node.dur)),
                 ("exclusive_dur_micros", _micros(node.exclusive_dur)),
                 ("blocked_micros", _micros(busy.blocked[i]))]
    if gap > 0:
        pairs.append(("host_gap_micros", _micros(gap)))
    return pairs


class _Ids:
    """Node id of a node number (ET ids, then GPU node ids) without a combined list."""

    def __init__(self, et_plus: EtPlus):
        self._cpu = et_plus.et.ids
        self._gpu = et_plus.gpu_nodes
        self._n = len(self._cpu)

    def __getitem__(self, u: int) -> int:
        return self._cpu[u] if u < self._n else self._gpu[u - self._n].id


_TYPE_NAMES = {value: pb.NodeType.Name(value) for value in pb.NodeType.values()}


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the payload's length, the payload."""
    return tag + encode_varint(len(payload)) + payload


def _io_bytes(values: Any, shapes: Any, types: Any, strides: Any = None) -> bytes:
    """An ``IOInfo`` message's wire bytes (empty strings are not written, as protobuf does)."""
    out = b""
    for tag, raw in ((b"\x0a", values), (b"\x12", shapes), (b"\x1a", types), (b"\x22", strides)):
        if raw is None or raw is msgspec.UNSET:
            continue
        text = bytes(raw)
        if not text.isascii():  # what protobuf writes for the text ``_text`` makes of it
            text = _text(raw).encode("utf-8")
        if text:
            out += tag + encode_varint(len(text)) + text
    return out


def _io_fields(node: EtNode, flat: bool) -> bytes:
    """``inputs`` (field 8) and ``outputs`` (field 9) of a CPU node, as ``fill_io`` sets them:
    present (if empty) whenever the ET node has them. O(size of the raw inputs/outputs)."""
    out = b""
    if flat:
        if node.inputs is not msgspec.UNSET:
            out += _field(b"\x42", _io_bytes(node.inputs, node.input_shapes, node.input_types))
        if node.outputs is not msgspec.UNSET:
            out += _field(b"\x4a", _io_bytes(node.outputs, node.output_shapes, node.output_types))
        return out
    for raw, tag in ((node.inputs, b"\x42"), (node.outputs, b"\x4a")):
        if raw is msgspec.UNSET or raw is None:
            continue
        try:
            parts = _IO_DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            out += _field(tag, _io_bytes(raw, None, None))
            continue
        out += _field(tag, _io_bytes(parts.values, parts.shapes, parts.types,
                                     parts.strides if len(parts.strides) else None))
    return out


def _packed(tag: bytes, values: list[int]) -> bytes:
    if not values:
        return b""
    return _field(tag, b"".join([encode_varint(v) for v in values]))


def _time_field(tag: bytes, value: Any) -> bytes:
    if value is msgspec.UNSET or value is None:
        return b""
    micros = max(0, round(value))
    return tag + encode_varint(micros) if micros else b""


def cpu_node_bytes(node: EtNode, node_type: int, ctrl: list[int], data: list[int], duration: float,
                   flat: bool, attrs: AttrEncoder, extra_attrs: bytes = b"") -> bytes:
    """The wire bytes of a CPU op's ``Node``, encoded directly (no message object), exactly what
    protobuf writes for the same fields: known fields in field-number order, proto3 defaults
    left out, repeated ids packed. The tests read every message back with protobuf and with an
    independent wire reader. O(size of the node)."""
    name = node.name.encode("utf-8")
    return b"".join((
        b"\x08" + encode_varint(node.id) if node.id else b"",
        _field(b"\x12", name) if name else b"",
        b"\x18" + encode_varint(node_type) if node_type else b"",
        _packed(b"\x22", ctrl),
        _packed(b"\x2a", data),
        _time_field(b"\x30", node.ts),
        _time_field(b"\x38", duration),
        _io_fields(node, flat),
        attrs.cpu_attr_bytes(node, flat),
        extra_attrs,
    ))


def node_messages(et_plus: EtPlus, plan: DependencyPlan, summary: WriteSummary,
                  order: list[int] | None = None) -> Iterator[pb.Node | bytes]:
    """One ``Node`` per ET node and GPU op, in ``plan.order`` (or the part of it given as
    ``order``), built on demand: CPU ops as wire bytes (``cpu_node_bytes``: duration the busy
    time, then the op's own attributes, its time split and its dependency causes), GPU ops as
    messages."""
    et = et_plus.et
    flat = et.layout == FLAT
    ids = _Ids(et_plus)
    attrs = AttrEncoder()
    n = plan.cpu_count
    for u in plan.order if order is None else order:
        ctrl, data, causes = _dependency_ids(plan, u, ids)
        causes_attr = attrs.encode(("data_dep_causes", "string_list", tuple(causes))) if causes else b""
        if u < n:
            node = et.nodes[u]
            node_type = pb.METADATA_NODE if node.name == PROCESS_GROUP_INIT else pb.COMP_NODE
            summary.counts_by_type[_TYPE_NAMES[node_type]] += 1
            extra = attrs.int64_attrs(busy_attrs(plan, u, node)) + causes_attr
            yield cpu_node_bytes(node, node_type, ctrl, data, plan.busy.sim[u], flat, attrs, extra)
        else:
            k = u - n
            node, link = et_plus.gpu_nodes[k], et_plus.gpu_links[k]
            comm = plan.comm[k]
            node_type = comm.node_type if comm is not None else pb.COMP_NODE
            message = pb.Node(id=node.id, name=node.name, type=node_type, ctrl_deps=ctrl, data_deps=data)
            _set_times(message, node.ts, node.dur)
            fill_io(message, node, flat)
            message.MergeFromString(attrs.encode_all(gpu_attrs(node, et.tid[link.et_index], comm)))
            message.MergeFromString(causes_attr)
            summary.counts_by_type[_TYPE_NAMES[message.type]] += 1
            yield message


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


# Plans at least this long are encoded by two processes (see ``_HalfInChild``).
PARALLEL_MIN_NODES = 50_000


def _frames(messages: Iterator[pb.Node | bytes]) -> Iterator[bytes]:
    """Each message as ``EtWriter`` frames it: varint length, then the bytes."""
    for message in messages:
        payload = message if isinstance(message, bytes) else message.SerializeToString()
        if not payload:
            raise ValueError("empty Node (every field default): readers would take it for end-of-file")
        yield encode_varint(len(payload)) + payload


class _HalfInChild:
    """Encodes the tail of the write order in a forked process while this one encodes the head.

    The child inherits the ET+ and the plan (no transfer), writes its framed messages to a
    temporary file and its counts to a second one, and exits. ``collect`` waits for it and returns
    (frames file, node count, counts by type, unresolved comm reasons), or None when it failed
    (the caller then encodes the tail itself: the bytes do not depend on who encodes them).
    Cost: the tail's encoding on the other core, one write and one read of its bytes."""

    def __init__(self, et_plus: EtPlus, plan: DependencyPlan, order: list[int]):
        fd, self.frames_path = tempfile.mkstemp(prefix="et-link-nodes.")
        self.counts_path = self.frames_path + ".counts"
        self.count = len(order)
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            status = 1
            try:
                summary = WriteSummary("")
                with os.fdopen(fd, "wb") as out:
                    pending = bytearray()
                    for frame in _frames(node_messages(et_plus, plan, summary, order)):
                        pending += frame
                        if len(pending) >= 1 << 20:
                            out.write(pending)
                            pending.clear()
                    out.write(pending)
                with open(self.counts_path, "wb") as out:
                    out.write(orjson.dumps([summary.counts_by_type, summary.comm_unresolved]))
                status = 0
            finally:
                os._exit(status)
        os.close(fd)

    def collect(self) -> tuple[str, int, dict, dict] | None:
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if status != 0:
            return None
        with open(self.counts_path, "rb") as counts:
            by_type, unresolved = orjson.loads(counts.read())
        return self.frames_path, self.count, by_type, unresolved

    def close(self) -> None:
        """Stop a child still running and delete the temporary files."""
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            self.pid = 0
        for path in (self.frames_path, self.counts_path):
            with contextlib.suppress(OSError):
                os.unlink(path)


def write_chakra_trace(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = ()) -> WriteSummary:
    """Write ``et_plus`` to ``path`` as a Chakra trace (gzip when it ends in ``.gz``) and return
    what was written. Atomic: on any error no file appears and an existing ``path`` is kept;
    ``protected`` paths (the inputs) are refused. A large trace is encoded by two processes, the
    tail of the order in a forked child (``_HalfInChild``); the bytes are the same.
    Cost: see the module docstring."""
    started = time.perf_counter()
    summary = WriteSummary(str(path))
    plan = dependency_plan(et_plus, summary)
    head, tail, child = plan.order, [], None
    if len(plan.order) >= PARALLEL_MIN_NODES and hasattr(os, "fork"):
        middle = len(plan.order) // 2
        head, tail = plan.order[:middle], plan.order[middle:]
        child = _HalfInChild(et_plus, plan, tail)
    try:
        with EtWriter(path, protected) as writer:
            writer.write_metadata(metadata_message(et_plus))
            for frame in _frames(node_messages(et_plus, plan, summary, head)):
                writer.write_frame(frame)
            done = child.collect() if child is not None else None
            if done is not None:
                frames_path, count, by_type, unresolved = done
                summary.counts_by_type.update(by_type)
                summary.comm_unresolved.update(unresolved)
                with open(frames_path, "rb") as frames:
                    writer.write_frames(frames, count)
            elif tail:
                for frame in _frames(node_messages(et_plus, plan, summary, tail)):
                    writer.write_frame(frame)
            summary.nodes = writer.nodes_written
    finally:
        if child is not None:
            child.close()
    summary.seconds = time.perf_counter() - started
    return summary


def write_et_plus_chakra(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = ()) -> None:
    """Pipeline entry point: ``write_chakra_trace`` and log its summary."""
    summary = write_chakra_trace(et_plus, path, protected)
    types = ", ".join(f"{name} {count}" for name, count in sorted(summary.counts_by_type.items()))
    log.info("wrote Chakra trace %s: %d nodes (%s) in %.2fs", path, summary.nodes, types, summary.seconds)
    log.info("waits: %d edges (%d moved past the launching op), skipped %s",
             summary.wait_edges, summary.wait_edges_redirected, dict(summary.waits_skipped) or "none")
    if summary.comm_unresolved:
        log.warning("communication kernels written as COMP_NODE: %s", dict(summary.comm_unresolved))
    if summary.ctrl_deps_dropped:
        log.warning("%d parents missing from the ET: ctrl_deps dropped", summary.ctrl_deps_dropped)

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
  size) and ``pg_name`` (numeric; Kineto "Process Group Name", record_param_comms' pg name, mapped
  through ``## process_group:init ##`` when it is a description; else "0");
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
  The edge goes to W when W comes after the GPU op in the dependency order (W began after the
  launch). Otherwise W is the launching op itself or one of its ancestors (the wait is inside the
  op that launched the work) and an edge to W would be a cycle: a blocking synchronize then
  points at the first linked op of W's thread that starts after the call returns; a
  ``cudaStreamWaitEvent`` at the next GPU op the thread issued (the stream that waited). Waits
  outside any linked op, outside the linked window, or without an op to wait on are counted and
  skipped.

Nodes are written in a topological order of these dependencies (every dependency before its
dependent), ties broken by time, so streaming readers can resolve dependencies as they go.
Cost: O((n + g) log(n + g)) time for n ET nodes and g GPU ops; memory O(n + g) small ints besides
the ET+ itself (no second copy of the graph): each node message is built, written and dropped.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import re
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import msgspec
import orjson

from . import et_def_pb2 as pb
from .chakra_io import EtWriter, encode_varint, make_attr
from .et_reader import FLAT, PROCESS_ROOT_NAMES, EtNode, decode_attrs
from .etplus import EtPlus, GpuNode
from .intervals import TimePoint, innermost_covering

log = logging.getLogger("et_link")

# Chakra schema version this writer targets (the ET schema suffix "chakra.0.0.4").
CHAKRA_SCHEMA_VERSION = "0.0.4"
PROCESS_GROUP_INIT = "## process_group:init ##"
PARAM_COMMS_NAME = "record_param_comms"
# How far above the launching op the collective's nccl:* / record_param_comms / c10d:: ops are looked for.
MAX_COMM_ANCESTORS = 4
MAX_INT64 = (1 << 63) - 1
NO_NODE = -1

# ---------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------

COLL, SEND, RECV = "coll", "send", "recv"

# Normalised name fragment -> collective; longer/more specific fragments first.
_COLLECTIVE_FRAGMENTS = (
    ("alltoall", pb.ALL_TO_ALL),
    ("allreduce", pb.ALL_REDUCE),
    ("allgather", pb.ALL_GATHER),
    ("reducescatter", pb.REDUCE_SCATTER),
    ("broadcast", pb.BROADCAST),
    ("bcast", pb.BROADCAST),
    ("barrier", pb.BARRIER),
    ("gather", pb.GATHER),
    ("scatter", pb.SCATTER),
    ("reduce", pb.REDUCE),
)
_KERNEL_TOKEN = re.compile(r"kernel_([A-Za-z]+)", re.IGNORECASE)

# Bytes per element of the dtype names ET types ("Tensor(float)") and Kineto ("Float") use.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "c10::half": 2, "float16": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long int": 8, "long": 8, "int64": 8, "int": 4, "int32": 4,
    "short int": 2, "short": 2, "int16": 2, "signed char": 1, "char": 1, "int8": 1,
    "unsigned char": 1, "byte": 1, "uint8": 1, "bool": 1, "c10::complex<float>": 8,
    "complexfloat": 8, "c10::complex<double>": 16, "complexdouble": 16, "c10::complex<c10::half>": 4,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
_TENSOR_DTYPE = re.compile(r"Tensor\(([^)]*)\)")


@dataclass(frozen=True)
class CommKind:
    """What a communication kernel is: ``role`` COLL (with ``comm_type``), SEND or RECV."""

    role: str
    comm_type: int | None = None


def is_comm_kernel(node: GpuNode) -> bool:
    """True for NCCL / RCCL kernels (by name). O(len(name))."""
    if node.cat != "kernel":
        return False
    name = node.name.lower()
    return "nccl" in name or "rccl" in name


def kind_from_name(name: str) -> CommKind | None:
    """The collective an op or collective name denotes ("nccl:all_to_all", "all_to_allv",
    "_allgather_base", "send", "c10d::recv_"...), or None. Send+recv together is ambiguous: None."""
    base = name.split(":")[-1] if name.startswith(("nccl:", "rccl:", "gloo:")) else name
    letters = re.sub(r"[^a-z]", "", base.lower())
    has_send, has_recv = "send" in letters, "recv" in letters
    if has_send != has_recv:
        return CommKind(SEND if has_send else RECV)
    if has_send:
        return None
    for fragment, comm_type in _COLLECTIVE_FRAGMENTS:
        if fragment in letters:
            return CommKind(COLL, comm_type)
    return None


def kind_from_kernel(name: str) -> CommKind | None:
    """The collective named by an NCCL kernel ("ncclKernel_AllReduce_RING_LL_Sum_float" ->
    ALL_REDUCE); None for SendRecv / generic kernels, whose meaning is the launching op's."""
    match = _KERNEL_TOKEN.search(name)
    if match is None:
        return None
    kind = kind_from_name(match.group(1))
    return kind if kind is not None and kind.role == COLL else None


# ---------------------------------------------------------------------------------------------
# Tensor sizes
# ---------------------------------------------------------------------------------------------


@dataclass
class OpIO:
    """The decoded inputs (or outputs) of one ET op: parallel lists of values, shapes, types."""

    values: list
    shapes: list
    types: list


class _IOParts(msgspec.Struct):
    """The nested-layout ``inputs``/``outputs`` object, its parts kept as raw JSON text."""

    values: msgspec.Raw = msgspec.Raw(b"[]")
    shapes: msgspec.Raw = msgspec.Raw(b"[]")
    types: msgspec.Raw = msgspec.Raw(b"[]")
    strides: msgspec.Raw = msgspec.Raw(b"")  # empty: absent


def _loads_list(raw: Any) -> list:
    if raw is None or raw is msgspec.UNSET:
        return []
    try:
        value = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def op_inputs(node: EtNode, layout: str) -> OpIO:
    """Decode an ET op's inputs (either layout). Cost: one JSON parse of the inputs."""
    if layout == FLAT:
        return OpIO(_loads_list(node.inputs), _loads_list(node.input_shapes), _loads_list(node.input_types))
    if node.inputs is msgspec.UNSET:
        return OpIO([], [], [])
    try:
        parsed = orjson.loads(bytes(node.inputs))
    except orjson.JSONDecodeError:
        return OpIO([], [], [])
    if not isinstance(parsed, dict):
        return OpIO([], [], [])
    return OpIO(*(parsed.get(key) if isinstance(parsed.get(key), list) else [] for key in ("values", "shapes", "types")))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tensor_bytes(value: Any, shape: Any, dtype: str | None) -> int | None:
    """Bytes of one ET tensor: numel × element size from its value tuple
    ``[tensor_id, storage_id, offset, numel, elem_bytes, device]``, else shape × dtype size."""
    if isinstance(value, list) and len(value) >= 5 and _is_int(value[3]) and _is_int(value[4]):
        return value[3] * value[4]
    size = DTYPE_BYTES.get((dtype or "").strip().lower())
    if size is None or not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        return None
    return math.prod(shape) * size


def tensors_bytes(io: OpIO) -> int | None:
    """Total bytes of the tensor (and tensor-list) entries of ``io``; None when it has none."""
    total, found = 0, False
    for position, type_name in enumerate(io.types):
        if not isinstance(type_name, str) or "Tensor" not in type_name:
            continue
        value = io.values[position] if position < len(io.values) else None
        shape = io.shapes[position] if position < len(io.shapes) else None
        dtypes = _TENSOR_DTYPE.findall(type_name) or [None]
        if type_name.startswith("Tensor"):
            items = [(value, shape, dtypes[0])]
        elif isinstance(value, list):
            shapes = shape if isinstance(shape, list) else []
            items = [(v, shapes[k] if k < len(shapes) else None, dtypes[min(k, len(dtypes) - 1)])
                     for k, v in enumerate(value)]
        else:
            continue
        for item_value, item_shape, dtype in items:
            size = tensor_bytes(item_value, item_shape, dtype)
            if size is not None:
                total += size
                found = True
    return total if found else None


# ---------------------------------------------------------------------------------------------
# Process groups
# ---------------------------------------------------------------------------------------------


@dataclass
class ProcessGroups:
    """From ``## process_group:init ##``: description -> numeric name, name -> global ranks."""

    name_of_desc: dict[str, str] = field(default_factory=dict)
    ranks_of_name: dict[str, list[int]] = field(default_factory=dict)

    def numeric_name(self, candidate: Any) -> str | None:
        """``candidate`` as a numeric pg name (itself, or mapped from a description), or None."""
        if candidate is None:
            return None
        text = str(candidate)
        if text.isdigit():
            return text
        return self.name_of_desc.get(text)


def read_process_groups(et_plus: EtPlus) -> ProcessGroups:
    """Parse every ``## process_group:init ##`` node (first input: a JSON list of group dicts with
    ``pg_name``, ``pg_desc``, ``ranks``). Cost: O(n) name checks + the init nodes' parse."""
    et = et_plus.et
    groups = ProcessGroups()
    for i, name in enumerate(et.names):
        if name != PROCESS_GROUP_INIT:
            continue
        values = op_inputs(et.nodes[i], et.layout).values
        if not values or not isinstance(values[0], str):
            continue
        try:
            config = orjson.loads(values[0])
        except orjson.JSONDecodeError:
            continue
        entries = list(config.values()) if isinstance(config, dict) else config
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or entry.get("pg_name") is None:
                continue
            pg_name = str(entry["pg_name"])
            if entry.get("pg_desc") is not None and pg_name.isdigit():
                groups.name_of_desc.setdefault(str(entry["pg_desc"]), pg_name)
            ranks = entry.get("ranks")
            if isinstance(ranks, list) and all(_is_int(r) for r in ranks):
                groups.ranks_of_name[pg_name] = ranks
    return groups


# ---------------------------------------------------------------------------------------------
# Communication attributes of a GPU op
# ---------------------------------------------------------------------------------------------


@dataclass
class CommOps:
    """The ET ops around a communication kernel (ET indices, -1 when absent)."""

    launcher: int
    collective: int = NO_NODE  # nccl:* / rccl:* user annotation
    param: int = NO_NODE  # record_param_comms
    c10d: int = NO_NODE  # c10d::* op


@dataclass
class CommAttrs:
    """What a comm node carries. ``node_type`` COMP_NODE means it could not be resolved."""

    node_type: int
    comm_type: int | None = None
    comm_size: int | None = None
    pg_name: str | None = None
    comm_src: int | None = None
    comm_dst: int | None = None
    comm_tag: int | None = None
    problem: str | None = None


class CommResolver:
    """Resolves the Chakra communication attributes of NCCL/RCCL kernels. Per kernel O(depth)."""

    def __init__(self, et_plus: EtPlus, index_of_id: dict[int, int]):
        self.et_plus = et_plus
        self.et = et_plus.et
        self.index_of_id = index_of_id
        self.groups = read_process_groups(et_plus)
        self.rank = et_plus.result.kineto.rank
        self._event_of_op = et_plus.result.match.event_of_op
        self._cpu_events = et_plus.result.kineto.cpu_events

    def comm_ops(self, launcher: int) -> CommOps:
        """Find the nccl:* / record_param_comms / c10d:: ops at or above the launching op."""
        ops = CommOps(launcher)
        i, depth = launcher, 0
        while i >= 0 and depth <= MAX_COMM_ANCESTORS:
            name = self.et.names[i]
            if ops.collective < 0 and name.startswith(("nccl:", "rccl:")):
                ops.collective = i
            elif ops.param < 0 and name == PARAM_COMMS_NAME:
                ops.param = i
            elif ops.c10d < 0 and name.startswith("c10d::"):
                ops.c10d = i
            parent = self.index_of_id.get(self.et.parent[i], NO_NODE)
            if parent == i:
                break
            i, depth = parent, depth + 1
        return ops

    def _kineto_args(self, et_index: int):
        if et_index < 0:
            return None
        event = self._event_of_op[et_index]
        return self._cpu_events[event].args if event >= 0 else None

    def _param_inputs(self, ops: CommOps) -> OpIO | None:
        return op_inputs(self.et.nodes[ops.param], self.et.layout) if ops.param >= 0 else None

    def kind(self, gpu: GpuNode, gpu_args, ops: CommOps, param_io: OpIO | None) -> CommKind | None:
        """Kernel name first (explicit collectives), then the launching ops' names, then Kineto."""
        kind = kind_from_kernel(gpu.name)
        if kind is not None:
            return kind
        names = []
        if ops.collective >= 0:
            names.append(self.et.names[ops.collective])
        if param_io is not None:
            names.append(_collective_name(param_io))
        if ops.c10d >= 0:
            names.append(self.et.names[ops.c10d])
        if gpu_args is not None:
            names.append(gpu_args.collective_name)
        for name in names:
            if name:
                kind = kind_from_name(name)
                if kind is not None:
                    return kind
        return None

    def size(self, ops: CommOps, param_io: OpIO | None, gpu_args) -> int | None:
        """Bytes moved: the collective op's input tensors, else record_param_comms' tensor
        inputs, else Kineto "In msg nelems" × dtype size (kernel's args, then the ops')."""
        if ops.collective >= 0:
            size = tensors_bytes(op_inputs(self.et.nodes[ops.collective], self.et.layout))
            if size:
                return size
        if param_io is not None:
            size = tensors_bytes(param_io)
            if size:
                return size
        for args in (gpu_args, self._kineto_args(ops.param), self._kineto_args(ops.collective)):
            if args is not None and args.in_msg_nelems and args.dtype:
                element = DTYPE_BYTES.get(args.dtype.lower())
                if element:
                    return args.in_msg_nelems * element
        return None

    def pg_name(self, gpu: GpuNode, ops: CommOps, param_io: OpIO | None) -> str:
        """Numeric process-group name; "0" (the default group) when the trace does not say."""
        candidates: list[Any] = []
        if gpu.pg_name is not msgspec.UNSET:
            candidates.append(gpu.pg_name)
        for et_index in (ops.param, ops.collective):
            args = self._kineto_args(et_index)
            if args is not None:
                candidates.append(args.pg_name)
        if param_io is not None:
            candidates += _pg_candidates(param_io)
        for candidate in candidates:
            name = self.groups.numeric_name(candidate)
            if name is not None:
                return name
        return "0"

    def resolve(self, gpu: GpuNode, gpu_args, launcher: int) -> CommAttrs:
        """The node type and comm attributes of one communication kernel."""
        ops = self.comm_ops(launcher)
        param_io = self._param_inputs(ops)
        kind = self.kind(gpu, gpu_args, ops, param_io)
        if kind is None:
            return CommAttrs(pb.COMP_NODE, problem="comm kind unknown")
        size = self.size(ops, param_io, gpu_args)
        if not size or size <= 0:
            return CommAttrs(pb.COMP_NODE, problem="comm size unknown")
        pg_name = self.pg_name(gpu, ops, param_io)
        if kind.role == COLL:
            return CommAttrs(pb.COMM_COLL_NODE, comm_type=kind.comm_type, comm_size=size, pg_name=pg_name)
        peer = _peer_rank(param_io, self.groups.ranks_of_name.get(pg_name))
        if peer is None:
            return CommAttrs(pb.COMP_NODE, problem="point-to-point peer unknown")
        attrs = CommAttrs(pb.COMM_SEND_NODE if kind.role == SEND else pb.COMM_RECV_NODE,
                          comm_size=size, pg_name=pg_name)
        if kind.role == SEND:
            attrs.comm_src, attrs.comm_dst = self.rank, peer
        else:
            attrs.comm_src, attrs.comm_dst = peer, self.rank
        if ops.c10d >= 0:
            attrs.comm_tag = _last_int(op_inputs(self.et.nodes[ops.c10d], self.et.layout))
        return attrs


def _collective_name_position(io: OpIO) -> int:
    """Position of record_param_comms' collective-name argument (its first non-numeric string)."""
    for position, value in enumerate(io.values):
        if isinstance(value, str) and value and not value.isdigit():
            return position
    return NO_NODE


def _collective_name(io: OpIO) -> str | None:
    position = _collective_name_position(io)
    return io.values[position] if position >= 0 else None


def _pg_candidates(io: OpIO) -> list[Any]:
    """record_param_comms' process-group arguments: a (pg_name, pg_desc) pair of strings
    (PyTorch >= 2.2) or a numeric string. (PyTorch 2.0 records a pointer: not a name.)"""
    out: list[Any] = []
    for value in io.values:
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            out += value
        elif isinstance(value, str) and value.isdigit():
            out.append(value)
    return out


def _peer_rank(io: OpIO | None, group_ranks: list[int] | None) -> int | None:
    """Peer of a send/recv: record_param_comms' rank argument (just before the collective name),
    mapped from group-local to global rank when the group's ranks are known."""
    if io is None:
        return None
    position = _collective_name_position(io)
    if position < 1 or not _is_int(io.values[position - 1]):
        return None
    peer = io.values[position - 1]
    if group_ranks and 0 <= peer < len(group_ranks):
        return group_ranks[peer]
    return peer


def _last_int(io: OpIO) -> int | None:
    for value in reversed(io.values):
        if _is_int(value):
            return value
    return None


# ---------------------------------------------------------------------------------------------
# Dependency plan
# ---------------------------------------------------------------------------------------------


@dataclass
class GpuPlacement:
    """Per GPU node k: its (device, stream), issue (launch) time and issuing Kineto thread."""

    stream_key: list[tuple]
    issue_ts: list[float]
    issue_thread: list[tuple | None]


@dataclass
class IssueIndex:
    """GPU ops grouped for "last op issued before t" lookups: per key, issue times (sorted) and
    the GPU node numbers in that order. Lookups are one bisect: O(log g)."""

    times: dict[Any, list[float]] = field(default_factory=dict)
    nodes: dict[Any, list[int]] = field(default_factory=dict)

    @staticmethod
    def build(keys: list, issue_ts: list[float]) -> IssueIndex:
        grouped: dict[Any, list[int]] = {}
        for k, key in enumerate(keys):
            if key is not None:
                grouped.setdefault(key, []).append(k)
        index = IssueIndex()
        for key, members in grouped.items():
            members.sort(key=lambda k: (issue_ts[k], k))
            index.nodes[key] = members
            index.times[key] = [issue_ts[k] for k in members]
        return index

    def last_before(self, key: Any, t: float) -> int:
        """The last GPU node of ``key`` issued at or before ``t`` (-1 if none)."""
        times = self.times.get(key)
        if not times:
            return NO_NODE
        position = bisect_right(times, t)
        return self.nodes[key][position - 1] if position else NO_NODE

    def first_after(self, key: Any, t: float) -> int:
        """The first GPU node of ``key`` issued after ``t`` (-1 if none)."""
        times = self.times.get(key)
        if not times:
            return NO_NODE
        position = bisect_right(times, t)
        return self.nodes[key][position] if position < len(times) else NO_NODE


@dataclass
class WriteSummary:
    """What ``write_chakra_trace`` wrote and decided."""

    path: str
    nodes: int = 0
    counts_by_type: Counter = field(default_factory=Counter)
    wait_calls: Counter = field(default_factory=Counter)  # runtime wait calls seen, by name
    wait_edges: int = 0  # edges GPU op -> the op that waited
    wait_edges_redirected: int = 0  # edges moved to the next op (the wait was inside the launcher)
    waits_skipped: Counter = field(default_factory=Counter)  # reason -> count
    comm_unresolved: Counter = field(default_factory=Counter)  # reason -> comm kernels as COMP_NODE
    ctrl_deps_dropped: int = 0  # parents missing from the ET (roots' self-parents not counted)
    seconds: float = 0.0


@dataclass
class DependencyPlan:
    """Dependencies of every node in one numbering: ET node i is i, GPU node k is n + k.

    ``ctrl[u]``: parent (-1 none). ``prev[u]``: previous node of u's CPU thread chain, or, for a
    GPU node, the previous op on its stream (-1 none); a GPU node's launcher is ``ctrl[u]``.
    ``waits[u]``: extra GPU sources u waits for. ``order``: topological write order.
    """

    cpu_count: int
    ctrl: array
    prev: array
    waits: dict[int, list[int]]
    order: list[int]
    position: array


def _preorder(et, index_of_id: dict[int, int], summary: WriteSummary) -> tuple[list[int], array]:
    """ET indices in start order (tree pre-order, siblings by id) and the ctrl parent of each
    (-1 for roots and dropped parents). Nodes under a parent cycle follow in id order, keeping a
    parent only when it comes earlier. O(n log n)."""
    n = len(et.nodes)
    parent = array("q", [NO_NODE]) * n
    by_id = sorted(range(n), key=et.ids.__getitem__)
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for i in by_id:
        p = index_of_id.get(et.parent[i], NO_NODE)
        if p == i or p < 0:
            if p < 0 and et.names[i] not in PROCESS_ROOT_NAMES:
                summary.ctrl_deps_dropped += 1
            roots.append(i)
            continue
        parent[i] = p
        children.setdefault(p, []).append(i)
    order: list[int] = []
    seen = bytearray(n)
    for root in roots:
        stack = [root]
        while stack:
            i = stack.pop()
            seen[i] = 1
            order.append(i)
            stack.extend(reversed(children.get(i, ())))
    if len(order) < n:  # parent cycles: not reachable from a root
        rank = {i: r for r, i in enumerate(order)}
        for i in by_id:
            if not seen[i]:
                if parent[i] not in rank:
                    parent[i] = NO_NODE
                    summary.ctrl_deps_dropped += 1
                rank[i] = len(order)
                order.append(i)
    return order, parent


def _gpu_placement(et_plus: EtPlus) -> GpuPlacement:
    stream_key, issue_ts, issue_thread = [], [], []
    for node, link in zip(et_plus.gpu_nodes, et_plus.gpu_links):
        stream_key.append((node.device, node.stream))
        launch = link.launch
        issue_ts.append(launch.ts if launch is not None else link.event.ts)
        issue_thread.append((launch.pid, launch.tid) if launch is not None else None)
    return GpuPlacement(stream_key, issue_ts, issue_thread)


def _time_keys(et_plus: EtPlus, placement: GpuPlacement) -> list[float]:
    """Priority of each node in the write order: linked start (CPU) or issue time (GPU);
    -inf for unlinked CPU ops (written as soon as their dependencies are)."""
    keys = [node.ts if node.ts is not msgspec.UNSET else -math.inf for node in et_plus.et.nodes]
    keys += placement.issue_ts
    return keys


def _topological_order(ctrl: array, prev: array, keys: list[float], ids: list[int]) -> list[int]:
    """Kahn's algorithm over the ctrl + prev edges, taking the ready node with the smallest
    (time key, id) first. O((V + E) log V). Raises RuntimeError if the edges have a cycle."""
    total = len(ctrl)
    indegree = array("q", [0]) * total
    out_count = array("q", [0]) * (total + 1)
    for u in range(total):
        for d in (ctrl[u], prev[u] if prev[u] != ctrl[u] else NO_NODE):
            if d >= 0:
                indegree[u] += 1
                out_count[d + 1] += 1
    for u in range(total):
        out_count[u + 1] += out_count[u]
    fill = array("q", out_count)
    targets = array("q", [0]) * out_count[total]
    for u in range(total):
        for d in (ctrl[u], prev[u] if prev[u] != ctrl[u] else NO_NODE):
            if d >= 0:
                targets[fill[d]] = u
                fill[d] += 1
    ready = [(keys[u], ids[u], u) for u in range(total) if indegree[u] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, _, u = heapq.heappop(ready)
        order.append(u)
        for t in range(out_count[u], out_count[u + 1]):
            v = targets[t]
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, (keys[v], ids[v], v))
    if len(order) != total:
        raise RuntimeError(f"internal error: dependency cycle among {total - len(order)} nodes")
    return order


def plan_dependencies(et_plus: EtPlus, index_of_id: dict[int, int], summary: WriteSummary) -> DependencyPlan:
    """ctrl / thread-chain / launcher / stream dependencies, the write order, then the waits."""
    et = et_plus.et
    n, g = len(et.nodes), len(et_plus.gpu_nodes)
    preorder, parent = _preorder(et, index_of_id, summary)
    ctrl = array("q", parent) + array("q", [NO_NODE]) * g
    prev = array("q", [NO_NODE]) * (n + g)
    last_on_thread: dict[int, int] = {}
    for i in preorder:
        tid = et.tid[i]
        prev[i] = last_on_thread.get(tid, NO_NODE)
        last_on_thread[tid] = i
    placement = _gpu_placement(et_plus)
    for k, link in enumerate(et_plus.gpu_links):
        ctrl[n + k] = link.et_index
    last_on_stream: dict[tuple, int] = {}
    gpu_nodes = et_plus.gpu_nodes
    for k in sorted(range(g), key=lambda k: (gpu_nodes[k].ts, gpu_nodes[k].id)):
        key = placement.stream_key[k]
        prev[n + k] = last_on_stream.get(key, NO_NODE)
        last_on_stream[key] = n + k
    ids = et.ids + [node.id for node in gpu_nodes]
    order = _topological_order(ctrl, prev, _time_keys(et_plus, placement), ids)
    position = array("q", [0]) * (n + g)
    for p, u in enumerate(order):
        position[u] = p
    plan = DependencyPlan(n, ctrl, prev, {}, order, position)
    add_wait_edges(et_plus, plan, placement, summary)
    return plan


# ---------------------------------------------------------------------------------------------
# Waits
# ---------------------------------------------------------------------------------------------

DEVICE_SYNC, STREAM_SYNC, STREAM_WAIT_EVENT = "device_sync", "stream_sync", "stream_wait_event"
WAIT_CALLS = {
    "cudaDeviceSynchronize": DEVICE_SYNC, "cuCtxSynchronize": DEVICE_SYNC, "hipDeviceSynchronize": DEVICE_SYNC,
    "cudaStreamSynchronize": STREAM_SYNC, "cuStreamSynchronize": STREAM_SYNC, "hipStreamSynchronize": STREAM_SYNC,
    "cudaEventSynchronize": STREAM_SYNC, "cuEventSynchronize": STREAM_SYNC, "hipEventSynchronize": STREAM_SYNC,
    "cudaStreamWaitEvent": STREAM_WAIT_EVENT, "cuStreamWaitEvent": STREAM_WAIT_EVENT,
    "hipStreamWaitEvent": STREAM_WAIT_EVENT,
}


@dataclass
class WaitContext:
    """Lookup structures for wait resolution, built once. Memory O(g + linked ops)."""

    placement: GpuPlacement
    by_stream: IssueIndex
    by_thread: IssueIndex
    by_thread_stream: IssueIndex
    thread_streams: dict[tuple, list[tuple]]
    linked_starts: dict[int, list[float]]  # ET tid -> linked op start times, sorted
    linked_ops: dict[int, list[int]]  # ET tid -> linked ET indices in that order


def _wait_context(et_plus: EtPlus, placement: GpuPlacement) -> WaitContext:
    et = et_plus.et
    threads = placement.issue_thread
    pairs = [(t, s) if t is not None else None for t, s in zip(threads, placement.stream_key)]
    thread_streams: dict[tuple, list[tuple]] = {}
    for pair in set(p for p in pairs if p is not None):
        thread_streams.setdefault(pair[0], []).append(pair[1])
    linked: dict[int, list[int]] = {}
    for i, node in enumerate(et.nodes):
        if node.ts is not msgspec.UNSET and not et.is_root(i):
            linked.setdefault(et.tid[i], []).append(i)
    starts = {}
    for tid, ops in linked.items():
        ops.sort(key=lambda i: (et.nodes[i].ts, et.ids[i]))
        starts[tid] = [et.nodes[i].ts for i in ops]
    return WaitContext(
        placement,
        IssueIndex.build(placement.stream_key, placement.issue_ts),
        IssueIndex.build(list(threads), placement.issue_ts),
        IssueIndex.build(pairs, placement.issue_ts),
        thread_streams, starts, linked,
    )


def _waited_on(call, kind: str, ctx: WaitContext) -> list[int]:
    """GPU node numbers the call waited for (rules in the module docstring)."""
    t = call.ts
    thread = (call.pid, call.tid)
    if kind == DEVICE_SYNC:
        found = (ctx.by_stream.last_before(key, t) for key in ctx.by_stream.nodes)
        return [k for k in found if k >= 0]
    if kind == STREAM_SYNC:
        stream = _named_stream(call, ctx)
        if stream is None:
            last = ctx.by_thread.last_before(thread, t)
            stream = ctx.placement.stream_key[last] if last >= 0 else None
        k = ctx.by_stream.last_before(stream, t) if stream is not None else NO_NODE
        return [k] if k >= 0 else []
    following = ctx.by_thread.first_after(thread, t)
    waiting = ctx.placement.stream_key[following] if following >= 0 else None
    latest, source_stream = -math.inf, None
    for stream in ctx.thread_streams.get(thread, ()):
        if stream == waiting:
            continue
        k = ctx.by_thread_stream.last_before((thread, stream), t)
        if k >= 0 and ctx.placement.issue_ts[k] > latest:
            latest, source_stream = ctx.placement.issue_ts[k], stream
    k = ctx.by_stream.last_before(source_stream, t) if source_stream is not None else NO_NODE
    return [k] if k >= 0 else []


def _named_stream(call, ctx: WaitContext) -> tuple | None:
    """The (device, stream) a runtime call names in its args, when Kineto records one."""
    stream = call.args.stream
    if stream is None:
        return None
    for key in ctx.by_stream.nodes:
        if key[1] == stream and (call.args.device is None or key[0] == call.args.device):
            return key
    return None


def _redirect_target(call, kind: str, waiter: int, ctx: WaitContext, et, n: int) -> int:
    """Where a wait goes when its own op launched the work: for a blocking synchronize, the first
    linked op of the waiter's thread starting at or after the call's end; for
    cudaStreamWaitEvent, the next GPU op the calling thread issued. -1 if none."""
    if kind == STREAM_WAIT_EVENT:
        k = ctx.by_thread.first_after((call.pid, call.tid), call.ts)
        return n + k if k >= 0 else NO_NODE
    tid = et.tid[waiter]
    starts = ctx.linked_starts.get(tid)
    if not starts:
        return NO_NODE
    position = bisect_left(starts, call.ts + call.dur)
    return ctx.linked_ops[tid][position] if position < len(starts) else NO_NODE


def _wait_calls(et_plus: EtPlus) -> list:
    """The Kineto runtime events that are waits, inside the linked window if there is one."""
    window = et_plus.result.window
    calls = []
    for event in et_plus.result.kineto.runtime_events:
        if event.name in WAIT_CALLS and (window is None or window.contains(event.ts)):
            calls.append(event)
    return calls


def _waiting_ops(et_plus: EtPlus, calls: list) -> list[int]:
    """For each call, the innermost linked ET op covering it (-1 if none). O((n + w) log(n + w))."""
    result = et_plus.result
    events = result.kineto.cpu_events
    op_of_event = [NO_NODE] * len(events)
    for i, e in enumerate(result.match.event_of_op):
        if e >= 0:
            op_of_event[e] = i
    points = [TimePoint(call.pid, call.tid, call.ts) for call in calls]
    waiting = []
    for e in innermost_covering(events, points):
        while e >= 0 and op_of_event[e] < 0:
            e = result.parents[e]
        waiting.append(op_of_event[e] if e >= 0 else NO_NODE)
    return waiting


def add_wait_edges(et_plus: EtPlus, plan: DependencyPlan, placement: GpuPlacement, summary: WriteSummary) -> None:
    """Add the wait edges to ``plan.waits``; only edges that go forward in ``plan.order`` are
    kept, so the order stays topological and the graph acyclic. O(w log g) for w wait calls."""
    calls = _wait_calls(et_plus)
    if not calls or not et_plus.gpu_nodes:
        summary.wait_calls.update(call.name for call in calls)
        if calls:
            summary.waits_skipped["no GPU op to wait on"] += len(calls)
        return
    ctx = _wait_context(et_plus, placement)
    n, position, et = plan.cpu_count, plan.position, et_plus.et
    for call, waiter in zip(calls, _waiting_ops(et_plus, calls)):
        summary.wait_calls[call.name] += 1
        if waiter < 0:
            summary.waits_skipped["call outside linked ops"] += 1
            continue
        kind = WAIT_CALLS[call.name]
        sources = _waited_on(call, kind, ctx)
        if not sources:
            summary.waits_skipped["no GPU op to wait on"] += 1
            continue
        for k in sources:
            source = n + k
            target, redirected = waiter, False
            if position[target] <= position[source]:
                target, redirected = _redirect_target(call, kind, waiter, ctx, et, n), True
            if target < 0 or target == source or position[target] <= position[source]:
                summary.waits_skipped["no later op to carry the wait"] += 1
                continue
            targets = plan.waits.setdefault(target, [])
            if source in targets or plan.prev[target] == source or plan.ctrl[target] == source:
                continue
            targets.append(source)
            summary.wait_edges += 1
            summary.wait_edges_redirected += redirected


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
            parts = _IO_DECODER.decode(bytes(raw))
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

    def _int64_attr(self, name: str, value: int) -> bytes:
        name_field = self._name_fields.get(name)
        if name_field is None:
            encoded_name = name.encode("utf-8")
            name_field = self._name_fields[name] = b"\x0a" + encode_varint(len(encoded_name)) + encoded_name
        body = name_field + b"\x48" + encode_varint(value & 0xFFFF_FFFF_FFFF_FFFF)
        return b"\x52" + encode_varint(len(body)) + body

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
        pairs = _cpu_attr_pairs(node, flat)
        own = [pair for pair in pairs if pair[0] in _PER_OP_ATTRS]
        shared = tuple(pair for pair in pairs if pair[0] not in _PER_OP_ATTRS)
        try:
            blob = self._blobs.get(shared)
            cacheable = True
        except TypeError:  # a list value: not hashable
            blob, cacheable = None, False
        if blob is None:
            blob = self.encode_all(_specs_of(shared))
            if cacheable and len(self._blobs) < self._max_entries:
                self._blobs[shared] = blob
        return self.encode(_IS_CPU_OP) + self.encode_all(_specs_of(own)) + blob


_IS_CPU_OP = ("is_cpu_op", "bool_val", True)
_FLAT_ATTRS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema")
_PER_OP_ATTRS = frozenset({"rf_id", "seq_id"})  # about unique per op: not cached in combination


def _cpu_attr_pairs(node: EtNode, flat: bool) -> list[tuple[str, Any]]:
    """The ET node's own metadata as (name, value), in file order (flat keys or ``attrs``)."""
    if flat:
        pairs = [(name, getattr(node, name)) for name in _FLAT_ATTRS]
    elif node.attrs is not msgspec.UNSET:
        pairs = [(attr.name, attr.value) for attr in decode_attrs(node)]
    else:
        return []
    return [(name, value) for name, value in pairs
            if value is not msgspec.UNSET and value is not None and name != "is_cpu_op"]


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
    yield "pg_name", "string_val", comm.pg_name or "0"


def _dependency_ids(plan: DependencyPlan, u: int, ids: list[int]) -> tuple[list[int], list[int]]:
    ctrl = [ids[plan.ctrl[u]]] if plan.ctrl[u] >= 0 else []
    data: list[int] = []
    if u >= plan.cpu_count and plan.ctrl[u] >= 0:
        data.append(plan.ctrl[u])  # a GPU op runs after its launching op
    if plan.prev[u] >= 0 and plan.prev[u] not in data:
        data.append(plan.prev[u])
    data += plan.waits.get(u, ())
    return ctrl, [ids[d] for d in data]


class _Ids:
    """Node id of a node number (ET ids, then GPU node ids) without a combined list."""

    def __init__(self, et_plus: EtPlus):
        self._cpu = et_plus.et.ids
        self._gpu = et_plus.gpu_nodes
        self._n = len(self._cpu)

    def __getitem__(self, u: int) -> int:
        return self._cpu[u] if u < self._n else self._gpu[u - self._n].id


def node_messages(et_plus: EtPlus, plan: DependencyPlan, resolver: CommResolver,
                  summary: WriteSummary) -> Iterator[pb.Node]:
    """One ``Node`` per ET node and GPU op, in ``plan.order``, built on demand."""
    et = et_plus.et
    flat = et.layout == FLAT
    ids = _Ids(et_plus)
    attrs = AttrEncoder()
    n = plan.cpu_count
    for u in plan.order:
        ctrl, data = _dependency_ids(plan, u, ids)
        if u < n:
            node = et.nodes[u]
            node_type = pb.METADATA_NODE if node.name == PROCESS_GROUP_INIT else pb.COMP_NODE
            message = pb.Node(id=node.id, name=node.name, type=node_type, ctrl_deps=ctrl, data_deps=data)
            _set_times(message, node.ts, node.dur)
            fill_io(message, node, flat)
            message.MergeFromString(attrs.cpu_attr_bytes(node, flat))
        else:
            k = u - n
            node, link = et_plus.gpu_nodes[k], et_plus.gpu_links[k]
            comm = resolver.resolve(node, link.event.args, link.et_index) if is_comm_kernel(node) else None
            if comm is not None and comm.problem:
                summary.comm_unresolved[comm.problem] += 1
            node_type = comm.node_type if comm is not None else pb.COMP_NODE
            message = pb.Node(id=node.id, name=node.name, type=node_type, ctrl_deps=ctrl, data_deps=data)
            _set_times(message, node.ts, node.dur)
            fill_io(message, node, flat)
            message.MergeFromString(attrs.encode_all(gpu_attrs(node, et.tid[link.et_index], comm)))
        summary.counts_by_type[pb.NodeType.Name(message.type)] += 1
        yield message


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def write_chakra_trace(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = ()) -> WriteSummary:
    """Write ``et_plus`` to ``path`` as a Chakra trace (gzip when it ends in ``.gz``) and return
    what was written. Atomic: on any error no file appears and an existing ``path`` is kept;
    ``protected`` paths (the inputs) are refused. Cost: see the module docstring."""
    started = time.perf_counter()
    summary = WriteSummary(str(path))
    index_of_id = et_plus.et.index_of_id()
    plan = plan_dependencies(et_plus, index_of_id, summary)
    resolver = CommResolver(et_plus, index_of_id)
    with EtWriter(path, protected) as writer:
        writer.write_metadata(metadata_message(et_plus))
        for message in node_messages(et_plus, plan, resolver, summary):
            writer.write_node(message)
        summary.nodes = writer.nodes_written
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

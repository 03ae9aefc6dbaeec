"""Chakra ``Node`` messages as protobuf wire bytes, written directly (no message objects): one
encoder, ``NodeFrames``, for every node kind (CPU ops, and GPU ops: kernels, copies, collectives,
point-to-point).

A ``Node``'s fields, in field-number order as protobuf writes them (tags named from the schema's
descriptors, ``protobuf_wire.tags``): ``id``, ``name``, ``type``, ``ctrl_deps``, ``data_deps``
(packed), ``start_time_micros``, ``duration_micros``, ``inputs``, ``outputs``, then ``attr``:
- a CPU op: duration = its busy time (``plan.busy.sim``); the ET's own fields
  (``chakra_fields.EtOnlyFields``: inputs, outputs, ``is_cpu_op`` true and the ET's attributes),
  then its time split (``inclusive_dur_micros``, ``exclusive_dur_micros``, ``blocked_micros`` when
  linked, ``host_gap_micros`` and ``deferred_micros`` when > 0: ``plan.busy``); duration rounded
  as a running total over its thread's ops (``whole_microseconds``);
- a later piece of a CPU op (``plan.later_pieces``): the op's name, ``COMP_NODE``, the op as its
  ``ctrl_deps``, its measured start and busy time, ``is_cpu_op``, ``tid``, ``continues`` (the op's
  id) and ``inclusive_dur_micros`` (where it lay);
- a CPU collective (``plan.cpu_comm``: gloo, MPI, UCC): a communication node whose duration is its
  busy time, its inputs/outputs, ``cpu_comm_attrs`` (not the ET's CPU-op attributes), then its time
  split as a CPU op's;
- a GPU op: type from its communication attributes (``plan.comm``), duration = its own; its
  inputs/outputs, then ``gpu_attrs``;
- all: last, ``data_dep_causes`` (one cause per data dependency, same order).
Proto3 defaults are left out, strings are UTF-8: the bytes are those protobuf serialises for the
same message (the tests build every message with protobuf and compare).

How: the fields every node has (id, name and type, parent, dependencies, times, time split,
causes) are columns over the plan's node numbers, made once per output; a chunk of the write
order takes its rows of each and writes them a field at a time (``_Rows``: a field is a block of
bytes a node, the message its fields side by side). A new ``Node`` field is one more line in
``NodeFrames._leading_fields`` or ``_trailing_fields``, in its place by field number. The fields
of any size that only some nodes have (the ET's inputs, outputs and attributes; a GPU op's or a
collective's attributes) are encoded op by op, what repeats once (``chakra_fields``' caches).
Cost: O(nodes) array passes for the columns; per chunk, array passes over its nodes' fixed
fields, one Python step per node for its own fields and the join; memory: the columns (a few
int64 entries a node) and one chunk of output.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from operator import attrgetter
from typing import Iterator

import numpy as np

from linker.model import et_def_pb2 as pb
from linker.plan.comm import PROCESS_GROUP_INIT, WORLD_GROUP_ID, CommAttrs, is_int
from linker.plan.dependency_plan import PARENT, THREAD_ORDER, chain_is_parent
from linker.read.et import FLAT, UNSET
from linker.write.chakra_attrs import ATTR, AttrEncoder, AttrSpec, int64_head
from linker.write.chakra_fields import EtOnlyFields
from linker.write.protobuf_wire import delimited, encode_varint, packed, tags, varint_rows

# AttrEncoder and EtOnlyFields: what a child encoding the ET's fields ahead needs (``schedule.fields_child``).
__all__ = ["AttrEncoder", "EtOnlyFields", "NodeFrames", "TYPE_NAMES", "cpu_comm_attrs", "cpu_node_type_of",
           "gpu_attrs"]

_ID, _NAME, _TYPE, _CTRL_DEPS, _DATA_DEPS, _START, _DURATION = tags(
    pb.Node, "id", "name", "type", "ctrl_deps", "data_deps", "start_time_micros", "duration_micros")
TYPE_NAMES = {value: pb.NodeType.Name(value) for value in pb.NodeType.values()}
# A later piece's ``continues``, then a CPU op's time split (a piece has the span it lay over and
# its host gap), written in this order.
TIME_SPLIT = ("continues", "inclusive_dur_micros", "exclusive_dur_micros", "blocked_micros", "host_gap_micros",
            "deferred_micros")


def cpu_node_type_of(name: str) -> int:
    """An ET op's node type: ``METADATA_NODE`` for the process-group record, else ``COMP_NODE``."""
    return pb.METADATA_NODE if name == PROCESS_GROUP_INIT else pb.COMP_NODE


def gpu_node_type_of(comm: CommAttrs | None) -> int:
    """A GPU op's node type: its communication kind, else ``COMP_NODE``."""
    return pb.COMP_NODE if comm is None else comm.node_type


def gpu_attrs(node, tid: int, comm: CommAttrs | None) -> Iterator[AttrSpec]:
    """A GPU op's attributes: ``is_cpu_op`` false, the launcher's ``tid``, placement ids, then
    the communication attributes of a communication node."""
    yield "is_cpu_op", "bool_val", False
    yield "tid", "int64_val", tid
    for name in ("stream", "device", "correlation"):
        value = getattr(node, name)
        if is_int(value):
            yield name, "int64_val", value
    if comm is None or comm.node_type == pb.COMP_NODE:
        return
    yield from _comm_attrs(comm)


def _comm_attrs(comm: CommAttrs) -> Iterator[AttrSpec]:
    """A communication node's own attributes, GPU or CPU alike: its type, bytes, a send's or
    receive's peers and tag, its group."""
    if comm.comm_type is not None:
        yield "comm_type", "int64_val", comm.comm_type
    yield "comm_size", "int64_val", comm.comm_size
    for name in ("comm_src", "comm_dst", "comm_tag"):
        value = getattr(comm, name)
        if value is not None:
            yield name, "int64_val", value
    yield "pg_name", "string_val", comm.pg_name or WORLD_GROUP_ID


def cpu_comm_attrs(tid: int, comm: CommAttrs) -> Iterator[AttrSpec]:
    """A CPU collective's, send's or receive's attributes (``plan.cpu_comm``): ``is_cpu_op`` false
    (ASTRA-sim refuses a communication node on the CPU), its measured thread, its communication
    attributes (a send's or receive's peers and tag), and a collective's issue number in the group
    (``comm_seq``), by which ranks pair collectives."""
    yield "is_cpu_op", "bool_val", False
    yield "tid", "int64_val", tid
    yield from _comm_attrs(comm)
    if comm.seq is not None:
        yield "comm_seq", "int64_val", comm.seq


def whole_microseconds(sim, tid: list[int], owners=()) -> list[int]:
    """Each CPU node's busy time in whole µs, rounded as one running total over the nodes taken
    thread by thread (``tid``: threads by number, ET order within each), not one by one: a node's
    value is the rounded running total up to it less that up to the node before. ``sim`` holds the
    n ET nodes' values, then those of the later pieces, piece j being node n + j of op
    ``owners[j]``: each piece comes right after its op (its pieces in their order), so an op's
    nodes together are within 1 µs of its busy time too. Each value is within 1 µs of the node's
    own and never negative, and a thread's sum is within 1 µs of its total (rounding each node
    alone can lose up to 0.5 µs a node, and many short ops lean one way). Array passes: a sort
    into that order, a running sum (added in order), rounding half to even as ``round`` does, a
    difference; O((n + p) log(n + p))."""
    n, p = len(tid), len(owners)
    node = np.concatenate((np.arange(n), np.asarray(owners, dtype=np.int64)))  # the op of each value
    is_piece = np.concatenate((np.zeros(n, dtype=np.int8), np.ones(p, dtype=np.int8)))
    sequence = np.lexsort((is_piece, node))  # each op, then its pieces in their order
    order = sequence[np.argsort(np.asarray(tid)[node][sequence], kind="stable")]
    running = np.rint(np.cumsum(np.asarray(sim, dtype=np.float64)[order])).astype(np.int64)
    whole = np.empty(n + p, dtype=np.int64)
    whole[order] = np.diff(running, prepend=0)
    return whole.tolist()


def _whole(nodes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Field ``name`` of each node in whole µs (rounded half to even, as ``round``; 0 where it is
    unset or null), and whether it is set (null counts as set). O(nodes)."""
    values = list(map(attrgetter(name), nodes))
    numbers = np.array([0.0 if value is UNSET or value is None else value for value in values], dtype=np.float64)
    return np.rint(numbers).astype(np.int64), np.array([value is not UNSET for value in values], dtype=bool)


def _ids_of(ids: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """The written id of each node number in ``numbers`` (-1 stays -1: no node)."""
    return np.where(numbers >= 0, ids[np.maximum(numbers, 0)], -1)


def _column(numbers: array) -> np.ndarray:
    """A plan column (``array("q")``) as an int64 array (a copy: the plan keeps its own)."""
    return np.array(numbers, dtype=np.int64)


class _Rows:
    """Fields of a chunk's nodes side by side: each field a block of rows (a uint8 matrix, row i
    node i's bytes of the field from the row's start) with each row's length (0: the node leaves
    the field out). ``cut`` joins each node's fields in the order added, node after node: the
    fields of a message in field-number order. Array passes, O(nodes * the blocks' widths)."""

    def __init__(self, count: int):
        self.count = count
        self._blocks: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []

    def add(self, block: np.ndarray, lengths: np.ndarray) -> None:
        if lengths.any():
            self._blocks.append(block)
            self._lengths.append(lengths)

    def extend(self, other: "_Rows") -> None:
        """``other``'s fields after these."""
        self._blocks += other._blocks
        self._lengths += other._lengths

    def varints(self, values: np.ndarray, present: np.ndarray, before: bytes = b"") -> None:
        """The varints of ``values`` in the rows where ``present``, each after ``before`` (a
        field's tag, an attribute's head)."""
        self.encoded(*varint_rows(np.where(present, values, 0)), present, before)

    def encoded(self, block: np.ndarray, lengths: np.ndarray, present: np.ndarray, before: bytes = b"") -> None:
        """Rows already encoded (``varint_rows``' block and lengths), in the rows where
        ``present``, each after ``before``."""
        if before:
            head = np.frombuffer(before, dtype=np.uint8)
            block = np.hstack((np.broadcast_to(head, (self.count, len(head))), block))
        self.add(block, np.where(present, lengths + len(before), 0))

    def entries(self, codes: np.ndarray, table: list[bytes]) -> None:
        """Entry ``codes[i]`` of ``table`` in row i (a field that repeats over many nodes)."""
        used, taken = np.unique(codes, return_inverse=True)
        block, lengths = _block([table[code] for code in used.tolist()])
        self.add(block[taken.ravel()], lengths[taken.ravel()])

    def some(self, rows: list[int], fields: list[bytes]) -> None:
        """``fields[k]`` in row ``rows[k]``; nothing in the other rows."""
        block, lengths = _block(fields)
        full = np.zeros((self.count, block.shape[1]), dtype=np.uint8)
        sizes = np.zeros(self.count, dtype=np.int64)
        full[rows], sizes[rows] = block, lengths
        self.add(full, sizes)

    def sizes(self) -> np.ndarray:
        """Each row's bytes."""
        return sum(self._lengths, np.zeros(self.count, dtype=np.int64))

    def cut(self) -> tuple[bytes, list[int]]:
        """The rows' bytes joined, and where each row ends in them."""
        if not self._blocks:
            return b"", [0] * self.count
        matrix = np.hstack(self._blocks)
        kept = np.hstack([np.arange(block.shape[1]) < lengths[:, None]
                          for block, lengths in zip(self._blocks, self._lengths)])
        return matrix[kept].tobytes(), np.cumsum(self.sizes()).tolist()


def _block(fields: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Byte strings as the rows of a uint8 matrix (each from its row's start), and their lengths."""
    lengths = np.array([len(field) for field in fields], dtype=np.int64)
    block = np.zeros((len(fields), int(lengths.max()) if len(fields) else 0), dtype=np.uint8)
    for k, field in enumerate(fields):
        block[k, :len(field)] = np.frombuffer(field, dtype=np.uint8)
    return block, lengths


def _packed(rows: _Rows, field_tag: bytes, values: np.ndarray) -> None:
    """A packed repeated uint64 field of one value a row (-1: none, the field left out)."""
    present = values >= 0
    block, lengths = varint_rows(np.where(present, values, 0))
    size = np.where(present, lengths, 0)
    rows.varints(size, present, field_tag)
    rows.add(block, size)


@dataclass
class _NodeColumns:
    """What ``NodeFrames`` writes of every node, as columns over the plan's node numbers (ET ops,
    GPU ops, later pieces). -1 marks a field left out (times and ids: written when > 0, != 0)."""

    id: np.ndarray
    head: np.ndarray  # code into ``NodeFrames`` heads: the name and type fields
    node_type: np.ndarray
    ctrl: np.ndarray  # the parent's id (a piece's: the op it continues, ``DependencyPlan.ctrl``)
    chained: np.ndarray  # the id of the node the thread ran before it (a CPU op's, a piece's)
    listed: np.ndarray  # True: its dependencies come from ``DependencyPlan.data_deps`` (GPU ops, waits)
    cause: np.ndarray  # code into ``NodeFrames`` causes (``data_dep_causes``) of a chained dependency
    thread: np.ndarray  # a later piece's code into ``NodeFrames`` piece threads; 0 (none) for the others
    start: np.ndarray  # whole µs
    duration: np.ndarray
    time_split: list[np.ndarray]  # ``TIME_SPLIT``'s values


class NodeFrames:
    """Framed ``Node`` bytes (varint length + message) of ET ops, GPU ops and later pieces, a chunk
    of the write order at a time; counts the node types written into ``summary.counts_by_type``,
    and the ops whose ET-only fields ``pre_encoded`` gave into ``summary.et_fields_from_child``.

    What every node has (id, name and type, parent, dependencies, times, time split, causes) is
    read from columns made once for the output (``_columns``) and written a field at a time over
    the chunk (``_Rows``): a new ``Node`` field is one more line there, in its place by field
    number. What some nodes have, of any size (the ET's inputs, outputs and attributes, a GPU
    op's or a collective's attributes), is encoded op by op (``_own_fields``); a nested-layout
    op's ``EtOnlyFields`` come from ``pre_encoded.chunk(order)`` when given
    (``fields_child.PreEncoded``: encoded by a child while the parent linked; None where they are
    not there yet), else from this encoder's own."""

    def __init__(self, et_plus, plan, summary, pre_encoded=None):
        self._et_plus, self._plan, self._summary = et_plus, plan, summary
        self.attrs = AttrEncoder()
        self._et_fields = EtOnlyFields(self.attrs, et_plus.et.layout == FLAT)
        self._pre_encoded = pre_encoded
        self._head_codes: dict[tuple[str, int], int] = {}  # (name, node type) -> code
        self._heads: list[bytes] = []
        self._cause_codes: dict[tuple[str, ...], int] = {(): 0}  # no dependency: no attribute
        self._causes: list[bytes] = [b""]
        self._time_split_heads = [int64_head(name) for name in TIME_SPLIT]
        self._piece_threads: list[bytes] = [b""]  # a later piece's ``is_cpu_op`` and ``tid``, by thread
        self._nodes: _NodeColumns | None = None

    def chunk(self, order) -> bytes:
        """The frames of the nodes in ``order``, joined."""
        columns = self._columns()
        nodes = np.asarray(order, dtype=np.int64)
        own = self._own_fields(order, nodes)
        listed = np.flatnonzero(columns.listed[nodes])
        listed_deps = [self._listed_deps(u) for u in nodes[listed].tolist()]
        leading, trailing = _Rows(len(nodes)), _Rows(len(nodes))
        self._leading_fields(leading, nodes, columns, listed, [field for field, _ in listed_deps])
        cause = columns.cause[nodes]
        cause[listed] = [code for _, code in listed_deps]
        self._trailing_fields(trailing, nodes, columns, cause)
        size = leading.sizes() + np.array([len(fields) for fields in own], dtype=np.int64) + trailing.sizes()
        if len(size) and not size.min():
            raise ValueError("empty Node (every field default): readers would take it for end-of-file")
        framed = _Rows(len(nodes))
        framed.varints(size, size > 0)
        framed.extend(leading)
        head, head_ends = framed.cut()
        tail, tail_ends = trailing.cut()
        parts = []
        head_at = tail_at = 0
        for head_end, fields, tail_end in zip(head_ends, own, tail_ends):
            parts += (head[head_at:head_end], fields, tail[tail_at:tail_end])
            head_at, tail_at = head_end, tail_end
        counts = np.bincount(columns.node_type[nodes])
        for node_type in np.flatnonzero(counts).tolist():
            self._summary.counts_by_type[TYPE_NAMES[node_type]] += int(counts[node_type])
        return b"".join(parts)

    def _leading_fields(self, rows: _Rows, nodes: np.ndarray, columns: _NodeColumns, listed: np.ndarray,
                        listed_fields: list[bytes]) -> None:
        """``id``, ``name``, ``type``, ``ctrl_deps``, ``data_deps`` (packed; the ``listed`` rows'
        given whole), ``start_time_micros``, ``duration_micros``; proto3 leaves 0 out."""
        node_id = columns.id[nodes]
        rows.varints(node_id, node_id != 0, _ID)
        rows.entries(columns.head[nodes], self._heads)
        _packed(rows, _CTRL_DEPS, columns.ctrl[nodes])
        _packed(rows, _DATA_DEPS, columns.chained[nodes])  # -1 in the listed rows
        if len(listed):
            rows.some(listed, listed_fields)
        for field_tag, values in ((_START, columns.start[nodes]), (_DURATION, columns.duration[nodes])):
            rows.varints(values, values > 0, field_tag)

    def _trailing_fields(self, rows: _Rows, nodes: np.ndarray, columns: _NodeColumns, cause: np.ndarray) -> None:
        """A later piece's thread (``is_cpu_op``, ``tid``), the time split (``TIME_SPLIT``, int64
        attributes: ``chakra_attrs.int64_attr``), then ``data_dep_causes`` (``cause``: each row's
        code)."""
        rows.entries(columns.thread[nodes], self._piece_threads)
        for head, values in zip(self._time_split_heads, columns.time_split):
            values = values[nodes]
            present = values >= 0
            if not present.any():
                continue
            value, value_size = varint_rows(np.where(present, values, 0))
            rows.varints(len(head) + value_size, present, ATTR)  # ``Node.attr`` and its size
            rows.encoded(value, value_size, present, head)
        rows.entries(cause, self._causes)

    def _own_fields(self, order, nodes: np.ndarray) -> list[bytes]:
        """The fields only some nodes have, between their times and their time split: a CPU op's
        ``EtOnlyFields``; a CPU collective's inputs, outputs and ``cpu_comm_attrs``; a GPU op's
        inputs, outputs and ``gpu_attrs`` (a later piece has none: its thread is a column)."""
        et_plus, plan = self._et_plus, self._plan
        et = et_plus.et
        n, tids, cpu_comm = plan.cpu_count, et.tid, plan.cpu_comm
        et_fields, encode_all = self._et_fields, self.attrs.encode_all
        if self._pre_encoded is not None:
            own = self._pre_encoded.chunk(order)
            self._summary.et_fields_from_child += len(own) - own.count(None)
        else:
            own = [None] * len(order)
        for k in np.flatnonzero(nodes >= n).tolist():
            u = order[k] - n
            if u < len(et_plus.gpu_nodes):
                node = et_plus.gpu_nodes[u]
                launcher = tids[et_plus.gpu_links[u].et_index]
                own[k] = et_fields.io(node) + encode_all(gpu_attrs(node, launcher, plan.comm[u]))
            else:
                own[k] = b""
        if cpu_comm:
            for k in [k for k, u in enumerate(order) if u in cpu_comm]:
                u = order[k]
                own[k] = et_fields.io(et.nodes[u]) + encode_all(cpu_comm_attrs(tids[u], cpu_comm[u]))
        for k in [k for k, fields in enumerate(own) if fields is None]:
            own[k] = et_fields(et.nodes[order[k]])
        return own

    def _thread_codes(self, owner: np.ndarray) -> np.ndarray:
        """Each node's code of its piece-thread attributes (``is_cpu_op`` true, ``tid``: a later
        piece's, its op's thread; 0, none, for the other nodes), each thread encoded once."""
        tids = self._et_plus.et.tid
        codes: dict[int, int] = {}
        for tid in sorted({tids[i] for i in set(owner.tolist())}):
            codes[tid] = len(self._piece_threads)
            self._piece_threads.append(self.attrs.encode_all((("is_cpu_op", "bool_val", True),
                                                               ("tid", "int64_val", tid))))
        pieces = np.array([codes[tids[i]] for i in owner.tolist()], dtype=np.int64)
        return np.concatenate((np.zeros(len(self._plan.prev) - len(owner), dtype=np.int64), pieces))

    def _columns(self) -> _NodeColumns:
        """The columns of every node, made on first use (``_node_columns``)."""
        if self._nodes is None:
            self._nodes = self._node_columns()
        return self._nodes

    def _node_columns(self) -> _NodeColumns:
        """Array passes over the plan's columns and the nodes' times: O(nodes)."""
        et_plus, plan = self._et_plus, self._plan
        et, gpu_nodes, busy = et_plus.et, et_plus.gpu_nodes, plan.busy
        pieces = busy.pieces
        n, g = plan.cpu_count, len(gpu_nodes)
        owner = pieces.owner.astype(np.int64)
        ids = np.array(et.ids + [node.id for node in gpu_nodes] + list(plan.piece_ids), dtype=np.int64)
        if len(ids) and ids.min() < 0:
            raise ValueError(f"varint of a negative value: node id {int(ids.min())}")
        ctrl, prev = _column(plan.ctrl), _column(plan.prev)
        listed = np.zeros(len(prev), dtype=bool)
        listed[n:n + g] = True
        listed[[u for u, waits in plan.waits.items() if waits]] = True
        chained = np.where(~listed & (prev >= 0), prev, -1)
        cause = np.zeros(len(prev), dtype=np.int64)
        at = np.flatnonzero(chained >= 0)
        cause[at] = np.where(chain_is_parent(prev[at], ctrl[at]), self._cause_code((PARENT,)),
                             self._cause_code((THREAD_ORDER,)))
        start, timed = _whole(et.nodes, "ts")
        whole = np.asarray(whole_microseconds(np.concatenate((busy.sim, pieces.sim)), et.tid, pieces.owner),
                           dtype=np.int64)
        head, node_type = self._heads_and_types(owner)
        return _NodeColumns(
            id=ids, head=head, node_type=node_type,
            ctrl=_ids_of(ids, ctrl), chained=_ids_of(ids, chained), listed=listed, cause=cause,
            thread=self._thread_codes(owner),
            start=np.concatenate((start, _whole(gpu_nodes, "ts")[0], np.rint(pieces.begin).astype(np.int64))),
            duration=np.concatenate((whole[:n], _whole(gpu_nodes, "dur")[0], whole[n:])),
            time_split=self._time_split(ids[owner], timed))

    def _listed_deps(self, u: int) -> tuple[bytes, int]:
        """The ``data_deps`` field of a GPU op or a node with waits of its own, as the plan gives
        them (``DependencyPlan.data_deps``), and its causes' code."""
        plan, et_plus = self._plan, self._et_plus
        deps = plan.data_deps(u)
        ids = [plan.node_id(d, et_plus.et.ids, et_plus.gpu_nodes) for d, _ in deps]
        return packed(_DATA_DEPS, ids), self._cause_code(tuple(cause for _, cause in deps))

    def _time_split(self, continued: np.ndarray, timed: np.ndarray) -> list[np.ndarray]:
        """``TIME_SPLIT``'s columns (-1: left out; negative values written as 0): a linked op's
        (``timed``) inclusive, exclusive and blocked time, and its host gap and deferred time when
        > 0; a piece's op (``continues``), the span it lay over and its host gap when > 0."""
        et, busy = self._et_plus.et, self._plan.busy
        pieces = busy.pieces
        n, g, p = len(et.nodes), len(self._et_plus.gpu_nodes), len(pieces)

        def column(et_values=None, present=None, piece_values=None) -> np.ndarray:
            ops = np.full(n, -1, dtype=np.int64) if et_values is None else np.where(present, np.maximum(et_values, 0), -1)
            return np.concatenate((ops, np.full(g, -1, dtype=np.int64),
                                   np.full(p, -1, dtype=np.int64) if piece_values is None else piece_values))

        def whole(values: np.ndarray) -> np.ndarray:
            return np.rint(values).astype(np.int64)

        piece_gap = np.where(pieces.host_gap > 0, whole(pieces.host_gap), -1)
        return [
            column(piece_values=continued),
            column(_whole(et.nodes, "dur")[0], timed, np.maximum(whole(pieces.end - pieces.begin), 0)),
            column(_whole(et.nodes, "exclusive_dur")[0], timed),
            column(whole(busy.blocked), timed),
            column(whole(busy.host_gap), busy.host_gap > 0, piece_gap),
            column(whole(busy.deferred), busy.deferred > 0),
        ]

    def _heads_and_types(self, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each node's code of its ``name`` and ``type`` fields, and its node type: an ET op's
        from its name (a CPU collective's from its communication kind), a GPU op's from its
        communication attributes, a piece's its op's name, a compute node."""
        et, plan = self._et_plus.et, self._plan
        type_of = {name: cpu_node_type_of(name) for name in dict.fromkeys(et.names)}  # a few hundred names
        code_of = {name: self._head_code((name, node_type)) for name, node_type in type_of.items()}
        cpu_heads = np.array([code_of[name] for name in et.names], dtype=np.int64)
        heads, types = cpu_heads.copy(), np.array([type_of[name] for name in et.names], dtype=np.int64)
        for i, comm in plan.cpu_comm.items():
            heads[i], types[i] = self._head_code((et.names[i], comm.node_type)), comm.node_type
        gpu_keys = [(node.name, gpu_node_type_of(comm)) for node, comm in zip(self._et_plus.gpu_nodes, plan.comm)]
        return (np.concatenate((heads, np.array([self._head_code(key) for key in gpu_keys], dtype=np.int64),
                                cpu_heads[owner])),
                np.concatenate((types, np.array([node_type for _, node_type in gpu_keys], dtype=np.int64),
                                np.full(len(owner), pb.COMP_NODE, dtype=np.int64))))

    def _head_code(self, key: tuple[str, int]) -> int:
        """The code of the ``name`` and ``type`` fields of (name, node type), encoded once."""
        code = self._head_codes.get(key)
        if code is None:
            name, node_type = key
            encoded = name.encode("utf-8")
            code = self._head_codes[key] = len(self._heads)
            self._heads.append((delimited(_NAME, encoded) if encoded else b"")
                               + (_TYPE + encode_varint(node_type) if node_type else b""))
        return code

    def _cause_code(self, causes: tuple[str, ...]) -> int:
        """The code of the ``data_dep_causes`` attribute of these causes, encoded once."""
        code = self._cause_codes.get(causes)
        if code is None:
            code = self._cause_codes[causes] = len(self._causes)
            self._causes.append(self.attrs.encode(("data_dep_causes", "string_list", causes)))
        return code

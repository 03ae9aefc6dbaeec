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
- every kind: last, ``data_dep_causes`` (one cause per data dependency, same order).
Proto3 defaults are left out, strings are UTF-8: the bytes are those protobuf serialises for the
same message (the tests build every message with protobuf and compare).
A new ``Node`` field is one more entry in ``NodeFrames._graph_fields`` (every kind) or in its kind's
method, in its place by field number.

What repeats is encoded once and kept as bytes: per op name (and type) its ``name``/``type``
fields; the ET's fields as ``chakra_fields`` caches them; the time-split attributes by value;
the dependency causes by their tuple.
Cost: O(output bytes) plus O(1) dict look-ups per op; memory: the caches, each bounded, and one
chunk of output.
"""

from __future__ import annotations

from itertools import repeat
from typing import Iterator

from linker.model import et_def_pb2 as pb
from linker.plan.comm import PROCESS_GROUP_INIT, WORLD_GROUP_ID, CommAttrs, is_int
from linker.plan.dependency_plan import PARENT, THREAD_ORDER
from linker.read.et import FLAT, UNSET
from linker.write.chakra_attrs import MAX_CACHED_VALUES, AttrEncoder, AttrSpec, int64_attr, int64_head
from linker.write.chakra_fields import EtOnlyFields
from linker.write.protobuf_wire import delimited, encode_varint, tags

# AttrEncoder and EtOnlyFields: what a child encoding the ET's fields ahead needs (``schedule.fields_child``).
__all__ = ["AttrEncoder", "EtOnlyFields", "NodeFrames", "TYPE_NAMES", "cpu_comm_attrs", "cpu_node_type_of",
           "gpu_attrs"]

_ID, _NAME, _TYPE, _CTRL_DEPS, _DATA_DEPS, _START, _DURATION = tags(
    pb.Node, "id", "name", "type", "ctrl_deps", "data_deps", "start_time_micros", "duration_micros")
TYPE_NAMES = {value: pb.NodeType.Name(value) for value in pb.NodeType.values()}
TIME_SPLIT_ATTRS = ("inclusive_dur_micros", "exclusive_dur_micros", "blocked_micros", "host_gap_micros",
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
    if comm.comm_type is not None:
        yield "comm_type", "int64_val", comm.comm_type
    yield "comm_size", "int64_val", comm.comm_size
    for name in ("comm_src", "comm_dst", "comm_tag"):
        value = getattr(comm, name)
        if value is not None:
            yield name, "int64_val", value
    yield "pg_name", "string_val", comm.pg_name or WORLD_GROUP_ID


def cpu_comm_attrs(tid: int, comm: CommAttrs) -> Iterator[AttrSpec]:
    """A CPU collective's attributes (``plan.cpu_comm``): ``is_cpu_op`` false (ASTRA-sim refuses a
    communication node on the CPU), its measured thread, its communication attributes, and its
    issue number in the group (``comm_seq``), by which ranks pair collectives."""
    yield "is_cpu_op", "bool_val", False
    yield "tid", "int64_val", tid
    if comm.comm_type is not None:
        yield "comm_type", "int64_val", comm.comm_type
    yield "comm_size", "int64_val", comm.comm_size
    yield "pg_name", "string_val", comm.pg_name or WORLD_GROUP_ID
    if comm.seq is not None:
        yield "comm_seq", "int64_val", comm.seq


def whole_microseconds(sim: list[float], tid: list[int], owners: list[int] = ()) -> list[int]:
    """Each CPU node's busy time in whole µs, rounded as one running total over the nodes taken
    thread by thread (``tid``: threads by number, ET order within each), not one by one: a node's
    value is the rounded running total up to it less that up to the node before. ``sim`` holds the
    n ET nodes' values, then those of the later pieces, piece j being node n + j of op
    ``owners[j]``: each piece comes right after its op (its pieces in their order), so an op's
    nodes together are within 1 µs of its busy time too. Each value is within 1 µs of the node's
    own and never negative, and a thread's sum is within 1 µs of its total (rounding each node
    alone can lose up to 0.5 µs a node, and many short ops lean one way). A stable sort by
    thread, a running sum, a difference; O((n + p) log(n + p))."""
    n = len(tid)
    sequence: list[int] = list(range(n))
    tids = tid
    if owners:
        tids = tid + [tid[owner] for owner in owners]
        by_owner = sorted(range(len(owners)), key=owners.__getitem__)  # stable: each op's pieces in order
        sequence = []
        k = 0
        for i in range(n):
            sequence.append(i)
            while k < len(by_owner) and owners[by_owner[k]] == i:
                sequence.append(n + by_owner[k])
                k += 1
    whole = [0] * len(sim)
    running = rounded_before = 0
    for u in sorted(sequence, key=lambda u: tids[u]):
        running += sim[u]
        rounded = round(running)
        whole[u] = rounded - rounded_before
        rounded_before = rounded
    return whole


class _IntAttr:
    """One int64 attribute's ``Node.attr`` bytes, cached by value (small values repeat)."""

    def __init__(self, name: str):
        self._head = int64_head(name)
        self.cache: dict[int, bytes] = {}

    def __call__(self, value: float) -> bytes:
        """The attribute of ``value`` rounded to a whole number."""
        whole = round(value)
        return self.cache.get(whole) or self.miss(whole)

    def miss(self, value: int) -> bytes:
        """The attribute of ``value`` (0 for a negative one), cached under ``value``."""
        encoded = int64_attr(self._head, value if value > 0 else 0)
        if len(self.cache) < MAX_CACHED_VALUES:
            self.cache[value] = encoded
        return encoded


class NodeFrames:
    """Framed ``Node`` bytes (varint length + message) of ET ops, GPU ops and later pieces, a
    chunk of the write order at a time; counts the node types written into
    ``summary.counts_by_type``, and the ops whose ET-only fields ``pre_encoded`` gave into
    ``summary.et_fields_from_child``.

    Each node kind has its message written by one method (``cpu_node``, ``gpu_node``,
    ``piece_node``): the fields every node has (``_graph_fields``, in field-number order), that
    kind's own fields, then the ``data_dep_causes`` attribute every node ends with. A new ``Node``
    field shared by every kind goes in ``_graph_fields``; one of a kind, in that kind's method.
    A CPU op's ``EtOnlyFields`` come from ``pre_encoded.chunk(order)`` when given
    (``fields_child.PreEncoded``: encoded by a child while the parent linked; None where they are
    not there yet), else from this encoder's own ``EtOnlyFields``."""

    def __init__(self, et_plus, plan, summary, pre_encoded=None):
        self._plan, self._summary, self._pre_encoded = plan, summary, pre_encoded
        et = et_plus.et
        self._nodes, self._ids, self._tids = et.nodes, et.ids, et.tid
        self._gpu_nodes, self._gpu_links = et_plus.gpu_nodes, et_plus.gpu_links
        self.attrs = AttrEncoder()
        self._et_fields = EtOnlyFields(self.attrs, et.layout == FLAT)
        self._heads: dict = {}  # op name (GPU: name and type) -> its name and type fields
        self._inclusive, self._exclusive, self._blocked, self._host_gap, self._deferred = (
            _IntAttr(name) for name in TIME_SPLIT_ATTRS)
        self._causes: dict = {}  # the causes of a node's data dependencies -> their attribute
        self._piece_threads: dict[int, bytes] = {}  # a thread -> a piece's ``is_cpu_op`` and ``tid``
        self._continues_head = int64_head("continues")
        self._piece_start = plan.piece_start if plan.piece_start >= 0 else len(plan.prev)
        pieces = plan.busy.pieces
        # Busy times in whole µs: the ET nodes' (index i), then the later pieces' (index n + j).
        self._whole_us = whole_microseconds(plan.busy.sim + pieces.sim, et.tid, pieces.owner)

    def chunk(self, order) -> bytes:
        """The frames of the nodes in ``order``, joined."""
        n, piece_start = self._plan.cpu_count, self._piece_start
        if self._pre_encoded is not None:  # the ET's own fields of each op, where the child encoded them
            fields_of = self._pre_encoded.chunk(order)
            self._summary.et_fields_from_child += len(fields_of) - fields_of.count(None)
        else:
            fields_of = repeat(None)
        frames = []
        for u, fields in zip(order, fields_of):
            if u < n:
                payload = self.cpu_node(u, fields)
            elif u < piece_start:
                payload = self.gpu_node(u)
            else:
                payload = self.piece_node(u)
            if not payload:
                raise ValueError("empty Node (every field default): readers would take it for end-of-file")
            frames += (encode_varint(len(payload)), payload)  # its frame: the length, then the message
        self._count_cpu_nodes(order)
        return b"".join(frames)

    def cpu_node(self, u: int, fields: bytes | None = None) -> bytes:
        """The ``Node`` of ET op u: duration its busy time (``whole_microseconds``); then its
        inputs/outputs and its attributes: the ET's own (``fields``, or ``EtOnlyFields``) or, for a
        CPU collective, ``cpu_comm_attrs``; then its time split."""
        node = self._nodes[u]
        cpu_comm = self._plan.cpu_comm
        comm = cpu_comm.get(u) if cpu_comm else None
        if comm is None:
            head = self._head(node.name, cpu_node_type_of(node.name))
            own = fields if fields is not None else self._et_fields(node)
        else:  # a CPU collective: counted here, as GPU ops are
            head = self._head((node.name, comm.node_type), comm.node_type)
            own = self._et_fields.io(node) + self.attrs.encode_all(cpu_comm_attrs(self._tids[u], comm))
            self._summary.counts_by_type[TYPE_NAMES[comm.node_type]] += 1
        parts, causes = self._graph_fields(u, node.id, head, node.ts, self._whole_us[u])
        parts += (own, self._time_split(u, node), causes)
        return b"".join(parts)

    def _time_split(self, u: int, node) -> bytes:
        """ET op u's time split (``plan.busy``): inclusive, exclusive and blocked time when it was
        linked (timed), host gap and deferred time when > 0 (negative values written as 0)."""
        busy = self._plan.busy
        split = b""
        if node.ts is not UNSET:
            split = (self._inclusive(node.dur) + self._exclusive(node.exclusive_dur)
                     + self._blocked(busy.blocked[u]))
        if busy.host_gap[u] > 0:
            split += self._host_gap(busy.host_gap[u])
        if busy.deferred[u] > 0:
            split += self._deferred(busy.deferred[u])
        return split

    def gpu_node(self, u: int) -> bytes:
        """The ``Node`` of GPU op u (``plan.cpu_count`` + its index): type from its communication
        attributes (``plan.comm``), duration its own; then its inputs/outputs and ``gpu_attrs``."""
        k = u - self._plan.cpu_count
        node, comm = self._gpu_nodes[k], self._plan.comm[k]
        node_type = gpu_node_type_of(comm)
        self._summary.counts_by_type[TYPE_NAMES[node_type]] += 1
        head = self._head((node.name, node_type), node_type)
        duration = node.dur if node.dur is not UNSET and node.dur is not None else 0
        parts, causes = self._graph_fields(u, node.id, head, node.ts, duration)
        launcher_tid = self._tids[self._gpu_links[k].et_index]
        parts += (self._et_fields.io(node), self.attrs.encode_all(gpu_attrs(node, launcher_tid, comm)), causes)
        return b"".join(parts)

    def piece_node(self, u: int) -> bytes:
        """The ``Node`` of later piece u (``plan.later_pieces``; ``plan.piece_start`` + j): its op's
        name, ``COMP_NODE``, the op as ``ctrl_deps``, its measured start, its busy time; then
        ``is_cpu_op`` and ``tid`` (cached per thread), ``continues`` (the op's id),
        ``inclusive_dur_micros`` (where it lay) and ``host_gap_micros`` when a host gap follows it."""
        plan = self._plan
        pieces, j = plan.busy.pieces, u - self._piece_start
        owner = pieces.owner[j]
        name, tid = self._nodes[owner].name, self._tids[owner]
        head = self._head(name, cpu_node_type_of(name))
        parts, causes = self._graph_fields(u, plan.piece_ids[j], head, pieces.begin[j],
                                           self._whole_us[len(self._ids) + j])
        thread = self._piece_threads.get(tid)
        if thread is None:
            thread = self._piece_threads[tid] = self.attrs.encode_all((("is_cpu_op", "bool_val", True),
                                                                         ("tid", "int64_val", tid)))
        parts += (thread, int64_attr(self._continues_head, self._ids[owner]),
                  self._inclusive(pieces.end[j] - pieces.begin[j]))
        if pieces.host_gap[j] > 0:
            parts.append(self._host_gap(pieces.host_gap[j]))
        parts.append(causes)
        return b"".join(parts)

    def _graph_fields(self, u: int, node_id: int, head: bytes, start, duration: float) -> tuple[list[bytes], bytes]:
        """The fields every node has, in field-number order, as a list to extend: ``id`` (when not
        0), ``name`` and ``type`` (``head``), ``ctrl_deps`` (``plan.ctrl``: the parent; a GPU op's
        launching op), ``data_deps`` (``plan.data_deps``), ``start_time_micros`` (``start``
        rounded) and ``duration_micros`` (rounded), each when > 0; and apart, the
        ``data_dep_causes`` attribute that ends the message (cached by its causes).
        Kept fast: the usual CPU node's dependency is read from ``plan.prev`` in place of
        ``plan.data_deps``'s call and list (with the frame and times written in place, a 400-step
        GPU pair to ``.et`` went from 1.065x to 0.96x the old encoder's CPU, paired)."""
        plan = self._plan
        parts = [_ID, encode_varint(node_id), head] if node_id else [head]
        parent = plan.ctrl[u]
        if parent >= 0:
            parent_id = encode_varint(self._ids[parent])
            parts += (_CTRL_DEPS, encode_varint(len(parent_id)), parent_id)
        if u not in plan.waits and (u < plan.cpu_count or u >= self._piece_start):
            # ``plan.data_deps`` of the usual CPU node, without its call and list (see the docstring)
            source = plan.prev[u]
            deps = ((source, PARENT if source == parent else THREAD_ORDER),) if source >= 0 else ()
        else:
            deps = plan.data_deps(u)
        causes = b""
        if len(deps) == 1:  # most nodes: one source, one cause
            source, cause = deps[0]
            source_id = encode_varint(plan.node_id(source, self._ids, self._gpu_nodes))
            parts += (_DATA_DEPS, encode_varint(len(source_id)), source_id)
            causes = self._causes.get((cause,)) or self._cause((cause,))
        elif deps:
            sources = b"".join([encode_varint(plan.node_id(d, self._ids, self._gpu_nodes)) for d, _ in deps])
            parts += (_DATA_DEPS, encode_varint(len(sources)), sources)
            cause_names = tuple([cause for _, cause in deps])
            causes = self._causes.get(cause_names) or self._cause(cause_names)
        if start is not UNSET and start is not None:
            start = round(start)
            if start > 0:
                parts += (_START, encode_varint(start))
        duration = round(duration)
        if duration > 0:
            parts += (_DURATION, encode_varint(duration))
        return parts, causes

    def _head(self, key, node_type: int) -> bytes:
        """The ``name`` and ``type`` fields of the ops of ``key`` (a name, or a GPU op's name and
        type), cached by ``key``."""
        head = self._heads.get(key)
        if head is None:
            name = key if isinstance(key, str) else key[0]
            encoded = name.encode("utf-8")
            head = self._heads[key] = ((delimited(_NAME, encoded) if encoded else b"")
                                       + (_TYPE + encode_varint(node_type) if node_type else b""))
        return head

    def _cause(self, causes: tuple[str, ...]) -> bytes:
        """The ``data_dep_causes`` attribute of these causes, cached."""
        encoded = self._causes[causes] = self.attrs.encode(("data_dep_causes", "string_list", causes))
        return encoded

    def _count_cpu_nodes(self, order) -> None:
        """Counts the chunk's ET ops (CPU collectives left out: counted as encoded) and later
        pieces by type."""
        plan = self._plan
        counts = self._summary.counts_by_type
        _count_et_ops(counts, order, self._nodes, plan.cpu_count, PROCESS_GROUP_INIT in self._heads,
                      plan.cpu_comm)
        if self._piece_start < len(plan.prev):  # later pieces: CPU compute nodes
            counts[TYPE_NAMES[pb.COMP_NODE]] += sum(u >= self._piece_start for u in order)


def _count_et_ops(counts, order, nodes, n: int, with_metadata: bool, cpu_comm) -> None:
    """Counts the chunk's ET ops by type (GPU ops and CPU collectives are counted as they are
    encoded); a ``METADATA_NODE`` is looked for only ``with_metadata`` (its name was seen).
    O(len(order))."""
    cpu = [u for u in order if u < n and u not in cpu_comm] if cpu_comm else [u for u in order if u < n]
    metadata = sum(1 for u in cpu if nodes[u].name == PROCESS_GROUP_INIT) if with_metadata else 0
    counts[TYPE_NAMES[pb.COMP_NODE]] += len(cpu) - metadata
    if metadata:
        counts[TYPE_NAMES[pb.METADATA_NODE]] += metadata

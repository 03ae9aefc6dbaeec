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
- both: last, ``data_dep_causes`` (one cause per data dependency, same order).
Proto3 defaults are left out, strings are UTF-8: the bytes are those protobuf serialises for the
same message (the tests build every message with protobuf and compare).
A new ``Node`` field is one more entry in ``NodeFrames.chunk``, in its place by field number.

What repeats is encoded once and kept as bytes: per op name (and type) its ``name``/``type``
fields; the ET's fields as ``chakra_fields`` caches them; the time-split attributes by value;
the dependency causes by their tuple.
Cost: O(output bytes) plus O(1) dict look-ups per op; memory: the caches, each bounded, and one
chunk of output.
"""

from __future__ import annotations

from itertools import repeat
from typing import Iterator

import numpy as np

from linker.model import et_def_pb2 as pb
from linker.plan.comm import PROCESS_GROUP_INIT, WORLD_GROUP_ID, CommAttrs, is_int
from linker.plan.dependency_plan import PARENT, THREAD_ORDER, chain_cause
from linker.read.et import FLAT, UNSET
from linker.write.chakra_attrs import MAX_CACHED_VALUES, AttrEncoder, AttrSpec, int64_attr, int64_head
from linker.write.chakra_fields import EtOnlyFields
from linker.write.protobuf_wire import CONTINUED_PAIRS, SMALL_VARINTS, SMALL_VARINTS_END, delimited, encode_varint, tags

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


class _IntAttr:
    """One int64 attribute's ``Node.attr`` bytes, cached by value (small values repeat)."""

    def __init__(self, name: str):
        self._head = int64_head(name)
        self.cache: dict[int, bytes] = {}

    def miss(self, value: int) -> bytes:
        """The attribute of ``value`` (0 for a negative one), cached under ``value``."""
        encoded = int64_attr(self._head, value if value > 0 else 0)
        if len(self.cache) < MAX_CACHED_VALUES:
            self.cache[value] = encoded
        return encoded


class NodeFrames:
    """Framed ``Node`` bytes (varint length + message) of ET ops and GPU ops, a chunk of the write
    order at a time; counts the node types written into ``summary.counts_by_type``, and the ops
    whose ET-only fields ``pre_encoded`` gave into ``summary.et_fields_from_child``.

    A nested-layout op's ``EtOnlyFields`` come from ``pre_encoded.chunk(order)`` when given
    (``fields_child.PreEncoded``: encoded by a child while the parent linked; None where they are
    not there yet), else from this encoder's own ``EtOnlyFields``, whose three steps ``chunk``
    inlines for the nested layout (a call and two joins less per op, on the serial path's
    hottest loop); a test checks both give the same bytes.
    ``chunk`` is one loop over CPU and GPU ops alike, a field at a time in field-number order:
    a new ``Node`` field goes in there, once. (About 150 lines: that loop is kept whole, so the
    message's layout reads top to bottom in one place.)"""

    def __init__(self, et_plus, plan, summary, pre_encoded=None):
        self._et_plus, self._plan, self._summary = et_plus, plan, summary
        self.attrs = AttrEncoder()
        self._et_fields = EtOnlyFields(self.attrs, et_plus.et.layout == FLAT)
        self._pre_encoded = pre_encoded
        self._heads: dict = {}  # op name (GPU: name and type) -> its name and type fields
        self._ints = [_IntAttr(name) for name in TIME_SPLIT_ATTRS]
        self._causes: dict = {}  # the causes of a node's data dependencies -> their attribute
        self._durations: list[int] | None = None  # ``whole_microseconds`` of the busy times
        self._busy: tuple[list[float], ...] | None = None  # blocked, host gap, deferred: ``_busy_lists``
        self._pieces: tuple[list[int], ...] | None = None  # ``_piece_micros``
        self._piece_threads: dict[int, bytes] = {}  # a thread -> a piece's ``is_cpu_op`` and ``tid``
        self._continues_head = int64_head("continues")

    def chunk(self, order) -> bytes:
        """The frames of the nodes in ``order``, joined.

        Long on purpose: one loop over the nodes with the fields' encoding written out, because it
        runs once per node of a ``.et`` output (720k on the large pair) and a helper per field
        would be a call per field per node. It gets shorter when the writer is fed from columns
        (issue "A columnar core"; docs/performance.md)."""
        et_plus, plan = self._et_plus, self._plan
        et = et_plus.et
        nodes, ids, n, tids = et.nodes, et.ids, plan.cpu_count, et.tid
        gpu_nodes, gpu_links, comm_of, cpu_comm = et_plus.gpu_nodes, et_plus.gpu_links, plan.comm, plan.cpu_comm
        ctrl_of, data_deps, prev, waits = plan.ctrl, plan.data_deps, plan.prev, plan.waits
        sim, (blocked, host_gap, deferred) = self._whole_us(), self._busy_lists()
        chain_causes = {cause: self._cause((cause,)) for cause in (PARENT, THREAD_ORDER)}
        heads, causes_of, et_fields, attrs = self._heads, self._causes, self._et_fields, self.attrs
        flat, inputs, outputs, cpu_attrs = et.layout == FLAT, et_fields.inputs, et_fields.outputs, et_fields.cpu_attrs
        plain_attrs = attrs.cpu_attr_bytes
        # The ET's own fields of each op of the chunk, from the child where it has encoded them.
        if self._pre_encoded is not None:
            fields_of = self._pre_encoded.chunk(order)
            self._summary.et_fields_from_child += len(fields_of) - fields_of.count(None)
        else:
            fields_of = repeat(None)
        inclusive, exclusive, blocked_attr, gap_attr, deferred_attr = self._ints
        inclusive_get, exclusive_get, blocked_get = inclusive.cache.get, exclusive.cache.get, blocked_attr.cache.get
        small, end, varint, pairs = SMALL_VARINTS, SMALL_VARINTS_END, encode_varint, CONTINUED_PAIRS
        id_tag, ctrl_tag, data_tag, start_tag, duration_tag = _ID, _CTRL_DEPS, _DATA_DEPS, _START, _DURATION
        gpu_types = self._summary.counts_by_type
        # Ids and other varints are inlined below 2**28 (see ``protobuf_wire.CONTINUED_PAIRS``).
        # Start times (µs since the epoch, >= 2**28): the varint of the bits above the low 14 kept
        # from the last op (the same for 16 ms), as ``encode_varint`` would write them.
        ts_high, ts_tail = None, b""
        out: list[bytes] = []
        append = out.append
        piece_start = plan.piece_start if plan.piece_start >= 0 else len(plan.prev)
        for u, fields in zip(order, fields_of):
            if u >= piece_start:  # a later piece of an op: a few fields, framed apart
                payload = self._piece_payload(u - piece_start)
                append(small[len(payload)] if len(payload) < end else varint(len(payload)))
                append(payload)
                continue
            et_op = u < n
            if et_op:
                node = nodes[u]
                comm = cpu_comm.get(u) if cpu_comm else None
                if comm is None:
                    head = heads.get(node.name) or self._head(node.name, cpu_node_type_of(node.name))
                else:  # a CPU collective: counted here, as GPU ops are
                    head = heads.get((node.name, comm.node_type)) or self._head((node.name, comm.node_type),
                                                                                comm.node_type)
                    gpu_types[TYPE_NAMES[comm.node_type]] += 1
                duration = sim[u]
            else:  # a GPU op
                k = u - n
                node, comm = gpu_nodes[k], comm_of[k]
                node_type = gpu_node_type_of(comm)
                head = heads.get((node.name, node_type)) or self._head((node.name, node_type), node_type)
                duration = node.dur if node.dur is not UNSET and node.dur is not None else 0
                gpu_types[TYPE_NAMES[node_type]] += 1
            # id, name, type
            i = node.id
            if i:
                i = small[i] if 0 <= i < end else pairs[i & 0x3FFF] + small[i >> 14] if 0 < i < 1 << 28 else varint(i)
                parts = [id_tag, i, head]
            else:
                parts = [head]
            # ctrl_deps: the parent (a GPU op's: its launching op, an ET op too)
            p = ctrl_of[u]
            if p >= 0:
                c = ids[p]
                c = small[c] if 0 <= c < end else pairs[c & 0x3FFF] + small[c >> 14] if 0 < c < 1 << 28 else varint(c)
                parts += (ctrl_tag, small[len(c)], c)
            # data_deps and their causes (written last)
            d = prev[u]
            if et_op and u not in waits:  # the thread's previous op or none: ``plan.data_deps`` inlined
                causes = chain_causes[chain_cause(d, p)] if d >= 0 else b""
            else:
                deps = data_deps(u)
                d = deps[0][0] if len(deps) == 1 else -1
                if d >= 0:
                    causes = causes_of.get((deps[0][1],)) or self._cause((deps[0][1],))
                else:
                    causes = self._many_deps(deps, parts) if deps else b""
            if d >= 0:
                d = ids[d] if d < n else gpu_nodes[d - n].id if d < piece_start else plan.piece_ids[d - piece_start]
                d = small[d] if 0 <= d < end else pairs[d & 0x3FFF] + small[d >> 14] if 0 < d < 1 << 28 else varint(d)
                parts += (data_tag, small[len(d)], d)
            # start_time_micros, duration_micros
            ts = node.ts
            if ts is not UNSET and ts is not None:
                t = round(ts)
                if t >> 14 == ts_high:  # the usual start time: the same high bits as the last one
                    parts += (start_tag, pairs[t & 0x3FFF] + ts_tail)
                elif t > 0:
                    parts += (start_tag, small[t] if t < end else varint(t))
                    if t >= 1 << 28:
                        ts_high = t >> 14
                        ts_tail = pairs[ts_high & 0x3FFF] + varint(t >> 28)
            t = round(duration)
            if t > 0:
                parts += (duration_tag, small[t] if t < end else varint(t))
            # inputs, outputs, attr
            if et_op:
                if comm is not None:
                    parts += (et_fields.io(node), attrs.encode_all(cpu_comm_attrs(tids[u], comm)))
                elif fields is not None:
                    parts.append(fields)
                elif flat:
                    parts.append(et_fields(node))
                else:  # ``EtOnlyFields`` inlined (a call and two joins less per op)
                    if node.inputs is not UNSET and node.inputs is not None:
                        parts.append(inputs(node.inputs))
                    if node.outputs is not UNSET and node.outputs is not None:
                        parts.append(outputs(node.outputs))
                    parts.append((node.attrs is not UNSET and cpu_attrs(node.attrs)) or plain_attrs(node, False))
                if ts is not UNSET:  # the caches hold negative values too (written as 0)
                    t, e, b = round(node.dur), round(node.exclusive_dur), round(blocked[u])
                    parts += (inclusive_get(t) or inclusive.miss(t), exclusive_get(e) or exclusive.miss(e),
                              blocked_get(b) or blocked_attr.miss(b))
                gap = host_gap[u]
                if gap > 0:
                    t = round(gap)
                    parts.append(gap_attr.cache.get(t) or gap_attr.miss(t))
                moved = deferred[u]
                if moved > 0:
                    t = round(moved)
                    parts.append(deferred_attr.cache.get(t) or deferred_attr.miss(t))
            else:
                parts += (et_fields.io(node), attrs.encode_all(gpu_attrs(node, tids[gpu_links[k].et_index], comm)))
            parts.append(causes)
            payload = b"".join(parts)
            size = len(payload)
            if not size:
                raise ValueError("empty Node (every field default): readers would take it for end-of-file")
            append(small[size] if size < end else varint(size))
            append(payload)
        _count_et_ops(self._summary.counts_by_type, order, nodes, n, PROCESS_GROUP_INIT in heads, cpu_comm)
        if piece_start < len(plan.prev):  # later pieces: CPU compute nodes
            self._summary.counts_by_type[TYPE_NAMES[pb.COMP_NODE]] += sum(u >= piece_start for u in order)
        return b"".join(out)

    def _whole_us(self) -> list[int]:
        """``whole_microseconds`` of the plan's busy times, the ET nodes' (index i) then the later
        pieces' (index n + j: rounded on their op's thread, after its ops), computed on first use."""
        if self._durations is None:
            busy, tid = self._plan.busy, self._et_plus.et.tid
            pieces = busy.pieces
            self._durations = whole_microseconds(np.concatenate((busy.sim, pieces.sim)), tid, pieces.owner)
        return self._durations

    def _busy_lists(self) -> tuple[list[float], ...]:
        """The plan's blocked, host gap and deferred columns as lists (read a node at a time by
        ``chunk``), made on first use."""
        if self._busy is None:
            busy = self._plan.busy
            self._busy = busy.blocked.tolist(), busy.host_gap.tolist(), busy.deferred.tolist()
        return self._busy

    def _piece_micros(self) -> tuple[list[int], ...]:
        """The later pieces' op, and their start, span and following host gap in whole µs (rounded
        half to even, as ``round``; -1: no gap), as lists read a piece at a time, made on first
        use."""
        if self._pieces is None:
            pieces = self._plan.busy.pieces
            gap = np.where(pieces.host_gap > 0, np.rint(pieces.host_gap), -1)
            self._pieces = tuple(column.astype(np.int64).tolist() for column in (
                pieces.owner, np.rint(pieces.begin), np.rint(pieces.end - pieces.begin), gap))
        return self._pieces

    def _piece_payload(self, j: int) -> bytes:
        """The ``Node`` of later piece j (``plan.later_pieces``): id, its op's name, ``COMP_NODE``,
        the op as ``ctrl_deps``, its dependency, its measured start, its busy time, then
        ``is_cpu_op`` and ``tid`` (cached per thread), ``continues`` (the op's id),
        ``inclusive_dur_micros`` (where it lay), ``host_gap_micros`` when a host gap follows it,
        and the dependency's cause (cached)."""
        plan, et = self._plan, self._et_plus.et
        u = plan.piece_start + j
        owners, begins, spans, gaps = self._piece_micros()
        owner = owners[j]
        name, owner_id, tid = et.names[owner], et.ids[owner], et.tid[owner]
        head = self._heads.get(name) or self._head(name, cpu_node_type_of(name))
        varint = encode_varint
        parent = varint(owner_id)
        parts = [_ID, varint(plan.piece_ids[j]), head, _CTRL_DEPS, varint(len(parent)), parent]
        if u in plan.waits:  # none as the rules stand: the general path
            deps = plan.data_deps(u)
            data = b"".join([varint(plan.node_id(d, et.ids, self._et_plus.gpu_nodes)) for d, _ in deps])
            causes = tuple(cause for _, cause in deps)
        else:  # the node the thread ran before it
            d = plan.prev[u]
            data = varint(plan.node_id(d, et.ids, self._et_plus.gpu_nodes))
            causes = (chain_cause(d, plan.ctrl[u]),)
        parts += (_DATA_DEPS, varint(len(data)), data)
        begin = begins[j]
        if begin > 0:
            parts += (_START, varint(begin))
        duration = self._whole_us()[len(et.ids) + j]
        if duration > 0:
            parts += (_DURATION, varint(duration))
        thread = self._piece_threads.get(tid)
        if thread is None:
            thread = self._piece_threads[tid] = self.attrs.encode_all((("is_cpu_op", "bool_val", True),
                                                                         ("tid", "int64_val", tid)))
        inclusive = self._ints[0]
        t = spans[j]
        parts += (thread, int64_attr(self._continues_head, owner_id), inclusive.cache.get(t) or inclusive.miss(t))
        t = gaps[j]
        if t >= 0:
            gap_attr = self._ints[3]
            parts.append(gap_attr.cache.get(t) or gap_attr.miss(t))
        parts.append(self._causes.get(causes) or self._cause(causes))
        return b"".join(parts)

    def _head(self, key, node_type: int) -> bytes:
        """The ``name`` and ``type`` fields of the ops of ``key`` (a name, or a GPU op's name and type)."""
        name = key if isinstance(key, str) else key[0]
        encoded = name.encode("utf-8")
        head = ((delimited(_NAME, encoded) if encoded else b"")
                + (_TYPE + encode_varint(node_type) if node_type else b""))
        self._heads[key] = head
        return head

    def _cause(self, causes: tuple[str, ...]) -> bytes:
        """The ``data_dep_causes`` attribute of these causes, cached."""
        encoded = self._causes[causes] = self.attrs.encode(("data_dep_causes", "string_list", causes))
        return encoded

    def _many_deps(self, deps: list[tuple[int, str]], parts: list) -> bytes:
        """Appends a ``data_deps`` field of several ids to ``parts``; returns their causes attribute."""
        et, plan = self._et_plus.et, self._plan
        ids = [plan.node_id(d, et.ids, self._et_plus.gpu_nodes) for d, _ in deps]
        data = b"".join([encode_varint(i) for i in ids])
        parts += (_DATA_DEPS, encode_varint(len(data)), data)
        return self.attrs.encode(("data_dep_causes", "string_list", tuple(cause for _, cause in deps)))


def _count_et_ops(counts, order, nodes, n: int, with_metadata: bool, cpu_comm) -> None:
    """Counts the chunk's ET ops by type (GPU ops and CPU collectives are counted as they are
    encoded); a ``METADATA_NODE`` is looked for only ``with_metadata`` (its name was seen).
    O(len(order))."""
    cpu = [u for u in order if u < n and u not in cpu_comm] if cpu_comm else [u for u in order if u < n]
    metadata = sum(1 for u in cpu if nodes[u].name == PROCESS_GROUP_INIT) if with_metadata else 0
    counts[TYPE_NAMES[pb.COMP_NODE]] += len(cpu) - metadata
    if metadata:
        counts[TYPE_NAMES[pb.METADATA_NODE]] += metadata

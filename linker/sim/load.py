"""Read the files ``et-link simulate`` replays into ``SimGraph`` columns: Chakra ``.et``/``.et.gz`` or ET+ JSON.

The kind of file is told by its content (a JSON document starts with ``{``), not by its suffix.

Chakra ``.et``: each node frame is parsed by a slim protobuf message that declares only the fields a
replay needs (id, name, type, ctrl_deps, data_deps, start_time_micros, duration_micros) and keeps
each ``attr`` as raw bytes; ``inputs``/``outputs`` are never decoded. An attribute is decoded only
when its name is one the replay reads (``is_cpu_op``, ``tid``, ``stream``, ``device``, ``comm_*``,
``pg_name``, ``inclusive_dur_micros``), and decoded attributes are cached by their bytes (most
repeat from node to node). Simulated duration: ``duration_micros``; measured duration:
``inclusive_dur_micros`` when present, else ``duration_micros``.

ET+ JSON (either ET layout): decoded with msgspec into the fields a replay needs. Simulated
duration: ``sim_dur``, else (older ET+) ``exclusive_dur`` for CPU ops and ``dur`` for GPU ops;
dependencies: the parent plus ``data_deps``, else (older ET+) the parent, a per-thread chain in id
order (ET ids are given at op start), each GPU op after its launcher (its parent) and after the
previous op on its stream. Each fallback used is recorded in ``SimGraph.notes``.

Errors a user can fix raise ``TraceInputError`` naming the file. Cost: O(file size) to read,
O(n + e) to build; memory O(n + e) numbers plus the names.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import re
from pathlib import Path
from typing import Any, Iterator

import msgspec
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from linker.model import et_def_pb2 as pb
from linker.plan.comm import PROCESS_GROUP_INIT, kind_from_kernel, kind_from_name
from linker.write.protobuf_wire import decode_varint
from linker.write.chakra_wire import attr_value, frame_boundary, iter_frames, iter_frames_from, open_binary
from linker.write.wait_nodes import WAIT_CAUSE_KEY
from linker.model.errors import TraceInputError
from linker.read.files import read_trace_bytes
from linker.schedule import Schedule
from linker.schedule.fork import ForkedCall
from linker.sim.graph import (COLL, COMM, COMM_TYPE_OF_NAME, CPU, GPU, META, NO_TIME, RECV, SEND, UNKNOWN_COMM_TYPE,
                    CommInfo, GraphBuilder, SimGraph, cpu_lane, gpu_lane, transfer_lane)

JSON, CHAKRA = "json", "chakra"

# ---------------------------------------------------------------------------------------------
# Which kind of file
# ---------------------------------------------------------------------------------------------


def file_kind(path: str | os.PathLike) -> str:
    """JSON when the (decompressed) file starts with '{', else Chakra. Raises TraceInputError
    (``open_binary``'s ``TraceFormatError`` when the file cannot be opened)."""
    p = Path(path)
    with contextlib.closing(open_binary(p)) as stream:
        try:
            head = stream.read(64)
        except (OSError, EOFError) as err:
            raise TraceInputError(p, f"cannot read: {err}") from None
    if not head:
        raise TraceInputError(p, "file is empty")
    return JSON if head.lstrip()[:1] == b"{" else CHAKRA


def load_graph(path: str | os.PathLike, rank: int = 0, schedule: Schedule | None = None) -> SimGraph:
    """Read one rank's file (.et, .et.gz or ET+ JSON) into a SimGraph. Raises TraceInputError.
    ``schedule`` (default ``Schedule.serial()``): whether a large ``.et`` is read in two halves."""
    if file_kind(path) == JSON:
        return load_json(path, rank)
    return load_chakra(path, rank, schedule)


# ---------------------------------------------------------------------------------------------
# Chakra protobuf
# ---------------------------------------------------------------------------------------------


def _slim_node_class() -> type:
    """A message type wire-compatible with Chakra ``Node`` holding only what a replay reads;
    ``attr`` stays raw bytes per attribute, ``inputs``/``outputs`` are skipped as unknown fields."""
    F = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(name="linker_sim_slim_node.proto", package="linker_sim",
                                                   syntax="proto3")
    message = file_proto.message_type.add(name="SlimNode")
    for name, number, kind, repeated in (("id", 1, F.TYPE_UINT64, False), ("name", 2, F.TYPE_STRING, False),
                                         ("type", 3, F.TYPE_INT32, False), ("ctrl_deps", 4, F.TYPE_UINT64, True),
                                         ("data_deps", 5, F.TYPE_UINT64, True),
                                         ("start_time_micros", 6, F.TYPE_UINT64, False),
                                         ("duration_micros", 7, F.TYPE_UINT64, False),
                                         ("attr", 10, F.TYPE_BYTES, True)):
        message.field.add(name=name, number=number, type=kind,
                          label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("linker_sim.SlimNode"))


_SlimNode = _slim_node_class()

# Attributes the replay reads, by their UTF-8 name.
_WANTED_ATTRS = frozenset(name.encode() for name in (
    "is_cpu_op", "tid", "stream", "device", "comm_type", "comm_size", "pg_name", "comm_src", "comm_dst",
    "inclusive_dur_micros", "data_dep_causes", "comm_seq", "host_gap_micros", "continues", WAIT_CAUSE_KEY))
# Attributes not read whose values are about unique per op: skipped by prefix, never cached.
_PER_OP_ATTRS = frozenset((b"rf_id", b"seq_id", b"fw_parent", b"exclusive_dur_micros", b"blocked_micros",
                           b"deferred_micros", b"folded_micros"))


def _int64_prefix(name: str) -> bytes:
    """An int64 attribute's wire prefix: its name (field 1), then the int64_val tag (field 9 varint)."""
    return b"\x0a" + bytes([len(name)]) + name.encode() + b"\x48"


# Per-op attributes the replay reads, by their int64 wire prefix: decoded inline, never cached.
_INLINE_INTS = tuple((_int64_prefix(name), name) for name in ("inclusive_dur_micros", "continues", "host_gap_micros"))
_ATTR_CACHE_LIMIT = 1 << 16


class _AttrDecoder:
    """(name, value) of a raw ``AttributeProto`` the replay reads, None for the others; cached by bytes.

    ``cache`` maps raw bytes to the decoded pair (or None); ``skip`` holds the name prefixes
    (field 1 tag, length, name) of attributes not read, so per-op ids (rf_id, seq_id), which never
    repeat, are skipped without a parse or a cache entry."""

    def __init__(self) -> None:
        self.cache: dict[bytes, tuple[str, Any] | None] = {}
        self.skip: tuple[bytes, ...] = ()

    def decode(self, raw: bytes) -> tuple[str, Any] | None:
        hit = self.cache.get(raw, False)
        if hit is not False:
            return hit
        for prefix, name in _INLINE_INTS:
            if raw.startswith(prefix):
                value = _small_varint(raw, len(prefix))
                if value is not None:
                    return name, value
        if raw.startswith(self.skip):
            return None
        attr = pb.AttributeProto()
        try:
            attr.ParseFromString(raw)
        except (DecodeError, RuntimeError, ValueError):
            return None
        name = attr.name.encode()
        if name in _PER_OP_ATTRS and raw.startswith(b"\x0a" + bytes([len(name)]) + name):
            self.skip += (raw[:2 + len(name)],)
            return None
        if name not in _WANTED_ATTRS:
            if len(self.cache) < _ATTR_CACHE_LIMIT:
                self.cache[raw] = None
            return None
        result = (attr.name, attr_value(attr))
        if len(self.cache) < _ATTR_CACHE_LIMIT:
            self.cache[raw] = result
        return result


def _small_varint(raw: bytes, pos: int) -> int | None:
    """The non-negative varint at ``pos`` when it ends the bytes and fits 63 bits, else None."""
    try:
        value, end = decode_varint(raw, pos)
    except (IndexError, ValueError):
        return None
    return value if end == len(raw) and value < (1 << 63) else None


def node_payloads(path: Path) -> Iterator[bytes]:
    """The payload of every Node frame of a ``.et``/``.et.gz`` (the GlobalMetadata frame skipped),
    cut by ``write.chakra_wire.iter_frames`` (its size and truncation checks included). Raises
    ``TraceInputError`` (a ``TraceFormatError``) for an empty, truncated or garbled file."""
    frames = iter_frames(path)
    next(frames)
    for frame in frames:
        yield frame.payload


def _as_int(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def load_chakra(path: str | os.PathLike, rank: int = 0, schedule: Schedule | None = None) -> SimGraph:
    """Read a Chakra ``.et``/``.et.gz``. Cost: one C parse per node frame, a cache hit per attribute.
    When the ``schedule`` says so (``Schedule.splits_load``: a large plain file and a spare core),
    the file is read in two halves at once: the second by a forked child (``fork.ForkedCall``)
    handing back its rows as columns; the graph is the same (a child that failed leaves its half
    to this process)."""
    p = Path(path)
    builder = GraphBuilder(str(p), rank)
    boundary = None
    if (schedule or Schedule.serial()).splits_load(p) and p.is_file():
        boundary = frame_boundary(p, p.stat().st_size // 2)
    if boundary is None:
        saw_inclusive = _add_chakra_nodes(builder, node_payloads(p), 1, p)
    else:
        offset, index = boundary

        def second_half() -> tuple[tuple, bool]:
            half = GraphBuilder(str(p), rank)
            saw = _add_chakra_nodes(half, (frame.payload for frame in iter_frames_from(p, offset, index)), index, p)
            return half.columns(), saw

        child = ForkedCall(lambda: pickle.dumps(second_half(), pickle.HIGHEST_PROTOCOL))
        try:
            saw_inclusive = _add_chakra_nodes(builder, _payloads_before(p, offset), 1, p)
            sent = child.result()
        finally:
            child.cancel()
        # A child that failed sent nothing: the second half is read here, its errors raised as usual.
        columns, saw_in_second = pickle.loads(sent) if sent is not None else second_half()
        builder.absorb(columns)
        saw_inclusive = saw_inclusive or saw_in_second
    if not saw_inclusive:
        builder.notes.append("no inclusive_dur_micros attribute: the measured timeline uses duration_micros")
    return _finish(builder, p)


def _payloads_before(path: Path, offset: int) -> Iterator[bytes]:
    """The payloads of the node frames that start before byte ``offset``."""
    frames = iter_frames(path)
    next(frames)
    for frame in frames:
        if frame.offset >= offset:
            frames.close()
            return
        yield frame.payload


def _add_chakra_nodes(builder: GraphBuilder, payloads: Iterator[bytes], first_index: int, p: Path) -> bool:
    """Add a node row per payload (message numbers from ``first_index``, for errors); True when
    some node has ``inclusive_dur_micros``."""
    decoder = _AttrDecoder()
    cache_get, skip_test = decoder.cache.get, decoder
    message = _SlimNode()
    parse = message.ParseFromString
    saw_inclusive = False
    add = builder.add
    for index, payload in enumerate(payloads, start=first_index):
        try:
            parse(payload)
        except (DecodeError, RuntimeError, ValueError) as err:
            raise TraceInputError(p, f"message #{index} is not a valid Chakra Node ({err})") from None
        attrs = {}
        for raw in message.attr:
            pair = cache_get(raw, False)
            if pair is False:
                if raw.startswith(skip_test.skip):
                    continue
                pair = skip_test.decode(raw)
            if pair is not None:
                attrs[pair[0]] = pair[1]
        node_type = message.type
        duration = float(message.duration_micros)
        measured = duration
        if "inclusive_dur_micros" in attrs:
            saw_inclusive = True
            measured = float(attrs["inclusive_dur_micros"])
        start = float(message.start_time_micros) if message.start_time_micros else NO_TIME
        comm = None
        if node_type == _COMP_NODE and attrs.get("is_cpu_op", "stream" not in attrs):
            kind, lane = CPU, cpu_lane(_as_int(attrs.get("tid"), 0))
        elif node_type == _COMP_NODE:
            kind = GPU
            lane = gpu_lane(_as_int(attrs.get("device"), 0), _as_int(attrs.get("stream"), -1))
        elif node_type in _COMM_NODES:
            kind = COMM
            comm = _chakra_comm(node_type, attrs)
            if "stream" in attrs or "tid" not in attrs:
                lane = gpu_lane(_as_int(attrs.get("device"), 0), _as_int(attrs.get("stream"), -1))
            else:  # a CPU backend's (gloo, MPI, UCC) collective, send or receive
                lane = _host_comm_lane(_as_int(attrs.get("tid"), 0), comm)
        elif node_type == pb.METADATA_NODE:
            kind, lane = META, cpu_lane(_as_int(attrs.get("tid"), 0))
        else:  # memory, storage, ... nodes: timed on the CPU like ASTRA-sim's non-GPU work
            kind, lane = CPU, cpu_lane(_as_int(attrs.get("tid"), 0))
        deps = message.data_deps
        ctrl = message.ctrl_deps
        causes = attrs.get("data_dep_causes")
        if causes is not None and len(causes) == len(deps):
            causes = ["parent"] * len(ctrl) + causes
        else:
            causes = None
        u = add(message.id, message.name, kind, duration, start, measured, lane,
                list(ctrl) + list(deps) if ctrl else list(deps), comm, causes)
        if "host_gap_micros" in attrs:
            builder.host_gap[u] = float(attrs["host_gap_micros"])
        if "continues" in attrs:
            builder.continues[u] = attrs["continues"]
        if WAIT_CAUSE_KEY in attrs:
            builder.wait_nodes[u] = attrs[WAIT_CAUSE_KEY]
    return saw_inclusive


_COMP_NODE = pb.COMP_NODE
_COMM_NODES = frozenset((pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE))


def _chakra_comm(node_type: int, attrs: dict) -> CommInfo:
    pg = attrs.get("pg_name")
    info = CommInfo(COLL, _as_int(attrs.get("comm_type"), UNKNOWN_COMM_TYPE), _as_int(attrs.get("comm_size"), 0),
                    str(pg) if pg is not None and pg != "" else "0")
    if node_type == pb.COMM_SEND_NODE:
        info.role, info.peer = SEND, _as_int(attrs.get("comm_dst"), -1)
    elif node_type == pb.COMM_RECV_NODE:
        info.role, info.peer = RECV, _as_int(attrs.get("comm_src"), -1)
    if "comm_seq" in attrs:
        info.seq = _as_int(attrs.get("comm_seq"), -1)
    return info


def _finish(builder: GraphBuilder, path: Path) -> SimGraph:
    if not builder.ids:
        raise TraceInputError(path, "the trace holds no nodes")
    try:
        return builder.finish()
    except ValueError as err:
        raise TraceInputError(path, str(err)) from None


# ---------------------------------------------------------------------------------------------
# ET+ JSON
# ---------------------------------------------------------------------------------------------


class _JsonAttr(msgspec.Struct):
    name: str = ""
    value: Any = None


class _JsonNode(msgspec.Struct):
    """An ET+ node: only the keys a replay reads (everything else is skipped by the decoder)."""

    id: int
    name: str = ""
    ctrl_deps: Any = None  # nested layout: the parent id
    parent: Any = None  # flat layout: the parent id
    attrs: msgspec.Raw = msgspec.Raw(b"null")  # nested layout; only its tid is read (``_tid_of``)
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    inclusive_dur: float | None = None
    exclusive_dur: float | None = None
    sim_dur: float | None = None
    data_deps: list[int] | None = None
    data_dep_causes: list[str] | None = None
    cat: str | None = None
    stream: int | None = None
    device: int | None = None
    comm_type: Any = None
    comm_size: int | None = None
    pg_name: Any = None
    comm_src: int | None = None
    comm_dst: int | None = None
    comm_role: str | None = None
    comm_seq: int | None = None
    host_gap_dur: float | None = None
    continues: int | None = None
    wait_cause: str | None = None


class _JsonDoc(msgspec.Struct):
    nodes: list[_JsonNode]


_JSON_DECODER = msgspec.json.Decoder(_JsonDoc)
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})  # ET+ JSON categories of GPU nodes


def _parent_of(node: _JsonNode) -> int | None:
    value = node.parent if node.parent is not None else node.ctrl_deps
    if isinstance(value, list):  # tolerate a list of parents
        value = value[0] if value else None
    return value if isinstance(value, int) and value != node.id else None


# The {"name": "tid", ...} object inside a nested-layout node's raw ``attrs`` list.
_TID_ATTR = re.compile(rb'\{[^{}]*"name"\s*:\s*"tid"[^{}]*\}')
_ATTR_DECODER = msgspec.json.Decoder(_JsonAttr)


def _tid_of(node: _JsonNode) -> int:
    """The node's CPU thread: flat ``tid``, else the ``tid`` entry of its ``attrs`` (0 if none).
    The attrs list stays raw: decoding every attribute of every node costs ~5x the whole decode."""
    if node.tid is not None:
        return _as_int(node.tid, 0)
    match = _TID_ATTR.search(node.attrs)
    if match is None:
        return 0
    text = match.group(0)
    tid = _TID_CACHE.get(text)
    if tid is None:
        try:
            tid = _as_int(_ATTR_DECODER.decode(text).value, 0)
        except (msgspec.DecodeError, msgspec.ValidationError):
            tid = 0
        if len(_TID_CACHE) < 1024:
            _TID_CACHE[text] = tid
    return tid


_TID_CACHE: dict[bytes, int] = {}


def _host_comm_lane(tid: int, comm: CommInfo) -> tuple:
    """A CPU backend's communication node's lane: a collective on its worker thread's, a send or
    receive on its thread's transfer lane (``graph.transfer_lane``)."""
    return transfer_lane(tid) if comm.role in (SEND, RECV) else cpu_lane(tid)


def _json_comm(node: _JsonNode) -> CommInfo | None:
    """CommInfo of a communication node: one the writer marked (``comm_type`` or ``comm_size``),
    as the ``.et`` writer makes it a communication node; a kernel named nccl/rccl that the writer
    could not resolve is a compute node in both formats. None for the others. A send's or
    receive's side: its ``comm_role``; in files written before it, the record's name or the one
    peer given."""
    if node.comm_type is None and node.comm_size is None:
        return None
    pg = node.pg_name
    info = CommInfo(COLL, UNKNOWN_COMM_TYPE, node.comm_size or 0, str(pg) if pg not in (None, "") else "0")
    if isinstance(node.comm_type, str):
        info.comm_type = COMM_TYPE_OF_NAME.get(node.comm_type.upper(), UNKNOWN_COMM_TYPE)
        kind = kind_from_name(node.comm_type)
    elif isinstance(node.comm_type, int):
        info.comm_type, kind = node.comm_type, None
    else:  # a kernel's name, or a CPU send's or receive's record ("gloo:send": peers on both sides)
        kind = kind_from_kernel(node.name) or kind_from_name(node.name)
        if kind is not None and kind.comm_type is not None:
            info.comm_type = kind.comm_type
    role = node.comm_role if node.comm_role is not None else kind.role if kind is not None else None
    if role == "send" or role is None and node.comm_dst is not None and node.comm_src is None:
        info.role, info.peer = SEND, node.comm_dst if node.comm_dst is not None else -1
    elif role == "recv" or role is None and node.comm_src is not None and node.comm_dst is None:
        info.role, info.peer = RECV, node.comm_src if node.comm_src is not None else -1
    info.seq = node.comm_seq
    return info


def load_json(path: str | os.PathLike, rank: int = 0) -> SimGraph:
    """Read an ET+ JSON (either layout). Cost: one msgspec decode, O(n log n) for the fallback order."""
    p = Path(path)
    data = read_trace_bytes(p)
    try:
        nodes = _JSON_DECODER.decode(data).nodes
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise TraceInputError(p, f"not an ET+ JSON document ({err})") from None
    del data
    builder = GraphBuilder(str(p), rank)
    has_sim_dur = any(node.sim_dur is not None for node in nodes)
    has_data_deps = any(node.data_deps is not None for node in nodes)
    if not any(node.ts is not None for node in nodes):
        raise TraceInputError(p, "an Execution Trace without times (no node has a 'ts'): link it first: "
                                 "et-link --et-file ET --kineto-file KINETO -o OUT.json, then simulate OUT.json")
    if not has_sim_dur:
        builder.notes.append("no sim_dur (older ET+): simulating exclusive_dur for CPU ops, dur for GPU ops")
    tids = [_tid_of(node) for node in nodes]
    fallback = None if has_data_deps else _fallback_order(nodes, tids)
    if fallback is not None:
        builder.notes.append("no data_deps (older ET+): dependencies are the parent, per-thread id order, "
                             "the launcher and the stream order")
    for i, node in enumerate(nodes):
        is_gpu = node.cat in GPU_CATS
        comm = _json_comm(node) if is_gpu or node.comm_type is not None or node.comm_size is not None else None
        tid = tids[i]
        if node.sim_dur is not None:
            duration = node.sim_dur
        elif is_gpu:
            duration = node.dur or 0.0
        else:
            duration = node.exclusive_dur if node.exclusive_dur is not None else (node.dur or 0.0)
        measured = node.inclusive_dur if node.inclusive_dur is not None else (node.dur or 0.0)
        start = float(node.ts) if node.ts is not None else NO_TIME
        if is_gpu or node.wait_cause is not None and node.stream is not None:  # a wait node: on its op's unit
            kind = COMM if comm is not None else GPU
            lane = gpu_lane(node.device if node.device is not None else 0,
                            node.stream if node.stream is not None else -1)
        elif comm is not None:  # a CPU backend's (gloo, MPI, UCC) collective, send or receive
            kind, lane = COMM, _host_comm_lane(tid, comm)
        else:
            kind = META if node.name == PROCESS_GROUP_INIT else CPU
            lane = cpu_lane(tid)
        parent = _parent_of(node)
        deps: list[int] = [] if parent is None else [parent]
        causes = None
        if fallback is not None:
            previous = fallback[i]
            if previous is not None:
                deps.append(previous)
        elif node.data_deps:
            if node.data_dep_causes is not None and len(node.data_dep_causes) == len(node.data_deps):
                causes = ["parent"] * len(deps) + node.data_dep_causes
            deps.extend(node.data_deps)
        u = builder.add(node.id, node.name, kind, float(duration), start, float(measured), lane, deps, comm, causes)
        if node.host_gap_dur:
            builder.host_gap[u] = float(node.host_gap_dur)
        if node.continues is not None:
            builder.continues[u] = node.continues
        if node.wait_cause is not None:
            builder.wait_nodes[u] = node.wait_cause
    return _finish(builder, p)


def _fallback_order(nodes: list[_JsonNode], tids: list[int]) -> list[int | None]:
    """For an ET+ without data_deps: the id each node follows — the previous CPU op of its thread in
    id order, or the previous GPU op of its (device, stream) in start order. O(n log n)."""
    previous: list[int | None] = [None] * len(nodes)
    cpu = sorted((i for i, node in enumerate(nodes) if node.cat not in GPU_CATS), key=lambda i: nodes[i].id)
    last: dict[Any, int] = {}
    for i in cpu:
        key = tids[i]
        previous[i] = last.get(key)
        last[key] = nodes[i].id
    gpu = sorted((i for i, node in enumerate(nodes) if node.cat in GPU_CATS),
                 key=lambda i: (nodes[i].ts if nodes[i].ts is not None else math.inf, nodes[i].id))
    last = {}
    for i in gpu:
        key = (nodes[i].device, nodes[i].stream)
        previous[i] = last.get(key)
        last[key] = nodes[i].id
    return previous

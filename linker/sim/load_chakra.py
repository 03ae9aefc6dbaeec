"""Read a Chakra ``.et``/``.et.gz`` into ``SimGraph`` columns (``sim.load``'s module docstring
says what is read and how it is timed); imported by ``load.load_graph`` only for a ``.et``, so that
reading an ET+ JSON loads no protobuf.

Each node frame is parsed by a slim protobuf message that declares only the fields a replay
needs and keeps each ``attr`` as raw bytes; an attribute is decoded only when the replay reads its
name, cached by its bytes. Errors a user can fix raise ``TraceInputError`` naming the file. Cost:
one C parse per node frame, a cache hit per attribute; O(n + e) to build.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Iterator

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from linker.model import et_def_pb2 as pb
from linker.model.errors import TraceInputError
from linker.schedule import Schedule
from linker.schedule.fork import ForkedCall
from linker.sim.graph import (COLL, COMM, CPU, GPU, META, NO_TIME, RECV, SEND, UNKNOWN_COMM_TYPE, CommInfo,
                              GraphBuilder, SimGraph, as_int, cpu_lane, finish_graph, gpu_lane, host_comm_lane)
from linker.write.chakra_wire import attr_value, frame_boundary, iter_frames, iter_frames_from
from linker.write.protobuf_wire import decode_varint
from linker.write.wait_nodes import WAIT_CAUSE_KEY

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


SlimNode = _slim_node_class()

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
    return finish_graph(builder, p)


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
    message = SlimNode()
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
            kind, lane = CPU, cpu_lane(as_int(attrs.get("tid"), 0))
        elif node_type == _COMP_NODE:
            kind = GPU
            lane = gpu_lane(as_int(attrs.get("device"), 0), as_int(attrs.get("stream"), -1))
        elif node_type in _COMM_NODES:
            kind = COMM
            comm = _chakra_comm(node_type, attrs)
            if "stream" in attrs or "tid" not in attrs:
                lane = gpu_lane(as_int(attrs.get("device"), 0), as_int(attrs.get("stream"), -1))
            else:  # a CPU backend's (gloo, MPI, UCC) collective, send or receive
                lane = host_comm_lane(as_int(attrs.get("tid"), 0), comm)
        elif node_type == pb.METADATA_NODE:
            kind, lane = META, cpu_lane(as_int(attrs.get("tid"), 0))
        else:  # memory, storage, ... nodes: timed on the CPU like ASTRA-sim's non-GPU work
            kind, lane = CPU, cpu_lane(as_int(attrs.get("tid"), 0))
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
    info = CommInfo(COLL, as_int(attrs.get("comm_type"), UNKNOWN_COMM_TYPE), as_int(attrs.get("comm_size"), 0),
                    str(pg) if pg is not None and pg != "" else "0")
    if node_type == pb.COMM_SEND_NODE:
        info.role, info.peer = SEND, as_int(attrs.get("comm_dst"), -1)
    elif node_type == pb.COMM_RECV_NODE:
        info.role, info.peer = RECV, as_int(attrs.get("comm_src"), -1)
    if "comm_seq" in attrs:
        info.seq = as_int(attrs.get("comm_seq"), -1)
    return info

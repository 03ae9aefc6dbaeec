"""Read the files ``et-link simulate`` replays into ``SimGraph`` columns: Chakra ``.et``/``.et.gz`` or ET+ JSON.

The kind of file is told by its content (a JSON document starts with ``{``), not by its suffix.

Chakra ``.et`` (``sim.load_chakra``, imported only for a ``.et``: reading an ET+ JSON loads no
protobuf): each node frame is parsed by a slim protobuf message that declares only the fields a
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

import math
import os
import re
from pathlib import Path
from typing import Any

import msgspec

from linker.plan.comm import PROCESS_GROUP_INIT, kind_from_kernel, kind_from_name
from linker.model.errors import TraceInputError
from linker.read.files import looks_like_json, read_head, read_trace_bytes
from linker.schedule import Schedule
from linker.sim.graph import (COLL, COMM, COMM_TYPE_OF_NAME, CPU, GPU, META, NO_TIME, RECV, SEND, UNKNOWN_COMM_TYPE,
                              CommInfo, GraphBuilder, SimGraph, as_int, cpu_lane, finish_graph, gpu_lane,
                              host_comm_lane)

JSON, CHAKRA = "json", "chakra"

# ---------------------------------------------------------------------------------------------
# Which kind of file
# ---------------------------------------------------------------------------------------------


def file_kind(path: str | os.PathLike) -> str:
    """JSON when the (decompressed) file starts with '{' (``read.files.looks_like_json``), else
    Chakra. Raises TraceInputError when the file cannot be opened or read, or is empty."""
    head = read_head(Path(path), 64)
    if not head:
        raise TraceInputError(Path(path), "file is empty")
    return JSON if looks_like_json(head) else CHAKRA


def load_graph(path: str | os.PathLike, rank: int = 0, schedule: Schedule | None = None) -> SimGraph:
    """Read one rank's file (.et, .et.gz or ET+ JSON) into a SimGraph. Raises TraceInputError.
    ``schedule`` (default ``Schedule.serial()``): whether a large ``.et`` is read in two halves."""
    if file_kind(path) == JSON:
        return load_json(path, rank)
    from linker.sim.load_chakra import load_chakra  # protobuf only for a .et: a JSON read loads none
    return load_chakra(path, rank, schedule)


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


# The {"name": "tid", ...} object inside a nested-layout node's raw ``attrs`` list: an object with
# no object inside it (a tid attribute holds a number), whose "name" is "tid".
_TID_ATTR = re.compile(rb'\{[^{}]*"name"\s*:\s*"tid"[^{}]*\}')
_ATTR_DECODER = msgspec.json.Decoder(_JsonAttr)


def _tid_of(node: _JsonNode) -> int:
    """The node's CPU thread: flat ``tid``, else the ``tid`` entry of its ``attrs`` (0 if none).
    The attrs list stays raw: decoding every attribute of every node costs ~5x the whole decode.
    The entry is the first object ``_TID_ATTR.search`` would find, found for a third of its cost
    (the search tries a match at every object of the list): the object around each occurrence of
    the text ``"tid"`` in turn, taken when it is a tid object seen before (``_TID_CACHE``) or
    matches ``_TID_ATTR``."""
    if node.tid is not None:
        return as_int(node.tid, 0)
    attrs = bytes(node.attrs)
    at = attrs.find(b'"tid"')
    while at >= 0:
        first, last = attrs.rfind(b"{", 0, at), attrs.find(b"}", at)
        if last < 0:
            return 0
        if first >= 0:
            text = attrs[first:last + 1]
            tid = _TID_CACHE.get(text)
            if tid is not None:
                return tid
            if _TID_ATTR.fullmatch(text):
                return _tid_value(text)
        at = attrs.find(b'"tid"', at + 1)
    return 0


def _tid_value(text: bytes) -> int:
    """The value of a tid object's text (``_TID_ATTR``), kept in ``_TID_CACHE`` (1,024 texts:
    one per thread in practice)."""
    try:
        tid = as_int(_ATTR_DECODER.decode(text).value, 0)
    except (msgspec.DecodeError, msgspec.ValidationError):
        tid = 0
    if len(_TID_CACHE) < 1024:
        _TID_CACHE[text] = tid
    return tid


_TID_CACHE: dict[bytes, int] = {}  # tid object texts that matched ``_TID_ATTR``, by their value


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
            kind, lane = COMM, host_comm_lane(tid, comm)
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
    return finish_graph(builder, p)


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

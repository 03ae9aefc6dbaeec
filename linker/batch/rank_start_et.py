"""The ``.et`` side of ``rank_start``: a job's ``.et`` output rewritten with its rank's delay node.

The delay node (a CPU ``COMP_NODE`` lasting the rank's start offset, ``plan.rank_start``) is written
first after the metadata; every node without dependencies (the process root) gets a data dependency
on it, cause ``rank_start`` (``data_dep_causes``); the other frames are copied as they are. A delay
node already in the file (an earlier run) is replaced; offset 0 removes it. ``batch.rank_start``
decides the offsets and calls ``set_chakra``. Cost per rank: one copy of the output, frames copied
as bytes, only the dependency-free nodes decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from linker.model import et_def_pb2 as pb
from linker.model.errors import TraceInputError
from linker.plan.rank_start import DELAY_NODE_NAME, OFFSET_ATTR, RANK_START
from linker.write.chakra_wire import (EtWriter, encode_varint, find_attr, iter_frames, make_attr, open_binary,
                                      parse_metadata)
from linker.write.protobuf_wire import decode_varint


def node_head(raw: bytes) -> tuple[int, str | None, bool, int]:
    """(id, name when it is the delay node's else None, has ctrl or data dependencies, node type)
    of a Node payload, reading only its first fields (a serialized message lists its fields by
    number). O(1) beyond the name."""
    node_id, name, node_type, pos, end = 0, None, 0, 0, len(raw)
    while pos < end:
        tag, pos = decode_varint(raw, pos)
        number, wire = tag >> 3, tag & 7
        if number in (4, 5):
            return node_id, name, True, node_type
        if number > 5:
            return node_id, name, False, node_type
        if wire == 0:
            value, pos = decode_varint(raw, pos)
            if number == 1:
                node_id = value
            elif number == 3:
                node_type = value
        elif wire == 2:
            length, pos = decode_varint(raw, pos)
            if number == 2 and raw[pos:pos + length] == _DELAY_NAME_BYTES:
                name = DELAY_NODE_NAME
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            break
    return node_id, name, False, node_type


_DELAY_NAME_BYTES = DELAY_NODE_NAME.encode()


def delay_node(node_id: int, offset_us: int) -> pb.Node:
    """The Chakra delay node: a CPU ``COMP_NODE`` lasting ``offset_us``, no measured time."""
    node = pb.Node(id=node_id, name=DELAY_NODE_NAME, type=pb.COMP_NODE, duration_micros=offset_us)
    node.attr.append(make_attr("is_cpu_op", True, "bool_val"))
    node.attr.append(make_attr(OFFSET_ATTR, offset_us, "int64_val"))
    return node


def _causes(node: pb.Node) -> list[str]:
    attr = find_attr(node, "data_dep_causes")
    return list(attr.string_list.values) if attr is not None else []


def _set_causes(node: pb.Node, causes: list[str]) -> None:
    kept = [a for a in node.attr if a.name != "data_dep_causes"]
    del node.attr[:]
    node.attr.extend(kept)
    if causes:
        node.attr.append(make_attr("data_dep_causes", causes, "string_list"))


def gate(node: pb.Node, delay_id: int) -> None:
    """Add the dependency on the delay node (cause ``rank_start``) to ``node``, unless it has it."""
    if delay_id in node.data_deps:
        return
    causes = _causes(node)
    if len(causes) != len(node.data_deps):
        causes = [""] * len(node.data_deps)
    node.data_deps.append(delay_id)
    _set_causes(node, causes + [RANK_START])


def ungate(node: pb.Node, delay_id: int) -> bool:
    """Remove a dependency on ``delay_id`` (and its cause); True when there was one."""
    if delay_id not in node.data_deps:
        return False
    causes = _causes(node)
    named = len(causes) == len(node.data_deps)
    keep = [k for k, d in enumerate(node.data_deps) if d != delay_id]
    deps = [node.data_deps[k] for k in keep]
    del node.data_deps[:]
    node.data_deps.extend(deps)
    _set_causes(node, [causes[k] for k in keep] if named else [])
    return True


_FRAMES_PER_WRITE = 4096  # frames joined into one write


def _frame(payload: bytes) -> bytes:
    return encode_varint(len(payload)) + payload


@dataclass
class _Heads:
    """What a rewrite needs to know of a ``.et``: its largest id, the delay node it already holds
    (id, offset) if any, and the ids of the nodes to gate (those whose only dependency, if any, is
    the old delay node); ``targets`` None: not known, every node with dependencies is looked at."""

    max_id: int
    old_id: int | None
    old_offset: int
    targets: set[int] | None


def heads_from_graph(graph) -> _Heads:
    """``_Heads`` from the rank's ``SimGraph`` as ``sim.load`` read it (no second pass over the
    file). O(n)."""
    delays = [u for u, name in enumerate(graph.names) if name == DELAY_NODE_NAME]
    old = delays[0] if delays else None
    missing = {u for u, _ in graph.missing_deps}
    offsets, nodes = graph.dep_offsets, graph.dep_nodes
    targets = {graph.ids[u] for u in range(len(graph))
               if u != old and u not in missing
               and all(nodes[k] == old for k in range(offsets[u], offsets[u + 1]))}
    return _Heads(max(graph.ids, default=-1), graph.ids[old] if old is not None else None,
                  round(graph.duration[old]) if old is not None else 0, targets)


def _scan_heads(path: Path) -> _Heads:
    heads = _Heads(-1, None, 0, set())
    for frame in iter_frames(path):
        if frame.index == 0:
            continue
        node_id, name, has_deps, _ = node_head(frame.payload)
        heads.max_id = max(heads.max_id, node_id)
        if name == DELAY_NODE_NAME:
            heads.old_id, heads.old_offset = node_id, pb.Node.FromString(frame.payload).duration_micros
        elif not has_deps:
            heads.targets.add(node_id)
    if heads.old_id is not None:
        heads.targets = None
    return heads


def _frame_id(payload: bytes) -> int:
    """The node id of a payload (its first field when the writer put it first)."""
    if payload[:1] == b"\x08":
        return decode_varint(payload, 1)[0]
    return node_head(payload)[0]


class _StaleHeads(Exception):
    """The file is not what its ``_Heads`` said (changed since they were read)."""


def set_chakra(path: Path, offset_us: int, heads: _Heads | None = None) -> bool:
    """Rewrite ``path`` with a delay node of ``offset_us``. Frames are copied as bytes; once every
    node to change has been seen, the rest of the file is copied in blocks. O(file). Idempotent,
    and checked against the file: heads given (from a graph read earlier) that miss a delay node
    the file holds are dropped, nothing written, and the file read anew, so a file never gets a
    second delay node."""
    if heads is not None:
        try:
            return _set_chakra(path, offset_us, heads)
        except _StaleHeads:
            pass
    try:
        return _set_chakra(path, offset_us, _scan_heads(path))
    except _StaleHeads as stale:
        raise TraceInputError(path, f"node {stale.args[0]} is a second rank-start delay node") from None


def _set_chakra(path: Path, offset_us: int, heads: _Heads) -> bool:
    if heads.old_offset == offset_us and (heads.old_id is not None or offset_us == 0):
        return False
    old_id = heads.old_id
    delay_id = old_id if old_id is not None else heads.max_id + 1
    targets = heads.targets
    left = len(targets) + (old_id is not None) if targets is not None else -1  # -1: never all seen
    pending: list[bytes] = []
    rest_at = None
    with EtWriter(path) as writer:
        for frame in iter_frames(path):
            if frame.index == 0:
                writer.write_metadata(parse_metadata(frame, path))
                if offset_us:
                    pending.append(_frame(delay_node(delay_id, offset_us).SerializeToString()))
                continue
            if left == 0:
                rest_at = frame.offset
                break
            node_id = _frame_id(frame.payload)
            if node_id == old_id:
                left -= targets is not None
                continue
            if node_id == delay_id or _DELAY_NAME_BYTES in frame.payload and node_head(frame.payload)[1] == DELAY_NODE_NAME:
                raise _StaleHeads(node_id)  # the file holds a delay node the heads did not: read it anew
            if targets is None or node_id in targets:
                node = pb.Node.FromString(frame.payload)
                changed = ungate(node, old_id) if old_id is not None else False
                if offset_us and (changed or not node.data_deps and not node.ctrl_deps):
                    gate(node, delay_id)
                pending.append(_frame(node.SerializeToString()))
                if targets is not None:
                    left -= 1
            else:
                pending.append(_frame(frame.payload))
            if len(pending) >= _FRAMES_PER_WRITE:
                writer.write_frames_bytes(b"".join(pending), len(pending))
                pending.clear()
        if pending:
            writer.write_frames_bytes(b"".join(pending), len(pending))
        if rest_at is not None:
            _copy_rest(path, rest_at, writer)
    return True


def _copy_rest(path: Path, offset: int, writer: EtWriter) -> None:
    """Copy the (uncompressed) bytes of ``path`` from ``offset`` to the end into ``writer``."""
    stream = open_binary(path)
    try:
        stream.seek(offset)
        while True:
            block = stream.read(1 << 20)
            if not block:
                break
            writer.write_frames_bytes(block, 0)
    finally:
        stream.close()

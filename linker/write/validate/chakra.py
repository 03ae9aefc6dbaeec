"""Checks of a Chakra protobuf file (``.et``, ``.et.gz``): the first message is a non-empty
``GlobalMetadata``; node types are known; COMM nodes carry ``comm_type`` (collectives) and
``comm_size`` > 0 as ``int64_val`` and are not CPU ops; collectives ASTRA-sim cannot simulate are
warned about; then the graph checks (``graph``). Cost: one streaming pass, then O(nodes + deps).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import Iterable

from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import (Frame, TraceFormatError, find_attr, has_unknown_fields, iter_frames,
                                      parse_metadata, parse_node)
from linker.write.validate.graph import DependencyTable, check_dependency_graph
from linker.write.validate.report import (DEFAULT_MAX_EXAMPLES, FORMAT_CHAKRA, ValidationResult, ViolationLog,
                                          make_result)

# Collectives ASTRA-sim simulates (BROADCAST by replaying its duration); the others abort it.
ASTRA_SIM_COLLECTIVES = frozenset({pb.ALL_REDUCE, pb.ALL_TO_ALL, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.BROADCAST})
COMM_NODE_TYPES = frozenset({pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE})

def _chakra_metadata(frame: Frame, path: Path, log: ViolationLog) -> tuple[pb.GlobalMetadata, pb.Node | None]:
    """Parse the first frame. Returns the metadata and, if the first message is really a Node,
    that node (reported as ``metadata_not_first``)."""
    if not frame.payload:
        log.add("metadata_empty", 0, "message #0 has 0 bytes")
        return pb.GlobalMetadata(), None
    try:
        metadata = parse_metadata(frame, path)
        metadata_error: TraceFormatError | None = None
    except TraceFormatError as err:
        metadata, metadata_error = pb.GlobalMetadata(), err
    if metadata_error is None and not has_unknown_fields(metadata):
        return metadata, None
    node = _parse_as_clean_node(frame, path)
    if node is not None:
        log.add("metadata_not_first", node.id, f"message #0 decodes as Node {node.id} ({node.name!r})")
        return pb.GlobalMetadata(), node
    if metadata_error is not None:
        raise metadata_error
    log.add("metadata_unknown_fields", 0, "message #0")
    return metadata, None


def _parse_as_clean_node(frame: Frame, path: Path) -> pb.Node | None:
    try:
        node = parse_node(frame, path)
    except TraceFormatError:
        return None
    if has_unknown_fields(node) or node.type == pb.INVALID_NODE:
        return None
    return node


def _metadata_schema(metadata: pb.GlobalMetadata) -> str | None:
    attr = find_attr(metadata, "schema")
    if attr is not None and attr.WhichOneof("value") == "string_val":
        return attr.string_val
    return metadata.version or None


def _check_comm_node(node: pb.Node, log: ViolationLog) -> None:
    """COMM node attribute checks; O(#attrs)."""
    attrs = {}
    for attr in node.attr:
        attrs.setdefault(attr.name, attr)
    is_cpu = attrs.get("is_cpu_op")
    if is_cpu is not None and is_cpu.WhichOneof("value") == "bool_val" and is_cpu.bool_val:
        log.add("comm_on_cpu", node.id, node.name)
    if node.type == pb.COMM_COLL_NODE:
        comm_type = _int_attr(node, attrs.get("comm_type"), "comm_type", log)
        if comm_type is None:
            log.add("comm_type_missing", node.id, node.name)
        elif comm_type not in _KNOWN_COMM_TYPES:
            log.add("comm_type_unknown", node.id, f"comm_type {comm_type}")
        elif comm_type not in ASTRA_SIM_COLLECTIVES:
            log.add("comm_type_unsupported", node.id, pb.CollectiveCommType.Name(comm_type))
    comm_size = _int_attr(node, attrs.get("comm_size"), "comm_size", log)
    if comm_size is None:
        log.add("comm_size_missing", node.id, node.name)
    elif comm_size <= 0:
        log.add("comm_size_not_positive", node.id, f"comm_size {comm_size}")
    if node.type == pb.COMM_SEND_NODE and "comm_dst" not in attrs:
        log.add("comm_peer_missing", node.id, "no comm_dst")
    if node.type == pb.COMM_RECV_NODE and "comm_src" not in attrs:
        log.add("comm_peer_missing", node.id, "no comm_src")


_KNOWN_COMM_TYPES = frozenset(pb.CollectiveCommType.values())
_INTEGER_KINDS = frozenset(
    {"int64_val", "int32_val", "uint32_val", "uint64_val", "sint32_val", "sint64_val",
     "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val"}
)


def _int_attr(node: pb.Node, attr: pb.AttributeProto | None, name: str, log: ViolationLog) -> int | None:
    """The integer value of a comm attribute; other integer kinds are read but warned about."""
    if attr is None:
        return None
    kind = attr.WhichOneof("value")
    if kind == "int64_val":
        return attr.int64_val
    log.add("comm_attr_kind", node.id, f"{name} is {kind}")
    return getattr(attr, kind) if kind in _INTEGER_KINDS else None


def _type_name(node_type: int) -> str:
    try:
        return pb.NodeType.Name(node_type)
    except ValueError:
        return f"UNKNOWN_{node_type}"


_KNOWN_NODE_TYPES = frozenset(pb.NodeType.values())


def validate_chakra(path: str | os.PathLike, max_examples: int = DEFAULT_MAX_EXAMPLES) -> ValidationResult:
    """Validate a Chakra ``.et``/``.et.gz`` file, streaming its nodes.

    Raises ``TraceFormatError`` when the file cannot be decoded at all (missing, empty, truncated,
    garbage). Cost: O(file) time; O(nodes + deps) memory.
    """
    p = Path(path)
    log = ViolationLog(max_examples)
    table = DependencyTable("Q")
    type_counts: dict[int, int] = {}
    with contextlib.closing(iter_frames(p)) as frames:
        metadata_frame = next(frames)
        metadata, first_node = _chakra_metadata(metadata_frame, p, log)
        nodes: Iterable[tuple[Frame, pb.Node]] = ((frame, parse_node(frame, p)) for frame in frames)
        if first_node is not None:
            nodes = itertools.chain([(metadata_frame, first_node)], nodes)
        for frame, node in nodes:
            if not frame.payload:
                log.add("empty_message", 0, f"message #{frame.index} at byte {frame.offset}")
            node_type = node.type
            type_counts[node_type] = type_counts.get(node_type, 0) + 1
            if node_type in COMM_NODE_TYPES:
                _check_comm_node(node, log)
            elif node_type == pb.INVALID_NODE:
                log.add("invalid_node_type", node.id, node.name)
            elif node_type not in _KNOWN_NODE_TYPES:
                log.add("unknown_node_type", node.id, f"type {node_type}")
            table.add_node(node.id, node.ctrl_deps, node.data_deps)
    check_dependency_graph(table, log, "dangling_ctrl_dep", file_order=True)
    counts = {_type_name(node_type): count for node_type, count in sorted(type_counts.items())}
    return make_result(p, FORMAT_CHAKRA, "protobuf", _metadata_schema(metadata), len(table), counts, log)


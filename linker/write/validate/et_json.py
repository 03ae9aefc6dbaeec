"""Checks of an ET / ET+ JSON file (plain or gzip; ``parent`` layout of schema 1.0.1,
``ctrl_deps`` of later schemas): every node has an int64 id and a parent, dependencies are ints;
then the graph checks (``graph``). Only the keys checked are decoded (see ``_JsonNode``).
Cost: one msgspec pass, then O(nodes + deps).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import msgspec

from linker.model.errors import TraceInputError
from linker.plan.rank_start import DELAY_NODE_NAME
from linker.read.files import collector_paused, read_trace_bytes
from linker.write.chakra_wire import TraceFormatError
from linker.write.protobuf_wire import is_int64
from linker.write.validate.graph import DependencyTable, check_dependency_graph
from linker.write.validate.report import (DEFAULT_MAX_EXAMPLES, FORMAT_ET_JSON, ValidationResult, ViolationLog,
                                          make_result)

UNSET = msgspec.UNSET
# Written here again, not imported from the readers, so the checker stays independent of them.
PROCESS_ROOT_NAMES = frozenset(
    {"[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_graph|process]"}
)
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# The keys of an ET/ET+ node the checks read, UNSET when absent; everything else (inputs, outputs,
# attrs) is skipped by the decoder, never built, which keeps a large ET's check to a fraction of a
# full parse's memory.
_CHECKED_KEYS = ("id", "name", "cat", "ctrl_deps", "parent", "data_deps")
_JsonNode = msgspec.defstruct("_JsonNode", [(key, Any, UNSET) for key in _CHECKED_KEYS])


class _JsonDocument(msgspec.Struct):
    schema: Any = UNSET
    nodes: list[_JsonNode] | msgspec.UnsetType = UNSET


class _LooseDocument(msgspec.Struct):
    """Fallback when some node is not a JSON object: nodes kept raw, decoded one by one."""

    schema: Any = UNSET
    nodes: list[msgspec.Raw] | msgspec.UnsetType = UNSET


_ONE_NODE = msgspec.json.Decoder(_JsonNode)


def _node_of(raw: msgspec.Raw) -> _JsonNode | None:
    """A node's checked keys, or None when the node is not a JSON object."""
    try:
        return _ONE_NODE.decode(raw)
    except msgspec.ValidationError:
        return None


def _json_document(path: Path, data: bytes) -> tuple[Any, list[_JsonNode | None]]:
    """(schema, nodes) of an ET / ET+ JSON document. One decode pass (two if a node is malformed)."""
    no_nodes = "not an Execution Trace: no top-level 'nodes' list"
    try:
        document = msgspec.json.decode(data, type=_JsonDocument)
        nodes = document.nodes
    except msgspec.DecodeError as err:
        raise TraceFormatError(path, f"not valid JSON ({err})") from None
    except msgspec.ValidationError:
        try:
            document = msgspec.json.decode(data, type=_LooseDocument)
        except msgspec.ValidationError:
            raise TraceFormatError(path, no_nodes) from None
        nodes = [_node_of(raw) for raw in document.nodes] if document.nodes is not UNSET else UNSET
    if nodes is UNSET:
        raise TraceFormatError(path, no_nodes)
    return document.schema, nodes


def _detect_json_layout(nodes: list[_JsonNode | None]) -> str:
    """'ctrl_deps' or 'parent': the key used by the first node that has either."""
    for node in nodes:
        if node is not None:
            if node.ctrl_deps is not UNSET:
                return "ctrl_deps"
            if node.parent is not UNSET:
                return "parent"
    return "parent"


def _dep_list(value: Any) -> Sequence[int] | None:
    """A dependency field as a sequence of ints (JSON stores one int or a list); None if malformed."""
    if is_int64(value):
        return (value,)
    if isinstance(value, list) and all(map(is_int64, value)):
        return value
    return None


def validate_json(path: str | os.PathLike, max_examples: int = DEFAULT_MAX_EXAMPLES) -> ValidationResult:
    """Validate an ET / ET+ JSON file (plain or gzip).

    Raises ``TraceFormatError`` when the file is not readable JSON with a ``nodes`` list.
    Cost: one msgspec pass that builds only ids and dependencies, then O(nodes + deps).
    """
    p = Path(path)
    try:
        data = read_trace_bytes(p)
    except TraceFormatError:
        raise
    except TraceInputError as err:
        raise TraceFormatError(p, err.problem) from None
    log = ViolationLog(max_examples)
    table = DependencyTable("q")
    counts = {"cpu": 0, "gpu": 0}
    with collector_paused():  # the node structs hold no cycles; they are freed by reference counting
        schema, nodes = _json_document(p, data)
        del data
        layout = _detect_json_layout(nodes)
        for position, node in enumerate(nodes):
            _add_json_node(position, node, table, counts, log)
        del nodes
    ctrl_kind = "dangling_ctrl_dep" if layout == "ctrl_deps" else "dangling_parent"
    check_dependency_graph(table, log, ctrl_kind)
    return make_result(p, FORMAT_ET_JSON, layout, schema if isinstance(schema, str) else None, len(table), counts, log)


def _add_json_node(
    position: int, node: _JsonNode | None, table: DependencyTable, counts: dict[str, int], log: ViolationLog
) -> None:
    """Count one JSON node and add it to the table (or report why it cannot be). O(#deps)."""
    node_id = node.id if node is not None else None
    if not is_int64(node_id):
        log.add("bad_id", -1, f"node #{position}: id {None if node_id is UNSET else node_id!r}")
        return
    counts["gpu" if node.cat in GPU_CATEGORIES else "cpu"] += 1
    parent = node.ctrl_deps if node.ctrl_deps is not UNSET else node.parent
    parents = _dep_list(parent)
    if parents is None:
        if parent is None or parent is UNSET:
            log.add("missing_parent", node_id, str(node.name if isinstance(node.name, str) else ""))
        else:
            log.add("bad_dependency", node_id, f"parent {parent!r}")
        parents = ()
    data_deps: Sequence[int] | None = ()
    if node.data_deps is not UNSET:
        data_deps = _dep_list(node.data_deps)
        if data_deps is None:
            log.add("bad_dependency", node_id, f"data_deps {node.data_deps!r}")
            data_deps = ()
    table.add_node(node_id, parents, data_deps)
    if node_id in parents and (node.name in PROCESS_ROOT_NAMES or node.name == DELAY_NODE_NAME):
        table.self_reference_ok.add(len(table) - 1)


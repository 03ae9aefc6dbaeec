"""Check a trace file against the invariants its consumers rely on (``et-link validate``).

Formats: Chakra protobuf (``.et``, ``.et.gz``) and ET / ET+ JSON (``.json``, ``.json.gz``, both node
layouts: ``parent`` in schema 1.0.1, ``ctrl_deps`` in later schemas). The format is chosen by the
file content (JSON starts with ``{``), not by the suffix alone.

Invariants (FORMATS.md §4; ASTRA-sim's feeder aborts on the graph ones):
- node ids are unique;
- every ``ctrl_deps`` / ``data_deps`` / ``parent`` id is a node of the file (the ET process root,
  whose parent is itself, is the one allowed self-reference);
- the graph of ctrl + data dependencies is acyclic (a node on a cycle is named);
- Chakra: the first message is a non-empty ``GlobalMetadata``; COMM nodes carry ``comm_type``
  (collectives) and ``comm_size`` > 0 as ``int64_val``, are not CPU ops, and collectives whose
  ``comm_type`` ASTRA-sim cannot simulate are warned about.

Cost: one streaming pass over a Chakra file (one msgspec pass for JSON), then O(nodes + deps)
time for the graph checks. Memory: O(nodes + deps) in flat arrays plus one id -> index dict
(JSON: the file's bytes plus the few keys checked per node).
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import msgspec

from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import (
    Frame,
    TraceFormatError,
    find_attr,
    has_unknown_fields,
    iter_frames,
    open_binary,
    parse_metadata,
    parse_node,
)
from linker.model.errors import TraceInputError
from linker.read.files import collector_paused, read_trace_bytes

UNSET = msgspec.UNSET

DEFAULT_MAX_EXAMPLES = 20

PROCESS_ROOT_NAMES = frozenset(
    {"[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_graph|process]"}
)
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# Collectives ASTRA-sim simulates (BROADCAST by replaying its duration); the others abort it.
ASTRA_SIM_COLLECTIVES = frozenset({pb.ALL_REDUCE, pb.ALL_TO_ALL, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.BROADCAST})
COMM_NODE_TYPES = frozenset({pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE})

ERROR = "error"
WARNING = "warning"

FORMAT_CHAKRA = "chakra"
FORMAT_ET_JSON = "et-json"


@dataclass(frozen=True)
class ViolationKind:
    """A kind of violation: its name (stable, for scripts), severity and one-line meaning."""

    name: str
    severity: str
    description: str


_KIND_LIST = (
    ViolationKind("metadata_empty", ERROR, "the GlobalMetadata message is empty (reads as end-of-file)"),
    ViolationKind("metadata_not_first", ERROR, "the first message is a Node, not a GlobalMetadata"),
    ViolationKind("metadata_unknown_fields", WARNING, "GlobalMetadata has fields this schema does not know"),
    ViolationKind("empty_message", ERROR, "zero-length Node message (the reference reader stops there)"),
    ViolationKind("bad_id", ERROR, "node id missing or not an integer"),
    ViolationKind("duplicate_id", ERROR, "node id used by more than one node"),
    ViolationKind("missing_parent", ERROR, "JSON node has neither 'parent' nor 'ctrl_deps'"),
    ViolationKind("bad_dependency", ERROR, "dependency value is not an integer id"),
    ViolationKind("dangling_parent", ERROR, "'parent' id is not a node of the file"),
    ViolationKind("dangling_ctrl_dep", ERROR, "ctrl_deps id is not a node of the file"),
    ViolationKind("dangling_data_dep", ERROR, "data_deps id is not a node of the file"),
    ViolationKind("cycle", ERROR, "cycle in the ctrl+data dependency graph (count: disjoint cycles found)"),
    ViolationKind("unknown_node_type", ERROR, "node type is not a NodeType value"),
    ViolationKind("invalid_node_type", WARNING, "node type is INVALID_NODE (skipped by ASTRA-sim)"),
    ViolationKind("comm_on_cpu", ERROR, "COMM node marked is_cpu_op=true (ASTRA-sim: comm node should not be on CPU)"),
    ViolationKind("comm_type_missing", ERROR, "collective node without a comm_type attribute"),
    ViolationKind("comm_type_unknown", ERROR, "comm_type is not a CollectiveCommType value"),
    ViolationKind("comm_type_unsupported", WARNING, "collective type ASTRA-sim cannot simulate"),
    ViolationKind("comm_size_missing", ERROR, "COMM node without a comm_size attribute"),
    ViolationKind("comm_size_not_positive", ERROR, "comm_size is not > 0"),
    ViolationKind("comm_peer_missing", ERROR, "send node without comm_dst / recv node without comm_src"),
    ViolationKind("comm_attr_kind", WARNING, "comm attribute not stored as int64_val"),
)
VIOLATION_KINDS: dict[str, ViolationKind] = {kind.name: kind for kind in _KIND_LIST}
_KIND_ORDER = {kind.name: position for position, kind in enumerate(_KIND_LIST)}


@dataclass
class Violation:
    """All occurrences of one kind: total ``count``, the first offending ``node_ids`` and, aligned
    with them, a short ``details`` text each (e.g. the missing dependency)."""

    kind: str
    severity: str
    description: str
    count: int = 0
    node_ids: list[int] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


@dataclass
class ValidationResult:
    """Outcome of ``validate_file``. ``ok`` is True when there is no error (warnings allowed).

    ``counts_by_type``: Chakra NodeType name -> count; for JSON ``{"cpu": n, "gpu": m}`` where a
    GPU node is one whose ``cat`` is kernel / gpu_memcpy / gpu_memset.
    """

    path: str
    file_format: str
    layout: str
    schema: str | None
    node_count: int
    counts_by_type: dict[str, int]
    violations: list[Violation]
    ok: bool

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == ERROR]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == WARNING]

    def violation(self, kind: str) -> Violation | None:
        """The violation of that kind, or None when the file has none."""
        return next((v for v in self.violations if v.kind == kind), None)


class _ViolationLog:
    """Counts violations by kind, keeping the first ``max_examples`` node ids of each. O(1) per add."""

    def __init__(self, max_examples: int):
        self._max_examples = max_examples
        self._by_kind: dict[str, Violation] = {}

    def add(self, kind_name: str, node_id: int, detail: str = "") -> None:
        violation = self._by_kind.get(kind_name)
        if violation is None:
            kind = VIOLATION_KINDS[kind_name]
            violation = self._by_kind[kind_name] = Violation(kind.name, kind.severity, kind.description)
        violation.count += 1
        if len(violation.node_ids) < self._max_examples:
            violation.node_ids.append(node_id)
            violation.details.append(detail)

    def violations(self) -> list[Violation]:
        """Errors first, then warnings; within a severity in the order of ``VIOLATION_KINDS``."""
        return sorted(self._by_kind.values(), key=lambda v: (v.severity != ERROR, _KIND_ORDER[v.kind]))


# ---------------------------------------------------------------------------------------------
# Dependency graph checks (shared by both formats)
# ---------------------------------------------------------------------------------------------


NO_EDGE = -1


@dataclass
class DependencyTable:
    """Node ids in file order and their dependencies, flat: node ``i``'s deps are
    ``dep_ids[dep_starts[i]:dep_starts[i+1]]``, its ``ctrl_counts[i]`` ctrl deps (parents) first,
    then its data deps. ``self_reference_ok`` holds the positions allowed to name themselves as
    parent (the ET process root). Memory: 8 bytes per dependency + 20 per node."""

    typecode: str = "Q"
    node_ids: array = field(init=False)
    dep_starts: array = field(init=False)
    dep_ids: array = field(init=False)
    ctrl_counts: array = field(default_factory=lambda: array("I"))
    self_reference_ok: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.node_ids = array(self.typecode)
        self.dep_starts = array("Q", [0])
        self.dep_ids = array(self.typecode)

    def add_node(self, node_id: int, ctrl_deps: Sequence[int], data_deps: Sequence[int]) -> None:
        """Append one node (O(#deps)). Ids must fit the table's typecode."""
        self.node_ids.append(node_id)
        self.dep_ids.extend(ctrl_deps)
        self.dep_ids.extend(data_deps)
        self.ctrl_counts.append(len(ctrl_deps))
        self.dep_starts.append(len(self.dep_ids))

    def is_data_dep(self, position: int, k: int) -> bool:
        """Whether dependency ``k`` (an index into ``dep_ids``) of node ``position`` is a data dep."""
        return k - self.dep_starts[position] >= self.ctrl_counts[position]

    def __len__(self) -> int:
        return len(self.node_ids)


def check_dependency_graph(table: DependencyTable, log: _ViolationLog, ctrl_kind: str = "dangling_ctrl_dep") -> None:
    """Report duplicate ids, dangling dependencies (``ctrl_kind`` for ctrl deps) and cycles.

    A graph whose edges all point the same way in file order is acyclic (checked first, in C
    loops); otherwise Kahn's algorithm finds the nodes on or behind a cycle and a walk over their
    dependencies names node-disjoint cycles. Cost: O(nodes + deps) time and memory.
    """
    index = _index_ids(table, log)
    owners = _dependency_owners(table)
    sources = _dependency_sources(table, index, owners, log, ctrl_kind)
    if NO_EDGE in sources:
        owners = [owner for source, owner in zip(sources, owners) if source != NO_EDGE]
        sources = [source for source in sources if source != NO_EDGE]
    if all(map(operator.lt, sources, owners)) or all(map(operator.gt, sources, owners)):
        return
    unprocessed = _kahn_unprocessed(len(table), sources, owners)
    if not unprocessed:
        return
    for number, cycle in enumerate(_find_cycles(table, index, unprocessed)):
        ids = [table.node_ids[position] for position in cycle]
        path = " -> ".join(map(str, ids + [ids[0]])) if len(ids) <= 8 else " -> ".join(map(str, ids[:8])) + " -> ..."
        note = f"; {len(unprocessed):,} nodes on or behind a cycle can never run" if number == 0 else ""
        log.add("cycle", ids[0], f"cycle of {len(ids)}: {path}{note}")


def _index_ids(table: DependencyTable, log: _ViolationLog) -> dict[int, int]:
    """id -> position of its first node; duplicates reported. O(nodes)."""
    index = dict(zip(table.node_ids, range(len(table.node_ids))))
    if len(index) == len(table.node_ids):
        return index
    index = {}
    for position, node_id in enumerate(table.node_ids):
        first = index.setdefault(node_id, position)
        if first != position:
            log.add("duplicate_id", node_id, f"node #{position} repeats the id of node #{first}")
    return index


def _dependency_owners(table: DependencyTable) -> list[int]:
    """For each dependency, the position of the node that has it. O(deps)."""
    starts = table.dep_starts
    counts = map(operator.sub, itertools.islice(starts, 1, None), starts)
    return list(itertools.chain.from_iterable(map(itertools.repeat, itertools.count(), counts)))


def _dependency_sources(
    table: DependencyTable, index: dict[int, int], owners: list[int], log: _ViolationLog, ctrl_kind: str
) -> list[int]:
    """For each dependency, the position of the node it names; NO_EDGE when that node is missing
    (reported) or for the process root's allowed reference to itself. O(deps)."""
    sources = list(map(index.get, table.dep_ids, itertools.repeat(NO_EDGE)))
    if NO_EDGE in sources:
        for k, source in enumerate(sources):
            if source == NO_EDGE:
                kind = "dangling_data_dep" if table.is_data_dep(owners[k], k) else ctrl_kind
                owner_id = table.node_ids[owners[k]]
                log.add(kind, owner_id, f"depends on {table.dep_ids[k]}, which is not in the file")
    for position in table.self_reference_ok:
        for k in range(table.dep_starts[position], table.dep_starts[position + 1]):
            if sources[k] == position and not table.is_data_dep(position, k):
                sources[k] = NO_EDGE
    return sources


def _kahn_unprocessed(node_count: int, sources: list[int], targets: list[int]) -> set[int]:
    """Positions never reaching in-degree 0 (on or behind a cycle). O(nodes + edges)."""
    in_degree = [0] * node_count
    out_count = [0] * (node_count + 1)
    for source, target in zip(sources, targets):
        in_degree[target] += 1
        out_count[source + 1] += 1
    out_start = list(itertools.accumulate(out_count))
    successors = [0] * len(sources)
    fill = out_start[:]
    for source, target in zip(sources, targets):
        successors[fill[source]] = target
        fill[source] += 1
    ready = [position for position, degree in enumerate(in_degree) if not degree]
    done = 0
    while ready:
        position = ready.pop()
        done += 1
        for successor in successors[out_start[position] : out_start[position + 1]]:
            in_degree[successor] -= 1
            if not in_degree[successor]:
                ready.append(successor)
    if done == node_count:
        return set()
    return {position for position, degree in enumerate(in_degree) if degree}


def _find_cycles(table: DependencyTable, index: dict[int, int], unprocessed: set[int]) -> Iterator[list[int]]:
    """Yield node-disjoint cycles (positions in dependency order: each depends on the previous).

    Every unprocessed node has an unprocessed dependency, so a walk along dependencies from one
    must revisit a node: if first seen in this walk, the walk's tail from there is a new cycle;
    if seen in an earlier walk, that walk already reported the cycle ahead. Each node is walked
    at most once: O(nodes + deps) in all.
    """
    walk_of: dict[int, int] = {}
    for walk_number, start in enumerate(sorted(unprocessed)):
        if start in walk_of:
            continue
        walk: list[int] = []
        position = start
        while position not in walk_of:
            walk_of[position] = walk_number
            walk.append(position)
            position = _unprocessed_dependency(table, index, unprocessed, position)
        if walk_of[position] == walk_number:
            cycle = walk[walk.index(position) :]
            cycle.reverse()
            yield cycle


def _unprocessed_dependency(table: DependencyTable, index: dict[int, int], unprocessed: set[int], position: int) -> int:
    for k in range(table.dep_starts[position], table.dep_starts[position + 1]):
        source = index.get(table.dep_ids[k])
        if source is None or source not in unprocessed:
            continue
        if source == position and position in table.self_reference_ok and not table.is_data_dep(position, k):
            continue
        return source
    raise AssertionError("unprocessed node without an unprocessed dependency")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Chakra protobuf
# ---------------------------------------------------------------------------------------------


def _chakra_metadata(frame: Frame, path: Path, log: _ViolationLog) -> tuple[pb.GlobalMetadata, pb.Node | None]:
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


def _check_comm_node(node: pb.Node, log: _ViolationLog) -> None:
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


def _int_attr(node: pb.Node, attr: pb.AttributeProto | None, name: str, log: _ViolationLog) -> int | None:
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
    log = _ViolationLog(max_examples)
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
    check_dependency_graph(table, log, "dangling_ctrl_dep")
    counts = {_type_name(node_type): count for node_type, count in sorted(type_counts.items())}
    return _result(p, FORMAT_CHAKRA, "protobuf", _metadata_schema(metadata), len(table), counts, log)


# ---------------------------------------------------------------------------------------------
# ET / ET+ JSON
# ---------------------------------------------------------------------------------------------


class _JsonNode(msgspec.Struct):
    """The keys of an ET/ET+ node the checks read; everything else (inputs, outputs, attrs) is
    skipped by the decoder, never built, which keeps a large ET's check to a fraction of a full
    parse's memory. UNSET = key absent."""

    id: Any = UNSET
    name: Any = UNSET
    cat: Any = UNSET
    ctrl_deps: Any = UNSET
    parent: Any = UNSET
    data_deps: Any = UNSET


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


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _is_int64(value: Any) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _dep_list(value: Any) -> Sequence[int] | None:
    """A dependency field as a sequence of ints (JSON stores one int or a list); None if malformed."""
    if _is_int64(value):
        return (value,)
    if isinstance(value, list) and all(map(_is_int64, value)):
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
    log = _ViolationLog(max_examples)
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
    return _result(p, FORMAT_ET_JSON, layout, schema if isinstance(schema, str) else None, len(table), counts, log)


def _add_json_node(
    position: int, node: _JsonNode | None, table: DependencyTable, counts: dict[str, int], log: _ViolationLog
) -> None:
    """Count one JSON node and add it to the table (or report why it cannot be). O(#deps)."""
    node_id = node.id if node is not None else None
    if not _is_int64(node_id):
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
    if node_id in parents and node.name in PROCESS_ROOT_NAMES:
        table.self_reference_ok.add(len(table) - 1)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def _result(
    path: Path, file_format: str, layout: str, schema: str | None, node_count: int,
    counts: dict[str, int], log: _ViolationLog,
) -> ValidationResult:
    violations = log.violations()
    ok = not any(v.severity == ERROR for v in violations)
    return ValidationResult(str(path), file_format, layout, schema, node_count, counts, violations, ok)


def _looks_like_json(path: Path) -> bool:
    """True when the (decompressed) content starts with '{' after whitespace. Reads a few KiB."""
    stream = open_binary(path)
    try:
        head = stream.read(4096)
    except (OSError, EOFError):
        return False
    finally:
        stream.close()
    return head.lstrip()[:1] == b"{"


def validate_file(path: str | os.PathLike, max_examples: int = DEFAULT_MAX_EXAMPLES) -> ValidationResult:
    """Validate a Chakra protobuf or ET/ET+ JSON file; the format is detected from the content.

    ``max_examples``: node ids kept per violation kind. Raises ``TraceFormatError`` for a file
    that cannot be decoded. See ``validate_chakra`` / ``validate_json`` for costs.
    """
    p = Path(path)
    if _looks_like_json(p):
        return validate_json(p, max_examples)
    if p.name.endswith((".json", ".json.gz")):  # named JSON, but is not: maybe a renamed Chakra file
        try:
            return validate_chakra(p, max_examples)
        except TraceFormatError as err:
            raise TraceFormatError(p, "not JSON (it does not start with '{') and not a Chakra trace "
                                   f"either ({err.problem})") from None
    return validate_chakra(p, max_examples)


def format_result(result: ValidationResult, examples: int = 5) -> str:
    """Human-readable report: verdict, node counts, then each violation with a few examples."""
    verdict = "OK" if result.ok else "FAILED"
    kind = "Chakra protobuf" if result.file_format == FORMAT_CHAKRA else f"ET JSON, '{result.layout}' layout"
    schema = f", schema {result.schema}" if result.schema else ""
    lines = [f"{result.path}: {verdict} ({kind}, {result.node_count:,} nodes{schema})"]
    counts = ", ".join(f"{name} {count:,}" for name, count in sorted(result.counts_by_type.items()))
    lines.append(f"  nodes by type: {counts or 'none'}")
    for violation in result.violations:
        lines.append(
            f"  {violation.severity.upper():7} {violation.kind} x{violation.count:,}: {violation.description}"
        )
        for node_id, detail in list(zip(violation.node_ids, violation.details))[:examples]:
            lines.append(f"          node {node_id}" + (f": {detail}" if detail else ""))
        hidden = violation.count - min(examples, len(violation.node_ids))
        if hidden > 0:
            lines.append(f"          ... {hidden:,} more")
    if not result.violations:
        lines.append("  no violations")
    return "\n".join(lines)

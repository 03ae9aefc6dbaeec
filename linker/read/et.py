"""Read a PyTorch Execution Trace (ET) into an ``ExecutionTrace``.

Both node layouts of docs/formats.md are read; the schema string is data, the layout is detected
from the nodes themselves (``parent`` + flat keys = "flat", ``ctrl_deps`` + ``attrs`` = "nested").

Decoding uses msgspec structs: the fields linking needs are typed, the bulky nested parts
(``inputs``, ``outputs``, shapes, types, and any key this module does not know) stay raw JSON
bytes and are written back out untouched. Unknown keys are discovered, not dropped: a decode that
meets one adds it as a raw field and retries. Cost: one decode pass over the file (plus one per
distinct unknown key), then one O(n) pass to build the columns (the nested layout's ``attrs``
decoded once more, by position: ``_positional_decoder``, or by name: ``attrs_by_position``). The
``op_schema`` column, which linking does not use, is decoded on first use (one more pass over
``attrs``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import msgspec

from linker.model.errors import TraceInputError
from linker.read.files import read_trace_bytes

UNSET = msgspec.UNSET
Unset = msgspec.UnsetType
Raw = msgspec.Raw

PROCESS_ROOT_NAMES = (
    "[pytorch|profiler|execution_trace|process]",
    "[pytorch|profiler|execution_graph|process]",
)
THREAD_ROOT_NAMES = (
    "[pytorch|profiler|execution_trace|thread]",
    "[pytorch|profiler|execution_graph|thread]",
)

ROOT_NAMES = frozenset(PROCESS_ROOT_NAMES + THREAD_ROOT_NAMES)

# Layout names, as reported.
FLAT = "flat"  # schema 1.0.1: "parent", flat rf_id/tid/... keys
NESTED = "nested"  # schema 1.0.2+: "ctrl_deps", inputs/outputs objects, "attrs" list


class SimulationFields(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The simulation fields ``plan.json_fields`` writes on every ET+ node it times, CPU (``EtNode``)
    and GPU (``link.etplus.GpuNode``) alike: ``data_deps`` (node ids) with ``data_dep_causes`` (one
    cause each), and a communication node's ``comm_type`` (Chakra enum name) and ``comm_size``
    (bytes). Keyword-only: msgspec puts keyword-only fields after the others, so these end a node's
    keys in the output, followed only by a subclass's own keyword-only fields."""

    data_deps: Any = UNSET
    data_dep_causes: Any = UNSET
    comm_type: Any = UNSET
    comm_size: Any = UNSET


class _CollectiveFields(SimulationFields, kw_only=True, omit_defaults=True):
    """A CPU collective's process group and its number among that group's calls, or a CPU send's
    or receive's group, peer ranks, tag and side (``plan.cpu_comm``), written after the simulation
    fields."""

    pg_name: Any = UNSET
    comm_seq: Any = UNSET
    comm_src: Any = UNSET
    comm_dst: Any = UNSET
    comm_tag: Any = UNSET
    comm_role: Any = UNSET


class EtNode(_CollectiveFields, forbid_unknown_fields=True, omit_defaults=True):
    """One ET node as decoded. Fields absent in the file stay UNSET and are not written back.

    ``ts``/``dur``/``inclusive_dur``/``exclusive_dur`` are the ET+ fields the linker fills in.
    """

    id: int
    name: str
    ctrl_deps: int | Unset = UNSET
    parent: int | Unset = UNSET
    inputs: Raw | Unset = UNSET
    outputs: Raw | Unset = UNSET
    attrs: Raw | Unset = UNSET  # decoded on demand: ``decode_attr_values``
    rf_id: int | Unset = UNSET
    fw_parent: int | Unset = UNSET
    seq_id: int | Unset = UNSET
    scope: int | Unset = UNSET
    tid: int | Unset = UNSET
    fw_tid: int | Unset = UNSET
    op_schema: str | Unset = UNSET
    input_shapes: Raw | Unset = UNSET
    input_types: Raw | Unset = UNSET
    output_shapes: Raw | Unset = UNSET
    output_types: Raw | Unset = UNSET
    ts: float | Unset = UNSET
    dur: float | Unset = UNSET
    inclusive_dur: float | Unset = UNSET
    exclusive_dur: float | Unset = UNSET
    # The busy split the linker fills in (``plan.json_fields``); then, from the bases, the
    # dependencies with causes and a collective's communication attributes.
    blocked_dur: float | Unset = UNSET
    host_gap_dur: float | Unset = UNSET
    deferred_dur: float | Unset = UNSET
    folded_dur: float | Unset = UNSET
    sim_dur: float | Unset = UNSET


def decode_attr_values(node: EtNode) -> list:
    """The nested-layout ``attrs`` of a node as entries with ``name`` and ``value`` only (their
    ``type`` skipped), empty when it has none. They stay raw in ``EtNode`` (ten small objects per
    node would be most of a big ET's memory) and are written back byte for byte. O(len(attrs))."""
    if node.attrs is UNSET:
        return []
    return _ATTR_VALUES_DECODER.decode(node.attrs)


class _ShapesOnly(msgspec.Struct):
    shapes: Any = None


_UNKNOWN_FIELD = re.compile(r"unknown field `(?P<key>[^`]*)`(?: - at `(?P<where>[^`]*)`)?")


def parent_positions(parent_ids: list[int], index_of_id: dict[int, int]) -> list[int]:
    """Index of each node's parent by ``index_of_id``, -1 for a missing parent or the node's own
    id. O(n)."""
    parent = [index_of_id.get(parent_id, -1) for parent_id in parent_ids]
    return [-1 if p == i else p for i, p in enumerate(parent)]


@dataclass
class ExecutionTrace:
    """An ET: its header, its decoded nodes, and columns over them (index = position in ``nodes``).

    ``header`` holds the top-level keys other than ``nodes`` (schema, pid, time, ...), as decoded.
    Column lists all have ``len(nodes)`` entries. ``parent[i]`` is the parent's node *id*.
    ``tid[i]`` is the ET thread number (0 for the process root), not an OS thread id.
    """

    path: str
    layout: str
    schema: str
    pid: int | None
    header: Any  # the decoded document struct, nodes included; written back by writers
    nodes: list[EtNode]
    text_bytes: int = 0  # size of the JSON text read (decompressed): a guess of the ET+ JSON's size
    ids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)
    rf_id: list[int] = field(default_factory=list)
    scope: list[int] = field(default_factory=list)
    _op_schema: list[str] | None = field(default_factory=list, repr=False)  # None: not decoded yet
    _op_indices: list[int] | None = field(default=None, repr=False)
    _root_positions: list[int] | None = field(default=None, repr=False)
    _index_of_id: dict[int, int] | None = field(default=None, repr=False)
    _parent_index: list[int] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.nodes)

    def is_root(self, i: int) -> bool:
        """True for the process root and the per-thread roots (not ops: never linked)."""
        return self.names[i] in ROOT_NAMES

    @property
    def op_schema(self) -> list[str]:
        """The ``op_schema`` of each node ("" when absent). Read from the nodes on first use (the
        linker never needs it), O(n) then; a list that can be appended to, as the other columns."""
        if self._op_schema is None:
            self._op_schema = _op_schema_column(self)
        return self._op_schema

    @op_schema.setter
    def op_schema(self, values: list[str]) -> None:
        self._op_schema = values

    def op_indices(self) -> list[int]:
        """Indices of all nodes that are ops (everything but the process and thread roots).
        Computed once (O(n)); do not modify the returned list."""
        if self._op_indices is None:
            roots = self.root_positions()
            if len(roots) > 64:
                self._op_indices = [i for i, name in enumerate(self.names) if name not in ROOT_NAMES]
            else:  # the usual few roots: taken out of all indices
                self._op_indices = list(range(len(self.names)))
                for root in reversed(roots):
                    del self._op_indices[root]
        return self._op_indices

    def root_positions(self) -> list[int]:
        """Indices of the process and thread roots, in node order. Computed once (O(n)); do not
        modify the returned list."""
        if self._root_positions is None:
            self._root_positions = [i for i, name in enumerate(self.names) if name in ROOT_NAMES]
        return self._root_positions

    def process_root(self) -> int:
        """Index of the first process root (-1 if the ET has none). O(1) after ``root_positions``."""
        return next((i for i in self.root_positions() if self.names[i] in PROCESS_ROOT_NAMES), -1)

    def input_shapes(self, i: int):
        """The decoded input shapes of node ``i`` (a list, or None). Decodes one small value."""
        node = self.nodes[i]
        if self.layout == FLAT:
            raw = node.input_shapes
            return msgspec.json.decode(raw) if raw is not UNSET else None
        if node.inputs is UNSET:
            return None
        return msgspec.json.decode(node.inputs, type=_ShapesOnly).shapes

    def index_of_id(self) -> dict[int, int]:
        """Map node id -> index. Computed once, O(n); do not modify."""
        if self._index_of_id is None:
            self._index_of_id = {node_id: i for i, node_id in enumerate(self.ids)}
        return self._index_of_id

    def parent_index(self) -> list[int]:
        """Index of each node's parent, or -1 (missing parent, or the process root's own id).
        Computed once, O(n); do not modify."""
        if self._parent_index is None:
            self._parent_index = parent_positions(self.parent, self.index_of_id())
        return self._parent_index

    def set_parent(self, i: int, parent_id: int) -> None:
        """Make node ``parent_id`` the parent of node i: the column, the node's own field (``parent``
        in the flat layout, ``ctrl_deps`` in the nested one) and the cached parent index. O(1);
        the index is made again on next use."""
        self.parent[i] = parent_id
        if self.layout == FLAT:
            self.nodes[i].parent = parent_id
        else:
            self.nodes[i].ctrl_deps = parent_id
        self._parent_index = None

    def threads(self) -> dict[int, list[int]]:
        """ET thread number -> op indices on that thread in start order (sorted by id). O(n log n)."""
        by_thread: dict[int, list[int]] = {}
        for i in sorted(self.op_indices(), key=self.ids.__getitem__):
            by_thread.setdefault(self.tid[i], []).append(i)
        return by_thread


def _document_type(node_type: type, extra_top: list[str]) -> type:
    fields = [
        ("schema", str | Unset, UNSET),
        ("pid", int | Unset, UNSET),
        ("time", str | Unset, UNSET),
        ("start_ts", int | Unset, UNSET),
        ("finish_ts", int | Unset, UNSET),
        ("nodes", list[node_type], msgspec.field(default_factory=list)),
    ]
    fields += _extra_fields(extra_top)
    return msgspec.defstruct(
        "EtDocument", fields, forbid_unknown_fields=True, omit_defaults=True
    )


def _extra_fields(keys: list[str]) -> list[tuple]:
    """Fields for keys the ET schema does not name, kept raw and written back under their own key.
    The attribute is a made-up identifier (``_extra_<k>``): a key may be any JSON string (a
    rocprofiler file's ``rocprofiler-sdk-tool``), which a struct's slot cannot be."""
    return [(f"_extra_{k}", Raw | Unset, msgspec.field(default=UNSET, name=key)) for k, key in enumerate(keys)]


def _node_type(extra_keys: list[str]) -> type:
    if not extra_keys:
        return EtNode
    fields = _extra_fields(extra_keys)
    return msgspec.defstruct(  # keyword-only: the unknown keys stay last, after the simulation fields
        "EtNodeExtended", fields, bases=(EtNode,), kw_only=True, forbid_unknown_fields=True, omit_defaults=True
    )


def _decode(path: Path, data: bytes) -> Any:
    """Decode the ET document, growing the struct types for unknown keys as they are met."""
    node_extra: list[str] = []
    top_extra: list[str] = []
    while True:
        node_type = _node_type(node_extra)
        doc_type = _document_type(node_type, top_extra)
        try:
            return msgspec.json.decode(data, type=doc_type)
        except msgspec.ValidationError as err:
            message = str(err)
            unknown = _UNKNOWN_FIELD.search(message)
            if unknown is None:
                raise TraceInputError(path, f"not a valid Execution Trace: {message}") from None
            key, where = unknown.group("key"), unknown.group("where") or "$"
            if where == "$":
                if key == "traceEvents":
                    raise TraceInputError(
                        path, "this is a Kineto trace, not an Execution Trace (arguments swapped?)"
                    ) from None
                top_extra.append(key)
            elif re.fullmatch(r"\$\.nodes\[\d+\]", where):
                node_extra.append(key)
            else:
                raise TraceInputError(path, f"not a valid Execution Trace: {message}") from None
            if len(node_extra) + len(top_extra) > 256:
                raise TraceInputError(path, "not an Execution Trace: too many unknown keys")
        except msgspec.DecodeError as err:
            raise TraceInputError(path, f"not valid JSON ({err})") from None


def _detect_layout(nodes: list[EtNode]) -> str:
    for node in nodes:
        if node.ctrl_deps is not UNSET or node.attrs is not UNSET:
            return NESTED
        if node.parent is not UNSET:
            return FLAT
    return NESTED


class _AttrValue(msgspec.Struct, gc=False):
    """An ``attrs`` entry as the columns need it: its ``type`` is skipped, never materialised."""

    name: str
    value: Any = None


_ATTR_VALUES_DECODER = msgspec.json.Decoder(list[_AttrValue])


def _int(value: Any, default: int = 0) -> int:
    if type(value) is int:
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _fill_columns(et: ExecutionTrace, nodes_per_block: int, attrs_by_position: bool) -> None:
    nodes = et.nodes
    et.ids = [node.id for node in nodes]
    et.names = [node.name for node in nodes]
    if et.layout == FLAT:
        et.parent = [node.parent if node.parent is not UNSET else node.id for node in nodes]
        et.tid = [node.tid if node.tid is not UNSET else 0 for node in nodes]
        et.rf_id = [node.rf_id if node.rf_id is not UNSET else 0 for node in nodes]
        et.scope = [node.scope if node.scope is not UNSET else 0 for node in nodes]
        et.op_schema = [node.op_schema if node.op_schema is not UNSET else "" for node in nodes]
        return
    et.parent = [node.ctrl_deps if node.ctrl_deps is not UNSET else node.id for node in nodes]
    et._op_schema = None  # decoded on first use: ``_op_schema_column``
    tid, rf_id, scope = et.tid, et.rf_id, et.scope
    positional = _positional_decoder(nodes, nodes_per_block) if attrs_by_position else None
    positions: dict[str, int] = dict(positional[1]) if positional else {}  # node 0's, as learned
    for start in range(0, len(nodes), nodes_per_block):  # blocks: the decoded attrs stay small
        block = nodes[start:start + nodes_per_block]
        fast = _positional_columns(block, positional, positions, et.path)
        if fast is not None:
            for column, values in zip((tid, rf_id, scope), fast):
                column.extend(values)
            continue
        attrs = _decoded_attrs(block, et.path)
        tid.extend(_attr_column(attrs, "tid", _int, positions))
        rf_id.extend(_attr_column(attrs, "rf_id", _int, positions))
        scope.extend(_attr_column(attrs, "scope", _int, positions))


def _decoded_attrs(block: list, path: str) -> list[list]:
    """Each node's ``attrs`` decoded by name (name/value only). A malformed entry (no name, not an
    object) is the file's fault: ``TraceInputError`` naming the node."""
    decode = _ATTR_VALUES_DECODER.decode
    try:
        return [decode(node.attrs) if node.attrs is not UNSET else [] for node in block]
    except msgspec.DecodeError:
        for node in block:  # only on failure: which node
            try:
                decode(node.attrs) if node.attrs is not UNSET else None
            except msgspec.DecodeError as err:
                raise TraceInputError(path, f"not a valid Execution Trace: node {node.id}'s attrs: {err}") from None
        raise


def _op_schema_column(et: ExecutionTrace) -> list[str]:
    """The nested layout's ``op_schema`` of every node, read by name as ``_fill_columns`` reads the
    other columns (the position where the first node holding it has it, else the last one). O(n)."""
    column: list[str] = []
    positions: dict[str, int] = {}
    for start in range(0, len(et.nodes), NODES_PER_BLOCK):
        block = et.nodes[start:start + NODES_PER_BLOCK]
        attrs = _decoded_attrs(block, et.path)
        column.extend(_attr_column(attrs, "op_schema", _text, positions))
    return column


# The attributes the columns hold (``op_schema``: on first use), with their conversion; the order of ``_fill_columns``.
_COLUMN_ATTRS = (("tid", _int), ("rf_id", _int), ("scope", _int))
NODES_PER_BLOCK = 16384  # nodes whose nested-layout attrs are decoded at a time, by default


def _positional_decoder(nodes: list[EtNode], nodes_per_block: int = NODES_PER_BLOCK):
    """A decoder of one node's ``attrs`` by position, or None: the list as an array of entries whose
    ``name`` must be the one at that place (a ``Literal``: no string made), only the column
    attributes' ``value`` decoded (an int, 0 when absent: another value is a misfit, read by name
    and converted there), and the entries after the last column attribute skipped (msgspec ignores
    trailing array items: not decoded, so not checked either; they stay raw and are written back).

    The positions are those the by-name path learns (the first node of the first block holding each
    column attribute, its first place there), found among the first nodes; the layout is the
    shortest of theirs with each column attribute at its place, cut after the last of them. A node
    laid out otherwise fails the decode and is read by name; a node whose list is longer is read by
    its first entries, as the by-name path takes a value found at its place: same columns. The
    first nodes: those of the first block, at most ``_LAYOUT_SAMPLE``."""
    sample = nodes[:min(_LAYOUT_SAMPLE, nodes_per_block)]
    try:
        layouts = [[entry.name for entry in _ATTR_VALUES_DECODER.decode(node.attrs)]
                   for node in sample if node.attrs is not UNSET]
    except msgspec.ValidationError:
        return None
    learned: dict[str, int] = {}
    for names in layouts:
        for name, _ in _COLUMN_ATTRS:
            if name not in learned and name in names:
                learned[name] = names.index(name)
    fitting = [names for names in layouts
               if all(len(names) > k and names[k] == name for name, k in learned.items())]
    if len(learned) < len(_COLUMN_ATTRS) or not fitting:
        return None
    fields = []
    last = max(learned.values())  # entries after the last column attribute: skipped, not decoded
    for k, name in enumerate(min(fitting, key=len)[:last + 1]):  # a column attribute's entry: the field of its name
        column = learned.get(name) == k
        entry = [("name", Literal[name])] + ([("value", int, 0)] if column else [])
        fields.append((name if column else f"_{k}", msgspec.defstruct(f"_Attr{k}", entry, gc=False)))
    layout = msgspec.defstruct("_AttrLayout", fields, array_like=True, gc=False)
    return msgspec.json.Decoder(layout).decode, learned


_LAYOUT_SAMPLE = 64  # nodes looked at for the positional layout


def _positional_columns(block: list[EtNode], positional, positions: dict[str, int],
                        path: str) -> list[list] | None:
    """The column attributes of ``block`` by the positional decoder (None without one); a node laid
    out otherwise (or without ``attrs``) is read by name at the same ``positions``. O(len(block));
    other attributes decode to a small struct each (their name matched, not made; value skipped)."""
    if positional is None:
        return None
    decode, _ = positional
    misfits: list[int] = []
    try:
        decoded = [decode(node.attrs) for node in block]
    except _MISFIT:
        decoded = [_decoded_or_placeholder(decode, node.attrs) for node in block]
        misfits = [i for i, d in enumerate(decoded) if d is _MISFIT_VALUES]
    columns = [[d.tid.value for d in decoded], [d.rf_id.value for d in decoded],
               [d.scope.value for d in decoded]]  # as _COLUMN_ATTRS
    if misfits:  # read by name and converted, as the by-name path reads them
        attrs = _decoded_attrs([block[i] for i in misfits], path)
        for column, (name, convert) in zip(columns, _COLUMN_ATTRS):
            for i, value in zip(misfits, _attr_column(attrs, name, convert, positions)):
                column[i] = value
    return columns


_MISFIT = (msgspec.ValidationError, msgspec.DecodeError, TypeError)  # laid out otherwise, or no attrs
_NO_VALUE = SimpleNamespace(value=None)
_MISFIT_VALUES = SimpleNamespace(tid=_NO_VALUE, rf_id=_NO_VALUE, scope=_NO_VALUE)


def _decoded_or_placeholder(decode, attrs):
    """The decoded ``attrs``, or ``_MISFIT_VALUES`` (placeholders) when laid out otherwise."""
    try:
        return decode(attrs)
    except _MISFIT:
        return _MISFIT_VALUES


def _text(value: Any) -> str:
    return str(value or "")


def _attr_column(attrs: list[list[_AttrValue]], name: str, convert, positions: dict[str, int]) -> list:
    """The value of attribute ``name`` of every node, converted (a missing one converts None).

    ETs list the attributes in one order: the position where the first node that has ``name``
    holds it (remembered in ``positions``) is looked at first; a node holding another name there is searched (last occurrence
    wins). O(n) for n nodes."""
    position = positions.get(name)
    if position is None:
        position = next((_position(a, name) for a in attrs if _position(a, name) >= 0), None)
        if position is None:
            position = 0
        else:
            positions[name] = position
    column = [a[position].value if len(a) > position and a[position].name == name else _find(a, name)
              for a in attrs]
    if convert is _int:
        return [v if type(v) is int else _int(v) for v in column]
    return [convert(v) for v in column]


def _position(attrs: list[_AttrValue], name: str) -> int:
    for i, attr in enumerate(attrs):
        if attr.name == name:
            return i
    return -1


def _find(attrs: list[_AttrValue], name: str) -> Any:
    for attr in reversed(attrs):
        if attr.name == name:
            return attr.value
    return None


def read_execution_trace(path: str | Path, inflate_into=None, *, nodes_per_block: int = NODES_PER_BLOCK,
                         attrs_by_position: bool = True) -> ExecutionTrace:
    """Load an ET file (``.json`` or gzip). Raises ``TraceInputError`` with a one-line reason.
    ``inflate_into``: see ``files.read_trace_bytes``. The nested layout's ``attrs`` are decoded for
    the columns ``nodes_per_block`` nodes at a time (the decoded lists live for one block only), by
    the positions the first nodes show (``_positional_decoder``), or, with ``attrs_by_position``
    False, by name for every node: the general path, slower, the same columns and errors."""
    path = Path(path)
    data = read_trace_bytes(path, inflate_into)
    doc = _decode(path, data)
    if not doc.nodes:
        raise TraceInputError(path, "not an Execution Trace: no 'nodes' (or an empty list)")
    layout = _detect_layout(doc.nodes)
    et = ExecutionTrace(
        path=str(path),
        layout=layout,
        schema=doc.schema if doc.schema is not UNSET else "",
        pid=doc.pid if doc.pid is not UNSET else None,
        header=doc,
        nodes=doc.nodes,
        text_bytes=len(data),
    )
    _fill_columns(et, nodes_per_block, attrs_by_position)
    if len(set(et.ids)) != len(et.ids):
        raise TraceInputError(path, "not a valid Execution Trace: node ids are not unique")
    return et

"""Edits of a written output's nodes: a node's busy time cut short, its dependencies re-pointed or
added to, and new nodes that continue it (``Piece``), in an ET+ JSON or a ``.et`` (plain or gzip),
atomically.

What to edit is the caller's to decide (``sim.device_edges``: a kernel that held the device
until another stream's kernel started, cut there); this module only writes it. A cut node keeps
its id, measured start and measured time (JSON ``dur``/``inclusive_dur``; ``.et``
``inclusive_dur_micros``, added when absent) and its busy time becomes its first part
(``sim_dur`` / ``duration_micros``); each later part is a ``Piece``: same name and unit, the node
as its parent and in ``continues``, as an op's later pieces have them, on the measured timeline
where it ran, after the part before it (``stream_order``), ids above the file's largest. JSON:
pieces appended after the nodes; ``.et``: each right after the part before it, and the file kept
in a topological order (``_TopologicalOrder``). Cost: one copy of the file; only the edited
nodes are decoded (JSON: the others are kept as the bytes they were written as, ``.et``: frames
copied as bytes, but while a node is held back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from linker.model import et_def_pb2 as pb
from linker.model.errors import TraceInputError
from linker.read.files import read_trace_bytes
from linker.write.chakra_wire import EtWriter, encode_varint, find_attr, iter_frames, make_attr, parse_metadata
from linker.write.protobuf_wire import decode_varint
from linker.write.sink import atomic_output

_NODE_KEYS = ("name", "cat", "ph", "stream", "device", "attrs")  # what a JSON piece takes of its node
_PARENT_KEYS = ("ctrl_deps", "parent")  # the parent key of a JSON node, as its layout has it
_PIECE_ATTRS = ("is_cpu_op", "tid", "stream", "device")  # what a .et piece takes of its node


@dataclass
class NodeEdit:
    """What changes on one node: ``busy`` its new busy time (µs; None: as written), ``repoint``
    dependencies replaced (old id -> new id, the cause kept), ``add`` dependencies appended with
    their causes."""

    busy: float | None = None
    repoint: dict[int, int] = field(default_factory=dict)
    add: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Piece:
    """A later part of node ``continues``: id ``id``, beginning ``offset`` µs after the node's
    measured start and lasting ``micros``, after node ``after`` (cause ``cause``)."""

    id: int
    continues: int
    offset: float
    micros: float
    after: int
    cause: str


def edit_nodes(path: str | Path, edits: dict[int, NodeEdit], pieces: list[Piece]) -> None:
    """Rewrite ``path`` (ET+ JSON or ``.et``, by suffix) with ``edits`` (node id -> its edit) and
    ``pieces`` appended. Raises TraceInputError when the file cannot be read or written or lacks
    a node named."""
    path = Path(path)
    if not edits and not pieces:
        return
    if path.name.lower().endswith((".et", ".et.gz")):
        _edit_chakra(path, edits, pieces)
    else:
        _edit_json(path, edits, pieces)


def _missing(path: Path, ids) -> TraceInputError:
    return TraceInputError(path, f"has no node with id {min(ids)} to edit")


# --- ET+ JSON ------------------------------------------------------------------------------------


class _Named(msgspec.Struct):
    """What a rewrite reads of every node of an ET+ JSON (the rest stays as written)."""

    id: object = None
    name: object = None


JSON_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])  # an object's keys, their values as written
JSON_NODES = msgspec.json.Decoder(list[msgspec.Raw])  # a document's nodes, each as written
_NODE_NAMES = msgspec.json.Decoder(list[_Named])
_NODES_PER_WRITE = 4096  # nodes joined into one write (a gzip output compresses each write)


def _edit_json(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece]) -> None:
    document = JsonDocument.read(path)
    document.edit(edits, pieces)
    document.write()


class JsonDocument:
    """An ET+ JSON output as a rewrite holds it: its keys and values as written (``doc``:
    ``msgspec.Raw``) and its nodes as the bytes they were written as (``nodes``: views into the
    file's bytes; an edited node encoded again; nodes added appended), with each node's ``ids``
    and ``names``. ``read`` decodes the document's structure and its nodes' ids and names only;
    ``write`` writes it back atomically. O(file bytes)."""

    def __init__(self, path: Path, doc: dict, nodes: list, ids: list, names: list):
        self.path, self.doc, self.nodes, self.ids, self.names = path, doc, nodes, ids, names

    @classmethod
    def read(cls, path: Path) -> "JsonDocument":
        data = read_trace_bytes(path)
        try:
            doc = JSON_FIELDS.decode(data)
            nodes: list = JSON_NODES.decode(doc["nodes"])
            named = _NODE_NAMES.decode(doc["nodes"])
        except (msgspec.DecodeError, KeyError) as err:
            raise TraceInputError(path, f"not an ET+ JSON document ({err})") from None
        return cls(path, doc, nodes, [node.id for node in named], [node.name for node in named])

    def append(self, node: dict) -> None:
        """Append a node made anew (its fields as values or ``msgspec.Raw``)."""
        self.nodes.append(msgspec.json.encode(node))
        self.ids.append(node["id"])
        self.names.append(msgspec.json.decode(node["name"]) if isinstance(node["name"], msgspec.Raw) else node["name"])

    def edit(self, edits: dict[int, NodeEdit], pieces: list[Piece]) -> None:
        """Apply ``edits`` to the nodes they name and append ``pieces`` (module docstring); only
        the edited and continued nodes are decoded. Raises TraceInputError when a node named is
        missing."""
        wanted = set(edits) | {piece.continues for piece in pieces}
        decoded = {}  # node id -> (position, its fields as written)
        for k, node_id in enumerate(self.ids):
            if node_id in wanted:
                decoded[node_id] = (k, JSON_FIELDS.decode(self.nodes[k]))
        if wanted - decoded.keys():
            raise _missing(self.path, wanted - decoded.keys())
        for piece in pieces:  # made from the node as written, before its edit
            self.append(_json_piece(decoded[piece.continues][1], piece))
        for node_id, edit in edits.items():
            k, node = decoded[node_id]
            _edit_json_node(node, edit)
            self.nodes[k] = msgspec.json.encode(node)

    def write(self) -> None:
        write_json_document(self.path, self.doc, self.nodes)


def write_json_document(path: Path, doc: dict, nodes: list) -> None:
    """Write an ET+ JSON document atomically: ``doc``'s keys and values as read (``msgspec.Raw``),
    its ``nodes`` replaced by ``nodes`` (each a node's bytes), a few thousand nodes a write (no
    second copy of the document in memory)."""
    with atomic_output(path) as out:
        for k, (key, raw) in enumerate(doc.items()):
            out.write((b"{" if k == 0 else b",") + msgspec.json.encode(key) + b":")
            if key != "nodes":
                out.write(raw)
                continue
            for j in range(0, len(nodes), _NODES_PER_WRITE):
                out.write((b"[" if j == 0 else b",") + b",".join(nodes[j:j + _NODES_PER_WRITE]))
            out.write(b"]" if nodes else b"[]")
        out.write(b"}")


def json_value(fields: dict, key: str):
    """A node's field (its fields as written: ``msgspec.Raw``), decoded; None when absent."""
    return msgspec.json.decode(fields[key]) if key in fields else None


def _edit_json_node(node: dict, edit: NodeEdit) -> None:
    """Edit a node's fields as written (``msgspec.Raw``): only those that change are encoded again,
    the rest stay the bytes they were."""
    if edit.busy is not None:
        node["sim_dur"] = msgspec.Raw(msgspec.json.encode(round(edit.busy, 3)))
    deps = json_value(node, "data_deps") or []
    causes = json_value(node, "data_dep_causes")
    named = isinstance(causes, list) and len(causes) == len(deps)
    deps = [edit.repoint.get(dep, dep) for dep in deps]
    for dep, cause in edit.add:
        deps.append(dep)
        if named:
            causes.append(cause)
    node["data_deps"] = msgspec.Raw(msgspec.json.encode(deps))
    if named:
        node["data_dep_causes"] = msgspec.Raw(msgspec.json.encode(causes))


def _json_piece(node: dict, piece: Piece) -> dict:
    """The JSON node of ``piece``, a later part of ``node`` (its fields as written)."""
    made = {"id": piece.id}
    made.update((key, node[key]) for key in _NODE_KEYS if key in node)
    made.update((key, piece.continues) for key in _PARENT_KEYS if key in node)  # as an op's later pieces
    ts = json_value(node, "ts")
    if isinstance(ts, (int, float)):
        made["ts"] = round(ts + piece.offset, 3)
    made.update({"dur": round(piece.micros, 3), "continues": piece.continues, "sim_dur": round(piece.micros, 3),
                 "data_deps": [piece.after], "data_dep_causes": [piece.cause]})
    return made


# --- Chakra .et ----------------------------------------------------------------------------------


def payload_node_id(payload: bytes) -> int:
    """The id of a Node payload: field 1, which every writer puts first."""
    if payload[:1] == b"\x08":
        return decode_varint(payload, 1)[0]
    return pb.Node.FromString(payload).id


def rewrite_et_nodes(path: Path, change: Callable[[bytes], Iterable[bytes]],
                     appended: Callable[[], Iterable[bytes]] = tuple) -> None:
    """Rewrite a ``.et`` atomically, frame by frame: its metadata as it was, each node's payload
    replaced by the payloads ``change`` returns for it (itself, edited, or with nodes before it),
    then ``appended()``'s. What ``change`` or ``appended`` raise leaves the file as it was.
    O(file bytes) plus what they decode."""
    pending: list[bytes] = []
    with EtWriter(path) as writer:
        for frame in iter_frames(path):
            if frame.index == 0:
                writer.write_metadata(parse_metadata(frame, path))
                continue
            pending.extend(encode_varint(len(payload)) + payload for payload in change(frame.payload))
            if len(pending) >= 4096:
                writer.write_frames_bytes(b"".join(pending), len(pending))
                pending.clear()
        pending.extend(encode_varint(len(payload)) + payload for payload in appended())
        if pending:
            writer.write_frames_bytes(b"".join(pending), len(pending))


def _edit_chakra(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece]) -> None:
    rewrite_et_nodes(path, *chakra_edits(path, edits, pieces))


def chakra_edits(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece]):
    """``edits`` and ``pieces`` as the ``change`` and ``appended`` of ``rewrite_et_nodes``: the
    edited file's frames in a topological order (``_TopologicalOrder``); ``appended`` raises
    TraceInputError when a node named was not met."""
    order = _TopologicalOrder(edits, pieces)

    def appended() -> list[bytes]:
        if order.wanted - order.seen:
            raise _missing(path, order.wanted - order.seen)
        return order.rest()

    return order.change, appended


class _TopologicalOrder:
    """The edited ``.et``'s frames in a topological order, as the writer wrote the file
    (docs/formats.md: a streaming reader meets every dependency before its dependent): a node's
    later parts right after it; a node that gains a dependency on one not yet written (a part of
    a kernel further on) held back, with whatever depends on it, until that one is written. Frames
    are decoded only where edited, continued or while a node is held back. O(file) plus O(h x k)
    for k nodes held back at once over h nodes written meanwhile."""

    def __init__(self, edits: dict[int, NodeEdit], pieces: list[Piece]):
        self.edits = edits
        self.parts: dict[int, list[Piece]] = {}
        for piece in pieces:
            self.parts.setdefault(piece.continues, []).append(piece)
        self.wanted = set(edits) | set(self.parts)
        self.seen: set[int] = set()
        # the nodes a new dependency points to: a written one is in ``written``
        self.targets = {dep for edit in edits.values() for dep, _ in edit.add}
        self.targets.update(new for edit in edits.values() for new in edit.repoint.values())
        self.written: set[int] = set()
        self.held: list[tuple[int, bytes, pb.Node, set[int]]] = []  # id, payload, node, what it waits for
        self.held_ids: set[int] = set()

    def change(self, payload: bytes) -> list[bytes]:
        node_id = payload_node_id(payload)
        if not self.held and node_id not in self.wanted and node_id not in self.targets:
            return [payload]
        node = pb.Node.FromString(payload)
        if node_id in self.wanted:
            self.seen.add(node_id)
        if node_id in self.edits:
            _edit_chakra_node(node, self.edits[node_id])
            payload = node.SerializeToString()
        needs = {dep for dep in (*node.data_deps, *node.ctrl_deps)
                 if dep in self.held_ids or (dep in self.targets and dep not in self.written)}
        if needs:
            self.held.append((node_id, payload, node, needs))
            self.held_ids.add(node_id)
            return []
        return self._write(node_id, payload, node)

    def _write(self, node_id: int, payload: bytes, node: pb.Node) -> list[bytes]:
        """The node's frame, its later parts', and then those of every held node now free."""
        out, ready = [], [(node_id, payload, node)]
        while ready:
            node_id, payload, node = ready.pop(0)
            out.append(payload)
            self.written.add(node_id)
            for piece in self.parts.get(node_id, ()):
                out.append(_chakra_piece(node, piece).SerializeToString())
                self.written.add(piece.id)
            still = []
            for entry in self.held:
                entry[3].difference_update(self.written)
                if entry[3]:
                    still.append(entry)
                else:
                    ready.append(entry[:3])
                    self.held_ids.discard(entry[0])
            self.held = still
        return out

    def rest(self) -> list[bytes]:
        """What is still held back at the end (a dependency the file never wrote), in file order."""
        rest = [entry[1] for entry in self.held]
        self.held = []
        return rest


def _edit_chakra_node(node: pb.Node, edit: NodeEdit) -> None:
    if edit.busy is not None:
        if find_attr(node, "inclusive_dur_micros") is None:  # the measured time stays readable
            node.attr.append(make_attr("inclusive_dur_micros", node.duration_micros, "int64_val"))
        node.duration_micros = round(edit.busy)
    for k, dep in enumerate(node.data_deps):
        node.data_deps[k] = edit.repoint.get(dep, dep)
    attr = find_attr(node, "data_dep_causes")
    named = attr is not None and len(attr.string_list.values) == len(node.data_deps)
    for dep, cause in edit.add:
        node.data_deps.append(dep)
        if named:
            attr.string_list.values.append(cause)


def _chakra_piece(node: pb.Node, piece: Piece) -> pb.Node:
    """The ``.et`` node of ``piece``, a later part of ``node``."""
    made = pb.Node(id=piece.id, name=node.name, type=node.type, duration_micros=round(piece.micros),
                   start_time_micros=node.start_time_micros + round(piece.offset))
    made.ctrl_deps.append(piece.continues)  # as an op's later pieces
    made.data_deps.append(piece.after)
    for key in _PIECE_ATTRS:
        attr = find_attr(node, key)
        if attr is not None:
            made.attr.append(attr)
    made.attr.append(make_attr("continues", piece.continues, "int64_val"))
    made.attr.append(make_attr("inclusive_dur_micros", round(piece.micros), "int64_val"))
    made.attr.append(make_attr("data_dep_causes", [piece.cause], "string_list"))
    return made

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
copied as bytes, but while a node is held back). This module holds what is common and the ET+
JSON side; the ``.et`` side is ``chakra_node_edits``, and ``output_edits`` picks one by the
file's suffix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from linker.model.errors import TraceInputError
from linker.read.files import read_trace_bytes
from linker.write.sink import atomic_output

_NODE_KEYS = ("name", "cat", "ph", "stream", "device", "attrs")  # what a JSON piece takes of its node
_PARENT_KEYS = ("ctrl_deps", "parent")  # the parent key of a JSON node, as its layout has it


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


def is_chakra_path(path: Path) -> bool:
    """Whether a rewrite takes ``path`` for a ``.et`` (by its suffix, as the writer named it)."""
    return path.name.lower().endswith((".et", ".et.gz"))


def missing_node(path: Path, ids) -> TraceInputError:
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


def edit_json(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece]) -> None:
    """``output_edits.edit_nodes`` on an ET+ JSON."""
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
            raise missing_node(self.path, wanted - decoded.keys())
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

"""The ``.et`` side of a written output's edits (``node_edits``) and wait nodes (``wait_nodes``):
frames rewritten one by one, in a topological order, only the nodes edited, continued, held back
or given a wait node decoded. Imported by ``output_edits`` only for a ``.et`` (the ET+ JSON side
loads no protobuf). Cost: one copy of the file; O(file) plus O(h x k) for k nodes held back at
once over h nodes written meanwhile (``_TopologicalOrder``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import EtWriter, encode_varint, find_attr, iter_frames, make_attr, parse_metadata
from linker.write.node_edits import NodeEdit, Piece, missing_node
from linker.write.protobuf_wire import decode_varint
from linker.write.wait_nodes import (HOLDS_KEY, MEASURED_WAIT_KEY, WAIT_CAUSE_KEY, WAIT_NODE_NAME, Wait,
                                     already_has_waits)

_PIECE_ATTRS = ("is_cpu_op", "tid", "stream", "device")  # what a .et piece takes of its node
_LANE_ATTRS = ("tid", "device", "stream", "is_cpu_op")  # what places a wait node on its unit


def edit_and_add_waits(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece], waits: list[Wait],
                       first_id: int) -> int:
    """``output_edits.edit_and_add_waits`` on a ``.et``: each frame passes through the edits'
    topological order (when there are edits or pieces), then the wait nodes' change; one rewrite.
    Returns the wait nodes written."""
    hold, written = chakra_holds(path, waits, first_id)
    if not edits and not pieces:
        rewrite_et_nodes(path, hold)
        return written()
    edit, edited_rest = chakra_edits(path, edits, pieces)

    def change(payload: bytes) -> list[bytes]:
        return [out for edited in edit(payload) for out in hold(edited)]

    def appended() -> list[bytes]:
        return [out for edited in edited_rest() for out in hold(edited)]

    rewrite_et_nodes(path, change, appended)
    return written()


# --- node edits ----------------------------------------------------------------------------------


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


def edit_chakra(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece]) -> None:
    """``output_edits.edit_nodes`` on a ``.et``."""
    rewrite_et_nodes(path, *chakra_edits(path, edits, pieces))


def chakra_edits(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece]):
    """``edits`` and ``pieces`` as the ``change`` and ``appended`` of ``rewrite_et_nodes``: the
    edited file's frames in a topological order (``_TopologicalOrder``); ``appended`` raises
    TraceInputError when a node named was not met."""
    order = _TopologicalOrder(edits, pieces)

    def appended() -> list[bytes]:
        if order.wanted - order.seen:
            raise missing_node(path, order.wanted - order.seen)
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


# --- wait nodes ----------------------------------------------------------------------------------


def wait_node_message(held: pb.Node, node_id: int, wait: Wait) -> pb.Node:
    """The ``.et`` wait node of ``wait``, placed on ``held``'s unit and after its dependencies."""
    node = pb.Node(id=node_id, name=WAIT_NODE_NAME, type=pb.COMP_NODE, duration_micros=round(wait.micros))
    node.ctrl_deps.extend(held.ctrl_deps)
    node.data_deps.extend(held.data_deps)
    cpu = find_attr(held, "is_cpu_op")
    for key in _LANE_ATTRS:
        attr = find_attr(held, key)
        if attr is not None:
            node.attr.append(attr)
    if cpu is None:  # a communication node carries no is_cpu_op: it runs on the GPU
        node.attr.append(make_attr("is_cpu_op", held.type == pb.COMP_NODE and find_attr(held, "stream") is None,
                                   "bool_val"))
    node.attr.append(make_attr(WAIT_CAUSE_KEY, wait.cause, "string_val"))
    node.attr.append(make_attr(MEASURED_WAIT_KEY + "_micros", round(wait.measured_us), "int64_val"))
    node.attr.append(make_attr(HOLDS_KEY, wait.node_id, "int64_val"))
    causes = find_attr(held, "data_dep_causes")
    if causes is not None:
        node.attr.append(causes)
    return node


def _hold(held: pb.Node, wait_id: int, cause: str) -> None:
    """Add the dependency on the wait node (and its cause, when the node names its causes)."""
    attr = find_attr(held, "data_dep_causes")
    named = attr is not None and len(attr.string_list.values) == len(held.data_deps)
    held.data_deps.append(wait_id)
    if named:
        attr.string_list.values.append(cause)


def chakra_holds(path: Path, waits: list[Wait], first_id: int):
    """The ``change`` of ``rewrite_et_nodes`` that puts a wait node before each held op of
    ``waits`` (the held op gaining its dependency), and a count of the wait nodes written so far.
    A node that is a wait node already is refused (``wait_nodes.already_has_waits``)."""
    wanted = {wait.node_id: (first_id + k, wait) for k, wait in enumerate(waits)}
    marker = WAIT_NODE_NAME.encode()
    written = 0

    def change(payload: bytes) -> tuple[bytes, ...]:
        nonlocal written
        if marker in payload and pb.Node.FromString(payload).name == WAIT_NODE_NAME:
            raise already_has_waits(path)
        entry = wanted.get(payload_node_id(payload))
        if entry is None:
            return (payload,)
        held = pb.Node.FromString(payload)
        wait_id, wait = entry
        node = wait_node_message(held, wait_id, wait).SerializeToString()
        _hold(held, wait_id, wait.cause)
        written += 1
        return node, held.SerializeToString()

    return change, lambda: written

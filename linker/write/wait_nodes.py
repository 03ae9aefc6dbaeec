"""Measured waits as nodes of their own: an output rewritten with a wait node before each op that,
as measured, waited for something its dependencies do not hold.

A *wait node* (``WAIT_NODE_NAME``) stands for time an op spent waiting for nothing the graph
holds (work queued before the trace, an event recorded outside it, another process): it depends
on what the held op depends on (the same ``ctrl_deps`` and ``data_deps``, with their causes),
lasts the wait, and the held op gets one more data dependency, on the wait node, whose cause is
the wait's (``sim.unheld.WAIT_CAUSES``: ``launched_before_trace``, ``other_stream_kernel``,
``untraced_event``, ``unexplained_gpu_idle``, ``unexplained_host_wait``). A
simulator that takes the graph literally (ASTRA-sim, ``et-link simulate``) then starts the op as
late after its dependencies as it started when measured. The node runs on the held op's unit: a
GPU ``COMP_NODE`` on its stream for a GPU or communication op, a CPU ``COMP_NODE`` on its thread
for a host op. It has no measured time; ``wait_cause``, ``measured_wait`` (µs as measured) and
``holds`` (the held op's id) say what it is. Ids continue above the file's largest.

Which ops wait and for how long is ``sim.waits``' to decide (docs/fidelity.md); this module only
writes them, into an ET+ JSON or a ``.et`` (plain or gzip), atomically. Cost: one copy of the
file; ``.et``: frames copied as bytes, only the held nodes decoded; JSON likewise, nodes kept
as the bytes they were written as.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from linker.model import et_def_pb2 as pb
from linker.model.errors import TraceInputError
from linker.write.chakra_wire import find_attr, make_attr
from linker.write.node_edits import (JSON_FIELDS, JsonDocument, NodeEdit, Piece, chakra_edits, edit_nodes,
                                     json_value, payload_node_id, rewrite_et_nodes)

WAIT_NODE_NAME = "[et-link|measured_wait]"
WAIT_CAUSE_KEY = "wait_cause"  # the wait's cause, on the wait node (JSON key, .et string attribute)
MEASURED_WAIT_KEY = "measured_wait"  # JSON: µs as measured; .et: ``measured_wait_micros``
HOLDS_KEY = "holds"  # the id of the op the wait holds back
_LANE_ATTRS = ("tid", "device", "stream", "is_cpu_op")  # what places a node on its unit


@dataclass(frozen=True)
class Wait:
    """One wait to write: the held op's id, the wait node's duration (µs), its cause and the wait
    as measured (µs; the duration may be less: the part a replay of the file does not already
    spend)."""

    node_id: int
    micros: float
    cause: str
    measured_us: float


def add_wait_nodes(path: str | Path, waits: list[Wait], first_id: int) -> int:
    """Rewrite ``path`` (ET+ JSON or ``.et``, by suffix) with a wait node before each held op of
    ``waits``; wait node ids from ``first_id`` (above every id of the file). Returns the nodes
    written. Raises TraceInputError when the file cannot be read or written, or already holds
    wait nodes (a file is rewritten once, right after it is linked)."""
    return edit_and_add_waits(path, {}, [], waits, first_id)


def edit_and_add_waits(path: str | Path, edits: dict[int, NodeEdit], pieces: list[Piece], waits: list[Wait],
                       first_id: int) -> int:
    """Rewrite ``path`` once with ``edits`` and ``pieces`` (``node_edits.edit_nodes``) and then,
    on the nodes so edited, a wait node before each held op of ``waits`` (``add_wait_nodes``):
    the file ``edit_nodes`` then ``add_wait_nodes`` would leave, for one copy of it instead of
    two. Returns the wait nodes written. Raises TraceInputError as those do; the file is then
    left as it was."""
    path = Path(path)
    if not waits:
        edit_nodes(path, edits, pieces)
        return 0
    if path.name.lower().endswith((".et", ".et.gz")):
        edit, edited_rest = chakra_edits(path, edits, pieces)
        hold, written = _chakra_holds(path, waits, first_id)

        def change(payload: bytes) -> list[bytes]:
            return [out for edited in edit(payload) for out in hold(edited)]

        def appended() -> list[bytes]:
            return [out for edited in edited_rest() for out in hold(edited)]

        rewrite_et_nodes(path, change, appended)
        return written()
    document = JsonDocument.read(path)
    if WAIT_NODE_NAME in document.names:
        raise _already(path)
    document.edit(edits, pieces)
    _hold_json(document, waits, first_id)
    document.write()
    return len(waits)


def _already(path: Path) -> TraceInputError:
    return TraceInputError(path, "already holds measured-wait nodes (link it again to write them anew)")


# --- ET+ JSON ------------------------------------------------------------------------------------


def _hold_json(document: JsonDocument, waits: list[Wait], first_id: int) -> None:
    """The wait nodes of ``waits`` into ``document``: a held node's fields are kept as written
    but for its ``data_deps`` and ``data_dep_causes``, which gain the wait node; the wait nodes
    are appended. Only the held nodes are decoded."""
    position = {node_id: k for k, node_id in enumerate(document.ids)}
    nodes = document.nodes
    for k, wait in enumerate(waits):
        at = position[wait.node_id]
        held = JSON_FIELDS.decode(nodes[at])
        deps, causes = json_value(held, "data_deps"), json_value(held, "data_dep_causes")
        node = _wait_node(held, first_id + k, wait, deps or [], causes or [])
        held["data_deps"] = msgspec.Raw(msgspec.json.encode((deps or []) + [node["id"]]))
        if causes is not None and len(causes) == len(deps or []):
            held["data_dep_causes"] = msgspec.Raw(msgspec.json.encode(causes + [wait.cause]))
        nodes[at] = msgspec.json.encode(held)
        document.append(node)


def _wait_node(held: dict, node_id: int, wait: Wait, deps: list, causes: list) -> dict:
    """The JSON wait node of ``wait``: on ``held``'s unit (its parent, thread or stream: ``held``'s
    fields as written), after its dependencies (``deps``, ``causes``)."""
    node = {"id": node_id, "name": WAIT_NODE_NAME}
    for key in ("parent", "ctrl_deps", "tid", "device", "stream"):
        if key in held:
            node[key] = held[key]
    if "tid" not in held and "attrs" in held:  # nested layout: the tid attribute
        attrs = msgspec.json.decode(held["attrs"])
        if isinstance(attrs, list):
            node["attrs"] = [attr for attr in attrs if isinstance(attr, dict) and attr.get("name") == "tid"]
    node.update({"sim_dur": round(wait.micros, 3), WAIT_CAUSE_KEY: wait.cause,
                 MEASURED_WAIT_KEY: round(wait.measured_us, 3), HOLDS_KEY: wait.node_id,
                 "data_deps": list(deps), "data_dep_causes": list(causes)})
    return node


# --- Chakra .et ----------------------------------------------------------------------------------


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


def _chakra_holds(path: Path, waits: list[Wait], first_id: int):
    """The ``change`` of ``rewrite_et_nodes`` that puts a wait node before each held op of
    ``waits`` (the held op gaining its dependency), and a count of the wait nodes written so far.
    A node that is a wait node already is refused (``_already``)."""
    wanted = {wait.node_id: (first_id + k, wait) for k, wait in enumerate(waits)}
    marker = WAIT_NODE_NAME.encode()
    written = 0

    def change(payload: bytes) -> tuple[bytes, ...]:
        nonlocal written
        if marker in payload and pb.Node.FromString(payload).name == WAIT_NODE_NAME:
            raise _already(path)
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

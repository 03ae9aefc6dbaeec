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
writes them into an ET+ JSON (the ``.et`` side is ``chakra_node_edits``; ``output_edits`` picks
one), atomically. Cost: one copy of the file, nodes kept as the bytes they were written as, only
the held nodes decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from linker.model.errors import TraceInputError
from linker.write.node_edits import JSON_FIELDS, JsonDocument, NodeEdit, Piece, json_value

WAIT_NODE_NAME = "[et-link|measured_wait]"
WAIT_CAUSE_KEY = "wait_cause"  # the wait's cause, on the wait node (JSON key, .et string attribute)
MEASURED_WAIT_KEY = "measured_wait"  # JSON: µs as measured; .et: ``measured_wait_micros``
HOLDS_KEY = "holds"  # the id of the op the wait holds back


@dataclass(frozen=True)
class Wait:
    """One wait to write: the held op's id, the wait node's duration (µs), its cause and the wait
    as measured (µs; the duration may be less: the part a replay of the file does not already
    spend)."""

    node_id: int
    micros: float
    cause: str
    measured_us: float


def edit_and_add_waits_json(path: Path, edits: dict[int, NodeEdit], pieces: list[Piece], waits: list[Wait],
                            first_id: int) -> int:
    """``output_edits.edit_and_add_waits`` on an ET+ JSON: decoded once (``JsonDocument``),
    edited, given its wait nodes and written once. Returns the wait nodes written."""
    document = JsonDocument.read(path)
    if WAIT_NODE_NAME in document.names:
        raise already_has_waits(path)
    document.edit(edits, pieces)
    _hold_json(document, waits, first_id)
    document.write()
    return len(waits)


def already_has_waits(path: Path) -> TraceInputError:
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

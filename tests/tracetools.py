"""Test helpers for trace pairs: load/save, ground truth by record-function id, and mutations.

Pure Python (no torch, no et-link imports), so tests of the linker can build their inputs and
expected answers independently of the code under test. Every mutation returns a new document and
leaves its argument untouched. All functions are O(events) or O(nodes) unless stated otherwise.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path
from typing import Any

CPU_EVENT_CATS = ("cpu_op", "user_annotation")
RF_ID_KEY = "Record function id"


def load_trace(path: str | Path) -> dict:
    """Read a JSON trace (ET or Kineto); gzip-compressed when the name ends in ``.gz``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        return json.load(handle)


def save_trace(obj: dict, path: str | Path) -> None:
    """Write ``obj`` as JSON; gzip-compressed when the name ends in ``.gz``. Creates parent dirs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(obj).encode()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)


def et_attr(node: dict, name: str, default: Any = None) -> Any:
    """A node's metadata value in either ET layout: flat key (1.0.1) or ``attrs`` list (1.0.2+).

    O(number of attrs) for the nested layout.
    """
    if name in node:
        return node[name]
    for attr in node.get("attrs", ()):
        if attr.get("name") == name:
            return attr.get("value")
    return default


def et_parent(node: dict) -> int | None:
    """The node's parent id: ``parent`` (1.0.1) or ``ctrl_deps`` (1.0.2+)."""
    return node.get("parent", node.get("ctrl_deps"))


def is_cpu_event(event: dict) -> bool:
    """True for complete (``X``) cpu_op and user_annotation events."""
    return event.get("ph") == "X" and event.get("cat") in CPU_EVENT_CATS


def strip_record_function_ids(kineto: dict) -> dict:
    """Deep copy of ``kineto`` with every ``args["Record function id"]`` removed (as in PyTorch < 2.2)."""
    stripped = copy.deepcopy(kineto)
    for event in stripped.get("traceEvents", ()):
        args = event.get("args")
        if isinstance(args, dict):
            args.pop(RF_ID_KEY, None)
    return stripped


def drop_cpu_events(kineto: dict, fraction: float, seed: int) -> tuple[dict, set[int]]:
    """Remove ``round(fraction * n)`` of the n ``cpu_op`` events, chosen with ``random.Random(seed)``.

    user_annotation, runtime, GPU, flow and metadata events are kept. Returns the new document and
    the record-function ids of the dropped events (events without one are dropped but not listed).
    Deterministic for a given (kineto, fraction, seed). O(events).
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    events = kineto.get("traceEvents", [])
    cpu_op_positions = [i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    dropped_positions = set(random.Random(seed).sample(cpu_op_positions, round(fraction * len(cpu_op_positions))))
    dropped_rf_ids = {events[i]["args"][RF_ID_KEY] for i in dropped_positions
                      if RF_ID_KEY in events[i].get("args", {})}
    result = {key: value for key, value in kineto.items() if key != "traceEvents"}
    result["traceEvents"] = [copy.deepcopy(e) for i, e in enumerate(events) if i not in dropped_positions]
    return result, dropped_rf_ids


def cpu_pids(kineto: dict) -> set:
    """Pids of the host process(es): those carrying cpu_op / user_annotation events."""
    return {e.get("pid") for e in kineto.get("traceEvents", ()) if is_cpu_event(e)}


def keep_only_thread(kineto: dict, tid: int) -> dict:
    """Copy of ``kineto`` as if only host thread ``tid`` had been profiled.

    Drops every event of the host process(es) whose tid is not ``tid`` (ops, runtime calls, flows,
    thread metadata), keeping process-level metadata (tid 0), device (GPU) events and global
    events (spans, instants). GPU ops launched from dropped threads stay, now without a launch.
    """
    host_pids = cpu_pids(kineto)

    def kept(event: dict) -> bool:
        if event.get("pid") not in host_pids:
            return True
        return event.get("tid") == tid or (event.get("ph") == "M" and event.get("tid") == 0)

    result = {key: value for key, value in kineto.items() if key != "traceEvents"}
    result["traceEvents"] = [copy.deepcopy(e) for e in kineto.get("traceEvents", ()) if kept(e)]
    return result


def rf_truth(et: dict, kineto: dict) -> dict[int, tuple]:
    """ET node id -> (tid, ts, name) of the Kineto cpu_op/user_annotation with the same record-function id.

    Works for both ET layouts. Skips rf_id 0 (process/thread roots; also what some builds report for
    every event) and any rf id carried by more than one Kineto event (ambiguous). Names are not
    compared: callers check agreement themselves. Empty when Kineto has no record-function ids.
    """
    by_rf_id: dict[int, tuple] = {}
    ambiguous: set[int] = set()
    for event in kineto.get("traceEvents", ()):
        if not is_cpu_event(event):
            continue
        rf_id = event.get("args", {}).get(RF_ID_KEY)
        if rf_id is None or rf_id == 0:
            continue
        if rf_id in by_rf_id:
            ambiguous.add(rf_id)
        by_rf_id[rf_id] = (event.get("tid"), event.get("ts"), event.get("name"))
    truth: dict[int, tuple] = {}
    for node in et.get("nodes", ()):
        rf_id = et_attr(node, "rf_id")
        if rf_id in by_rf_id and rf_id not in ambiguous:
            truth[node["id"]] = by_rf_id[rf_id]
    return truth

"""Input sanity: one pass over the decoded ET and Kineto trace before any linking.

Every entry point that links (``pipeline.link_pair``, hence the CLI and ``batch``) runs these checks
right after reading. Per category of odd input, one decision:

- refused (``TraceInputError`` naming the file, node and value): ET node ids that are not integers
  in 0..2**63-1 (an id is what every output format and consumer keys on), and ET integer fields
  (rf_id, tid, scope, seq_id, fw_parent, fw_tid) outside the signed 64-bit range; a Kineto trace
  left with no usable CPU event.
- repaired with a warning that names the problem: an ET node whose parent is itself, is not in the
  file, or has a later id (which is how every parent cycle shows, since PyTorch gives a parent a
  smaller id than its children) is re-attached to its thread's root node (the process root for a
  thread root); Kineto events whose ``ts`` or ``dur`` is missing, negative, not finite or beyond
  2**53 microseconds are left out of linking.

The repairs change only the in-memory model (the ET+ then passes ``et-link validate``); input files
are never touched. Cost: O(nodes + events), no sorting.
"""

from __future__ import annotations

import math
from itertools import count
from dataclasses import dataclass, field

from linker.model.errors import TraceInputError
from linker.read.et import FLAT, THREAD_ROOT_NAMES, ExecutionTrace
from linker.read.kineto import KinetoEvent, KinetoTrace

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
ID_MAX = INT64_MAX
TIME_LIMIT_US = float(1 << 53)  # beyond this a float µs timestamp has lost its precision
EXAMPLES = 5

# ET node fields that must fit a signed 64-bit integer (Chakra attributes are int64).
INT64_NODE_FIELDS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid")


@dataclass
class ParentRepairs:
    """ET nodes re-attached because their parent could not be used, by kind of problem."""

    self_parent: list[int] = field(default_factory=list)  # node ids
    missing_parent: list[int] = field(default_factory=list)
    later_parent: list[int] = field(default_factory=list)  # includes every node on a cycle

    def total(self) -> int:
        return len(self.self_parent) + len(self.missing_parent) + len(self.later_parent)


def _in_int64(value) -> bool:
    return type(value) is not int or INT64_MIN <= value <= INT64_MAX


def _ints_in_int64(values: list) -> bool:
    """True when every int among ``values`` passes ``_in_int64`` (min/max at C speed)."""
    ints = [v for v in values if type(v) is int]
    return not ints or (INT64_MIN <= min(ints) and max(ints) <= INT64_MAX)


def _first_outside(column: list, low: int, high: int) -> int | None:
    """Position of the first value outside [low, high]; min/max first, so O(n) at C speed."""
    if not column or (low <= min(column) and max(column) <= high):
        return None
    return next(i for i, v in enumerate(column) if not low <= v <= high)


def check_ids(et: ExecutionTrace) -> None:
    """Refuse ids outside 0..2**63-1 and 64-bit fields out of range. O(nodes)."""
    i = _first_outside(et.ids, 0, ID_MAX)
    if i is not None:
        raise TraceInputError(et.path, f"node #{i} ({et.names[i][:60]!r}): id {et.ids[i]} is out of range "
                              "(node ids must be integers from 0 to 2**63-1)")
    for name, column in (("rf_id", et.rf_id), ("tid", et.tid), ("scope", et.scope)):
        i = _first_outside(column, INT64_MIN, INT64_MAX)
        if i is not None:
            raise TraceInputError(et.path, f"node {et.ids[i]}: {name} {column[i]} does not fit in 64 bits")
    if et.layout != FLAT:
        return  # the nested layout keeps these in ``attrs`` (read into the columns above)
    if all(_ints_in_int64([getattr(node, name, None) for node in et.nodes]) for name in INT64_NODE_FIELDS):
        return
    for i, node in enumerate(et.nodes):  # some value is out of range: the first, in node order
        for name in INT64_NODE_FIELDS:
            value = getattr(node, name, None)
            if not _in_int64(value):
                raise TraceInputError(et.path, f"node {et.ids[i]}: {name} {value} does not fit in 64 bits")


def repair_parents(et: ExecutionTrace) -> ParentRepairs:
    """Re-attach nodes whose parent is unusable (self, missing, later id / cycle). O(nodes).

    A usable parent is another node of the file with a smaller id; the process root alone may be
    its own parent. Replacement: the root of the node's thread, else the process root. Refuses
    (``TraceInputError``) when a node needs a new parent and the ET has no process root.
    """
    repairs = ParentRepairs()
    index = et.index_of_id()
    process_root = et.process_root()
    process_root = process_root if process_root >= 0 else None
    # Every node but those with a usable parent (a C-speed filter; usually only the process root).
    suspects = [i for i, parent, node_id in zip(count(), et.parent, et.ids)
                if not (parent < node_id and parent in index)]
    thread_roots: dict[int, int] | None = None
    for i in suspects:
        node_id, parent = et.ids[i], et.parent[i]
        if i == process_root:
            if parent != node_id:
                repairs.missing_parent.append(node_id)
                et.set_parent(i, node_id)
            continue
        kind = (repairs.self_parent if parent == node_id else
                repairs.later_parent if parent in index else repairs.missing_parent)
        kind.append(node_id)
        if thread_roots is None:
            thread_roots = _thread_roots(et)
        candidates = [] if et.names[i] in THREAD_ROOT_NAMES else [thread_roots.get(et.tid[i])]
        candidates.append(process_root)
        replacement = next((c for c in candidates if c is not None and et.ids[c] < node_id), None)
        if replacement is None:
            raise TraceInputError(et.path, f"node {node_id}: parent {parent} is unusable "
                                  "(itself, absent or a later node) and the ET has no process root to attach it to")
        et.set_parent(i, et.ids[replacement])
    return repairs


def _thread_roots(et: ExecutionTrace) -> dict[int, int]:
    """ET thread number -> index of its first thread root node."""
    roots: dict[int, int] = {}
    for i, name in enumerate(et.names):
        if name in THREAD_ROOT_NAMES:
            roots.setdefault(et.tid[i], i)
    return roots


def _examples(ids: list[int]) -> str:
    shown = ", ".join(str(x) for x in ids[:EXAMPLES])
    return shown + (f" and {len(ids) - EXAMPLES} more" if len(ids) > EXAMPLES else "")


def check_execution_trace(et: ExecutionTrace) -> list[str]:
    """Refuse unusable ids; repair unusable parents. Returns warnings naming the file. O(nodes)."""
    check_ids(et)
    repairs = repair_parents(et)
    if not repairs.total():
        return []
    parts = []
    if repairs.self_parent:
        parts.append(f"{len(repairs.self_parent)} are their own parent (ids {_examples(repairs.self_parent)})")
    if repairs.missing_parent:
        parts.append(f"{len(repairs.missing_parent)} name a parent that is not in the file "
                     f"(ids {_examples(repairs.missing_parent)})")
    if repairs.later_parent:
        parts.append(f"{len(repairs.later_parent)} name a later node as parent, as on a parent cycle "
                     f"(ids {_examples(repairs.later_parent)})")
    return [f"{et.path}: {repairs.total()} ET nodes had an unusable parent and were re-attached to their "
            f"thread's root: " + "; ".join(parts)]


def usable_time(event: KinetoEvent) -> bool:
    """True when ``ts`` and ``dur`` are present, finite, non-negative and below 2**53 µs."""
    ts, dur = event.ts, event.dur
    return (isinstance(ts, (int, float)) and isinstance(dur, (int, float))
            and math.isfinite(ts) and math.isfinite(dur)
            and 0 <= ts < TIME_LIMIT_US and 0 <= dur < TIME_LIMIT_US)


def check_kineto_trace(kineto: KinetoTrace) -> list[str]:
    """Leave out events with unusable times (warning per kind of event). O(events).

    Raises ``TraceInputError`` when no CPU event is left.
    """
    warnings = []
    limit = TIME_LIMIT_US
    for label in ("cpu_events", "runtime_events", "gpu_events"):
        events = getattr(kineto, label)
        # inline form of ``usable_time`` (NaN fails every comparison): one cheap test per event
        bad = [k for k, e in enumerate(events) if not (0 <= e.ts < limit and 0 <= e.dur < limit)]
        if not bad:
            continue
        first = events[bad[0]]
        kept = [e for e in events if usable_time(e)]
        setattr(kineto, label, kept)
        kind = {"cpu_events": "CPU ops", "runtime_events": "runtime calls", "gpu_events": "GPU ops"}[label]
        warnings.append(f"{kineto.path}: {len(bad)} Kineto {kind} have a missing, negative or out-of-range "
                        f"ts/dur and were left out (first: {first.name[:60]!r}, ts {first.ts}, dur {first.dur})")
    if not kineto.cpu_events:
        raise TraceInputError(kineto.path, "no Kineto CPU op has a usable ts/dur")
    return warnings

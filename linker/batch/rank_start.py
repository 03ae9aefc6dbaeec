"""Write each rank's start offset into a job's outputs (``plan.rank_start`` holds the rule).

Run by ``et-link batch`` once every rank is linked, since an offset is relative to the job's
earliest start: each rank's measured span (handed over by its worker, ``plan.rank_start.et_plus_span``:
the numbers ``et-link simulate`` reads back from the output; for a ``.et`` job the loaded graphs'
own), the offsets follow from the rule, and each output whose offset differs from what it holds
is rewritten (an output this run wrote, offset 0: left unread):

- ``.et`` / ``.et.gz``: the delay node is written first after the metadata; every node without
  dependencies (the process root) gets a data dependency on it, cause ``rank_start``
  (``data_dep_causes``); the other frames are copied as they are. A delay node already in the
  file (an earlier run) is replaced; offset 0 removes it.
- ET+ JSON: the same delay node (``sim_dur`` the offset) and the same edge on the root node(s).

The ``.et`` rewrite lives in ``rank_start_et`` (imported for ``.et`` jobs only).

The rewrite is atomic (temporary file renamed over the output) and the rank's report sidecar is
updated to the new output, so a rerun still skips the rank. Cost per rank: when its offset
changes, one copy of the output (``.et``: frames copied as bytes, only the
dependency-free nodes decoded; JSON: one decode and encode of the document).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from itertools import accumulate
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import orjson

from linker.model.errors import TraceInputError
from linker.plan.rank_start import (DELAY_NODE_NAME, MEASURED, RANK_START, delay_node_json, measured_offsets,
                                    offset_micros)
from linker.read.files import read_trace_bytes
from linker.schedule import Schedule
from linker.write.sink import atomic_output


@dataclass
class RankStarts:
    """What was written: the rule, each rank's offset in µs (None: no offsets, see ``note``)."""

    rule: str
    offsets_us: dict[int, int] | None = None
    note: str = ""
    rewritten: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"rule": self.rule, "offsets_us": {str(r): v for r, v in (self.offsets_us or {}).items()},
                "note": self.note, "rewritten_ranks": self.rewritten}


    def lines(self) -> list[str]:
        """What the batch prints about the offsets."""
        if self.offsets_us:
            shown = ", ".join(f"{rank}: {us:,}" for rank, us in sorted(self.offsets_us.items()))
            return [f"rank start offsets (--rank-start {self.rule}, us): {shown}"]
        return [f"rank start offsets (--rank-start {self.rule}): none" + (f" ({self.note})" if self.note else "")]


def apply_rank_starts(files: list[tuple[Path, int]], spans: list, reports: dict[int, Path], rule: str,
                      fresh: frozenset[int] = frozenset(), graphs: list | None = None,
                      schedule: Schedule | None = None, processes: int = 1,
                      sizes: list[int] | None = None) -> RankStarts:
    """Write the job's rank offsets into its outputs (rule ``measured``) or remove any (``zero``).
    ``files``: [(output, rank)]; ``spans``: each file's measured span (``SimGraph.measured_span``;
    may be empty for rule ``zero``), which give the offsets; ``reports``: each rank's sidecar,
    updated when its output is rewritten; ``fresh``: the ranks whose outputs this run wrote (they
    hold no delay node: an offset of 0 leaves them unread); ``graphs``: each file's ``SimGraph``
    when loaded (a ``.et`` is then not read twice). ``schedule`` (serial by default) may rewrite
    the outputs in up to ``processes`` forked children (``Schedule.each_output``, which weighs
    ``sizes``: each file's bytes, 0 when not given); the files and sidecars come out the same.
    Raises TraceInputError when an output cannot be read or written (the first in rank order;
    children may meanwhile have rewritten outputs of later ranks)."""
    result = RankStarts(rule)
    wanted = [0] * len(files)
    if rule == MEASURED and len(files) > 1:
        offsets = measured_offsets(spans)
        if offsets is None:
            result.note = "the ranks' measured start times do not look like one clock"
        else:
            wanted = [offset_micros(o) for o in offsets]
            result.offsets_us = {rank: us for (_, rank), us in zip(files, wanted)}
    elif rule == MEASURED:
        result.note = "a single rank"
    todo = [(k, path, rank, offset) for k, ((path, rank), offset) in enumerate(zip(files, wanted))
            if not (offset == 0 and rank in fresh)]  # just written, without a delay node: nothing to change
    calls = [(path, offset, graphs[k] if graphs and k < len(graphs) else None) for k, path, _, offset in todo]
    weights = [sizes[k] if sizes else 0 for k, _, _, _ in todo]
    outcomes = (schedule or Schedule.serial()).each_output(set_rank_start, calls, weights, processes)
    for (_, path, rank, offset), call, outcome in zip(todo, calls, outcomes):
        if outcome[0] if outcome is not None else set_rank_start(*call):
            result.rewritten.append(rank)
            if rank in reports:
                _restamp_sidecar(reports[rank], path, offset)
    return result


def set_rank_start(path: Path, offset_us: int, graph=None) -> bool:
    """Make ``path`` hold a delay node of ``offset_us`` (none when 0); True when it was rewritten.
    ``graph``: the file's ``SimGraph``, when already loaded (a ``.et`` is then read once)."""
    path = Path(path)
    if not path.name.endswith((".et", ".et.gz")):
        return _set_json(path, offset_us)
    from linker.batch.rank_start_et import heads_from_graph, set_chakra  # the protobuf side, for .et jobs

    return set_chakra(path, offset_us, heads_from_graph(graph) if graph is not None else None)


# ---------------------------------------------------------------------------------------------
# ET+ JSON
# ---------------------------------------------------------------------------------------------


def _set_json(path: Path, offset_us: int) -> bool:
    """``set_rank_start`` for an ET+ JSON: spliced in its bytes (``_splice_json``) when laid out as
    et-link writes it, else decoded and encoded whole. The two give the same document."""
    data = read_trace_bytes(path)
    try:
        heads = _JSON_HEADS.decode(data).nodes
    except (msgspec.DecodeError, msgspec.ValidationError):
        heads = None
    spliced = _splice_json(data, heads, offset_us) if heads else None
    if spliced is None:
        return _set_json_document(path, data, offset_us)
    if spliced is False:
        return False
    with atomic_output(path) as out:
        for piece in spliced:
            out.write(piece)
    return True


class _JsonNodeHead(msgspec.Struct):
    """What the rewrite reads of a node (other keys skipped)."""

    id: Any = None
    name: Any = None
    parent: Any = msgspec.UNSET
    ctrl_deps: Any = msgspec.UNSET
    data_deps: Any = None
    sim_dur: Any = 0
    tid: Any = None


class _JsonNodeHeads(msgspec.Struct):
    nodes: list[_JsonNodeHead]


class _RawNodes(msgspec.Struct):
    nodes: list[msgspec.Raw]


_JSON_HEADS, _RAW_NODES = msgspec.json.Decoder(_JsonNodeHeads), msgspec.json.Decoder(_RawNodes)
_NODES_OPEN = b'"nodes":['  # only a key can match: a quote inside a JSON string is escaped
_ID, _DATA_DEPS = attrgetter("id"), attrgetter("data_deps")


def _splice_json(data, heads: list[_JsonNodeHead], offset_us: int) -> list | bool | None:
    """The document ``data`` with the delay node of ``offset_us`` (as ``_set_json_document`` makes
    it), as pieces to write one after the other: long slices of ``data`` itself, and the few
    nodes that change (the delay node, the nodes whose edges change) encoded anew. False when
    nothing changes; None when the nodes list is not laid out as et-link writes it (one top-level
    ``nodes`` key, no space between its items) or a node is not what the rewrite expects: the
    caller then decodes the document. O(bytes): two C decodes (the nodes' heads, their raw texts),
    C passes over the nodes, a Python step per node that changes."""
    ids_column = list(map(_ID, heads))
    if not all(isinstance(node_id, int) for node_id in ids_column):
        return None
    old = [k for k, h in enumerate(heads) if h.name == DELAY_NODE_NAME]
    if (heads[old[0]].sim_dur if old else 0) == offset_us:
        return False
    raws = _RAW_NODES.decode(data).nodes
    opening = (data if hasattr(data, "find") else bytes(data)).find(_NODES_OPEN)
    if opening < 0 or len(raws) != len(heads):
        return None
    first = opening + len(_NODES_OPEN)  # the first node's first byte
    starts = list(accumulate((len(raw) + 1 for raw in raws), initial=first))  # node k at starts[k] (a "," after each)
    closing = starts[-1] - 1  # the list's "]", when nothing lies between its items
    view = memoryview(data)
    if bytes(view[closing:closing + 1]) != b"]" or view[first:first + len(raws[0])] != memoryview(raws[0]):
        return None
    parent_key = "ctrl_deps" if heads[0].ctrl_deps is not msgspec.UNSET and heads[0].parent is msgspec.UNSET else "parent"
    ids = set(ids_column)
    delay_id = heads[old[0]].id if old else max(ids) + 1
    edited: dict[int, dict | None] = dict.fromkeys(old)  # None: left out
    for k, deps in enumerate(map(_DATA_DEPS, heads) if old else ()):  # edges on an earlier delay node
        if k not in edited and isinstance(deps, list) and delay_id in deps:
            edited[k] = node = orjson.loads(bytes(raws[k]))
            _drop_delay_edge(node, delay_id)
    roots = [k for k, head in enumerate(heads)
             if not head.data_deps and k not in edited and _is_root(getattr(head, parent_key), head.id, ids)]
    roots = sorted(roots + [k for k, node in edited.items() if node is not None and not node.get("data_deps")
                            and _is_root(node.get(parent_key), node["id"], ids)])
    items: list = []  # the new list's items: the delay node, runs of nodes kept as written, changed nodes
    if offset_us:
        for k in roots:
            node = edited.get(k) or orjson.loads(bytes(raws[k]))
            _add_delay_edge(node, delay_id)
            edited[k] = node
        tid = edited[roots[0]].get("tid") if roots else None
        items.append(orjson.dumps(delay_node_json(delay_id, offset_us, parent_key, tid)))
    given = 0  # the first node not yet in ``items``
    for k in sorted(edited):
        if k > given:
            items.append(view[starts[given]:starts[k] - 1])  # nodes given..k-1, their commas between them
        if edited[k] is not None:
            items.append(orjson.dumps(edited[k]))
        given = k + 1
    if given < len(raws):
        items.append(view[starts[given]:closing])
    pieces = [view[:first]]
    for i, item in enumerate(items):
        pieces += [b",", item] if i else [item]
    pieces.append(view[closing:])
    return pieces


def _drop_delay_edge(node: dict, delay_id: int) -> None:
    """``node`` without its data dependency on the delay node ``delay_id`` (and that cause)."""
    deps = node.get("data_deps") or []
    if delay_id in deps:
        causes = node.get("data_dep_causes") or []
        keep = [k for k, d in enumerate(deps) if d != delay_id]
        node["data_deps"] = [deps[k] for k in keep]
        if len(causes) == len(deps):
            node["data_dep_causes"] = [causes[k] for k in keep]


def _add_delay_edge(node: dict, delay_id: int) -> None:
    """``node`` (a root) data-depending on the delay node ``delay_id``, cause ``RANK_START``."""
    node.setdefault("data_deps", [])
    causes = node.get("data_dep_causes")
    if causes is None or len(causes) != len(node["data_deps"]):
        causes = [""] * len(node["data_deps"])
    node["data_deps"] = node["data_deps"] + [delay_id]
    node["data_dep_causes"] = causes + [RANK_START]


def _set_json_document(path: Path, data, offset_us: int) -> bool:
    """``_set_json`` on the whole document decoded (any JSON layout). O(bytes), in Python objects."""
    try:
        document = orjson.loads(memoryview(data))  # a large file comes mapped (``files.read_trace_bytes``)
        nodes = document["nodes"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise TraceInputError(path, "not an ET+ JSON document") from None
    old = [n for n in nodes if n.get("name") == DELAY_NODE_NAME]
    old_offset = old[0].get("sim_dur", 0) if old else 0
    if old_offset == offset_us:
        return False
    parent_key = "ctrl_deps" if nodes and "ctrl_deps" in nodes[0] and "parent" not in nodes[0] else "parent"
    ids = {n["id"] for n in nodes}
    delay_id = old[0]["id"] if old else max(ids, default=0) + 1
    kept = []
    for node in nodes:
        if node.get("name") == DELAY_NODE_NAME:
            continue
        _drop_delay_edge(node, delay_id)
        kept.append(node)
    roots = [n for n in kept if not n.get("data_deps") and _is_root(n.get(parent_key), n["id"], ids)]
    if offset_us:
        for node in roots:
            _add_delay_edge(node, delay_id)
        tid = roots[0].get("tid") if roots else None
        kept.insert(0, delay_node_json(delay_id, offset_us, parent_key, tid))
    document["nodes"] = kept
    with atomic_output(path) as out:
        out.write(orjson.dumps(document))
    return True


def _is_root(parent, node_id: int, ids: set) -> bool:
    """A node without a parent in the file: none, itself, -1, or an id the file does not hold."""
    if isinstance(parent, list):
        parent = parent[0] if parent else None
    return parent is None or parent is msgspec.UNSET or parent == node_id or parent == -1 \
        or not isinstance(parent, int) or parent not in ids


# ---------------------------------------------------------------------------------------------
# The rank's sidecar
# ---------------------------------------------------------------------------------------------


def _restamp_sidecar(report: Path, output: Path, offset_us: int) -> None:
    """Point the sidecar's output stamp at the rewritten output (a rerun then still skips the
    rank) and record the offset. A missing or unreadable sidecar is left alone (the rank is then
    linked again next run, as it would be anyway)."""
    with contextlib.suppress(OSError, orjson.JSONDecodeError, KeyError, TypeError):
        doc = orjson.loads(report.read_bytes())
        st = output.stat()
        doc["batch"]["output"] = {"path": str(output), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        doc["rank_start_us"] = offset_us
        with atomic_output(report) as out:
            out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))

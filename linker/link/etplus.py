"""Build the ET+ from a ``LinkResult``: times on linked ET nodes, new GPU nodes under their launcher.

docs/formats.md: every linked CPU node gets ``ts``, ``dur``, ``inclusive_dur``, ``exclusive_dur`` (µs);
every attributed kernel/memcpy/memset becomes a node whose parent (``ctrl_deps`` or ``parent``, as
the layout has it) is its launching CPU node, carrying ``cat, name, ph, ts, dur, inclusive_dur,
exclusive_dur, stream, device, correlation`` (and ``pg_name`` when the trace names the process
group). New ids continue after the largest existing id. Each linked node's Kineto start and end
and its exclusive time are gathered on the way (``EtPlus.op_times``, ``op_exclusive``: values of
the build, never changed after it) for the plan's busy times. Cost O(n + g).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import msgspec
import numpy as np

from linker.link.durations import rounded_exclusive, with_lost_time
from linker.read.et import FLAT, ExecutionTrace, SimulationFields
from linker.link.gpu import GpuLink
from linker.link.measured import apply_placement
from linker.link.recipe import LinkResult

UNSET = msgspec.UNSET
Unset = msgspec.UnsetType

_EMPTY_IO_NESTED = msgspec.Raw(b'{"values":[],"shapes":[],"types":[]}')
_EMPTY_LIST = msgspec.Raw(b"[]")


class _PeerFields(SimulationFields, kw_only=True, omit_defaults=True):
    """A send or receive kernel's peer ranks, tag and side (``plan.comm``), written after the
    simulation fields."""

    comm_src: int | Unset = UNSET
    comm_dst: int | Unset = UNSET
    comm_tag: int | Unset = UNSET
    comm_role: str | Unset = UNSET


class GpuNode(_PeerFields, omit_defaults=True):
    """A GPU op as an ET+ node. Layout-dependent keys stay UNSET (not written) when not used; the
    simulation fields (``SimulationFields``, then ``_PeerFields``) come last."""

    # Written always (no defaults: omit_defaults would drop a field equal to its default).
    id: int
    name: str
    cat: str
    ph: str
    ts: float | int
    dur: float | int
    inclusive_dur: float | int
    exclusive_dur: float | int
    stream: int | None
    device: int | None
    correlation: int | None
    # Written when set.
    ctrl_deps: int | Unset = UNSET
    parent: int | Unset = UNSET
    pg_name: str | Unset = UNSET
    tid: int | Unset = UNSET
    inputs: Any = UNSET
    outputs: Any = UNSET
    input_shapes: Any = UNSET
    input_types: Any = UNSET
    output_shapes: Any = UNSET
    output_types: Any = UNSET
    attrs: list | Unset = UNSET
    # Busy duration (``plan.json_fields``); the other simulation fields are the bases'.
    sim_dur: float | int | Unset = UNSET


class FlatPiece(msgspec.Struct, omit_defaults=True):
    """A later piece of an op as an ET+ JSON node, flat layout (``PieceRows``). Fields in the order
    written; every one positional, so a chunk of them is made by one ``map`` over the columns."""

    id: Any = UNSET
    name: Any = UNSET
    parent: Any = UNSET
    inputs: Any = UNSET
    outputs: Any = UNSET
    input_shapes: Any = UNSET
    input_types: Any = UNSET
    output_shapes: Any = UNSET
    output_types: Any = UNSET
    tid: Any = UNSET
    ts: Any = UNSET
    dur: Any = UNSET
    continues: Any = UNSET
    host_gap_dur: Any = UNSET
    sim_dur: Any = UNSET
    data_deps: Any = UNSET
    data_dep_causes: Any = UNSET


class NestedPiece(msgspec.Struct, omit_defaults=True):
    """A later piece of an op as an ET+ JSON node, nested layout (``PieceRows``)."""

    id: Any = UNSET
    name: Any = UNSET
    ctrl_deps: Any = UNSET
    inputs: Any = UNSET
    outputs: Any = UNSET
    attrs: Any = UNSET
    ts: Any = UNSET
    dur: Any = UNSET
    continues: Any = UNSET
    host_gap_dur: Any = UNSET
    sim_dur: Any = UNSET
    data_deps: Any = UNSET
    data_dep_causes: Any = UNSET


@dataclass
class PieceRows:
    """The later pieces of the ops (``plan.later_pieces``) as ET+ JSON nodes, kept as columns (one
    entry per piece) and made into node structs a chunk at a time by the writer (``nodes``): a
    piece is the op's exclusive time after one of its children, run where the thread ran it.
    ``continues``: the id of the op whose time it is (its parent too); ``ts`` / ``dur``: where it
    lies on the measured timeline (µs); ``sim_dur``: its busy time (``dur`` less the blocked time
    in it) plus ``host_gap_dur`` when the host time that follows it is folded into it (UNSET
    entries are not written). Ids lie above every ET and GPU node's. Laid out as the ET's GPU
    nodes are: flat ``parent``, ``tid`` and empty lists; nested ``ctrl_deps``, empty
    ``inputs``/``outputs`` and ``tid`` in ``attrs``."""

    flat: bool
    ids: list[int]
    names: list[str]
    continues: list[int]
    tids: list[int]
    ts: list
    dur: list
    host_gap: list
    sim: list
    data_deps: list
    data_dep_causes: list

    def __len__(self) -> int:
        return len(self.ids)

    def nodes(self, start: int = 0, stop: int | None = None) -> list:
        """The node structs of pieces ``start`` to ``stop`` (C passes over the columns)."""
        cut = slice(start, stop)  # ``map`` stops with the columns: the repeated values need no count
        if self.flat:
            empty = repeat(_EMPTY_LIST)
            return list(map(FlatPiece, self.ids[cut], self.names[cut], self.continues[cut], empty, empty, empty,
                            empty, empty, empty, self.tids[cut], self.ts[cut], self.dur[cut], self.continues[cut],
                            self.host_gap[cut], self.sim[cut], self.data_deps[cut], self.data_dep_causes[cut]))
        attrs_of: dict[int, list] = {}
        attrs = [attrs_of.get(tid) or attrs_of.setdefault(tid, [{"name": "tid", "type": "uint64", "value": tid}])
                 for tid in self.tids[cut]]
        return list(map(NestedPiece, self.ids[cut], self.names[cut], self.continues[cut],
                        repeat(_EMPTY_IO_NESTED), repeat(_EMPTY_IO_NESTED), attrs, self.ts[cut],
                        self.dur[cut], self.continues[cut], self.host_gap[cut], self.sim[cut],
                        self.data_deps[cut], self.data_dep_causes[cut]))


@dataclass
class EtPlus:
    """The ET with times filled in, plus the GPU nodes (``gpu_links[k]`` made ``gpu_nodes[k]``)."""

    result: LinkResult
    gpu_nodes: list[GpuNode]
    gpu_links: list[GpuLink]
    plan: Any = None  # dependency_plan.DependencyPlan once computed (plan.deps.dependency_plan)
    plan_summary: Any = None  # the dependency_plan.WriteSummary it was computed with
    # Per ET node: its linked Kineto event's start and end (µs, NaN when unlinked), gathered by
    # ``build_et_plus`` for the plan (``busy``; None: read off the events again).
    op_times: tuple[list[float], list[float]] | None = None
    # Per ET node: its exclusive µs (0.0 when unlinked), for the plan's busy times.
    op_exclusive: list[float] | None = None
    # The later pieces as ET+ JSON nodes, in columns (``plan.json_fields``; None until annotated).
    piece_rows: PieceRows | None = None

    @property
    def et(self) -> ExecutionTrace:
        return self.result.et

    def all_nodes(self) -> list:
        return self.et.nodes + self.gpu_nodes + (self.piece_rows.nodes() if self.piece_rows else [])


def as_number(value: float) -> float | int:
    """Integral floats as ints, so traces with integer µs stay integer in the output."""
    return int(value) if value == int(value) else value


def op_exclusive_times(result: LinkResult) -> list[float]:
    """Per Kineto CPU event, the exclusive time its op is written with: the nesting's
    (``link.durations``), plus the own time of the events no op is linked to inside it, through
    other such events (``durations.with_lost_time``: an op the ET lost). O(n), O(n · depth) when
    the ET lost ops."""
    linked = np.asarray(result.match.event_of_op, dtype=np.int64)
    flagged = np.zeros(len(result.exclusive), dtype=bool)
    flagged[linked[linked >= 0]] = True
    return with_lost_time(result.exclusive, result.linked_ancestors(), flagged)


def build_et_plus(result: LinkResult) -> EtPlus:
    """Fill ET+ time fields into ``result.et.nodes`` (in place) and create the GPU nodes. A
    non-integral ``exclusive_dur`` is written rounded to 3 decimals (``round(x, 3)``): from
    ``result.exclusive_rounded`` when the nesting came with it, else rounded here (one C pass over
    every event). O(n + g)."""
    et, columns = result.et, result.kineto.cpu_columns()
    exclusive = op_exclusive_times(result)
    rounded_column = result.exclusive_rounded if exclusive is result.exclusive else None
    if rounded_column is None or len(rounded_column) != len(exclusive):
        rounded_column = rounded_exclusive(exclusive)
    apply_placement(et, result.placement)  # where the ET's tree contradicts the measurement
    nodes, event_ts, event_dur = et.nodes, columns.ts, columns.dur
    starts, ends = [math.nan] * len(nodes), [math.nan] * len(nodes)
    op_exclusive = [0.0] * len(nodes)
    for i, e in enumerate(result.match.event_of_op):
        if e < 0:
            continue
        node = nodes[i]
        ts, dur, excl = event_ts[e], event_dur[e], exclusive[e]
        starts[i], ends[i], op_exclusive[i] = ts, ts + dur, excl
        node.ts = int(ts) if ts.is_integer() else ts
        node.dur = node.inclusive_dur = int(dur) if dur.is_integer() else dur
        node.exclusive_dur = int(excl) if excl.is_integer() else rounded_column[e]
    next_id = max(et.ids) + 1
    flat = et.layout == FLAT
    gpu_nodes, gpu_links = [], []
    for link in result.gpu.links:
        if link.et_index < 0:
            continue
        g = link.event
        dur = as_number(g.dur)
        node = GpuNode(id=next_id, name=g.name, cat=g.cat, ph="X", ts=as_number(g.ts), dur=dur,
                       inclusive_dur=dur, exclusive_dur=dur,
                       stream=g.args.stream if g.args.stream is not None else _int_or_none(g.tid),
                       device=g.args.device if g.args.device is not None else _int_or_none(g.pid),
                       correlation=g.args.correlation)
        if g.args.pg_name is not None:
            node.pg_name = str(g.args.pg_name)
        parent_id = et.ids[link.et_index]
        if flat:
            node.parent = parent_id
            node.tid = et.tid[link.et_index]
            node.inputs = node.outputs = _EMPTY_LIST
            node.input_shapes = node.input_types = _EMPTY_LIST
            node.output_shapes = node.output_types = _EMPTY_LIST
        else:
            node.ctrl_deps = parent_id
            node.inputs = node.outputs = _EMPTY_IO_NESTED
            node.attrs = [{"name": "tid", "type": "uint64", "value": et.tid[link.et_index]}]
        gpu_nodes.append(node)
        gpu_links.append(link)
        next_id += 1
    return EtPlus(result, gpu_nodes, gpu_links, op_times=(starts, ends), op_exclusive=op_exclusive)


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) else None

"""The replay model: one rank's node graph as typed columns (``SimGraph``), built by ``GraphBuilder``.

A ``SimGraph`` holds what a trace-driven replay needs and nothing else: per node its id, name,
resource kind (CPU op, GPU compute op, communication, metadata), simulated duration, measured start
and measured duration, the lane it ran on (a CPU thread or a GPU device/stream), communication
attributes for the few communication nodes, and its dependencies as CSR (predecessor node numbers).
Dependencies naming an id that is not in the file are kept aside (``missing_deps``): the replay
reports those nodes as never issued instead of aborting.

Readers (``linker.sim.load``) feed rows to a ``GraphBuilder``; ``finish`` resolves ids to node
numbers. Cost: O(n + e) time and memory for n nodes and e dependency references.
"""

from __future__ import annotations

import functools
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linker.model.errors import TraceInputError

# Resource kinds.
CPU, GPU, COMM, META = 0, 1, 2, 3
KIND_NAMES = ("cpu", "gpu", "comm", "metadata")

# Communication roles.
COLL, SEND, RECV = 1, 2, 3
ROLE_NAMES = {COLL: "collective", SEND: "send", RECV: "recv"}

# Chakra CollectiveCommType numbers -> names (et_def.proto).
COMM_TYPE_NAMES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST", "ALL_TO_ALL",
                   "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
COMM_TYPE_OF_NAME = {name: number for number, name in enumerate(COMM_TYPE_NAMES)}
UNKNOWN_COMM_TYPE = -1

NO_TIME = math.nan


def comm_type_name(comm_type: int) -> str:
    """"ALL_REDUCE"... for a Chakra number; "UNKNOWN" for -1 or an unknown number."""
    return COMM_TYPE_NAMES[comm_type] if 0 <= comm_type < len(COMM_TYPE_NAMES) else "UNKNOWN"


@dataclass
class CommInfo:
    """A communication node's attributes. ``peer``: the other rank of a send (its ``comm_dst``) or a
    recv (its ``comm_src``); -1 for collectives or when unknown."""

    role: int
    comm_type: int = UNKNOWN_COMM_TYPE
    size: int = 0
    pg_name: str = "0"
    peer: int = -1
    seq: int | None = None  # ``comm_seq``: a CPU collective's issue number in its group (ranks pair by it)


def cpu_lane(tid: int) -> tuple:
    return ("cpu", tid)


def transfer_lane(tid: int) -> tuple:
    """The lane of a CPU backend's sends and receives issued on thread ``tid``: the thread's, as a
    host collective's, but apart from its ops, which go on while the transfer runs."""
    return ("cpu", tid, "send/recv")


def gpu_lane(device: int, stream: int) -> tuple:
    return ("gpu", device, stream)


def host_comm_lane(tid: int, comm: CommInfo) -> tuple:
    """A CPU backend's communication node's lane: a collective on its worker thread's, a send or
    receive on its thread's transfer lane (``graph.transfer_lane``)."""
    return transfer_lane(tid) if comm.role in (SEND, RECV) else cpu_lane(tid)


def as_int(value: Any, default: int) -> int:
    """An attribute's value as an int: a bool, an int or a decimal string; ``default`` otherwise."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def lane_label(key: tuple) -> str:
    """The lane name shown in reports and traces: "cpu thread 1", "cpu thread 1 send/recv", "gpu 0
    stream 7"."""
    if key[0] == "cpu":
        return f"cpu thread {key[1]}" + (f" {key[2]}" if len(key) > 2 else "")
    return f"gpu {key[1]} stream {key[2]}"


@dataclass
class SimGraph:
    """One rank's replay graph as columns; node numbers 0..n-1 index every column.

    ``duration``: simulated busy time (µs). ``start``/``measured_dur``: the measured timeline (NaN
    start when the node was not timed). ``lane``: index into ``lane_keys``. ``dep_offsets`` /
    ``dep_nodes``: CSR of predecessors (ctrl and data deps, deduplicated). ``missing_deps``: (node,
    id) for dependency ids absent from the file. ``comm``: node -> CommInfo for communication
    nodes. ``notes``: what the reader had to assume (fallbacks), shown in the report.
    ``dep_cause``: parallel to ``dep_nodes``, an index into ``cause_names`` saying why the edge
    exists ("parent" for a ctrl dependency, the file's ``data_dep_causes`` for data ones, "" when
    the file does not say); empty when the file gives no causes.
    """

    path: str
    rank: int
    ids: array
    names: list[str]
    kind: bytearray
    duration: array
    start: array
    measured_dur: array
    lane: array
    lane_keys: list[tuple]
    dep_offsets: array
    dep_nodes: array
    missing_deps: list[tuple[int, int]] = field(default_factory=list)
    comm: dict[int, CommInfo] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dep_cause: bytearray = field(default_factory=bytearray)
    cause_names: list[str] = field(default_factory=lambda: [""])
    # Node -> µs of its duration that is host time between ops (``host_gap``), for the nodes with any.
    host_gap: dict[int, float] = field(default_factory=dict)
    # A later piece of an op (docs/durations.md) -> the id of the op it continues.
    continues: dict[int, int] = field(default_factory=dict)
    # A wait node (``write.wait_nodes``: a measured wait written into the file) -> its cause.
    wait_nodes: dict[int, str] = field(default_factory=dict)

    def op_us(self, u: int, us: float) -> float:
        """Of ``us`` spent running node ``u`` (its simulated duration, or a part of it), the part
        that is its op's own time: the rest is the host time between ops folded into it."""
        gap = self.host_gap.get(u)
        if not gap:
            return us
        total = self.duration[u]
        return us - (min(gap, total) * us / total if total > 0 else 0.0)

    def edge_cause(self, u: int, d: int) -> str:
        """Why u depends on d (both local node numbers); "" when unknown. O(deps of u)."""
        if not self.dep_cause:
            return ""
        for k in range(self.dep_offsets[u], self.dep_offsets[u + 1]):
            if self.dep_nodes[k] == d:
                return self.cause_names[self.dep_cause[k]]
        return ""

    def __len__(self) -> int:
        return len(self.ids)

    def deps_of(self, u: int) -> array:
        return self.dep_nodes[self.dep_offsets[u]:self.dep_offsets[u + 1]]

    def measured_span(self) -> tuple[float, float]:
        """(earliest measured start, latest measured end) over timed nodes; (nan, nan) if none.
        One O(n) pass, computed once per graph (the measured times do not change)."""
        return self._measured_span

    @functools.cached_property
    def _measured_span(self) -> tuple[float, float]:
        first, last = math.inf, -math.inf
        for s, d in zip(self.start, self.measured_dur):
            if not math.isnan(s):
                if s < first:
                    first = s
                if s + d > last:
                    last = s + d
        return (first, last) if first <= last else (NO_TIME, NO_TIME)

    def measured_step(self) -> float:
        """Latest (start + measured duration) minus earliest start over timed nodes (0 if none)."""
        first, last = self.measured_span()
        return last - first if not math.isnan(first) else 0.0


class GraphBuilder:
    """Collects node rows in file order, then ``finish`` resolves dependency ids. O(1) per row."""

    def __init__(self, path: str, rank: int = 0):
        self.path = path
        self.rank = rank
        self.ids = array("q")
        self.names: list[str] = []
        self.kind = bytearray()
        self.duration = array("d")
        self.start = array("d")
        self.measured_dur = array("d")
        self.lane = array("q")
        self.lane_index: dict[tuple, int] = {}
        self.dep_ids: list = []  # per node: a tuple/list of dependency ids
        self.dep_causes: dict[int, list[str]] = {}  # node -> cause per entry of its dep_ids, when known
        self.comm: dict[int, CommInfo] = {}
        self.notes: list[str] = []
        self.host_gap: dict[int, float] = {}  # node -> its host time (µs), when any
        self.continues: dict[int, int] = {}  # a later piece -> the id of the op it continues
        self.wait_nodes: dict[int, str] = {}  # a wait node -> its cause

    def add(self, node_id: int, name: str, kind: int, duration: float, start: float, measured_dur: float,
            lane_key: tuple, dep_ids, comm: CommInfo | None = None, causes: list[str] | None = None) -> int:
        """Append one node; ``dep_ids``: its ctrl + data dependency ids (duplicates allowed);
        ``causes``: why, one per entry of ``dep_ids`` (optional)."""
        u = len(self.ids)
        self.ids.append(node_id)
        self.names.append(name)
        self.kind.append(kind)
        self.duration.append(duration if duration > 0 else 0.0)
        self.start.append(start)
        self.measured_dur.append(measured_dur if measured_dur > 0 else 0.0)
        lane = self.lane_index.get(lane_key)
        if lane is None:
            lane = self.lane_index[lane_key] = len(self.lane_index)
        self.lane.append(lane)
        self.dep_ids.append(dep_ids)
        if comm is not None:
            self.comm[u] = comm
        if causes is not None:
            self.dep_causes[u] = causes
        return u

    def columns(self) -> tuple:
        """The rows added so far as plain columns, for ``absorb`` by a builder in another process."""
        return (self.ids, self.names, self.kind, self.duration, self.start, self.measured_dur, self.lane,
                list(self.lane_index), self.dep_ids, self.dep_causes, self.comm, self.host_gap, self.continues,
                self.wait_nodes)

    def absorb(self, columns: tuple) -> None:
        """Append the rows of another builder's ``columns()`` after this one's, as if added here:
        lanes renumbered by first use, node numbers of causes and comm shifted. O(rows)."""
        ids, names, kind, duration, start, measured_dur, lane, lane_keys, dep_ids, dep_causes, comm, gaps, pieces, waits = columns
        offset = len(self.ids)
        renumber = [self.lane_index.setdefault(key, len(self.lane_index)) for key in lane_keys]
        taken_as_they_are = ((self.ids, ids), (self.names, names), (self.kind, kind), (self.duration, duration),
                             (self.start, start), (self.measured_dur, measured_dur), (self.dep_ids, dep_ids))
        for column, more in taken_as_they_are:
            column.extend(more)
        self.lane.extend(array("q", [renumber[k] for k in lane]))
        self.dep_causes.update((u + offset, causes) for u, causes in dep_causes.items())
        self.comm.update((u + offset, info) for u, info in comm.items())
        self.host_gap.update((u + offset, us) for u, us in gaps.items())
        self.continues.update((u + offset, op) for u, op in pieces.items())
        self.wait_nodes.update((u + offset, cause) for u, cause in waits.items())

    def finish(self) -> SimGraph:
        """Resolve dependency ids to node numbers. Raises ValueError on a duplicated node id."""
        index: dict[int, int] = {}
        for u, node_id in enumerate(self.ids):
            if index.setdefault(node_id, u) != u:
                raise ValueError(f"node id {node_id} appears twice")
        offsets = array("q", [0])
        nodes = array("q")
        missing: list[tuple[int, int]] = []
        get = index.get
        append, mark = nodes.append, offsets.append
        causes_of = self.dep_causes
        dep_cause = bytearray()
        add_cause = dep_cause.append
        cause_code: dict[str, int] = {"": 0}
        code_of = cause_code.get
        for u, deps in enumerate(self.dep_ids):
            causes = causes_of.get(u) if causes_of else None
            if causes is None:
                if len(deps) > 1:
                    deps = dict.fromkeys(deps)  # deduplicated, in order
                for d in deps:
                    v = get(d)
                    if v is None:
                        missing.append((u, d))
                    else:
                        append(v)
                        if causes_of:
                            add_cause(0)
            else:
                first: dict[int, str] = {}
                for d, cause in zip(deps, causes):
                    if first.setdefault(d, cause) == "parent" and cause:
                        first[d] = cause  # a data cause ("launch"...) says more than the ctrl edge it repeats
                for d, cause in first.items():
                    v = get(d)
                    if v is None:
                        missing.append((u, d))
                        continue
                    append(v)
                    code = code_of(cause)
                    if code is None:  # past 255 distinct causes, the rest share code 0 (no name)
                        code = 0
                        if len(cause_code) < 256:
                            code = cause_code[cause] = len(cause_code)
                    add_cause(code)
            mark(len(nodes))
        self.dep_ids, self.dep_causes = [], {}
        return SimGraph(self.path, self.rank, self.ids, self.names, self.kind, self.duration, self.start,
                        self.measured_dur, self.lane, list(self.lane_index), offsets, nodes, missing,
                        self.comm, self.notes, dep_cause, sorted(cause_code, key=cause_code.get), self.host_gap,
                        self.continues, self.wait_nodes)


def finish_graph(builder: GraphBuilder, path: Path) -> SimGraph:
    """The graph of ``builder``'s rows; its errors (no nodes, a dependency on no node) raise
    TraceInputError naming ``path``."""
    if not builder.ids:
        raise TraceInputError(path, "the trace holds no nodes")
    try:
        return builder.finish()
    except ValueError as err:
        raise TraceInputError(path, str(err)) from None

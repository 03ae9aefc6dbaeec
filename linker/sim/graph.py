"""The replay model: one rank's node graph as typed columns (``SimGraph``), built by ``GraphBuilder``.

A ``SimGraph`` holds what a trace-driven replay needs and nothing else: per node its id, name,
resource kind (CPU op, GPU compute op, communication, metadata), simulated duration, measured start
and measured duration, the lane it ran on (a CPU thread or a GPU device/stream), communication
attributes for the few communication nodes, and its dependencies as CSR (predecessor node numbers).
Dependencies naming an id that is not in the file are kept aside (``missing_deps``): the replay
reports those nodes as never issued instead of aborting.

Readers (``linker.sim.load``) feed rows to a ``GraphBuilder``; ``finish`` resolves ids to node
numbers (``resolve_dependencies``, numpy passes). Cost: O(n) per row added, O(e log e) to resolve
e dependency references; memory O(n + e).
"""

from __future__ import annotations

import functools
import math
from array import array
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

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
        """Resolve dependency ids to node numbers (``resolve_dependencies``). Raises ValueError on a
        duplicated node id."""
        offsets, nodes, missing, dep_cause, cause_names = resolve_dependencies(self.ids, self.dep_ids,
                                                                               self.dep_causes)
        self.dep_ids, self.dep_causes = [], {}
        return SimGraph(self.path, self.rank, self.ids, self.names, self.kind, self.duration, self.start,
                        self.measured_dur, self.lane, list(self.lane_index), offsets, nodes, missing,
                        self.comm, self.notes, dep_cause, cause_names, self.host_gap, self.continues,
                        self.wait_nodes)


MAX_CAUSES = 256  # distinct causes a graph names (``dep_cause`` is a byte); past them, code 0 (no name)


def resolve_dependencies(ids: array, dep_ids: list, dep_causes: dict[int, list[str]]) -> tuple:
    """Each node's dependencies as node numbers, from its dependency ids (``GraphBuilder.dep_ids``)
    and, for the nodes that have them, one cause per id (``dep_causes``; ids past the last cause
    are left out). Returns (offsets, nodes, missing, dep_cause, cause_names): the CSR of the
    predecessors, each id once in the order of its first mention; the (node, id) of ids that name
    no node, each once; a cause code per kept predecessor (empty when no node has causes) and the
    names of the codes ("" first), numbered in the order they first occur.

    An id mentioned twice keeps the cause of its first mention, except that a "parent" (the ctrl
    edge) gives way to the first later mention's cause other than "" or "parent" (a data cause,
    "launch"..., says more than the ctrl edge it repeats). Raises ValueError on a duplicated node
    id. O(E log E) in numpy passes for E mentions."""
    node_ids = np.frombuffer(ids, dtype=np.int64) if len(ids) else np.zeros(0, dtype=np.int64)
    by_id = np.argsort(node_ids, kind="stable")
    sorted_ids = node_ids[by_id]
    repeated = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1]) + 1
    if len(repeated):  # the first node (in node order) whose id an earlier node has
        raise ValueError(f"node id {int(node_ids[by_id[repeated].min()])} appears twice")
    owner, mentioned, cause, names, outside = _mentions(dep_ids, dep_causes, node_ids)
    first, resolved = _first_mentions(owner, mentioned, cause, names.get("parent", -1))
    first_ids, first_owners = mentioned[first], owner[first]
    at = np.minimum(np.searchsorted(sorted_ids, first_ids), max(len(sorted_ids) - 1, 0))
    found = sorted_ids[at] == first_ids if len(sorted_ids) else np.zeros(len(first), dtype=bool)
    missing = [(u, outside.get(d, d)) for u, d in zip(first_owners[~found].tolist(), first_ids[~found].tolist())]
    offsets = array("q", [0])
    offsets.frombytes(np.cumsum(np.bincount(first_owners[found], minlength=len(node_ids)), dtype=np.int64).tobytes())
    nodes = array("q")
    nodes.frombytes(by_id[at[found]].astype(np.int64).tobytes())
    if not dep_causes:
        return offsets, nodes, missing, bytearray(), [""]
    codes, cause_names = _cause_codes(resolved[found], list(names))
    return offsets, nodes, missing, bytearray(codes.astype(np.uint8).tobytes()), cause_names


def _mentions(dep_ids: list, dep_causes: dict[int, list[str]], node_ids: np.ndarray) -> tuple:
    """Every dependency mention as columns, in node order then the order given: its node, the id
    it names and its cause, an index into the names returned ("" first: the cause of a node
    without causes; a node with causes mentions as many ids as it has both ids and causes); and
    the ids past 64 bits (a damaged file's: they name no node), each stood for in the id column by
    a value no node has and no other mention names (``_beyond_64_bits``). O(E), in C passes but
    for the nodes whose causes and ids differ in number."""
    lengths = np.fromiter(map(len, dep_ids), dtype=np.int64, count=len(dep_ids))
    with_causes = np.fromiter(dep_causes.keys(), dtype=np.int64, count=len(dep_causes))
    cause_lengths = np.fromiter(map(len, dep_causes.values()), dtype=np.int64, count=len(dep_causes))
    counts = lengths.copy()
    counts[with_causes] = np.minimum(lengths[with_causes], cause_lengths)
    given = counts[with_causes]
    ids_cut = not np.array_equal(counts, lengths)
    causes_cut = not np.array_equal(given, cause_lengths)
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(dep_ids), dtype=np.int64), counts)

    def listed():
        if ids_cut:
            return chain.from_iterable(deps[:k] for deps, k in zip(dep_ids, counts.tolist()))
        return chain.from_iterable(dep_ids)

    outside: dict[int, int] = {}
    try:
        mentioned = np.fromiter(listed(), dtype=np.int64, count=total)
    except OverflowError:
        mentioned, outside = _beyond_64_bits(list(listed()), node_ids)
    distinct = dict.fromkeys(chain([""], chain.from_iterable(dep_causes.values())))
    names = {name: code for code, name in enumerate(distinct)}
    cause = np.zeros(total, dtype=np.int64)
    if len(with_causes):
        causes = (chain.from_iterable(c[:k] for c, k in zip(dep_causes.values(), given.tolist())) if causes_cut
                  else chain.from_iterable(dep_causes.values()))
        codes = np.fromiter(map(names.__getitem__, causes), dtype=np.int64, count=int(given.sum()))
        first_of_node = np.cumsum(counts) - counts  # each node's first mention
        first_of_run = np.cumsum(given) - given  # each node's first cause in ``codes``
        cause[np.repeat(first_of_node[with_causes] - first_of_run, given) + np.arange(len(codes))] = codes
    return owner, mentioned, cause, names, outside


_INT64 = range(-(1 << 63), 1 << 63)  # the ids a column of int64 holds


def _beyond_64_bits(mentions: list[int], node_ids: np.ndarray) -> tuple[np.ndarray, dict[int, int]]:
    """The mentions as an int64 column, each distinct id past 64 bits replaced by a value below
    every node id and every other mention, with the map back to the ids replaced. O(E)."""
    floor = min(min((d for d in mentions if d in _INT64), default=0), int(node_ids.min()) if len(node_ids) else 0, 0)
    stand_in: dict[int, int] = {}
    for d in mentions:
        if d not in _INT64 and d not in stand_in:
            stand_in[d] = floor - 1 - len(stand_in)
    column = np.array([stand_in.get(d, d) for d in mentions], dtype=np.int64)
    return column, {value: d for d, value in stand_in.items()}


def _first_mentions(owner: np.ndarray, mentioned: np.ndarray, cause: np.ndarray,
                    parent: int) -> tuple[np.ndarray, np.ndarray]:
    """The position of each (node, id)'s first mention, in mention order, and the cause it keeps
    (``resolve_dependencies``' rule; ``parent``: the code of "parent", -1 when no mention has it).
    O(E log E)."""
    if not len(owner):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(len(owner)), mentioned, owner))  # by node, id, then mention order
    same = (owner[order][1:] == owner[order][:-1]) & (mentioned[order][1:] == mentioned[order][:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    first = order[starts]
    kept = cause[first]
    if parent >= 0 and (kept == parent).any():
        ordered = cause[order]
        place = np.where((ordered != 0) & (ordered != parent), np.arange(len(order)), len(order))
        says_more = np.minimum.reduceat(place, starts)  # each (node, id): its first mention whose cause says more
        replace = (kept == parent) & (says_more < len(order))
        kept[replace] = ordered[says_more[replace]]
    by_mention = np.argsort(first, kind="stable")
    return first[by_mention], kept[by_mention]


def _cause_codes(resolved: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes for the kept causes (indices into ``names``), numbered by first occurrence ("" is 0;
    past ``MAX_CAUSES`` names the rest are 0), and the names of the codes. O(k log k)."""
    distinct, first_at = np.unique(resolved, return_index=True)
    code_of = np.zeros(len(names), dtype=np.int64)
    kept = [""]
    for index in distinct[np.argsort(first_at, kind="stable")].tolist():
        if index != 0 and len(kept) < MAX_CAUSES:
            code_of[index] = len(kept)
            kept.append(names[index])
    return code_of[resolved], kept


def finish_graph(builder: GraphBuilder, path: Path) -> SimGraph:
    """The graph of ``builder``'s rows; its errors (no nodes, a dependency on no node) raise
    TraceInputError naming ``path``."""
    if not builder.ids:
        raise TraceInputError(path, "the trace holds no nodes")
    try:
        return builder.finish()
    except ValueError as err:
        raise TraceInputError(path, str(err)) from None

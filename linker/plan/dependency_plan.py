"""The dependency plan as a value: its node numbering, the causes of its edges and the counts
of what was written (``docs/durations.md``).

One numbering for all nodes: ET node i is i, GPU node k is n + k, later piece j (``Pieces``: an
op's exclusive time after its first child, a node of its own) is n + g + j; ``NO_NODE`` is none. Every data
dependency carries one of ``CAUSES``. ``DependencyPlan`` is what ``deps.plan_dependencies``
builds and the writers read: ctrl (parent) and previous-on-the-thread columns, the extra edges
with their causes, the busy times, the communication attributes and the write order.
``GpuPlacement`` and ``IssueIndex`` place GPU ops by stream and issue time, for the collective
order and the wait edges (``waits``). Cost: the columns are O(n + g) small ints.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from linker.plan.busy import BusyTimes
from linker.plan.comm import CommAttrs

NO_NODE = -1

THREAD_ORDER, PARENT, LAUNCH, STREAM_ORDER = "thread_order", "parent", "launch", "stream_order"
EVENT_WAIT, SYNC, FORK, JOIN, COLLECTIVE_ORDER = "event_wait", "sync", "fork", "join", "collective_order"
CAUSES = (THREAD_ORDER, PARENT, LAUNCH, STREAM_ORDER, EVENT_WAIT, SYNC, FORK, JOIN, COLLECTIVE_ORDER)

# ---------------------------------------------------------------------------------------------
# Dependency plan
# ---------------------------------------------------------------------------------------------


@dataclass
class GpuPlacement:
    """Per GPU node k: its (device, stream), issue (launch) time and issuing Kineto thread.
    ``before_trace``: the GPU nodes launched before the trace began (no launch event: their issue
    time here is their own start, which orders them on their stream; they were issued before any
    call of the trace)."""

    stream_key: list[tuple]
    issue_ts: list[float]
    issue_thread: list[tuple | None]
    before_trace: frozenset[int] = frozenset()


@dataclass
class IssueIndex:
    """GPU ops grouped for "last op issued before t" lookups: per key, issue times (sorted) and
    the GPU node numbers in that order. Lookups are one bisect: O(log g)."""

    times: dict[Any, list[float]] = field(default_factory=dict)
    nodes: dict[Any, list[int]] = field(default_factory=dict)

    @staticmethod
    def build(keys: list, issue_ts: list[float]) -> IssueIndex:
        grouped: dict[Any, list[int]] = {}
        for k, key in enumerate(keys):
            if key is not None:
                grouped.setdefault(key, []).append(k)
        index = IssueIndex()
        for key, members in grouped.items():
            members.sort(key=issue_ts.__getitem__)  # stable: by (issue time, k), members come by k
            index.nodes[key] = members
            index.times[key] = [issue_ts[k] for k in members]
        return index

    def last_before(self, key: Any, t: float) -> int:
        """The last GPU node of ``key`` issued at or before ``t`` (-1 if none)."""
        times = self.times.get(key)
        if not times:
            return NO_NODE
        position = bisect_right(times, t)
        return self.nodes[key][position - 1] if position else NO_NODE

    def first_after(self, key: Any, t: float) -> int:
        """The first GPU node of ``key`` issued after ``t`` (-1 if none)."""
        times = self.times.get(key)
        if not times:
            return NO_NODE
        position = bisect_right(times, t)
        return self.nodes[key][position] if position < len(times) else NO_NODE


@dataclass
class WriteSummary:
    """What ``write_chakra_trace`` wrote and decided."""

    path: str
    nodes: int = 0
    counts_by_type: Counter = field(default_factory=Counter)
    wait_calls: Counter = field(default_factory=Counter)  # runtime wait calls seen, by name
    wait_edges: int = 0  # edges GPU op -> the op that waited (distinct edges written)
    wait_edges_redirected: int = 0  # edges that go to the op after the call, not the op holding it
    copy_wait_edges: int = 0  # synchronous copy -> the op after the copy call
    waits_skipped: Counter = field(default_factory=Counter)  # reason -> count
    comm_unresolved: Counter = field(default_factory=Counter)  # reason -> comm kernels as COMP_NODE
    # CPU collectives, sends and receives whose trace names no process group, in a job with others
    # (``cpu_comm``): "collectives" taken as the world group's, "point_to_point" kept as CPU ops;
    # "groups": how many the job had
    cpu_comm_unnamed: Counter = field(default_factory=Counter)
    ctrl_deps_dropped: int = 0  # parents missing from the ET (roots' self-parents not counted)
    dependency_causes: Counter = field(default_factory=Counter)  # data dependencies by cause
    et_fields_from_child: int = 0  # ops whose ET-only fields a child encoded (``schedule.fields_child``)
    seconds: float = 0.0


def chain_is_parent(prev, ctrl):
    """Whether a CPU node's (or later piece's) dependency on ``prev``, the node its thread ran just
    before it, is on its parent (``ctrl``): the one statement of the rule, on two node numbers or
    on two columns of them alike (numpy arrays: a column of booleans)."""
    return prev == ctrl


def chain_cause(prev: int, ctrl: int) -> str:
    """The cause of that dependency: ``parent`` when ``chain_is_parent``, else ``thread_order``.
    ``DependencyPlan.data_deps``, the ET+ JSON's fields and the ``.et`` encoder all read it here."""
    return PARENT if chain_is_parent(prev, ctrl) else THREAD_ORDER


@dataclass
class DependencyPlan:
    """Dependencies of every node in one numbering: ET node i is i, GPU node k is n + k, later
    piece j is ``piece_start`` + j (``piece_start`` = n + g).

    ``ctrl[u]``: parent (-1 none; a piece's: the op it continues). ``prev[u]``: previous node of
    u's CPU thread chain (pieces are in the chains), or, for a GPU node, the previous op on its
    stream (-1 none); a GPU node's launcher is ``ctrl[u]``.
    ``waits[u]``: other (source, cause) data dependencies of u: fork/join, sync, event_wait,
    collective_order. ``order``: topological write order, and ``position`` each node's place in it.
    ``busy``: busy times of the ET nodes; ``comm[k]``:
    communication attributes of GPU node k (None for non-communication kernels).
    """

    cpu_count: int
    ctrl: array
    prev: array
    waits: dict[int, list[tuple[int, str]]]
    busy: BusyTimes | None = None
    comm: list[CommAttrs | None] = field(default_factory=list)
    launchless: frozenset = frozenset()  # GPU nodes with no launch (before the trace): no ``launch`` edge
    cpu_comm: dict[int, CommAttrs] = field(default_factory=dict)  # ET index -> CPU collective (``cpu_comm``)
    order: list[int] = field(default_factory=list, repr=False)
    position: array = field(default_factory=lambda: array("q"), repr=False)
    piece_start: int = -1  # the first piece's number (n + g); -1: no pieces
    piece_ids: list[int] = field(default_factory=list)  # the node id of each piece

    def is_piece(self, u: int) -> bool:
        return 0 <= self.piece_start <= u

    def node_id(self, u: int, et_ids: list[int], gpu_nodes) -> int:
        """The written id of node ``u``."""
        if u < self.cpu_count:
            return et_ids[u]
        if self.is_piece(u):
            return self.piece_ids[u - self.piece_start]
        return gpu_nodes[u - self.cpu_count].id

    def data_deps(self, u: int) -> list[tuple[int, str]]:
        """(source node, cause) of every data dependency of u, in the order written."""
        p = self.prev[u]
        if u < self.cpu_count or self.is_piece(u):
            deps = [(p, chain_cause(p, self.ctrl[u]))] if p >= 0 else []
        else:
            deps = [(self.ctrl[u], LAUNCH)] if self.ctrl[u] >= 0 and u not in self.launchless else []
            if p >= 0:
                deps.append((p, STREAM_ORDER))
        waits = self.waits.get(u)
        if not waits:  # most nodes: no set to build
            return deps
        seen = {d for d, _ in deps}
        for source, cause in waits:
            if source not in seen:
                seen.add(source)
                deps.append((source, cause))
        return deps

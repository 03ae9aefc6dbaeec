"""Discrete-event replay of one rank's graph or of a whole job's graphs (``replay``).

Semantics (those of ASTRA-sim's workload layer over Chakra's FeederV3):
- a node becomes *ready* when every one of its ctrl and data dependencies has finished (a child waits
  for its parent to finish); a dependency on an id absent from the file is never satisfied;
- each node runs on one *unit* of its rank for its duration (scaled by ``Scale``). Model
  ``astra-sim`` has three units per rank: CPU ops, GPU compute ops, communication (at most one of
  each in flight); model ``lanes`` has one unit per CPU thread and per GPU (device, stream), a
  communication kernel running on its stream. Metadata nodes take no time and no unit;
- issue policy among ready nodes of one unit (``issue_order``): under ``astra-sim`` the node with
  the smallest id, as ASTRA-sim's workload layer walks its dependency-free nodes (docs/fidelity.md,
  "ASTRA-sim's issue order"); under ``lanes`` the node that became ready first, ties by measured
  start, then node id (a stream or a thread runs its work in the order it came);
- job replay: the collective a rank issues is matched with the k-th collective of the same
  process group (``pg_name``) on every other member rank, k counted in measured-start order per
  rank; a send with the recv of the same (src, dst) pair in the same order. Members of a group come
  from ``comm_groups`` (``{"<pg>": [ranks]}``), else all ranks of the job. The collective holds
  each member's unit from its issue, starts when the last member has issued it, and lasts the
  *transfer time*: the shortest measured duration among its members' kernels. A measured NCCL
  kernel lasts from its rank's arrival to the end of the transfer, so it includes the wait for the
  slowest peer; the last rank to arrive waits for nobody, so its kernel — the shortest — is the
  transfer alone. This needs no clock alignment between ranks. A single rank replays its
  collectives for their own duration.
- CPU collectives (gloo, MPI, UCC; on a CPU lane) start (arrive, in a job) as long after their
  dependencies finish as their worker took to pick them up when measured (``_cpu_pickups``: the
  host's time, which ``Scale`` leaves as it is, but for the part the collective spent
  communicating beside the group's earlier one, which the comm factor scales and a network
  what-if stretches as the earlier one: ``CommGroups.shared``, ``network.retime``; counted from
  when the node was ready, so a unit
  that freed later than that adds nothing); in a
  job on one clock each member ends its own measured time after the last arrival (``_cpu_waits``).
  They are matched by their issue number (``comm_seq``)
  when every one has one: one that only some ranks hold (the ETs of the others lost it at the end of
  the trace) is replayed alone by those that hold it. One that ran, on some rank, while the group's
  previous one still ran (``_ran_under_previous``) is replayed alone on every rank, for the part that
  outlasted the previous one: matching it would make each rank wait for every rank's previous
  collective, which the run did not do. Under ``astra-sim`` (one collective in flight per rank) it
  is not issued before the collective issued before it on its rank has ended
  (``CommGroups.issued_after``), however early it became ready: its worker may have taken it µs
  before the earlier one's, and it would hold the unit through its time beside that one.
- measured waits (``holds``, from ``measured_holds``; ``et-link simulate --waits measured``, the
  default): an op that, when measured, started after everything it depends on had finished (as
  the replay ends them) waited for something the graph does not hold. Replaying the trace as
  measured, it becomes ready no earlier than its measured start (from its rank's release): where
  the replay already runs late, that lateness takes the wait's place instead of adding to it. In
  a what-if (``Scale`` or ``network``) it becomes ready, after its dependencies finish, as long as
  the replay of the trace as measured held it (``what_if_holds``). Without holds the replay gives
  the graph's own prediction (``--waits explained``).
- job replay: each rank starts at its measured start offset (its first measured start minus the
  job's earliest) when the ranks' clocks agree (``measured_release``), else all at 0. A rank that
  began its step late makes the others wait for it at the first collective, as it did when measured.

The loop ends when no event is left; nodes that never ran are then explained (``diagnose``), so a
stuck graph (missing dependency, cycle, collective a rank never reaches) is reported, never hung
on. Cost: O((n + e) log n) time, O(n + e) memory for n nodes and e dependencies over all ranks.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from linker.model.errors import OptionError
from linker.plan.rank_start import measured_offsets
from linker.sim.graph import COLL, COMM, CPU, META, RECV, SEND, SimGraph, comm_type_name, lane_label
from linker.sim.network import NetworkSpec, retime
from linker.sim.unheld import gpu_waits, host_waits

ASTRA_SIM, LANES = "astra-sim", "lanes"
MODELS = (ASTRA_SIM, LANES)
# Issue orders (``replay``'s ``issue_order``): the ready node with the smallest id, or the one ready first.
BY_ID, BY_READY = "id", "ready"


# Why a node's start is what it is (``Replay.cause_kind``).
CAUSE_NONE, CAUSE_DEPENDENCY, CAUSE_UNIT, CAUSE_PEER = 0, 1, 2, 3

NO_NODE = -1


@dataclass(frozen=True)
class Scale:
    """Duration factors for what-if questions: CPU ops, GPU compute ops, communication."""

    cpu: float = 1.0
    gpu: float = 1.0
    comm: float = 1.0

    @classmethod
    def parse(cls, text: str) -> "Scale":
        """``"cpu=0.5,gpu=2"`` -> Scale(0.5, 2, 1). Raises OptionError on a bad item."""
        factors = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in ("cpu", "gpu", "comm"):
                raise OptionError(f"bad --scale item {item!r}: use cpu=F, gpu=F, comm=F")
            try:
                factor = float(value)
            except ValueError:
                raise OptionError(f"bad --scale factor {value!r} for {name}") from None
            if not (factor >= 0 and math.isfinite(factor)):
                raise OptionError(f"--scale {name} must be a finite number >= 0, not {value}")
            factors[name] = factor
        return cls(**factors)

    def factor(self, kind: int) -> float:
        return (self.cpu, self.gpu, self.comm, 0.0)[kind]


@dataclass
class CommGroups:
    """The matched communication of a job: group g has ``members[g]`` (global node numbers) and
    needs ``expected[g]`` of them (fewer present: it can never start). ``group_of[u]``: u's group
    or -1 (a node replayed alone). ``label[g]``: (pg or "p2p a->b", index) for reports."""

    group_of: array
    members: list[list[int]] = field(default_factory=list)
    expected: list[int] = field(default_factory=list)
    member_ranks: list[list[int]] = field(default_factory=list)
    label: list[tuple[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    type_mismatch: dict[str, str] = field(default_factory=dict)  # pg -> first disagreement, in words
    waited: dict[int, list[float]] = field(default_factory=dict)  # g -> per member: measured wait for peers
    pickup: dict[int, float] = field(default_factory=dict)  # CPU collective -> its worker's measured pickup delay
    # CPU collective replayed alone because it ran under the group's previous one -> the collective
    # issued before it on its rank, where the group's collectives carry issue numbers
    # (``_match_group``): model astra-sim issues it after that one ended.
    issued_after: dict[int, int] = field(default_factory=dict)
    # CPU collective -> the part of its pickup inside its own record: it communicated there, under
    # the group's earlier collective (``_cpu_pickups``); what-ifs move it with the medium.
    shared: dict[int, float] = field(default_factory=dict)

    def resize_shared(self, v: int, length: float) -> None:
        """Make the part of v's pickup spent communicating under the group's earlier collective
        ``length`` µs long (never below 0; a what-if's change of that medium: ``Scale``'s comm
        factor, a network episode's change). Nothing for a collective without such a part."""
        part = self.shared.get(v)
        if part:
            length = max(0.0, length)
            self.pickup[v] += length - part
            self.shared[v] = length


@dataclass(kw_only=True)
class Replay:
    """Result of a replay over ``graphs`` (global node u of rank position r is offsets[r] + local);
    built by ``replay`` with every field named.

    Times in µs from 0; NaN where a node never became ready / was never issued / started / finished.
    ``issue``: when its unit took it; ``start``: when it began to run (for a collective, when its
    last member was issued).
    ``cause[u]``: the node whose end set u's start (a dependency, the previous node on the unit, or
    for a collective the cause of its last-arriving member ``peer[u]``), -1 at time 0.
    """

    graphs: list[SimGraph]
    model: str
    scale: Scale
    offsets: list[int]
    duration: array
    unit_of: array
    unit_names: list[tuple[int, str]]  # (rank position, unit name)
    ready: array
    issue: array
    start: array
    end: array
    cause: array
    cause_kind: bytearray
    peer: array
    groups: CommGroups
    missing: bytearray  # 1 when u depends on an id absent from its file
    queued: list[int]  # nodes still waiting for their unit when the loop ended
    release: list[float]  # per rank position: when its first nodes became ready
    # Global node -> (µs, cause, measured start offset): a measured wait the replay held it back by
    # after its dependencies finished (``measured_holds``; empty when replaying the graph's own
    # waits only).
    holds: dict[int, tuple[float, str, float]] = field(default_factory=dict)
    # ``network.NetworkWhatIf``: how ``--network`` re-timed the collectives (None without it).
    network: object | None = None
    # How a hold is replayed: True (the trace as measured: no ``Scale``, no ``network``): not before
    # its op's measured start (from its rank's release), so lateness the replay already has absorbs
    # the wait instead of adding to it; False (a what-if): the wait's length after the dependencies.
    holds_to_measured_start: bool = True
    issue_order: str = BY_ID  # ``replay``'s ``issue_order``
    # Held node -> when its dependencies had all finished (its hold ran from then to ``ready``).
    held_from: dict[int, float] = field(default_factory=dict)
    # Wait node -> the time it lasts until once its unit takes it (``replay``'s ``wait_floors``).
    wait_floors: dict[int, float] = field(default_factory=dict)
    # Whether the files' wait nodes were given their time (``replay``'s ``wait_nodes``).
    wait_nodes: bool = True

    def rank_of(self, u: int) -> int:
        """Rank position (index into ``graphs``) of global node u. O(log ranks)."""
        return bisect_right(self.offsets, u) - 1

    def local(self, u: int) -> tuple[SimGraph, int]:
        r = self.rank_of(u)
        return self.graphs[r], u - self.offsets[r]

    def wait_causes(self, r: int) -> list[str]:
        """Per node of rank position r, the cause of the measured wait it stands for (a wait node
        of its file) or was held back by (``holds``); "" for neither. O(nodes of the rank + holds)."""
        graph, base = self.graphs[r], self.offsets[r]
        causes = [""] * len(graph)
        for u, (_, cause, _) in self.holds.items():
            if base <= u < base + len(graph):
                causes[u - base] = cause
        for local, cause in graph.wait_nodes.items():
            causes[local] = cause
        return causes

    @property
    def node_count(self) -> int:
        return len(self.duration)


# ---------------------------------------------------------------------------------------------
# Building the job-wide columns
# ---------------------------------------------------------------------------------------------


def _units(graphs: list[SimGraph], model: str, wait_nodes: bool = True) -> tuple[array, list[tuple[int, str]]]:
    """Unit of every node (-1 for metadata, and for the files' wait nodes when ``wait_nodes`` is
    False: absent, they hold no unit either, so no op queues behind one) and the units' names:
    under ``ASTRA_SIM`` a rank's cpu, gpu and comm units (a node's by its kind), else one per lane.
    Numpy passes over the kind and lane columns, O(n)."""
    columns: list[np.ndarray] = []
    names: list[tuple[int, str]] = []
    for r, graph in enumerate(graphs):
        base = len(names)
        kind = np.frombuffer(graph.kind, dtype=np.uint8)
        if model == ASTRA_SIM:
            names += [(r, "cpu"), (r, "gpu"), (r, "comm")]
            unit = np.where(kind == META, -1, base + kind.astype(np.int64))
        else:
            names += [(r, lane_label(key)) for key in graph.lane_keys]
            unit = np.where(kind == META, -1, base + np.asarray(graph.lane, dtype=np.int64))
        if not wait_nodes and graph.wait_nodes:
            unit[list(graph.wait_nodes)] = -1
        columns.append(unit)
    return _int_array(np.concatenate(columns) if columns else np.zeros(0, dtype=np.int64)), names


def node_offsets(graphs: list[SimGraph]) -> list[int]:
    """The global number of each graph's first node when the graphs' nodes are numbered one after
    the other (rank position r's node u is ``offsets[r] + u``). O(ranks)."""
    return list(accumulate((len(graph) for graph in graphs[:-1]), initial=0)) if graphs else []


def _successors(graphs: list[SimGraph], offsets: list[int], total: int) -> tuple[array, array, array, bytearray]:
    """CSR of successors over global numbers, indegree (a missing dependency counts and is never
    satisfied), and the missing-dependency flag. Numpy passes over each graph's dependency CSR: a
    node's successors are the nodes that list it, in node order (the edges sorted by dependency
    with a stable sort). O(n + e log e); the columns go back to ``array`` for the event loop, which
    reads them an element at a time."""
    sizes, dependents, dependencies = [], [], []
    for graph, base in zip(graphs, offsets):
        starts = np.asarray(graph.dep_offsets, dtype=np.int64)
        size = np.diff(starts) if len(starts) else np.zeros(0, dtype=np.int64)  # dependencies per node
        sizes.append(size)
        dependents.append(np.repeat(np.arange(base, base + len(size), dtype=np.int64), size))  # each edge's node
        dependencies.append(base + np.asarray(graph.dep_nodes, dtype=np.int64))
    edge_dependent = np.concatenate(dependents) if dependents else np.zeros(0, dtype=np.int64)
    edge_dependency = np.concatenate(dependencies) if dependencies else np.zeros(0, dtype=np.int64)
    targets = edge_dependent[np.argsort(edge_dependency, kind="stable")]
    succ_offsets = np.concatenate(([0], np.cumsum(np.bincount(edge_dependency, minlength=total))))
    indegree = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
    missing = bytearray(total)
    for graph, base in zip(graphs, offsets):
        for u, _ in graph.missing_deps:
            missing[base + u] = 1
            indegree[base + u] += 1
    return _int_array(succ_offsets), _int_array(targets), _int_array(indegree), missing


def _int_array(values: np.ndarray) -> array:
    """An int64 numpy column as an ``array("q")`` (one copy)."""
    column = array("q")
    column.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return column


def match_communication(graphs: list[SimGraph], offsets: list[int], comm_groups: dict[str, list[int]] | None
                        ) -> CommGroups:
    """Match collectives by (process group, k-th in measured order) and sends with recvs by
    (src, dst, k-th) across ranks. With one rank, nothing is matched. O(c log c) for c comm nodes."""
    total = offsets[-1] + len(graphs[-1]) if graphs else 0
    groups = CommGroups(array("q", [NO_NODE]) * total)
    if len(graphs) < 2:
        return groups
    ranks = [graph.rank for graph in graphs]
    position_of_rank = {rank: r for r, rank in enumerate(ranks)}
    collectives: dict[tuple[int, str], list[int]] = {}
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for r, (graph, base) in enumerate(zip(graphs, offsets)):
        for u in sorted(graph.comm, key=lambda u: _issue_key(graph, u)):
            info = graph.comm[u]
            if info.role == COLL:
                collectives.setdefault((r, info.pg_name), []).append(base + u)
            elif info.peer in position_of_rank:
                table, key = (sends, (graph.rank, info.peer)) if info.role == SEND else (recvs, (info.peer, graph.rank))
                table.setdefault(key, []).append(base + u)
            elif info.role in (SEND, RECV):
                groups.notes.append(f"rank {graph.rank}: {'send' if info.role == SEND else 'recv'} node "
                                    f"{graph.ids[u]} has no peer among the given ranks; replayed alone")
    _group_collectives(graphs, collectives, comm_groups, position_of_rank, groups)
    _group_point_to_point(sends, recvs, position_of_rank, groups)
    if measured_release(graphs) is not None:  # one clock: CPU collectives' waits can be read
        _cpu_waits(graphs, offsets, groups)
    return groups


def _cpu_waits(graphs: list[SimGraph], offsets: list[int], groups: CommGroups) -> None:
    """For each matched group of CPU collectives (gloo, MPI, UCC: timed on the host clock, which
    the ranks share here), each member's measured wait for its peers: the last member's measured
    arrival minus its own. The rest of its busy time is its own part of the transfer: ranks of a
    CPU backend do not finish a collective together (each ends when its last data arrived and its
    worker ran), and a rank's step ends with its own. A send busy for longer than its record (its
    transfer began in the call that issued it: ``plan.busy._sends_begun_in_their_call``) arrived
    where that busy time began, its record's end less it. O(members)."""
    for g, members in enumerate(groups.members):
        starts = []
        for u in members:
            r = bisect_right(offsets, u) - 1
            graph, local = graphs[r], u - offsets[r]
            if graph.lane_keys[graph.lane[local]][0] != "cpu" or math.isnan(graph.start[local]):
                break
            info = graph.comm.get(local)
            early = graph.duration[local] - graph.measured_dur[local] if info is not None and info.role == SEND else 0.0
            starts.append(graph.start[local] - max(0.0, early))
        else:
            last = max(starts)
            groups.waited[g] = [last - start for start in starts]


def _cpu_pickups(graphs: list[SimGraph], offsets: list[int], groups: CommGroups) -> None:
    """Each CPU collective's *pickup* delay (``groups.pickup``): where its busy part began on the
    measured timeline, less where the last of its dependencies ended there as the replay ends it
    (``_busy_window``). Its worker took it that long after it could have (a loaded host wakes a
    worker late), so the replay starts it — in a job, its arrival, and the last rank to arrive
    sets the collective's start — that long after its dependencies finish. A collective that ran
    under the group's earlier one has its busy part at its end (``plan.cpu_comm``): the delay then
    holds, after its worker took it (its record's start), the time it communicated beside the
    earlier one, kept apart (``groups.shared``) so that a what-if moves it with the medium.
    O(c · deps + E) for c CPU collectives and E edges (one numpy pass for the join and parent
    edges)."""
    for graph, base in zip(graphs, offsets):
        collectives = {u for u in graph.comm if graph.lane_keys[graph.lane[u]][0] == "cpu"}
        if not collectives:
            continue
        read_at = _joined_at(graph, collectives)
        for u in collectives:
            ready = max((_busy_window(graph, d, collectives, read_at)[1] for d in graph.deps_of(u)
                         if d >= 0 and not math.isnan(graph.start[d])), default=None)
            if ready is not None:
                busy_from = _busy_window(graph, u, collectives, read_at)[0]
                if busy_from > ready:
                    groups.pickup[base + u] = busy_from - ready
                    shared = busy_from - max(ready, graph.start[u])
                    if shared > 0:
                        groups.shared[base + u] = shared


def _busy_window(graph: SimGraph, u: int, collectives: set[int], read_at: dict[int, float]) -> tuple[float, float]:
    """Where node u's busy time (its ``duration``) lies on the measured timeline: a CPU op's from
    its start (its own time, then the host time folded into it); a CPU collective's at the end of
    its record, which ends where it ended or where the op that reads its result began, whichever
    is earlier (``plan.cpu_comm``: one that ran wholly under the group's earlier collective has
    no busy part, and it lies at its end; an op its worker ran after communicating, its first
    child, ends it too); any other node's over its measured span."""
    start = graph.start[u]
    if u in collectives:
        end = min(start + graph.measured_dur[u], read_at.get(u, math.inf))
        return end - graph.duration[u], end
    if graph.kind[u] == CPU:
        return start, start + graph.duration[u]
    return start, start + graph.measured_dur[u]


def _joined_at(graph: SimGraph, sources: set[int]) -> dict[int, float]:
    """Per node of ``sources`` that is the source of a ``join`` or ``parent`` edge: the earliest
    measured start among the nodes it releases (the op that reads a collective's result, an op its
    worker ran after communicating). O(E) in numpy (``_edges``), plus O(j) for the j edges found."""
    read_at: dict[int, float] = {}
    for d, v in _edges(graph, ("join", "parent"), sources):
        if graph.start[v] < read_at.get(d, math.inf):
            read_at[d] = graph.start[v]
    return read_at


def _edges(graph: SimGraph, causes: tuple[str, ...], sources: set[int]) -> list[tuple[int, int]]:
    """(source, target) of every edge whose cause is one of ``causes`` and whose source is in
    ``sources``: found by their cause codes in ``dep_cause`` and their sources in ``dep_nodes`` in
    one numpy pass, their targets by a binary search of ``dep_offsets``. O(E) in C, plus O(k log n)
    for the k edges found."""
    codes = [graph.cause_names.index(cause) for cause in causes if cause in graph.cause_names]
    if not codes or not sources:
        return []
    import numpy as np  # the replay imports numpy only where collectives run on a CPU backend

    kinds = np.frombuffer(bytes(graph.dep_cause), dtype=np.uint8)
    nodes = np.asarray(graph.dep_nodes)[:len(kinds)]
    found = np.flatnonzero(np.isin(kinds, codes) & np.isin(nodes, np.fromiter(sources, dtype=np.int64)))
    targets = np.searchsorted(np.asarray(graph.dep_offsets), found, side="right") - 1
    return list(zip(nodes[found].tolist(), targets.tolist()))


def _issue_key(graph: SimGraph, u: int) -> tuple:
    """Issue order of a communication node: a GPU one by measured start (a stream runs in issue
    order), a CPU one (gloo, MPI, UCC: on a worker thread) by id, after the GPU ones. An id is
    given when the worker starts the record: two started within µs may hold theirs against their
    issue order, which the plan's ``collective_order`` edges keep (``plan.cpu_comm.issue_order``)."""
    if graph.lane_keys[graph.lane[u]][0] == "cpu":
        return (1, graph.ids[u], graph.ids[u])
    return (0, _start_key(graph, u), graph.ids[u])


def _start_key(graph: SimGraph, u: int) -> float:
    s = graph.start[u]
    return s if not math.isnan(s) else math.inf


def _group_collectives(graphs, collectives, comm_groups, position_of_rank, groups: CommGroups) -> None:
    """Matches the collectives of each process group across its member ranks (``_match_group``);
    ``collectives``: (rank position, pg) -> its collectives in issue order. O(c log c)."""
    holders: dict[str, set[int]] = {}  # pg -> rank positions holding collectives on it
    for r, pg in collectives:
        holders.setdefault(pg, set()).add(r)
    offsets = node_offsets(graphs)
    for pg in sorted(holders):
        positions = _group_positions(graphs, pg, holders[pg], comm_groups, position_of_rank, groups.notes)
        if len(positions) >= 2:
            _match_group(graphs, offsets, pg, positions, [collectives.get((r, pg), []) for r in positions], groups)


def _group_positions(graphs, pg: str, holders: set[int], comm_groups, position_of_rank, notes: list[str]) -> list[int]:
    """The rank positions that are members of process group ``pg``: those ``comm_groups`` lists
    among the given ranks, else all; notes the listed ranks absent, a group the file lacks, and
    ranks holding collectives of a group they are not members of (replayed alone)."""
    positions = list(range(len(graphs)))
    if comm_groups is not None and pg in comm_groups:
        listed = comm_groups[pg]
        positions = sorted(position_of_rank[rank] for rank in listed if rank in position_of_rank)
        absent = sorted(rank for rank in listed if rank not in position_of_rank)
        if absent:
            notes.append(f"process group {pg}: ranks {absent} are not among the given files; "
                         f"its collectives are matched among the given ranks only")
    elif comm_groups is not None and pg != "0":
        notes.append(f"process group {pg} is not in the comm-group file: taken as all ranks")
    for r in sorted(holders - set(positions)):
        notes.append(f"rank {graphs[r].rank} has collectives on process group {pg} but is not "
                     f"one of its members; they are replayed alone")
    return positions


def _match_group(graphs, offsets: list[int], pg: str, positions: list[int], lists: list[list[int]],
                 groups: CommGroups) -> None:
    """Matches the k-th collectives of process group ``pg`` across its members (``lists``: per
    member position, its collectives in issue order), or CPU collectives by issue number
    (``_by_issue_number``); leaves alone those only some ranks hold and those that ran under the
    group's previous one (``_ran_under_previous``); notes what it left alone or found odd."""
    counts = {graphs[r].rank: len(nodes) for r, nodes in zip(positions, lists)}
    numbered = _by_issue_number(graphs, offsets, lists)
    if numbered is not None:  # CPU collectives: paired by issue number, gaps where a rank lacks one
        every = sorted(set().union(*numbered))
        lists = [[by_number.get(number) for number in every] for by_number in numbered]
    under = _ran_under_previous(graphs, offsets, lists) if SERIALISED_ALONE else set()
    alone = cut = 0
    previous: list[int | None] = [None] * len(lists)  # per member rank, its last collective so far
    for k in range(max(len(nodes) for nodes in lists)):
        g = len(groups.members)
        at_k = [nodes[k] if k < len(nodes) else None for nodes in lists]
        members = [u for u in at_k if u is not None]
        before, previous = previous, [u if u is not None else p for u, p in zip(at_k, previous)]
        if numbered is not None and len(members) < len(positions):
            cut += 1  # the ETs of some ranks lost it: the others replay theirs alone
            continue
        if len(members) == len(positions) and any(u in under for u in members):
            alone += 1
            if numbered is not None:  # issue numbers: the order the plan serialised them in (ids may swap)
                groups.issued_after.update((u, p) for u, p in zip(at_k, before) if p is not None)
            continue
        groups.members.append(members)
        groups.expected.append(len(positions))
        groups.member_ranks.append([graphs[r].rank for r in positions])
        groups.label.append((pg, k))
        for u in members:
            groups.group_of[u] = g
    if alone:
        groups.notes.append(f"process group {pg}: {alone} collective(s) ran on some rank while the previous one "
                            f"was still running (a CPU backend's workers run them at once); each rank replays "
                            f"the part that outlasted the previous one on its own")
    if cut:
        groups.notes.append(f"process group {pg}: {cut} CPU collective(s) are missing on some ranks (an ET "
                            f"writes an op when it ends: one still running when the trace stopped is lost); "
                            f"the ranks that hold them replay them alone")
    elif len(set(counts.values())) > 1:
        groups.notes.append(f"process group {pg}: the ranks hold different numbers of collectives {counts}")
    mismatch = _first_type_mismatch(graphs, offsets, positions, lists)
    if mismatch:
        groups.type_mismatch[pg] = mismatch
        groups.notes.append(f"process group {pg}: {mismatch}")


SERIALISED_ALONE = True  # see ``_ran_under_previous``


def _by_issue_number(graphs: list[SimGraph], offsets: list[int], lists: list[list[int]]) -> list[dict] | None:
    """Per member rank, its collectives of the group by issue number (``comm_seq``, written for CPU
    collectives), when every one of them has one and no rank repeats a number; else None."""
    numbered = []
    for nodes in lists:
        by_number = {}
        for u in nodes:
            r = bisect_right(offsets, u) - 1
            number = graphs[r].comm[u - offsets[r]].seq
            if number is None or number < 0 or number in by_number:
                return None
            by_number[number] = u
        numbered.append(by_number)
    return numbered if any(numbered) else None


def _ran_under_previous(graphs: list[SimGraph], offsets: list[int], lists: list[list[int | None]]) -> set[int]:
    """The CPU collectives (global nodes) of one group that started, on their rank, before the
    group's earlier collectives there had ended (measured start and duration; ``lists``: per member
    rank, its collectives in issue order, None for a gap). ``plan.cpu_comm`` serialises them and
    keeps only the part after the previous ones ended: matching such a part across ranks would
    make each rank's part wait for every rank's previous collective, which the run did not do.
    O(collectives of the group)."""
    under = set()
    for nodes in lists:
        latest_end = -math.inf
        for u in nodes:
            if u is None:
                continue
            r = bisect_right(offsets, u) - 1
            graph, local = graphs[r], u - offsets[r]
            if graph.lane_keys[graph.lane[local]][0] != "cpu":
                break  # GPU collectives: a stream runs them one at a time
            start = graph.start[local]
            if start < latest_end:
                under.add(u)
            latest_end = max(latest_end, start + graph.measured_dur[local])
    return under


def _first_type_mismatch(graphs, offsets: list[int], positions: list[int], lists: list[list[int]]) -> str:
    """The first k where the ranks' k-th collectives are of different types, as a sentence naming the
    odd ranks ("" when they agree). O(collectives of the group)."""
    for k in range(min(len(nodes) for nodes in lists)):
        types: dict[int, list[int]] = {}
        for r, nodes in zip(positions, lists):
            if nodes[k] is None:  # a gap in issue numbers
                continue
            info = graphs[r].comm[nodes[k] - offsets[r]]
            if info.comm_type >= 0:
                types.setdefault(info.comm_type, []).append(graphs[r].rank)
        if len(types) > 1:
            common = max(types, key=lambda t: len(types[t]))
            odd = sorted(rank for t, ranks in types.items() if t != common for rank in ranks)
            odd_types = sorted({comm_type_name(t) for t in types if t != common})
            return (f"collective #{k} is {comm_type_name(common)} on most ranks but {'/'.join(odd_types)} on "
                    f"rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))}: a collective is probably "
                    f"missing (or extra) there before #{k}")
    return ""


def _group_point_to_point(sends, recvs, position_of_rank, groups: CommGroups) -> None:
    for key in sorted(set(sends) | set(recvs)):
        send_nodes, recv_nodes = sends.get(key, []), recvs.get(key, [])
        for k in range(max(len(send_nodes), len(recv_nodes))):
            g = len(groups.members)
            members = [nodes[k] for nodes in (send_nodes, recv_nodes) if k < len(nodes)]
            groups.members.append(members)
            groups.expected.append(2)
            groups.member_ranks.append(list(key))
            groups.label.append((f"p2p {key[0]}->{key[1]}", k))
            for u in members:
                groups.group_of[u] = g


# ---------------------------------------------------------------------------------------------
# The event loop
# ---------------------------------------------------------------------------------------------


def measured_release(graphs: list[SimGraph]) -> list[float] | None:
    """Each rank's first measured start minus the job's earliest, when the ranks' clocks agree
    (``plan.rank_start.measured_offsets``: every rank timed, the first starts within one measured
    step of each other); else None. O(n)."""
    return measured_offsets([graph.measured_span() for graph in graphs])


def measured_holds(graphs: list[SimGraph], model: str = ASTRA_SIM) -> dict[int, tuple[float, str, float]]:
    """The measured waits no dependency explains (``unheld.gpu_waits``: a GPU or communication op
    that started after everything it depends on had finished; ``unheld.host_waits``: the same of a
    host op), as holds for ``replay``: global node -> (µs, cause, its measured start from its
    rank's first measured start). Replaying the trace as measured, each such op becomes ready no
    earlier than its measured start (from its rank's release) once its dependencies finish; in a
    what-if (``Scale``, ``network``) it becomes ready the wait's length after its dependencies
    finish, a length the what-if leaves as it is (the wait was for nothing the graph holds).
    A graph whose file carries wait nodes (``sim.file_waits``, sized for ASTRA-sim's units) gets
    none under ``ASTRA_SIM``: its waits are those, replayed as ASTRA-sim replays them; under
    ``LANES`` (a unit per thread and stream) its wait nodes get no time (``file_wait_nodes``) and
    every measured wait is held, as for a file without them. O(n + E)."""
    holds = {}
    base = 0
    through = not file_wait_nodes(model)  # the wait nodes get no time: measure past them
    for graph in graphs:
        if graph.wait_nodes and not through:  # its measured waits are in the file, none on top
            base += len(graph)
            continue
        first, _ = graph.measured_span()
        for u, wait, cause in gpu_waits(graph, through_wait_nodes=through) + host_waits(graph, through_wait_nodes=through):
            holds[base + u] = (wait, cause, graph.start[u] - first)
        base += len(graph)
    return holds


def file_wait_nodes(model: str) -> bool:
    """Whether a replay under ``model`` gives the files' wait nodes their time (ASTRA-sim's units,
    which they are sized for) or none (``LANES``: ``measured_holds`` holds every wait instead)."""
    return model == ASTRA_SIM


def what_if_holds(as_measured: Replay) -> dict[int, tuple[float, str, float]]:
    """The holds for a what-if of the same graphs: each the wait the replay of the trace as
    measured (``as_measured``, holds to measured starts) actually held its op for, from its
    dependencies' end to its ready time. A what-if replayed with them keeps each wait's length
    while its dependencies move, and changes nothing where it changes nothing (a what-if of
    factor 1 replays as the trace does). O(holds)."""
    return {v: (as_measured.ready[v] - as_measured.held_from[v], cause, offset)
            for v, (_, cause, offset) in as_measured.holds.items() if v in as_measured.held_from}


def replay(graphs: list[SimGraph], model: str = ASTRA_SIM, scale: Scale = Scale(),
           comm_groups: dict[str, list[int]] | None = None, release: list[float] | None = None,
           holds: dict[int, tuple[float, str, float]] | None = None, network: NetworkSpec | None = None,
           wait_nodes: bool = True, wait_floors: dict[int, float] | None = None,
           issue_order: str | None = None) -> Replay:
    """Replay one or several ranks (several = one job, collectives matched across them).

    ``release[r]``: when rank position r starts (its nodes without dependencies become ready then);
    default 0 for every rank (see ``measured_release`` for the measured start offsets).
    ``holds``: global node -> (µs, cause, measured start offset), measured waits replayed as such
    (``measured_holds``: how, there); none by default.
    ``network``: a what-if link (``network.retime``): each collective's network part is fitted to
    the measured collectives and moved to this link, the rest of its time kept as measured; None
    (the default) replays every collective as measured.
    ``wait_nodes``: the wait nodes a file carries (``SimGraph.wait_nodes``) last their duration
    on their unit (True; a what-if's ``scale`` never shortens a wait) or are not there (False: no
    time and no unit, as if the file had none: the graph's own prediction, ``--waits explained``).
    ``wait_floors``: global wait node -> a time (from its rank's release): the node lasts, when its
    unit takes it, until that time (none if later): how ``sim.file_waits`` sizes the wait nodes it
    writes. Their durations are left in ``Replay.duration``.
    ``issue_order``: which ready node a free unit issues, ``BY_ID`` (the smallest id: ASTRA-sim's
    workload layer) or ``BY_READY`` (the one ready first, ties by measured start then id); default
    ``BY_ID`` under ``ASTRA_SIM``, ``BY_READY`` under ``LANES``."""
    if model not in MODELS:
        raise OptionError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if issue_order is None:
        issue_order = BY_ID if model == ASTRA_SIM else BY_READY
    offsets = node_offsets(graphs)
    total = sum(map(len, graphs))
    duration = array("d")
    factors = np.array([scale.factor(kind) for kind in range(4)], dtype=np.float64)
    for graph in graphs:
        base = len(duration)
        scaled = np.asarray(graph.duration, dtype=np.float64) * factors[np.frombuffer(graph.kind, dtype=np.uint8)]
        duration.frombytes(scaled.tobytes())
        for u in graph.wait_nodes:
            duration[base + u] = graph.duration[u] if wait_nodes else 0.0
    unit_of, unit_names = _units(graphs, model, wait_nodes)
    succ_offsets, succ_nodes, indegree, missing = _successors(graphs, offsets, total)
    groups = match_communication(graphs, offsets, comm_groups)
    _cpu_pickups(graphs, offsets, groups)
    if scale.factor(COMM) != 1.0:
        for v, part in list(groups.shared.items()):
            groups.resize_shared(v, part * scale.factor(COMM))
    what_if = retime(graphs, offsets, groups, duration, scale.factor(COMM), network) if network is not None else None
    nan = array("d", [math.nan])
    result = Replay(
        graphs=graphs, model=model, scale=scale, offsets=offsets, duration=duration, unit_of=unit_of,
        unit_names=unit_names, ready=nan * total, issue=nan * total, start=nan * total, end=nan * total,
        cause=array("q", [NO_NODE]) * total, cause_kind=bytearray(total), peer=array("q", [NO_NODE]) * total,
        groups=groups, missing=missing, queued=[],
        release=list(release) if release is not None else [0.0] * len(graphs), holds=dict(holds or {}),
        network=what_if, holds_to_measured_start=scale == Scale() and network is None, wait_nodes=wait_nodes,
        issue_order=issue_order)
    if wait_floors:
        result.wait_floors = {v: result.release[result.rank_of(v)] + at for v, at in wait_floors.items()}
    _Loop(result, _issue_keys(graphs, issue_order), succ_offsets, succ_nodes, indegree).run()
    return result


def _issue_keys(graphs: list[SimGraph], issue_order: str) -> list:
    """Per global node, the key its unit issues it by among the nodes ready at one instant
    (``BY_ID``: its id; ``BY_READY``: (measured start, id), after the ready time). O(n)."""
    keys: list = []
    for graph in graphs:
        if issue_order == BY_ID:
            keys.extend(graph.ids)
        else:
            keys.extend((s if not math.isnan(s) else math.inf, i) for s, i in zip(graph.start, graph.ids))
    return keys


# The loop's events, (time, kind, node; -node for a release) on one heap. At one instant the loop
# takes the releases (a held node becomes ready), then the ends (a node finishes), then the
# arrivals (a CPU collective's member, picked up late by its worker, reaches its collective); ends
# and arrivals in node order, releases latest node first (``_Loop.release``).
RELEASE, END, ARRIVAL = 0, 1, 2


class _Loop:
    """The event loop's state over one ``Replay`` (``rp``, whose columns it fills): per unit its
    queue of ready nodes (a heap of (issue key, ready time, node): the issue policy), whether it
    is busy and the node it ran last; per node the dependency whose end made it ready
    (``dep_cause``); per communication group how many members have arrived; the event heap; the
    units touched at the current instant (each issues its best ready node once the instant's
    events are all taken). ``indegree`` (the dependencies left per node) is counted down in place."""

    def __init__(self, rp: Replay, priority: list, succ_offsets: array, succ_nodes: array, indegree: array):
        self.rp, self.priority = rp, priority
        self.id_order = rp.issue_order == BY_ID
        self.succ_offsets, self.succ_nodes, self.indegree = succ_offsets, succ_nodes, indegree
        unit_count = len(rp.unit_names)
        self.queues: list[list] = [[] for _ in range(unit_count)]
        self.busy = bytearray(unit_count)
        self.last_on_unit = array("q", [NO_NODE]) * unit_count
        self.dep_cause = array("q", [NO_NODE]) * len(rp.duration)
        self.arrived = [0] * len(rp.groups.members)
        self.events: list[tuple[float, int, int]] = []  # (time, kind, node or -node)
        self.touched: list[int] = []
        # One collective in flight per rank (model astra-sim): a collective replayed alone because
        # it ran under the one issued before it is not issued before that one ended, whenever it
        # became ready (``CommGroups.issued_after``; ASTRA-sim's workload copies give it that edge).
        self.after = rp.groups.issued_after if rp.model == ASTRA_SIM else {}
        self.parked: dict[int, list[tuple[int, float]]] = {}  # node -> (collective, ready) waiting for its end

    def run(self) -> None:
        """Releases every rank's first nodes, then takes the events in time order; after all those
        of one instant, each touched free unit issues its best ready node. Leaves the nodes still
        queued when no event is left in ``rp.queued``."""
        self.release_first_nodes()
        events, t = self.events, 0.0
        while True:
            self.issue_touched(t)
            if not events:
                break
            t = events[0][0]
            while events and events[0][0] == t:
                _, kind, key = heapq.heappop(events)
                if kind == END:
                    self.end(key, t)
                elif kind == RELEASE:
                    self.become_ready(-key, t)
                else:
                    self.arrive(key, t)
        self.rp.queued = [entry[2] for queue in self.queues for entry in queue]

    def release_first_nodes(self) -> None:
        """The nodes without dependencies: ready at their rank's release (at 0 when it is 0), or
        held (``rp.holds``) from then for their measured start or their wait (``replay``)."""
        rp = self.rp
        for r, base in enumerate(rp.offsets):
            release = rp.release[r]
            for v in range(base, base + len(rp.graphs[r])):
                if self.indegree[v] == 0:
                    hold = rp.holds.get(v)
                    at = release
                    if hold:
                        rp.held_from[v] = release
                        at += hold[2] if rp.holds_to_measured_start else hold[0]
                    if at > 0:
                        self.release(v, at)
                    else:
                        self.become_ready(v, 0.0)

    def dependencies_done(self, v: int, t: float) -> None:
        """Node v's last dependency ended at ``t``: it is ready then or, held (``rp.holds``), not
        before its measured start from its rank's release (the trace as measured) or its wait's
        length later (a what-if): a release event."""
        rp = self.rp
        hold = rp.holds.get(v)
        at = t
        if hold:
            rp.held_from[v] = t
            at = max(t, rp.release[rp.rank_of(v)] + hold[2]) if rp.holds_to_measured_start else t + hold[0]
        if at > t:
            self.release(v, at)
        else:
            self.become_ready(v, t)

    def release(self, v: int, at: float) -> None:
        """Held node v becomes ready at ``at``: a release event, keyed by -v so that one instant's
        releases are taken latest node first, as the replay has always taken them (their units
        issue in that order, which names the last member to reach a collective)."""
        heapq.heappush(self.events, (at, RELEASE, -v))

    def become_ready(self, v: int, t: float) -> None:
        """Node v is ready at ``t``: queued on its unit (the unit touched), or, a metadata node
        (no unit, no time), issued, started and ended at once."""
        rp = self.rp
        unit = rp.unit_of[v]
        rp.ready[v] = t
        if unit < 0:
            rp.issue[v] = rp.start[v] = t
            cause = self.dep_cause[v]
            rp.cause[v], rp.cause_kind[v] = cause, CAUSE_DEPENDENCY if cause >= 0 else CAUSE_NONE
            heapq.heappush(self.events, (t, END, v))
        elif not (self.after and self.parked_until_issued_before_ends(v, t)):
            key = self.priority[v] if self.id_order else (t, self.priority[v])
            heapq.heappush(self.queues[unit], (key, t, v))
            self.touched.append(unit)

    def parked_until_issued_before_ends(self, v: int, t: float) -> bool:
        """Whether node v, ready at ``t``, waits for the collective issued before it to end
        (``after``) before it joins its unit's queue: parked until then (``end``)."""
        before = self.after.get(v)
        if before is None or not math.isnan(self.rp.end[before]):  # none, or it has ended
            return False
        self.parked.setdefault(before, []).append((v, t))
        return True

    def issue_touched(self, t: float) -> None:
        """Each unit touched at this instant, free and with ready nodes, issues its best one."""
        for unit in self.touched:
            if not self.busy[unit] and self.queues[unit]:
                self.dispatch(unit, t)
        self.touched = []

    def dispatch(self, unit: int, t: float) -> None:
        """The unit issues its best ready node v at ``t``: v's cause (the unit's previous node when
        v waited for the unit, else its last dependency); a wait node being sized lasts until its
        floor; v starts after its pickup delay (a CPU collective's worker), or arrives at its
        collective (then, or as an arrival event)."""
        rp = self.rp
        _, ready_at, v = heapq.heappop(self.queues[unit])
        self.busy[unit] = 1
        rp.issue[v] = t
        if t > ready_at:
            rp.cause[v], rp.cause_kind[v] = self.last_on_unit[unit], CAUSE_UNIT
        elif self.dep_cause[v] >= 0:
            rp.cause[v], rp.cause_kind[v] = self.dep_cause[v], CAUSE_DEPENDENCY
        delay = max(0.0, ready_at + rp.groups.pickup.get(v, 0.0) - t)  # counted from ready, not from t
        floor = rp.wait_floors.get(v)
        if floor is not None:
            rp.duration[v] = max(0.0, floor - t)
        if rp.groups.group_of[v] < 0:
            rp.start[v] = t + delay
            heapq.heappush(self.events, (t + delay + rp.duration[v], END, v))
        elif delay > 0:
            heapq.heappush(self.events, (t + delay, ARRIVAL, v))
        else:
            self.arrive(v, t)

    def arrive(self, v: int, t: float) -> None:
        """Member v reaches its collective at ``t``; the last member starts them all: each lasts
        the transfer (the shortest member's duration) or, a CPU collective timed on one clock, its
        own duration less its measured wait for its peers (``CommGroups.waited``)."""
        rp, groups = self.rp, self.rp.groups
        g = groups.group_of[v]
        self.arrived[g] += 1
        if self.arrived[g] < groups.expected[g]:
            return
        members = groups.members[g]
        transfer = min(rp.duration[m] for m in members)
        waits = groups.waited.get(g)
        comm_factor = rp.scale.factor(COMM)
        for k, m in enumerate(members):
            rp.start[m] = t
            rp.peer[m] = v
            if m != v:
                rp.cause[m], rp.cause_kind[m] = rp.cause[v], CAUSE_PEER
            own = transfer if waits is None else max(0.0, rp.duration[m] - waits[k] * comm_factor)
            heapq.heappush(self.events, (t + own, END, m))

    def end(self, u: int, t: float) -> None:
        """Node u ends at ``t``: its unit is free (and touched); each successor with no dependency
        left becomes ready (``dependencies_done``), its cause u."""
        rp = self.rp
        rp.end[u] = t
        unit = rp.unit_of[u]
        if unit >= 0:
            self.busy[unit] = 0
            self.last_on_unit[unit] = u
            self.touched.append(unit)
        if self.parked:
            for v, ready in self.parked.pop(u, ()):
                self.become_ready(v, ready)  # u has ended: queued, ready since then
        indegree, succ_nodes = self.indegree, self.succ_nodes
        for k in range(self.succ_offsets[u], self.succ_offsets[u + 1]):
            v = succ_nodes[k]
            indegree[v] -= 1
            if indegree[v] == 0:
                self.dep_cause[v] = u
                self.dependencies_done(v, t)

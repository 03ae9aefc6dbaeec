"""Fill the ET+ JSON's simulation fields from the dependency plan (``plan.deps``).

Every linked CPU node gets ``blocked_dur`` (µs of its exclusive time spent waiting: blocking runtime
calls, another thread), ``host_gap_dur`` (uncovered thread time folded into it, 0 when none) and
``sim_dur`` (= exclusive_dur − blocked_dur − deferred_dur + host_gap_dur: the ``.et``
``duration_micros`` before rounding); ``deferred_dur`` (the busy part of its exclusive time after
its first child began, carried by its later-piece nodes) only when > 0. Each later piece
(``plan.later_pieces``) is a node of its own (``link.etplus.PieceRows``, ``EtPlus.piece_rows``):
the op's name and thread, ``continues`` (the op's id, also its parent), ``ts`` / ``dur`` (where
it lay), ``sim_dur`` (its busy µs) and its dependency; an unlinked node gets ``sim_dur``
and ``host_gap_dur`` only when it carries a gap (a worker's thread root: the time before its
first op). Every node gets ``data_deps`` (node ids) and
``data_dep_causes`` (same order; ``plan.dependency_plan.CAUSES``). GPU nodes get ``sim_dur`` (their ``dur``)
and, for resolved communication kernels, ``comm_type`` (Chakra enum name), ``comm_size`` (bytes),
``pg_name`` (PyTorch's process-group name, as Kineto's "Process Group Name" that the node may
already carry; the ``.et`` attribute holds the job-wide id, that name + 1), and ``comm_src`` /
``comm_dst`` for point-to-point. Re-resolving an annotated node gives the same attributes.
``ts``, ``dur``, ``inclusive_dur`` and ``exclusive_dur`` keep their meanings.
Cost: O(n + g + edges) after the plan.
"""

from __future__ import annotations

from collections import deque
from itertools import compress, repeat
from operator import attrgetter, eq, gt, is_not, sub

import msgspec

from linker.model import chakra_kinds as kinds
from linker.plan.comm import WORLD_GROUP_ID
from linker.read.et import FLAT
from linker.plan.dependency_plan import PARENT, THREAD_ORDER, DependencyPlan, WriteSummary
from linker.plan.deps import dependency_plan
from linker.link.etplus import EtPlus, PieceRows, as_number


def pytorch_group_name(group_id: str) -> str:
    """PyTorch's process-group name of a job-wide group id (``comm.job_group_id`` inverse)."""
    return str(int(group_id) - 1) if group_id.isdigit() else group_id


SAMPLE = 32768  # values looked at to choose how a column is rounded (``us_at``)
PARENT_CAUSES, THREAD_ORDER_CAUSES = (PARENT,), (THREAD_ORDER,)  # one tuple each for every chain node


def _us(value: float) -> float | int:
    if value == 0:  # most blocked / gap times
        return 0
    return as_number(round(value, 3))


def us_at(values: list[float], at: list[int]) -> list[float | int]:
    """``_us`` of ``values[i]`` for each i of ``at``, in C passes. A column whose first ``SAMPLE``
    values are less than half distinct (the later-piece columns: a few thousand values over
    hundreds of thousands of ops) has each distinct value rounded once; one of mostly distinct
    values (``sim``) is rounded value by value, as hashing them would cost more than it saves.
    Raises as ``_us`` does on a NaN or infinite value. O(len(at))."""
    picked = list(map(values.__getitem__, at))
    sample = picked[:SAMPLE]
    repeats = len(set(sample)) * 2 < len(sample)
    distinct = list(dict.fromkeys(picked)) if repeats else picked
    rounded: list[float | int] = list(map(round, distinct, repeat(3)))
    whole = list(map(int, rounded))
    for k in compress(range(len(rounded)), map(eq, rounded, whole)):  # 0.0 too: _us gives int 0
        rounded[k] = whole[k]
    return list(map(dict(zip(distinct, rounded)).__getitem__, picked)) if repeats else rounded


def _set_all(nodes, name: str, values) -> None:
    """Set attribute ``name`` of each node to its value (one C pass)."""
    deque(map(setattr, nodes, repeat(name), values), maxlen=0)


def _chain_deps(plan: DependencyPlan, id_of: list[int]) -> tuple[list[list[int]], list[tuple[str, ...]]]:
    """``data_deps`` ids and causes of the CPU nodes from their thread chain alone (what
    ``plan.data_deps`` gives a node without waits): the previous node, a parent or not. C passes
    and a loop over the thread firsts; O(n)."""
    n = plan.cpu_count
    prev, ctrl = plan.prev[:n], plan.ctrl[:n]
    ids = list(map(list, zip(map(id_of.__getitem__, prev))))  # [id], each a list of exactly one
    causes = list(map((THREAD_ORDER_CAUSES, PARENT_CAUSES).__getitem__, map(eq, prev, ctrl)))
    for i in compress(range(n), map(gt, repeat(0), prev)):  # a thread's first node: no previous
        ids[i], causes[i] = [], ()
    return ids, causes


def _piece_rows(et_plus: EtPlus, plan: DependencyPlan, id_of: list[int], dep_fields) -> PieceRows | None:
    """The later pieces as ET+ JSON rows (``link.etplus.PieceRows``), in the plan's piece order.
    C passes over the columns; a piece's one dependency (the node the thread ran before it) is
    read off the chain as ``_chain_deps`` reads the ops' (a piece another rule made wait: through
    ``plan.data_deps``). O(pieces)."""
    pieces = plan.busy.pieces
    count = len(pieces)
    if not count:
        return None
    et, start = et_plus.et, plan.piece_start
    every = range(count)
    prev = plan.prev[start:]
    deps = list(map(list, zip(map(id_of.__getitem__, prev))))
    causes = list(map((THREAD_ORDER_CAUSES, PARENT_CAUSES).__getitem__, map(eq, prev, plan.ctrl[start:])))
    for j in [u - start for u in plan.waits if u >= start]:  # none as the rules stand
        deps[j], causes[j] = dep_fields(plan.data_deps(start + j))
    gaps = us_at(pieces.host_gap, every)
    return PieceRows(
        flat=et.layout == FLAT, ids=plan.piece_ids, names=list(map(et.names.__getitem__, pieces.owner)),
        continues=list(map(et.ids.__getitem__, pieces.owner)), tids=list(map(et.tid.__getitem__, pieces.owner)),
        ts=us_at(pieces.begin, every), dur=us_at(list(map(sub, pieces.end, pieces.begin)), every),
        host_gap=[gap or msgspec.UNSET for gap in gaps], sim=us_at(pieces.sim, every), data_deps=deps,
        data_dep_causes=causes)


def annotate_et_plus(et_plus: EtPlus, summary: WriteSummary | None = None) -> DependencyPlan:
    """Compute (or reuse) the plan and write the simulation fields onto the ET+ nodes. C passes
    over the columns and the nodes; loops only over the nodes with waits, gaps or blocked time."""
    plan = dependency_plan(et_plus, summary)
    et, busy, n = et_plus.et, plan.busy, plan.cpu_count
    gpu_nodes = et_plus.gpu_nodes
    id_of = et.ids + [node.id for node in gpu_nodes] + plan.piece_ids  # node id of each plan index
    data_deps, unset = plan.data_deps, msgspec.UNSET
    shared_causes: dict[tuple[str, ...], tuple[str, ...]] = {}

    def dep_fields(deps: list[tuple[int, str]]) -> tuple[list[int], tuple[str, ...]]:
        """``data_deps`` (a list of exactly its length) and ``data_dep_causes`` (one shared tuple
        per distinct sequence of causes: a few kinds for millions of nodes)."""
        causes = tuple([cause for _, cause in deps])
        if len(deps) == 1:  # a list display is allocated at its size, a comprehension with spare room
            ids = [id_of[deps[0][0]]]
        else:
            ids = [id_of[d] for d, _ in deps]
        return ids, shared_causes.setdefault(causes, causes)

    dep_ids, dep_causes = _chain_deps(plan, id_of)
    for i in plan.waits:
        if i < n:
            dep_ids[i], dep_causes[i] = dep_fields(data_deps(i))
    nodes = et.nodes
    _set_all(nodes, "data_deps", dep_ids)
    _set_all(nodes, "data_dep_causes", dep_causes)
    # Linked nodes (a ``ts``) carry blocked_dur, host_gap_dur (0 when none) and sim_dur: sim is
    # exclusive where nothing is blocked, deferred, folded or a gap (its ``_us`` is then the
    # ``exclusive_dur`` the build wrote, as every other node's is its own ``_us``).
    linked = list(compress(range(n), map(is_not, map(attrgetter("ts"), nodes), repeat(unset))))
    linked_nodes = list(map(nodes.__getitem__, linked))
    _set_all(linked_nodes, "blocked_dur", repeat(0))
    _set_all(linked_nodes, "host_gap_dur", repeat(0))
    _set_all(linked_nodes, "sim_dur", us_at(busy.sim, linked))
    at = list(compress(range(n), busy.blocked))
    for i, value in zip(at, us_at(busy.blocked, at)):
        if nodes[i].ts is not unset:
            nodes[i].blocked_dur = value
    at = list(compress(range(n), map(gt, busy.host_gap, repeat(0.0))))
    for i, value in zip(at, us_at(busy.host_gap, at)):
        node = nodes[i]
        node.host_gap_dur = value
        if node.ts is unset:  # a worker's thread root: the time before its first op
            node.sim_dur = value
    at = list(compress(range(n), busy.deferred))  # a parent's exclusive time after its first child
    _set_all(map(nodes.__getitem__, at), "deferred_dur", us_at(busy.deferred, at))
    et_plus.piece_rows = _piece_rows(et_plus, plan, id_of, dep_fields)
    for i, comm in plan.cpu_comm.items():  # CPU collectives: communication nodes on their measured thread
        node = et.nodes[i]
        node.comm_type, node.comm_size = kinds.collective_name(comm.comm_type), comm.comm_size
        node.pg_name, node.tid = pytorch_group_name(comm.pg_name or WORLD_GROUP_ID), et.tid[i]
        node.sim_dur = _us(busy.sim[i])  # the part after the group's earlier collective (``cpu_comm``)
        if comm.seq is not None:
            node.comm_seq = comm.seq
    for k, node in enumerate(gpu_nodes):
        node.sim_dur = node.dur
        node.data_deps, node.data_dep_causes = dep_fields(data_deps(n + k))
        comm = plan.comm[k] if plan.comm else None
        if comm is None or comm.node_type == kinds.COMP_NODE:
            continue
        if comm.comm_type is not None:
            node.comm_type = kinds.collective_name(comm.comm_type)
        node.comm_size = comm.comm_size
        if node.pg_name is msgspec.UNSET:  # PyTorch's name, as Kineto's "Process Group Name"
            node.pg_name = pytorch_group_name(comm.pg_name or WORLD_GROUP_ID)
        if comm.comm_src is not None:
            node.comm_src = comm.comm_src
        if comm.comm_dst is not None:
            node.comm_dst = comm.comm_dst
    return plan

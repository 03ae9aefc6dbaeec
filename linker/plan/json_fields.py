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
``comm_dst`` / ``comm_tag`` / ``comm_role`` for point-to-point (``_comm_fields``, CPU and GPU
alike). Re-resolving an annotated node gives the same attributes.
``ts``, ``dur``, ``inclusive_dur`` and ``exclusive_dur`` keep their meanings.
Cost: O(n + g + edges) after the plan.
"""

from __future__ import annotations

import msgspec
import numpy as np

from linker.model import chakra_kinds as kinds
from linker.model.rounding import round_3
from linker.plan.comm import WORLD_GROUP_ID
from linker.read.et import FLAT
from linker.plan.dependency_plan import PARENT, THREAD_ORDER, DependencyPlan, WriteSummary, chain_is_parent
from linker.plan.deps import dependency_plan
from linker.link.etplus import EtPlus, PieceRows, as_number


def pytorch_group_name(group_id: str) -> str:
    """PyTorch's process-group name of a job-wide group id (``comm.job_group_id`` inverse)."""
    return str(int(group_id) - 1) if group_id.isdigit() else group_id


SAMPLE = 32768  # values looked at to choose how a column is made (``us_at``)
CHAIN_CAUSES = {PARENT: (PARENT,), THREAD_ORDER: (THREAD_ORDER,)}  # one tuple each for every chain node


def _us(value: float) -> float | int:
    if value == 0:  # most blocked / gap times
        return 0
    return as_number(round(value, 3))


def us_at(values, at) -> list[float | int]:
    """``_us`` of ``values[i]`` for each i of ``at`` (a sequence or an array of floats), as Python
    numbers for the writer: ``round(x, 3)``, an int where that is integral. A column whose first
    ``SAMPLE`` values are less than half distinct (the later pieces' durations: a few thousand
    values over hundreds of thousands of pieces) makes each distinct number once and shares it,
    which keeps the plan's peak memory down. Raises ``ValueError`` on a NaN or infinite value, as
    ``_us`` does. O(len(at)) in numpy passes (O(k log k) for k values in a column that repeats)."""
    picked = np.asarray(values, dtype=np.float64)[np.asarray(at, dtype=np.intp)]
    if not np.isfinite(picked).all():
        raise ValueError("a time to write is NaN or infinite")
    sample = np.sort(picked[:SAMPLE])
    if (1 + np.count_nonzero(sample[1:] != sample[:-1])) * 2 < len(sample):  # fewer than half distinct
        distinct, inverse = np.unique(picked, return_inverse=True)
        return np.array(as_numbers(round_3(distinct)), dtype=object)[inverse].tolist()
    return as_numbers(round_3(picked))


def as_numbers(rounded: np.ndarray) -> list[float | int]:
    """The values as Python numbers, an int where integral (``link.etplus.as_number``). O(n)."""
    whole = rounded == np.trunc(rounded)
    fits = whole & (np.abs(rounded) < 2.0 ** 63)
    numbers = rounded.astype(object)
    numbers[fits] = rounded[fits].astype(np.int64).astype(object)
    for k in np.flatnonzero(whole & ~fits):  # past int64: none in a real trace
        numbers[k] = int(rounded[k])
    return numbers.tolist()


def _chain_deps(prev, ctrl, id_of: list[int]) -> tuple[list[list[int]], list[tuple[str, ...]]]:
    """``data_deps`` ids and causes of nodes from their thread chain alone (what ``plan.data_deps``
    gives a node no other rule made wait): the node the thread ran before it, its parent or not
    (``chain_is_parent``); nothing for a thread's first node. ``prev`` / ``ctrl``: the nodes'
    columns of the plan; ``id_of``: the written id of each plan node (the lists share its ints).
    The causes in numpy passes, then one list per node for the writer. O(n)."""
    chained = np.asarray(prev, dtype=np.int64)
    kinds = np.where(chained >= 0, np.where(chain_is_parent(chained, np.asarray(ctrl, dtype=np.int64)), 1, 2), 0)
    table = ((), CHAIN_CAUSES[PARENT], CHAIN_CAUSES[THREAD_ORDER])
    kinds = kinds.tolist()
    ids = [[id_of[p]] if kind else [] for p, kind in zip(prev, kinds)]
    return ids, [table[kind] for kind in kinds]


def _piece_rows(et_plus: EtPlus, plan: DependencyPlan, id_of: list[int], dep_fields) -> PieceRows | None:
    """The later pieces as ET+ JSON rows (``link.etplus.PieceRows``), in the plan's piece order: a
    piece's one dependency is read off the chain as the ops' are (``_chain_deps``; a piece another
    rule made wait: through ``plan.data_deps``). O(pieces)."""
    pieces = plan.busy.pieces
    count = len(pieces)
    if not count:
        return None
    et, start = et_plus.et, plan.piece_start
    every = np.arange(count)
    deps, causes = _chain_deps(plan.prev[start:], plan.ctrl[start:], id_of)
    for j in [u - start for u in plan.waits if u >= start]:  # none as the rules stand
        deps[j], causes[j] = dep_fields(plan.data_deps(start + j))
    owners = pieces.owner.tolist()
    return PieceRows(
        flat=et.layout == FLAT, ids=plan.piece_ids, names=[et.names[i] for i in owners],
        continues=[et.ids[i] for i in owners], tids=[et.tid[i] for i in owners],
        ts=us_at(pieces.begin, every), dur=us_at(pieces.end - pieces.begin, every),
        host_gap=[gap or msgspec.UNSET for gap in us_at(pieces.host_gap, every)], sim=us_at(pieces.sim, every),
        data_deps=deps, data_dep_causes=causes)


def annotate_et_plus(et_plus: EtPlus, summary: WriteSummary | None = None) -> DependencyPlan:
    """Compute (or reuse) the plan and write the simulation fields onto the ET+ nodes. A pass over
    the nodes, array passes over the plan's columns, and loops over the nodes with waits, gaps,
    blocked or deferred time. O(n + p + edges)."""
    plan = dependency_plan(et_plus, summary)
    et, n = et_plus.et, plan.cpu_count
    gpu_nodes = et_plus.gpu_nodes
    id_of = et.ids + [node.id for node in gpu_nodes] + plan.piece_ids  # node id of each plan index
    data_deps = plan.data_deps
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

    dep_ids, dep_causes = _chain_deps(plan.prev[:n], plan.ctrl[:n], id_of)
    for i in plan.waits:
        if i < n:
            dep_ids[i], dep_causes[i] = dep_fields(data_deps(i))
    for node, ids, causes in zip(et.nodes, dep_ids, dep_causes):
        node.data_deps, node.data_dep_causes = ids, causes
    _busy_fields(et.nodes, plan.busy, et_plus.op_times[0] if et_plus.op_times is not None else None)
    et_plus.piece_rows = _piece_rows(et_plus, plan, id_of, dep_fields)
    _cpu_comm_fields(et, plan)
    for k, node in enumerate(gpu_nodes):
        node.sim_dur = node.dur
        node.data_deps, node.data_dep_causes = dep_fields(data_deps(n + k))
        _gpu_comm_fields(node, plan.comm[k] if plan.comm else None)
    return plan


def _busy_fields(nodes, busy, starts=None) -> None:
    """Linked nodes (a ``ts``) carry blocked_dur, host_gap_dur (0 when none) and sim_dur: sim is
    exclusive where nothing is blocked, deferred, folded or a gap (its ``_us`` is then the
    ``exclusive_dur`` the build wrote, as every other node's is its own ``_us``); deferred_dur
    where > 0; an unlinked node with a host gap (a worker's thread root: the time before its first
    op) carries it as its sim_dur. ``starts``: the nodes' start column the build gathered
    (``EtPlus.op_times``, NaN when unlinked), else the nodes are asked. A pass over the nodes
    (or the column), then over those with each time."""
    unset = msgspec.UNSET
    if starts is not None:
        linked = np.flatnonzero(~np.isnan(np.asarray(starts, dtype=np.float64)))
    else:
        linked = np.array([i for i, node in enumerate(nodes) if node.ts is not unset], dtype=np.intp)
    for i, sim in zip(linked.tolist(), us_at(busy.sim, linked)):
        node = nodes[i]
        node.blocked_dur, node.host_gap_dur, node.sim_dur = 0, 0, sim
    at = np.flatnonzero(busy.blocked)
    for i, value in zip(at.tolist(), us_at(busy.blocked, at)):
        if nodes[i].ts is not unset:
            nodes[i].blocked_dur = value
    at = np.flatnonzero(busy.host_gap > 0)
    for i, value in zip(at.tolist(), us_at(busy.host_gap, at)):
        node = nodes[i]
        node.host_gap_dur = value
        if node.ts is unset:
            node.sim_dur = value
    at = np.flatnonzero(busy.deferred)  # a parent's exclusive time after its first child
    for i, value in zip(at.tolist(), us_at(busy.deferred, at)):
        nodes[i].deferred_dur = value


def _cpu_comm_fields(et, plan: DependencyPlan) -> None:
    """CPU collectives: communication nodes on their measured thread, their sim_dur the part after
    the group's earlier collective; CPU sends and receives: their sim_dur the whole record
    (``cpu_comm``). Their group is always written, as the job-wide id's PyTorch name."""
    for i, comm in plan.cpu_comm.items():
        node = et.nodes[i]
        _comm_fields(node, comm)
        node.pg_name, node.tid = pytorch_group_name(comm.pg_name or WORLD_GROUP_ID), et.tid[i]
        node.sim_dur = _us(float(plan.busy.sim[i]))
        if comm.seq is not None:
            node.comm_seq = comm.seq


def _gpu_comm_fields(node, comm) -> None:
    """A resolved communication kernel's fields (``comm``: its ``CommAttrs``; None or a compute
    node: nothing). The group is kept where the node already names one (Kineto's "Process Group
    Name")."""
    if comm is None or comm.node_type == kinds.COMP_NODE:
        return
    _comm_fields(node, comm)
    if node.pg_name is msgspec.UNSET:
        node.pg_name = pytorch_group_name(comm.pg_name or WORLD_GROUP_ID)


def _comm_fields(node, comm) -> None:
    """A communication node's own fields, GPU or CPU alike (as ``chakra_encode._comm_attrs`` writes
    them to the ``.et``): ``comm_type`` (a collective's Chakra name), ``comm_size``, a send's or
    receive's ``comm_src`` / ``comm_dst`` / ``comm_tag`` and its ``comm_role`` ("send" or "recv":
    which side this node is; both peers are written when the trace names this rank, so a reader
    cannot tell the side from them)."""
    if comm.comm_type is not None:
        node.comm_type = kinds.collective_name(comm.comm_type)
    node.comm_size = comm.comm_size
    for name in ("comm_src", "comm_dst", "comm_tag"):
        value = getattr(comm, name)
        if value is not None:
            setattr(node, name, value)
    role = COMM_ROLES.get(comm.node_type)
    if role is not None:
        node.comm_role = role


COMM_ROLES = {kinds.COMM_SEND_NODE: "send", kinds.COMM_RECV_NODE: "recv"}  # a point-to-point node's ``comm_role``

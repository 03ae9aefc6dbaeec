"""The dependency plan of both writers: ctrl / data dependencies and the write order.

One numbering for all nodes (``dependency_plan``): ET node i is i, GPU node k is n + k.
``plan_dependencies`` builds the parent (ctrl) edges, the per-thread and per-stream chains, the
cross-thread fork/join edges and busy times of ``busy``, the collective order per process group, a
topological write order, and the wait edges of blocking runtime calls (``waits``; the rules in
``docs/durations.md``).

Every data dependency carries a cause (``CAUSES``): ``thread_order`` (previous op on the CPU
thread, in start order), ``parent`` (the previous op in that order is the parent: first child),
``launch`` (a GPU op after its launching CPU op), ``stream_order`` (previous GPU op on the same
device and stream), ``event_wait`` (``cudaStreamWaitEvent``: a GPU op after the other stream's op it
waited for), ``sync`` (a blocking synchronize or synchronous copy: the op after the call waits for
the GPU op(s) waited on), ``fork`` / ``join`` (cross-thread, ``busy``), ``collective_order``
(communication kernels of one process group run in issue order, when not already on one stream).
Cost: O((n + g) log(n + g)) time, O(n + g) small ints of memory.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass

import msgspec

import numpy as np

from linker.model.columns import ascending
from linker.plan.busy import JOIN, BusyTimes, compute_busy
from linker.plan.comm import CommAttrs, CommResolver, is_comm_kernel
from linker.plan.cpu_comm import (communication_stretches, cpu_collectives, hold_for_measured_duration, is_point_to_point,
                                  lost_issuers)
from linker.plan.dependency_plan import (COLLECTIVE_ORDER, LAUNCH, NO_NODE, PARENT, STREAM_ORDER, THREAD_ORDER,
                                         DependencyPlan, GpuPlacement, WriteSummary, chain_is_parent)
from linker.plan.waits import add_wait_edges
from linker.read.et import PROCESS_ROOT_NAMES, parent_positions
from linker.link.etplus import EtPlus, op_exclusive_times


def _parent_indices(et, index_of_id: dict[int, int]) -> list[int]:
    """Index of each node's parent (-1: missing, or the node's own id). O(n)."""
    if index_of_id is et.index_of_id():
        return et.parent_index()
    return parent_positions(et.parent, index_of_id)


def _id_order_is_preorder(by_id: list[int], parent: list[int]) -> bool:
    """True when the nodes in id order are already the tree pre-order (roots and siblings by id):
    each node's parent is the previous node or one of its ancestors. One stack sweep, O(n)."""
    stack = [NO_NODE]
    push, pop = stack.append, stack.pop
    try:
        for i in by_id:
            p = parent[i]
            while stack[-1] != p:
                pop()
            push(i)
    except IndexError:  # the parent is not on the stack: not yet seen, or a closed subtree
        return False
    return True


def _preorder(et, index_of_id: dict[int, int], summary: WriteSummary,
              by_id: list[int] | None = None, check_id_order: bool = True,
              follows: dict[int, int] | None = None) -> tuple[list[int], array]:
    """ET indices in start order (tree pre-order, siblings by id) and the ctrl parent of each
    (-1 for roots and dropped parents). Nodes under a parent cycle follow in id order, keeping a
    parent only when it comes earlier. ``follows``: node -> the sibling it comes right after
    whatever its id (a CPU collective after the ops its worker ran before communicating:
    ``link.measured``). O(n log n); ids in pre-order (PyTorch gives ids at op start) and no
    ``follows`` take one sort and one stack sweep (``check_id_order`` False: the general walk,
    always; the same answer)."""
    n = len(et.nodes)
    parents = _parent_indices(et, index_of_id)
    for i in np.flatnonzero(np.asarray(parents) == NO_NODE).tolist():
        if index_of_id.get(et.parent[i], NO_NODE) < 0 and et.names[i] not in PROCESS_ROOT_NAMES:
            summary.ctrl_deps_dropped += 1
    by_id = by_id if by_id is not None else id_order(et.ids)
    parent = array("q", parents)
    follows = {u: v for u, v in (follows or {}).items() if parent[u] >= 0 and parent[u] == parent[v]}
    if check_id_order and not follows and _id_order_is_preorder(by_id, parents):
        return by_id, parent
    followed_by = {v: u for u, v in follows.items()}
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for i in by_id:
        if i in follows:  # placed after the sibling it follows
            continue
        p = parent[i]
        if p < 0:
            roots.append(i)
        else:
            children.setdefault(p, []).append(i)
        while i in followed_by:
            i = followed_by[i]
            children[p].append(i)
    order: list[int] = []
    seen = bytearray(n)
    for root in roots:
        stack = [root]
        while stack:
            i = stack.pop()
            seen[i] = 1
            order.append(i)
            stack.extend(reversed(children.get(i, ())))
    if len(order) < n:  # parent cycles: not reachable from a root
        rank = {i: r for r, i in enumerate(order)}
        for i in by_id:
            if not seen[i]:
                if parent[i] not in rank:
                    parent[i] = NO_NODE
                    summary.ctrl_deps_dropped += 1
                rank[i] = len(order)
                order.append(i)
    return order, parent


@dataclass
class TreeOrder:
    """What of the plan comes from the ET alone: its node indices by id, the tree pre-order with
    each node's ctrl parent (``_preorder``) and how many parents that dropped, and each node's
    previous node on its thread (``_thread_chains``, ET nodes only)."""

    by_id: list[int]
    preorder: list[int]
    parent: array
    dropped: int
    chains: array


def tree_order(et, follows: dict[int, int] | None = None) -> TreeOrder:
    """``et``'s ``TreeOrder`` (``follows``: see ``_preorder``). O(n log n), one sort and stack
    sweeps when the id order is the pre-order."""
    n = len(et.nodes)
    by_id = id_order(et.ids)
    counts = WriteSummary(et.path)
    preorder, parent = _preorder(et, et.index_of_id(), counts, by_id, follows=follows)
    return TreeOrder(by_id, preorder, parent, counts.ctrl_deps_dropped, _thread_chains(preorder, et.tid, n))


def _thread_chains(order: list[int], tid: list[int], total: int) -> array:
    """``prev`` of the CPU nodes: the previous node of the same thread in ``order`` (-1 for a
    thread's first), for ``total`` nodes (the rest -1). A stable sort by thread, then one scatter;
    O(n log n)."""
    nodes = np.asarray(order, dtype=np.int64)
    threads = np.asarray(tid)[nodes]
    by_thread = np.argsort(threads, kind="stable")
    chains, threads = nodes[by_thread], threads[by_thread]
    previous = np.concatenate(([NO_NODE], chains[:-1]))
    previous[np.flatnonzero(threads[1:] != threads[:-1]) + 1] = NO_NODE  # each thread's first
    prev = np.full(total, NO_NODE, dtype=np.int64)
    prev[chains] = previous
    return array("q", prev.tobytes())


def _gpu_placement(et_plus: EtPlus) -> GpuPlacement:
    stream_key, issue_ts, issue_thread, before_trace = [], [], [], []
    for k, (node, link) in enumerate(zip(et_plus.gpu_nodes, et_plus.gpu_links)):
        stream_key.append((node.device, node.stream))
        launch = link.launch
        issue_ts.append(launch.ts if launch is not None else link.event.ts)
        issue_thread.append((launch.pid, launch.tid) if launch is not None else None)
        if link.before_trace:
            before_trace.append(k)
    return GpuPlacement(stream_key, issue_ts, issue_thread, frozenset(before_trace))


def _time_keys(et_plus: EtPlus, placement: GpuPlacement, starts: list[float] | None = None) -> list[float]:
    """Priority of each node in the write order: linked start (CPU) or issue time (GPU);
    -inf for unlinked CPU ops (written as soon as their dependencies are). ``starts``: the CPU
    nodes' start column the build gathered (``EtPlus.op_times``, NaN when unlinked), the same
    numbers as their ``ts`` (which has integral values as int) without a pass over the nodes."""
    if starts is not None:
        keys = np.asarray(starts, dtype=np.float64)
        keys = np.where(np.isnan(keys), -math.inf, keys).tolist()  # NaN: unlinked
    else:
        keys = [node.ts if node.ts is not msgspec.UNSET else -math.inf for node in et_plus.et.nodes]
    keys += placement.issue_ts
    return keys


def _edge_sources(ctrl: array, prev: array, extra: dict[int, list[tuple[int, str]]], u: int):
    """Distinct dependency sources of u among the ctrl, prev and ``extra`` edges."""
    sources = [d for d in (ctrl[u], prev[u] if prev[u] != ctrl[u] else NO_NODE) if d >= 0]
    for d, _ in extra.get(u, ()):
        if d not in sources:
            sources.append(d)
    return sources


def _inverse(order: list[int]) -> array:
    """position[u] = p for order[p] = u. O(n)."""
    position = array("q", [0]) * len(order)
    for p, u in enumerate(order):
        position[u] = p
    return position


def id_order(ids: list[int]) -> list[int]:
    """Positions sorted by id (ids distinct). C passes when the ids already ascend (as PyTorch
    numbers the nodes), else a sort. O(n), O(n log n) at worst."""
    if ascending(ids):
        return list(range(len(ids)))
    return sorted(range(len(ids)), key=ids.__getitem__)


def _id_order(ids: list[int], cpu_by_id: list[int] | None) -> list[int]:
    """Every node number sorted by (id, number); ``cpu_by_id`` (the first len(cpu_by_id) nodes so
    sorted) is reused when the other (GPU) nodes' ids ascend after all of them (as built)."""
    if cpu_by_id is not None:
        n = len(cpu_by_id)
        rest = ids[n:]
        if not rest:
            return list(cpu_by_id)
        if (not cpu_by_id or ids[cpu_by_id[-1]] < rest[0]) and ascending(rest):
            return cpu_by_id + list(range(n, len(ids)))
    return sorted(range(len(ids)), key=ids.__getitem__)


def _keeps_preorder(order: list[int], preorder: list[int]) -> bool:
    """True when the CPU nodes (numbers below len(preorder)) come in ``order`` as in ``preorder``."""
    n = len(preorder)
    return order == preorder or preorder == [u for u in order if u < n]


def _write_order(ctrl: array, prev: array, keys: list[float], ids: list[int],
                 extra: dict[int, list[tuple[int, str]]], cpu_by_id: list[int] | None = None,
                 preorder: list[int] | None = None) -> tuple[list[int], array]:
    """The write order, and the position of each node in it: the order of Kahn's algorithm over
    the ctrl + prev (+ ``extra``) edges that takes the ready node with the smallest (time key, id,
    number) first (a NaN key counts as -inf, as an unlinked op's: written as soon as its
    dependencies are). Raises RuntimeError if the edges have a cycle.

    How: when sorting every node by (time key, id) already puts each edge forward (the usual
    case: parents start first, chains run in time), that sort is Kahn's order (its smallest ready
    node is then always the smallest node left): two stable sorts and C passes over the edges.
    The CPU nodes' ctrl / prev edges need no check when they come in ``preorder`` (those edges go
    forward in it: parents first, thread chains in that order). When some nodes have an edge
    going backward in that sort (a GPU op issued before its stream predecessor), ``_late_walk``
    gives Kahn's order from the sort, doing Python work only around those nodes (on the 6000-step
    GPU pair: 5,136 of them, 0.04 s, where a heap over every node took 0.6 s). A CPU node whose
    ``prev`` is a later piece (not a CPU node: no preorder edge) is checked like the other nodes.
    O((V + E) log V) at worst; the tests hold Kahn's algorithm itself and compare."""
    total = len(ctrl)
    if any(map(math.isnan, keys)):
        keys = [-math.inf if math.isnan(key) else key for key in keys]
    order = _id_order(ids, cpu_by_id)
    order.sort(key=keys.__getitem__)
    position = _inverse(order)
    first = 0  # nodes from here on get their ctrl / prev edges checked
    if preorder is not None and _keeps_preorder(order, preorder):
        first = len(preorder)
    place = np.append(np.asarray(position), NO_NODE)  # place[NO_NODE]: no edge
    here = place[first:total]
    late = set((first + np.flatnonzero((place[np.asarray(ctrl)[first:]] > here)
                                       | (place[np.asarray(prev)[first:]] > here))).tolist())
    late.update(u for u, sources in extra.items() if any(position[d] > position[u] for d, _ in sources))
    late.update(u for u in range(first) if prev[u] >= first and position[prev[u]] > position[u])  # prev: a later piece
    if not late:
        return order, position
    order = _late_walk(order, place.tolist(), late, ctrl, prev, keys, ids, extra)
    return order, _inverse(order)


def _late_walk(order: list[int], at: list[int], late: set[int], ctrl: array, prev: array,
               keys: list[float], ids: list[int], extra: dict[int, list[tuple[int, str]]]) -> list[int]:
    """Kahn's order (``_write_order``) from the (time key, id, number) sort ``order`` (``at``: each
    node's place in it) when only the nodes in ``late`` have a dependency placed after them. Kahn's
    algorithm takes the smallest ready node; walking the sort, that is the node reached when it is
    ready, and a node reached before its dependencies are done (late, or after a node still held)
    is held until they are, then taken before the walk goes on (it is smaller than every node
    ahead), held nodes freed together in (key, id, number) order. Runs of the sort with no node
    held and none late are taken whole. O(n) C work plus Python work per late or held node and
    per node passed while some are held; raises RuntimeError on a cycle, as Kahn's does."""
    total = len(order)
    stops = sorted(at[u] for u in late)
    out: list[int] = []
    held: set[int] = set()  # reached, not yet taken
    waiting: dict[int, list[int]] = {}  # node -> held nodes waiting for it
    missing: dict[int, int] = {}  # held node -> its dependencies not yet taken
    ready: list[tuple[float, int, int]] = []
    i = 0
    for stop in stops:
        if stop < i:
            continue
        if not held:
            out += order[i:stop]
            i = stop
        while i < total and (held or i == stop):
            u = order[i]
            unmet = [d for d in _edge_sources(ctrl, prev, extra, u) if at[d] > i or d in held]
            if unmet:
                held.add(u)
                missing[u] = len(unmet)
                for d in unmet:
                    waiting.setdefault(d, []).append(u)
            else:
                _take(u, out, held, waiting, missing, ready, keys, ids)
            i += 1
    if held:
        raise RuntimeError(f"internal error: dependency cycle among {len(held)} nodes")
    out += order[i:]
    return out


def _take(u: int, out: list[int], held: set[int], waiting: dict[int, list[int]],
          missing: dict[int, int], ready: list, keys: list[float], ids: list[int]) -> None:
    """Append ``u`` to ``out``, then every held node it frees, and those they free, smallest
    (key, id, number) first (``_late_walk``)."""
    while True:
        out.append(u)
        held.discard(u)
        for v in waiting.pop(u, ()):
            missing[v] -= 1
            if not missing[v]:
                del missing[v]
                heapq.heappush(ready, (keys[v], ids[v], v))
        if not ready:
            return
        u = heapq.heappop(ready)[2]


def _exclusive_of_ops(et_plus: EtPlus) -> list[float]:
    """Exclusive µs of each ET node (0 for unlinked nodes), as the build writes it
    (``link.etplus.op_exclusive_times``)."""
    exclusive = op_exclusive_times(et_plus.result) + [0.0]  # event -1: unlinked
    return [exclusive[event] for event in et_plus.result.match.event_of_op]


def _comm_attrs(et_plus: EtPlus, resolver: CommResolver | None, summary: WriteSummary) -> list[CommAttrs | None]:
    """Communication attributes of every GPU node (None for other kernels), resolved once
    (whether a kernel communicates: once per kernel name and category)."""
    comm: list[CommAttrs | None] = []
    is_comm: dict[tuple[str, str], bool] = {}
    for node, link in zip(et_plus.gpu_nodes, et_plus.gpu_links):
        attrs = None
        if resolver:
            name = (node.cat, node.name)
            communicates = is_comm.get(name)
            if communicates is None:
                communicates = is_comm[name] = is_comm_kernel(node)
            if communicates:
                attrs = resolver.resolve(node, link.event.args, link.et_index)
        if attrs is not None and attrs.problem:
            summary.comm_unresolved[attrs.problem] += 1
        comm.append(attrs)
    return comm


def _collective_order(plan: DependencyPlan, placement: GpuPlacement, extra: dict) -> None:
    """Each communication node after the previous one of its process group (issue order), when
    that one is not already its stream predecessor."""
    n = plan.cpu_count
    last_of_group: dict[str, int] = {}
    members = [k for k, attrs in enumerate(plan.comm) if attrs is not None and attrs.pg_name is not None
               and attrs.problem is None]
    for k in sorted(members, key=lambda k: (placement.issue_ts[k], k)):
        group = plan.comm[k].pg_name
        previous = last_of_group.get(group)
        if previous is not None and plan.prev[n + k] != n + previous:
            extra.setdefault(n + k, []).append((n + previous, COLLECTIVE_ORDER))
        last_of_group[group] = k


@dataclass
class OpParts:
    """Where an op's busy time lies once its later pieces are nodes: its own node, then its pieces
    (numbers from ``start``), each with the measured time it began; and the pieces that run
    right after a node on its thread (``next_piece``). ``before`` and ``ran_before`` answer which
    node a dependency on an op comes from. Built in O(p)."""

    begins: dict[int, list[float]]  # op -> -inf (its own node), then its pieces' begins
    nodes: dict[int, list[int]]  # op -> itself, then its pieces
    next_piece: dict[int, int]  # node -> the piece the thread runs right after it
    piece_begin: dict[int, float]  # piece node -> its measured begin

    @staticmethod
    def of(pieces, start: int, prev: array, wanted: set[int]) -> "OpParts":
        """The parts of the ops in ``wanted`` (the others are never asked for) and, for every node
        a piece follows, that piece (the inverse of the pieces' ``prev``). C passes, then a loop
        over the wanted ops' pieces."""
        parts = OpParts({}, {}, {}, {})
        count = len(pieces)
        if not count or not wanted:
            return parts
        parts.next_piece = dict(zip(prev[start:start + count], range(start, start + count)))
        begins = pieces.begin.tolist()
        parts.piece_begin = dict(zip(range(start, start + count), begins))
        owners = pieces.owner.tolist()
        for j in np.flatnonzero(np.isin(pieces.owner, list(wanted))).tolist():  # time order
            owner = owners[j]
            if owner not in parts.nodes:
                parts.nodes[owner], parts.begins[owner] = [owner], [-math.inf]
            parts.nodes[owner].append(start + j)
            parts.begins[owner].append(begins[j])
        return parts

    def __bool__(self) -> bool:
        return bool(self.next_piece)

    def before(self, op: int, t: float) -> int:
        """The part of ``op`` that ran last before measured time ``t`` (the op itself when it has
        no pieces; its last part when ``t`` is unknown, NaN): what of the op ran before something
        inside it (a launch). O(log pieces of the op)."""
        nodes = self.nodes.get(op)
        if nodes is None:
            return op
        if math.isnan(t):
            return nodes[-1]
        return nodes[max(0, bisect_left(self.begins[op], t) - 1)]

    def after(self, op: int, t: float) -> int:
        """The first part of ``op`` that began at or after measured time ``t`` (its last part when
        none did; the op itself when it has no pieces): what of the op ran once a wait that ended
        at ``t`` was over (a join into the op the thread waited in, whose stretch is cut there; a
        part holding only the wait has no busy time and is no node). O(log pieces of the op)."""
        nodes = self.nodes.get(op)
        if nodes is None:
            return op
        return nodes[min(len(nodes) - 1, bisect_left(self.begins[op], t))]

    def ran_before(self, op: int, t: float) -> int:
        """The last node of ``op``'s thread that began before measured time ``t`` from ``op`` on:
        ``before``, then the pieces the thread ran after it that began before ``t`` (all of them
        when ``t`` is NaN). An edge from the op to something on another thread that began at ``t``
        (``fork``, ``join``) waits for what the thread had run by then, as it did. O(those pieces)."""
        u = self.before(op, t)
        following = self.next_piece.get(u)
        while following is not None and not self.piece_begin[following] >= t:  # NaN t: follow all
            u = following
            following = self.next_piece.get(u)
        return u


def _settle_after_chain(pieces, prev: array, n: int, starts: list[float]) -> None:
    """Each piece follows the op the thread ran last before it in start order; the thread chain
    is the ET's pre-order, which can place an op that started before the piece (a tie, or an op
    Kineto nests otherwise) after that op. Move ``after`` along the chain past such ops, so that
    no chain edge runs against the measured starts. O(n) numpy passes for the chain's inverse,
    then a step per op passed (usually none)."""
    if not len(pieces):
        return
    chain = np.array(prev[:n], dtype=np.int64)
    follower = np.full(n + 1, NO_NODE, dtype=np.int64)  # an op -> the ET node after it on its thread
    on_chain = chain != NO_NODE
    follower[chain[on_chain]] = np.flatnonzero(on_chain)
    start_of = np.append(np.asarray(starts, dtype=np.float64), math.inf)  # [NO_NODE]: no follower
    for j in np.flatnonzero(start_of[follower[pieces.after]] < pieces.begin).tolist():  # the few
        a, begin = int(pieces.after[j]), pieces.begin[j]
        while start_of[follower[a]] < begin:  # NaN (unlinked): stays after
            a = int(follower[a])
        pieces.after[j] = a


def _thread_pieces(ctrl: array, prev: array, pieces, n: int, start: int) -> None:
    """Put the later pieces (numbers ``start`` + j) into the thread chains: the pieces that follow
    op a, in time order, run after a and before the node that followed a (its ``prev`` is then
    the last of them); each piece's ``ctrl`` is the op it continues. O(n + p log p) in numpy
    passes for p pieces."""
    count = len(pieces)
    if not count:
        return
    ctrl.frombytes(pieces.owner.astype(np.int64).tobytes())
    order = np.argsort(pieces.after, kind="stable")  # the pieces following each op, in time order
    after, node = pieces.after[order], start + order
    first = np.ones(count, dtype=bool)
    first[1:] = after[1:] != after[:-1]
    piece_prev = np.empty(count, dtype=np.int64)
    piece_prev[order] = np.where(first, after, np.roll(node, 1))  # a's first piece after a, each next after the last
    last = np.append(first[1:], True)
    ops, last_piece = after[last], node[last]  # each op a piece follows (sorted), and its last piece
    chain = np.array(prev[:n], dtype=np.int64)
    k = np.minimum(np.searchsorted(ops, chain), len(ops) - 1)
    moved = ops[k] == chain  # the node that followed a now follows a's last piece
    chain[moved] = last_piece[k[moved]]
    prev[:n] = array("q", chain.tobytes())
    prev.frombytes(piece_prev.tobytes())


def _handoff_edges(et_plus: EtPlus, busy: BusyTimes, parts: OpParts, ctrl: array, prev: array,
                   op_starts: list[float], finished_by: dict[int, int] | None = None) -> dict[int, list[tuple[int, str]]]:
    """The dependencies that cross threads or come from a later piece, by target: each fork or
    join from what its source's thread had run by then (``OpParts.ran_before``; a join into the
    op the main thread waited in goes to its part after the wait; a fork into a worker's thread
    root, which has no start of its own, by its spawning op's start: ``busy.spawned_at``), unless
    the chain already holds it; a GPU op launched from a later piece of its op depends on that
    piece (``launch``).
    ``finished_by``: a CPU collective whose worker ran ops for it after communicating -> the last
    of them: the work the waiting thread was woken by ends there, so a join comes from it.
    O(cross edges + GPU ops), a bisect each."""
    n = len(et_plus.et.nodes)
    extra: dict[int, list[tuple[int, str]]] = {}
    finished_by = finished_by or {}
    for source, target, cause in busy.cross:
        resumed = busy.resumed_at.get((source, target))
        if cause == JOIN:
            source = finished_by.get(source, source)
        at = op_starts[target] if resumed is None else resumed
        if math.isnan(at):  # a worker's thread root, no start of its own: where its spawner began
            at = busy.spawned_at.get(target, at)
        source = parts.ran_before(source, at)
        if resumed is not None:
            target = parts.after(target, resumed)
        if source != target and source != prev[target] and source != ctrl[target]:
            extra.setdefault(target, []).append((source, cause))
    for k, link in enumerate(et_plus.gpu_links if parts else ()):
        if link.launch is not None:
            part = parts.before(link.et_index, link.launch.ts)
            if part != link.et_index:
                extra.setdefault(n + k, []).append((part, LAUNCH))
    return extra


def _last_descendants(preorder: list[int], parent, collectives) -> dict[int, int]:
    """Per collective of ``collectives`` with children, the last node of its subtree in
    ``preorder`` (the ops its worker ran after communicating, and theirs). O(n) in numpy for their
    places, then O(subtree) each."""
    if not collectives:
        return {}
    order = np.asarray(preorder, dtype=np.int64)
    last = {}
    for k in np.flatnonzero(np.isin(order, np.fromiter(collectives, dtype=np.int64))).tolist():
        inside = {preorder[k]}
        j = k + 1
        while j < len(preorder) and parent[preorder[j]] in inside:
            inside.add(preorder[j])
            j += 1
        if j > k + 1:
            last[preorder[k]] = preorder[j - 1]
    return last


def _busy_with_cpu_collectives(et_plus: EtPlus, exclusive: list[float], tree: TreeOrder,
                               cpu_comm: dict[int, CommAttrs]) -> tuple[BusyTimes, list[tuple[int, int]], dict[int, int]]:
    """``compute_busy`` with the CPU collectives' rules: where each communicated
    (``cpu_comm.communication_stretches``: its place on its thread, after the ops its worker ran
    for it first, which are handed to the worker with it), its busy time there and the
    ``collective_order`` edges (``hold_for_measured_duration``), and the last op its worker ran
    for it after communicating (``_last_descendants``: where the joins from it come from)."""
    prepared_by = et_plus.result.placement.prepared_by
    stretches = communication_stretches(et_plus.et, cpu_comm, tree.preorder, tree.parent, et_plus.result.placement.follows)
    busy = compute_busy(et_plus, exclusive, tree.preorder, cpu_comm,
                        lost_issuers(et_plus, cpu_comm) if cpu_comm else None,
                        {i: start for i, (start, _) in stretches.items()},
                        {op for i, ops in prepared_by.items() for op in [*ops[1:], i]})
    order = hold_for_measured_duration(busy, et_plus.et, cpu_comm, stretches)
    return busy, order, _last_descendants(tree.preorder, tree.parent, stretches)


def plan_dependencies(et_plus: EtPlus, summary: WriteSummary, resolver: CommResolver | None = None,
                      tree: TreeOrder | None = None) -> DependencyPlan:
    """ctrl / thread-chain / launcher / stream / fork-join / collective dependencies, the write
    order, then the waits; every data dependency with its cause (counted in ``summary``).
    ``tree``: the ``tree_order`` of the ET as read and checked (made while the Kineto trace was
    still being read), used unless the link moved ops to their measured thread or parent
    (``Placement``): the ET's tree is then not the one it was made of, and it is made again."""
    et = et_plus.et
    n, g = len(et.nodes), len(et_plus.gpu_nodes)
    if tree is None or et_plus.result.placement.disagreements or len(tree.preorder) != n:
        tree = tree_order(et, et_plus.result.placement.follows)
    by_id, preorder = tree.by_id, tree.preorder
    summary.ctrl_deps_dropped += tree.dropped
    ctrl = tree.parent + array("q", [NO_NODE]) * g
    prev = tree.chains + array("q", [NO_NODE]) * g
    placement = _gpu_placement(et_plus)
    for k, link in enumerate(et_plus.gpu_links):
        ctrl[n + k] = link.et_index
    last_on_stream: dict[tuple, int] = {}
    gpu_nodes = et_plus.gpu_nodes
    for k in sorted(range(g), key=lambda k: (gpu_nodes[k].ts, gpu_nodes[k].id)):
        key = placement.stream_key[k]
        prev[n + k] = last_on_stream.get(key, NO_NODE)
        last_on_stream[key] = n + k
    exclusive = et_plus.op_exclusive if et_plus.op_exclusive is not None else _exclusive_of_ops(et_plus)
    starts = et_plus.op_times[0] if et_plus.op_times is not None else None
    cpu_comm = cpu_collectives(et_plus, summary.cpu_comm_unnamed)  # gloo / MPI / UCC: communication nodes
    _leave_chains(prev, [i for i, attrs in cpu_comm.items() if is_point_to_point(attrs)])
    busy, cpu_comm_order, finished_by = _busy_with_cpu_collectives(et_plus, exclusive, tree, cpu_comm)
    pieces = busy.pieces
    op_starts = starts if starts is not None else [node.ts if node.ts is not msgspec.UNSET else math.nan
                                                   for node in et.nodes]
    _settle_after_chain(pieces, prev, n, op_starts)
    _thread_pieces(ctrl, prev, pieces, n, n + g)
    launchers = {link.et_index for link in et_plus.gpu_links if link.launch is not None}
    parts = OpParts.of(pieces, n + g, prev, launchers | {source for source, _, _ in busy.cross}
                       | {waiter for _, waiter in busy.resumed_at})
    extra = _handoff_edges(et_plus, busy, parts, ctrl, prev, op_starts, finished_by)
    plan = DependencyPlan(n, ctrl, prev, extra, busy, _comm_attrs(et_plus, resolver, summary),
                          frozenset(n + k for k in placement.before_trace),
                          cpu_comm)
    ids = et.ids + [node.id for node in gpu_nodes] if g else list(et.ids)
    if len(pieces):
        plan.piece_start = n + g
        first = max(ids, default=-1) + 1  # pieces take ids above every ET and GPU node's
        plan.piece_ids = list(range(first, first + len(pieces)))
        ids += plan.piece_ids
    _collective_order(plan, placement, extra)
    for source, target in cpu_comm_order:  # CPU collectives: each after the one it ended after
        if source != prev[target] and source != ctrl[target]:
            extra.setdefault(target, []).append((source, COLLECTIVE_ORDER))
    keys = _time_keys(et_plus, placement, starts) + pieces.begin.tolist()
    # The waits keep only the edges that go forward in the order: it is made first.
    plan.order, plan.position = _write_order(ctrl, prev, keys, ids, extra, by_id, preorder)
    add_wait_edges(et_plus, plan, placement, summary)
    _count_causes(plan, summary.dependency_causes)
    return plan


def _leave_chains(prev: array, nodes: list[int]) -> None:
    """Take ``nodes`` (CPU sends and receives: transfers their thread went on beside) out of their
    threads' chains: the node after one follows the node before it, not the transfer, and a
    transfer follows its parent (the call that issued it: ``ctrl``) alone, so that the later
    pieces threaded into the chains (``_thread_pieces``) never come between the two. O(n) for the
    followers' search."""
    if not nodes:
        return
    leaving = set(nodes)
    for v in np.flatnonzero(np.isin(np.asarray(prev), np.asarray(nodes, dtype=np.int64))).tolist():
        if v in leaving:
            continue
        u = prev[v]
        while u in leaving:
            u = prev[u]
        prev[v] = u
    for u in nodes:
        prev[u] = NO_NODE


def _count_causes(plan: DependencyPlan, counts: Counter) -> None:
    """Add the causes of every node's ``data_deps`` to ``counts``: what ``plan.data_deps`` gives,
    counted over the ctrl / prev columns for the nodes without waits (a CPU node or later piece
    after the node its thread ran before it: ``chain_cause``; a GPU node after its launch and its
    stream's previous node), listed for the others. O(n + g) in numpy passes, O(edges) for the
    waits."""
    n, waits = plan.cpu_count, list(plan.waits)
    prev, ctrl = np.asarray(plan.prev), np.asarray(plan.ctrl)
    gpu_end = plan.piece_start if plan.piece_start >= 0 else len(prev)
    read_off = np.ones(len(prev), dtype=bool)  # the nodes whose dependencies the columns give
    read_off[waits] = False
    gpu = np.zeros(len(prev), dtype=bool)
    gpu[n:gpu_end] = True
    chained = read_off & ~gpu & (prev != NO_NODE)
    launched = read_off & gpu & (ctrl >= 0)
    launched[list(plan.launchless)] = False
    parents = int(np.count_nonzero(chained & chain_is_parent(prev, ctrl)))
    causes = sorted(cause for u in waits for _, cause in plan.data_deps(u))  # one order whatever the waits'
    counts.update(causes)
    for cause, count in ((PARENT, parents), (THREAD_ORDER, int(np.count_nonzero(chained)) - parents),
                         (LAUNCH, int(np.count_nonzero(launched))),
                         (STREAM_ORDER, int(np.count_nonzero(read_off & gpu & (prev >= 0))))):
        if count:
            counts[cause] += count


def dependency_plan(et_plus: EtPlus, summary: WriteSummary | None = None,
                    tree: TreeOrder | None = None) -> DependencyPlan:
    """The plan of ``et_plus`` (durations, dependencies with causes), computed once and kept on it;
    ``tree``: see ``plan_dependencies``."""
    if et_plus.plan is None:
        summary = summary if summary is not None else WriteSummary("")
        resolver = CommResolver(et_plus, et_plus.et.index_of_id()) if et_plus.gpu_nodes else None  # GPU nodes only
        et_plus.plan = plan_dependencies(et_plus, summary, resolver, tree)
        et_plus.plan_summary = summary
    elif summary is not None and summary is not et_plus.plan_summary:
        _copy_plan_counts(et_plus.plan_summary, summary)
    return et_plus.plan


def _copy_plan_counts(source: WriteSummary, target: WriteSummary) -> None:
    for name in ("wait_calls", "waits_skipped", "comm_unresolved", "cpu_comm_unnamed", "dependency_causes"):
        getattr(target, name).update(getattr(source, name))
    for name in ("wait_edges", "wait_edges_redirected", "copy_wait_edges", "ctrl_deps_dropped"):
        setattr(target, name, getattr(source, name))

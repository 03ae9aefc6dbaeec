"""The dependency plan of the Chakra writer: ctrl / data dependencies and the write order.

One numbering for all nodes: ET node i is i, GPU node k is n + k. ``plan_dependencies`` builds the
parent (ctrl) edges, the per-thread and per-stream chains, the cross-thread fork/join edges and busy
times of ``busy``, the collective order per process group, a topological write order, and the
wait edges of blocking runtime calls (rules in ``write_chakra``'s docstring).

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
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice
from operator import attrgetter, countOf, eq, gt, lt, ne
from typing import Any

import msgspec

from linker.plan.busy import DEVICE_SYNC, STREAM_SYNC, STREAM_WAIT_EVENT, WAIT_CALLS, BusyTimes, compute_busy, ops_covering
from linker.plan.comm import CommAttrs, CommResolver, is_comm_kernel
from linker.plan.cpu_comm import cpu_collectives, hold_for_measured_duration
from linker.read.et import PROCESS_ROOT_NAMES, parent_positions
from linker.link.etplus import EtPlus

NO_NODE = -1

THREAD_ORDER, PARENT, LAUNCH, STREAM_ORDER = "thread_order", "parent", "launch", "stream_order"
EVENT_WAIT, SYNC, FORK, JOIN, COLLECTIVE_ORDER = "event_wait", "sync", "fork", "join", "collective_order"
CAUSES = (THREAD_ORDER, PARENT, LAUNCH, STREAM_ORDER, EVENT_WAIT, SYNC, FORK, JOIN, COLLECTIVE_ORDER)

# ---------------------------------------------------------------------------------------------
# Dependency plan
# ---------------------------------------------------------------------------------------------


@dataclass
class GpuPlacement:
    """Per GPU node k: its (device, stream), issue (launch) time and issuing Kineto thread."""

    stream_key: list[tuple]
    issue_ts: list[float]
    issue_thread: list[tuple | None]


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
    ctrl_deps_dropped: int = 0  # parents missing from the ET (roots' self-parents not counted)
    dependency_causes: Counter = field(default_factory=Counter)  # data dependencies by cause
    seconds: float = 0.0


@dataclass
class DependencyPlan:
    """Dependencies of every node in one numbering: ET node i is i, GPU node k is n + k.

    ``ctrl[u]``: parent (-1 none). ``prev[u]``: previous node of u's CPU thread chain, or, for a
    GPU node, the previous op on its stream (-1 none); a GPU node's launcher is ``ctrl[u]``.
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

    def data_deps(self, u: int) -> list[tuple[int, str]]:
        """(source node, cause) of every data dependency of u, in the order written."""
        p = self.prev[u]
        if u < self.cpu_count:
            deps = [(p, PARENT if p == self.ctrl[u] else THREAD_ORDER)] if p >= 0 else []
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
              by_id: list[int] | None = None) -> tuple[list[int], array]:
    """ET indices in start order (tree pre-order, siblings by id) and the ctrl parent of each
    (-1 for roots and dropped parents). Nodes under a parent cycle follow in id order, keeping a
    parent only when it comes earlier. O(n log n); ids in pre-order (PyTorch gives ids at op
    start) take one sort and one stack sweep."""
    n = len(et.nodes)
    parents = _parent_indices(et, index_of_id)
    for i in compress(range(n), map(NO_NODE.__eq__, parents)):
        if index_of_id.get(et.parent[i], NO_NODE) < 0 and et.names[i] not in PROCESS_ROOT_NAMES:
            summary.ctrl_deps_dropped += 1
    by_id = by_id if by_id is not None else id_order(et.ids)
    parent = array("q", parents)
    if _id_order_is_preorder(by_id, parents):
        return by_id, parent
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for i in by_id:
        p = parent[i]
        if p < 0:
            roots.append(i)
        else:
            children.setdefault(p, []).append(i)
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


def tree_order(et) -> TreeOrder:
    """``et``'s ``TreeOrder`` (a value: the pipeline may compute it while the Kineto child is still
    at work and hand it to ``dependency_plan``). O(n log n), one sort and stack sweeps when the id
    order is the pre-order."""
    n = len(et.nodes)
    by_id = id_order(et.ids)
    counts = WriteSummary(et.path)
    preorder, parent = _preorder(et, et.index_of_id(), counts, by_id)
    return TreeOrder(by_id, preorder, parent, counts.ctrl_deps_dropped, _thread_chains(preorder, et.tid, n))


def _thread_chains(order: list[int], tid: list[int], total: int) -> array:
    """``prev`` of the CPU nodes: the previous node of the same thread in ``order`` (-1 for a
    thread's first), for ``total`` nodes (the rest -1). A stable sort by thread, then one scatter."""
    chains = sorted(order, key=tid.__getitem__)
    previous = [NO_NODE] + chains[:-1]
    counts = Counter(map(tid.__getitem__, order))
    for start in accumulate([counts[t] for t in sorted(counts)][:-1], initial=0):
        previous[start] = NO_NODE
    prev = array("q", [NO_NODE]) * total
    for u, p in zip(chains, previous):
        prev[u] = p
    return prev


def _gpu_placement(et_plus: EtPlus) -> GpuPlacement:
    stream_key, issue_ts, issue_thread = [], [], []
    for node, link in zip(et_plus.gpu_nodes, et_plus.gpu_links):
        stream_key.append((node.device, node.stream))
        launch = link.launch
        issue_ts.append(launch.ts if launch is not None else link.event.ts)
        issue_thread.append((launch.pid, launch.tid) if launch is not None else None)
    return GpuPlacement(stream_key, issue_ts, issue_thread)


def _time_keys(et_plus: EtPlus, placement: GpuPlacement, starts: list[float] | None = None) -> list[float]:
    """Priority of each node in the write order: linked start (CPU) or issue time (GPU);
    -inf for unlinked CPU ops (written as soon as their dependencies are). ``starts``: the CPU
    nodes' start column the build gathered (``EtPlus.op_times``, NaN when unlinked), the same
    numbers as their ``ts`` (which has integral values as int) without a pass over the nodes."""
    if starts is not None:
        keys = list(starts)
        for i in compress(range(len(keys)), map(ne, keys, keys)):  # NaN: unlinked
            keys[i] = -math.inf
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


def _topological_order(ctrl: array, prev: array, keys: list[float], ids: list[int],
                       extra: dict[int, list[tuple[int, str]]] | None = None) -> list[int]:
    """Kahn's algorithm over the ctrl + prev (+ ``extra``) edges, taking the ready node with the
    smallest (time key, id) first. O((V + E) log V). Raises RuntimeError if the edges have a cycle."""
    extra = extra or {}
    total = len(ctrl)
    indegree = array("q", [0]) * total
    out_count = array("q", [0]) * (total + 1)
    edge_source, edge_target = array("q"), array("q")  # every edge once, in target order
    for u in range(total):
        c, p = ctrl[u], prev[u]
        if c >= 0:
            edge_source.append(c)
            edge_target.append(u)
        if p >= 0 and p != c:
            edge_source.append(p)
            edge_target.append(u)
        if u in extra:
            for d in _edge_sources(ctrl, prev, extra, u)[(c >= 0) + (p >= 0 and p != c):]:
                edge_source.append(d)
                edge_target.append(u)
    for d, u in zip(edge_source, edge_target):
        indegree[u] += 1
        out_count[d + 1] += 1
    for u in range(total):
        out_count[u + 1] += out_count[u]
    fill = array("q", out_count)
    targets = array("q", [0]) * out_count[total]
    for d, u in zip(edge_source, edge_target):
        targets[fill[d]] = u
        fill[d] += 1
    del edge_source, edge_target
    ready = [(keys[u], ids[u], u) for u in range(total) if indegree[u] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, _, u = heapq.heappop(ready)
        order.append(u)
        for t in range(out_count[u], out_count[u + 1]):
            v = targets[t]
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, (keys[v], ids[v], v))
    if len(order) != total:
        raise RuntimeError(f"internal error: dependency cycle among {total - len(order)} nodes")
    return order


def _inverse(order: list[int]) -> array:
    """position[u] = p for order[p] = u. O(n)."""
    position = array("q", [0]) * len(order)
    for p, u in enumerate(order):
        position[u] = p
    return position


def id_order(ids: list[int]) -> list[int]:
    """Positions sorted by id (ids distinct). C passes when the ids already ascend (as PyTorch
    numbers the nodes), else a sort. O(n), O(n log n) at worst."""
    if all(map(lt, ids, islice(ids, 1, None))):
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
        if (not cpu_by_id or ids[cpu_by_id[-1]] < rest[0]) and all(map(lt, rest, rest[1:])):
            return cpu_by_id + list(range(n, len(ids)))
    return sorted(range(len(ids)), key=ids.__getitem__)


def _keeps_preorder(order: list[int], preorder: list[int]) -> bool:
    """True when the CPU nodes (numbers below len(preorder)) come in ``order`` as in ``preorder``."""
    return order == preorder or preorder == list(compress(order, map(len(preorder).__gt__, order)))


def _write_order(ctrl: array, prev: array, keys: list[float], ids: list[int],
                 extra: dict[int, list[tuple[int, str]]], cpu_by_id: list[int] | None = None,
                 preorder: list[int] | None = None) -> tuple[list[int], array]:
    """``_topological_order`` and the position of each node in it. When sorting every node by
    (time key, id) already puts each edge forward (the usual case: parents start first, chains
    run in time), that sort is the order Kahn's algorithm would give (its smallest ready node is
    then always the smallest node left): two stable sorts and C passes over the edges. The CPU
    nodes' ctrl / prev edges need no check when they come in ``preorder`` (those edges go forward
    in it: parents first, thread chains in that order). When some nodes have an edge going
    backward in that sort (a GPU op issued before its stream predecessor), ``_late_walk`` gives
    Kahn's order from the sort, doing Python work only around those nodes (on the 6000-step GPU
    pair: 5,136 of them, 0.04 s, where Kahn's heap over every node took 0.6 s). Keys with a NaN:
    Kahn's algorithm itself."""
    total = len(ctrl)
    if any(map(math.isnan, keys)):
        order = _topological_order(ctrl, prev, keys, ids, extra)
        return order, _inverse(order)
    order = _id_order(ids, cpu_by_id)
    order.sort(key=keys.__getitem__)
    position = _inverse(order)
    at = position.tolist() + [NO_NODE]  # at[-1]: no edge
    first = 0  # nodes from here on get their ctrl / prev edges checked
    if preorder is not None and _keeps_preorder(order, preorder):
        first = len(preorder)
    late = set(compress(range(first, total), map(gt, map(at.__getitem__, ctrl[first:]), position[first:])))
    late.update(compress(range(first, total), map(gt, map(at.__getitem__, prev[first:]), position[first:])))
    late.update(u for u, sources in extra.items() if any(position[d] > position[u] for d, _ in sources))
    if not late:
        return order, position
    order = _late_walk(order, at, late, ctrl, prev, keys, ids, extra)
    return order, _inverse(order)


def _late_walk(order: list[int], at: list[int], late: set[int], ctrl: array, prev: array,
               keys: list[float], ids: list[int], extra: dict[int, list[tuple[int, str]]]) -> list[int]:
    """``_topological_order``'s order from the (time key, id, number) sort ``order`` (``at``: each
    node's place in it) when only the nodes in ``late`` have a dependency placed after them. Kahn's
    algorithm takes the smallest ready node; walking the sort, that is the node reached when it is
    ready, and a node reached before its dependencies are done (late, or after a node still held)
    is held until they are, then taken before the walk goes on (it is smaller than every node
    ahead), held nodes freed together in (key, id, number) order. Runs of the sort with no node
    held and none late are taken whole. O(n) C work plus Python work per late or held node and
    per node passed while some are held; raises RuntimeError on a cycle, as Kahn's does."""
    total = len(order)
    stops = sorted(map(at.__getitem__, late))
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
    """Exclusive µs of each ET node (0 for unlinked nodes)."""
    exclusive = et_plus.result.exclusive + [0.0]  # event -1: unlinked
    return list(map(exclusive.__getitem__, et_plus.result.match.event_of_op))


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


def plan_dependencies(et_plus: EtPlus, summary: WriteSummary,
                      resolver: CommResolver | None = None, tree: TreeOrder | None = None) -> DependencyPlan:
    """ctrl / thread-chain / launcher / stream / fork-join / collective dependencies, the write
    order, then the waits; every data dependency with its cause (counted in ``summary``).
    ``tree``: the ET's ``tree_order`` when already computed."""
    et = et_plus.et
    n, g = len(et.nodes), len(et_plus.gpu_nodes)
    tree = tree if tree is not None else tree_order(et)
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
    busy = compute_busy(et_plus, exclusive, preorder)
    cpu_comm = cpu_collectives(et_plus)  # gloo / MPI / UCC collectives: communication nodes
    cpu_comm_order = hold_for_measured_duration(busy, et, cpu_comm)
    extra: dict[int, list[tuple[int, str]]] = {}
    for source, target, cause in busy.cross:
        if source != target and source != prev[target] and source != ctrl[target]:
            extra.setdefault(target, []).append((source, cause))
    plan = DependencyPlan(n, ctrl, prev, extra, busy, _comm_attrs(et_plus, resolver, summary),
                          frozenset(n + k for k, link in enumerate(et_plus.gpu_links) if link.before_trace),
                          cpu_comm)
    _collective_order(plan, placement, extra)
    for source, target in cpu_comm_order:  # CPU collectives of a group, one at a time in issue order
        if source != prev[target] and source != ctrl[target]:
            extra.setdefault(target, []).append((source, COLLECTIVE_ORDER))
    ids = et.ids + [node.id for node in gpu_nodes] if g else et.ids
    keys = _time_keys(et_plus, placement, starts)
    # The waits keep only the edges that go forward in the order: it is made first.
    plan.order, plan.position = _write_order(ctrl, prev, keys, ids, extra, by_id, preorder)
    add_wait_edges(et_plus, plan, placement, summary)
    _count_causes(plan, summary.dependency_causes)
    return plan


def _count_causes(plan: DependencyPlan, counts: Counter) -> None:
    """Add the causes of every node's ``data_deps`` to ``counts``: what ``plan.data_deps`` gives,
    read off the ctrl / prev columns (C passes) for the CPU nodes without waits. O(n + g)."""
    n, ctrl, prev, waits, launchless = plan.cpu_count, plan.ctrl, plan.prev, plan.waits, plan.launchless
    causes: list[str] = []
    for u in waits:
        causes.extend([cause for _, cause in plan.data_deps(u)])
    cpu_prev, cpu_ctrl = prev[:n], ctrl[:n]
    chained = n - cpu_prev.count(NO_NODE)
    parents = countOf(map(eq, cpu_prev, cpu_ctrl), True)  # also counts prev == ctrl == -1
    parents -= countOf(map(cpu_ctrl.__getitem__, compress(range(n), map(NO_NODE.__eq__, cpu_prev))), NO_NODE)
    for u in waits:
        if u < n and prev[u] >= 0:
            chained -= 1
            parents -= prev[u] == ctrl[u]
    launches = streams = 0
    for u in range(n, len(prev)):
        if u not in waits:
            launches += ctrl[u] >= 0 and u not in launchless
            streams += prev[u] >= 0
    causes.sort()  # the same counts in one order whatever the waits' order
    counts.update(causes)
    for cause, count in ((PARENT, parents), (THREAD_ORDER, chained - parents), (LAUNCH, launches),
                         (STREAM_ORDER, streams)):
        if count:
            counts[cause] += count


def dependency_plan(et_plus: EtPlus, summary: WriteSummary | None = None,
                    tree: TreeOrder | None = None) -> DependencyPlan:
    """The plan of ``et_plus`` (durations, dependencies with causes), computed once and kept on it.
    ``tree``: the ET's ``tree_order`` when already computed (used only by the first call)."""
    if et_plus.plan is None:
        summary = summary if summary is not None else WriteSummary("")
        resolver = CommResolver(et_plus, et_plus.et.index_of_id()) if et_plus.gpu_nodes else None  # GPU nodes only
        et_plus.plan = plan_dependencies(et_plus, summary, resolver, tree)
        et_plus.plan_summary = summary
    elif summary is not None and summary is not et_plus.plan_summary:
        _copy_plan_counts(et_plus.plan_summary, summary)
    return et_plus.plan


def _copy_plan_counts(source: WriteSummary, target: WriteSummary) -> None:
    for name in ("wait_calls", "waits_skipped", "comm_unresolved", "dependency_causes"):
        getattr(target, name).update(getattr(source, name))
    for name in ("wait_edges", "wait_edges_redirected", "copy_wait_edges", "ctrl_deps_dropped"):
        setattr(target, name, getattr(source, name))


# ---------------------------------------------------------------------------------------------
# Waits
# ---------------------------------------------------------------------------------------------

# WAIT_CALLS and its kinds live in ``busy`` (one list for blocked time and for wait edges).


@dataclass
class WaitContext:
    """Lookup structures for wait resolution, built once. Memory O(g + linked ops)."""

    placement: GpuPlacement
    by_stream: IssueIndex
    by_thread: IssueIndex
    by_thread_stream: IssueIndex
    thread_streams: dict[tuple, list[tuple]]
    linked_starts: dict[int, list[float]]  # ET tid -> linked op start times, sorted
    linked_ops: dict[int, list[int]]  # ET tid -> linked ET indices in that order


def _wait_context(et_plus: EtPlus, placement: GpuPlacement) -> WaitContext:
    et = et_plus.et
    threads = placement.issue_thread
    pairs = [(t, s) if t is not None else None for t, s in zip(threads, placement.stream_key)]
    thread_streams: dict[tuple, list[tuple]] = {}
    for pair in set(p for p in pairs if p is not None):
        thread_streams.setdefault(pair[0], []).append(pair[1])
    linked: dict[int, list[int]] = {}
    ts = list(map(attrgetter("ts"), et.nodes))
    tids, unset = et.tid, msgspec.UNSET
    for i in et.op_indices():
        if ts[i] is not unset:
            linked.setdefault(tids[i], []).append(i)
    starts = {}
    for tid, ops in linked.items():
        ops.sort(key=et.ids.__getitem__)
        ops.sort(key=ts.__getitem__)  # stable: by (start, id), as ops came by index
        starts[tid] = list(map(ts.__getitem__, ops))
    return WaitContext(
        placement,
        IssueIndex.build(placement.stream_key, placement.issue_ts),
        IssueIndex.build(list(threads), placement.issue_ts),
        IssueIndex.build(pairs, placement.issue_ts),
        thread_streams, starts, linked,
    )


def _waited_on(call, kind: str, ctx: WaitContext) -> list[int]:
    """GPU node numbers the call waited for (rules in the module docstring)."""
    t = call.ts
    thread = (call.pid, call.tid)
    if kind == DEVICE_SYNC:
        found = (ctx.by_stream.last_before(key, t) for key in ctx.by_stream.nodes)
        return [k for k in found if k >= 0]
    if kind == STREAM_SYNC:
        stream = _named_stream(call, ctx)
        if stream is None:
            last = ctx.by_thread.last_before(thread, t)
            stream = ctx.placement.stream_key[last] if last >= 0 else None
        k = ctx.by_stream.last_before(stream, t) if stream is not None else NO_NODE
        return [k] if k >= 0 else []
    following = ctx.by_thread.first_after(thread, t)
    waiting = ctx.placement.stream_key[following] if following >= 0 else None
    latest, source_stream = -math.inf, None
    for stream in ctx.thread_streams.get(thread, ()):
        if stream == waiting:
            continue
        k = ctx.by_thread_stream.last_before((thread, stream), t)
        if k >= 0 and ctx.placement.issue_ts[k] > latest:
            latest, source_stream = ctx.placement.issue_ts[k], stream
    k = ctx.by_stream.last_before(source_stream, t) if source_stream is not None else NO_NODE
    return [k] if k >= 0 else []


def _named_stream(call, ctx: WaitContext) -> tuple | None:
    """The (device, stream) a runtime call names in its args, when Kineto records one."""
    stream = call.args.stream
    if stream is None:
        return None
    for key in ctx.by_stream.nodes:
        if key[1] == stream and (call.args.device is None or key[0] == call.args.device):
            return key
    return None


def _op_after(thread_tid: int, t: float, ctx: WaitContext) -> int:
    """The first linked op of ET thread ``thread_tid`` starting at or after ``t`` (-1 if none)."""
    starts = ctx.linked_starts.get(thread_tid)
    if not starts:
        return NO_NODE
    position = bisect_left(starts, t)
    return ctx.linked_ops[thread_tid][position] if position < len(starts) else NO_NODE


def _wait_target(call, kind: str, waiter: int, ctx: WaitContext, et, n: int) -> int:
    """Where a wait edge goes. A blocking synchronize: the first linked op of the waiter's thread
    starting at or after the call returns (the thread went on only then); failing that, the
    waiter. cudaStreamWaitEvent (the CPU does not block): the next GPU op the calling thread
    issued, on the stream that waited."""
    if kind == STREAM_WAIT_EVENT:
        k = ctx.by_thread.first_after((call.pid, call.tid), call.ts)
        return n + k if k >= 0 else NO_NODE
    after = _op_after(et.tid[waiter], call.ts + call.dur, ctx)
    return after if after >= 0 else waiter


def _wait_calls(et_plus: EtPlus) -> list:
    """The Kineto runtime events that are waits, inside the linked window if there is one."""
    window = et_plus.result.window
    calls = []
    for event in et_plus.result.kineto.runtime_events:
        if event.name in WAIT_CALLS and (window is None or window.contains(event.ts)):
            calls.append(event)
    return calls


ADDED, ALREADY_THERE, NO_PLACE = "added", "already there", "no place"


def _add_wait(plan: DependencyPlan, source: int, target: int, cause: str) -> str:
    """Record source -> target unless it would go backward in the write order (NO_PLACE) or the
    dependency exists already (ALREADY_THERE)."""
    if target < 0 or target == source or plan.position[target] <= plan.position[source]:
        return NO_PLACE
    targets = plan.waits.setdefault(target, [])
    if any(d == source for d, _ in targets) or plan.prev[target] == source or plan.ctrl[target] == source:
        return ALREADY_THERE
    targets.append((source, cause))
    return ADDED


def _ended_after_start(et_plus: EtPlus, k: int, j: int) -> bool:
    """True when GPU node k ended (1 µs tolerance) after GPU node j started: j cannot have waited
    for k (the event waited on was recorded before k; the trace does not record which)."""
    if j < 0:
        return False
    source, target = et_plus.gpu_nodes[k], et_plus.gpu_nodes[j]
    return source.ts + source.dur > target.ts + 1.0


def add_wait_edges(et_plus: EtPlus, plan: DependencyPlan, placement: GpuPlacement, summary: WriteSummary) -> None:
    """Add the wait edges to ``plan.waits``; only edges that go forward in ``plan.order`` are
    kept, so the order stays topological and the graph acyclic. An event wait needs no covering CPU
    op (it is GPU to GPU); for such a call outside any op, an edge whose waited-on op ended after
    the waiting op started is dropped. O(w log g) for w wait calls."""
    calls = _wait_calls(et_plus)
    if not et_plus.gpu_nodes:
        summary.wait_calls.update(call.name for call in calls)
        if calls:
            summary.waits_skipped["no GPU op to wait on"] += len(calls)
        return
    ctx = _wait_context(et_plus, placement)
    n, et = plan.cpu_count, et_plus.et
    for call, waiter in zip(calls, ops_covering(et_plus, calls)):
        summary.wait_calls[call.name] += 1
        kind = WAIT_CALLS[call.name]
        if waiter < 0 and kind != STREAM_WAIT_EVENT:  # an event wait needs no CPU op: GPU to GPU
            summary.waits_skipped["call outside linked ops"] += 1
            continue
        sources = _waited_on(call, kind, ctx)
        if not sources:
            summary.waits_skipped["no GPU op to wait on"] += 1
            continue
        cause = EVENT_WAIT if kind == STREAM_WAIT_EVENT else SYNC
        target = _wait_target(call, kind, waiter, ctx, et, n)  # the same for every source
        for k in sources:
            source = n + k
            if waiter < 0 and _ended_after_start(et_plus, k, target - n):
                summary.waits_skipped["waited-on op ended after the waiting op started"] += 1
                continue
            outcome = _add_wait(plan, source, target, cause)
            if outcome == NO_PLACE:
                summary.waits_skipped["no later op to carry the wait"] += 1
            elif outcome == ADDED:
                summary.wait_edges += 1
                summary.wait_edges_redirected += target != waiter
    copies = plan.busy.blocking_copies if plan.busy is not None else []
    launches = [et_plus.gpu_links[k].launch for k in copies]
    for k, launch, waiter in zip(copies, launches, ops_covering(et_plus, launches)):
        if waiter < 0:
            continue
        target = _op_after(et.tid[waiter], launch.ts + launch.dur, ctx)
        if _add_wait(plan, n + k, target, SYNC) == ADDED:
            summary.copy_wait_edges += 1

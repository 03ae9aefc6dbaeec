"""The dependency plan's fast paths give what the general algorithms give.

``chakra_deps`` takes the id order as the tree pre-order when it is one, and the (time, id) sort as
the write order when every edge goes forward in it; ``busy`` orders a thread's ops by one sort on
the start plus a fix-up of equal starts (any input order), and reads the times ``build_et_plus``
gathered. Each is checked against the general algorithm on the
fixtures and on hand-made cases where the fast path does not apply.
"""

from __future__ import annotations

import heapq
import math
import random
from types import SimpleNamespace

import pytest

from conftest import FIXTURES, dlrm_pair
from linker.plan import deps as chakra_deps
from linker.plan.busy import _start_order, compute_busy
from linker.plan.dependency_plan import NO_NODE, WriteSummary
from linker.plan.deps import _id_order, _preorder, _write_order
from linker.read.et import read_execution_trace
from linker.link.etplus import build_et_plus
from linker.read.kineto import read_kineto_trace
from linker.link.recipe import link

PAIRS = sorted(str(p.parent.relative_to(FIXTURES)) for p in FIXTURES.glob("*/*/et.json.gz"))


def _et_plus(name: str):
    if name == "dlrm_rank0":
        et_path, kineto_path = dlrm_pair(0)
    else:
        et_path, kineto_path = FIXTURES / name / "et.json.gz", FIXTURES / name / "kineto.json.gz"
    return build_et_plus(link(read_execution_trace(et_path), read_kineto_trace(kineto_path)))


def _general_preorder(et) -> tuple[list[int], list[int], int]:
    """``_preorder`` without the id-order shortcut: the general walk."""
    summary = WriteSummary("")
    order, parent = _preorder(et, et.index_of_id(), summary, check_id_order=False)
    return order, list(parent), summary.ctrl_deps_dropped


@pytest.mark.parametrize("name", PAIRS + ["dlrm_rank0"])
def test_fast_paths_match_the_general_algorithms(name):
    et_plus = _et_plus(name)
    et = et_plus.et
    summary = WriteSummary("")
    order, parent = _preorder(et, et.index_of_id(), summary)
    assert (order, list(parent), summary.ctrl_deps_dropped) == _general_preorder(et)
    plan = chakra_deps.dependency_plan(et_plus)
    # The write order is the one Kahn's sort gives.
    keys = chakra_deps._time_keys(et_plus, chakra_deps._gpu_placement(et_plus)) + plan.busy.pieces.begin.tolist()
    ids = et.ids + [node.id for node in et_plus.gpu_nodes] + plan.piece_ids
    kahn = _kahn(plan.ctrl, plan.prev, keys, ids, plan.waits)
    fast, position = _write_order(plan.ctrl, plan.prev, keys, ids, plan.waits)
    assert fast == kahn == plan.order and plan.position == position
    by_id = sorted(range(len(et.nodes)), key=et.ids.__getitem__)
    assert _write_order(plan.ctrl, plan.prev, keys, ids, plan.waits, by_id, order)[0] == kahn
    assert [position[u] for u in kahn] == list(range(len(kahn)))


def _kahn(ctrl, prev, keys, ids, extra=None) -> list[int]:
    """Kahn's algorithm itself, the smallest ready (key, id, number) first: what ``_write_order``
    must give. Raises RuntimeError on a cycle."""
    extra = extra or {}
    sources = [{d for d in (ctrl[u], prev[u]) if d >= 0} | {d for d, _ in extra.get(u, ())} for u in range(len(ctrl))]
    unmet = [len(s) for s in sources]
    dependents: list[list[int]] = [[] for _ in sources]
    for u, s in enumerate(sources):
        for d in s:
            dependents[d].append(u)
    ready = [(keys[u], ids[u], u) for u in range(len(ctrl)) if not unmet[u]]
    heapq.heapify(ready)
    order = []
    while ready:
        u = heapq.heappop(ready)[2]
        order.append(u)
        for v in dependents[u]:
            unmet[v] -= 1
            if not unmet[v]:
                heapq.heappush(ready, (keys[v], ids[v], v))
    if len(order) != len(ctrl):
        raise RuntimeError("a dependency cycle")
    return order


def _tree(parents_by_id: dict[int, int]):
    """A stand-in ExecutionTrace: node ids with their parent ids (nodes in the given order)."""
    ids = list(parents_by_id)
    index = {node_id: i for i, node_id in enumerate(ids)}
    parent = [parents_by_id[node_id] for node_id in ids]
    parent_index = [index.get(p, NO_NODE) if index.get(p) != i else NO_NODE for i, p in enumerate(parent)]
    return SimpleNamespace(nodes=ids, ids=ids, parent=parent, names=["op"] * len(ids),
                           index_of_id=lambda: index, parent_index=lambda: parent_index)


def _reference_preorder(et) -> list[int]:
    """Recursive pre-order, roots and siblings by id; nodes on a parent cycle last, by id."""
    index = et.index_of_id()
    children: dict[int, list[int]] = {}
    for i, p in enumerate(et.parent):
        if index.get(p, i) != i:
            children.setdefault(index[p], []).append(i)
    order: list[int] = []

    def visit(i):
        order.append(i)
        for c in sorted(children.get(i, ()), key=et.ids.__getitem__):
            visit(c)

    for i in sorted(range(len(et.ids)), key=et.ids.__getitem__):
        if index.get(et.parent[i], i) == i:
            visit(i)
    return order + sorted(set(range(len(et.ids))) - set(order), key=et.ids.__getitem__)


@pytest.mark.parametrize("parents_by_id", [
    {1: 1, 2: 1, 3: 2, 4: 2, 5: 1, 6: 5},  # ids in pre-order (the fast path)
    {6: 5, 4: 2, 3: 2, 5: 1, 2: 1, 1: 1},  # the same tree, nodes in another order
    {1: 1, 5: 1, 2: 5, 3: 1, 4: 2},  # a child with a smaller id than its parent's later sibling
    {1: 1, 2: 1, 3: 9, 4: 3, 5: 2},  # a missing parent (dropped) holding a subtree
    {1: 1, 2: 3, 3: 2, 4: 1},  # a parent cycle
])
def test_preorder_of_hand_made_trees(parents_by_id):
    et = _tree(parents_by_id)
    summary = WriteSummary("")
    order, parent = _preorder(et, et.index_of_id(), summary)
    assert order == _reference_preorder(et)
    assert (order, list(parent), summary.ctrl_deps_dropped) == _general_preorder(et)


def test_write_order_falls_back_when_the_time_order_has_a_backward_edge():
    # node 1 (time 0) depends on node 2 (time 5): the time sort puts it first, Kahn's order waits
    ctrl = chakra_deps.array("q", [NO_NODE, 2, NO_NODE, 0])
    prev = chakra_deps.array("q", [NO_NODE, NO_NODE, 0, 2])
    keys, ids = [1.0, 0.0, 5.0, 2.0], [10, 11, 12, 13]
    order, position = _write_order(ctrl, prev, keys, ids, {})
    assert order == _kahn(ctrl, prev, keys, ids) == [0, 2, 1, 3]
    assert list(position) == [0, 2, 1, 3]
    extra = {0: [(3, "join")]}
    with pytest.raises(RuntimeError):
        _write_order(ctrl, prev, keys, ids, extra)


@pytest.mark.parametrize("seed", range(40))
def test_write_order_with_late_nodes_is_kahns_order(seed):
    # Random DAGs whose time order puts many edges backward (and ties in key and id): the walk
    # that holds the late nodes gives Kahn's order exactly.
    rng = random.Random(seed)
    n = rng.randrange(2, 400)
    rank = list(range(n))
    rng.shuffle(rank)  # a topological order of the DAG: edges go from earlier to later in it
    node_at = {r: u for u, r in enumerate(rank)}

    def earlier(u, chance):
        return node_at[rng.randrange(rank[u])] if rank[u] and rng.random() < chance else NO_NODE

    ctrl = chakra_deps.array("q", [earlier(u, 0.8) for u in range(n)])
    prev = chakra_deps.array("q", [earlier(u, 0.6) for u in range(n)])
    extra = {}
    for u in rng.sample(range(n), n // 10):
        sources = [d for d in (earlier(u, 1.0) for _ in range(rng.randrange(1, 4))) if d >= 0]
        if sources:
            extra[u] = [(d, "join") for d in sources]
    # keys: mostly following the DAG (as times do), a share at random; a few unlinked (-inf)
    spread = rng.choice([0.0, 0.1, 0.5, 1.0])
    keys = [float(rank[u] // 3) if rng.random() >= spread else float(rng.randrange(n // 3 + 1)) for u in range(n)]
    for u in rng.sample(range(n), n // 20):
        keys[u] = -math.inf
    ids = [rng.randrange(n // 2 + 1) for _ in range(n)]
    order, position = _write_order(ctrl, prev, keys, ids, extra)
    assert order == _kahn(ctrl, prev, keys, ids, extra)
    assert [position[u] for u in order] == list(range(n))


def test_a_nan_key_is_written_as_soon_as_its_dependencies_are():
    # node 2's key is NaN: it counts as -inf (an unlinked op's), so it goes right after node 0
    ctrl = chakra_deps.array("q", [NO_NODE, 0, 0, NO_NODE])
    prev = chakra_deps.array("q", [NO_NODE] * 4)
    keys, ids = [0.0, 1.0, math.nan, 2.0], [0, 1, 2, 3]
    order, position = _write_order(ctrl, prev, keys, ids, {})
    assert order == _kahn(ctrl, prev, [0.0, 1.0, -math.inf, 2.0], ids) == [0, 2, 1, 3]
    assert list(position) == [0, 2, 1, 3]


def test_write_order_with_late_nodes_finds_a_cycle():
    ctrl = chakra_deps.array("q", [NO_NODE, 2, 1, NO_NODE])  # 1 and 2 wait for each other
    prev = chakra_deps.array("q", [NO_NODE] * 4)
    with pytest.raises(RuntimeError):
        _write_order(ctrl, prev, [0.0, 1.0, 2.0, 3.0], [0, 1, 2, 3], {})


def test_start_order_is_the_sort_by_start_then_longest_then_id_then_index():
    rng = random.Random(3)
    n = 2000
    starts = [float(rng.randrange(50)) for _ in range(n)]  # many equal starts
    ends = [s + rng.randrange(4) for s in starts]
    ids = [rng.randrange(n // 2) for _ in range(n)]  # repeated ids too
    ops = rng.sample(range(n), n // 2)
    expected = sorted(sorted(ops), key=lambda i: (starts[i], -ends[i], ids[i]))  # ties: by index
    assert _start_order(ops, starts, ends, ids) == (expected, [starts[i] for i in expected])
    assert _start_order(sorted(ops), starts, ends, ids)[0] == expected  # any input order
    assert _start_order([], starts, ends, ids) == ([], [])


def test_id_order_reuses_the_cpu_order_only_when_the_gpu_ids_follow():
    ids = [5, 3, 9, 4]
    assert _id_order(ids + [10, 11], [1, 3, 0, 2]) == [1, 3, 0, 2, 4, 5]
    assert _id_order(ids + [8, 11], [1, 3, 0, 2]) == [1, 3, 0, 4, 2, 5]  # a GPU id among the CPU ids
    assert _id_order(ids + [12, 11], [1, 3, 0, 2]) == [1, 3, 0, 2, 5, 4]  # GPU ids not ascending
    assert _id_order(ids, None) == [1, 3, 0, 2]


@pytest.mark.parametrize("name", ["cpu/autograd_threads", "gpu/gpu_v111", "dlrm_rank0"])
def test_busy_times_do_not_depend_on_the_order_hint(name):
    et_plus = _et_plus(name)
    exclusive = chakra_deps._exclusive_of_ops(et_plus)
    n = len(et_plus.et.nodes)
    with_hint = compute_busy(et_plus, exclusive, list(range(n - 1, -1, -1)))
    et_plus.op_times = None  # the columns gathered again from the events
    without = compute_busy(et_plus, exclusive)
    assert with_hint == without


@pytest.mark.parametrize("name", ["cpu/autograd_threads", "gpu/gpu_v111", "dlrm_rank0"])
def test_columns_gathered_by_the_build_give_what_the_nodes_give(name):
    """The plan and the simulation fields from the columns ``build_et_plus`` gathers (starts, ends,
    exclusive times) equal those read again from the nodes and events; the columns stay as built."""
    import msgspec

    from linker.plan.json_fields import annotate_et_plus

    gathered, again = _et_plus(name), _et_plus(name)
    assert gathered.op_exclusive is not None
    placement = chakra_deps._gpu_placement(gathered)
    assert chakra_deps._time_keys(gathered, placement, gathered.op_times[0]) == \
        chakra_deps._time_keys(gathered, placement)
    again.op_times = again.op_exclusive = None
    assert chakra_deps._exclusive_of_ops(gathered) == gathered.op_exclusive
    built = (list(gathered.op_exclusive), tuple(map(list, gathered.op_times)))
    annotate_et_plus(gathered)
    annotate_et_plus(again)
    assert (gathered.op_exclusive, tuple(map(list, gathered.op_times))) == built
    assert gathered.plan.busy == again.plan.busy
    assert gathered.plan.order == again.plan.order and gathered.plan.position == again.plan.position
    assert msgspec.json.encode(gathered.all_nodes()) == msgspec.json.encode(again.all_nodes())

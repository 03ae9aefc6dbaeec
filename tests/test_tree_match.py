"""Tests of linker.link.tree_match on synthetic op forests (with ground truth) and on a real trace pair."""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from linker.link.tree_match import (
    ET_SIDE,
    KINETO_SIDE,
    ForestMatch,
    OrderedForest,
    match_forests,
)
from conftest import shared_reason

SHARED = Path(__file__).resolve().parents[2] / "shared"

# --------------------------------------------------------------------------------------------------
# Synthetic op trees with ground truth (also used by scripts/bench_tree_match.py)
# --------------------------------------------------------------------------------------------------

_AS_STRIDED = ("aten::as_strided", ())
_T = ("aten::t", (("aten::transpose", (_AS_STRIDED,)),))
_RESOLVE = ("aten::resolve_conj", ())


def _addmm(conj: int) -> tuple:
    """aten::addmm with `conj` resolve_conj leaves (2 or 3 in real traces)."""
    return ("aten::addmm", (("aten::expand", (_AS_STRIDED,)), ("aten::copy_", ())) + (_RESOLVE,) * conj)


def _linear(conj: int) -> tuple:
    return ("aten::linear", (_T, _addmm(conj)))


_RELU = ("aten::relu", (("aten::clamp_min", ()),))
_CONV = ("aten::conv2d", (("aten::convolution", (("aten::_convolution", (
    ("aten::mkldnn_convolution", (("aten::empty", ()), ("aten::as_strided_", ()))),)),)),))
_LAYER_NORM = ("aten::layer_norm",
               (("aten::native_layer_norm", (("aten::empty", ()), ("aten::empty", ()))),))
_DROPOUT = ("aten::dropout", (("aten::bernoulli_", ()), ("aten::div_", ()), ("aten::mul", ())))
_SOFTMAX = ("aten::softmax", (("aten::_softmax", ()),))
_MATMUL = ("aten::matmul", (("aten::bmm", (("aten::resolve_conj", ()),)), ("aten::_unsafe_view", ())))


def _evaluate(name: str, body: tuple) -> tuple:
    return (f"autograd::engine::evaluate_function: {name}", ((name, body),))


_ACCUMULATE = _evaluate("torch::autograd::AccumulateGrad", (("aten::detach", (("detach", ()),)),))
_ADDMM_BACKWARD = _evaluate("AddmmBackward0", (_T, ("aten::mm", (_RESOLVE, _RESOLVE)), _T,
                                               ("aten::mm", (_RESOLVE, _RESOLVE)), _T))
_RELU_BACKWARD = _evaluate("ReluBackward0", (("aten::threshold_backward", ()),))
_CONV_BACKWARD = _evaluate("ConvolutionBackward0", (("aten::convolution_backward", (
    ("aten::empty", ()), ("aten::empty", ()), ("aten::sum", ()))),))
_NORM_BACKWARD = _evaluate("NativeLayerNormBackward0", (("aten::native_layer_norm_backward", (
    ("aten::empty_like", (("aten::empty_strided", ()),)),)),))
_TO_COPY = ("aten::_to_copy", (("aten::empty_strided", ()), ("aten::copy_", ())))
_SGD_PARAM = (("aten::mul_", (("aten::to", (_TO_COPY,)),)), ("aten::add_", ()), ("aten::add_", ()))


def random_program(rng: random.Random, layers: int) -> list[str]:
    """A model: a list of layer kinds drawn at random (repeated kinds give identical subtrees)."""
    kinds = ["linear_relu", "linear_relu", "conv", "norm", "dropout", "attention", "linear3"]
    return [rng.choice(kinds) for _ in range(layers)]


def iteration_template(program: list[str], step: int | None) -> list[tuple]:
    """Top-level op templates of one training iteration of program (under ProfilerStep#step when
    step is given).  Parameters get a zero_grad zero_ each and an SGD mul_/add_/add_ each."""
    forward: list[tuple] = []
    backward: list[tuple] = []
    params = 0
    for kind in program:
        if kind == "linear_relu":
            forward += [_linear(2), _RELU]
            backward = [_RELU_BACKWARD, _ADDMM_BACKWARD, _ACCUMULATE, _ACCUMULATE] + backward
            params += 2
        elif kind == "linear3":
            forward += [_linear(3)]
            backward = [_ADDMM_BACKWARD, _ACCUMULATE] + backward
            params += 2
        elif kind == "conv":
            forward += [_CONV, _RELU]
            backward = [_RELU_BACKWARD, _CONV_BACKWARD, _ACCUMULATE] + backward
            params += 1
        elif kind == "norm":
            forward += [_LAYER_NORM]
            backward = [_NORM_BACKWARD, _ACCUMULATE, _ACCUMULATE] + backward
            params += 2
        elif kind == "dropout":
            forward += [_DROPOUT]
        else:  # attention
            forward += [_linear(2), _linear(2), _MATMUL, _SOFTMAX, _MATMUL, _linear(2)]
            backward = [_ADDMM_BACKWARD, _ADDMM_BACKWARD, _ACCUMULATE, _ACCUMULATE] + backward
            params += 6
    zero_grad = ("Optimizer.zero_grad#SGD.zero_grad",
                 (("aten::zero_", (("aten::fill_", ()),)),) * params)
    log_softmax = ("aten::log_softmax", (("aten::to", ()), ("aten::_log_softmax", ())))
    nll = ("aten::nll_loss_nd", (("aten::nll_loss", (("aten::nll_loss_forward", ()),)),))
    loss = ("aten::cross_entropy_loss", (log_softmax, nll))
    ones = ("aten::ones_like", (("aten::empty_like", ()), ("aten::fill_", ())))
    step_op = ("Optimizer.step#SGD.step", _SGD_PARAM * params)
    body = [zero_grad] + forward + [loss, ones] + backward + [step_op]
    if step is None:
        return body
    return [(f"ProfilerStep#{step}", tuple(body))]


@dataclass
class SynthTree:
    """A mutable tree with ground-truth ids: node k has labels[k] and children kids[k]."""

    labels: list[str] = field(default_factory=list)
    kids: list[list[int]] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)

    def add(self, label: str, parent: int) -> int:
        self.labels.append(label)
        self.kids.append([])
        node = len(self.labels) - 1
        (self.kids[parent] if parent >= 0 else self.roots).append(node)
        return node

    def instantiate(self, template: tuple, parent: int) -> int:
        """Add a copy of a (label, children templates) template under parent; iterative."""
        root = self.add(template[0], parent)
        work = [(child, root) for child in reversed(template[1])]
        while work:
            (label, children), at = work.pop()
            node = self.add(label, at)
            work.extend((child, node) for child in reversed(children))
        return root


@dataclass
class Serialized:
    forest: OrderedForest
    ids: list[int]  # ground-truth id of each pre-order position (-1 for an inserted node)


def serialize(tree: SynthTree, deleted: set[int] = frozenset(),
              relabel: dict[int, str] | None = None, extra_ids: int = -1) -> Serialized:
    """Pre-order OrderedForest of tree; deleted nodes vanish and their children move up to the
    nearest kept ancestor; ids >= extra_ids (when extra_ids >= 0) are reported as -1 (not in the ET)."""
    relabel = relabel or {}
    labels: list[str] = []
    parent: list[int] = []
    ids: list[int] = []
    work = [(r, -1) for r in reversed(tree.roots)]
    while work:
        node, at = work.pop()
        if node in deleted:
            work.extend((c, at) for c in reversed(tree.kids[node]))
            continue
        labels.append(relabel.get(node, tree.labels[node]))
        parent.append(at)
        ids.append(-1 if 0 <= extra_ids <= node else node)
        here = len(labels) - 1
        work.extend((c, here) for c in reversed(tree.kids[node]))
    return Serialized(OrderedForest(labels, parent), ids)


def synthetic_tree(seed: int, iterations: int, layers: int, profiler_steps: bool = False) -> SynthTree:
    rng = random.Random(seed)
    program = random_program(rng, layers)
    tree = SynthTree()
    for it in range(iterations):
        for template in iteration_template(program, it if profiler_steps else None):
            tree.instantiate(template, -1)
    return tree


def delete_random(tree: SynthTree, fraction: float, seed: int) -> set[int]:
    rng = random.Random(seed)
    return {k for k in range(len(tree.labels)) if rng.random() < fraction}


@dataclass
class Score:
    correct: int
    wrong: int
    present: int  # Kineto nodes whose true ET node exists with the same label


def score(match: ForestMatch, et: Serialized, kineto: Serialized) -> Score:
    et_labels = {i: lab for i, lab in zip(et.ids, et.forest.labels)}
    present = sum(1 for i, lab in zip(kineto.ids, kineto.forest.labels)
                  if i >= 0 and et_labels.get(i) == lab)
    correct = sum(1 for x, y in match.pairs if et.ids[x] == kineto.ids[y])
    return Score(correct, len(match.pairs) - correct, present)


def check_contract(match: ForestMatch, et: OrderedForest, kineto: OrderedForest) -> None:
    """Each index once, equal labels, ancestor and order preserved (checked on all pairs in O(n))."""
    xs = [x for x, _ in match.pairs]
    ys = [y for _, y in match.pairs]
    assert len(set(xs)) == len(xs) and len(set(ys)) == len(ys)
    assert all(et.labels[x] == kineto.labels[y] for x, y in match.pairs)
    assert xs == sorted(xs) and ys == sorted(ys)  # pre-order preserved both ways
    pair_et = dict(match.pairs)
    pair_k = {y: x for x, y in match.pairs}

    def nearest_paired_ancestor(parent: list[int], paired: dict[int, int]) -> list[int]:
        out = [-1] * len(parent)
        for i, p in enumerate(parent):
            if p >= 0:
                out[i] = p if p in paired else out[p]
        return out

    up_et = nearest_paired_ancestor(et.parent, pair_et)
    up_k = nearest_paired_ancestor(kineto.parent, pair_k)
    for x, y in match.pairs:
        assert (pair_et[up_et[x]] if up_et[x] >= 0 else -1) == up_k[y]


# --------------------------------------------------------------------------------------------------
# Synthetic tests
# --------------------------------------------------------------------------------------------------

def test_identical_forests_pair_everything_at_zero_cost():
    tree = synthetic_tree(seed=1, iterations=3, layers=12)
    et = serialize(tree)
    kineto = serialize(tree)
    match = match_forests(et.forest, kineto.forest)
    n = len(et.ids)
    assert match.pairs == [(i, i) for i in range(n)]
    assert match.edit_cost == 0
    assert match.tree_nodes == (n, n)
    assert match.unmatched_subtrees == []
    assert match.paired_identical == n
    assert match.kineto_span == (0, n)


def test_five_percent_deleted_kineto_events():
    """>= 97% of the still-present nodes paired correctly, <= 0.5% wrong.  Summed over seeds: which
    copy of a run of identical siblings lost a whole subtree is unknowable and left unpaired, so a
    single small forest can fall a little lower (each seed is held to 94%)."""
    totals = Score(0, 0, 0)
    for seed in (2, 3, 4, 5, 6):
        tree = synthetic_tree(seed=seed, iterations=4, layers=16)
        et = serialize(tree)
        kineto = serialize(tree, deleted=delete_random(tree, 0.05, seed))
        match = match_forests(et.forest, kineto.forest)
        check_contract(match, et.forest, kineto.forest)
        s = score(match, et, kineto)
        assert s.wrong <= 0.005 * s.present, (seed, s)
        assert s.correct >= 0.94 * s.present, (seed, s)
        deleted = len(et.ids) - len(kineto.ids)
        assert match.edit_cost == len(et.ids) + len(kineto.ids) - 2 * len(match.pairs)
        assert match.edit_cost >= deleted
        assert match.paired_identical > match.paired_aligned > 0
        totals = Score(totals.correct + s.correct, totals.wrong + s.wrong, totals.present + s.present)
    assert totals.correct >= 0.97 * totals.present, totals
    assert totals.wrong <= 0.005 * totals.present, totals


def test_deleted_internal_node_children_are_found_one_level_up():
    tree = SynthTree()
    for _ in range(3):
        tree.instantiate(_linear(2), -1)
    et = serialize(tree)
    kineto = serialize(tree, deleted={tree.roots[1]})
    match = match_forests(et.forest, kineto.forest)
    s = score(match, et, kineto)
    assert s.correct == s.present == len(kineto.ids) and s.wrong == 0
    assert match.edit_cost == 1
    assert [(u.side, u.root, u.label, u.size) for u in match.unmatched_subtrees] == \
        [(ET_SIDE, tree.roots[1], "aten::linear", 1)]


def test_missing_copy_in_run_of_identical_leaves_is_not_guessed():
    tree = SynthTree()
    parent = tree.add("Optimizer.step#SGD.step", -1)
    tree.add("aten::mul_", parent)
    run = [tree.add("aten::add_", parent) for _ in range(4)]
    tree.add("aten::zero_", parent)
    et = serialize(tree)
    kineto = serialize(tree, deleted={run[2]})
    match = match_forests(et.forest, kineto.forest)
    assert score(match, et, kineto).wrong == 0
    paired_labels = {et.forest.labels[x] for x, _ in match.pairs}
    assert paired_labels == {"Optimizer.step#SGD.step", "aten::mul_", "aten::zero_"}
    assert match.ambiguous_unpaired > 0


def test_missing_whole_node_inside_a_run_is_placed_by_its_promoted_children():
    """A missing Optimizer.step mul_ leaves its aten::to in the run: that pins which copy is missing."""
    tree = SynthTree()
    step = tree.instantiate(("Optimizer.step#SGD.step", _SGD_PARAM * 6), -1)
    muls = [c for c in tree.kids[step] if tree.labels[c] == "aten::mul_"]
    et = serialize(tree)
    kineto = serialize(tree, deleted={muls[3]})
    match = match_forests(et.forest, kineto.forest)
    s = score(match, et, kineto)
    assert s.wrong == 0 and s.correct == s.present


def test_extra_kineto_iterations_land_on_one_iteration():
    rng = random.Random(5)
    body = iteration_template(random_program(rng, 10), None)
    tree = SynthTree()
    for template in body:
        tree.instantiate(template, -1)
    et = serialize(tree)
    kineto_tree = SynthTree()
    for _ in range(3):
        for template in body:
            kineto_tree.instantiate(template, -1)
    kineto = serialize(kineto_tree)
    n = len(et.ids)
    assert len(kineto.ids) == 3 * n
    match = match_forests(et.forest, kineto.forest)
    check_contract(match, et.forest, kineto.forest)
    assert len(match.pairs) == n
    start = match.pairs[0][1]
    assert start % n == 0  # identical copies: any one will do, but one whole copy
    assert all(y == start + x for x, y in match.pairs)
    assert match.kineto_span == (start, start + n)
    assert match.edit_cost == 0


def test_profiler_steps_pick_the_right_iteration_despite_deletions():
    totals = Score(0, 0, 0)
    for seed in (6, 7, 8):
        tree = synthetic_tree(seed=seed, iterations=6, layers=12, profiler_steps=True)
        et = serialize(SynthTree(tree.labels, tree.kids, [tree.roots[3]]))  # ProfilerStep#3 only
        kineto = serialize(tree, deleted=delete_random(tree, 0.05, seed))
        match = match_forests(et.forest, kineto.forest)
        check_contract(match, et.forest, kineto.forest)
        s = score(match, et, kineto)
        assert s.wrong <= 0.005 * s.present
        lo, hi = match.kineto_span
        in_step = set(et.ids)
        assert lo < hi and all(kineto.ids[k] in in_step for k in range(lo, hi))
        totals = Score(totals.correct + s.correct, totals.wrong + s.wrong, totals.present + s.present)
    assert totals.correct >= 0.97 * totals.present, totals


def test_relabelled_and_inserted_subtrees_stay_unpaired():
    tree = synthetic_tree(seed=7, iterations=2, layers=12)
    et = serialize(tree)
    rng = random.Random(7)
    n = len(tree.labels)
    internal = [k for k in range(n) if tree.kids[k]]
    relabelled = set(rng.sample(internal, 20))
    relabel = {k: "aten::renamed_op" for k in relabelled}
    # Insert 15 extra subtrees (ids >= n) into random children lists of a Kineto copy.
    kineto_tree = SynthTree(list(tree.labels), [list(k) for k in tree.kids], list(tree.roots))
    hosts = [k for k in internal if k not in relabelled]
    for _ in range(15):
        host = rng.choice(hosts)
        extra = kineto_tree.instantiate(("Inserted::annotation", (("aten::empty", ()), _RELU)), -1)
        kineto_tree.roots.remove(extra)
        kineto_tree.kids[host].insert(rng.randrange(len(kineto_tree.kids[host]) + 1), extra)
    kineto = serialize(kineto_tree, relabel=relabel, extra_ids=n)
    match = match_forests(et.forest, kineto.forest)
    check_contract(match, et.forest, kineto.forest)
    s = score(match, et, kineto)
    assert s.wrong == 0
    assert s.correct >= 0.97 * s.present
    paired_kineto = {y for _, y in match.pairs}
    inserted = [k for k, i in enumerate(kineto.ids) if i < 0]
    assert len(inserted) == 15 * 4
    assert all(k not in paired_kineto for k in inserted)
    inserted_roots = [u for u in match.unmatched_subtrees
                      if u.side == KINETO_SIDE and u.label == "Inserted::annotation"]
    assert len(inserted_roots) == 15 and all(u.size == 4 for u in inserted_roots)
    assert match.edit_cost >= 15 * 4 + 2 * len(relabelled)


def _chain(labels: list[str]) -> SynthTree:
    tree = SynthTree()
    at = -1
    for label in labels:
        at = tree.add(label, at)
    return tree


@pytest.mark.parametrize("max_depth", [10, 100_000])
def test_deep_chain_without_recursion_error(max_depth):
    rng = random.Random(8)
    vocabulary = [f"op_{k}" for k in range(40)]
    tree = _chain([rng.choice(vocabulary) for _ in range(5_000)])
    et = serialize(tree)
    kineto = serialize(tree, deleted=delete_random(tree, 0.05, 8))
    match = match_forests(et.forest, kineto.forest, max_depth=max_depth)
    check_contract(match, et.forest, kineto.forest)
    s = score(match, et, kineto)
    assert s.wrong <= 0.005 * s.present
    assert s.correct >= 0.97 * s.present
    identical = match_forests(et.forest, serialize(tree).forest, max_depth=max_depth)
    assert len(identical.pairs) == 5_000 and identical.edit_cost == 0


def test_max_depth_switches_deep_levels_to_order_alignment():
    tree = synthetic_tree(seed=9, iterations=2, layers=10)
    et = serialize(tree)
    kineto = serialize(tree, deleted=delete_random(tree, 0.05, 9))
    deep = match_forests(et.forest, kineto.forest, max_depth=50)
    shallow = match_forests(et.forest, kineto.forest, max_depth=1)
    assert deep.paired_by_order == 0
    assert shallow.paired_by_order > 0
    # Order alignment happens only under a pair at depth >= max_depth: nothing at depth <= 1 is an
    # order pair, so the structural counters cover at least all pairs of depth <= 1.
    depth = [0] * len(et.ids)
    for i, p in enumerate(et.forest.parent):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    top_pairs = sum(1 for x, _ in shallow.pairs if depth[x] <= 1)
    assert shallow.paired_identical + shallow.paired_aligned >= top_pairs
    for match in (deep, shallow):
        check_contract(match, et.forest, kineto.forest)
        s = score(match, et, kineto)
        assert s.wrong <= 0.005 * s.present, s
        assert s.correct >= 0.95 * s.present, s
    with pytest.raises(ValueError):
        match_forests(et.forest, kineto.forest, max_depth=-1)


def test_identical_subtrees_below_max_depth_still_pair_wholesale():
    tree = synthetic_tree(seed=10, iterations=1, layers=6)
    et = serialize(tree)
    match = match_forests(et.forest, serialize(tree).forest, max_depth=0)
    assert len(match.pairs) == len(et.ids) and match.paired_by_order == 0


def test_rejects_input_not_in_preorder():
    with pytest.raises(ValueError):
        match_forests(OrderedForest(["a", "b", "c"], [-1, 0, 5]), OrderedForest(["a"], [-1]))
    with pytest.raises(ValueError):  # node 3's parent 1 is no longer on the path after node 2
        match_forests(OrderedForest(["a", "b", "c", "d"], [-1, 0, -1, 1]), OrderedForest(["a"], [-1]))
    with pytest.raises(ValueError):
        match_forests(OrderedForest(["a", "b"], [-1]), OrderedForest(["a"], [-1]))


def test_empty_and_disjoint_forests():
    empty = OrderedForest([], [])
    some = OrderedForest(["a", "b"], [-1, 0])
    assert match_forests(empty, empty).pairs == []
    m = match_forests(some, empty)
    assert m.pairs == [] and m.edit_cost == 2
    m = match_forests(some, OrderedForest(["x", "y"], [-1, 0]))
    assert m.pairs == [] and m.edit_cost == 2 and m.kineto_span == (0, 0)


def test_deterministic():
    tree = synthetic_tree(seed=10, iterations=2, layers=10)
    et = serialize(tree)
    kineto = serialize(tree, deleted=delete_random(tree, 0.05, 10))
    assert match_forests(et.forest, kineto.forest) == match_forests(et.forest, kineto.forest)


# --------------------------------------------------------------------------------------------------
# Real trace pair (skipped when ../shared is absent)
# --------------------------------------------------------------------------------------------------

_THREAD_ROOT = "[pytorch|profiler|execution_trace|thread]"


def _attrs(node: dict) -> dict:
    return {a["name"]: a["value"] for a in node.get("attrs", [])}


def _et_thread_forest(path: Path, tid: int) -> tuple[OrderedForest, list[int]]:
    """ET forest of one thread: parent from ctrl_deps, children sorted by id; returns rf_ids."""
    with gzip.open(path) as f:
        nodes = json.load(f)["nodes"]
    mine = sorted((n for n in nodes if _attrs(n).get("tid") == tid and n["name"] != _THREAD_ROOT),
                  key=lambda n: n["id"])
    index = {n["id"]: k for k, n in enumerate(mine)}
    forest = OrderedForest([n["name"] for n in mine], [index.get(n["ctrl_deps"], -1) for n in mine])
    return forest, [_attrs(n)["rf_id"] for n in mine]


def _kineto_thread_forest(path: Path, drop_fraction: float = 0.0,
                          seed: int = 0) -> tuple[OrderedForest, list[int], int]:
    """Kineto forest of the main CPU thread (the one with most cpu_op events), nested by interval;
    ProfilerStep#* ignored; optionally a random fraction of events removed.  Returns record-function
    ids and the number of removed events."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
           and not e["name"].startswith("ProfilerStep#")]
    tids: dict = {}
    for e in ops:
        tids[e["tid"]] = tids.get(e["tid"], 0) + 1
    tid = max(tids, key=tids.get)
    ops = sorted((e for e in ops if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
    rng = random.Random(seed)
    kept = [e for e in ops if rng.random() >= drop_fraction]
    labels, parent, rf_ids, open_ends = [], [], [], []
    stack: list[int] = []
    for e in kept:
        while stack and open_ends[stack[-1]] <= e["ts"]:
            stack.pop()
        labels.append(e["name"])
        parent.append(stack[-1] if stack else -1)
        rf_ids.append(e["args"]["Record function id"])
        open_ends.append(e["ts"] + e["dur"])
        stack.append(len(labels) - 1)
    return OrderedForest(labels, parent), rf_ids, len(ops) - len(kept)


def _in_broken_leaf_run(forest: OrderedForest, rf_ids: list[int], kept: set[int], node: int) -> bool:
    """Whether node is a leaf in a run of adjacent same-label leaf siblings of which one was removed:
    which copy was removed cannot be told from structure, so its neighbours may stay unpaired."""
    children: list[int] = []
    leaf = [True] * len(forest.parent)
    for i, p in enumerate(forest.parent):
        if p >= 0:
            leaf[p] = False
        if p == forest.parent[node]:
            children.append(i)
    k = children.index(node)
    lo = hi = k
    while lo > 0 and forest.labels[children[lo - 1]] == forest.labels[node] and leaf[children[lo - 1]]:
        lo -= 1
    while (hi + 1 < len(children) and forest.labels[children[hi + 1]] == forest.labels[node]
           and leaf[children[hi + 1]]):
        hi += 1
    return leaf[node] and any(rf_ids[c] not in kept for c in children[lo:hi + 1])


def _real_pair(drop_fraction: float, seed: int):
    pair_dir = SHARED / "traces" / "torch_cpu" / "mlp_1step"
    if not pair_dir.is_dir():
        pytest.skip(shared_reason(pair_dir))
    et, et_rf = _et_thread_forest(pair_dir / "et.json.gz", tid=1)
    kineto, k_rf, removed = _kineto_thread_forest(pair_dir / "kineto.json.gz", drop_fraction, seed)
    assert len(et.labels) > 150 and (removed > 0) == (drop_fraction > 0)
    return et, et_rf, kineto, k_rf


def test_real_trace_against_record_function_ids():
    et, et_rf, kineto, k_rf = _real_pair(0.0, 0)
    match = match_forests(et, kineto)
    check_contract(match, et, kineto)
    present = len(set(et_rf) & set(k_rf))
    correct = sum(1 for x, y in match.pairs if et_rf[x] == k_rf[y])
    assert len(match.pairs) == correct
    assert correct >= 0.999 * present
    assert match.edit_cost == len(et.labels) + len(kineto.labels) - 2 * correct


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_real_trace_with_five_percent_of_kineto_events_removed(seed):
    """No wrong pair, and every present node left unpaired sits in a run of identical leaves that lost
    one copy (e.g. aten::resolve_conj under aten::mm, aten::add_ in the optimizer step), where the
    structure cannot tell which copy is gone: >= 99.9% of the determinable nodes are paired."""
    et, et_rf, kineto, k_rf = _real_pair(0.05, seed)
    match = match_forests(et, kineto)
    check_contract(match, et, kineto)
    kept = set(k_rf)
    correct = {et_rf[x] for x, y in match.pairs if et_rf[x] == k_rf[y]}
    assert len(match.pairs) == len(correct)
    et_index = {rf: x for x, rf in enumerate(et_rf)}
    missed = [rf for rf in kept if rf not in correct]
    undeterminable = [rf for rf in missed if _in_broken_leaf_run(et, et_rf, kept, et_index[rf])]
    determinable = len(kept) - len(undeterminable)
    assert len(correct) >= 0.999 * determinable, (len(correct), determinable, missed)
    assert len(correct) >= 0.95 * len(kept)

"""Method 3: approximate match by call-tree structure (``--match approximate``).

Per paired thread, the ET call tree (parent links; children in id = start order) and the Kineto
call tree (interval nesting) are matched as ordered labelled forests by ``tree_match`` (identical
subtrees by canonical hashing, alignment only where they differ). ``ProfilerStep#*`` events are
linkable but never parents, on both sides, since Kineto may record steps the ET does not nest.
Cost: near-linear in the size of the trees (see ``tree_match``).
"""

from __future__ import annotations

from dataclasses import fields

from linker.link.align import gaps_between
from linker.read.et import ExecutionTrace
from linker.link.intervals import nesting_parents
from linker.read.kineto import KinetoTrace
from linker.link.threads import OpMatch, pair_threads
from linker.link.exact import align_names, kineto_threads_in
from linker.link.tree_match import OrderedForest, match_forests

LARGEST_UNMATCHED = 10


def _is_step(name: str) -> bool:
    return name.startswith("ProfilerStep#")


def et_forest(et: ExecutionTrace, ops: list[int]) -> OrderedForest:
    """The ET call tree of one thread's ops (in id order); steps are leaves."""
    position = {i: k for k, i in enumerate(ops)}
    parent_index = et.parent_index()
    labels, parents = [], []
    path: list[int] = []  # positions of the current root-to-node path
    for k, i in enumerate(ops):
        p = parent_index[i]
        while p >= 0 and p in position and _is_step(et.names[p]):
            p = parent_index[p]
        q = position.get(p, -1)
        while path and path[-1] != q:
            path.pop()
        if not path:
            q = -1  # parent not on the current path (not pre-order in id order): a new root
        labels.append(et.names[i])
        parents.append(q)
        path.append(k)
    return OrderedForest(labels, parents)


def kineto_forest(kineto: KinetoTrace, evs: list[int], nest: list[int]) -> OrderedForest:
    """The Kineto call tree of one thread's events (in start order), from interval nesting."""
    position = {j: k for k, j in enumerate(evs)}
    events = kineto.cpu_events
    return OrderedForest([events[j].name for j in evs], [position.get(nest[j], -1) for j in evs])


def match_by_structure(et: ExecutionTrace, kineto: KinetoTrace, keep: list[bool] | None = None,
                       max_depth: int = 10) -> OpMatch:
    """Pair ET ops with Kineto events (those with ``keep[i]``, when given) by tree structure."""
    events = kineto.cpu_events
    skip = [_is_step(e.name) or (keep is not None and not keep[i]) for i, e in enumerate(events)]
    nest = nesting_parents(events, skip)
    et_threads = et.threads()
    k_threads = kineto_threads_in(kineto, keep)
    pairs, unpaired = pair_threads(et_threads, k_threads, et, kineto)
    event_of_op = [-1] * len(et)
    edit_cost = 0
    sizes = [0, 0]
    unmatched = []
    counters: dict[str, int] = {}  # tree_match's own counters (pairs by kind, DP cells, ...), summed
    for pair in pairs:
        ops, evs = et_threads[pair.et_tid], k_threads[pair.kineto_thread]
        result = match_forests(et_forest(et, ops), kineto_forest(kineto, evs, nest), max_depth)
        for a, b in result.pairs:
            event_of_op[ops[a]] = evs[b]
        pair.linked = len(result.pairs)
        edit_cost += result.edit_cost
        sizes[0] += result.tree_nodes[0]
        sizes[1] += result.tree_nodes[1]
        for f in fields(result):
            value = getattr(result, f.name)
            if type(value) is int and f.name != "edit_cost":
                counters[f.name] = counters.get(f.name, 0) + value
        for sub in result.unmatched_subtrees[:LARGEST_UNMATCHED]:
            unmatched.append({"side": sub.side, "thread": pair.et_tid if sub.side == "et" else list(pair.kineto_thread),
                              "name": sub.label, "size": sub.size})
    settled = settle_children(et, kineto, event_of_op, nest, keep)
    unmatched.sort(key=lambda u: -u["size"])
    match = OpMatch("approximate", event_of_op, pairs, unpaired)
    match.stats = {"max_depth": max_depth, "edit_cost": edit_cost, "tree_nodes": {"et": sizes[0], "kineto": sizes[1]},
                   "largest_unmatched_subtrees": unmatched[:LARGEST_UNMATCHED],
                   "paired_by_children_shapes": settled, **counters}
    match.notes.append(f"structural match: {edit_cost} tree edits (ops inserted, deleted or renamed to "
                       f"align the call trees) over {sizes[0]} ET / {sizes[1]} Kineto nodes")
    if unpaired:
        match.notes.append(f"ET threads {unpaired} have no Kineto counterpart")
    return match


def settle_children(et: ExecutionTrace, kineto: KinetoTrace, event_of_op: list[int],
                    nest: list[int], keep: list[bool] | None) -> int:
    """Second pass: under each matched pair, align the still-unmatched children of the two sides
    between their matched siblings, by name and input shapes (``link.exact.align_names``).

    Tree matching sees names only; in a run of same-name siblings with one copy missing it rightly
    leaves the run unmatched. Shapes often tell those siblings apart. Parents are visited before
    children (id order), so a newly matched child's children are settled in turn. O(n) plus the
    shapes decoded for the ops in gaps. Returns how many pairs it added.
    """
    parent_index = et.parent_index()
    et_children: dict[int, list[int]] = {}
    for i in sorted(range(len(et)), key=et.ids.__getitem__):
        p = parent_index[i]
        if p >= 0 and not et.is_root(i):
            et_children.setdefault(p, []).append(i)
    k_children: dict[int, list[int]] = {}
    for j, p in enumerate(nest):
        if p >= 0 and (keep is None or keep[j]):
            k_children.setdefault(p, []).append(j)
    used = {e for e in event_of_op if e >= 0}
    added = 0
    for i in sorted(range(len(et)), key=et.ids.__getitem__):
        e = event_of_op[i]
        if e < 0 or i not in et_children or e not in k_children:
            continue
        kids_et, kids_k = et_children[i], k_children[e]
        position = {j: y for y, j in enumerate(kids_k)}
        anchors = [(x, position[event_of_op[c]]) for x, c in enumerate(kids_et)
                   if event_of_op[c] in position]
        for x_lo, x_hi, y_lo, y_hi in gaps_between(anchors, len(kids_et), len(kids_k)):
            gap_et = [c for c in kids_et[x_lo:x_hi] if event_of_op[c] < 0]
            gap_k = [j for j in kids_k[y_lo:y_hi] if j not in used]
            if gap_et and gap_k:
                for a, b in align_names(et, kineto, gap_et, gap_k):
                    event_of_op[gap_et[a]] = gap_k[b]
                    used.add(gap_k[b])
                    added += 1
    return added

"""``sim.graph.resolve_dependencies`` (the replay graph's predecessors from the dependency ids a
reader collected) against the rule written as a plain loop over the nodes, here: each id once in
the order of its first mention, a missing id recorded once, a "parent" cause giving way to a
later mention's data cause, causes numbered by first occurrence up to 256 names."""

from __future__ import annotations

import random
from array import array

import pytest

from linker.sim.graph import GraphBuilder, resolve_dependencies


def expected(ids: list[int], dep_ids: list[list[int]], dep_causes: dict[int, list[str]]):
    """The rule, one node and one mention at a time."""
    index = {}
    for u, node_id in enumerate(ids):
        if node_id in index:
            raise ValueError(f"node id {node_id} appears twice")
        index[node_id] = u
    offsets, nodes, missing, codes, names = [0], [], [], [], {"": 0}
    for u, deps in enumerate(dep_ids):
        if u in dep_causes:
            kept: dict[int, str] = {}
            for d, cause in zip(deps, dep_causes[u]):
                if d not in kept:
                    kept[d] = cause
                elif kept[d] == "parent" and cause not in ("", "parent"):
                    kept[d] = cause
        else:
            kept = dict.fromkeys(deps, "")
        for d, cause in kept.items():
            if d not in index:
                missing.append((u, d))
                continue
            nodes.append(index[d])
            if cause not in names and len(names) < 256:
                names[cause] = len(names)
            codes.append(names.get(cause, 0))
        offsets.append(len(nodes))
    if not dep_causes:
        codes, names = [], {"": 0}
    return offsets, nodes, missing, codes, list(names)


def resolved(ids, dep_ids, dep_causes):
    offsets, nodes, missing, codes, names = resolve_dependencies(array("q", ids), dep_ids, dep_causes)
    return list(offsets), list(nodes), missing, list(codes), names


def random_graph(rng: random.Random, n: int, with_causes: bool, cause_pool: list[str]):
    ids = rng.sample(range(-5, 4 * n), n)
    names_to_pick = ids + [4 * n + k for k in range(5)]  # some ids name no node
    dep_ids = [[rng.choice(names_to_pick) for _ in range(rng.randint(0, 5))] for _ in range(n)]
    dep_causes = {}
    if with_causes:
        for u, deps in enumerate(dep_ids):
            if rng.random() < 0.8:  # some nodes give no causes; some give fewer than their ids
                k = len(deps) - (rng.random() < 0.1)
                dep_causes[u] = [rng.choice(cause_pool) for _ in range(max(k, 0))]
    return ids, dep_ids, dep_causes


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_follow_the_rule(seed):
    rng = random.Random(seed)
    pool = ["parent", "parent", "", "thread_order", "launch", "stream_order", "sync"]
    ids, dep_ids, dep_causes = random_graph(rng, rng.randint(1, 60), seed % 4 != 0, pool)
    assert resolved(ids, dep_ids, dep_causes) == expected(ids, dep_ids, dep_causes)


def test_parent_gives_way_to_a_later_data_cause_only():
    ids = [10, 11, 12, 13]
    dep_ids = [[], [10, 10, 10], [10, 11, 10, 11], [12, 12, 11, 11]]
    dep_causes = {1: ["parent", "", "launch"], 2: ["thread_order", "parent", "parent", "sync"],
                  3: ["", "launch", "parent", "parent"]}
    offsets, nodes, missing, codes, names = resolved(ids, dep_ids, dep_causes)
    assert (offsets, nodes, missing) == ([0, 0, 1, 3, 5], [0, 0, 1, 2, 1], [])
    # 10 after "parent", "": "launch"; 10 after "thread_order": kept; 11 after "parent": "sync";
    # 12 after "": kept, whatever follows; 11 after "parent", "parent": "parent"
    assert [names[c] for c in codes] == ["launch", "thread_order", "sync", "", "parent"]


def test_past_256_causes_the_rest_share_code_0():
    ids = list(range(300))
    dep_ids = [[] if u == 0 else [u - 1] for u in ids]
    dep_causes = {u: [f"cause{u}"] for u in range(1, 300)}
    offsets, nodes, missing, codes, names = resolved(ids, dep_ids, dep_causes)
    assert len(names) == 256 and names[1] == "cause1" and names[255] == "cause255"
    assert codes[:255] == list(range(1, 256)) and set(codes[255:]) == {0}
    assert (offsets, nodes, missing, codes, names) == expected(ids, dep_ids, dep_causes)


def test_an_id_past_64_bits_is_missing_once():
    big = 1 << 64
    ids = [1, 2]
    dep_ids = [[big, 2, big], [1, big + 1]]
    offsets, nodes, missing, codes, names = resolved(ids, dep_ids, {})
    assert (offsets, nodes, missing, codes) == ([0, 1, 2], [1, 0], [(0, big), (1, big + 1)], [])


def test_a_repeated_node_id_is_named():
    with pytest.raises(ValueError, match="node id 7 appears twice"):
        resolve_dependencies(array("q", [5, 7, 9, 7, 5]), [[], [], [], [], []], {})
    builder = GraphBuilder("x")
    for node_id in (3, 4, 4):
        builder.add(node_id, "op", 0, 1.0, 0.0, 1.0, ("cpu", 0), [3])
    with pytest.raises(ValueError, match="node id 4 appears twice"):
        builder.finish()

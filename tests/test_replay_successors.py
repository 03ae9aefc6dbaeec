"""The replay's successor lists (``sim.engine._successors``) against the rule written as a plain loop:
node d's successors are the nodes that list d among their dependencies, in node order, numbered
globally over the ranks; a node's indegree is its dependencies plus one per dependency missing from
its file (never satisfied)."""

from __future__ import annotations

import random
from array import array
from itertools import accumulate
from types import SimpleNamespace

import pytest

from conftest import FIXTURES, linked_rank
from linker.sim.engine import _successors, node_offsets, replay
from linker.sim.load import load_graph


def expected(graphs, offsets, total):
    successors: list[list[int]] = [[] for _ in range(total)]
    indegree = [0] * total
    missing = bytearray(total)
    for graph, base in zip(graphs, offsets):
        starts, nodes = list(graph.dep_offsets), list(graph.dep_nodes)
        for u in range(len(starts) - 1):
            for k in range(starts[u], starts[u + 1]):
                successors[base + nodes[k]].append(base + u)
            indegree[base + u] = starts[u + 1] - starts[u]
        for u, _ in graph.missing_deps:
            missing[base + u] = 1
            indegree[base + u] += 1
    csr = list(accumulate((len(s) for s in successors), initial=0))
    return csr, [v for s in successors for v in s], indegree, missing


def random_graph(rng: random.Random, n: int) -> SimpleNamespace:
    """What ``_successors`` reads of a ``SimGraph``: its dependency CSR and missing dependencies."""
    starts, nodes = [0], []
    for u in range(n):
        deps = rng.sample(range(n), rng.randint(0, min(n, 4)))  # distinct, in any order; cycles do not matter here
        nodes += [d for d in deps if d != u]
        starts.append(len(nodes))
    missing = [(u, 10**6 + u) for u in range(n) if rng.random() < 0.1]
    missing += missing[:1]  # a node missing two dependencies
    return SimpleNamespace(dep_offsets=array("q", starts), dep_nodes=array("q", nodes), missing_deps=missing,
                           size=n)


@pytest.mark.parametrize("seed", range(30))
def test_random_ranks_follow_the_rule(seed):
    rng = random.Random(seed)
    graphs = [random_graph(rng, rng.randint(0, 40)) for _ in range(rng.randint(1, 4))]
    offsets = list(accumulate((g.size for g in graphs[:-1]), initial=0))
    total = sum(g.size for g in graphs)
    csr, targets, indegree, missing = _successors(graphs, offsets, total)
    assert (list(csr), list(targets), list(indegree), missing) == expected(graphs, offsets, total)
    assert isinstance(csr, array) and isinstance(targets, array) and isinstance(indegree, array)


def test_real_ranks_follow_the_rule(tmp_path):
    """Two ranks of a captured DDP job over gloo (collectives matched across them), linked and read
    back: the successors are the rule's, and the job replays to its end."""
    job = FIXTURES / "ddp_gloo"
    graphs = [load_graph(linked_rank(tmp_path, job, rank)) for rank in (0, 1)]
    offsets = node_offsets(graphs)
    total = sum(map(len, graphs))
    assert offsets == [0, len(graphs[0])] and sum(len(g.dep_nodes) for g in graphs) > total
    got = _successors(graphs, offsets, total)
    assert (list(got[0]), list(got[1]), list(got[2]), got[3]) == expected(graphs, offsets, total)
    assert replay(graphs).queued == []

"""The critical path of a replay: the chain of nodes whose ends set each other's starts up to the
simulated end, and the ops that take most time on it.

Every node started because of one thing the replay recorded (``Replay.cause``): its last
dependency to finish, the node before it on its unit (a resource wait), or — for a collective —
what made its last-arriving member arrive (a wait for a peer rank). Following causes back from the
node that ends last gives a chain that tiles the whole simulated time: each link starts when the
previous one ends. Cost: O(length of the path) to walk, O(path) to aggregate.
"""

from __future__ import annotations

from dataclasses import dataclass

from .engine import CAUSE_PEER, NO_NODE, Replay
from .graph import KIND_NAMES


@dataclass
class PathStep:
    """One node on the critical path (global node number), when it ran, and why it started then
    (``via``: "start", "dependency", "unit" (waited for its resource), "peer" (waited for
    ``peer_rank`` to reach the collective))."""

    node: int
    start: float
    end: float
    via: str
    peer_rank: int | None = None


@dataclass
class CriticalOp:
    """Time an op name (of one kind) spends on the critical path, over ``count`` occurrences."""

    name: str
    kind: str
    us: float
    count: int


_VIA = ("start", "dependency", "unit", "peer")


def last_node(rp: Replay) -> int:
    """The node that finishes last (-1 when nothing finished). O(n)."""
    best, best_end = NO_NODE, -1.0
    for u, e in enumerate(rp.end):
        if e == e and e >= best_end:
            best, best_end = u, e
    return best


def critical_path(rp: Replay) -> list[PathStep]:
    """The chain from time 0 to the simulated end, first node first."""
    steps: list[PathStep] = []
    u = last_node(rp)
    guard = rp.node_count
    while u != NO_NODE and guard > 0:
        guard -= 1
        kind = rp.cause_kind[u]
        peer_rank = None
        if kind == CAUSE_PEER:
            peer_rank = rp.graphs[rp.rank_of(rp.peer[u])].rank
        steps.append(PathStep(u, rp.start[u], rp.end[u], _VIA[kind], peer_rank))
        u = rp.cause[u]
    steps.reverse()
    return steps


def top_ops(rp: Replay, path: list[PathStep], limit: int = 10) -> list[CriticalOp]:
    """Op names by their time on the path (end - start of each occurrence), largest first."""
    totals: dict[tuple[str, str], CriticalOp] = {}
    for step in path:
        graph, local = rp.local(step.node)
        key = (graph.names[local], KIND_NAMES[graph.kind[local]])
        op = totals.get(key)
        if op is None:
            op = totals[key] = CriticalOp(key[0], key[1], 0.0, 0)
        op.us += step.end - step.start
        op.count += 1
    return sorted(totals.values(), key=lambda op: (-op.us, op.name))[:limit]


def time_by_kind(rp: Replay, path: list[PathStep]) -> dict[str, float]:
    """Time on the path per kind of node ("cpu", "gpu", "comm", "metadata")."""
    totals = {name: 0.0 for name in KIND_NAMES}
    for step in path:
        graph, local = rp.local(step.node)
        totals[KIND_NAMES[graph.kind[local]]] += step.end - step.start
    return totals

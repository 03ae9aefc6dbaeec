"""The critical path of a replay: the chain of nodes whose ends set each other's starts up to the
simulated end, and the ops that take most time on it.

Every node started because of one thing the replay recorded (``Replay.cause``): its last
dependency to finish, the node before it on its unit (a resource wait), or — for a collective —
what made its last-arriving member arrive (a wait for a peer rank). Following causes back from the
node that ends last gives a chain that tiles the whole simulated time: each link starts when the
previous one ends, or, for a node the replay held back by a measured wait (``Replay.holds``),
that wait later (the wait is counted as such: ``WAIT``, by its cause). Cost: O(length of the path) to walk, O(path) to aggregate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from linker.sim.engine import CAUSE_DEPENDENCY, CAUSE_PEER, NO_NODE, Replay
from linker.sim.graph import KIND_NAMES, SimGraph


@dataclass(slots=True)
class PathStep:
    """One node on the critical path (global node number), when it ran, and why it started then
    (``via``: "start", "dependency", "unit" (waited for its resource), "peer" (waited for
    ``peer_rank`` to reach the collective))."""

    node: int
    start: float
    end: float
    via: str
    peer_rank: int | None = None
    link: str = ""  # for "dependency": the edge's cause from the file ("parent", "launch"...), if known
    graph: SimGraph | None = None  # the node's rank graph ...
    local: int = -1  # ... and its number there
    held: float = 0.0  # µs it was held back after its cause ended: a measured wait (``Replay.holds``)
    held_cause: str = ""  # that wait's cause (``unheld.WAIT_CAUSES``)


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
        if not math.isnan(e) and e >= best_end:
            best, best_end = u, e
    return best


def critical_path(rp: Replay) -> list[PathStep]:
    """The chain from time 0 to the simulated end, first node first."""
    nodes: list[int] = []
    u = last_node(rp)
    cause = rp.cause
    guard = rp.node_count
    while u != NO_NODE and guard > 0:  # causes end before their node starts: no loop, the guard is a fuse
        guard -= 1
        nodes.append(u)
        u = cause[u]
    nodes.reverse()
    start, end, cause_kind = rp.start, rp.end, rp.cause_kind
    if len(rp.graphs) == 1:  # one rank: global numbers are local ones
        only = rp.graphs[0]
        steps = [PathStep(u, start[u], end[u], _VIA[cause_kind[u]], None, "", only, u) for u in nodes]
    else:
        steps = [PathStep(u, start[u], end[u], _VIA[cause_kind[u]], None, "", *rp.local(u)) for u in nodes]
    for step in steps:
        kind = cause_kind[step.node]
        if kind == CAUSE_DEPENDENCY:
            if step.graph.dep_cause:
                step.link = step.graph.edge_cause(step.local, cause[step.node] - (step.node - step.local))
        elif kind == CAUSE_PEER:
            step.peer_rank = rp.graphs[rp.rank_of(rp.peer[step.node])].rank
        if step.local in step.graph.wait_nodes:  # a wait node of the file: its own time is the wait (``wait_us``)
            continue
        hold = rp.holds.get(step.node)
        if hold and kind == CAUSE_DEPENDENCY:  # the wait lies between its cause's end and its start
            held = step.start - end[cause[step.node]]
            if held > 0:  # none where the replay already ran late enough
                step.held, step.held_cause = held, hold[1]
    return steps


@dataclass
class PathLink:
    """How the critical path continues into its nodes: ``link`` is "start", "unit" (waited for its
    resource), "peer" (waited for another rank at a collective), or the dependency's cause
    ("parent", "thread_order", "launch"..., "dependency" when the file gives none); ``us`` is the
    time of the nodes entered that way."""

    link: str
    count: int
    us: float


def path_links(path: list[PathStep]) -> list[PathLink]:
    """The path's links by kind, largest time first."""
    totals: dict[str, PathLink] = {}
    for step in path:
        name = step.link or step.via
        entry = totals.get(name)
        if entry is None:
            entry = totals[name] = PathLink(name, 0, 0.0)
        entry.count += 1
        entry.us += step.end - step.start
    return sorted(totals.values(), key=lambda link: (-link.us, link.link))


HOST = "host"  # the kind of the host time between ops (Python), counted apart from every op
HOST_TIME = "(host time between ops)"
WAIT = "wait"  # the kind of a measured wait the graph does not explain (``Replay.holds``)


def wait_us(step: PathStep) -> float:
    """The measured wait a step of the path holds: the hold before it (``PathStep.held``), or, for a
    wait node of the file (``SimGraph.wait_nodes``), its own time."""
    return step.end - step.start if step.local in step.graph.wait_nodes else step.held


def wait_name(cause: str) -> str:
    """The critical path's row for the measured waits of one cause."""
    return f"(measured wait: {cause})"


def _op_and_host(step: PathStep) -> tuple[float, float]:
    """The step's time on the path, split into its op's own time and the host time between ops
    folded into its node (``SimGraph.op_us``)."""
    us = step.end - step.start
    own = step.graph.op_us(step.local, us)
    return own, us - own


def top_ops(rp: Replay, path: list[PathStep], limit: int = 10) -> list[CriticalOp]:
    """Op names by their time on the path (end - start of each node, its later pieces included),
    largest first; ``count`` counts ops, not their pieces. The host time between ops folded into
    a node (Python between ops: ``SimGraph.host_gap``) is no op's: it is summed as ``HOST_TIME``."""
    totals: dict[tuple[str, str], list] = {}
    host = 0.0
    for step in path:
        graph, i = step.graph, step.local
        own, gap = _op_and_host(step)
        host += gap
        if step.held > 0 or i in graph.wait_nodes:
            waited = totals.setdefault((wait_name(graph.wait_nodes.get(i, step.held_cause)), WAIT), [0.0, 0])
            waited[0] += wait_us(step)
            waited[1] += 1
        if i in graph.wait_nodes:  # a wait node is its wait, counted above, and no op
            continue
        key = (graph.names[i], KIND_NAMES[graph.kind[i]])
        entry = totals.get(key)
        if entry is None:
            entry = totals[key] = [0.0, 0]
        entry[0] += own
        entry[1] += i not in graph.continues
    if host > 0:
        totals[(HOST_TIME, HOST)] = [host, 0]
    ops = [CriticalOp(name, kind, us, count) for (name, kind), (us, count) in totals.items()]
    return sorted(ops, key=lambda op: (-op.us, op.name))[:limit]


def time_by_kind(rp: Replay, path: list[PathStep]) -> dict[str, float]:
    """Time on the path per kind of node ("cpu", "gpu", "comm", "metadata"), ``HOST`` (the host
    time between ops folded into CPU nodes, taken out of "cpu") and ``WAIT`` (measured waits)."""
    totals = [0.0] * len(KIND_NAMES)
    host = held = 0.0
    for step in path:
        held += wait_us(step)
        if step.local in step.graph.wait_nodes:  # all of it the wait
            continue
        own, gap = _op_and_host(step)
        totals[step.graph.kind[step.local]] += own
        host += gap
    kinds = dict(zip(KIND_NAMES, totals))
    if host > 0:
        kinds[HOST] = host
    if held > 0:
        kinds[WAIT] = held
    return kinds

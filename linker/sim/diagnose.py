"""Why nodes never ran, after a replay ended with work left (a stuck graph or a stalled job).

Root causes, each found directly: a dependency on an id absent from the file; a collective (or
send/recv) that some members issued and others never reached (a *stall*: it holds the issuing
ranks' units forever); a ready node queued behind such a unit. Every other node that never ran waits
(transitively) for one of these — found by one walk along successors — or lies in or after a
dependency cycle (an example cycle is extracted by walking predecessors). Cost: O(n + e).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from linker.sim.engine import Replay
from linker.sim.graph import comm_type_name

MISSING_DEPENDENCY = "missing dependency"
STALLED_COLLECTIVE = "stalled collective"
QUEUED = "queued behind a stalled collective"
BLOCKED = "waits for a node that never ran"
CYCLE = "in or after a dependency cycle"


@dataclass
class NeverRan:
    """A node that never finished: ``reason`` (one of the constants above), ``blocker`` (global node
    of the root cause for BLOCKED/QUEUED, else -1), ``detail`` (e.g. the missing id)."""

    node: int
    reason: str
    blocker: int = -1
    detail: str = ""


@dataclass
class Stall:
    """A communication group that cannot complete: who reached it and who did not, and why."""

    process_group: str
    index: int
    comm_type: str
    arrived_ranks: list[int]
    missing: list[tuple[int, str]]  # (rank, why it did not arrive)
    nodes: list[int]  # member nodes present (global)
    hint: str = ""  # the process group's first collective-type disagreement between ranks, if any


@dataclass
class Diagnosis:
    never_ran: list[NeverRan] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    cycle_example: list[int] = field(default_factory=list)  # global nodes of one cycle

    @property
    def never_issued(self) -> list[NeverRan]:
        """Nodes never issued at all (stalled collective members were issued, so they are excluded)."""
        return [item for item in self.never_ran if item.reason != STALLED_COLLECTIVE]


def diagnose(rp: Replay) -> Diagnosis:
    """Explain every node that never finished. Empty when the replay completed."""
    total = rp.node_count
    end = rp.end
    unfinished = [u for u in range(total) if math.isnan(end[u])]
    result = Diagnosis()
    if not unfinished:
        return result
    reason: dict[int, NeverRan] = {}
    roots: list[int] = []
    absent_of: dict[int, dict[int, list[str]]] = {}  # per graph: node -> the absent ids it names
    for u in unfinished:
        if rp.missing[u]:
            graph, local = rp.local(u)
            by_node = absent_of.get(id(graph))
            if by_node is None:
                by_node = absent_of[id(graph)] = {}
                for v, d in graph.missing_deps:
                    by_node.setdefault(v, []).append(str(d))
            ids = by_node.get(local, [])[:3]
            reason[u] = NeverRan(u, MISSING_DEPENDENCY, -1, "depends on absent id " + ", ".join(ids))
            roots.append(u)
        elif not math.isnan(rp.issue[u]):
            reason[u] = NeverRan(u, STALLED_COLLECTIVE)
            roots.append(u)
    holders = {rp.unit_of[u]: u for u in unfinished if not math.isnan(rp.issue[u])}
    for u in rp.queued:
        if u not in reason:
            reason[u] = NeverRan(u, QUEUED, holders.get(rp.unit_of[u], -1))
            roots.append(u)
    _propagate(rp, roots, reason)
    left = [u for u in unfinished if u not in reason]
    for u in left:
        reason[u] = NeverRan(u, CYCLE)
    if left:
        result.cycle_example = _find_cycle(rp, left[0], set(left))
    result.never_ran = [reason[u] for u in unfinished]
    result.stalls = _stalls(rp, reason)
    return result


def _propagate(rp: Replay, roots: list[int], reason: dict[int, NeverRan]) -> None:
    """Mark every unfinished node downstream of a root as BLOCKED by that root. O(n + e)."""
    successors = _successor_lists(rp)
    queue = deque((u, u if reason[u].reason != QUEUED else reason[u].blocker) for u in roots)
    while queue:
        u, root = queue.popleft()
        for v in successors.get(u, ()):
            if v not in reason and math.isnan(rp.end[v]):
                reason[v] = NeverRan(v, BLOCKED, root)
                queue.append((v, root))


def _successor_lists(rp: Replay) -> dict[int, list[int]]:
    """Successors of unfinished nodes only (the stuck part of the graph)."""
    successors: dict[int, list[int]] = {}
    for graph, base in zip(rp.graphs, rp.offsets):
        offs, nodes = graph.dep_offsets, graph.dep_nodes
        for u in range(len(graph)):
            if math.isnan(rp.end[base + u]):
                for k in range(offs[u], offs[u + 1]):
                    successors.setdefault(base + nodes[k], []).append(base + u)
    return successors


def _find_cycle(rp: Replay, u: int, stuck: set[int]) -> list[int]:
    """Walk predecessors inside ``stuck`` (each has one there) until a node repeats; the repeated
    stretch is a cycle. O(nodes walked)."""
    seen: dict[int, int] = {}
    walk: list[int] = []
    while u not in seen:
        seen[u] = len(walk)
        walk.append(u)
        graph, local = rp.local(u)
        base = u - local
        nxt = next((base + d for d in graph.deps_of(local) if base + d in stuck), None)
        if nxt is None:
            return []
        u = nxt
    cycle = walk[seen[u]:]
    cycle.reverse()
    return cycle


def _stalls(rp: Replay, reason: dict[int, NeverRan]) -> list[Stall]:
    groups = rp.groups
    stalls = []
    counts = _collective_counts(rp)
    for g, members in enumerate(groups.members):
        arrived = [u for u in members if not math.isnan(rp.issue[u]) and math.isnan(rp.end[u])]
        if not arrived:
            continue
        pg, index = groups.label[g]
        present = {rp.graphs[rp.rank_of(u)].rank: u for u in members}
        arrived_ranks = sorted(rp.graphs[rp.rank_of(u)].rank for u in arrived)
        missing = []
        for rank in groups.member_ranks[g]:
            if rank in arrived_ranks:
                continue
            u = present.get(rank)
            if u is None:
                where = f"process group {pg}" if not pg.startswith("p2p") else pg
                missing.append((rank, f"it holds only {counts.get((pg, rank), 0)} collectives on {where}"))
            else:
                graph, local = rp.local(u)
                why = reason.get(u)
                missing.append((rank, f"its node {graph.ids[local]} ({graph.names[local]}) never issued: "
                                      f"{why.reason if why else 'unknown'}"))
        first_graph, first_local = rp.local(members[0])
        info = first_graph.comm.get(first_local)
        stalls.append(Stall(pg, index, comm_type_name(info.comm_type) if info else "UNKNOWN", arrived_ranks,
                            missing, list(members), groups.type_mismatch.get(pg, "")))
    return stalls


def _collective_counts(rp: Replay) -> dict[tuple[str, int], int]:
    """(group label, rank) -> how many of that label's groups the rank holds a node in. O(c)."""
    counts: dict[tuple[str, int], int] = {}
    for g, members in enumerate(rp.groups.members):
        pg = rp.groups.label[g][0]
        for u in members:
            key = (pg, rp.graphs[rp.rank_of(u)].rank)
            counts[key] = counts.get(key, 0) + 1
    return counts

"""The dependency-graph checks both formats share: node ids unique, every dependency names a node
of the file (the ET process root may name itself as parent), no cycle (the nodes on one named).
Cost: O(nodes + deps) time and memory.
"""

from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from linker.write.validate.report import ViolationLog

NO_EDGE = -1


@dataclass
class DependencyTable:
    """Node ids in file order and their dependencies, flat: node ``i``'s deps are
    ``dep_ids[dep_starts[i]:dep_starts[i+1]]``, its ``ctrl_counts[i]`` ctrl deps (parents) first,
    then its data deps. ``self_reference_ok`` holds the positions allowed to name themselves as
    parent (the ET process root). Memory: 8 bytes per dependency + 20 per node."""

    typecode: str = "Q"
    node_ids: array = field(init=False)
    dep_starts: array = field(init=False)
    dep_ids: array = field(init=False)
    ctrl_counts: array = field(default_factory=lambda: array("I"))
    self_reference_ok: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.node_ids = array(self.typecode)
        self.dep_starts = array("Q", [0])
        self.dep_ids = array(self.typecode)

    def add_node(self, node_id: int, ctrl_deps: Sequence[int], data_deps: Sequence[int]) -> None:
        """Append one node (O(#deps)). Ids must fit the table's typecode."""
        self.node_ids.append(node_id)
        self.dep_ids.extend(ctrl_deps)
        self.dep_ids.extend(data_deps)
        self.ctrl_counts.append(len(ctrl_deps))
        self.dep_starts.append(len(self.dep_ids))

    def is_data_dep(self, position: int, k: int) -> bool:
        """Whether dependency ``k`` (an index into ``dep_ids``) of node ``position`` is a data dep."""
        return k - self.dep_starts[position] >= self.ctrl_counts[position]

    def __len__(self) -> int:
        return len(self.node_ids)


def check_dependency_graph(table: DependencyTable, log: ViolationLog, ctrl_kind: str = "dangling_ctrl_dep",
                           file_order: bool = False) -> None:
    """Report duplicate ids, dangling dependencies (``ctrl_kind`` for ctrl deps) and cycles; with
    ``file_order`` (a ``.et``: et-link writes a topological order, docs/formats.md), each
    dependency written after the node that has it, as a warning.

    A graph whose edges all point the same way in file order is acyclic (checked first); otherwise
    Kahn's algorithm finds the nodes on or behind a cycle and a walk over their dependencies names
    node-disjoint cycles. Cost: O(nodes + deps) time and memory.
    """
    index = _index_ids(table, log)
    owners = _dependency_owners(table)
    sources = _dependency_sources(table, index, owners, log, ctrl_kind)
    if NO_EDGE in sources:
        owners = [owner for source, owner in zip(sources, owners) if source != NO_EDGE]
        sources = [source for source in sources if source != NO_EDGE]
    forward = all(source < owner for source, owner in zip(sources, owners))
    if file_order and not forward:
        for source, owner in zip(sources, owners):
            if source > owner:
                log.add("dependency_written_later", table.node_ids[owner],
                        f"depends on {table.node_ids[source]}, written {source - owner:,} node(s) later")
    if forward or all(source > owner for source, owner in zip(sources, owners)):
        return
    unprocessed = _kahn_unprocessed(len(table), sources, owners)
    if not unprocessed:
        return
    for number, cycle in enumerate(_find_cycles(table, index, unprocessed)):
        ids = [table.node_ids[position] for position in cycle]
        path = " -> ".join(map(str, ids + [ids[0]])) if len(ids) <= 8 else " -> ".join(map(str, ids[:8])) + " -> ..."
        note = f"; {len(unprocessed):,} nodes on or behind a cycle can never run" if number == 0 else ""
        log.add("cycle", ids[0], f"cycle of {len(ids)}: {path}{note}")


def _index_ids(table: DependencyTable, log: ViolationLog) -> dict[int, int]:
    """id -> position of its first node; duplicates reported. O(nodes)."""
    index = dict(zip(table.node_ids, range(len(table.node_ids))))
    if len(index) == len(table.node_ids):
        return index
    index = {}
    for position, node_id in enumerate(table.node_ids):
        first = index.setdefault(node_id, position)
        if first != position:
            log.add("duplicate_id", node_id, f"node #{position} repeats the id of node #{first}")
    return index


def _dependency_owners(table: DependencyTable) -> list[int]:
    """For each dependency, the position of the node that has it. O(deps)."""
    starts = table.dep_starts
    return [position for position in range(len(starts) - 1) for _ in range(starts[position + 1] - starts[position])]


def _dependency_sources(
    table: DependencyTable, index: dict[int, int], owners: list[int], log: ViolationLog, ctrl_kind: str
) -> list[int]:
    """For each dependency, the position of the node it names; NO_EDGE when that node is missing
    (reported) or for the process root's allowed reference to itself. O(deps)."""
    sources = [index.get(dep_id, NO_EDGE) for dep_id in table.dep_ids]
    if NO_EDGE in sources:
        for k, source in enumerate(sources):
            if source == NO_EDGE:
                kind = "dangling_data_dep" if table.is_data_dep(owners[k], k) else ctrl_kind
                owner_id = table.node_ids[owners[k]]
                log.add(kind, owner_id, f"depends on {table.dep_ids[k]}, which is not in the file")
    for position in table.self_reference_ok:
        for k in range(table.dep_starts[position], table.dep_starts[position + 1]):
            if sources[k] == position and not table.is_data_dep(position, k):
                sources[k] = NO_EDGE
    return sources


def _kahn_unprocessed(node_count: int, sources: list[int], targets: list[int]) -> set[int]:
    """Positions never reaching in-degree 0 (on or behind a cycle). O(nodes + edges)."""
    in_degree = [0] * node_count
    out_count = [0] * (node_count + 1)
    for source, target in zip(sources, targets):
        in_degree[target] += 1
        out_count[source + 1] += 1
    out_start = list(itertools.accumulate(out_count))
    successors = [0] * len(sources)
    fill = out_start[:]
    for source, target in zip(sources, targets):
        successors[fill[source]] = target
        fill[source] += 1
    ready = [position for position, degree in enumerate(in_degree) if not degree]
    done = 0
    while ready:
        position = ready.pop()
        done += 1
        for successor in successors[out_start[position] : out_start[position + 1]]:
            in_degree[successor] -= 1
            if not in_degree[successor]:
                ready.append(successor)
    if done == node_count:
        return set()
    return {position for position, degree in enumerate(in_degree) if degree}


def _find_cycles(table: DependencyTable, index: dict[int, int], unprocessed: set[int]) -> Iterator[list[int]]:
    """Yield node-disjoint cycles (positions in dependency order: each depends on the previous).

    Every unprocessed node has an unprocessed dependency, so a walk along dependencies from one
    must revisit a node: if first seen in this walk, the walk's tail from there is a new cycle;
    if seen in an earlier walk, that walk already reported the cycle ahead. Each node is walked
    at most once: O(nodes + deps) in all.
    """
    walk_of: dict[int, int] = {}
    for walk_number, start in enumerate(sorted(unprocessed)):
        if start in walk_of:
            continue
        walk: list[int] = []
        position = start
        while position not in walk_of:
            walk_of[position] = walk_number
            walk.append(position)
            position = _unprocessed_dependency(table, index, unprocessed, position)
        if walk_of[position] == walk_number:
            cycle = walk[walk.index(position) :]
            cycle.reverse()
            yield cycle


def _unprocessed_dependency(table: DependencyTable, index: dict[int, int], unprocessed: set[int], position: int) -> int:
    for k in range(table.dep_starts[position], table.dep_starts[position + 1]):
        source = index.get(table.dep_ids[k])
        if source is None or source not in unprocessed:
            continue
        if source == position and position in table.self_reference_ok and not table.is_data_dep(position, k):
            continue
        return source
    raise AssertionError("unprocessed node without an unprocessed dependency")  # pragma: no cover


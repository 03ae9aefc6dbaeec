"""CPU collectives as ASTRA-sim needs them: a meeting of the ranks, then each rank's measured time.

ASTRA-sim times a collective from the network configuration and its ``comm_size``, never from
``duration_micros``. A GPU collective's measured transfer is close to a property of the network,
and ``sim.network_fit`` finds the one network that reproduces them. A CPU backend's collective
(gloo, MPI, UCC) is not: its time is set by the host — workers woken late, ranks' processes
sharing cores — and one job's all-reduces of one bucket measured 4 to 32 ms, each rank ending at
its own time. No network gives each its time, and ASTRA-sim's ring lets a rank that arrived early
run its first steps before the last one arrives (a rank's end after the last arrival depends on
its place in the ring), which a replay of measured times does not. So the workload copies
ASTRA-sim reads (``astra/workload.<rank>.et``; the job's own ``.et`` files are unchanged) write each
CPU collective as what ``et-link simulate``'s job replay (``sim.engine``, model astra-sim, the
files' own start: delay nodes included) does with it:

- a collective the replay matches across ranks: a 1-byte collective under a new id, taking the
  original's dependencies (the ranks meet there: ASTRA-sim ends it when the last rank has issued
  it, a few ns later), then, under the original id (so everything that waited for the collective
  waits for this), a ``COMP_NODE`` off the CPU (``is_cpu_op`` false: ASTRA-sim's GPU unit, idle in
  a CPU job) lasting from the replay's meeting time (the last rank's issue) to that rank's own
  end in the replay: the worker's pickup, the transfer and the rank's own tail
  (``engine._cpu_pickups``, ``engine._cpu_waits``);
- a collective the replay runs alone on each rank (it ran under the group's previous one on
  another worker, or some rank's ET lost it): that ``COMP_NODE`` only, for its replayed time.
  ASTRA-sim holds one collective in flight per rank and meets every rank at each: as a collective
  it would make every rank wait for the slowest one's previous collective, which the run did not
  do (measured on a 4-rank gloo job with no communication time: 6-7 ms per rank from that alone).

What-ifs on CPU time still move the ranks' meetings; the transfer is the measured one whatever the
network file says (the network still times the GPU collectives). Cost: one job replay, O(c) after.
"""

from __future__ import annotations

from dataclasses import dataclass

from linker.sim.engine import ASTRA_SIM, replay
from linker.sim.graph import COLL, SimGraph


@dataclass
class NodeEdit:
    """How a workload copy writes one CPU collective: ``timed_us`` of work off the CPU under its
    id; ``sync_id`` not None: after a 1-byte collective of that new id, which the timed node
    depends on (the meeting takes the collective's dependencies)."""

    timed_us: int
    sync_id: int | None = None


def _is_cpu_collective(graph: SimGraph, u: int) -> bool:
    info = graph.comm.get(u)
    return info is not None and info.role == COLL and graph.lane_keys[graph.lane[u]][0] == "cpu"


def cpu_collective_edits(graphs: list[SimGraph], comm_groups: dict[str, list[int]] | None) -> list[dict[int, NodeEdit]]:
    """Per rank position: node id -> ``NodeEdit`` for its CPU collectives (module docstring);
    empty dicts when the job has no CPU collective or is a single rank (run as 2 NPUs replaying
    one file: its collectives meet at once and take the network's time)."""
    edits: list[dict[int, NodeEdit]] = [{} for _ in graphs]
    collectives = [[u for u in graph.comm if _is_cpu_collective(graph, u)] for graph in graphs]
    if len(graphs) < 2 or not any(collectives):
        return edits
    rp = replay(graphs, ASTRA_SIM, comm_groups=comm_groups)
    matched: dict[tuple, list[tuple[int, int, float, float]]] = {}  # ASTRA-sim's match: pg, issue order
    for r, (graph, nodes) in enumerate(zip(graphs, collectives)):
        base = rp.offsets[r]
        position = 0
        for u in sorted(nodes, key=graph.ids.__getitem__):
            issue, end = rp.issue[base + u], rp.end[base + u]
            if issue != issue or end != end:
                continue  # never ran in the replay: left as it is
            if rp.groups.group_of[base + u] < 0:  # replayed alone: no peer to meet
                edits[r][graph.ids[u]] = NodeEdit(timed_us=round(end - issue))
                continue
            info = graph.comm[u]
            key = (info.pg_name, info.seq if info.seq is not None else position)
            position += 1
            matched.setdefault(key, []).append((r, u, issue, end))
    next_id = [max(graph.ids, default=0) + 1 for graph in graphs]
    for members in matched.values():
        met = max(issue for _, _, issue, _ in members)  # ASTRA-sim meets the ranks when the last one issues it
        for r, u, _, end in members:
            edits[r][graphs[r].ids[u]] = NodeEdit(timed_us=max(0, round(end - met)), sync_id=next_id[r])
            next_id[r] += 1
    return edits

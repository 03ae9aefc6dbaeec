"""CPU collectives as ASTRA-sim needs them: a meeting of the ranks, then each rank's measured time
(or, in the ``network`` form, the meeting, the bytes the network carried, then the rest).

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
- a send and its receive (gloo's ``send`` / ``recv``: a pipeline's stages) likewise: a 1-byte send
  and receive (the receiver cannot go on before the sender issued it), then each side's
  ``COMP_NODE`` for the rest of its replayed time;
- a collective the replay runs alone on each rank (it ran under the group's previous one on
  another worker, or some rank's ET lost it): that ``COMP_NODE`` only, for its replayed time; one
  that ran under the previous one also depends on the collective issued before it on its rank,
  as the replay issues it (``engine.CommGroups.issued_after``: with one collective in flight, a
  worker that took the later-issued one a few µs first would otherwise hold the rank's collective
  unit through its whole time beside the earlier one).
  ASTRA-sim holds one collective in flight per rank and meets every rank at each: as a collective
  it would make every rank wait for the slowest one's previous collective, which the run did not
  do (measured on a 4-rank gloo job with no communication time: 6-7 ms per rank from that alone).

What-ifs on CPU time still move the ranks' meetings; in this form (``measured``, the default) the
transfer is the measured one whatever the network file says (the network still times the GPU
collectives).

The ``network`` form (``--astra-cpu-collectives network``; a job whose collectives are all CPU
ones) hands the network part to ASTRA-sim, as ``et-link simulate --network`` models it
(``sim.network``, docs/whatif.md): the CPU collectives' bus is fitted to their episodes
(``network.fit_job``: a matched collective and the ones that ran under it share the medium), and
written as ASTRA-sim's ``FullyConnected`` network of the job's N NPUs with each link at the bus
rate / N (ASTRA-sim's ring all-reduce sends 2(N-1)/N S per NPU over one link at a time: 2(N-1) S /
rate, the bus's time). Each matched collective becomes the meeting, then a collective of its
episode's size (the bytes every member rank's episode carried, as one collective of the first's
type) taking the network's time for it (``network_fit.collective_ns``), then the ``COMP_NODE``
holding the rest of the rank's time: the replay's time less the network's, taken from the
episode's first node and, where that would go below 0, from the next ones'. On the fitted network
ASTRA-sim replays the trace as the measured form does; with another bandwidth or latency in
``network.yml`` its own network model moves the collectives. The meeting stays: it makes the
ranks start the carried collective together (a rank that issued it first would otherwise run its
first ring steps alone).

The meeting's own network time (its ring steps' latency) is taken from the parts too. A rank whose
parts of an episode are shorter than the network's time for it (it sent some of its bytes before
the last rank arrived, or the fit, a least squares over every episode, is above this one) still
takes the network's whole time in ASTRA-sim before them: each of the episode's collectives whose
parts so far fall short ends late by the difference (at most the network's time on the network
written). ``simulate --network`` ends it at its measured end plus the change of the network's
time, earlier by that same difference. So the CPU ops that waited for a late collective give the
time back (``_repay``), as far as the replay says they waited for it. What the carried collectives
do not hold (collectives run alone; a rank's bytes beyond those every member's episode held) keeps
its replayed time, re-timed for the network written (``retime_uncarried``). The copies are thus
made for one network file (``given``: ``astra-setup --astra-bandwidth`` / ``--astra-latency``);
a ``network.yml`` edited afterwards moves only the carried collectives. Cost: one job replay,
O(c log c) after, and O(n log n + e) per rank that owes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from linker.model.errors import OptionError
from linker.sim.engine import ASTRA_SIM, Replay, replay
from linker.sim.graph import COLL, CPU, SimGraph
from linker.sim.network import BUS, FittedNetwork, fit_job, volume
from linker.sim.network_fit import DEFAULT_TOPOLOGY, FITTED_TYPES, NetworkFit, collective_ns, stated

MEASURED_FORM, NETWORK_FORM = "measured", "network"
CPU_COLLECTIVE_FORMS = (MEASURED_FORM, NETWORK_FORM)
_GB = float(1 << 30)


GIVEN_FIELDS = ("npus", "bandwidth_gbps", "latency_ns")  # the network file's values a user may give (astra-setup)


def given_values(overrides: dict) -> dict:
    """The network file's values among ``overrides`` (``GIVEN_FIELDS``), to put in the fitted one's place."""
    return {name: overrides[name] for name in GIVEN_FIELDS if name in overrides}


def check_form(form: str) -> str:
    """``form`` when it is one of ``CPU_COLLECTIVE_FORMS``; raises OptionError otherwise."""
    if form not in CPU_COLLECTIVE_FORMS:
        raise OptionError(f"unknown --astra-cpu-collectives {form!r}; choose one of {', '.join(CPU_COLLECTIVE_FORMS)}")
    return form


@dataclass
class NodeEdit:
    """How a workload copy writes one CPU collective: ``timed_us`` of work off the CPU under its
    id; ``sync_id`` not None: after a 1-byte collective of that new id, which the timed node
    depends on (the meeting takes the collective's dependencies); ``carried`` not None (the
    ``network`` form): (new id, Chakra type, bytes) of a collective after the meeting that the
    timed node depends on instead; ``after_id`` not None (one replayed alone that ran under the
    collective issued before it): that collective's id, which the timed node depends on too.
    ``kept`` (the ``network`` form's repayment, ``_repay``): not a collective but a CPU op, written
    as it is with ``duration_micros`` = ``timed_us``."""

    timed_us: int
    sync_id: int | None = None
    carried: tuple[int, int, int] | None = None
    after_id: int | None = None
    kept: bool = False


@dataclass
class Uncarried:
    """A rank's episode (its collectives' node ids, Chakra types and sizes, its process group's
    size) whose bytes ASTRA-sim's network carries only in part, in the ``network`` form: one the
    replay runs alone (``carried`` None: no meeting, so no collective ASTRA-sim could time), or a
    matched one holding more than the bytes every member's episode held (``carried``: the
    collective written, (type, size)). ``retime_uncarried`` re-times the rest."""

    rank: int
    node_ids: list[int]
    types: list[int]
    sizes: list[int]
    npus: int
    carried: tuple[int, int] | None = None


@dataclass
class CpuCollectives:
    """The workload copies' CPU collectives: per rank position node id -> ``NodeEdit``; in the
    ``network`` form the network the carried collectives were timed on (``network``, with the
    CPU collectives' bus fit it stands for in ``bus``) and how many were carried; ``notes`` say
    why a form asked for was not used."""

    edits: list[dict[int, NodeEdit]]
    network: NetworkFit | None = None
    bus: FittedNetwork | None = None
    carried: int = 0
    repaid: float = 0.0  # µs taken from CPU ops after collectives that ran longer than measured (``_repay``)
    uncarried: list[Uncarried] = field(default_factory=list)  # the network form's, for ``retime_uncarried``
    notes: list[str] = field(default_factory=list)


def is_cpu_comm(graph: SimGraph, u: int) -> bool:
    """A CPU backend's collective, send or receive."""
    return u in graph.comm and graph.lane_keys[graph.lane[u]][0] == "cpu"


def _is_cpu_collective(graph: SimGraph, u: int) -> bool:
    return is_cpu_comm(graph, u) and graph.comm[u].role == COLL


def cpu_collective_edits(graphs: list[SimGraph], comm_groups: dict[str, list[int]] | None,
                         form: str = MEASURED_FORM, topology: str | None = None,
                         given: dict | None = None) -> CpuCollectives:
    """Per rank position: node id -> ``NodeEdit`` for its CPU collectives (module docstring), in
    ``form``; the ``network`` form on ``topology`` (default ``FullyConnected``) where the job's
    collectives are all CPU ones with a bus to fit, else the ``measured`` form with a note; its
    copies made for the fitted network with ``given``'s values in its place (``bandwidth_gbps``,
    ``latency_ns``: the network file written, ``astra_setup.bus_network``). Empty
    edits when the job has no CPU collective or is a single rank (run as 2 NPUs replaying one
    file: its collectives meet at once and take the network's time)."""
    edits: list[dict[int, NodeEdit]] = [{} for _ in graphs]
    collectives = [[u for u in graph.comm if is_cpu_comm(graph, u)] for graph in graphs]
    if len(graphs) < 2 or not any(collectives):
        result = CpuCollectives(edits)
        if form == NETWORK_FORM and any(collectives):
            result.notes.append("--astra-cpu-collectives network: a single rank's collectives are timed by the "
                                "network file already (fitted to them, run as 2 NPUs)")
        return result
    rp = replay(graphs, ASTRA_SIM, comm_groups=comm_groups)
    matched: dict[tuple, list[tuple[int, int, float, float]]] = {}  # ASTRA-sim's match: pg, issue order
    for r, (graph, nodes) in enumerate(zip(graphs, collectives)):
        base = rp.offsets[r]
        position = 0
        for u in sorted(nodes, key=graph.ids.__getitem__):
            issue, end = rp.issue[base + u], rp.end[base + u]
            if math.isnan(issue) or math.isnan(end):
                continue  # never ran in the replay: left as it is
            if rp.groups.group_of[base + u] < 0:  # replayed alone: no peer to meet
                before = rp.groups.issued_after.get(base + u)
                edits[r][graph.ids[u]] = NodeEdit(timed_us=round(end - issue),
                                                  after_id=None if before is None else graph.ids[before - base])
                continue
            info = graph.comm[u]
            if info.role != COLL:  # a send and its receive: the replay's pair, as ASTRA-sim pairs them
                key = ("send/recv", rp.groups.group_of[base + u])
            else:
                key = (info.pg_name, info.seq if info.seq is not None else position)
                position += 1
            matched.setdefault(key, []).append((r, u, issue, end))
    next_id = [max(graph.ids, default=0) + 1 for graph in graphs]
    timed: dict[int, float] = {}  # global node -> its timed part before rounding (the network form takes from it)
    for members in matched.values():
        met = max(issue for _, _, issue, _ in members)  # ASTRA-sim meets the ranks when the last one issues it
        for r, u, _, end in members:
            edits[r][graphs[r].ids[u]] = NodeEdit(timed_us=max(0, round(end - met)), sync_id=next_id[r])
            timed[rp.offsets[r] + u] = max(0.0, end - met)
            next_id[r] += 1
    result = CpuCollectives(edits)
    if form == NETWORK_FORM:
        _carry(result, rp, timed, next_id, topology or DEFAULT_TOPOLOGY, given or {})
    return result


def _carry(result: CpuCollectives, rp: Replay, timed: dict[int, float], next_id: list[int], topology: str,
           given: dict) -> None:
    """The ``network`` form over the measured one's edits (``timed``: each matched member's part
    from the meeting): fit the bus, time each matched episode's bytes on the ASTRA-sim network
    that stands for it, and take that time from the episode's timed parts; a collective that then
    ends later than its replayed time, by at most the network's time for the episode on the network
    written (``given`` in the fitted one's place), owes the difference to the ops that wait for it
    (``_repay``); what the carried collectives do not hold is re-timed for that network
    (``retime_uncarried``). O(c log c), and O(n log n + e) per rank that owes."""
    graphs = rp.graphs
    fitted = _bus_network(result, rp, topology)
    if fitted is None:
        return
    job, bus, network = fitted
    written = replace(network, **given_values(given))
    episodes: dict[int, list] = {}  # group -> its members' episodes
    debts: dict[int, list[tuple[int, float]]] = {}  # rank position -> (a collective, µs it ends late)
    for episode in job.episodes["cpu"]:
        g = rp.groups.group_of[episode.nodes[0]]
        if g >= 0 and episode.types[0] in FITTED_TYPES:
            episodes.setdefault(g, []).append(episode)
        elif g < 0 and all(t in FITTED_TYPES for t in episode.types):
            result.uncarried.append(_uncarried(rp, episode))
    for members in episodes.values():
        first = members[0]
        one_byte = volume(first.types[0], 1, first.npus)[1]
        size = round(min(e.per_rank_bytes for e in members) / one_byte)
        network_us, written_us = (sum(collective_ns(first.types[0], carried, first.npus, topology, net.bandwidth_gbps,
                                                    net.latency_ns) for carried in (1, size)) / 1000
                                  for net in (network, written))  # the meeting's and the carried collective's
        for episode in members:
            r = rp.rank_of(episode.nodes[0])
            graph, base = graphs[r], rp.offsets[r]
            head = result.edits[r].get(graph.ids[episode.nodes[0] - base])
            if head is None:  # never ran in the replay: left as it is
                continue
            left = network_us
            for v in episode.nodes:
                edit = result.edits[r].get(graph.ids[v - base])
                if edit is None:
                    continue
                part = timed.get(v, float(edit.timed_us))
                taken = min(part, left)
                left -= taken
                edit.timed_us = max(0, round(part - taken))
                if left >= 0.5:  # it ends late (less is below the file's µs): by no more than the network's time
                    debts.setdefault(r, []).append((v - base, min(left, written_us)))
            head.carried = (next_id[r], first.types[0], size)
            next_id[r] += 1
            result.carried += 1
            if episode.per_rank_bytes > one_byte * size and all(t in FITTED_TYPES for t in episode.types):
                result.uncarried.append(_uncarried(rp, episode, (first.types[0], size)))
    for r, owed in debts.items():
        at = slice(rp.offsets[r], rp.offsets[r] + len(graphs[r]))
        result.repaid += _repay(graphs[r], result.edits[r], owed, rp.issue[at], rp.end[at])
    result.network, result.bus = network, bus
    retime_uncarried(result, written)


def _uncarried(rp: Replay, episode, carried: tuple[int, int] | None = None) -> Uncarried:
    """``episode`` (a fitted episode of the replay ``rp``) as an ``Uncarried`` of its rank, its
    nodes by id; ``carried``: the collective written for it, if any."""
    r = rp.rank_of(episode.nodes[0])
    graph, base = rp.graphs[r], rp.offsets[r]
    return Uncarried(r, [graph.ids[v - base] for v in episode.nodes], episode.types, episode.sizes, episode.npus,
                     carried)


def _bus_network(result: CpuCollectives, rp: Replay, topology: str) -> tuple | None:
    """(the job's episodes and fits, the CPU collectives' bus, the ASTRA-sim network of ``topology``
    that stands for it) of the replay ``rp``; None, with a note on ``result``, when the job has GPU
    collectives (the network file is theirs) or no CPU collective carries bytes. O(c log c)."""
    graphs = rp.graphs
    if any(info.role == COLL and not _is_cpu_collective(graph, u) for graph in graphs for u, info in graph.comm.items()):
        result.notes.append("--astra-cpu-collectives network: the job has GPU collectives, which the network is "
                            "fitted to; the CPU collectives keep their measured form")
        return None
    job = fit_job(graphs, rp.offsets, rp.groups, rp.duration, medium=BUS)
    bus = job.fits.get("cpu")
    if bus is None or not bus.bandwidth < float("inf"):
        result.notes.append("--astra-cpu-collectives network: no CPU collective carries bytes over a bus to fit; "
                            "the CPU collectives keep their measured form")
        return None
    npus = len(graphs)
    network = NetworkFit(topology, npus, stated(bus.bandwidth / npus / _GB), stated(bus.latency_us * 1000), True,
                         collectives=bus.collectives, measured_us=bus.measured_us, modelled_us=bus.modelled_us,
                         mean_abs_error=bus.mean_abs_error)
    return job, bus, network


def retime_uncarried(cpu: CpuCollectives, written: NetworkFit) -> None:
    """Re-time, for the network file actually written (``written``: the fitted one, or the
    bandwidth or latency a what-if gave), the collectives' time the carried collectives do not
    hold (``Uncarried``): each such episode's timed parts change by ASTRA-sim's time for its
    collectives on ``written`` less on the fitted network, less that change for the collective
    carried for it, from its first node and, where that would go below 0, the next ones (as
    ``simulate --network`` re-times an episode's bytes). Nothing changes on the fitted network.
    O(such collectives)."""
    fitted = cpu.network
    if fitted is None:
        return

    def change_ns(comm_type: int, size: int, npus: int) -> int:
        return (collective_ns(comm_type, size, npus, written.topology, written.bandwidth_gbps, written.latency_ns)
                - collective_ns(comm_type, size, npus, fitted.topology, fitted.bandwidth_gbps, fitted.latency_ns))

    for episode in cpu.uncarried:
        change = sum(change_ns(t, size, episode.npus) for t, size in zip(episode.types, episode.sizes))
        if episode.carried is not None:
            change -= change_ns(*episode.carried, episode.npus)
        change /= 1000
        edits = cpu.edits[episode.rank]
        for node_id in episode.node_ids:
            edit = edits.get(node_id)
            if edit is None or change == 0:
                continue
            now = max(0.0, edit.timed_us + change)
            change -= now - edit.timed_us
            edit.timed_us = round(now)


def _repay(graph: SimGraph, edits: dict[int, NodeEdit], owed: list[tuple[int, float]], issue, end) -> float:
    """Take a rank's debts (``owed``: (a collective, µs it ends later than the replay ends it:
    ``_carry``)) back from the CPU ops that waited for them, walking each thread in the replay's order
    with what it owes: an op that waited for a late collective owes that collective's lateness less
    the time the op waited beyond it (``issue`` / ``end``: the replay's times of the rank's nodes);
    an op that waited for anything (its start after the thread's previous op's end) owes that much
    less; each op gives what it can, down to 0. The ops are written as they are with the shorter
    ``duration_micros`` (a ``NodeEdit`` with ``kept``). Returns the µs taken. O(n log n + e) for
    the rank."""
    late = dict(owed)
    ops = [v for v in range(len(graph)) if graph.kind[v] == CPU and not math.isnan(issue[v])]  # CPU ops issued
    joins: dict[int, float] = {}  # op -> the lateness a late collective it waited for gives it
    for v in ops:
        for d in graph.deps_of(v):
            if d in late and not math.isnan(end[d]):
                joins[v] = max(joins.get(v, 0.0), late[d] - (issue[v] - end[d]))
    by_lane: dict[int, list[int]] = {}
    for v in sorted(ops, key=issue.__getitem__):
        by_lane.setdefault(graph.lane[v], []).append(v)
    repaid = 0.0
    for lane in by_lane.values():
        owing, previous_end = 0.0, None
        for v in lane:
            if previous_end is not None and issue[v] > previous_end:
                owing = max(0.0, owing - (issue[v] - previous_end))  # a wait on the thread absorbs it
            owing = max(owing, joins.get(v, 0.0))
            previous_end = end[v]
            node_id = graph.ids[v]
            if owing <= 0 or (node_id in edits and not edits[node_id].kept):
                continue
            taken = min(graph.duration[v], owing)
            if taken > 0:
                owing, repaid = owing - taken, repaid + taken
                edits[node_id] = NodeEdit(timed_us=max(0, round(graph.duration[v] - taken)), kept=True)
    return repaid

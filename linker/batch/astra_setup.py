"""An ASTRA-sim setup beside a job's (or a single pair's) ``.et`` files: ``astra/`` holding

- ``network.yml``: one dimension, the topology, NPU count, bandwidth and latency fitted to the
  measured collectives (``sim.network_fit``; any of them given by the user instead);
- ``system.json``: the system layer configuration the fit's cost model assumes;
- ``memory.json``: no remote memory;
- ``workload.<rank>.et``: links to the rank files (a single pair: rank 0 and 1 both link to it,
  since ASTRA-sim needs at least 2 NPUs; ``.et.gz`` files are decompressed by ``run`` first,
  ASTRA-sim reads them raw). A file holding ``METADATA_NODE``s (``## process_group:init ##``)
  gets a copy instead, those nodes written as zero-duration CPU ``COMP_NODE``s: ASTRA-sim
  0ba29a2 aborts on the first metadata node it issues (``Statistics::get_operator_type`` has no
  case for it: "Invalid node_type ... Assertion `false' failed");
- ``comm_groups.json``: the process groups as NPU ids (the job's, each group's members kept among
  the ranks linked here; a single pair's groups are its ``pg_name``s over both NPUs);
- ``npu_ranks.json`` (only when the ranks linked are not 0..n-1, e.g. ranks 4-7 of a job): the
  rank of each NPU. NPU k is the k-th rank linked, so the NPU count is the ranks linked and every
  file agrees with it: the workload files are numbered by NPU, the comm groups and the send/recv
  peers in the workload copies are renumbered the same (``npu_numbers``), and ``astra_run`` reads
  this file to set each NPU beside its rank's measured times;
- ``run``: the exact command line, with the binary from ``$ASTRA_SIM_BIN``; extra arguments are
  passed on. Its paths are relative to its own folder, so the job's folder can move.

docs/astra-sim.md describes the files and what ASTRA-sim prints. Cost: one load of every rank's
graph (``sim.load``) to collect the collectives, O(collectives) for the fit.
"""

from __future__ import annotations

import contextlib
import json
import os
from bisect import bisect_right
from dataclasses import replace
from pathlib import Path

from linker import __version__
from linker.model.errors import TraceInputError
from linker.sim.engine import match_communication, node_offsets
from linker.batch.folder_lock import owned_folder
from linker.batch.rank_start_et import node_head
from linker.sim.graph import COLL, META, RECV, SEND, SimGraph
from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import EtWriter, encode_varint, find_attr, iter_frames, make_attr, parse_metadata
from linker.sim.network_fit import (ENDPOINT_DELAY_NS, LOCAL_MEM_BW_GBPS, Collective, NetworkFit, fit_network)
from linker.batch.astra_collectives import (MEASURED_FORM, CpuCollectives, NodeEdit, cpu_collective_edits, given_values,
                                           is_cpu_comm)
from linker.sim.network import format_rate

SETUP_DIR = "astra"
WORKLOAD_PREFIX = "workload"
NPU_RANKS_FILE = "npu_ranks.json"  # [rank of NPU 0, rank of NPU 1, ...], written when they are not 0..n-1


def system_config() -> dict:
    """The system layer configuration the cost model of ``network_fit`` is derived for."""
    ring = ["ring"]
    return {"scheduling-policy": "LIFO", "endpoint-delay": ENDPOINT_DELAY_NS, "active-chunks-per-dimension": 1,
            "preferred-dataset-splits": 1, "all-reduce-implementation": ring, "all-gather-implementation": ring,
            "reduce-scatter-implementation": ring, "all-to-all-implementation": ring,
            "collective-optimization": "localBWAware", "local-mem-bw": LOCAL_MEM_BW_GBPS, "boost-mode": 0,
            "roofline-enabled": 0, "peak-perf": 900}


def network_yaml(fit: NetworkFit) -> str:
    if fit.cpu_bus is not None:
        head = (f"# written by et-link {__version__}: {fit.topology} standing for the CPU collectives' bus of "
                f"{fit.cpu_bus['bandwidth']} shared by the {fit.npus} NPUs,\n# each link at the bus rate / "
                f"{fit.npus}: for a bus of R GB/s (2^30 bytes), et-link astra-setup --astra-bandwidth R / "
                f"{fit.npus}\n# (the workload copies are made for the network written: et-link's docs/whatif.md)\n")
    else:
        head = (f"# written by et-link {__version__}: {fit.topology}, fitted to the measured collectives "
                f"(see et-link's docs/astra-sim.md)\n")
    return (head +
            f"topology: [ {fit.topology} ]\nnpus_count: [ {fit.npus} ]\n"
            f"bandwidth: [ {fit.bandwidth_gbps} ]  # GB/s\nlatency: [ {fit.latency_ns} ]  # ns\n")


def bus_network(cpu: CpuCollectives, overrides: dict) -> NetworkFit:
    """The network file of the ``network`` form (``astra_collectives``): the network the carried
    collectives were timed on, with the user's values (``overrides``) in its place."""
    network = cpu.network
    given = given_values(overrides)
    bus = cpu.bus
    note = (f"it stands for the CPU collectives' bus as simulate --network fits it: {format_rate(bus.bandwidth)}, "
            f"latency {bus.latency_us:,.1f} us" + ("" if bus.latency_told_apart else " (not told apart)")
            + f", {bus.episodes} episodes; each of the {network.npus} links at the bus rate / {network.npus} "
            f"(docs/whatif.md)")
    return replace(network, **given, fitted=len(given) < 2, cpu_bus=bus.to_json(), notes=[note])


def job_collectives(graphs: list[SimGraph], comm_groups: dict[str, list[int]] | None) -> list[Collective]:
    """Each collective as ``et-link simulate`` replays it: matched across ranks (the shortest
    member's kernel is the transfer time), or, for a single rank, each on its own over 2 NPUs.
    In a job, CPU collectives are left out: the workload copies give them their replayed time
    (``astra_collectives``), so the network does not time them."""
    out: list[Collective] = []
    if len(graphs) == 1:
        graph = graphs[0]
        for u, info in sorted(graph.comm.items()):
            if info.role == COLL:
                out.append(Collective(info.comm_type, info.size, 2, graph.duration[u]))
        return out
    offsets = node_offsets(graphs)
    groups = match_communication(graphs, offsets, comm_groups)
    for g, members in enumerate(groups.members):
        infos = []
        for m in members:
            r = bisect_right(offsets, m) - 1
            infos.append((graphs[r].comm[m - offsets[r]], graphs[r].duration[m - offsets[r]]))
        r0 = bisect_right(offsets, members[0]) - 1
        if graphs[r0].lane_keys[graphs[r0].lane[members[0] - offsets[r0]]][0] == "cpu":
            continue  # a CPU collective: timed in the workload copies, not by the network
        first = infos[0][0]
        out.append(Collective(first.comm_type, max(i.size for i, _ in infos), groups.expected[g],
                              min(d for _, d in infos)))
    return out


def _script(files: list[tuple[Path, int]], setup: Path, groups: bool) -> str:
    lines = ["#!/bin/sh",
             f"# Written by et-link {__version__}: run ASTRA-sim (analytical backend) on this job.",
             "# ASTRA_SIM_BIN: the binary, e.g. .../bin/AstraSim_Analytical_Congestion_Unaware",
             "# (or _Congestion_Aware). Extra arguments are passed on. See et-link's docs/astra-sim.md.",
             "set -e",
             'here=$(cd "$(dirname "$0")" && pwd)',
             ': "${ASTRA_SIM_BIN:?set ASTRA_SIM_BIN to an ASTRA-sim analytical binary}"']
    for path, rank in files:
        if path.name.endswith(".gz"):
            source = os.path.relpath(path, setup)
            lines.append(f'gzip -dc "$here/{source}" > "$here/{WORKLOAD_PREFIX}.{rank}.et"')
    command = ['"$ASTRA_SIM_BIN"', f'--workload-configuration="$here/{WORKLOAD_PREFIX}"']
    if groups:
        command.append('--comm-group-configuration="$here/comm_groups.json"')
    command += ['--system-configuration="$here/system.json"', '--network-configuration="$here/network.yml"',
                '--remote-memory-configuration="$here/memory.json"', '--logging-folder="$here/log"', '"$@"']
    lines.append('cd "$here"')
    lines.append("exec " + " \\\n  ".join(command))
    return "\n".join(lines) + "\n"


def npu_numbers(ranks: list[int], comm_groups: dict[str, list[int]] | None
                ) -> tuple[dict[int, int], dict[str, list[int]] | None, str | None]:
    """The job's ranks as ASTRA-sim's NPUs when ``ranks`` (sorted) were linked: ({rank: NPU}, the
    comm groups as NPU ids, a note or None). NPU k is the k-th rank linked (the identity for a whole
    job or ranks 0..n-1), so NPU ids stay below the NPU count (the ranks linked); each group keeps
    its members among the linked ranks, a group with none of them is left out. O(ranks + members)."""
    npu_of = {rank: npu for npu, rank in enumerate(ranks)}
    renumbered = ranks != list(range(len(ranks)))
    if comm_groups is None:
        groups, members = None, set()
    else:
        groups = {group: sorted(npu_of[rank] for rank in listed if rank in npu_of)
                  for group, listed in comm_groups.items()}
        groups = {group: listed for group, listed in groups.items() if listed} or None
        members = set().union(*comm_groups.values())
    outside = sorted(members - set(npu_of))
    if not outside and not renumbered:
        return npu_of, groups, None
    from linker.batch.collectives import format_ranks  # here: its module's imports are heavy

    what = []
    if outside:
        dropped = len(comm_groups) - len(groups or {})
        what.append(f"comm_groups.json keeps each process group's members among them (ranks "
                    f"{format_ranks(outside)} of the job are not linked here"
                    + (f"; {dropped} group(s) with none of them left out)" if dropped else ")"))
    if renumbered:
        what.append(f"NPU k is the k-th of them ({NPU_RANKS_FILE}): workload files, comm groups and send/recv peers "
                    "numbered by NPU")
    return npu_of, groups, (f"NPUs 0-{len(ranks) - 1} are the {len(ranks)} ranks linked ({format_ranks(ranks)}): "
                            + "; ".join(what))


def write_setup(files: list[tuple[Path, int]], graphs: list[SimGraph], comm_groups: dict[str, list[int]] | None,
                setup: Path, overrides: dict) -> dict:
    """Write the setup for ``files`` ([(path, rank)], sorted by rank) into ``setup``, NPU k for the
    k-th rank (``npu_numbers``); return its record (the fit, the notes, ``lines`` to print).
    ``comm_groups``: the job's groups of global ranks. Raises TraceInputError when it cannot write."""
    single = len(files) == 1
    form = overrides.get("cpu_collectives", MEASURED_FORM)
    overrides = {name: value for name, value in overrides.items() if name != "cpu_collectives"}
    fit = fit_network(job_collectives(graphs, comm_groups), 2 if single else len(files), overrides)
    ranks = [rank for _, rank in files]
    notes = []
    npu_of, npu_groups = {}, None
    if single:
        workload = [(files[0][0], 0), (files[0][0], 1)]
        groups = sorted({info.pg_name for info in graphs[0].comm.values()})
        comm_groups = npu_groups = {pg: [0, 1] for pg in groups} if groups else None
        notes.append("a single rank, run as 2 NPUs (both replay the same file)")
    else:
        npu_of, npu_groups, note = npu_numbers(ranks, comm_groups)
        workload = [(path, npu_of[rank]) for path, rank in files]
        if note:
            notes.append(note)
        notes += _unpaired_peers(graphs, npu_of)
    renumbered = any(rank != npu for rank, npu in npu_of.items())
    try:
        setup.mkdir(parents=True, exist_ok=True)
        copies, edited, metadata, renumbered_peers, computed_peers = [], [], [], [], []
        cpu = cpu_collective_edits(_as_written(files, graphs), comm_groups, form, overrides.get("topology"), overrides)
        edits = cpu.edits
        notes += cpu.notes
        if cpu.network is not None:
            fit = bus_network(cpu, overrides)
        _remove_stale(setup, {f"{WORKLOAD_PREFIX}.{npu}.et" for _, npu in workload}, renumbered)
        for (path, npu), graph, edit in zip(workload, graphs * 2 if single else graphs,
                                            edits * 2 if single else edits):
            link = setup / f"{WORKLOAD_PREFIX}.{npu}.et"
            if link.is_symlink() or link.exists():
                link.unlink()
            point_to_point = _point_to_point_peers(graph)
            unpaired = len(point_to_point - set(npu_of))
            peers = npu_of if point_to_point and (renumbered or unpaired) else None
            if META in graph.kind or edit or peers is not None:
                copy_for_astra(path, link, edit, peers)
                copies.append(npu)
                if edit:
                    edited.append(npu)
                elif META in graph.kind:
                    metadata.append(npu)
                if peers is not None and renumbered:
                    renumbered_peers.append(npu)
                if unpaired:
                    computed_peers.append(npu)
            elif not path.name.endswith(".gz"):
                link.symlink_to(os.path.relpath(path.absolute(), setup.absolute()))
        if metadata:
            notes.append(f"workload {sorted(set(metadata))}: copies with METADATA_NODEs as CPU "
                         "COMP_NODEs (ASTRA-sim 0ba29a2 aborts on metadata nodes)")
        if renumbered_peers:
            notes.append(f"workload {renumbered_peers}: copies whose send/recv peers are NPU ids")
        if computed_peers:
            notes.append(f"workload {computed_peers}: copies whose send/recv nodes with a peer not linked here are "
                         "GPU COMP_NODEs of their measured time (ASTRA-sim would wait for that peer forever)")
        if edited and cpu.network is None:
            count = sum(len(edit) for edit in edits)
            notes.append(f"{count} CPU collective node(s) are not fitted: the workload copies give them their "
                         "replayed time")
            notes.append(f"workload {edited}: copies whose CPU collectives are a 1-byte meeting of the ranks, then "
                         "the rank's replayed collective time off the CPU; metadata nodes as CPU COMP_NODEs "
                         "(docs/astra-sim.md)")
        elif edited:
            count = sum(not e.kept for edit in edits for e in edit.values())
            notes.append(f"workload {edited}: copies whose CPU collectives are a 1-byte meeting of the ranks, then "
                         f"for {cpu.carried} of their {count} nodes a collective of the bytes the network carried "
                         "(the episode's), then the rest of the rank's replayed time off the CPU; metadata nodes as "
                         "CPU COMP_NODEs (docs/astra-sim.md)")
            if cpu.repaid:
                shortened = sum(e.kept for edit in edits for e in edit.values())
                notes.append(f"{shortened} CPU op(s) after a collective that the network's time made end later than "
                             f"measured are {cpu.repaid / 1000:.3f} ms shorter in all (docs/whatif.md)")
        _write_text(setup / "network.yml", network_yaml(fit))
        _write_text(setup / "system.json", json.dumps(system_config(), indent=4) + "\n")
        _write_text(setup / "memory.json", json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=4) + "\n")
        if npu_groups:
            _write_text(setup / "comm_groups.json", json.dumps(npu_groups) + "\n")
        if renumbered:
            _write_text(setup / NPU_RANKS_FILE, json.dumps(ranks) + "\n")
        run = setup / "run"
        unpack = [(p.absolute(), r) for p, r in workload if r not in copies]
        _write_text(run, _script(unpack, setup.absolute(), bool(npu_groups)))
        run.chmod(0o755)
    except OSError as err:
        raise TraceInputError(setup, f"cannot write the ASTRA-sim setup ({err.strerror or err})") from None
    lines = fit.lines() + [f"  note: {note}" for note in notes]
    lines.append(f"ASTRA-sim setup: {setup}/run (set ASTRA_SIM_BIN; docs/astra-sim.md)")
    return {"dir": str(setup), "network": fit.to_json(), "notes": notes, "lines": lines}


def _point_to_point_peers(graph: SimGraph) -> set[int]:
    """The ranks the graph's send and recv nodes name as their peers (-1: not known)."""
    return {info.peer for info in graph.comm.values() if info.role in (SEND, RECV)}


def _unpaired_peers(graphs: list[SimGraph], npu_of: dict[int, int]) -> list[str]:
    """A note per rank whose send/recv nodes name a peer that is not linked here (their NPU
    would not exist, or be another rank's): ASTRA-sim cannot pair them."""
    from linker.batch.collectives import format_ranks

    notes = []
    for graph in graphs:
        peers = {peer for peer in _point_to_point_peers(graph) if peer >= 0}
        if peers - set(npu_of):
            notes.append(f"rank {graph.rank}: send/recv with rank(s) {format_ranks(peers - set(npu_of))} "
                         "that are not linked here: ASTRA-sim cannot pair them, so they run as compute of their "
                         "measured time (link those ranks too)")
    return notes


def _remove_stale(setup: Path, written: set[str], renumbered: bool) -> None:
    """Remove the workload files and NPU map an earlier setup left in ``setup`` that this one does
    not write (e.g. the whole job's, before a setup of some of its ranks): ASTRA-sim and
    ``astra_run`` would take them for NPUs of this one."""
    stale = [path for path in setup.glob(f"{WORKLOAD_PREFIX}.*.et")
             if path.name[len(WORKLOAD_PREFIX) + 1:-3].isdigit() and path.name not in written]
    if not renumbered:
        stale.append(setup / NPU_RANKS_FILE)
    for path in stale:
        if path.is_symlink() or path.exists():
            path.unlink()


def _as_written(files: list[tuple[Path, int]], graphs: list[SimGraph]) -> list[SimGraph]:
    """The job's graphs as the files now hold them (read again when a rank holds a CPU collective,
    send or receive: ``batch`` loads them before it writes the rank start delay nodes, which the
    replay of ``cpu_collective_edits`` needs, and whose ids the new nodes must not take);
    ``graphs`` otherwise."""
    from linker.sim.load import load_graph

    if len(files) < 2 or not any(is_cpu_comm(graph, u) for graph in graphs for u in graph.comm):
        return graphs
    return [load_graph(path, rank) for path, rank in files]


def copy_without_metadata(source: Path, target: Path) -> None:
    """Copy a ``.et``/``.et.gz`` to ``target`` (plain ``.et``) with every ``METADATA_NODE`` written as
    a CPU ``COMP_NODE`` of duration 0; the other frames copied as bytes. O(file)."""
    copy_for_astra(source, target, {})


def copy_for_astra(source: Path, target: Path, edits: dict[int, NodeEdit],
                   peers: dict[int, int] | None = None) -> None:
    """``copy_without_metadata``, also writing the CPU collectives named in ``edits`` (node id ->
    ``NodeEdit``, ``batch.astra_collectives``): a 1-byte collective under the new id taking the
    node's dependencies (when ``sync_id`` is set), then, when ``carried`` is set, the collective of
    those bytes after it (``_carried``), then under the node's own id a ``COMP_NODE`` off the CPU
    for ``timed_us``. ``peers`` ({rank: NPU}, ``npu_numbers``; empty for a single rank run as two
    NPUs): the ``comm_src`` / ``comm_dst`` of send and recv nodes renumbered; a send or recv whose
    peer is not in it becomes a GPU ``COMP_NODE`` of its duration (``unpaired_peer``: the rank it
    named), with its dependencies: ASTRA-sim would wait for that peer forever, leaving the node
    unreleased and the run unfinished. Other nodes are copied as bytes. O(file)."""
    point_to_point = (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE) if peers is not None else ()
    with EtWriter(target) as writer:
        for frame in iter_frames(source):
            if frame.index == 0:
                writer.write_metadata(parse_metadata(frame, source))
                continue
            head = node_head(frame.payload)
            if head[3] != pb.METADATA_NODE and head[0] not in edits and head[3] not in point_to_point:
                writer.write_frames_bytes(encode_varint(len(frame.payload)) + frame.payload, 1)
                continue
            node = pb.Node.FromString(frame.payload)
            if node.type in point_to_point:
                _pair_or_compute(node, peers)
            edit = edits.get(node.id)
            if edit is None:  # a metadata node, or a send / recv
                if node.type == pb.METADATA_NODE:
                    node.type = pb.COMP_NODE
                    node.duration_micros = 0
                    if find_attr(node, "is_cpu_op") is None:
                        node.attr.append(make_attr("is_cpu_op", True, "bool_val"))
                writer.write_node(node)
                continue
            if edit.kept:  # a CPU op repaying a rank's debt (``astra_collectives._repay``)
                node.duration_micros = edit.timed_us
                writer.write_node(node)
                continue
            timed = pb.Node(id=node.id, name=node.name, type=pb.COMP_NODE, duration_micros=edit.timed_us,
                            start_time_micros=node.start_time_micros)
            timed.attr.extend(attr for attr in node.attr if attr.name == "tid")
            timed.attr.append(make_attr("is_cpu_op", False, "bool_val"))
            if edit.sync_id is None:
                timed.ctrl_deps.extend(node.ctrl_deps)
                timed.data_deps.extend(node.data_deps)
                if edit.after_id is not None and edit.after_id not in timed.data_deps:
                    timed.data_deps.append(edit.after_id)
            else:
                meeting = pb.Node()
                meeting.CopyFrom(node)
                meeting.id = edit.sync_id
                meeting.duration_micros = 0
                meeting.ClearField("start_time_micros")  # not a measured op: no time of its own
                size = find_attr(meeting, "comm_size")
                if size is not None and size.WhichOneof("value"):
                    setattr(size, size.WhichOneof("value"), 1)
                _meet_as_astra_sim_can(meeting)
                for attr in list(meeting.attr):
                    if attr.name in ("data_dep_causes", "inclusive_dur_micros", "exclusive_dur_micros",
                                     "blocked_micros"):
                        meeting.attr.remove(attr)
                writer.write_node(meeting)
                if edit.carried is None:
                    timed.data_deps.append(edit.sync_id)
                else:
                    writer.write_node(_carried(meeting, edit.sync_id, *edit.carried))
                    timed.data_deps.append(edit.carried[0])
            writer.write_node(timed)


# The collectives ASTRA-sim runs across the ranks; it replays a broadcast by its duration on each
# rank alone and refuses the others (the run then ends with the node unreleased: "Exiting").
MEETING_TYPES = frozenset((pb.ALL_REDUCE, pb.ALL_TO_ALL, pb.ALL_GATHER, pb.REDUCE_SCATTER))


def _meet_as_astra_sim_can(meeting: pb.Node) -> None:
    """A 1-byte meeting of a collective type ASTRA-sim does not run across the ranks (reduce,
    gather, scatter, broadcast, barrier) becomes a 1-byte all-reduce: the meeting's point is that
    the ranks wait for each other, whatever the type."""
    comm_type = find_attr(meeting, "comm_type")
    if meeting.type == pb.COMM_COLL_NODE and comm_type is not None and comm_type.WhichOneof("value") and (
            getattr(comm_type, comm_type.WhichOneof("value")) not in MEETING_TYPES):
        setattr(comm_type, comm_type.WhichOneof("value"), pb.ALL_REDUCE)


def _pair_or_compute(node: pb.Node, peers: dict[int, int]) -> None:
    """A send / recv node's ``comm_src`` and ``comm_dst`` as NPU ids (``peers``: {rank: NPU}; the
    node's own rank is one of the two) when its peer (``comm_dst`` of a send, ``comm_src`` of a
    recv) is there; else the node becomes a GPU ``COMP_NODE`` of its duration, its peer kept as
    ``unpaired_peer``."""
    ranks = {}
    for name in ("comm_src", "comm_dst"):
        attr = find_attr(node, name)
        field_name = attr.WhichOneof("value") if attr is not None else None
        if field_name:
            ranks[name] = (attr, field_name, getattr(attr, field_name))
    peer = ranks.get("comm_dst" if node.type == pb.COMM_SEND_NODE else "comm_src", (None, None, None))[2]
    if peer in peers:
        for attr, field_name, rank in ranks.values():
            if rank in peers:
                setattr(attr, field_name, peers[rank])
        return
    node.type = pb.COMP_NODE
    for attr in [attr for attr in node.attr if attr.name in ("comm_src", "comm_dst", "is_cpu_op")]:
        node.attr.remove(attr)
    node.attr.append(make_attr("is_cpu_op", False, "bool_val"))
    if peer is not None:
        node.attr.append(make_attr("unpaired_peer", peer, "int64_val"))


def _carried(meeting: pb.Node, after: int, node_id: int, comm_type: int, size: int) -> pb.Node:
    """The collective of the ``network`` form: the meeting's node under ``node_id``, of type
    ``comm_type`` and ``size`` bytes, after the meeting (``after``) alone."""
    carried = pb.Node()
    carried.CopyFrom(meeting)
    carried.id = node_id
    carried.ClearField("ctrl_deps")
    carried.ClearField("data_deps")
    carried.data_deps.append(after)
    for name, value in (("comm_type", comm_type), ("comm_size", size)):
        attr = find_attr(carried, name)
        if attr is not None and attr.WhichOneof("value"):
            setattr(attr, attr.WhichOneof("value"), value)
    return carried


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def setup_for_files(paths: list[Path], output_dir: Path | None, overrides: dict) -> list[str]:
    """``et-link astra-setup``: the setup for already written ``.et`` files (one pair or a job).
    Returns the lines to print. The folder of the files (when writable: a batch may be writing it)
    and the setup's folder are held while it runs (``folder_lock``); one another run holds raises
    ``FolderBusyError`` before anything is read or written."""
    from linker.sim.job import read_comm_groups, resolve_inputs
    from linker.sim.load import load_graph

    inputs = resolve_inputs(paths, None)
    for path, _ in inputs.files:
        if not path.name.endswith((".et", ".et.gz")):
            raise TraceInputError(path, "ASTRA-sim reads Chakra .et files; write the ET+ with -o NAME.et")
    files_folder = inputs.files[0][0].absolute().parent
    setup = Path(output_dir) if output_dir else files_folder / SETUP_DIR
    held = [files_folder] if os.access(files_folder, os.W_OK) else []
    if setup.absolute() != files_folder:
        held.append(setup)
    with contextlib.ExitStack() as stack:
        for folder in held:
            stack.enter_context(owned_folder(folder, "et-link astra-setup"))
        groups = read_comm_groups(inputs.comm_groups_path) if inputs.comm_groups_path is not None else None
        graphs = [load_graph(path, rank) for path, rank in inputs.files]
        return write_setup(inputs.files, graphs, groups, setup, overrides)["lines"]


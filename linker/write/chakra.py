"""Write the ET+ as a Chakra protobuf trace (``.et``, ``.et.gz``) that Chakra tools and ASTRA-sim read.

Output (FORMATS.md §4): one ``GlobalMetadata`` (``version`` plus the ET header's ``schema``, ``pid``,
``time``, ``start_ts``, ``finish_ts``), then one ``Node`` per ET node and per GPU op, streamed one at a
time through ``chakra_wire.EtWriter`` (temporary file renamed at the end: no file on failure; the
input paths are refused as output).

Node types:
- CPU ops (every ET node, roots included) and kernels / memcpys / memsets: ``COMP_NODE``;
- ``## process_group:init ##``: ``METADATA_NODE``;
- communication kernels: ``COMM_COLL_NODE`` (``comm_type``, ``comm_size``, ``pg_name``) or
  ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` (the peer, ``comm_size``), by the rules of ``plan.comm``;
  one whose kind, size or peer cannot be determined is written as a ``COMP_NODE`` (its duration
  kept) and counted in the summary, never invented.

Dependencies (every id referenced exists; the graph is acyclic by construction):
- ``ctrl_deps`` = the parent (a GPU op's parent is its launching CPU op). The process root's
  self-parent and parents missing from the ET are dropped.
- ``data_deps``: per ET thread a serial chain in start order. Start order is the pre-order of the
  ET tree with siblings by id (ET ids are given at op start), which is the linked-``ts`` order for
  linked ops and places unlinked ops by id; a parent always precedes its children, so the chain
  never contradicts a ctrl edge. Each GPU op depends on its launching CPU op and on the previous
  op (by GPU start time) on the same (device, stream).
- Waits, when Kineto shows the runtime call and the call lies inside a linked ET op W (the
  innermost linked op covering it); the GPU op "waited on" is chosen in issue (launch) order,
  which on a FIFO stream is also completion order and is immune to GPU/CPU clock skew:
  * ``cudaDeviceSynchronize`` (and ``cuCtxSynchronize``, ``hipDeviceSynchronize``): on every
    stream, the last GPU op issued before the call;
  * ``cudaStreamSynchronize`` / ``cudaEventSynchronize`` (cu*/hip* too): the stream named in the
    call's args when Kineto records it, else the stream of the last GPU op the same CPU thread
    issued before the call; the last GPU op issued on that stream before the call;
  * ``cudaStreamWaitEvent`` (Kineto records neither the event nor the streams): the waiting stream
    is that of the next GPU op the same thread issues after the call; the event's stream is the
    stream, other than the waiting one, of the thread's most recent launch before the call; the
    op waited on is the last op issued on that stream before the call.
  A blocking synchronize's edge goes to the first linked op of W's thread that starts after the
  call returns (the thread went on only then), or to W when none does; a synchronous copy (a
  ``cudaMemcpy``, or a ``cudaMemcpyAsync`` that returned after its copy ended) likewise makes the
  op after the call wait for the copy. A ``cudaStreamWaitEvent`` blocks no thread: its edge goes to
  the next GPU op the thread issued (the stream that waited). Edges that would go backward in the
  write order, waits outside any linked op, outside the linked window, or without an op to wait
  on are counted and skipped.
- Cross-thread ``fork`` / ``join`` edges and the collective order per process group
  (``plan.deps``, ``busy``). Every data dependency carries its cause in the ``string_list``
  attribute ``data_dep_causes`` (same length and order as ``data_deps``).

Durations: ``duration_micros`` is the node's busy time (``busy``): a CPU op's exclusive time minus
its blocked time before its first child, plus the host gap folded into it; each later piece of
that exclusive time is a node of its own (the op's name, ``continues`` = the op's id), run where
the thread ran it; a GPU op's duration. CPU values are rounded along their thread, so a thread's
total keeps its value. Linked CPU ops also carry ``inclusive_dur_micros`` (measured),
``exclusive_dur_micros``, ``blocked_micros`` and, when > 0, ``host_gap_micros`` and
``deferred_micros`` (the time their pieces carry; int64 µs, rounded); a thread root that carries
a worker's start offset has ``host_gap_micros`` too.

The rules live in two modules of their own: ``plan.comm`` (communication attributes) and
``plan.deps`` (dependencies, waits, write order); this module turns nodes into messages.

Nodes are written in a topological order of these dependencies (every dependency before its
dependent), ties broken by time, so streaming readers can resolve dependencies as they go.
Cost: O((n + g) log(n + g)) time for n ET nodes and g GPU ops; memory O(n + g) small ints besides
the ET+ itself (no second copy of the graph): each node message is built, written and dropped.
Messages are encoded ``CHUNK_NODES`` at a time by ``chakra_encode.NodeFrames``, one encoder for
CPU and GPU ops, straight to wire bytes, what repeats (op names, IO shapes/types, attribute
combinations) encoded once and kept as bytes; the tests build every message with protobuf and
compare the bytes. Chunks are written (and gzip-compressed) by a writer thread while the next
ones are encoded (``EtWriter``'s ``background``).
"""

from __future__ import annotations

import logging
import os
import time

import msgspec

from linker.link.etplus import EtPlus
from linker.model import et_def_pb2 as pb
from linker.model.output import Output
from linker.plan.comm import is_int
from linker.plan.dependency_plan import WriteSummary
from linker.plan.deps import dependency_plan
from linker.write.chakra_encode import NodeFrames
from linker.write.chakra_wire import EtWriter, make_attr

log = logging.getLogger("et_link")

# Chakra schema version this writer targets (the ET schema suffix "chakra.0.0.4").
CHAKRA_SCHEMA_VERSION = "0.0.4"
# Nodes encoded per chunk (one join, one write): about 3 MB of output on the large CPU pair;
# 8192 took 0.96x the whole run of 2048 (docs/performance.md), fewer numpy calls a node.
CHUNK_NODES = 8192


def metadata_message(et_plus: EtPlus) -> pb.GlobalMetadata:
    """``GlobalMetadata``: ``version`` plus the ET header fields that are present."""
    header = et_plus.et.header
    metadata = pb.GlobalMetadata(version=CHAKRA_SCHEMA_VERSION)
    for name, kind in (("schema", "string_val"), ("pid", "uint64_val"), ("time", "string_val"),
                       ("start_ts", "uint64_val"), ("finish_ts", "uint64_val")):
        value = getattr(header, name, msgspec.UNSET)
        if value is msgspec.UNSET or value is None:
            continue
        if kind == "uint64_val" and (not is_int(value) or value < 0):
            metadata.attr.append(make_attr(name, str(value), "string_val"))
        else:
            metadata.attr.append(make_attr(name, value, kind))
    return metadata


def write_chakra_trace(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = (),
                       pre_encoded=None, chunk_nodes: int = CHUNK_NODES) -> WriteSummary:
    """Write ``et_plus`` to ``path`` as a Chakra trace (gzip when it ends in ``.gz``) and return
    what was written. Atomic: on any error no file appears and an existing ``path`` is kept;
    ``protected`` paths (the inputs) are refused. Nodes are encoded ``chunk_nodes`` at a time (the
    bytes are the same for any number);
    ``pre_encoded``: the ET's own fields of each op, already encoded (``fields_child.PreEncoded``).
    Cost: see the module docstring."""
    started = time.perf_counter()
    summary = WriteSummary(str(path))
    plan = dependency_plan(et_plus, summary)
    frames = NodeFrames(et_plus, plan, summary, pre_encoded)
    order = plan.order
    # A writer thread pays where it compresses (``.et.gz``); for a plain ``.et`` it was measured to
    # save nothing (0.0-0.7% of a large run, docs/performance.md), so the encoder writes itself.
    with EtWriter(path, protected, background=Output.of(path).compressed) as writer:
        writer.write_metadata(metadata_message(et_plus))
        for start in range(0, len(order), chunk_nodes):
            chunk = order[start:start + chunk_nodes]
            encoded = frames.chunk(chunk)
            writer.write_frames_bytes(encoded, len(chunk))
            if start == 0:  # the file's size, extrapolated from the first chunk (a guess it forgives)
                writer.reserve(len(encoded) * len(order) // len(chunk) + (1 << 16))
        summary.nodes = writer.nodes_written
    summary.seconds = time.perf_counter() - started
    return summary


def write_et_plus_chakra(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = (),
                         pre_encoded=None) -> WriteSummary:
    """Pipeline entry point: ``write_chakra_trace``, its summary logged and returned."""
    summary = write_chakra_trace(et_plus, path, protected, pre_encoded)
    types = ", ".join(f"{name} {count}" for name, count in sorted(summary.counts_by_type.items()))
    log.info("wrote Chakra trace %s: %d nodes (%s) in %.2fs", path, summary.nodes, types, summary.seconds)
    log.info("waits: %d edges (%d moved past the launching op), skipped %s",
             summary.wait_edges, summary.wait_edges_redirected, dict(summary.waits_skipped) or "none")
    if summary.comm_unresolved:
        log.info("communication kernels written as COMP_NODE: %s", dict(summary.comm_unresolved))
    if summary.ctrl_deps_dropped:
        log.info("%d parents missing from the ET: ctrl_deps dropped", summary.ctrl_deps_dropped)
    if pre_encoded is not None:
        log.info("ET-only fields of %d ops encoded ahead by a child", summary.et_fields_from_child)
    return summary

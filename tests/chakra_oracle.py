"""The ``.et`` an ET+ should give, built with protobuf messages one node at a time: the oracle the
writer's wire-byte encoder (``chakra_encode.NodeFrames``) is compared with.

Only the rules come from the writer (which attributes a node carries and as which kind:
``attr_spec``, ``cpu_attr_pairs``, ``gpu_attrs``; the dependency plan); every byte comes from
protobuf's own serialiser (``pb.Node``, ``make_attr``), so tags, varints, packing, field order and
proto3 defaults are checked against protobuf, not against the encoder's tables.
"""

from __future__ import annotations

from collections import Counter

import msgspec

from linker.model import et_def_pb2 as pb
from linker.plan.comm import IOParts
from linker.plan.deps import WriteSummary, dependency_plan
from linker.read.et import FLAT
from linker.write.chakra import metadata_message
from linker.write.chakra_attrs import PER_OP_ATTRS, attr_spec, cpu_attr_pairs
from linker.write.chakra_encode import cpu_node_type_of, gpu_attrs
from linker.write.chakra_wire import make_attr
from linker.write.protobuf_wire import encode_varint

UNSET = msgspec.UNSET
_IO = msgspec.json.Decoder(IOParts)


def _text(raw) -> str:
    return "" if raw is None or raw is UNSET else str(raw, "utf-8", "replace")


def _set_io(target: pb.IOInfo, values, shapes, types, strides=None) -> None:
    target.values, target.shapes, target.types = _text(values), _text(shapes), _text(types)
    if strides is not None:
        target.strides = _text(strides)


def _fill_io(message: pb.Node, node, flat: bool) -> None:
    """``inputs`` / ``outputs``: the node's own JSON texts, present whenever the node has them."""
    if flat:
        if node.inputs is not UNSET:
            _set_io(message.inputs, node.inputs, node.input_shapes, node.input_types)
        if node.outputs is not UNSET:
            _set_io(message.outputs, node.outputs, node.output_shapes, node.output_types)
        return
    for raw, target in ((node.inputs, message.inputs), (node.outputs, message.outputs)):
        if raw is UNSET or raw is None:
            continue
        try:
            parts = _IO.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            target.values = _text(raw)
            continue
        _set_io(target, parts.values, parts.shapes, parts.types, parts.strides if len(parts.strides) else None)


def _micros(value) -> int:
    return max(0, round(value))


def _add_attrs(message: pb.Node, specs) -> None:
    for spec in specs:
        if spec is not None:
            name, kind, value = spec
            message.attr.append(make_attr(name, value, kind))


def _cpu_attrs(message: pb.Node, plan, u: int, node, flat: bool) -> None:
    """``is_cpu_op``, the per-op ids, the other ET attributes, then the time split."""
    pairs = cpu_attr_pairs(node, flat)
    own = [pair for pair in pairs if pair[0] in PER_OP_ATTRS]
    shared = [pair for pair in pairs if pair[0] not in PER_OP_ATTRS]
    _add_attrs(message, [("is_cpu_op", "bool_val", True)] + [attr_spec(*pair) for pair in own + shared])
    busy = plan.busy
    if node.ts is not UNSET:
        _add_attrs(message, [("inclusive_dur_micros", "int64_val", _micros(node.dur)),
                             ("exclusive_dur_micros", "int64_val", _micros(node.exclusive_dur)),
                             ("blocked_micros", "int64_val", _micros(busy.blocked[u]))])
    if busy.host_gap[u] > 0:
        _add_attrs(message, [("host_gap_micros", "int64_val", _micros(busy.host_gap[u]))])
    if busy.deferred[u] > 0:
        _add_attrs(message, [("deferred_micros", "int64_val", _micros(busy.deferred[u]))])


def whole_micros(et, sim: list[float], pieces=None) -> list[int]:
    """Each CPU node's busy time in whole µs: one running total over the nodes taken thread by
    thread (threads by number, ET order within each, each op's later pieces right after it, in
    their order), rounded, less the rounded total before the node. ``sim``: the ET ops' values,
    then the pieces'. A plain loop over the nodes grouped by thread."""
    n = len(et.tid)
    pieces_of: dict[int, list[int]] = {}
    for j, owner in enumerate(pieces.owner if pieces is not None else ()):
        pieces_of.setdefault(owner, []).append(n + j)
    by_thread: dict[int, list[int]] = {}
    for u in range(n):
        by_thread.setdefault(et.tid[u], []).extend([u] + pieces_of.get(u, []))
    whole = [0] * len(sim)
    total, written = 0.0, 0
    for tid in sorted(by_thread):
        for u in by_thread[tid]:
            total += sim[u]
            whole[u] = round(total) - written
            written = round(total)
    return whole


def piece_message(et_plus, plan, j: int, whole: list[int]) -> pb.Node:
    """The ``Node`` of later piece j: the op's name, ``COMP_NODE``, the op as its parent, its
    dependency, measured start and busy time, then ``is_cpu_op``, ``tid``, ``continues``,
    ``inclusive_dur_micros``, ``host_gap_micros`` (when a gap follows it) and the cause."""
    et, pieces, u = et_plus.et, plan.busy.pieces, plan.piece_start + j
    owner = pieces.owner[j]
    deps = plan.data_deps(u)
    message = pb.Node(id=plan.piece_ids[j], name=et.names[owner], type=cpu_node_type_of(et.names[owner]),
                      ctrl_deps=[et.ids[owner]],
                      data_deps=[plan.node_id(d, et.ids, et_plus.gpu_nodes) for d, _ in deps])
    message.start_time_micros = _micros(pieces.begin[j])
    message.duration_micros = whole[len(et.ids) + j]
    _add_attrs(message, [("is_cpu_op", "bool_val", True), ("tid", "int64_val", et.tid[owner]),
                         ("continues", "int64_val", et.ids[owner]),
                         ("inclusive_dur_micros", "int64_val", _micros(pieces.end[j] - pieces.begin[j]))])
    if pieces.host_gap[j] > 0:
        _add_attrs(message, [("host_gap_micros", "int64_val", _micros(pieces.host_gap[j]))])
    if deps:
        message.attr.append(make_attr("data_dep_causes", [cause for _, cause in deps], "string_list"))
    return message


def node_message(et_plus, plan, u: int, whole: list[int] | None = None) -> pb.Node:
    """The ``Node`` of node number ``u`` (ET op i is i, GPU op k is ``plan.cpu_count + k``, later
    piece j ``plan.piece_start + j``); ``whole``: the CPU nodes' ``whole_micros`` (computed here
    when not given)."""
    et, n = et_plus.et, plan.cpu_count
    flat = et.layout == FLAT

    def id_of(v: int) -> int:
        return plan.node_id(v, et.ids, et_plus.gpu_nodes)

    if whole is None:
        whole = whole_micros(et, plan.busy.sim.tolist() + plan.busy.pieces.sim.tolist(), plan.busy.pieces)
    if plan.is_piece(u):
        return piece_message(et_plus, plan, u - plan.piece_start, whole)
    deps = plan.data_deps(u)
    if u < n:
        node = et.nodes[u]
        node_type, duration = cpu_node_type_of(node.name), whole[u]
    else:
        node, comm = et_plus.gpu_nodes[u - n], plan.comm[u - n]
        node_type, duration = (pb.COMP_NODE if comm is None else comm.node_type), node.dur
    message = pb.Node(id=node.id, name=node.name, type=node_type,
                      ctrl_deps=[id_of(plan.ctrl[u])] if plan.ctrl[u] >= 0 else [],
                      data_deps=[id_of(d) for d, _ in deps])
    if node.ts is not UNSET and node.ts is not None:
        message.start_time_micros = _micros(node.ts)
    if duration is not UNSET and duration is not None:
        message.duration_micros = _micros(duration)
    _fill_io(message, node, flat)
    if u < n:
        _cpu_attrs(message, plan, u, node, flat)
    else:
        link = et_plus.gpu_links[u - n]
        _add_attrs(message, gpu_attrs(node, et.tid[link.et_index], comm))
    if deps:
        message.attr.append(make_attr("data_dep_causes", [cause for _, cause in deps], "string_list"))
    return message


def expected_et(et_plus) -> tuple[bytes, list[bytes], WriteSummary]:
    """The ``.et`` file's bytes (not gzip), its messages (metadata first) and the summary's
    counts by node type, as the oracle makes them."""
    summary = WriteSummary("")
    plan = dependency_plan(et_plus, summary)
    whole = whole_micros(et_plus.et, plan.busy.sim.tolist() + plan.busy.pieces.sim.tolist(), plan.busy.pieces)
    messages = [metadata_message(et_plus)] + [node_message(et_plus, plan, u, whole) for u in plan.order]
    summary.counts_by_type = Counter(pb.NodeType.Name(m.type) for m in messages[1:])
    frames = [m.SerializeToString() for m in messages]
    return b"".join(encode_varint(len(frame)) + frame for frame in frames), frames, summary

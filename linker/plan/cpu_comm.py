"""CPU collectives: gloo (and MPI / UCC) collectives as communication nodes.

A CPU backend runs a collective on one of its own worker threads: PyTorch records it as a
``gloo:<collective>`` record function (``mpi:`` / ``ucc:`` likewise), which Kineto shows on the
worker thread, lasting from the worker taking the work to the collective's end (waiting for the
peers included). The ET op of the same record function is joined to that event; ``link.measured``
has already put it on its measured thread. Here each such joined op becomes a communication node:

- kind from its name (``plan.comm.kind_from_name``): a collective, or a send / receive
  (``gloo:send``, ``gloo:recv``: point-to-point, below);
- ``comm_size``: bytes of its own tensor inputs (the ET records the bucket it reduces), else of the
  ``c10d::*`` call that issued it (``_IssuingCalls``: its parent, or, when the ET names another
  parent, the latest such call by record-function id); a scatter's always the call's first
  argument, the chunk each rank receives; an op whose size is unknown stays a CPU op;
- process group: the one its trace names (Kineto "Process Group Name" on the event, else
  ``record_param_comms`` above it), else the world group;
- its *issue number* (``seq``; ``issue_numbers``): which of the rank's ``c10d::`` collective calls
  issued it, so ranks pair their collectives by it, and a collective the ET lost at the end of the
  trace leaves a gap instead of shifting the others;
- its *consumer* (``consumers``): the first op of the issuing thread, after the collective
  started, whose inputs use a tensor storage the collective writes (``written_storages``: the
  issuing call's first argument; DDP's
  ``copy_bucket_to_grad`` views of the bucket, an optimizer reading gradients that are bucket
  views). That op could not run before the result was there: the thread waited for the
  collective (``work.wait()``, no op of its own) from its last activity until the consumer began.
  ``plan.busy`` counts that wait as blocked time and gives the consumer a ``join`` edge from the
  collective. The worker's record function ends a little after the waiting thread is woken
  (the backend completes the work inside it), so the wait cannot be found from the worker's end;
  the data the collective hands back finds it;
- its *wait op* (``wait_ops``), for PyTorch's functional collectives: the call returns at once
  and the thread waits in ``_c10d_functional::wait_tensor`` given the collective's tensor. When
  that op began before the collective ended, the thread waited in it: ``plan.busy`` counts the
  wait as blocked time of the wait op and gives its part after the collective's end a ``join``
  edge from the collective, as for a call that waits; the ops between the call and the wait that
  take the tensor (``_wrap_tensor_autograd``) do not read its data, so they are no consumer. A
  wait op that began after the collective ended is its consumer;
- its busy time is its measured interval up to its *end*, less any part spent while the group's
  earlier collective still ran (``hold_for_measured_duration``: the replay serialises a group's
  collectives; its ``collective_order`` edge comes from the earlier one that ended last by its
  end); the host gap ``busy`` folded into it
  (the worker's idle time until its next collective) and any blocked time are dropped. Its end is
  the earlier of its record function's end and its consumer's start: the result was there when
  the consumer read it, and a worker descheduled before closing the record function (seen for
  14 ms on a loaded host) did not make the collective longer.

A CPU backend's send or receive (``c10d::send`` / ``c10d::recv_``, pipeline stages) differs: the
record is made on the issuing thread when the call enqueues the transfer and ended by the thread
that waits for it (``work.wait()``, no op of its own), when the transfer is done. Its peer and tag
are the issuing call's two int arguments (``dst`` / ``src``, then ``tag``; a group rank, mapped to a
global one through the group's ranks: gloo names no group on the record, so that is the world group
when the job had no other, and unknown otherwise); a send or receive whose peer is unknown (a
receive from any source, or a rank of an unnamed group) stays a CPU op. Such a node is a
``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` busy for its whole record (the peer's lateness and the
transfer), apart from the group's collectives (gloo runs a pair of them outside its collective
queue); where the issuing thread sat when the record ended, it waited: that idle time is blocked and
what the thread ran next follows the transfer (``plan.busy._point_to_point_waits``: a ``join``
edge). A send whose call wrote the bytes before it made the record (nothing else of the thread ran
in the call first) is busy from the call's start, the call's time before the record blocked
(``plan.busy._sends_begun_in_their_call``, ``busy.begun_at``).

Cost: O(n) name checks plus one parse of the few collectives' inputs.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import Counter

import numpy as np
from msgspec import UNSET

from linker.link.measured import CPU_BACKEND_PREFIXES
from linker.model import chakra_kinds as kinds
from linker.plan.comm import (COLL, PARAM_COMMS_NAME, PYTORCH_WORLD_GROUP, SEND, CommAttrs, OpIO, dtype_name, is_int,
                              job_group_id, kind_from_name, op_inputs, read_process_groups, tensors_bytes,
                              _TENSOR_DTYPE)

_ISSUING_PREFIXES = ("c10d::", PARAM_COMMS_NAME)
MAX_ANCESTORS = 4  # how far up a record_param_comms naming the group is looked for


def is_cpu_comm_name(name: str) -> bool:
    """True for a CPU backend's record of a collective, a send or a receive (``gloo:all_reduce``,
    ``gloo:send``, ``mpi:allgather``, ``ucc:...``)."""
    return name.startswith(CPU_BACKEND_PREFIXES) and kind_from_name(name) is not None


def is_point_to_point(attrs: CommAttrs) -> bool:
    """True for a send or receive node."""
    return attrs.node_type in (kinds.COMM_SEND_NODE, kinds.COMM_RECV_NODE)


def is_send(attrs: CommAttrs) -> bool:
    return attrs.node_type == kinds.COMM_SEND_NODE


def _dtype(io) -> str | None:
    for type_name in io.types:
        found = _TENSOR_DTYPE.findall(type_name) if isinstance(type_name, str) else []
        if found and dtype_name(found[0]):
            return dtype_name(found[0])
    return None


def _named_group(et_plus, i: int, event, groups, parent_index) -> str | None:
    """PyTorch's numeric pg name as the trace names it: the event's "Process Group Name", else a
    record_param_comms ancestor's group argument; None when it names none (a collective is then
    in the world group)."""
    candidates = []
    if event is not None and getattr(event.args, "pg_name", None) is not None:
        candidates.append(event.args.pg_name)
    et = et_plus.et
    p, depth = parent_index[i], 0
    while p >= 0 and depth < MAX_ANCESTORS:
        if et.names[p] == PARAM_COMMS_NAME:
            for value in op_inputs(et.nodes[p], et.layout).values:
                if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
                    candidates += value
                elif isinstance(value, str) and value.isdigit():
                    candidates.append(value)
            break
        p, depth = parent_index[p], depth + 1
    for candidate in candidates:
        name = groups.numeric_name(candidate)
        if name is not None:
            return name
    return None


def _issuers(et, event_of_op, rf_of_event) -> list[tuple[int, int]]:
    """(record-function id, ET index) of every joined ``c10d::<collective>`` op (the calls that
    issue collectives), by record-function id."""
    found = []
    for i, name in enumerate(et.names):
        if name.startswith("c10d::") and event_of_op[i] >= 0:
            kind = kind_from_name(name)
            rf = rf_of_event[event_of_op[i]]
            if kind is not None and kind.role == COLL and isinstance(rf, int):
                found.append((rf, i))
    found.sort()
    return found


def issue_numbers(et_plus, collectives: list[int]) -> tuple[dict[int, int], list[int]]:
    """The issue number of each CPU collective: the position, among the rank's joined
    ``c10d::<collective>`` calls in record-function order, of the call that issued it — the latest
    one whose record function was created before the collective's (a backend creates a
    collective's record function when the call enqueues it; ids grow in creation order). Every rank
    issues a group's collectives in the same order, so equal numbers are one collective, even where
    the ET lost some (the observer writes an op when it ends: a collective still running when the
    trace stopped is not in the ET). Also the issue numbers of calls whose collective the ET lacks.
    O(c log c)."""
    et, match = et_plus.et, et_plus.result.match
    rf_of_event = et_plus.result.kineto.cpu_columns().rf_id
    issuers = _issuers(et, match.event_of_op, rf_of_event)
    rfs = [rf for rf, _ in issuers]
    numbers: dict[int, int] = {}
    for i in collectives:
        position = _issued_by(rfs, rf_of_event[match.event_of_op[i]])
        if position >= 0:
            numbers[i] = position
    used = set(numbers.values())
    unrecorded = [k for k in range(len(issuers)) if k not in used] if numbers else []
    return numbers, unrecorded


def _issued_by(rfs: list[int], rf) -> int:
    """The position, among the issuing calls' sorted record-function ids ``rfs``, of the call that
    issued a record of id ``rf``: the latest created before it; -1 for none (or no id)."""
    return bisect_left(rfs, rf) - 1 if isinstance(rf, int) else -1


def issuing_calls(et_plus, comm: dict[int, CommAttrs]) -> dict[int, int]:
    """CPU collective ET index -> ET index of the ``c10d::`` call that issued it (by its issue
    number, ``issue_numbers``); collectives without one are absent. O(c log c)."""
    numbered = {i: attrs.seq for i, attrs in comm.items() if attrs.seq is not None}
    if not numbered:
        return {}
    issuers = _issuers(et_plus.et, et_plus.result.match.event_of_op, et_plus.result.kineto.cpu_columns().rf_id)
    return {i: issuers[seq][1] for i, seq in numbered.items() if 0 <= seq < len(issuers)}


def lost_issuers(et_plus, comm: dict[int, CommAttrs]) -> list[int]:
    """ET indices of the ``c10d::`` collective calls whose collective the ET lacks (it was still
    running when the trace stopped: the observer writes an op when it ends), when ``comm``'s
    collectives carry issue numbers; else []. O(c log c)."""
    numbered = [i for i, attrs in comm.items() if attrs.seq is not None]
    if not numbered:
        return []
    _, lost = issue_numbers(et_plus, numbered)
    if not lost:
        return []
    issuers = _issuers(et_plus.et, et_plus.result.match.event_of_op, et_plus.result.kineto.cpu_columns().rf_id)
    return [issuers[k][1] for k in lost]


def cpu_collectives(et_plus, unnamed: Counter | None = None) -> dict[int, CommAttrs]:
    """ET index -> communication attributes of every joined CPU collective, send and receive (see
    the module docstring). ``unnamed``, when given, counts those whose trace names no process
    group in a job that had others: "collectives" (taken as the world group's: a collective of
    another group is then matched with the wrong ranks), "point_to_point" (kept as CPU ops), and
    "groups", how many the job had. O(n) name checks; the inputs of those ops (and their parents)
    parsed once."""
    et, match = et_plus.et, et_plus.result.match
    comm_names = set(filter(is_cpu_comm_name, set(et.names)))  # a few hundred distinct names
    if not comm_names:
        return {}
    found = [i for i, name in enumerate(et.names) if name in comm_names and match.event_of_op[i] >= 0]
    if not found:
        return {}
    groups = read_process_groups(et_plus)
    parent_index = et.parent_index()
    events = et_plus.result.kineto.cpu_events
    issuing = _IssuingCalls(et_plus, parent_index)
    out: dict[int, CommAttrs] = {}
    for i in found:
        kind = kind_from_name(et.names[i])
        io, size = _size(et, i, kind, issuing)
        if not size:
            continue
        group = _named_group(et_plus, i, events[match.event_of_op[i]], groups, parent_index)
        group_unknown = group is None and not groups.world_only()
        if group_unknown and unnamed is not None:
            unnamed["collectives" if kind.role == COLL else "point_to_point"] += 1
            unnamed["groups"] = groups.count
        if kind.role == COLL:
            out[i] = CommAttrs(kinds.COMM_COLL_NODE, comm_type=kind.comm_type, comm_size=size,
                               pg_name=job_group_id(group or PYTORCH_WORLD_GROUP), dtype=_dtype(io))
            continue
        if group_unknown:
            continue  # its peer is a rank of a group the trace does not name
        group = group or PYTORCH_WORLD_GROUP
        peer_and_tag = _peer_and_tag(et, parent_index[i], kind.role, groups.ranks_of_name.get(group))
        if peer_and_tag is not None:
            out[i] = _point_to_point_attrs(kind.role, peer_and_tag, et_plus.result.kineto.rank, size,
                                           job_group_id(group), _dtype(io))
    collectives = [i for i, attrs in out.items() if attrs.node_type == kinds.COMM_COLL_NODE]
    if len({out[i].pg_name for i in collectives}) == 1:  # numbered among one group's calls only
        numbers, _ = issue_numbers(et_plus, collectives)
        for i, number in numbers.items():
            out[i].seq = number
    return out


class _IssuingCalls:
    """The ``c10d::`` call that issued a CPU collective's record: its parent when that is one, else
    (a record ``link.measured`` placed on its worker thread) the latest joined ``c10d::<collective>``
    call whose record function was created before the record's (``issue_numbers``' rule)."""

    def __init__(self, et_plus, parent_index):
        self.et, self.parent_index = et_plus.et, parent_index
        self.rf_of_event, self.event_of_op = et_plus.result.kineto.cpu_columns().rf_id, et_plus.result.match.event_of_op
        self._issuers: list[tuple[int, int]] | None = None
        self._rfs: list[int] = []

    def of(self, i: int) -> int:
        parent = self.parent_index[i]
        if parent >= 0 and self.et.names[parent].startswith("c10d::"):
            return parent
        if self._issuers is None:
            self._issuers = _issuers(self.et, self.event_of_op, self.rf_of_event)
            self._rfs = [rf for rf, _ in self._issuers]
        k = _issued_by(self._rfs, self.rf_of_event[self.event_of_op[i]])
        return self._issuers[k][1] if k >= 0 else -1


def _size(et, i: int, kind, issuing: _IssuingCalls):
    """(the inputs read, bytes) of a CPU collective, send or receive: its record's tensor inputs,
    else those of the call that issued it; for a scatter, always the call's first argument (the
    tensor each rank receives: the root's record holds the whole list, the others' nothing)."""
    scatter = kind.role == COLL and kind.comm_type == kinds.SCATTER
    io = op_inputs(et.nodes[i], et.layout)
    size = None if scatter else tensors_bytes(io)
    if not size:
        call = issuing.of(i)
        if call < 0:
            return io, None
        io = op_inputs(et.nodes[call], et.layout)
        if scatter:
            io = OpIO(io.values[:1], io.shapes[:1], io.types[:1])
        size = tensors_bytes(io)
    return io, size


def _peer_and_tag(et, issuer: int, role: str, group_ranks: list[int] | None) -> tuple[int, int] | None:
    """(peer as a global rank, tag) of a CPU send or receive: the two int arguments of the
    ``c10d::`` call that issued it (``issuer``, its parent: ``dst`` or ``src``, then ``tag``); None
    when the parent is not such a call or names no peer (a receive from any source)."""
    if issuer < 0 or not et.names[issuer].startswith("c10d::"):
        return None
    kind = kind_from_name(et.names[issuer])
    if kind is None or kind.role != role:
        return None
    io = op_inputs(et.nodes[issuer], et.layout)
    ints = [value for value, type_name in zip(io.values, io.types) if type_name == "Int" and is_int(value)]
    if len(ints) != 2:
        return None
    peer, tag = ints
    if group_ranks and 0 <= peer < len(group_ranks):
        peer = group_ranks[peer]
    return peer, tag


def _point_to_point_attrs(role: str, peer_and_tag: tuple[int, int], rank: int | None, size: int, group_id: str,
                          dtype: str | None) -> CommAttrs:
    """A CPU send's or receive's attributes: its peer on one side, this rank (when the trace
    names it) on the other."""
    peer, tag = peer_and_tag
    if role == SEND:
        return CommAttrs(kinds.COMM_SEND_NODE, comm_size=size, pg_name=group_id, dtype=dtype, comm_src=rank,
                         comm_dst=peer, comm_tag=tag)
    return CommAttrs(kinds.COMM_RECV_NODE, comm_size=size, pg_name=group_id, dtype=dtype, comm_src=peer,
                     comm_dst=rank, comm_tag=tag)


def _storages(io) -> set[int]:
    """Storage ids of the tensors (and tensor lists) among ``io``'s values: the second entry of an
    ET tensor value ``[tensor_id, storage_id, offset, numel, elem_bytes, device]``."""
    found: set[int] = set()
    for position, type_name in enumerate(io.types):
        if not isinstance(type_name, str) or "Tensor" not in type_name or position >= len(io.values):
            continue
        value = io.values[position]
        items = [value] if type_name.startswith("Tensor") else value if isinstance(value, list) else []
        for item in items:
            if (isinstance(item, list) and len(item) == 6 and isinstance(item[1], int)
                    and not isinstance(item[1], bool) and isinstance(item[5], str)):
                found.add(item[1])
    return found


# PyTorch's functional collectives (DTensor, tensor parallelism, compiled graphs) return at once and
# wait for the result in an op of their own; ``c10d_functional::`` is the namespace before 2.2.
WAIT_OPS = frozenset({"_c10d_functional::wait_tensor", "c10d_functional::wait_tensor"})


def wait_ops(et, comm: dict[int, CommAttrs], thread_ops: list[int], thread_starts: list[float],
             issued_at: dict[int, float], issued: dict[int, int] | None = None) -> dict[int, int]:
    """Collective ET index -> the op of one thread that waits for it (``WAIT_OPS``): the first
    such op starting at or after the collective was issued (``issued_at``: its issuing call's
    start; the worker may take the work after the wait began) whose inputs share a storage with
    what the collective writes, as ``consumers`` finds an op (``issued``: its issuing calls). A
    collective none waits for is absent. One pass over the thread's op names, then ``consumers``
    over the wait ops. O(m + w parses)."""
    names = et.names
    at = [p for p, op in enumerate(thread_ops) if names[op] in WAIT_OPS]
    if not at:
        return {}
    return consumers(et, comm, [thread_ops[p] for p in at], [thread_starts[p] for p in at], issued_at, issued)


def written_storages(et, i: int, call: int = -1) -> set[int]:
    """The tensor storages collective ``i`` writes, which an op must read to need its result: the
    first argument of the ``c10d::`` call that issued it (``call``; ``i`` itself when it is such a
    call): c10d puts first what a collective writes, the tensors of an in-place all_reduce,
    broadcast or reduce, the outputs of an all_gather, gather, scatter, reduce_scatter or
    all_to_all. Without a call, the record's own tensor inputs (the records of in-place
    collectives hold their tensors; an all_gather's holds only its input, which it does not
    write). O(one parse)."""
    if et.names[i].startswith("c10d::"):
        call = i
    if call >= 0:
        io = op_inputs(et.nodes[call], et.layout)
        return _storages(OpIO(io.values[:1], io.shapes[:1], io.types[:1]))
    return _storages(op_inputs(et.nodes[i], et.layout))


def consumers(et, comm: dict[int, CommAttrs], thread_ops: list[int], thread_starts: list[float],
              collective_starts: dict[int, float], issued: dict[int, int] | None = None) -> dict[int, int]:
    """Collective ET index -> its consumer on one thread (module docstring): the first of
    ``thread_ops`` (that thread's linked ops in start order, ``thread_starts`` their starts)
    starting at or after the collective's measured start (``collective_starts``) whose input
    tensors share a storage with what the collective writes (``written_storages``; ``issued``:
    collective -> the call that issued it, when known). A collective none reads is absent.

    One sweep over the thread from the earliest collective's start; an op's inputs are parsed
    only while some collective still waits for its consumer. O(m) parses for the m ops swept."""
    wanted: list[tuple[float, int, set[int]]] = []
    issued = issued or {}
    for i in comm:
        storages = written_storages(et, i, issued.get(i, -1))
        if storages and i in collective_starts:
            wanted.append((collective_starts[i], i, storages))
    if not wanted:
        return {}
    wanted.sort()
    found: dict[int, int] = {}
    pending: list[tuple[int, set[int]]] = []
    next_wanted = 0
    for p in range(bisect_left(thread_starts, wanted[0][0]), len(thread_ops)):
        start = thread_starts[p]
        while next_wanted < len(wanted) and wanted[next_wanted][0] <= start:
            pending.append(wanted[next_wanted][1:])
            next_wanted += 1
        if not pending:
            if next_wanted == len(wanted):
                break
            continue
        op = thread_ops[p]
        if op in comm or et.names[op].startswith(_ISSUING_PREFIXES):  # the calls that issue collectives
            continue
        used = _storages(op_inputs(et.nodes[op], et.layout))
        if not used:
            continue
        still = []
        for i, storages in pending:
            if storages & used:
                found[i] = op
            else:
                still.append((i, storages))
        pending = still
        if not pending and next_wanted == len(wanted):
            break
    return found


def issue_order(et, comm: dict[int, CommAttrs]) -> dict[str, list[int]]:
    """Per process group, its CPU collectives in issue order; sends and receives are not among
    them. The order is that of the records' record-function ids, made when the call enqueues the
    work on the issuing thread (the order ``issue_numbers`` pairs ranks by), else of their ET ids.
    An ET id is given when a worker thread starts the record: two workers that start within µs of
    each other can take theirs in the other order (seen 28 µs apart on a 4-rank DDP job over gloo).
    O(c log c)."""
    groups: dict[str, list[int]] = {}
    for i in comm:
        if not is_point_to_point(comm[i]):
            groups.setdefault(comm[i].pg_name, []).append(i)
    for members in groups.values():
        if all(et.rf_id[i] > 0 for i in members):
            members.sort(key=lambda i: (et.rf_id[i], et.ids[i]))
        else:
            members.sort(key=et.ids.__getitem__)
    return groups


def hold_for_measured_duration(busy, et, comm: dict[int, CommAttrs],
                               stretches: dict[int, tuple[float, float]] | None = None) -> list[tuple[int, int]]:
    """Busy time of each CPU collective, and the ``collective_order`` edges that serialise each
    process group's collectives (source, target ET indices).

    A replay runs one collective at a time per group (ASTRA-sim: one in flight per rank), while a
    CPU backend may run two on two worker threads at once. Each collective's busy time is the part
    of its measured interval after the group's earlier collectives (issue order) had ended: from
    the later of its start and their latest end to its own end (0 when it ended under them), so
    serialised they end when they ended. No blocked time, no host gap (a worker's idle time is
    nobody's work). The end is the earlier of the measured end and the consumer's start
    (``busy.consumed_at``). ``stretches``: collective -> the part of its record where it
    communicated, when ops its worker ran for it lie in the record (``communication_stretches``);
    its start and end stand for the record's.

    Its edge comes from the earlier collective that ended last *before it ended*
    (``_latest_ended_by``): the one whose end its busy part follows. A collective that ended under
    an earlier one (gloo ran both at once) follows only those that had ended by then, or none: an
    edge from the one still running would order it after an end it did not wait for, which the
    measured timeline contradicts.

    A send or receive is busy for its whole record (from the call that enqueued it to the wait
    that saw it done), a send whose transfer began in its call from the call's start
    (``busy.begun_at``), outside the group's order. O(c log c) for c collectives."""
    edges = []
    consumed_at = busy.consumed_at
    stretches = stretches or {}
    for i in [i for i, attrs in comm.items() if is_point_to_point(attrs)]:
        start = float(et.nodes[i].ts)
        busy.sim[i] = start + float(et.nodes[i].dur) - busy.begun_at.get(i, start)
        busy.blocked[i] = busy.host_gap[i] = 0.0
    for members in issue_order(et, comm).values():
        ended: list[tuple[float, int]] = []  # (end, ET index) of the earlier members, sorted
        for i in members:
            start, end = stretches.get(i) or (float(et.nodes[i].ts), float(et.nodes[i].ts) + float(et.nodes[i].dur))
            end = max(start, min(end, consumed_at.get(i, end)))
            latest_end = ended[-1][0] if ended else float("-inf")
            busy.sim[i] = max(0.0, end - max(start, latest_end))
            busy.blocked[i] = 0.0
            busy.host_gap[i] = 0.0
            source = _latest_ended_by(ended, end)
            if source is not None:
                edges.append((source, i))
            insort(ended, (end, i))
    return edges


def communication_stretches(et, comm: dict[int, CommAttrs], preorder: list[int], parent,
                            follows: dict[int, int]) -> dict[int, tuple[float, float]]:
    """Collective -> (start, end) of the part of its record in which it communicated, for the
    collectives whose record holds ops its worker ran for it (``link.measured``): from the end of
    the last op it ran before communicating (``follows``, placed before it) to the start of its
    first child (the first op it ran after, reading the result), each the record's own start or
    end where there is none. O(n) in numpy for the collectives' places in ``preorder``."""
    if not comm:
        return {}
    order = np.asarray(preorder, dtype=np.int64)
    places = np.flatnonzero(np.isin(order, np.fromiter(comm, dtype=np.int64)))
    stretches = {}
    for k in places.tolist():
        i = preorder[k]
        node = et.nodes[i]
        start, end = float(node.ts), float(node.ts) + float(node.dur)
        before = follows.get(i)
        if before is not None and et.nodes[before].ts is not UNSET:
            start = max(start, float(et.nodes[before].ts) + float(et.nodes[before].dur))
        child = preorder[k + 1] if k + 1 < len(preorder) else -1
        if child >= 0 and parent[child] == i and et.nodes[child].ts is not UNSET:
            end = max(start, min(end, float(et.nodes[child].ts)))
        if (start, end) != (float(node.ts), float(node.ts) + float(node.dur)):
            stretches[i] = (start, end)
    return stretches


def _latest_ended_by(ended: list[tuple[float, int]], end: float) -> int | None:
    """Of ``ended`` (sorted (end, index) pairs), the index of the one that ended last at or before
    ``end``; None when none had. O(log c)."""
    k = bisect_right(ended, (end, float("inf")))
    return ended[k - 1][1] if k else None

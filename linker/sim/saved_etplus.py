"""A saved ET+ (ET+ JSON or Chakra ``.et``, plain or gzip) read for its times, and its tables (``linker.load``).

Where the time of a step went, HTA-style, from the file alone: no link result, no Kineto trace.
One pass over the file fills a column per quantity (µs), read from the fields et-link writes
(docs/formats.md; their meaning in docs/durations.md), ET+ JSON / ``.et``:

- ``ts_us``: ``ts`` / ``start_time_micros``;
- ``measured_us``: ``inclusive_dur`` (else ``dur``) / ``inclusive_dur_micros`` (a GPU op: its
  ``duration_micros``); for a later piece, the span it lay over;
- ``exclusive_us``: ``exclusive_dur`` / ``exclusive_dur_micros`` (a GPU op: its duration);
- ``blocked_us``, ``deferred_us``, ``host_gap_us``: ``blocked_dur``, ``deferred_dur``,
  ``host_gap_dur`` / ``blocked_micros``, ``deferred_micros``, ``host_gap_micros``;
- ``sim_us``: ``sim_dur`` (older ET+: ``exclusive_dur`` for CPU ops, ``dur`` for GPU ops, as a
  replay reads them) / ``duration_micros``.

``busy_us`` = ``sim_us - host_gap_us``: the node's own working time, what a replay runs as its op
(the host gap folded into it is Python between ops, not the op's). A time the node does not have
is NaN (``ts_us``, ``measured_us``, ``exclusive_us`` of an unlinked op or a later piece); the
others default to 0.

The tables (``SavedEtPlus``): ``nodes_table`` one row per node, later pieces included;
``ops_table`` one row per op, each later piece (a node with ``continues``) counted in the op it
continues; ``op_names_table`` one row per op name and kind, ranked by busy time, so an op that
mostly waited (``## backward ##`` while the autograd thread runs) ranks by its work, its wait in
``blocked_us``. A table is a pandas DataFrame, or with ``as_rows=True`` a list of dicts
(``link.tables.make_table``).

Errors a user can fix (missing file, not JSON nor protobuf, an ET not linked yet) raise
``TraceInputError`` naming the file. Cost: O(file size) to read, one msgspec decode (JSON) or one
slim protobuf parse per node (``.et``); O(n) per table; memory O(n) numbers plus the names.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from google.protobuf.message import DecodeError

from linker.model import et_def_pb2 as pb
from linker.model.errors import TraceInputError
from linker.plan.comm import PROCESS_GROUP_INIT
from linker.read.files import read_trace_bytes
from linker.sim.graph import COMM, CPU, GPU, KIND_NAMES, META
# The replay reader's slim Node parse and nested-layout tid lookup, shared rather than copied.
from linker.sim.load import GPU_CATS, JSON, _tid_of, file_kind
from linker.sim.load_chakra import SlimNode, node_payloads
from linker.sim.critical import WAIT
from linker.write.chakra_wire import attr_value
from linker.write.protobuf_wire import decode_varint
from linker.write.wait_nodes import WAIT_NODE_NAME

NAN = math.nan
# The columns of ``ops_table`` that ``op_names_table`` sums per op name.
_SUMMED = ("pieces", "measured_us", "exclusive_us", "blocked_us", "busy_us", "host_gap_us", "sim_us")
NOT_LINKED = ("no node has a measured time: not an ET+ (an Execution Trace not linked yet, or a file another "
              "tool wrote): link it first: et-link --et-file ET --kineto-file KINETO -o OUT.json "
              "(et-link validate FILE says what the file holds)")


@dataclass
class SavedEtPlus:
    """One saved ET+ as columns, one entry per node in file order (module docstring for each)."""

    path: Path
    format: str  # "json" or "et"
    ids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kind: bytearray = field(default_factory=bytearray)  # graph.CPU / GPU / COMM / META
    tid: list[int] = field(default_factory=list)  # CPU thread; a GPU op: its launching thread
    stream: list[int | None] = field(default_factory=list)  # GPU ops only
    continues: list[int | None] = field(default_factory=list)  # a later piece: the id of its op
    ts: list[float] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)
    exclusive: list[float] = field(default_factory=list)
    blocked: list[float] = field(default_factory=list)
    deferred: list[float] = field(default_factory=list)
    host_gap: list[float] = field(default_factory=list)
    sim: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def busy(self) -> list[float]:
        """Per node: ``sim - host_gap``, its working time (none for a wait node: it is a wait)."""
        return [0.0 if name == WAIT_NODE_NAME else s - g for s, g, name in zip(self.sim, self.host_gap, self.names)]

    def kinds(self) -> list[str]:
        """Per node its kind's name; ``wait`` for the wait nodes of the file (``write.wait_nodes``)."""
        return [WAIT if name == WAIT_NODE_NAME else KIND_NAMES[k] for k, name in zip(self.kind, self.names)]

    def nodes_table(self, as_rows: bool = False):
        """One row per node, in file order: ``id``, ``name``, ``kind`` (cpu, gpu, comm,
        metadata; ``wait`` for a measured wait the file carries as a node: its ``sim_us`` is the
        wait, its busy time none), ``tid``, ``stream``, ``continues`` (a later piece: its op's id;
        else None), ``ts_us``, ``measured_us``, ``exclusive_us``, ``blocked_us``, ``deferred_us``,
        ``host_gap_us``, ``busy_us``, ``sim_us``."""
        from linker.link.tables import make_table

        waits = [name == WAIT_NODE_NAME for name in self.names]
        return make_table({
            "id": self.ids, "name": self.names, "kind": self.kinds(), "tid": self.tid,
            "stream": self.stream, "continues": self.continues, "ts_us": self.ts,
            "measured_us": [math.nan if w else v for w, v in zip(waits, self.measured)],
            "exclusive_us": [math.nan if w else v for w, v in zip(waits, self.exclusive)],
            "blocked_us": self.blocked, "deferred_us": self.deferred,
            "host_gap_us": self.host_gap, "busy_us": self.busy(), "sim_us": self.sim},
            as_rows, integer_columns=("stream", "continues"))

    def op_columns(self) -> dict[str, list]:
        """The columns of ``ops_table``: every node that is not a later piece, each piece's busy,
        host-gap and sim time added to its op's (a piece whose op the file lacks stays a row of
        its own). O(n)."""
        busy = self.busy()
        op_ids = {node_id for node_id, op in zip(self.ids, self.continues) if op is None}
        rows = [i for i, op in enumerate(self.continues)
                if (op is None or op not in op_ids) and self.names[i] != WAIT_NODE_NAME]  # a wait is no op
        row_of_id = {self.ids[i]: r for r, i in enumerate(rows)}
        columns: dict[str, list] = {
            "id": [self.ids[i] for i in rows], "name": [self.names[i] for i in rows],
            "kind": [KIND_NAMES[self.kind[i]] for i in rows], "tid": [self.tid[i] for i in rows],
            "stream": [self.stream[i] for i in rows], "ts_us": [self.ts[i] for i in rows],
            "measured_us": [self.measured[i] for i in rows], "exclusive_us": [self.exclusive[i] for i in rows],
            "blocked_us": [self.blocked[i] for i in rows], "busy_us": [busy[i] for i in rows],
            "host_gap_us": [self.host_gap[i] for i in rows], "sim_us": [self.sim[i] for i in rows],
            "pieces": [0] * len(rows)}
        op_busy, op_gap, op_sim = columns["busy_us"], columns["host_gap_us"], columns["sim_us"]
        pieces = columns["pieces"]
        for i, op in enumerate(self.continues):
            if op is None or op not in op_ids:
                continue
            r = row_of_id[op]
            op_busy[r] += busy[i]
            op_gap[r] += self.host_gap[i]
            op_sim[r] += self.sim[i]
            pieces[r] += 1
        return columns

    def ops_table(self, as_rows: bool = False):
        """One row per op (ET op or GPU op), in file order, its later pieces counted in it:
        ``id``, ``name``, ``kind``, ``tid``, ``stream``, ``ts_us``, ``measured_us``,
        ``exclusive_us``, ``blocked_us`` (the op's own), ``busy_us``, ``host_gap_us``, ``sim_us``
        (the op's node and its pieces together: ``busy_us`` is the op's exclusive time less its
        blocked time), ``pieces`` (how many)."""
        from linker.link.tables import make_table

        return make_table(self.op_columns(), as_rows, integer_columns=("stream",))

    def op_names_table(self, as_rows: bool = False):
        """One row per op name and kind, the most busy time first (where the time goes):
        ``name``, ``kind``, ``ops`` (how many), ``pieces``, ``measured_us``, ``exclusive_us``,
        ``blocked_us``, ``busy_us``, ``host_gap_us``, ``sim_us``: sums over its ops (a time an
        op does not have counts 0), ``busy_share`` (its part of all the file's busy time of that
        kind)."""
        from linker.link.tables import make_table

        ops = self.op_columns()
        group_of: dict[tuple[str, str], int] = {}  # (name, kind) -> its row
        group_of_op = [group_of.setdefault(key, len(group_of)) for key in zip(ops["name"], ops["kind"])]
        keys = list(group_of)
        counts = [0] * len(keys)
        for g in group_of_op:
            counts[g] += 1
        totals: dict[str, list] = {}
        for column in _SUMMED:
            total = totals[column] = [0 if column == "pieces" else 0.0] * len(keys)
            for g, value in zip(group_of_op, ops[column]):
                if not math.isnan(value):
                    total[g] += value
        busy = totals["busy_us"]
        busy_of_kind: dict[str, float] = {}
        for (_, kind), value in zip(keys, busy):
            busy_of_kind[kind] = busy_of_kind.get(kind, 0.0) + value
        order = sorted(range(len(keys)), key=lambda g: (-busy[g], keys[g]))
        columns: dict[str, list] = {"name": [keys[g][0] for g in order], "kind": [keys[g][1] for g in order],
                                    "ops": [counts[g] for g in order]}
        for column in _SUMMED:
            columns[column] = [totals[column][g] for g in order]
        columns["busy_share"] = [busy[g] / busy_of_kind[keys[g][1]] if busy_of_kind[keys[g][1]] else 0.0
                                 for g in order]
        return make_table(columns, as_rows)


def load_saved(path: str | os.PathLike) -> SavedEtPlus:
    """Read a saved ET+ (JSON or ``.et``, told by content as ``load.file_kind`` does). Raises
    ``TraceInputError`` naming the file."""
    p = Path(path)
    saved = _read_json(p) if file_kind(p) == JSON else _read_chakra(p)
    if all(math.isnan(t) for t in saved.ts):
        raise TraceInputError(p, NOT_LINKED)
    return saved


# ---------------------------------------------------------------------------------------------
# ET+ JSON
# ---------------------------------------------------------------------------------------------


class _TimedNode(msgspec.Struct):
    """An ET+ node: its identity and time fields only (everything else is skipped by the decoder)."""

    id: int
    name: str = ""
    attrs: msgspec.Raw = msgspec.Raw(b"null")  # nested layout: only its tid is read (``load._tid_of``)
    tid: Any = None
    cat: str | None = None
    stream: int | None = None
    comm_type: Any = None
    comm_size: int | None = None
    continues: int | None = None
    ts: float | None = None
    dur: float | None = None
    inclusive_dur: float | None = None
    exclusive_dur: float | None = None
    blocked_dur: float | None = None
    deferred_dur: float | None = None
    host_gap_dur: float | None = None
    sim_dur: float | None = None


class _TimedDoc(msgspec.Struct):
    nodes: list[_TimedNode]


_JSON_DECODER = msgspec.json.Decoder(_TimedDoc)


def _read_json(p: Path) -> SavedEtPlus:
    data = read_trace_bytes(p)
    try:
        nodes = _JSON_DECODER.decode(data).nodes
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise TraceInputError(p, f"not an ET+ JSON document ({err})") from None
    del data
    saved = SavedEtPlus(p, "json")
    for node in nodes:
        gpu = node.cat in GPU_CATS
        comm = node.comm_type is not None or node.comm_size is not None
        if gpu:
            kind = COMM if comm else GPU
        elif comm:
            kind = COMM  # a CPU collective (gloo, MPI, UCC)
        else:
            kind = META if node.name == PROCESS_GROUP_INIT else CPU
        measured = node.inclusive_dur if node.inclusive_dur is not None else node.dur
        exclusive = node.exclusive_dur
        if node.sim_dur is not None:
            sim = node.sim_dur
        else:  # an older ET+: what ``load.load_json`` replays
            sim = (node.dur if gpu else exclusive if exclusive is not None else node.dur) or 0.0
        saved.ids.append(node.id)
        saved.names.append(node.name)
        saved.kind.append(kind)
        saved.tid.append(_tid_of(node))
        saved.stream.append(node.stream if gpu else None)
        saved.continues.append(node.continues)
        saved.ts.append(NAN if node.ts is None else node.ts)
        saved.measured.append(NAN if measured is None else measured)
        saved.exclusive.append(NAN if exclusive is None or node.continues is not None else exclusive)
        saved.blocked.append(node.blocked_dur or 0.0)
        saved.deferred.append(node.deferred_dur or 0.0)
        saved.host_gap.append(node.host_gap_dur or 0.0)
        saved.sim.append(float(sim))
    return saved


# ---------------------------------------------------------------------------------------------
# Chakra .et
# ---------------------------------------------------------------------------------------------

# The attributes read, by their UTF-8 name; the others (rf_id, op_schema, comm_*...) are skipped
# by name without a parse.
_READ_ATTRS = frozenset(name.encode() for name in (
    "is_cpu_op", "tid", "stream", "continues", "inclusive_dur_micros", "exclusive_dur_micros", "blocked_micros",
    "deferred_micros", "host_gap_micros"))
_INT64_VAL_TAG = 0x48  # AttributeProto field 9 (int64_val), varint
_COMM_NODES = frozenset((pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE))
_CACHE_LIMIT = 1 << 12


def _node_attrs(raws, cache: dict[bytes, tuple[str, Any] | None]) -> dict[str, Any]:
    """The read attributes of one node (name -> value). An ``int64_val`` (the per-op times,
    ``continues``, ``tid``) is decoded from its bytes; any other kind by a parse, cached by its
    bytes (``is_cpu_op`` and the like repeat from node to node)."""
    attrs: dict[str, Any] = {}
    for raw in raws:
        size = raw[1] if len(raw) > 1 and raw[0] == 0x0A else 0x80
        if size < 0x80:  # the usual: field 1 (name) first, a name under 128 bytes
            name = raw[2:2 + size]
            if name not in _READ_ATTRS:
                continue
            at = 2 + size
            if at < len(raw) and raw[at] == _INT64_VAL_TAG:
                try:
                    value, end = decode_varint(raw, at + 1)
                except (IndexError, ValueError):
                    end = -1
                if end == len(raw):
                    attrs[name.decode()] = value - (1 << 64) if value >= 1 << 63 else value
                    continue
        pair = cache.get(raw, False)
        if pair is False:
            attr = pb.AttributeProto()
            try:
                attr.ParseFromString(raw)
                pair = (attr.name, attr_value(attr)) if attr.name.encode() in _READ_ATTRS else None
            except (DecodeError, RuntimeError, ValueError):
                pair = None
            if len(cache) < _CACHE_LIMIT:
                cache[raw] = pair
        if pair is not None:
            attrs[pair[0]] = pair[1]
    return attrs


def _as_int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, bool)) else None


def _read_chakra(p: Path) -> SavedEtPlus:
    saved = SavedEtPlus(p, "et")
    message = SlimNode()
    parse = message.ParseFromString
    cache: dict[bytes, tuple[str, Any] | None] = {}
    for index, payload in enumerate(node_payloads(p), start=1):
        try:
            parse(payload)
        except (DecodeError, RuntimeError, ValueError) as err:
            raise TraceInputError(p, f"message #{index} is not a valid Chakra Node ({err})") from None
        attrs = _node_attrs(message.attr, cache)
        node_type = message.type
        if node_type == pb.COMP_NODE:
            kind = CPU if attrs.get("is_cpu_op", "stream" not in attrs) else GPU
        elif node_type in _COMM_NODES:
            kind = COMM
        elif node_type == pb.METADATA_NODE:
            kind = META
        else:  # memory, storage... nodes: CPU work, as a replay times them
            kind = CPU
        duration = float(message.duration_micros)
        continues = _as_int(attrs.get("continues"))
        on_gpu = kind == GPU or (kind == COMM and "stream" in attrs)
        measured = attrs.get("inclusive_dur_micros")
        exclusive = attrs.get("exclusive_dur_micros")
        if on_gpu:  # a GPU op's times are its duration
            measured = duration if measured is None else measured
            exclusive = duration if exclusive is None else exclusive
        saved.ids.append(message.id)
        saved.names.append(message.name)
        saved.kind.append(kind)
        saved.tid.append(_as_int(attrs.get("tid")) or 0)
        saved.stream.append(_as_int(attrs.get("stream")) if on_gpu else None)
        saved.continues.append(continues)
        saved.ts.append(float(message.start_time_micros) if message.start_time_micros else NAN)
        saved.measured.append(NAN if measured is None else float(measured))
        saved.exclusive.append(NAN if exclusive is None or continues is not None else float(exclusive))
        saved.blocked.append(float(attrs.get("blocked_micros", 0)))
        saved.deferred.append(float(attrs.get("deferred_micros", 0)))
        saved.host_gap.append(float(attrs.get("host_gap_micros", 0)))
        saved.sim.append(duration)
    return saved

"""NCCL message sizes from NCCL's own NVTX ranges, for an Nsight Systems capture without an ET.

A Kineto trace writes a collective's size on its NCCL kernel ("In msg nelems", "dtype"); an
Nsight Systems capture has only NCCL's NVTX ranges. Recent NCCL releases (NCCL's
``src/include/nvtx_payload_schemas.h``) attach a binary payload to the range of each API call:
the communicator id (``uint64``), the message size in bytes (``size_t``) and the reduction
operation, root or peer (``int``); ``ncclCommInitRank`` and its kin carry the communicator id and
its number of ranks. Nsight Systems exports the payload layouts in ``NVTX_PAYLOAD_SCHEMAS``
(``payloadSize``) and ``NVTX_PAYLOAD_SCHEMA_ENTRIES`` (one row per field: ``name``, ``offset``),
and each range's payload in ``NVTX_EVENTS.binaryData``. Which schema a range used is not
exported; a field is read at the offset that every schema of the payload's length holding that
field agrees on (NCCL puts the message size at the same place in all of them). The payload is
taken to be the raw little-endian struct, as a BLOB (or hex text); Nsight Systems documents no
other form, and no public capture with payloads was found to check it against (the exports we
have hold the schemas but no ``binaryData``: ``nsys export`` leaves blobs out unless asked,
``META_DATA_EXPORT`` ``EXPORT_PARAM_INCLUDE_BLOBS``).

A kernel's size: the NCCL range its launch began in on the launching thread (the outermost
NCCL range there). A collective's range gives its own size (``ncclReduceScatter``: the
per-rank size NCCL writes times the communicator's ranks, known from an init range in the
capture, else none); a ``ncclGroupEnd`` range gives the ops of its group (since the group's
``ncclGroupStart``): one kernel takes them all (point-to-point: the bytes sent, else received;
collectives of one kind: their sum), as many kernels as ops take one each in order, anything else
none. The kernel's args then say ``In msg nelems`` = bytes with ``dtype`` "Byte" (NCCL gives
bytes, not the element type) and, for one kind of op, ``Collective name``. What stays without a
size is named in the notes. Cost: one query of the other domains' ranges (run only when the
processes read have some), the tiny schema tables, a C-level pass over the GPU and runtime events
to find the NCCL kernels and their launches, a bisection per NCCL kernel.
"""

from __future__ import annotations

import bisect
import struct
from collections import Counter, defaultdict
from operator import attrgetter

import msgspec

ENTRIES, SCHEMAS = "NVTX_PAYLOAD_SCHEMA_ENTRIES", "NVTX_PAYLOAD_SCHEMAS"
SIZE_FIELDS = ("Message size [bytes]", "Bytes")  # NCCL's names of the message size (newer, older)
COMM_FIELD, RANKS_FIELD = "NCCL communicator ID", "No. of ranks"
FIELD_FORMATS = {"size": "<Q", COMM_FIELD: "<Q", RANKS_FIELD: "<i"}  # size_t, uint64_t, int (NCCL's structs)
GROUP_START, GROUP_END = "ncclGroupStart", "ncclGroupEnd"
POINT_TO_POINT = ("ncclSend", "ncclRecv")
PER_RANK_OUTPUT = ("ncclReduceScatter",)  # NCCL's payload: the output (recvcount); the input is × ranks
COLLECTIVES = ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclBcast", "ncclReduce",
               *POINT_TO_POINT)
COMM_INITS = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable", "ncclCommSplit",
              "ncclCommShrink")
BYTE_DTYPE = "Byte"  # PyTorch's name of uint8: a size in bytes as elements
NCCL_KERNEL_PREFIX = "nccl"

_NAME = attrgetter("name")


class Payloads:
    """The payload layouts of the file: per schema its length and field offsets by name."""

    def __init__(self, conn, tables: dict):
        self.layouts: list[tuple[int | None, dict[str, int]]] = []
        entries = tables.get(ENTRIES, set())
        if not {"schemaId", "name"} <= entries:
            return
        sizes = {}
        if {"schemaId", "payloadSize"} <= tables.get(SCHEMAS, set()):
            sizes = dict(conn.execute(f"SELECT DISTINCT schemaId, payloadSize FROM {SCHEMAS}"))
        offset = 'coalesce("offset", 0)' if "offset" in entries else "0"
        fields: dict = defaultdict(dict)
        for schema, name, at in conn.execute(f"SELECT DISTINCT schemaId, name, {offset} FROM {ENTRIES}"):
            fields[schema]["size" if name in SIZE_FIELDS else name] = at
        self.layouts = [(sizes.get(schema), named) for schema, named in fields.items()]

    def read(self, blob, field: str) -> int | None:
        """The ``field`` of a payload, or None: no blob, no schema of its length with that field,
        schemas that disagree on its place, or a blob too short for it."""
        data = _bytes(blob)
        if data is None:
            return None
        places = {named[field] for size, named in self.layouts if field in named and size in (None, len(data))}
        if len(places) != 1:
            return None
        at = places.pop()
        layout = struct.Struct(FIELD_FORMATS[field])
        if at < 0 or at + layout.size > len(data):
            return None
        return layout.unpack_from(data, at)[0]


def _bytes(blob) -> bytes | None:
    if isinstance(blob, bytes):
        return blob or None
    if isinstance(blob, str):
        try:
            return bytes.fromhex(blob) or None
        except ValueError:
            return None
    return None


def nccl_ranges_sql(tables: dict, pid_list: str, us: str) -> str | None:
    """SQL of the push/pop ranges of other domains than PyTorch's in the chosen processes (pid,
    tid, start µs, end µs, text, payload), or None without the columns."""
    columns = tables.get("NVTX_EVENTS", set())
    if not {"start", "end", "eventType", "globalTid", "domainId"} <= columns:
        return None
    text = "n.text" if "text" in columns else "NULL"
    if "textId" in columns and "StringIds" in tables:
        text = f"coalesce({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
    blob = "n.binaryData" if "binaryData" in columns else "NULL"
    pid = "((n.globalTid >> 24) & 16777215)"
    return (f"SELECT {pid}, (n.globalTid & 16777215), (n.start {us}, (n.\"end\" {us}, {text}, {blob} "
            f"FROM NVTX_EVENTS n WHERE n.eventType = 59 AND coalesce(n.domainId, 0) <> 0 "
            f"AND n.\"end\" IS NOT NULL AND {pid} IN ({pid_list})")


class _Owner:
    """A top-level NCCL range a launch can lie in, and the ops whose sizes it stands for:
    (API name, bytes or None, the reason when None)."""

    __slots__ = ("start", "end", "name", "ops")

    def __init__(self, start: float, end: float, name: str, ops: list):
        self.start, self.end, self.name, self.ops = start, end, name, ops


def _owners(rows: list, payloads: Payloads) -> dict[tuple, list[_Owner]]:
    """(pid, tid) -> its top-level NCCL ranges in start order, each with its ops: a collective
    its own; a ``ncclGroupEnd`` the ops since its group's ``ncclGroupStart``. Ranges inside
    another NCCL range are NCCL's own calls: left out."""
    ranks = {}
    for _, _, _, _, name, blob in rows:
        if name in COMM_INITS:
            comm, count = payloads.read(blob, COMM_FIELD), payloads.read(blob, RANKS_FIELD)
            if comm is not None and count:
                ranks[comm] = count
    threads = defaultdict(list)
    for pid, tid, start, end, name, blob in sorted(rows, key=lambda r: (r[0], r[1], r[2], -r[3])):
        threads[(pid, tid)].append((start, end, name, blob))
    owners = {}
    for thread, ranges in threads.items():
        found, pending, depth, outer_end = [], [], 0, None
        for start, end, name, blob in ranges:
            if outer_end is not None and end <= outer_end:
                continue  # inside the previous top-level range
            outer_end = end
            if name == GROUP_START:
                if depth == 0:
                    pending = []
                depth += 1
            elif name in COLLECTIVES:
                op = (name, *_op_bytes(name, blob, payloads, ranks))
                if depth:
                    pending.append(op)
                else:
                    found.append(_Owner(start, end, name, [op]))
            elif name == GROUP_END:
                depth = max(depth - 1, 0)
                if depth == 0:  # the group's kernels are launched here
                    found.append(_Owner(start, end, name, pending))
                    pending = []
        owners[thread] = found
    return owners


def _op_bytes(name: str, blob, payloads: Payloads, ranks: dict) -> tuple[int | None, str | None]:
    """(bytes, None) of one NCCL call's payload, or (None, why not)."""
    if _bytes(blob) is None:
        return None, "no payload"
    size = payloads.read(blob, "size")
    if size is None:
        return None, "payload not readable"
    if name in PER_RANK_OUTPUT:
        count = ranks.get(payloads.read(blob, COMM_FIELD))
        if not count:
            return None, "communicator size not in the capture"
        size *= count
    return size, None


def _sizes_of(owner: _Owner, kernels: int) -> list[tuple[int | None, str | None]]:
    """(bytes, collective name) for each of the ``kernels`` launched in ``owner``; bytes None
    when they cannot be told (reason in the name slot)."""
    ops = owner.ops
    if not ops:
        return [(None, "no NCCL call in its group")] * kernels
    missing = [why for _, size, why in ops if size is None]
    if missing:
        return [(None, missing[0])] * kernels
    kinds = {name for name, _, _ in ops}
    if kernels == 1:
        if kinds <= set(POINT_TO_POINT):
            sent = [size for name, size, _ in ops if name == "ncclSend"]
            total = sum(sent) if sent else sum(size for _, size, _ in ops)
            return [(total, kinds.pop()[4:] if len(kinds) == 1 else None)]
        if len(kinds) == 1:
            return [(sum(size for _, size, _ in ops), kinds.pop()[4:])]
    elif kernels == len(ops) and len(kinds) == 1:
        return [(size, name[4:]) for name, size, _ in ops]
    return [(None, "group launches a different number of kernels than it holds calls")] * kernels


def add_nccl_sizes(conn, tables: dict, pids: list[int], us: str, runtime: list, gpu: list,
                   other_domains: bool, kernel_names: set[str] | None = None) -> list[str]:
    """Give the NCCL kernels of ``gpu`` the message size of their NCCL call (module docstring)
    and return the notes saying what was and was not sized. ``other_domains``: the processes
    read have ranges outside PyTorch's domain (else no query is made); ``kernel_names``: the
    distinct kernel names, when the caller has them (else read off the events)."""
    names = kernel_names if kernel_names is not None else set(map(_NAME, gpu))
    nccl_names = {name for name in names if name.startswith(NCCL_KERNEL_PREFIX)}
    if not nccl_names:
        return []
    kernels = [event for event in gpu if event.name in nccl_names]
    sql = nccl_ranges_sql(tables, ", ".join(map(str, pids)), us) if other_domains else None
    rows = [r for r in conn.execute(sql) if isinstance(r[4], str) and r[4].startswith("nccl")] if sql else []
    if not rows:
        return [f"{len(kernels)} NCCL kernels and no NCCL NVTX ranges in the capture: their message size "
                f"comes only from an ET ({_counted(k.name.split('(')[0] for k in kernels)})"]
    owners = _owners(rows, Payloads(conn, tables))
    wanted = {kernel.args.correlation for kernel in kernels}
    launches = {r.args.correlation: r for r in runtime if r.args.correlation in wanted}
    placed: dict[int, list] = defaultdict(list)  # id(owner) -> its kernels
    by_id, unplaced = {}, 0
    for kernel in kernels:
        owner = _owner_of(owners, launches.get(kernel.args.correlation))
        if owner is None:
            unplaced += 1
        else:
            placed[id(owner)].append(kernel)
            by_id[id(owner)] = owner
    sized, unsized = 0, Counter()
    for key, members in placed.items():
        owner = by_id[key]
        for kernel, (size, name) in zip(members, _sizes_of(owner, len(members))):
            if size is None:
                unsized[(owner.name if owner.name != GROUP_END else _group_words(owner), name)] += 1
                continue
            kernel.args = msgspec.structs.replace(kernel.args, in_msg_nelems=size, dtype=BYTE_DTYPE,
                                                  collective_name=name or kernel.args.collective_name)
            sized += 1
    return _notes(len(kernels), sized, unsized, unplaced, rows)


def _owner_of(owners: dict, launch) -> _Owner | None:
    """The top-level NCCL range of the launching thread in which the launch began (its end is
    not compared: NCCL's ranges on a thread do not overlap, and a µs float sum of the launch's
    start and duration can miss an equal end by a rounding)."""
    if launch is None:
        return None
    ranges = owners.get((launch.pid, launch.tid))
    if not ranges:
        return None
    k = bisect.bisect_right([o.start for o in ranges], launch.ts) - 1
    if k >= 0 and ranges[k].end >= launch.ts:
        return ranges[k]
    return None


def _group_words(owner: _Owner) -> str:
    return f"group of {_counted(name for name, _, _ in owner.ops)}" if owner.ops else "empty group"


def _counted(names) -> str:
    return ", ".join(f"{name} ×{count}" for name, count in sorted(Counter(names).items()))


def _notes(total: int, sized: int, unsized: Counter, unplaced: int, rows: list) -> list[str]:
    notes = [f"NCCL message sizes from NCCL's NVTX payloads: {sized} of {total} NCCL kernels"]
    if not any(_bytes(r[5]) is not None for r in rows):
        notes[0] += (" (NCCL's ranges carry no payload in this export: recent NCCL attaches one; nsys "
                     "exports it only with its blobs, see META_DATA_EXPORT EXPORT_PARAM_INCLUDE_BLOBS)")
    if unsized:
        notes.append("NCCL kernels without a message size (it comes only from an ET): " + "; ".join(
            f"{count} under {where} ({why})" for (where, why), count in sorted(unsized.items())))
    if unplaced:
        notes.append(f"{unplaced} NCCL kernels launched outside every NCCL range (or with no launch row): "
                     "no message size")
    return notes

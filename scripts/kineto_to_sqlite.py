"""Turn a real Kineto trace into an Nsight Systems-schema and an nvprof-schema SQLite file of the
same events, so one ET links through any of the three sources (equivalence fixtures, issue 32).

    python scripts/kineto_to_sqlite.py KINETO.json[.gz] --nsys OUT.sqlite --nvprof OUT.nvvp
        [--strip-op-id] [--repeat N] [--graph-trace] [--nccl-payloads]

What is written, from the Kineto events (the Kineto file is read with ``json``, not with et-link):

- every ``cpu_op`` / ``user_annotation`` event becomes a PyTorch NVTX range whose text PyTorch's
  ``getNvtxStr`` would write: ``name[, seq = N][, op_id = M][, sizes = [[…]]]`` from the event's
  name, ``Sequence number``, ``Record function id`` (left out with ``--strip-op-id``, or when 0)
  and ``Input Dims``; nsys: ``NVTX_EVENTS`` (eventType 59, domain 0, ``globalTid`` = pid << 24 |
  tid); nvprof: a start and an end row in ``CUPTI_ACTIVITY_KIND_MARKER`` paired by ``id``, thread
  in ``objectId``;
- ``cuda_runtime`` / ``cuda_driver`` events become API rows with their correlation (nsys: one
  table, names with a ``_v7000`` suffix as nsys writes them; nvprof: RUNTIME / DRIVER tables keyed
  by CUPTI callback id, the event's ``cbid`` or the id of its name);
- kernels, memcpys, memsets become activity rows (device = ``device`` arg or pid, stream =
  ``stream`` arg or tid, the copy/memory kinds parsed back from Kineto's names);
- CUDA graphs (nsys): the GPU ops of a ``cudaGraphLaunch`` / ``hipGraphLaunch`` (one correlation)
  are a graph execution. Kineto does not record which graph: launches whose GPU ops are the same
  sequence (category, name, stream) are one graph, numbered 1, 2, … in order of first launch.
  By default their rows carry ``graphId`` (kernels) and ``graphNodeId`` (kernels, memcpys,
  memsets: graph id × 1000 + the op's place in its launch, from 1), as nsys writes them under
  ``--cuda-graph-trace=node``; with ``--graph-trace`` (nsys's ``--cuda-graph-trace=graph``) they
  are left out and each launch is one ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row instead (first op's
  start to last op's end, first op's device and stream, ``graphId``, ``graphExecId`` = graph id),
  and ``META_DATA_CAPTURE`` says which mode;
- NCCL's NVTX ranges (nsys, ``--nccl-payloads``): around each NCCL kernel's launch, in NCCL's
  domain (``domainId`` 1, names through ``StringIds``), the ranges recent NCCL writes with their
  payloads as ``binaryData`` and their layouts in ``NVTX_PAYLOAD_SCHEMAS`` /
  ``_SCHEMA_ENTRIES`` (NCCL's ``src/include/nvtx_payload_schemas.h``: communicator id, message
  size in bytes, then reduction op, root or peer; the entry names and type codes as real
  exports hold them), from the kernel's Kineto args: the collective (``Collective name``), its
  size (``In msg nelems`` × the ``dtype``'s bytes; reduce-scatter: ``Out msg nelems``, per rank,
  as NCCL writes it) and ``Group size``. A collective is one range ending after its launch; an
  all-to-all is a group (``ncclGroupStart``, a ``ncclSend`` and a ``ncclRecv`` of an equal share
  per rank, ``ncclGroupEnd`` around the launch); each thread first gets a ``ncclCommInitRank``
  range per communicator with its number of ranks. Kernels without those args get no range.

Times: ns = the Kineto µs value times 1000, computed exactly from its decimal text (Kineto writes
at most 3 decimals), so ``ns / 1000`` reads back as the same float. Threads whose ids do not fit
nsys's 24 bits are renumbered. Kineto-only ways to reach a launch (External id, ``ac2g`` flows)
have no NVTX counterpart: a GPU op whose correlation matches no API row stays without launch.

``--repeat N`` writes the events N times, each copy shifted past the previous one in time, op ids
and correlations (the benchmark's large file). Cost: one pass over the Kineto events per copy.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sqlite3
import struct
import sys
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from linker.read.nvprof import CBID_OF_NAME, DRIVER_CBID_OF_NAME  # noqa: E402

CPU_CATS = ("cpu_op", "user_annotation")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch")
GRAPH_NODES_PER_ID = 1000  # graphNodeId = graph id * this + the op's place in its launch
COPY_KINDS = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8,
              "HtoH": 9, "PtoP": 10}
MEMORY_KINDS = {"Pageable": 1, "Pinned": 2, "Device": 3, "Array": 4, "Managed": 5, "Device Static": 6,
                "Managed Static": 7}
MEMCPY_NAME = re.compile(r"Memcpy (\w+)(?: \(([\w ]+) -> ([\w ]+)\))?")
MEMSET_NAME = re.compile(r"Memset(?: \(([\w ]+)\))?")


def ns(value) -> int:
    """Kineto µs (as decoded from its JSON text) -> integer ns, exactly."""
    return int((Decimal(repr(value)) * 1000).to_integral_value())


def load_kineto(path: Path) -> list[dict]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)["traceEvents"]


def range_text(event: dict, strip_op_id: bool) -> str:
    """PyTorch's NVTX text for a CPU event (``getNvtxStr``)."""
    args = event.get("args") or {}
    text = event["name"]
    seq = args.get("Sequence number")
    if isinstance(seq, int) and seq >= 0:
        text += f", seq = {seq}"
    op_id = args.get("Record function id")
    if not strip_op_id and isinstance(op_id, int) and op_id > 0:
        text += f", op_id = {op_id}"
    dims = args.get("Input Dims")
    if isinstance(dims, list):
        text += ", sizes = " + json.dumps(dims, separators=(", ", ": "))
    return text


class _Threads:
    """(pid, tid) -> a tid that fits 24 bits (the same one when it already does)."""

    def __init__(self):
        self.map: dict = {}

    def __call__(self, pid, tid) -> int:
        key = (pid, tid)
        if key not in self.map:
            fits = isinstance(tid, int) and 0 <= tid < (1 << 24)
            self.map[key] = tid if fits else (1 << 23) + len(self.map)
        return self.map[key]


def _events(path: Path):
    events = [e for e in load_kineto(path) if e.get("ph") == "X" and "ts" in e and "dur" in e]
    cpu = [e for e in events if e.get("cat") in CPU_CATS]
    runtime = [e for e in events if e.get("cat") in RUNTIME_CATS]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    pids = [e["pid"] for e in cpu if isinstance(e.get("pid"), int)]
    main_pid = max(set(pids), key=pids.count) if pids else 1
    span = max((ns(e["ts"]) + ns(e["dur"]) for e in events), default=0) - min((ns(e["ts"]) for e in events), default=0)
    op_ids = [(e.get("args") or {}).get("Record function id") or 0 for e in cpu]
    corrs = [(e.get("args") or {}).get("correlation") or 0 for e in runtime + gpu]
    return cpu, runtime, gpu, main_pid, span + 1000, max(op_ids, default=0) + 1, max(corrs, default=0) + 1


def _copy_kinds(event: dict) -> tuple[int, int, int]:
    match = MEMCPY_NAME.match(event["name"])
    if not match:
        return 0, 0, 0
    kind, src, dst = match.groups()
    return COPY_KINDS.get(kind, 0), MEMORY_KINDS.get(src or "", 0), MEMORY_KINDS.get(dst or "", 0)


def _memset_kind(event: dict) -> int:
    match = MEMSET_NAME.match(event["name"])
    return MEMORY_KINDS.get((match.group(1) if match else None) or "", 0)


def _placement(event: dict) -> tuple[int, int]:
    args = event.get("args") or {}
    device = args.get("device", event.get("pid"))
    stream = args.get("stream", event.get("tid"))
    return int(device) if isinstance(device, int) else 0, int(stream) if isinstance(stream, int) else 0


def _with_op_id(text: str, shift: int) -> str:
    if not shift:
        return text
    return re.sub(r", op_id = (\d+)", lambda m: f", op_id = {int(m.group(1)) + shift}", text, count=1)


NSYS_DDL = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
  int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT);
CREATE TABLE NVTX_PAYLOAD_SCHEMAS (domainId INTEGER, schemaId INTEGER, name TEXT, type INTEGER, flags INTEGER,
  numEntries INTEGER, payloadSize INTEGER, alignTo INTEGER);
CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId INTEGER NOT NULL, schemaId INTEGER NOT NULL, idx INTEGER NOT NULL,
  flags INTEGER, type INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER,
  gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER,
  graphNodeId INTEGER, graphId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER, graphNodeId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  value INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER, graphNodeId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER,
  contextId INTEGER, greenContextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
  graphId INTEGER, graphExecId INTEGER);
CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT);
"""


def graph_nodes(runtime: list[dict], gpu: list[dict]) -> dict[int, tuple[int, int]]:
    """``id(event)`` of each GPU op a graph launch carries -> (graph id, graph node id). Launches
    whose ops (in start order) have the same (category, name, stream) run one graph; graphs are
    numbered from 1 in order of first launch. O(g log g)."""
    launches = {_corr(e, 0) for e in runtime if e["name"] in GRAPH_LAUNCHES} - {None}
    by_launch: dict[int, list[dict]] = {}
    for e in gpu:
        corr = _corr(e, 0)
        if corr in launches:
            by_launch.setdefault(corr, []).append(e)
    graph_of: dict[tuple, int] = {}
    nodes = {}
    for corr in sorted(by_launch, key=lambda c: min(ns(e["ts"]) for e in by_launch[c])):
        ops = sorted(by_launch[corr], key=lambda e: ns(e["ts"]))
        signature = tuple((e["cat"], e["name"], _placement(e)[1]) for e in ops)
        graph = graph_of.setdefault(signature, len(graph_of) + 1)
        for place, e in enumerate(ops, start=1):
            nodes[id(e)] = (graph, graph * GRAPH_NODES_PER_ID + place)
    return nodes


def graph_trace_rows(gpu: list[dict], nodes: dict, gpid: int) -> list[tuple]:
    """One ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row per graph launch (``graph_nodes``): start, end,
    device, context, green context, stream, correlation, globalPid, graph id, graph exec id."""
    spans: dict[int, list] = {}
    for e in gpu:
        if id(e) not in nodes:
            continue
        start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        span = spans.get(_corr(e, 0))
        if span is None:
            device, stream = _placement(e)
            spans[_corr(e, 0)] = [start, end, device, stream, nodes[id(e)][0]]
        else:
            if start < span[0]:
                span[0], span[2], span[3] = start, *_placement(e)
            span[1] = max(span[1], end)
    return [(a, b, d, 1, None, st, c, gpid, g, g) for c, (a, b, d, st, g) in spans.items()]


NCCL_DOMAIN = 1
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1}
# NCCL's payload layouts (nvtx_payload_schemas.h, communicator id first): schema id -> (API, entries
# (name, type code, offset), struct format, payload size). Type codes as in real exports: 18
# uint64, 22 size_t, 5 int, 16777232 NCCL's reduction-op enum.
COMM, SIZE = ("NCCL communicator ID", 18, None), ("Message size [bytes]", 22, 8)
NCCL_SCHEMAS = {
    0x1000002: ("ncclCommInitRank", [COMM, ("No. of ranks", 5, 8), ("Rank", 5, 12), ("CUDA device", 5, 16)],
                "<Qiii4x"),
    0x1000004: ("ncclAllGather", [COMM, SIZE], "<QQ"),
    0x1000005: ("ncclReduce", [COMM, SIZE, ("Root", 5, 16), ("Reduction operation", 16777232, 20)], "<QQii"),
    0x1000006: ("ncclBroadcast", [COMM, SIZE, ("Root", 5, 16)], "<QQi4x"),
    0x1000007: ("ncclAllReduce", [COMM, SIZE, ("Reduction operation", 16777232, 16)], "<QQi4x"),
    0x1000008: ("ncclReduceScatter", [COMM, SIZE, ("Reduction operation", 16777232, 16)], "<QQi4x"),
    0x1000009: ("ncclSend", [COMM, SIZE, ("Peer rank", 5, 16)], "<QQi4x"),
    0x100000A: ("ncclRecv", [COMM, SIZE, ("Peer rank", 5, 16)], "<QQi4x"),
}
NCCL_FORMAT = {api: fmt for api, _, fmt in NCCL_SCHEMAS.values()}
NCCL_CALLS = (("alltoall", "group"), ("allreduce", "ncclAllReduce"), ("allgather", "ncclAllGather"),
              ("reducescatter", "ncclReduceScatter"), ("broadcast", "ncclBroadcast"), ("reduce", "ncclReduce"),
              ("send", "ncclSend"), ("recv", "ncclRecv"))


def _nccl_call(args: dict) -> str | None:
    letters = re.sub(r"[^a-z]", "", str(args.get("Collective name") or "").lower())
    return next((call for fragment, call in NCCL_CALLS if fragment in letters), None)


def nccl_ranges(runtime: list[dict], gpu: list[dict], gtid) -> list[tuple]:
    """NCCL's NVTX ranges around the NCCL kernels' launches (module docstring): rows (start ns,
    end ns, name, globalTid, payload bytes)."""
    launches = {_corr(e, 0): e for e in runtime}
    rows, comms = [], {}
    for e in sorted(gpu, key=lambda e: ns(e["ts"])):
        args, launch = e.get("args") or {}, launches.get(_corr(e, 0))
        call = _nccl_call(args)
        if not e["name"].startswith("nccl") or launch is None or call is None or args.get("dtype") not in DTYPE_BYTES:
            continue
        element, ranks = DTYPE_BYTES[args["dtype"]], int(args.get("Group size") or 1)
        pg = str(args.get("Process Group Name", "0"))
        comm = 0xC0FFEE00 + (int(pg) if pg.isdigit() else sum(pg.encode()))
        thread = gtid(launch["pid"], launch["tid"])
        a, b = ns(launch["ts"]), ns(launch["ts"]) + ns(launch["dur"])
        comms.setdefault((thread, comm), (a, ranks))
        if call == "group":
            share = int(args.get("In msg nelems") or 0) * element // ranks
            calls = [(name, peer) for peer in range(ranks) for name in ("ncclSend", "ncclRecv")]
            rows.append((a - 2 * len(calls) - 3, a - 2 * len(calls) - 2, "ncclGroupStart", thread, None))
            for k, (name, peer) in enumerate(calls):
                start = a - 2 * len(calls) - 1 + 2 * k
                rows.append((start, start + 1, name, thread, struct.pack(NCCL_FORMAT[name], comm, share, peer)))
            rows.append((a - 1, b, "ncclGroupEnd", thread, None))
            continue
        count = args.get("Out msg nelems" if call == "ncclReduceScatter" else "In msg nelems") or 0
        third = [0, 0] if call == "ncclReduce" else [0]
        rows.append((a - 1, b, call, thread, struct.pack(NCCL_FORMAT[call], comm, int(count) * element, *third)))
    for (thread, comm), (first, ranks) in comms.items():
        rows.append((first - 10_000, first - 9_000, "ncclCommInitRank", thread,
                     struct.pack(NCCL_FORMAT["ncclCommInitRank"], comm, ranks, 0, 0)))
    return rows


def _write_nccl_schemas(conn) -> None:
    for schema, (_, entries, fmt) in NCCL_SCHEMAS.items():
        conn.execute("INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (?, ?, NULL, 1, NULL, ?, ?, NULL)",
                     (NCCL_DOMAIN, schema, len(entries), struct.calcsize(fmt)))
        conn.executemany("INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (?, ?, ?, NULL, ?, ?, NULL, NULL, ?)",
                         ((NCCL_DOMAIN, schema, k, kind, name, at) for k, (name, kind, at) in enumerate(entries)))


def write_nsys(kineto: Path, out: Path, strip_op_id: bool = False, repeat: int = 1,
               graph_trace: bool = False, nccl_payloads: bool = False) -> None:
    """The nsys-schema SQLite file of ``kineto`` (``repeat`` copies). ``graph_trace``: each CUDA
    graph launch as one graph-trace row, its GPU ops left out; ``nccl_payloads``: NCCL's ranges
    with their payloads around the NCCL kernels' launches (module docstring)."""
    cpu, runtime, gpu, main_pid, span, op_step, corr_step = _events(kineto)
    threads = _Threads()
    strings: dict[str, int] = {}

    def sid(value: str) -> int:
        return strings.setdefault(value, len(strings) + 1)

    def gtid(pid, tid) -> int:
        return (int(pid) << 24) | threads(pid, tid)

    texts = [range_text(e, strip_op_id) for e in cpu]
    # Each event's row once (times in ns); every copy adds its shifts (time, op id, correlation).
    ranges = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), t, gtid(e["pid"], e["tid"])) for e, t in zip(cpu, texts)]
    calls = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(e["cat"] == "cuda_driver"), gtid(e["pid"], e["tid"]),
              _corr(e, 0), sid(e["name"] + "_v7000")) for e in runtime]
    gpid = main_pid << 24
    nccl = [(a, b, sid(name), g, blob) for a, b, name, g, blob in nccl_ranges(runtime, gpu, gtid)] \
        if nccl_payloads else []
    nodes = graph_nodes(runtime, gpu)
    graphs = graph_trace_rows(gpu, nodes, gpid) if graph_trace else []
    kernels, copies, sets = [], [], []
    for e in gpu:
        if graph_trace and id(e) in nodes:
            continue
        start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        device, stream = _placement(e)
        graph, node = nodes.get(id(e), (None, None))
        if e["cat"] == "kernel":
            kernels.append((start, end, device, stream, _corr(e, 0), gpid, sid(e["name"]),
                            sid(e["name"].split("<")[0].split("(")[0]), node, graph))
        elif e["cat"] == "gpu_memcpy":
            copies.append((start, end, device, stream, _corr(e, 0), gpid, *_copy_kinds(e), node))
        else:
            sets.append((start, end, device, stream, _corr(e, 0), gpid, _memset_kind(e), node))
    out.unlink(missing_ok=True)
    conn = sqlite3.connect(out)
    conn.executescript(NSYS_DDL)
    conn.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [
        ("EXPORT_PRODUCT_VERSION", "et-link scripts/kineto_to_sqlite.py"), ("EXPORT_SCHEMA_VERSION", "3.0.0")])
    conn.execute("INSERT INTO META_DATA_CAPTURE VALUES ('CUDA_GRAPH_TRACE_OPTIONS:MODE', ?)",
                 ("Graph" if graph_trace else "Node",))
    if nccl:
        _write_nccl_schemas(conn)
    for copy in range(repeat):
        dt, op_shift, dc = copy * span, copy * op_step, copy * corr_step
        conn.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                         "VALUES (?, ?, 59, ?, ?, 0)",
                         ((a + dt, b + dt, _with_op_id(t, op_shift) if not strip_op_id else t, g)
                          for a, b, t, g in ranges))
        conn.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, textId, globalTid, domainId, binaryData) "
                         f"VALUES (?, ?, 59, ?, ?, {NCCL_DOMAIN}, ?)", ((a + dt, b + dt, n, g, blob)
                                                                         for a, b, n, g, blob in nccl))
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?, ?, 0, NULL)",
                         ((a + dt, b + dt, d, g, _shift(c, dc), n) for a, b, d, g, c, n in calls))
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
                         "correlationId, globalPid, demangledName, shortName, graphNodeId, graphId) "
                         "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?)",
                         ((a + dt, b + dt, d, st, _shift(c, dc), g, n1, n2, gn, gi)
                          for a, b, d, st, c, g, n1, n2, gn, gi in kernels))
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, 1, ?, ?, ?, 0, ?, ?, ?, ?)",
                         ((a + dt, b + dt, d, st, _shift(c, dc), g, k, sk, dk, gn)
                          for a, b, d, st, c, g, k, sk, dk, gn in copies))
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, 1, ?, ?, ?, 0, 0, ?, ?)",
                         ((a + dt, b + dt, d, st, _shift(c, dc), g, k, gn) for a, b, d, st, c, g, k, gn in sets))
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         ((a + dt, b + dt, d, cx, gc, st, _shift(c, dc), g, gi, ge)
                          for a, b, d, cx, gc, st, c, g, gi, ge in graphs))
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", ((i, v) for v, i in strings.items()))
    conn.commit()
    conn.close()


def _shift(corr, shift: int):
    return corr + shift if corr is not None else None


def _corr(event: dict, shift: int):
    corr = (event.get("args") or {}).get("correlation")
    return corr + shift if isinstance(corr, int) else None


NVPROF_DDL = """
CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE Version (version INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MARKER (_id_ INTEGER PRIMARY KEY, flags INTEGER, timestamp INTEGER, id INTEGER,
  objectKind INTEGER, objectId BLOB, name INTEGER, domain INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (_id_ INTEGER PRIMARY KEY, cbid INTEGER, start INTEGER, end INTEGER,
  processId INTEGER, threadId INTEGER, correlationId INTEGER, returnValue INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER (_id_ INTEGER PRIMARY KEY, cbid INTEGER, start INTEGER, end INTEGER,
  processId INTEGER, threadId INTEGER, correlationId INTEGER, returnValue INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (_id_ INTEGER PRIMARY KEY, start INTEGER, end INTEGER,
  completed INTEGER, deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER, name INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (_id_ INTEGER PRIMARY KEY, copyKind INTEGER, srcKind INTEGER, dstKind INTEGER,
  flags INTEGER, bytes INTEGER, start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER, streamId INTEGER,
  correlationId INTEGER, runtimeCorrelationId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (_id_ INTEGER PRIMARY KEY, value INTEGER, bytes INTEGER, start INTEGER,
  end INTEGER, deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER, flags INTEGER,
  memoryKind INTEGER);
"""


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def write_nvprof(kineto: Path, out: Path, strip_op_id: bool = False) -> None:
    """The nvprof-schema SQLite file of ``kineto``."""
    cpu, runtime, gpu, main_pid, _, _, _ = _events(kineto)
    threads = _Threads()
    strings: dict[str, int] = {}

    def sid(value: str) -> int:
        return strings.setdefault(value, len(strings) + 1)

    out.unlink(missing_ok=True)
    conn = sqlite3.connect(out)
    conn.executescript(NVPROF_DDL)
    conn.execute("INSERT INTO Version VALUES (12)")
    markers = []
    for k, e in enumerate(cpu, start=1):
        obj = struct.pack("<IQ", int(e["pid"]), threads(e["pid"], e["tid"]))
        start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        markers.append((2, start, k, 2, obj, sid(range_text(e, strip_op_id)), 0))
        markers.append((4, end, k, 2, obj, 0, 0))
    markers.sort(key=lambda row: row[1])  # nvprof writes markers as they happen
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MARKER (flags, timestamp, id, objectKind, objectId, name, "
                     "domain) VALUES (?, ?, ?, ?, ?, ?, ?)", markers)
    for e in runtime:
        driver = e["cat"] == "cuda_driver"
        cbid = (e.get("args") or {}).get("cbid")
        if not isinstance(cbid, int):
            cbid = (DRIVER_CBID_OF_NAME if driver else CBID_OF_NAME).get(e["name"], 0)
        conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_{'DRIVER' if driver else 'RUNTIME'} (cbid, start, end, "
                     "processId, threadId, correlationId, returnValue) VALUES (?, ?, ?, ?, ?, ?, 0)",
                     (cbid, ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(e["pid"]),
                      _signed32(threads(e["pid"], e["tid"])), _corr(e, 0)))
    for e in gpu:
        start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        device, stream = _placement(e)
        if e["cat"] == "kernel":
            conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (start, end, completed, deviceId, "
                         "contextId, streamId, correlationId, name) VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                         (start, end, end, device, stream, _corr(e, 0), sid(e["name"])))
        elif e["cat"] == "gpu_memcpy":
            kind, src, dst = _copy_kinds(e)
            conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (copyKind, srcKind, dstKind, flags, bytes, start, "
                         "end, deviceId, contextId, streamId, correlationId, runtimeCorrelationId) "
                         "VALUES (?, ?, ?, 0, 0, ?, ?, ?, 1, ?, ?, 0)", (kind, src, dst, start, end, device, stream,
                                                                          _corr(e, 0)))
        else:
            conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (value, bytes, start, end, deviceId, contextId, "
                         "streamId, correlationId, flags, memoryKind) VALUES (0, 0, ?, ?, ?, 1, ?, ?, 0, ?)",
                         (start, end, device, stream, _corr(e, 0), _memset_kind(e)))
    conn.executemany("INSERT INTO StringTable VALUES (?, ?)", ((i, v) for v, i in strings.items()))
    conn.commit()
    conn.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kineto", type=Path)
    parser.add_argument("--nsys", type=Path)
    parser.add_argument("--nvprof", type=Path)
    parser.add_argument("--strip-op-id", action="store_true", help="leave op_id out of the range text")
    parser.add_argument("--repeat", type=int, default=1, help="nsys only: write the events this many times")
    parser.add_argument("--graph-trace", action="store_true",
                        help="nsys only: each CUDA graph launch as one CUPTI_ACTIVITY_KIND_GRAPH_TRACE row")
    parser.add_argument("--nccl-payloads", action="store_true",
                        help="nsys only: NCCL's NVTX ranges with payloads around the NCCL kernels' launches")
    args = parser.parse_args(argv)
    if args.nsys:
        write_nsys(args.kineto, args.nsys, args.strip_op_id, args.repeat, args.graph_trace, args.nccl_payloads)
    if args.nvprof:
        write_nvprof(args.kineto, args.nvprof, args.strip_op_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Read an nvprof / NVIDIA Visual Profiler SQLite database (``nvprof -o file.nvvp``).

What is read (docs/nsys.md has the details and sources):

- ``CUPTI_ACTIVITY_KIND_MARKER``: a range is a start row (``flags`` 2, name = ``StringTable`` id)
  and an end row (``flags`` 4) with the same ``id``; a start row without its end row never closed.
  The thread is ``objectId``: pid as 4 bytes little-endian, then tid as 8 bytes. PyTorch's ranges
  are chosen as in an nsys export (``linker.read.nsys``): default domain, ``op_id`` when the
  process has any, else every range that is not a PyProf dict marker.
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` and ``_DRIVER`` (``cbid`` names from ``CUPTI_NAMES``; the
  ``threadId`` column holds the tid as a signed 32-bit value: read as unsigned).
- ``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`` and ``_KERNEL``, ``_MEMCPY``, ``_MEMSET``; launch =
  runtime/driver call with the same ``correlationId``. nvprof keeps kernel names mangled
  (``_ZN2at6native…``): they are demangled as Kineto shows them (``linker.read.demangle``, once
  per distinct name; a name outside its subset stays as recorded). An nvprof file holds one process (``--profile-child-processes`` writes one file
  per process).
- Timestamps are ns since the epoch: too large for µs floats to keep whole ns, so they are made
  relative to the earliest one (``timing_model.MAX_PLAIN_US``).

Cost: as ``linker.read.nsys``: a few queries, one struct per row kept.
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

from linker.read import timing_model as model
from linker.read.demangle import demangle
from linker.read.nsys import Processes, choose_processes, open_ops, range_notes, read_ops, unlaunched_count
from linker.read.sqlite_source import sqlite_problem

MARKER = "CUPTI_ACTIVITY_KIND_MARKER"
RUNTIME, DRIVER = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"
KERNEL_TABLES = ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL")
MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RANGE_START, RANGE_END = 2, 4
DRIVER_KEY = 1 << 20  # driver cbids are keyed cbid + DRIVER_KEY (runtime and driver ids overlap)

# CUPTI callback ids (cupti_runtime_cbid.h / cupti_driver_cbid.h) of the calls et-link looks at:
# launches, copies, sets, synchronisations. Other calls are named "cbid N".
RUNTIME_CBIDS = {
    13: "cudaLaunch", 31: "cudaMemcpy", 32: "cudaMemcpy2D", 39: "cudaMemcpyToSymbol",
    40: "cudaMemcpyFromSymbol", 41: "cudaMemcpyAsync", 44: "cudaMemcpy2DAsync", 47: "cudaMemcpyToSymbolAsync",
    48: "cudaMemcpyFromSymbolAsync", 49: "cudaMemset", 50: "cudaMemset2D", 51: "cudaMemsetAsync",
    52: "cudaMemset2DAsync", 126: "cudaThreadSynchronize", 131: "cudaStreamSynchronize",
    137: "cudaEventSynchronize", 144: "cudaMemcpy3D", 145: "cudaMemcpy3DAsync", 147: "cudaStreamWaitEvent",
    160: "cudaMemcpyPeer", 161: "cudaMemcpyPeerAsync", 165: "cudaDeviceSynchronize", 211: "cudaLaunchKernel",
    214: "cudaLaunchKernel_ptsz", 215: "cudaMemcpy_ptds", 225: "cudaMemcpyAsync_ptsz",
    233: "cudaMemset_ptds", 235: "cudaMemsetAsync_ptsz", 239: "cudaStreamSynchronize_ptsz",
    247: "cudaStreamWaitEvent_ptsz", 269: "cudaLaunchCooperativeKernel", 270: "cudaLaunchCooperativeKernel_ptsz",
    284: "cudaLaunchHostFunc", 311: "cudaGraphLaunch", 312: "cudaGraphLaunch_ptsz", 430: "cudaLaunchKernelExC",
    431: "cudaLaunchKernelExC_ptsz", 10: "cudaGetLastError", 11: "cudaPeekAtLastError", 17: "cudaGetDevice",
}
DRIVER_CBIDS = {
    17: "cuCtxSynchronize", 115: "cuLaunch", 116: "cuLaunchGrid", 117: "cuLaunchGridAsync",
    121: "cuEventSynchronize", 126: "cuStreamSynchronize", 276: "cuMemcpyHtoD", 295: "cuStreamWaitEvent",
    305: "cuMemcpy", 306: "cuMemcpyAsync", 307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz",
    477: "cuLaunchCooperativeKernel", 514: "cuGraphLaunch", 515: "cuGraphLaunch_ptsz", 652: "cuLaunchKernelEx",
    653: "cuLaunchKernelEx_ptsz",
}
CBID_OF_NAME = {name: cbid for cbid, name in RUNTIME_CBIDS.items()}
DRIVER_CBID_OF_NAME = {name: cbid for cbid, name in DRIVER_CBIDS.items()}


def call_names() -> dict[int, str]:
    """Runtime cbid -> name, driver cbid + ``DRIVER_KEY`` -> name."""
    names = dict(RUNTIME_CBIDS)
    names.update({cbid + DRIVER_KEY: name for cbid, name in DRIVER_CBIDS.items()})
    return names


def decode_object_id(blob: bytes) -> tuple[int, int] | None:
    """(pid, tid) of a marker's 12-byte ``objectId`` (pid 4 bytes LE, tid 8 bytes LE)."""
    if not isinstance(blob, bytes) or len(blob) < 12:
        return None
    pid, tid = struct.unpack_from("<IQ", blob)
    return pid, tid


def encode_object_id(pid: int, tid: int) -> bytes:
    return struct.pack("<IQ", pid, tid)


def database_version(conn, tables) -> str:
    if "Version" in tables and "version" in tables["Version"]:
        row = conn.execute("SELECT version FROM Version").fetchone()
        if row is not None:
            return f"nvprof database version {row[0]}"
    return "nvprof database, version unknown"


def _ranges_sql(conn, tables) -> str | None:
    """SQL of the ranges with the columns ``linker.read.nsys`` reads (rid, pid, tid, start, stop,
    dom, t), or None without a marker table."""
    columns = tables.get(MARKER)
    if not columns or not {"flags", "timestamp", "id", "objectId", "name"} <= columns:
        return None
    threads = []
    for (blob,) in conn.execute(f"SELECT DISTINCT objectId FROM {MARKER} WHERE flags = {RANGE_START}"):
        decoded = decode_object_id(blob)
        if decoded is not None:
            threads.append(f"(X'{blob.hex()}', {decoded[0]}, {decoded[1]})")
    if not threads:
        return None
    text = "coalesce((SELECT value FROM StringTable st WHERE st._id_ = s.name), '')" if "StringTable" in tables else "''"
    domain = "coalesce(s.domain, 0)" if "domain" in columns else "0"
    return (
        f"WITH th(obj, pid, tid) AS (VALUES {', '.join(threads)}) "
        f"SELECT s._id_ AS rid, th.pid AS pid, th.tid AS tid, s.timestamp AS start, e.timestamp AS stop, "
        f"{domain} AS dom, {text} AS t FROM {MARKER} s JOIN th ON th.obj = s.objectId "
        f"LEFT JOIN {MARKER} e ON e.id = s.id AND e.flags = {RANGE_END} WHERE s.flags = {RANGE_START}")


def read_nvprof(conn: sqlite3.Connection, path: Path, tables: dict, pid: int | None = None,
                prefer_pid: int | None = None) -> model.TimingTrace:
    """The ``TimingTrace`` of an nvprof database (arguments as ``nsys.read_nsys``)."""
    try:
        return _read(conn, path, tables, pid, prefer_pid)
    except sqlite3.Error as err:
        raise sqlite_problem(path, err) from None


def _read(conn, path, tables, pid, prefer_pid) -> model.TimingTrace:
    version = database_version(conn, tables)
    ranges_sql = _ranges_sql(conn, tables)
    processes = Processes(conn, ranges_sql)
    pids, chosen = choose_processes(path, processes.pytorch(), processes.rows, pid, prefer_pid, "nvprof database")
    base = _time_base(conn, tables)
    us = f"- {base}) / {model.NS_PER_US}"
    cpu = read_ops(conn, ranges_sql, pids, processes, us)
    notes, warnings = range_notes(pids, processes, cpu, open_ops(conn, ranges_sql, pids, processes))
    warnings[:0] = chosen
    runtime = _runtime(conn, tables, pids, us)
    gpu = _gpu(conn, tables, us)
    unlaunched = unlaunched_count(runtime, gpu)
    if unlaunched:
        warnings.append(f"{path}: {unlaunched} of {len(gpu)} GPU ops have no launch row in the runtime "
                        "or driver table; see the report's GPU accounting (those before the first "
                        "recorded launch go under the process root, the others stay unattached)")
    return model.TimingTrace(
        path=str(path), pid=pids[0], rank=None, world_size=None, cpu_events=cpu, runtime_events=runtime,
        gpu_events=gpu, source="nvprof", version=version, processes=pids, notes=notes, warnings=warnings,
        time_base_ns=base)


def _time_base(conn, tables) -> int:
    latest, earliest = 0, None
    for table, column in ((MARKER, "timestamp"), (RUNTIME, "start"), (DRIVER, "start")) + tuple(
            (t, "start") for t in KERNEL_TABLES):
        if column in tables.get(table, ()):
            low, high = conn.execute(f"SELECT min({column}), max({column}) FROM {table}").fetchone()
            if high is not None:
                latest = max(latest, high)
                earliest = low if earliest is None else min(earliest, low)
    return int(earliest) if latest / model.NS_PER_US >= model.MAX_PLAIN_US else 0


def _runtime(conn, tables, pids, us) -> list:
    parts = []
    for table, key in ((RUNTIME, "cbid"), (DRIVER, f"cbid + {DRIVER_KEY}")):
        columns = tables.get(table)
        if not columns or not {"cbid", "start", "end", "processId", "threadId", "correlationId"} <= columns:
            continue
        parts.append(f"SELECT {key} AS k, {int(table == DRIVER)} AS d, processId AS pid, "
                     f"(threadId & 4294967295) AS tid, (start {us} AS ts, (\"end\" - start) / {model.NS_PER_US} AS dur, "
                     f"correlationId AS c, start AS s, \"end\" AS e, rowid AS rid FROM {table} "
                     f"WHERE processId IN ({', '.join(map(str, pids))})")
    if not parts:
        return []
    rows = conn.execute(f"SELECT k, d, pid, tid, ts, dur, c FROM ({' UNION ALL '.join(parts)}) "
                        "ORDER BY pid, tid, s, e DESC, d, rid")
    names = call_names()
    keys = {k for (k,) in conn.execute(f"SELECT DISTINCT k FROM ({' UNION ALL '.join(parts)})")}
    names.update({k: f"cbid {k - DRIVER_KEY if k >= DRIVER_KEY else k}" for k in keys if k not in names})
    return model.runtime_events(rows, names)


class KernelNames(dict):
    """StringTable id -> demangled kernel name; a text key (a memcpy / memset name the query
    made) is its own name; an id the table lacks gives ``default``."""

    def get(self, key, default=None):
        return dict.get(self, key, key if isinstance(key, str) else default)


def kernel_names(conn, tables, kernel_tables: list[str]) -> KernelNames:
    """The demangled names of the ``StringTable`` ids the kernel tables use (one query; each
    distinct name demangled once)."""
    names = KernelNames()
    if "StringTable" not in tables or not kernel_tables:
        return names
    used = " UNION ".join(f"SELECT name FROM {table}" for table in kernel_tables)
    for key, value in conn.execute(f"SELECT _id_, value FROM StringTable WHERE _id_ IN ({used})"):
        names[key] = demangle(value or "")
    return names


def _gpu(conn, tables, us) -> list:
    parts, kernel_tables = [], []
    common = {"start", "end", "deviceId", "streamId", "correlationId"}
    for order, table in enumerate(KERNEL_TABLES + (MEMCPY, MEMSET)):
        columns = tables.get(table)
        if not columns or not common <= columns:
            continue
        if table in KERNEL_TABLES:
            if "name" not in columns:
                continue
            cat, name = "kernel", "name"
            kernel_tables.append(table)
        elif table == MEMCPY:
            cat = "gpu_memcpy"
            name = model.memcpy_name_sql("copyKind", *(c if c in columns else None for c in ("srcKind", "dstKind")))
        else:
            cat = "gpu_memset"
            name = model.memset_name_sql("memoryKind" if "memoryKind" in columns else None)
        parts.append(f"SELECT {name} AS name, '{cat}' AS cat, deviceId, streamId, (start {us} AS ts, "
                     f"(\"end\" - start) / {model.NS_PER_US} AS dur, correlationId, start AS s, {order} AS kind, "
                     f"rowid AS rid FROM {table}")
    if not parts:
        return []
    rows = conn.execute(f"SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY s, kind, rid")
    return model.gpu_events((row[:7] for row in rows), kernel_names(conn, tables, kernel_tables))

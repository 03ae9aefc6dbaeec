"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``, schema 2.9 to 3.x).

What is read (docs/nsys.md has the details and sources):

- ``NVTX_EVENTS`` push/pop ranges (``eventType`` 59), text from ``text`` or ``StringIds[textId]``,
  thread from ``globalTid`` (pid = bits 24-47, tid = bits 0-23). PyTorch's ranges are those of
  the default domain (``domainId`` 0) that carry ``op_id`` (PyTorch >= 2022); in older captures,
  which have no ``op_id``, every default-domain range that is not a PyProf dict marker (``{…}``).
  A process is a PyTorch process when some default-domain range has ``op_id`` or ``seq``, or an
  op name with a namespace (``aten::``, ``c10d::``: captures of ops without autograd). Other
  ranges (NCCL's and MPI's domains, user ranges, PyProf markers) are left out and counted in the
  notes; ranges never closed (``end`` NULL) are left out with a warning.
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` (runtime and driver calls: ``eventClass`` 1 = driver), names
  from ``StringIds`` without the ``_v7000`` version suffix.
- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` of the processes read (``globalPid``).
  A GPU op's launch is the runtime row with its ``correlationId`` in the same process: with more
  than one process in the trace, correlations are renumbered to be unique (``_correlation_sql``).
  The kernels of a CUDA graph (``--cuda-graph-trace=node``: ``graphId`` / ``graphNodeId`` set)
  carry the correlation of their ``cudaGraphLaunch``, so they hang under the op that launched
  the graph, as in a Kineto trace. A capture traced graph by graph (``--cuda-graph-trace=graph``,
  nsys's default) has no rows for those kernels but one ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row
  per launch: it is read as one kernel named ``CUDA graph <graphId>`` spanning the execution, on
  the device and stream of the row (a row whose correlation also has kernel rows is left out;
  one without times, start = end = 0, is left out with a warning).
- The version from ``META_DATA_EXPORT`` (schema >= 3) or ``EXPORT_META_DATA`` (2.x).
- NCCL's own ranges (another domain) and their payloads: the message size of each NCCL kernel
  when the capture holds it (``linker.read.nccl_nvtx``), said in the notes either way.

One output is one rank: a file with several PyTorch processes gives one of them (``prefer_pid``,
the ET's, else the first by pid, with a warning) unless a process or ``ALL_PROCESSES`` is asked for.

Tables or columns that are missing are treated as empty. Every query reads only the columns
needed; SQLite joins the string table, filters and divides the times. Rows are read in file order,
which Nsight Systems writes by start: the builders (``timing_model``) check each thread's order as
rows come and sort only a thread that is out of it, in Python (SQLite's sort of millions of range
rows with their text cost more than the whole rest of the query). Cost: a streaming aggregate
over the ranges, a probe per process that stops at its first PyTorch range, one query per event
kind; one struct per row kept (two per range with op_id or seq); O(n) for rows in order, O(n log
n) for a thread that is not.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from operator import attrgetter
from pathlib import Path

from linker.model.errors import TraceInputError
from linker.read import timing_model as model
from linker.read.nccl_nvtx import add_nccl_sizes
from linker.read.sqlite_source import (ALL_PROCESSES, TABLE_GRAPH_TRACE, TABLE_KERNEL, TABLE_MEMCPY, TABLE_MEMSET,
                                      TABLE_NVTX, TABLE_RUNTIME, sqlite_problem)

NVTX_PUSH_POP = 59
PID_SQL = "(({col} >> 24) & 16777215)"
TID_SQL = "({col} & 16777215)"
VERSION_SUFFIX = re.compile(r"_v\d+$")
GRAPH_NAME = "CUDA graph "  # a whole-graph row's name: this and its graphId


def _pid(col: str) -> str:
    return PID_SQL.format(col=col)


def _tid(col: str) -> str:
    return TID_SQL.format(col=col)


def export_version(conn: sqlite3.Connection, tables: dict) -> str:
    """"nsys <product version>, export schema <schema version>" from the metadata table."""
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables and {"name", "value"} <= tables[table]:
            rows = dict(conn.execute(f"SELECT name, value FROM {table} WHERE name IN "
                                     "('EXPORT_PRODUCT_VERSION', 'EXPORT_SCHEMA_VERSION')"))
            return (f"nsys {rows.get('EXPORT_PRODUCT_VERSION', '?')}, "
                    f"export schema {rows.get('EXPORT_SCHEMA_VERSION', '?')}")
    return "nsys, export schema unknown (no metadata table)"


def _ranges_sql(tables: dict) -> str | None:
    """SQL of the push/pop ranges (columns: rid, pid, tid, start, stop, dom, t = the text), or
    None without an NVTX table."""
    columns = tables.get(TABLE_NVTX)
    if not columns or not {"start", "eventType", "globalTid"} <= columns:
        return None
    text = "n.text" if "text" in columns else "NULL"
    if "textId" in columns and "StringIds" in tables:
        text = f"coalesce({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
    stop = 'n."end"' if "end" in columns else "NULL"
    domain = "coalesce(n.domainId, 0)" if "domainId" in columns else "0"
    return (
        f"SELECT n.rowid AS rid, {_pid('n.globalTid')} AS pid, {_tid('n.globalTid')} AS tid, "
        f"n.start AS start, {stop} AS stop, {domain} AS dom, coalesce({text}, '') AS t "
        f"FROM {TABLE_NVTX} n WHERE n.eventType = {NVTX_PUSH_POP}")


class Processes:
    """Per process: its ranges by kind. One aggregate query that does not read the text (ranges
    and never-closed ones of the default and other domains, the earliest and latest start), then
    per process with default-domain ranges a query that stops at its first PyTorch range (one with
    ``op_id`` or ``seq``, or a namespaced ``aten::`` name: ops run without autograd have neither
    field). ``rows[pid]``: ranges, other_domains, default, open_default, pytorch (bool), and
    op_id (bool: some op has an ``op_id``, PyTorch >= 2022; its ops are then those ranges), set
    by ``read_ops`` once the ranges are read. ``starts``: (earliest, latest) start of all
    ranges, or None. The ranges left out of a process read (PyProf markers, user ranges, ops never
    closed) are counted once its ops are read (``range_notes``)."""

    def __init__(self, conn: sqlite3.Connection, ranges_sql: str | None):
        self.rows: dict[int, dict] = {}
        self.starts: tuple[int, int] | None = None
        if ranges_sql is None:
            return
        counts = "count(*), sum(dom <> 0), sum(dom = 0), sum(dom = 0 AND stop IS NULL)"
        # One streaming pass (no sort) answers for a one-process file; several processes are
        # then counted per process (GROUP BY sorts).
        low, high, first, last, *totals = conn.execute(
            f"SELECT min(pid), max(pid), min(start), max(start), {counts} FROM ({ranges_sql})").fetchone()
        if low is None:
            return
        self.starts = (first, last)
        rows = [(low, *totals)] if low == high else conn.execute(
            f"SELECT pid, {counts} FROM ({ranges_sql}) GROUP BY pid").fetchall()
        for pid, count, other, default, open_default in rows:
            self.rows[pid] = {"ranges": count, "other_domains": other, "default": default,
                              "open_default": open_default, "op_id": False, "pytorch": False}
        for pid, row in self.rows.items():
            if row["default"]:
                self._classify(conn, ranges_sql, pid, row)

    @staticmethod
    def _classify(conn, ranges_sql: str, pid: int, row: dict) -> None:
        row["pytorch"] = conn.execute(
            f"SELECT 1 FROM ({ranges_sql}) WHERE pid = {pid} AND dom = 0 AND ({model.HAS_OP_ID_SQL} OR "
            f"{model.HAS_SEQ_SQL} OR instr(t, '::') > 0) LIMIT 1").fetchone() is not None

    def pytorch(self) -> list[int]:
        return sorted(p for p, r in self.rows.items() if r["pytorch"])


def op_filter(pids: list[int], processes: Processes) -> str:
    """SQL condition on the ranges: PyTorch ops of the chosen processes (default domain; those
    with op_id when the process has any, else all but PyProf markers)."""
    terms = []
    for pid in pids:
        rule = model.HAS_OP_ID_SQL if processes.rows[pid]["op_id"] else "t NOT LIKE '{%'"
        terms.append(f"(pid = {pid} AND {rule})")
    return f"dom = 0 AND ({' OR '.join(terms)})"


# The ranges that may be ops under either rule of ``op_filter`` (before it is known whether the
# process has op_ids): default domain, not a PyProf marker unless it has an op_id.
MAY_BE_OP_SQL = f"dom = 0 AND (t NOT LIKE '{{%' OR {model.HAS_OP_ID_SQL})"
_RF_ID = attrgetter("args.rf_id")


def read_ops(conn, ranges_sql: str, pids: list[int], processes: Processes, us: str) -> list:
    """The closed PyTorch ranges of ``pids`` as ``cpu_op`` events, and each process's ``op_id``
    flag set (``Processes.rows``). One query reads the ranges that may be ops under either rule
    of ``op_filter``; a process with some op_id then keeps only its ranges with one (user ranges
    dropped: a pass over its events, only when it has both kinds). A scan for op_id before the
    read would cost a full pass over the text of a file without any. O(n)."""
    pid_list = ", ".join(map(str, pids))
    events = read_in_order(conn, cpu_sql(ranges_sql, f"{MAY_BE_OP_SQL} AND pid IN ({pid_list})", us),
                           CPU_ORDER, model.cpu_events)
    rf_ids = list(map(_RF_ID, events))
    without = rf_ids.count(None)
    with_id = ({e.pid for e, rf_id in zip(events, rf_ids) if rf_id is not None} if len(pids) > 1 else set(pids)
               if without < len(events) else set())
    for pid in pids:  # op_ids only on ranges never closed: rare, looked for among those only
        if pid not in with_id and processes.rows[pid]["open_default"] and conn.execute(
                f"SELECT 1 FROM ({ranges_sql}) WHERE pid = {pid} AND dom = 0 AND stop IS NULL AND "
                f"{model.HAS_OP_ID_SQL} LIMIT 1").fetchone():
            with_id.add(pid)
    for pid in with_id:
        processes.rows[pid]["op_id"] = True
    if without and with_id:
        events = [e for e, rf_id in zip(events, rf_ids) if rf_id is not None or e.pid not in with_id]
    return events


def read_nsys(conn: sqlite3.Connection, path: Path, tables: dict, pid: int | None = None,
              prefer_pid: int | None = None) -> model.TimingTrace:
    """The ``TimingTrace`` of the file. ``pid``: read that process only; ``prefer_pid`` (the ET's
    pid): read it when the file holds several PyTorch processes. Raises ``TraceInputError`` when
    the file has no PyTorch ranges or the process asked for is not there."""
    try:
        return _read(conn, path, tables, pid, prefer_pid)
    except sqlite3.Error as err:
        raise sqlite_problem(path, err) from None


def choose_processes(path: Path, available: list[int], everything: dict, pid: int | None,
                     prefer_pid: int | None, what: str) -> tuple[list[int], list[str]]:
    """(pids to read, warnings). ``pid``: that process (refused when absent), or
    ``ALL_PROCESSES``; else one process, as one output is one rank: ``prefer_pid`` (the ET's) when
    the file holds several (refused when it is none of them: linking one ET needs its process),
    else the first in pid order, with a warning naming the others (``batch`` links each)."""
    if not available:
        kinds = (f"{len(everything)} process(es) with NVTX ranges, none from PyTorch"
                 if everything else "no NVTX ranges at all")
        raise TraceInputError(path, f"no PyTorch ranges in this {what} ({kinds}): record with "
                              "torch.autograd.profiler.emit_nvtx() (nsys profile --pytorch=autograd-nvtx)")
    listed = ", ".join(map(str, available))
    if pid == ALL_PROCESSES:
        return available, []
    if pid is not None:
        if pid not in available:
            raise TraceInputError(path, f"process {pid} has no PyTorch ranges here (processes with "
                                  f"PyTorch ranges: {listed})")
        return [pid], []
    if len(available) == 1:
        return available, []
    if prefer_pid is not None:
        if prefer_pid in available:
            return [prefer_pid], []
        raise TraceInputError(path, f"holds {len(available)} PyTorch processes (pids {listed}) and none is "
                              f"the ET's pid {prefer_pid}: link each process with 'et-link batch' (one rank "
                              "per process)")
    return available[:1], [f"{path}: holds {len(available)} PyTorch processes (pids {listed}): read pid "
                           f"{available[0]} only (rank 0 in pid order); 'et-link batch --kineto {path.name}' "
                           "links every process as a rank"]


def _read(conn, path, tables, pid, prefer_pid) -> model.TimingTrace:
    version = export_version(conn, tables)
    ranges_sql = _ranges_sql(tables)
    processes = Processes(conn, ranges_sql)
    pids, chosen = choose_processes(path, processes.pytorch(), processes.rows, pid, prefer_pid,
                                    "Nsight Systems export")
    several = _first_correlations(conn, tables, pids) if len(pids) > 1 else None
    base = time_base(conn, tables, processes.starts)
    us = f"- {base}) / {model.NS_PER_US}"
    cpu = read_ops(conn, ranges_sql, pids, processes, us)
    notes, warnings = range_notes(pids, processes, cpu, open_ops(conn, ranges_sql, pids, processes))
    warnings[:0] = chosen
    runtime = _runtime(conn, tables, pids, several, us)
    gpu, graph_notes, graph_warnings, kernel_names = _gpu(conn, tables, pids, several, us)
    notes += graph_notes
    warnings += graph_warnings
    notes += add_nccl_sizes(conn, tables, pids, us, runtime, gpu,
                            any(processes.rows[p]["other_domains"] for p in pids), kernel_names)
    unlaunched = unlaunched_count(runtime, gpu)
    if unlaunched:
        warnings.append(f"{path}: {unlaunched} of {len(gpu)} GPU ops have no launch row in "
                        f"{TABLE_RUNTIME} (cut off by the capture, a slice or the export); "
                        "see the report's GPU accounting (those before the first "
                        "recorded launch go under the process root, the others stay unattached)")
    trace = model.TimingTrace(
        path=str(path), pid=pids[0] if len(pids) == 1 else None, rank=None, world_size=None,
        cpu_events=cpu, runtime_events=runtime, gpu_events=gpu, source="nsys", version=version,
        processes=pids, notes=notes, warnings=warnings, time_base_ns=base)
    if trace.pid is None and cpu:
        trace.pid = pids[0]
    return trace


_CORRELATION = attrgetter("args.correlation")


def unlaunched_count(runtime: list, gpu: list) -> int:
    """How many of the ``gpu`` events have no ``runtime`` event with their correlation. O(n + g)."""
    launches = {event.args.correlation for event in runtime}
    return sum(1 for event in gpu if event.args.correlation not in launches)


def read_in_order(conn, sql: str, order: str, build):
    """``build(rows, in_order=True)`` over the rows of ``sql`` in file order: Nsight Systems writes
    rows by start, so they rarely need the sort that would be most of what SQL costs beyond a bare
    scan; ``build`` checks the order as rows come and sorts a thread whose rows are not in it. A
    NULL time (which the check cannot compare: ``TypeError``) has SQLite sort the rows instead
    (``ORDER BY order``)."""
    try:
        return build(conn.execute(sql), in_order=True)
    except TypeError:
        return build(conn.execute(f"{sql} ORDER BY {order}"))


def open_ops(conn, ranges_sql: str, pids: list[int], processes: Processes) -> dict[int, int]:
    """pid -> its PyTorch ops never closed (``end`` NULL), for the processes read that have
    default-domain ranges never closed (one query each, looking at those rows only)."""
    counts = {}
    for pid in pids:
        if processes.rows[pid]["open_default"]:
            counts[pid] = conn.execute(f"SELECT count(*) FROM ({ranges_sql}) WHERE stop IS NULL AND "
                                       f"{op_filter([pid], processes)}").fetchone()[0]
    return counts


def time_base(conn, tables, range_starts: tuple | None = None) -> int:
    """0, or the earliest start when times in µs would not keep whole ns (``MAX_PLAIN_US``), among
    the ranges (``range_starts``: their earliest and latest start, from ``Processes``), the API
    calls and the kernels."""
    latest, earliest = 0, None
    spans = [range_starts] if range_starts else []
    for table in (TABLE_RUNTIME, TABLE_KERNEL):
        if "start" in tables.get(table, ()):
            spans.append(conn.execute(f"SELECT min(start), max(start) FROM {table}").fetchone())
    for low, high in spans:
        if high is not None:
            latest = max(latest, high)
            earliest = low if earliest is None else min(earliest, low)
    return int(earliest) if latest / model.NS_PER_US >= model.MAX_PLAIN_US else 0


# The reader's order of the CPU rows (``cpu_sql``'s columns), when SQLite sorts them
# (``read_in_order``): by thread (pid, tid as numbers: ``cpu_events`` puts the threads in text
# order), start, op_id (Kineto's External id order; none last), the longer first, then file order.
_OP_ID_SQL = (f"CASE WHEN instr(t, '{model.OP_ID_MARKER}') > 0 THEN CAST(substr(t, instr(t, "
              f"'{model.OP_ID_MARKER}') + {len(model.OP_ID_MARKER)}) AS INTEGER) END")
CPU_ORDER = f"pid, tid, start, coalesce({_OP_ID_SQL}, {1 << 62}), stop DESC, rid"


def cpu_sql(ranges_sql: str, ops: str, us: str) -> str:
    """The PyTorch ranges to read, closed ones, as ``timing_model.cpu_events`` rows (text, pid,
    tid, ts, dur), in file order (``read_in_order`` adds ``ORDER BY CPU_ORDER`` when needed)."""
    return (f"SELECT t, pid, tid, (start {us}, (stop - start) / {model.NS_PER_US} "
            f"FROM ({ranges_sql}) WHERE {ops} AND stop IS NOT NULL")


def range_notes(pids, processes, cpu: list, open_ops: dict[int, int]) -> tuple[list[str], list[str]]:
    """What was read (the ``cpu`` events) and left out of the chosen processes' ranges, in words
    (notes, warnings). ``open_ops``: pid -> PyTorch ops never closed. A process with ``op_id``
    leaves out its default-domain ranges without one (user ranges); one without leaves out its
    PyProf markers (``{…}``): either count is the default-domain ranges less the ops read and
    the ops never closed. O(1) for one process, O(n) for several (events counted per pid)."""
    kept = {pids[0]: len(cpu)} if len(pids) == 1 else Counter(e.pid for e in cpu)
    notes, warnings = [f"{len(cpu)} PyTorch NVTX ranges read as CPU ops"], []
    rows = {p: processes.rows[p] for p in pids}
    other = sum(r["other_domains"] for r in rows.values())
    rest = {p: r["default"] - kept.get(p, 0) - open_ops.get(p, 0) for p, r in rows.items()}
    user = sum(n for p, n in rest.items() if rows[p]["op_id"])
    pyprof = sum(n for p, n in rest.items() if not rows[p]["op_id"])
    never_closed = sum(open_ops.values())
    left = []
    if other:
        left.append(f"{other} ranges of other NVTX domains (NCCL, MPI, user domains)")
    if user:
        left.append(f"{user} default-domain ranges that are not PyTorch ops (user ranges without op_id)")
    if pyprof:
        left.append(f"{pyprof} PyProf dict markers")
    if left:
        notes.append("left out (not ops; GPU work inside them hangs under the innermost PyTorch range): "
                     + "; ".join(left))
    others = sorted(set(processes.rows) - set(pids))
    if others:
        notes.append(f"processes not read: {', '.join(map(str, others))}")
    if never_closed:
        warnings.append(f"{never_closed} PyTorch NVTX ranges were never closed (end NULL: the capture "
                        "stopped inside them); left out")
    return notes, warnings


def _string_names(conn, table: str, column: str, tables: dict, strip: bool = True) -> dict:
    """String id -> name (``strip``: without its ``_vNNNN`` suffix), for the ids ``table.column``
    uses."""
    if "StringIds" not in tables:
        return {}
    rows = conn.execute(f"SELECT id, value FROM StringIds WHERE id IN (SELECT DISTINCT {column} FROM {table})")
    if not strip:
        return {key: value or "" for key, value in rows}
    return {key: VERSION_SUFFIX.sub("", value or "") for key, value in rows}


def _first_correlations(conn, tables, pids) -> dict[int, int]:
    """pid -> its smallest runtime correlation (0 without runtime rows)."""
    firsts = dict.fromkeys(pids, 0)
    if {"globalTid", "correlationId"} <= tables.get(TABLE_RUNTIME, set()):
        pid = _pid("globalTid")
        firsts.update(conn.execute(f"SELECT {pid}, min(correlationId) FROM {TABLE_RUNTIME} "
                                   f"WHERE {pid} IN ({', '.join(map(str, pids))}) GROUP BY {pid}"))
    return firsts


def _correlation_sql(column: str, pid_sql: str, firsts: dict[int, int] | None) -> str:
    """The correlation as read: the column itself for one process; for several, unique across
    them and alike relative to each one's first launch, so that "launched before the trace"
    (below the first launch) is judged per process: ``(c - first(pid) + 2**32) * P + index(pid)``."""
    if not firsts:
        return column
    first = " ".join(f"WHEN {p} THEN {c}" for p, c in firsts.items())
    index = " ".join(f"WHEN {p} THEN {i}" for i, p in enumerate(firsts))
    return (f"(({column} - CASE {pid_sql} {first} END + 4294967296) * {len(firsts)} "
            f"+ CASE {pid_sql} {index} END)")


def _runtime(conn, tables, pids, several, us) -> list:
    columns = tables.get(TABLE_RUNTIME)
    if not columns or not {"start", "end", "globalTid", "correlationId"} <= columns:
        return []
    name_key = "nameId" if "nameId" in columns else "NULL"
    names = _string_names(conn, TABLE_RUNTIME, "nameId", tables) if name_key != "NULL" else {}
    driver = "(eventClass = 1)" if "eventClass" in columns else "0"
    pid = _pid("globalTid")
    sql = (
        f"SELECT {name_key}, {driver}, {pid}, {_tid('globalTid')}, (start {us}, "
        f"(\"end\" - start) / {model.NS_PER_US}, {_correlation_sql('correlationId', pid, several)} "
        f"FROM {TABLE_RUNTIME} WHERE {pid} IN ({', '.join(map(str, pids))})")
    return read_in_order(conn, sql, 'globalTid, start, "end" DESC, rowid',
                         lambda rows, **order: model.runtime_events(rows, names, **order))


def _gpu(conn, tables, pids, several, us) -> tuple[list, list[str], list[str], set[str]]:
    """(GPU ops, notes, warnings, the distinct kernel names): kernels, memcpys, memsets and
    whole-graph rows (``_graph_trace``) of the chosen processes, by start time (kernels first at
    equal starts, then file order: one query per table, no SQL sort; Python's stable sort of
    nearly sorted rows is quick). Kernel names come from ``StringIds`` through a dict of the ids
    used."""
    events, kernel_names = [], set()
    pid_list = ", ".join(map(str, pids))
    for table, cat in ((TABLE_KERNEL, "kernel"), (TABLE_MEMCPY, "gpu_memcpy"), (TABLE_MEMSET, "gpu_memset")):
        columns = tables.get(table)
        if not columns or not GPU_COLUMNS <= columns:
            continue
        names = None
        if cat == "kernel":
            key = next((c for c in ("demangledName", "shortName") if c in columns), None)
            name = key or "NULL"
            names = _string_names(conn, table, key, tables, strip=False) if key else {}
            kernel_names.update(names.values())
        elif cat == "gpu_memcpy":
            name = model.memcpy_name_sql("copyKind", *(c if c in columns else None for c in ("srcKind", "dstKind")))
        else:
            name = model.memset_name_sql("memKind" if "memKind" in columns else None)
        pid = _pid("globalPid")
        rows = conn.execute(
            f"SELECT {name}, '{cat}', deviceId, streamId, (start {us}, (\"end\" - start) / {model.NS_PER_US}, "
            f"{_correlation_sql('correlationId', pid, several)} FROM {table} WHERE {pid} IN ({pid_list})")
        events += model.gpu_events(rows, names)
    graphs, notes, warnings = _graph_trace(conn, tables, pid_list, several, us, events)
    events += graphs
    events.sort(key=_TS)
    return events, notes, warnings, kernel_names


GPU_COLUMNS = frozenset({"start", "end", "deviceId", "streamId", "correlationId", "globalPid"})


def _graph_trace(conn, tables, pid_list: str, several, us, events: list) -> tuple[list, list[str], list[str]]:
    """(GPU ops, notes, warnings) of ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``: one kernel named
    ``CUDA graph <graphId>`` per graph launch of the chosen processes, but for launches whose
    kernels ``events`` already holds (a set of the few graph correlations, checked against the
    kernels in C) and rows without times (start = end = 0: CUPTI could not time the graph).
    One query of the (small) graph table; nothing when it is absent or empty."""
    columns = tables.get(TABLE_GRAPH_TRACE)
    if not columns or not GPU_COLUMNS <= columns:
        return [], [], []
    pid = _pid("globalPid")
    graph = "graphId" if "graphId" in columns else "NULL"
    rows = conn.execute(
        f"SELECT '{GRAPH_NAME}' || coalesce({graph}, '?'), 'kernel', deviceId, streamId, (start {us}, "
        f"(\"end\" - start) / {model.NS_PER_US}, {_correlation_sql('correlationId', pid, several)}, "
        f"start = 0 AND \"end\" = 0 FROM {TABLE_GRAPH_TRACE} WHERE {pid} IN ({pid_list})").fetchall()
    if not rows:
        return [], [], []
    untimed = sum(row[7] for row in rows)
    launches = {row[6] for row in rows}
    with_kernels = launches.intersection(map(_CORRELATION, events))
    kept = [row[:7] for row in rows if not row[7] and row[6] not in with_kernels]
    notes = [f"{len(kept)} CUDA graph launches read as one GPU op each ({TABLE_GRAPH_TRACE}: the capture "
             "traced graphs as a whole, nsys --cuda-graph-trace=graph; their kernels are not in the file: "
             "profile with --cuda-graph-trace=node to see them)"] if kept else []
    if with_kernels:
        notes.append(f"{len(with_kernels)} graph-trace rows left out: their launch's kernels are in the file")
    warnings = [f"{untimed} CUDA graph launches have no times in {TABLE_GRAPH_TRACE} (start = end = 0); "
                "left out"] if untimed else []
    return model.gpu_events(kept), notes, warnings


_TS = attrgetter("ts")

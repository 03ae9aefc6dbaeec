"""Read any timing trace et-link takes, told apart by content (never by name).

- Kineto JSON (plain or gzip): ``linker.read.kineto``.
- SQLite (the 16-byte ``SQLite format 3`` header): an Nsight Systems export (``StringIds``:
  ``linker.read.nsys``) or an nvprof database (``StringTable``: ``linker.read.nvprof``), opened
  read-only (``linker.read.sqlite_source``).
- An Nsight Systems JSON export (``--type json`` or ``--type jsonlines``, plain or gzip: its
  first line, ``linker.read.nsys_json_form``), loaded into the SQLite reader's tables.
- Anything else with a profiler's report suffix is refused in one line that says what to do:
  ``.nsys-rep`` / ``.qdrep`` are Nsight Systems' binary reports (``nsys export --type sqlite``),
  an ``.nvvp`` that is not SQLite is not an nvprof database.

``TimingSelection`` names one process of a multi-process file (``et-link batch``: one rank per
process); it is a path-like, so the rest of the pipeline handles it as the file's path.
``seq_agreement`` is the extra check of a link made by order: ET ``seq_id`` against the range's
``seq``. Cost: the reader's; detection reads 16 bytes, then at most 64 KiB of text.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from linker.model.errors import TraceInputError
from linker.read.files import GZIP_MAGIC, collector_paused
from linker.read.kineto import KinetoTrace, read_kineto_trace
from linker.read.nsys_json import nsys_json_processes, read_nsys_json
from linker.read.nsys_json_form import nsys_json_form
from linker.read.sqlite_source import (ALL_PROCESSES, NSYS, NVPROF, has_sqlite_header, open_read_only, source_kind,
                                       sqlite_problem, table_columns)

NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".qdstrm")
SEQ_AGREEMENT = 0.99  # below this share of agreeing seq numbers, the seq check warns


@dataclass(frozen=True)
class TimingSelection(os.PathLike):
    """One process (``pid``) of the timing file at ``path``; ``os.fspath`` gives the file."""

    path: Path
    pid: int

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return f"{self.path} (pid {self.pid})"

    def stat(self):
        return self.path.stat()


def is_sqlite_file(path: str | os.PathLike) -> bool:
    """True when the file at ``path`` is an SQLite database (by its header)."""
    return has_sqlite_header(os.fspath(path))


def is_profiler_export(path: str | os.PathLike) -> bool:
    """True when the file at ``path`` is an SQLite database or an Nsight Systems JSON export: a
    file that may hold several processes (``export_processes``), read by SQL."""
    return is_sqlite_file(path) or nsys_json_form(os.fspath(path)) is not None


def read_timing_trace(path: str | os.PathLike, prefer_pid: int | None = None,
                      read_json=read_kineto_trace, all_processes: bool = False) -> KinetoTrace:
    """The timing trace at ``path`` (a ``TimingSelection`` reads one process), as a
    ``KinetoTrace``. A multi-process SQLite file gives one process (one output is one rank):
    ``prefer_pid`` (the ET's pid), else the first in pid order with a warning; ``all_processes``
    reads them all into one trace. ``read_json``: the Kineto reader for JSON files (the
    pipeline passes the one it holds). Raises ``TraceInputError`` (one line naming the file) on
    anything unusable."""
    pid = path.pid if isinstance(path, TimingSelection) else ALL_PROCESSES if all_processes else None
    file = Path(os.fspath(path))
    if is_sqlite_file(file):
        return read_sqlite_timing(file, pid, prefer_pid)
    form = nsys_json_form(file)
    if form is not None:
        return read_nsys_json(file, form, pid, prefer_pid)
    _refuse_known_binaries(file)
    return read_json(file)


def _refuse_known_binaries(path: Path) -> None:
    """One-line refusals for profiler files that are not SQLite (nor Kineto JSON)."""
    name = path.name.lower()
    try:
        with open(path, "rb") as stream:
            head = stream.read(2)
    except OSError:
        return  # the Kineto reader names the problem
    if head == GZIP_MAGIC or head[:1] in (b"{", b"[", b" ", b"\n", b"\r", b"\t"):
        return
    if name.endswith(NSYS_REPORT_SUFFIXES):
        raise TraceInputError(path, "an Nsight Systems report (binary), not an SQLite export: export it "
                              f"with 'nsys export --type sqlite -o {path.stem}.sqlite {path.name}' and "
                              "give the .sqlite file")
    if name.endswith(".nvvp"):
        raise TraceInputError(path, "not an nvprof SQLite database (no SQLite header): record with "
                              "'nvprof -o FILE.nvvp' (or export from the Visual Profiler) and give that file")


def read_sqlite_timing(path: Path, pid: int | None = None, prefer_pid: int | None = None):
    """An Nsight Systems or nvprof SQLite file as a ``TimingTrace`` (the cyclic collector paused
    meanwhile: a struct per row, none of them garbage)."""
    conn = open_read_only(path)
    try:
        with collector_paused():
            return _read_sqlite(conn, path, pid, prefer_pid)
    finally:
        conn.close()


def _read_sqlite(conn, path: Path, pid, prefer_pid):
    """The reader that fits the file's tables."""
    try:
        tables = table_columns(conn)
    except sqlite3.Error as err:  # a damaged schema
        raise sqlite_problem(path, err) from None
    kind = source_kind(tables)
    if kind == NSYS:
        from linker.read.nsys import read_nsys

        return read_nsys(conn, path, tables, pid, prefer_pid)
    if kind == NVPROF:
        from linker.read.nvprof import read_nvprof

        return read_nvprof(conn, path, tables, pid, prefer_pid)
    names = ", ".join(sorted(tables)[:5]) or "no tables at all"
    raise TraceInputError(path, "an SQLite file that is neither an Nsight Systems export (no StringIds "
                          f"table) nor an nvprof database (no StringTable): {names}")


def sqlite_processes(path: str | os.PathLike) -> list[int]:
    """The pids with PyTorch ranges in an Nsight Systems / nvprof file, ascending (``batch``: one
    rank each, in this order). Raises ``TraceInputError`` like the readers. One aggregate query."""
    from linker.read import nsys, nvprof

    path = Path(os.fspath(path))
    conn = open_read_only(path)
    try:
        tables = table_columns(conn)
        kind = source_kind(tables)
        sql = nsys._ranges_sql(tables) if kind == NSYS else nvprof._ranges_sql(conn, tables) if kind == NVPROF else None
        return nsys.Processes(conn, sql).pytorch()
    except sqlite3.Error as err:
        raise sqlite_problem(path, err) from None
    finally:
        conn.close()


def export_processes(path: str | os.PathLike) -> list[int]:
    """``sqlite_processes`` of an SQLite file, or the same of an Nsight Systems JSON export (read
    whole: its lines are in no order that would let a query stop early)."""
    form = nsys_json_form(os.fspath(path)) if not is_sqlite_file(path) else None
    if form is not None:
        return nsys_json_processes(Path(os.fspath(path)), form)
    return sqlite_processes(path)


def source_notes(trace: KinetoTrace) -> tuple[list[str], list[str]]:
    """(notes, warnings) the report carries about the timing source (empty for Kineto)."""
    describe = getattr(trace, "describe", None)
    if describe is None:
        return [], []
    return [describe(), *trace.notes], list(trace.warnings)


def _et_seq(node) -> int | None:
    """An ET node's ``seq_id`` (flat key or nested attr), None when absent."""
    from linker.read.et import decode_attr_values

    if isinstance(node.seq_id, int):
        return node.seq_id
    for attr in decode_attr_values(node):
        if attr.name == "seq_id":
            return attr.value if isinstance(attr.value, int) else None
    return None


def seq_agreement(et, trace: KinetoTrace, event_of_op: list[int]) -> str | None:
    """The ``seq`` check of a link made without record-function ids: of the linked ops whose ET
    ``seq_id`` and range ``seq`` are both known (>= 0), how many agree. None when the trace's
    events carry no ``seq`` (Kineto). O(linked ops), decoding their attrs."""
    events = trace.cpu_events
    both = agree = 0
    for i, e in enumerate(event_of_op):
        if e < 0:
            continue
        seq = getattr(events[e].args, "seq", None)
        if seq is None or seq < 0:
            continue
        mine = _et_seq(et.nodes[i])
        if mine is None or mine < 0:
            continue
        both += 1
        agree += seq == mine
    if not both:
        return None
    note = f"seq check: the ET's seq_id equals the range's seq on {agree} of {both} linked ops that have both"
    return note if agree >= SEQ_AGREEMENT * both else f"{note}: BELOW {SEQ_AGREEMENT:.0%}, the order alignment may be off"

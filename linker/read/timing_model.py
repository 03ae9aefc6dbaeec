"""The Kineto model as filled from an NVTX-based capture (Nsight Systems, nvprof).

A timing source other than Kineto is read into the same ``KinetoTrace`` / ``KinetoEvent`` model, so
linking, the writers and the simulator need nothing new:

- a PyTorch NVTX range is a ``cpu_op`` event: the name is the range text before its first
  ``, seq = `` / ``, op_id = `` / ``, sizes = `` field; ``op_id`` becomes the ``Record function
  id`` (PyTorch writes the same RecordFunction handle as the ET's ``rf_id``) and the External id
  (it orders same-start ranges as Kineto's External id does: both are drawn at op start);
  ``sizes = [[…]]`` becomes ``Input Dims``; ``seq`` rides along in ``RangeArgs.seq``;
- a CUDA runtime / driver call is a ``cuda_runtime`` / ``cuda_driver`` event with its
  ``correlation``;
- kernels, memcpys and memsets are ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events with pid =
  device and tid = stream, as Kineto writes them.

Times are µs floats: ``ns / 1000`` computed by SQLite (an IEEE division, so a Kineto time written
as ns by ``scripts/kineto_to_sqlite.py`` reads back as the very float Kineto's decoder makes).

``TimingTrace`` adds what the report says about the source: its kind and version, the processes
read and the ranges left out. The builders below turn cursor rows into events in one
comprehension each (the SQL has already joined, filtered, parsed and sorted). Cost: one struct per
row read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from linker.read.kineto import KinetoArgs, KinetoEvent, KinetoTrace

NO_DIMS = KinetoArgs().input_dims
# Range text fields PyTorch appends to the op name (``getNvtxStr``), and older spellings of seq.
SEQ_MARKERS = (", seq = ", ", seq=", ", stashed seq = ", ", stashed seq=")
OP_ID_MARKER = ", op_id = "
SIZES_MARKER = ", sizes = "
INPUT_OP_IDS_MARKER = ", input_op_ids = "
NAME_END_MARKERS = SEQ_MARKERS + (OP_ID_MARKER, SIZES_MARKER, INPUT_OP_IDS_MARKER)
NS_PER_US = 1000.0
# Times stay as recorded while ns / 1000 keeps whole ns in a float (below 2**43 µs); beyond
# (nvprof's epoch ns) they are made relative to the earliest timestamp read.
MAX_PLAIN_US = float(1 << 43)
_FAR = 1 << 30


class RangeArgs(KinetoArgs, frozen=True, omit_defaults=True):
    """``KinetoArgs`` of a PyTorch NVTX range, plus its autograd sequence number (None: none)."""

    seq: int | None = None


@dataclass
class TimingTrace(KinetoTrace):
    """A ``KinetoTrace`` read from an Nsight Systems or nvprof SQLite file.

    ``source``: "nsys" or "nvprof"; ``version``: product and schema version as the file states
    them; ``processes``: pids read (rank order for ``batch``); ``notes``: what the report says
    about ranges and rows left out; ``warnings``: the same, for what the user should look at;
    ``time_base_ns``: subtracted from every timestamp (0: times as recorded)."""

    source: str = ""
    version: str = ""
    processes: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    time_base_ns: int = 0

    def describe(self) -> str:
        """One line for the report: source, version, processes."""
        kind = {"nsys": "Nsight Systems", "nvprof": "nvprof"}.get(self.source, self.source)
        pids = ", ".join(map(str, self.processes))
        base = f"; times relative to {self.time_base_ns} ns" if self.time_base_ns else ""
        return (f"timing source: {kind} SQLite export ({self.version}), "
                f"process{'es' if len(self.processes) != 1 else ''} {pids}{base}")


def _first_marker_sql(text: str, markers: tuple[str, ...]) -> str:
    """SQL: position of the first of ``markers`` in ``text`` (``_FAR`` when none occurs)."""
    parts = [f"coalesce(nullif(instr({text}, '{m}'), 0), {_FAR})" for m in markers]
    return f"min({', '.join(parts)})" if len(parts) > 1 else parts[0]


def _int_after_sql(text: str, marker: str) -> str:
    """SQL: the integer after ``marker`` in ``text``, or NULL when the marker is absent (SQLite's
    CAST reads the longest integer prefix)."""
    return (f"CASE WHEN instr({text}, '{marker}') > 0 THEN "
            f"CAST(substr({text}, instr({text}, '{marker}') + {len(marker)}) AS INTEGER) END")


def range_fields_sql(text: str = "t") -> dict[str, str]:
    """SQL expressions over the range text column ``text``: name, op_id, seq, sizes (the
    ``[[…]]`` list after ``, sizes = ``, NULL when absent or not valid JSON)."""
    cut = _first_marker_sql(text, NAME_END_MARKERS)
    seq = "coalesce(" + ", ".join(_int_after_sql(text, m) for m in SEQ_MARKERS) + ")"
    sizes_at = f"instr({text}, '{SIZES_MARKER}')"
    ops_at = f"instr({text}, '{INPUT_OP_IDS_MARKER}')"
    start = f"{sizes_at} + {len(SIZES_MARKER)}"
    raw_sizes = (f"CASE WHEN {sizes_at} = 0 THEN NULL WHEN {ops_at} > {sizes_at} "
                 f"THEN substr({text}, {start}, {ops_at} - ({start})) ELSE substr({text}, {start}) END")
    return {
        "name": f"CASE WHEN {cut} >= {_FAR} THEN {text} ELSE substr({text}, 1, {cut} - 1) END",
        "op_id": _int_after_sql(text, OP_ID_MARKER),
        "seq": seq,
        "sizes": f"CASE WHEN json_valid({raw_sizes}) THEN {raw_sizes} END",
        "has_op_id": f"(instr({text}, '{OP_ID_MARKER}') > 0)",
        "has_seq": "(" + " OR ".join(f"instr({text}, '{m}') > 0" for m in SEQ_MARKERS) + ")",
    }


def cpu_events(rows) -> list[KinetoEvent]:
    """Rows (name, pid, tid, ts, dur, op_id, seq, sizes) -> ``cpu_op`` events, in row order."""
    Event, Args, Raw, no_dims = KinetoEvent, RangeArgs, msgspec.Raw, NO_DIMS
    return [Event("X", "cpu_op", name, pid, tid, ts, dur, None,
                  Args(external_id=op_id, rf_id=op_id, input_dims=Raw(sizes.encode()) if sizes else no_dims,
                       seq=seq))
            for name, pid, tid, ts, dur, op_id, seq, sizes in rows]


def runtime_events(rows, names: dict) -> list[KinetoEvent]:
    """Rows (name key, driver?, pid, tid, ts, dur, correlation) -> runtime events; ``names`` maps
    the key (a string id or a callback id) to the call's name."""
    Event, Args = KinetoEvent, KinetoArgs
    return [Event("X", "cuda_driver" if driver else "cuda_runtime", names.get(key, ""), pid, tid, ts, dur,
                  None, Args(correlation=corr))
            for key, driver, pid, tid, ts, dur, corr in rows]


def gpu_events(rows) -> list[KinetoEvent]:
    """Rows (name, cat, device, stream, ts, dur, correlation) -> GPU events (pid = device,
    tid = stream), in row order."""
    Event, Args = KinetoEvent, KinetoArgs
    return [Event("X", cat, name, device, stream, ts, dur, None,
                  Args(correlation=corr, stream_value=stream, device=device))
            for name, cat, device, stream, ts, dur, corr in rows]


# CUPTI enum names as Kineto writes them into memcpy / memset event names.
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP"}
MEMORY_KINDS = {1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
                7: "Managed Static"}


def _case_sql(column: str, names: dict[int, str]) -> str:
    whens = " ".join(f"WHEN {code} THEN '{name}'" for code, name in names.items())
    return f"CASE {column} {whens} ELSE 'Unknown' END"


def memcpy_name_sql(kind: str, src: str | None, dst: str | None) -> str:
    """SQL: Kineto's memcpy name, ``Memcpy HtoD (Pageable -> Device)``, from the CUPTI enums."""
    head = f"'Memcpy ' || {_case_sql(kind, MEMCPY_KINDS)}"
    if src is None or dst is None:
        return head
    return (f"{head} || ' (' || {_case_sql(src, MEMORY_KINDS)} || ' -> ' || "
            f"{_case_sql(dst, MEMORY_KINDS)} || ')'")


def memset_name_sql(kind: str | None) -> str:
    """SQL: Kineto's memset name, ``Memset (Device)``."""
    return "'Memset'" if kind is None else f"'Memset (' || {_case_sql(kind, MEMORY_KINDS)} || ')'"

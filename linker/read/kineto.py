"""Read a Kineto (Chrome trace JSON) file into a ``KinetoTrace``.

Only what linking and the writers use is decoded: complete (``X``) events of the CPU, runtime and
GPU categories, ``ac2g`` flow endpoints, and a few top-level keys. ``args`` decode into a small
struct holding the ids (correlation, External id, Record function id) and GPU placement; other
args keys are skipped by the decoder, never materialised. Cost: one decode pass, one sort per
event kind (O(n log n)).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol

import msgspec

from linker.model.errors import TraceInputError
from linker.read.files import read_trace_bytes
from linker.read.nsys_json_form import FORM_WORDS, nsys_json_form

UNSET = msgspec.UNSET
Unset = msgspec.UnsetType

CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# Host API calls that put work on a GPU stream (docs/formats.md). A runtime event whose correlation
# matches a GPU op is a launch whatever its name (some builds write "INVALID"); this list names the
# known ones for the report.
LAUNCH_NAMES = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel", "cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpyToSymbol",
    "cudaMemcpyFromSymbol", "cudaMemsetAsync", "cudaGraphLaunch", "hipLaunchKernel",
    "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyAsync",
    "hipMemcpyWithStream", "hipMemsetAsync", "hipGraphLaunch",
})
# Launch calls whose one correlation carries every GPU op of a captured graph.
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
# Python call-stack events (with_stack): kept (unsorted) only around launches outside every cpu_op
# and annotation, the only place they are looked at.
PYTHON_CATEGORY = "python_function"


class KinetoArgs(msgspec.Struct, frozen=True, omit_defaults=True):
    """The ``args`` keys et-link uses; all optional. (``omit_defaults``: only for ``schedule.kineto_child``'s
    compact encoding; these structs are never written to an output.)"""

    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    rf_id: int | None = msgspec.field(default=None, name="Record function id")
    # ROCm runtime calls write the stream as a hex string ("0x0"): ``stream`` gives it as a number.
    stream_value: int | str | None = msgspec.field(default=None, name="stream")
    device: int | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    group_size: int | None = msgspec.field(default=None, name="Group size")
    comm_seq: int | None = msgspec.field(default=None, name="Seq")  # NCCL collectives: the group's sequence number
    bytes: int | str | None = None  # a decimal string on ROCm runtime calls
    # Tensor shapes of the op's inputs (recorded with record_shapes): kept raw, decoded only to
    # tell apart same-name neighbours.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input Dims")


    @property
    def stream(self) -> int | None:
        """The stream number: ints as written, "0x1f" / "31" strings parsed, else None."""
        value = self.stream_value
        if value is None or isinstance(value, int):
            return value
        try:
            return int(value, 0)
        except ValueError:
            return None


NO_ARGS = KinetoArgs()


class KinetoEvent(msgspec.Struct, omit_defaults=True):
    """One Chrome-trace event. ``ts``/``dur`` in microseconds (floats; ns fractions kept)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = -1.0  # absent in the file: negative, so ``sanity`` leaves the event out
    dur: float = -1.0
    id: int | str | None = None
    args: KinetoArgs = NO_ARGS

    @property
    def end(self) -> float:
        return self.ts + self.dur


class _KinetoDocument(msgspec.Struct):
    traceEvents: list[KinetoEvent] | Unset = UNSET
    nodes: msgspec.Raw | Unset = UNSET
    distributedInfo: dict[str, Any] | Unset = UNSET
    baseTimeNanoseconds: int | Unset = UNSET
    traceName: str | Unset = UNSET


@dataclass
class FlowEnd:
    """One endpoint of an ``ac2g`` flow arrow."""

    pid: int | str
    tid: int | str
    ts: float


@dataclass
class CpuColumns:
    """What linking reads of every CPU event, as columns (index = position in ``cpu_events``):
    start and duration (µs, as the events hold them), ``Record function id`` (None when absent),
    name and thread (for the report's examples of unlinked events). Linking by rf_id reads nothing
    else of most events, so a trace whose events are pending (``schedule.kineto_child``) is linked
    without making them."""

    ts: list[float]
    dur: list[float]
    rf_id: list[int | None]
    name: list[str]
    tid: list[int | str]

    @classmethod
    def of(cls, events: list[KinetoEvent]) -> CpuColumns:
        """The columns read off ``events``. O(n), in C but for the rf_id's."""
        return cls(list(map(_TS, events)), list(map(_DUR, events)), [e.args.rf_id for e in events],
                   list(map(_NAME, events)), list(map(_TID, events)))


_TS, _DUR, _NAME, _TID = attrgetter("ts"), attrgetter("dur"), attrgetter("name"), attrgetter("tid")
_PID = attrgetter("pid")


@dataclass
class KinetoTrace:
    """The parts of a Kineto trace et-link uses.

    ``cpu_events``: ``cpu_op`` and ``user_annotation`` complete events, sorted by
    (pid, tid, ts, External id, -dur): per thread in start order, an enclosing event first.
    ``runtime_events``: ``cuda_runtime``/``cuda_driver`` (and HIP) events, sorted by (pid, tid, ts).
    ``gpu_events``: kernels, memcpys, memsets, sorted by ts.
    ``flows``: ``ac2g`` flow id -> its endpoints (usually one on the host, one on the device).
    ``python_events``: the ``python_function`` events that may matter (``python_events_in_use``),
    in file order (not sorted).

    ``cpu_events`` may be given as a list or as ``PendingCpuEvents`` (events still encoded, with
    their columns: ``schedule.kineto_child``), which are decoded the first time ``cpu_events`` is
    read; ``cpu_columns()`` and ``cpu_count()`` never decode them. Setting ``cpu_events`` sets the
    columns with them.
    """

    path: str
    pid: int | None
    rank: int | None
    world_size: int | None
    cpu_events: list[KinetoEvent]  # a property: see ``_cpu_events`` below the class
    runtime_events: list[KinetoEvent]
    gpu_events: list[KinetoEvent]
    flows: dict[int | str, list[FlowEnd]] = field(default_factory=dict)
    python_events: list[KinetoEvent] = field(default_factory=list)

    def cpu_count(self) -> int:
        """``len(cpu_events)``, without decoding pending events. O(1)."""
        return len(self.__dict__["_cpu_columns"].ts)

    def cpu_columns(self) -> CpuColumns:
        """The ``CpuColumns`` of ``cpu_events`` (made when the events were set). O(1)."""
        return self.__dict__["_cpu_columns"]

    def cpu_events_decoded(self) -> bool:
        """False while the CPU events are pending (given encoded, not read since)."""
        return isinstance(self.__dict__["_cpu_events"], list)

    def decode_cpu_events(self) -> None:
        """Decode pending CPU events now (``PendingCpuEvents``: held by a child process that is
        about to go), so that ``cpu_events`` no longer needs it. O(n) once; nothing afterwards."""
        _get_cpu_events(self)

    def has_record_function_ids(self) -> bool:
        """True when some CPU event has a non-zero ``Record function id`` (0 means unknown)."""
        return any(self.cpu_columns().rf_id)


class PendingCpuEvents(Protocol):
    """CPU events not decoded yet: their count and columns, and ``fill()`` making them (once)."""

    columns: CpuColumns

    def fill(self) -> list[KinetoEvent]: ...


def _get_cpu_events(trace: KinetoTrace) -> list[KinetoEvent]:
    events = trace.__dict__["_cpu_events"]
    if not isinstance(events, list):  # pending: decoded now, once
        events = trace.__dict__["_cpu_events"] = events.fill()
    return events


def _set_cpu_events(trace: KinetoTrace, events) -> None:
    """The events (a list, or ``PendingCpuEvents``) and their columns, set together. O(n) for a
    list (``CpuColumns.of``), O(1) for pending events."""
    trace.__dict__["_cpu_events"] = events
    trace.__dict__["_cpu_columns"] = CpuColumns.of(events) if isinstance(events, list) else events.columns


# A property on the dataclass (set after it is made, so that ``cpu_events`` stays an ``__init__``
# field): the one place where pending events become a list.
KinetoTrace.cpu_events = property(_get_cpu_events, _set_cpu_events)


def _cpu_order(event: KinetoEvent) -> tuple:
    # Equal start times are common (integer µs in older traces): the op that started first has
    # the smaller External id (assigned at op start); then the longer (enclosing) event first.
    ext = event.args.external_id
    return (str(event.pid), str(event.tid), event.ts, ext if ext is not None else 1 << 62, -event.dur)


def _own_input_dims(events: list[KinetoEvent]) -> None:
    """Give each event's ``Input Dims`` its own bytes: a decoded ``msgspec.Raw`` is a view that
    keeps the whole decompressed file alive (158 MB on a large trace). O(n)."""
    unset = NO_ARGS.input_dims
    for event in events:
        dims = event.args.input_dims
        if dims is not unset:
            msgspec.structs.force_setattr(event.args, "input_dims", msgspec.Raw(bytes(dims)))


def _refuse_nsys_json(path: Path) -> None:
    """An Nsight Systems JSON export is not a Kineto trace (``read_timing_trace`` reads it; a
    caller of this reader gets one line, before the file is read whole). Reads its first line."""
    form = nsys_json_form(path)
    if form is not None:
        raise TraceInputError(path, f"an Nsight Systems {FORM_WORDS[form]} export, not a Kineto trace")


def read_kineto_trace(path: str | Path, own_dims: bool = True) -> KinetoTrace:
    """Load a Kineto trace file (``.json`` or gzip). Raises ``TraceInputError`` on bad input.

    ``own_dims=False`` leaves each ``Input Dims`` a view into the decoded file (for a caller that
    copies them anyway: ``schedule.kineto_child``)."""
    path = Path(path)
    _refuse_nsys_json(path)
    data = read_trace_bytes(path)
    try:
        doc = msgspec.json.decode(data, type=_KinetoDocument)
    except msgspec.ValidationError as err:
        raise TraceInputError(path, f"not a valid Kineto trace: {err}") from None
    except msgspec.DecodeError as err:
        raise TraceInputError(path, f"not valid JSON ({err})") from None
    if doc.traceEvents is UNSET:
        if doc.nodes is not UNSET:
            raise TraceInputError(
                path, "this is an Execution Trace, not a Kineto trace (arguments swapped?)"
            )
        raise TraceInputError(path, "not a Kineto trace: no 'traceEvents' list")

    cpu, runtime, gpu, python = [], [], [], []
    flows: dict[int | str, list[FlowEnd]] = {}
    for event in doc.traceEvents:
        cat = event.cat
        if event.ph == "X":
            if cat in CPU_CATEGORIES:
                cpu.append(event)
            elif cat in RUNTIME_CATEGORIES:
                runtime.append(event)
            elif cat in GPU_CATEGORIES:
                gpu.append(event)
            elif cat == PYTHON_CATEGORY:
                python.append(event)
        elif cat == "ac2g" and event.ph in ("s", "f") and event.id is not None:
            flows.setdefault(event.id, []).append(FlowEnd(event.pid, event.tid, event.ts))
    if not cpu:
        raise TraceInputError(path, "not a usable Kineto trace: it has no cpu_op or user_annotation events")
    info = doc.distributedInfo if doc.distributedInfo is not UNSET else {}
    del doc, data
    if own_dims:
        for events in (cpu, runtime, gpu):
            _own_input_dims(events)
    cpu.sort(key=_cpu_order)
    runtime.sort(key=_cpu_order)
    gpu.sort(key=lambda e: e.ts)

    pid_counts = Counter(map(_PID, cpu))  # counted in C; the most common integer pid is the trace's
    for pid in [pid for pid in pid_counts if not isinstance(pid, int)]:
        del pid_counts[pid]
    rank = info.get("rank")
    world = info.get("world_size")
    return KinetoTrace(
        path=str(path),
        pid=pid_counts.most_common(1)[0][0] if pid_counts else None,
        rank=rank if isinstance(rank, int) else None,
        world_size=world if isinstance(world, int) else None,
        cpu_events=cpu,
        runtime_events=runtime,
        gpu_events=gpu,
        flows=flows,
        python_events=python_events_in_use(cpu, runtime, gpu, python),
    )


cpu_event_order = _cpu_order  # the sort key of ``KinetoTrace.cpu_events``, for lists built elsewhere


def python_events_in_use(cpu, runtime, gpu, python) -> list[KinetoEvent]:
    """The python events worth keeping: those on a thread with a GPU launch that no CPU event
    covers, overlapping the span of such launches (usually none: a trace with stacks can hold
    millions, kept alive for nothing). ``cpu`` sorted as ``cpu_event_order``.
    O(n + r log n + p): the CPU events' union per thread, then one bisection per launch."""
    if not python:
        return []
    carried = {g.args.correlation for g in gpu if g.args.correlation is not None}
    launches = [r for r in runtime if r.args.correlation in carried]
    starts: dict = {}
    ends: dict = {}
    for e in cpu:  # per thread, the union of the intervals (start order: merge on the fly)
        key = (e.pid, e.tid)
        thread_starts, thread_ends = starts.setdefault(key, []), ends.setdefault(key, [])
        if thread_ends and e.ts <= thread_ends[-1]:
            thread_ends[-1] = max(thread_ends[-1], e.ts + e.dur)
        else:
            thread_starts.append(e.ts)
            thread_ends.append(e.ts + e.dur)
    span: dict = {}  # thread -> (first, last) uncovered launch time
    for r in launches:
        key = (r.pid, r.tid)
        k = bisect.bisect_right(starts.get(key, ()), r.ts) - 1
        if k < 0 or ends[key][k] < r.ts:
            first, last = span.get(key, (r.ts, r.ts))
            span[key] = (min(first, r.ts), max(last, r.ts))
    if not span:
        return []
    kept = []
    for e in python:
        window = span.get((e.pid, e.tid))
        if window is not None and e.ts <= window[1] and e.ts + e.dur >= window[0]:
            kept.append(e)
    return kept

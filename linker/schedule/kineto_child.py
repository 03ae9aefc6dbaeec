"""Read a large Kineto trace in a forked child while the parent reads the ET (the two files are
independent until matching).

``start(path)`` forks (``fork.ForkedCall``) while the process is still small, so the parent
pays no copy-on-write for what it then builds. The child runs ``read_kineto_trace`` and the input
check ``sanity.check_kineto_trace``, and hands back the checked ``KinetoTrace`` and the check's
warnings encoded with msgpack (``to_wire``), in parts: the trace without its events, then the
events ``CHUNK_EVENTS`` at a time, as compact maps (default fields left out), their ``Input Dims``
(raw JSON bytes, which msgpack would otherwise splice in as msgpack) taken out into one JSON array
per chunk, carried as a msgpack binary with the events' positions. ``finish(child)`` decodes each
part in C as it comes (``from_wire``: the child encodes the next meanwhile), splits each array with
one JSON decode and puts each ``Input Dims`` back in its event as a view into that array (which
holds only dims): the same trace and warnings the serial read and check give
(tests/test_read_paths.py).

The CPU events, most of a trace, are not decoded then. Each of their chunks comes as its
``CpuColumns`` (start, duration, rf_id, name, thread: what linking by rf_id and its report read
of every event), beside the chunk itself, encoded as above, which the parent keeps as it came. The
trace's ``cpu_events`` are then pending (``PendingEvents``, a ``kineto.PendingCpuEvents``): decoded,
all at once, the first time anything reads them (tests/test_kineto_deferred.py).

Then the child nests the CPU events (``durations.nest_cpu_events``, which linking needs and which
needs nothing but this trace) and sends the nesting's three columns as machine arrays
(``nesting_to_wire``). ``finish`` gives them back as a ``CpuNesting`` value beside the trace (C
conversions), or None if they do not come (the link then nests the events itself). When there is
no child (the schedule started none) or it failed for any reason (a bad file,
a trace the check refuses, a payload cut short), ``finish`` gives None and the caller reads
and checks the file itself, so a bad file fails with the same ``TraceInputError``, in the same
order, as without a child.

Cost, for n events: the child reads as the serial path does, plus one O(n) pass and the encode,
then the nesting sweep; the parent takes the CPU columns with C conversions (0.03 s for 360k
events, against 0.24 s to decode the events), decodes the other lists, and takes the nesting's
columns likewise; the CPU events, if read, cost what decoding them did before.
"""

from __future__ import annotations

import contextlib
import operator
import os
from array import array
from collections.abc import Iterator
from typing import NamedTuple

import msgspec
from msgspec.structs import force_setattr

from linker.link.durations import CpuNesting, nest_cpu_events, rounded_exclusive
from linker.model.errors import TraceInputError
from linker.schedule.fork import ForkedCall
from linker.read.kineto import NO_ARGS, CpuColumns, FlowEnd, KinetoEvent, KinetoTrace, read_kineto_trace
from linker.read.sanity import check_kineto_trace

_NO_DIMS = NO_ARGS.input_dims


class _Trace(msgspec.Struct, array_like=True):
    """A ``KinetoTrace`` without its events (they follow in chunks)."""

    path: str
    pid: int | None
    rank: int | None
    world_size: int | None
    flows: dict[int | str, list[FlowEnd]]


class _Head(msgspec.Struct, array_like=True):
    trace: _Trace
    warnings: list[str]  # of ``sanity.check_kineto_trace``, run by the child too
    sizes: list[int]  # events per list (cpu, runtime, gpu, python)


class _Columns(msgspec.Struct, array_like=True):
    """A chunk of CPU events' ``CpuColumns``: ts and dur as float64 machine arrays, the rf_ids,
    and the names as the chunk's distinct names with each event's position among them (int32)."""

    ts: bytes
    dur: bytes
    rf_id: list[int | None]
    names: list[str]
    name_at: bytes
    tids: list[int | str]  # likewise the threads: the chunk's distinct ones, each event's position
    tid_at: bytes


class _Chunk(msgspec.Struct, array_like=True):
    events: list[KinetoEvent]  # without their ``Input Dims`` (carried below)
    # The positions (in the chunk) of the events with ``Input Dims``, and those dims (raw JSON
    # values) in one JSON array, carried as a msgpack binary.
    dims_at: list[int]
    dims: bytes


class _CpuChunk(msgspec.Struct, array_like=True):
    """A chunk of CPU events' columns (the events themselves come last: ``cpu_events_to_wire``)."""

    columns: _Columns


_HEAD, _CHUNK, _CPU_CHUNK = (msgspec.msgpack.Decoder(kind) for kind in (_Head, _Chunk, _CpuChunk))
CHUNK_EVENTS = 1 << 15  # events per part: the parent decodes one while the child encodes the next
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def start(path: str | os.PathLike) -> ForkedCall | None:
    """A child reading and checking the Kineto trace at ``path`` (the schedule decides whether to
    start one: ``Schedule.kineto_reader``), or None when no process can be made."""
    try:
        return ForkedCall(lambda: _read_and_check(path))
    except OSError:
        return None


def _read_and_check(path) -> Iterator[bytes]:
    """The child's work: the checked trace without its CPU events (``trace_to_wire``), the CPU
    events' nesting, then the CPU events (``cpu_events_to_wire``), which the parent reads only if
    something reads them: until then the child waits on the full pipe."""
    trace = read_kineto_trace(path, own_dims=False)
    warnings = check_kineto_trace(trace)
    # What the parent waits for is all made before the first part goes: the pipe holds only a few
    # parts, and a child blocked on it until the parent has read the ET would make the rest then.
    needed = [*trace_to_wire(trace, warnings), nesting_to_wire(nest_cpu_events(trace.cpu_events))]
    yield from needed
    del needed
    yield from cpu_events_to_wire(trace)


class CheckedKineto(NamedTuple):
    """A Kineto trace as read and checked: the trace, the check's warnings, and its CPU events'
    nesting when the child made it (else None: the link nests them)."""

    trace: KinetoTrace
    warnings: list[str]
    nesting: CpuNesting | None = None


def finish(child: ForkedCall | None) -> CheckedKineto | None:
    """The child's trace, checked, with the warnings of the check and, when it came, its CPU
    events' nesting; or None (no child, or it failed (a bad file, a trace the check refuses): the
    caller reads and checks the file itself, and the child is reaped). The trace's CPU events are
    pending on the child, which the caller keeps until it is done with them (``cancel()``)."""
    parts = child.parts() if child is not None else iter(())
    checked = None
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, StopIteration):
        checked = from_wire(parts)
    wire = next(parts, None) if checked is not None else None
    if checked is None:
        if child is not None:
            child.cancel()
        return None
    nesting = None
    if wire is not None:
        with contextlib.suppress(ValueError):
            nesting = nesting_from_wire(checked[0].cpu_count(), wire)
    return CheckedKineto(checked[0], checked[1], nesting)


def _lists(trace) -> tuple:
    return trace.cpu_events, trace.runtime_events, trace.gpu_events, trace.python_events


def to_wire(trace: KinetoTrace, warnings: list[str], chunk_events: int = CHUNK_EVENTS) -> Iterator[bytes]:
    """``trace_to_wire``'s parts, then ``cpu_events_to_wire``'s: all ``from_wire`` and the pending
    events need."""
    yield from trace_to_wire(trace, warnings, chunk_events)
    yield from cpu_events_to_wire(trace, chunk_events)


def trace_to_wire(trace: KinetoTrace, warnings: list[str], chunk_events: int = CHUNK_EVENTS) -> Iterator[bytes]:
    """The trace and its check's warnings as msgpack parts: the trace without its events (``_Head``),
    the CPU events' columns in chunks of ``chunk_events`` (``_CpuChunk``), then the other event
    lists in chunks (``_Chunk``, see ``_encoded``)."""
    lists = _lists(trace)
    bare = _Trace(trace.path, trace.pid, trace.rank, trace.world_size, trace.flows)
    yield msgspec.msgpack.encode(_Head(bare, warnings, [len(events) for events in lists]))
    encode = msgspec.msgpack.Encoder().encode
    cpu = trace.cpu_events
    for start in range(0, len(cpu), chunk_events):
        chunk = cpu[start:start + chunk_events]
        yield encode(_CpuChunk(_columns(chunk, list(map(_ARGS, chunk)))))
    for events in lists[1:]:
        yield from _encoded(events, chunk_events)


def cpu_events_to_wire(trace: KinetoTrace, chunk_events: int = CHUNK_EVENTS) -> Iterator[bytes]:
    """The CPU events in chunks of ``chunk_events`` (``_Chunk``, see ``_encoded``)."""
    yield from _encoded(trace.cpu_events, chunk_events)


def _encoded(events: list[KinetoEvent], chunk_events: int) -> Iterator[bytes]:
    """``events`` as ``_Chunk`` parts. Each ``Input Dims`` leaves its event (reset in place to the
    default, so the event's map omits it) for one JSON array per chunk, beside the positions of
    the events they belong to."""
    encode = msgspec.msgpack.Encoder().encode
    for start in range(0, len(events), chunk_events):
        chunk = events[start:start + chunk_events]
        args = list(map(_ARGS, chunk))
        positions = [i for i, d in enumerate(map(_INPUT_DIMS, args)) if d is not _NO_DIMS]
        carried = [args[i] for i in positions]
        dims = b"[" + b",".join(map(_INPUT_DIMS, carried)) + b"]"
        for event_args in carried:
            force_setattr(event_args, "input_dims", _NO_DIMS)
        yield encode(_Chunk(chunk, positions, dims))


def _columns(chunk: list[KinetoEvent], args: list) -> _Columns:
    """The chunk's ``CpuColumns`` as the wire carries them."""
    names: dict[str, int] = {}
    name_at = array("i", [names.setdefault(name, len(names)) for name in map(_NAME, chunk)])
    tids: dict[int | str, int] = {}
    tid_at = array("i", [tids.setdefault(tid, len(tids)) for tid in map(_TID, chunk)])
    return _Columns(array("d", map(_TS, chunk)).tobytes(), array("d", map(_DUR, chunk)).tobytes(),
                    list(map(_RF_ID, args)), list(names), name_at.tobytes(), list(tids), tid_at.tobytes())


def from_wire(parts: Iterator, skip: int = 0) -> tuple[KinetoTrace, list[str], PendingEvents]:
    """The trace and warnings ``trace_to_wire`` encoded, taken from ``parts``, each ``Input Dims``
    back in its event: a view into its chunk's JSON array (which holds only dims), split in C by
    one JSON decode and put back by C loops, no Python per event. The CPU events are pending (the
    third value): read from the rest of ``parts`` when first needed, after ``skip`` other parts
    (the nesting). Raises ``StopIteration`` when the parts end early."""
    head = _HEAD.decode(next(parts))
    pending = PendingEvents(head.sizes[0], parts, skip, head.trace.path)
    while pending.taken < pending.count:
        pending.take(_CPU_CHUNK.decode(next(parts)))
    lists: list[list[KinetoEvent]] = [[], [], []]
    for events, size in zip(lists, head.sizes[1:]):
        while len(events) < size:
            events += _events(next(parts))
        if len(events) != size:
            raise msgspec.ValidationError(f"{len(events)} events for {size}")
    pending.close()
    bare = head.trace
    trace = KinetoTrace(bare.path, bare.pid, bare.rank, bare.world_size, pending, *lists[:2], bare.flows, lists[2])
    return trace, head.warnings, pending


def _events(part) -> list[KinetoEvent]:
    """The events of an encoded ``_Chunk``, their ``Input Dims`` put back (views into its JSON
    array of dims, split by one decode)."""
    chunk = _CHUNK.decode(part)
    events = chunk.events
    for k, dims in zip(chunk.dims_at, _RAW_LIST.decode(chunk.dims)):
        force_setattr(events[k].args, "input_dims", dims)
    return events


class PendingEvents:
    """The CPU events of a trace from the wire, not taken until something reads
    ``KinetoTrace.cpu_events`` (linking by rf_id reads only their ``columns``: ``CpuColumns``).
    ``fill()`` takes them from the rest of the wire (the child encodes them meanwhile; the caller
    keeps it until then) and decodes them; it is called once, by the trace. A child that is gone
    (cancelled, failed) leaves them to this process: the file is read and checked again, as the
    serial schedule reads it."""

    def __init__(self, count: int, parts: Iterator = iter(()), skip: int = 0, path: str = ""):
        self.events: list[KinetoEvent] = []
        self.count, self.taken = count, 0
        self.columns: CpuColumns | None = None
        self._parts, self._skip, self._path = parts, skip, path
        self._ts, self._dur = array("d"), array("d")
        self._rf_id: list[int | None] = []
        self._names: list[str] = []
        self._tids: list[int | str] = []

    def take(self, chunk: _CpuChunk) -> None:
        """Keep one chunk, its columns appended to the trace's. Raises ``ValidationError`` when
        the columns are not one per event."""
        columns = chunk.columns
        at = array("i")
        at.frombytes(columns.name_at)
        size = len(at)
        self._ts.frombytes(columns.ts)
        self._dur.frombytes(columns.dur)
        self._rf_id += columns.rf_id
        names = columns.names
        self._names += [names[k] for k in at]
        at = array("i")
        at.frombytes(columns.tid_at)
        tids = columns.tids
        self._tids += [tids[k] for k in at]
        self.taken += size
        lengths = {len(self._ts), len(self._dur), len(self._rf_id), len(self._names), len(self._tids)}
        if lengths != {self.taken}:
            raise msgspec.ValidationError(f"CPU event columns of unequal lengths for {size} events")

    def close(self) -> None:
        """Every chunk has come: make the columns. Raises ``ValidationError`` when more events
        came than the head announced."""
        if self.taken != self.count:
            raise msgspec.ValidationError(f"{self.taken} events for {self.count}")
        self.columns = CpuColumns(self._ts.tolist(), self._dur.tolist(), self._rf_id, self._names, self._tids)

    def fill(self) -> list[KinetoEvent]:
        """Take and decode the events into ``events`` (in order, their ``Input Dims`` back) and
        return it; from the file again when the wire cannot give them all."""
        parts, self._parts = self._parts, iter(())
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, StopIteration):
            for _ in range(self._skip):
                next(parts)
            while len(self.events) < self.count:
                self.events += _events(next(parts))
        if len(self.events) != self.count:  # the child is gone: as the serial schedule reads it
            trace = read_kineto_trace(self._path)
            check_kineto_trace(trace)
            if len(trace.cpu_events) != self.count:
                raise TraceInputError(self._path, "changed while it was being read")
            self.events[:] = trace.cpu_events
        return self.events


def nesting_to_wire(nesting: CpuNesting) -> bytes:
    """The nesting's columns as machine arrays, one after the other: parents (int64), then
    exclusive durations, ends and the exclusive durations rounded as the ET+ writes them
    (float64; ``rounded_exclusive``, made here when the nesting has none), all of one length."""
    rounded = nesting.rounded if nesting.rounded is not None else rounded_exclusive(nesting.exclusive)
    columns = [array("q", nesting.parents), array("d", nesting.exclusive), nesting.end, array("d", rounded)]
    return b"".join([column.tobytes() for column in columns])


def nesting_from_wire(n: int, data) -> CpuNesting:
    """The ``CpuNesting`` of ``nesting_to_wire``'s columns for ``n`` events (the values bit for
    bit). Raises ``ValueError`` when they are not of that length."""
    if len(data) != 32 * n:
        raise ValueError(f"{len(data)} bytes of nesting for {n} CPU events")
    view = memoryview(data)
    parents, exclusive, ends, rounded = array("q"), array("d"), array("d"), array("d")
    for k, column in enumerate((parents, exclusive, ends, rounded)):
        column.frombytes(view[8 * n * k:8 * n * (k + 1)])
    # The parents as ``nest_cpu_events`` makes them, one int object per parent, not one per event.
    ints = list(range(n))
    ints.append(-1)  # ints[-1]: the top level's -1
    parents = [ints[p] for p in parents]
    del ints
    return CpuNesting(parents, exclusive.tolist(), ends, rounded.tolist())


_ARGS, _INPUT_DIMS, _RF_ID = (operator.attrgetter(name) for name in ("args", "input_dims", "rf_id"))
_TS, _DUR, _NAME, _TID = (operator.attrgetter(name) for name in ("ts", "dur", "name", "tid"))

"""Read a large Kineto trace in a forked child while the parent reads the ET (the two files are
independent until matching).

``start(path)`` forks (``forked.ForkedCall``) while the process is still small, so the parent
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
of every event), while the chunk itself, encoded as above, goes on the child's shelf (``forked.shelve``: a memory file
the parent maps, no copy through the pipe). The trace's ``cpu_events`` are then deferred
(``DeferredEvents``): decoded from the shelf, all at once, the first time anything reads them
(tests/test_kineto_deferred.py). When the link will try record-function ids first on a trace that
has them and no GPU events (``start``'s ``rf_id_first``), nothing will read the events: the child
does not encode them at all (a quarter of its work), and if something reads them after all they
are read again from the file.

Then the child nests the CPU events (``durations.cpu_nesting``, which linking needs and which
needs nothing but this trace) and sends the nesting's three columns as machine arrays
(``nesting_to_wire``), with a fourth when the events were left in the file: the exclusive
durations rounded as the ET+ writes them (``durations.rounded_exclusive``: 0.1 s of the parent's
work otherwise, done in the time the events' encoding would have taken). ``finish`` puts them on
the trace (C conversions), or leaves the nesting to be computed where it is needed if they do not
come. When there is no child (a small file, no ``fork``) or it failed for any reason (a bad file,
a trace the check refuses, a shelf without its chunks), ``finish`` gives None and the caller reads
and checks the file itself, so a bad file fails with the same ``TraceInputError``, in the same
order, as without a child.

Cost, for n events: the child reads as the serial path does, plus one O(n) pass and the encode,
then the nesting sweep; the parent takes the CPU columns with C conversions (0.03 s for 360k
events, against 0.24 s to decode the events), decodes the other lists, and takes the nesting's
columns likewise; the CPU events, if read, cost what decoding them did before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import operator
import os
from array import array
from collections import deque
from collections.abc import Iterator
from itertools import repeat
from pathlib import Path

import msgspec
from msgspec.structs import force_setattr

from linker.link.durations import CpuNesting, nest_cpu_events, rounded_exclusive
from linker.model.errors import TraceInputError
from linker.schedule.fork import ForkedCall, can_fork, shelve, spare_core
from linker.read.kineto import NO_ARGS, CpuColumns, KinetoEvent, KinetoTrace, read_kineto_trace
from linker.read.sanity import check_kineto_trace

# Below this size on disk (about a 30 MB gzip-compressed trace's JSON) the serial read is quick.
FORK_MIN_BYTES = 2 << 20

_NO_DIMS = NO_ARGS.input_dims


class _Head(msgspec.Struct, array_like=True):
    trace: KinetoTrace  # without its events: they follow in chunks
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
    """A chunk of CPU events: their columns, and the events as an encoded ``_Chunk``, decoded only
    if they are read: on the child's shelf (``forked.shelve``) at ``shelf_at``, else here (a
    msgpack binary the parent takes as a view)."""

    columns: _Columns
    chunk: memoryview
    shelf_at: int = -1  # NOT_SENT: the events were not sent (``to_wire``'s ``send_cpu_events``)
    shelf_size: int = 0


NOT_SENT = -2


_HEAD, _CHUNK, _CPU_CHUNK = (msgspec.msgpack.Decoder(kind) for kind in (_Head, _Chunk, _CpuChunk))
CHUNK_EVENTS = 1 << 15  # events per part: the parent decodes one while the child encodes the next
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def start(path: str | os.PathLike, rf_id_first: bool = False) -> ForkedCall | None:
    """A child reading the Kineto trace at ``path``, or None (small or unreadable file, no fork, a
    single core). ``rf_id_first``: the link will try record-function ids first, which read only
    the CPU events' columns: a trace with ids and no GPU events then keeps its CPU events in the
    file (``to_wire``'s ``send_cpu_events``; read again from it if they are ever read)."""
    try:
        big = Path(path).stat().st_size >= FORK_MIN_BYTES
    except OSError:
        return None
    if not big or not can_fork() or not spare_core():
        return None
    try:
        return ForkedCall(lambda: _read_and_check(path, rf_id_first), shelf=True)
    except OSError:
        return None


def _read_and_check(path, rf_id_first: bool = False) -> Iterator[bytes]:
    """The child's work: the checked trace (``to_wire``'s parts), then its CPU events' nesting."""
    trace = read_kineto_trace(path, own_dims=False)
    warnings = check_kineto_trace(trace)
    events_left = rf_id_first and _joins_by_rf_id(trace)
    yield from to_wire(trace, warnings, not events_left)
    nesting = nest_cpu_events(trace.cpu_events)
    if events_left:  # the time the events' encoding would take, and more, is spare
        nesting.rounded = rounded_exclusive(nesting.exclusive)
    yield nesting_to_wire(nesting)


def finish(child: ForkedCall | None) -> tuple[KinetoTrace, list[str]] | None:
    """The child's trace, checked, with the warnings of the check and, when it came, its CPU
    events' nesting (``KinetoTrace.cpu_nesting``); or None (no child, or it failed (a bad file, a
    trace the check refuses): the caller reads and checks the file itself)."""
    parts = child.parts() if child is not None else iter(())
    checked = None
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, StopIteration):
        checked = from_wire(parts)
        deferred = checked[0].deferred_cpu
        if deferred is not None and not deferred.find_shelved(child.shelf() if child is not None else None):
            checked = None
    nesting = next(parts, None) if checked is not None else None
    if child is not None:
        child.cancel()
    if nesting is not None:
        with contextlib.suppress(ValueError):
            nesting_from_wire(checked[0], nesting)
    return checked


def _lists(trace) -> tuple:
    return trace.cpu_events, trace.runtime_events, trace.gpu_events, trace.python_events


def _joins_by_rf_id(trace: KinetoTrace) -> bool:
    """True when linking by record-function ids will not read the CPU events themselves: no GPU
    events to attribute, and ids on the first CPU events (a trace has them all or none)."""
    return not trace.gpu_events and any(map(_RF_ID, map(_ARGS, trace.cpu_events[:CHUNK_EVENTS])))


def to_wire(trace: KinetoTrace, warnings: list[str], send_cpu_events: bool = True) -> Iterator[bytes]:
    """The trace and its check's warnings as msgpack parts: the trace without its events (``_Head``),
    then each event list in chunks of ``CHUNK_EVENTS`` (``_Chunk``). Each ``Input Dims`` leaves its
    event (reset in place to the default, so the event's map omits it) for one JSON array per chunk,
    beside the positions of the events they belong to. Without ``send_cpu_events`` the CPU chunks
    carry their columns only (``_CpuChunk.shelf_at`` = ``NOT_SENT``)."""
    lists = _lists(trace)
    bare = dataclasses.replace(trace, cpu_events=[], runtime_events=[], gpu_events=[], python_events=[])
    yield msgspec.msgpack.encode(_Head(bare, warnings, [len(events) for events in lists]))
    encode = msgspec.msgpack.Encoder().encode
    for events in lists:
        for start in range(0, len(events), CHUNK_EVENTS):
            chunk = events[start:start + CHUNK_EVENTS]
            args = list(map(_ARGS, chunk))
            columns = _columns(chunk, args) if events is trace.cpu_events else None
            if columns is not None and not send_cpu_events:
                yield encode(_CpuChunk(columns, memoryview(b""), NOT_SENT))
                continue
            positions = [i for i, d in enumerate(map(_INPUT_DIMS, args)) if d is not _NO_DIMS]
            carried = list(map(args.__getitem__, positions))
            dims = b"[" + b",".join(map(_INPUT_DIMS, carried)) + b"]"
            deque(map(force_setattr, carried, repeat("input_dims"), repeat(_NO_DIMS)), maxlen=0)
            part = encode(_Chunk(chunk, positions, dims))
            if columns is None:
                yield part
            elif (at := shelve(part)) is not None:
                yield encode(_CpuChunk(columns, memoryview(b""), at, len(part)))
            else:
                yield encode(_CpuChunk(columns, memoryview(part)))


def _columns(chunk: list[KinetoEvent], args: list) -> _Columns:
    """The chunk's ``CpuColumns`` as the wire carries them."""
    names: dict[str, int] = {}
    name_at = array("i", [names.setdefault(name, len(names)) for name in map(_NAME, chunk)])
    tids: dict[int | str, int] = {}
    tid_at = array("i", [tids.setdefault(tid, len(tids)) for tid in map(_TID, chunk)])
    return _Columns(array("d", map(_TS, chunk)).tobytes(), array("d", map(_DUR, chunk)).tobytes(),
                    list(map(_RF_ID, args)), list(names), name_at.tobytes(), list(tids), tid_at.tobytes())


def from_wire(parts: Iterator) -> tuple[KinetoTrace, list[str]]:
    """The trace and warnings ``to_wire`` encoded, taken from ``parts`` (the parts after them are
    left there), each ``Input Dims`` back in its event: a view into its chunk's JSON array (which
    holds only dims), split in C by one JSON decode and put back by C loops, no Python per event.
    Raises ``StopIteration`` when the parts end early."""
    head = _HEAD.decode(next(parts))
    trace = head.trace
    deferred = DeferredEvents(trace.cpu_events, head.sizes[0])
    while deferred.taken < deferred.count:
        deferred.take(_CPU_CHUNK.decode(next(parts)))
    for events, size in zip(_lists(trace)[1:], head.sizes[1:]):
        while len(events) < size:
            events += _events(next(parts))
        if len(events) != size:
            raise msgspec.ValidationError(f"{len(events)} events for {size}")
    deferred.defer(trace)
    return trace, head.warnings


def _events(part) -> list[KinetoEvent]:
    """The events of an encoded ``_Chunk``, their ``Input Dims`` put back (views into its JSON
    array of dims, split by one decode)."""
    chunk = _CHUNK.decode(part)
    args = map(_ARGS, map(chunk.events.__getitem__, chunk.dims_at))
    deque(map(force_setattr, args, repeat("input_dims"), _RAW_LIST.decode(chunk.dims)), maxlen=0)
    return chunk.events


class DeferredEvents:
    """The CPU events of a trace from the wire, left encoded until something reads
    ``KinetoTrace.cpu_events`` (linking by rf_id reads only their columns: ``CpuColumns``).
    ``events`` is the list they will fill (empty until then); ``fill()`` decodes them all into it
    (what ``from_wire`` did at once before: a quarter of reading the JSON) and returns it."""

    def __init__(self, events: list, count: int):
        self.events, self.count, self.taken = events, count, 0
        self._chunks: list[memoryview | tuple[int, int]] = []  # encoded ``_Chunk``s, or where shelved
        self.shelf: mmap.mmap | None = None  # the child's shelf, once all chunks are on it
        self._ts, self._dur = array("d"), array("d")
        self._rf_id: list[int | None] = []
        self._names: list[str] = []
        self._tids: list[int | str] = []
        self._path = ""  # the trace's file (``defer``): events not sent are read again from it

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
        self._names += map(columns.names.__getitem__, at)
        at = array("i")
        at.frombytes(columns.tid_at)
        self._tids += map(columns.tids.__getitem__, at)
        self.taken += size
        lengths = {len(self._ts), len(self._dur), len(self._rf_id), len(self._names), len(self._tids)}
        if lengths != {self.taken}:
            raise msgspec.ValidationError(f"CPU event columns of unequal lengths for {size} events")
        if chunk.shelf_at == NOT_SENT:
            self._chunks.append(None)
        else:
            self._chunks.append(chunk.chunk if chunk.shelf_at < 0 else (chunk.shelf_at, chunk.shelf_size))

    def defer(self, trace: KinetoTrace) -> None:
        """Make ``trace``'s CPU events these: its ``cpu_events`` deferred, its columns given.
        Raises ``ValidationError`` when more events came than the head announced."""
        if self.taken != self.count:
            raise msgspec.ValidationError(f"{self.taken} events for {self.count}")
        columns = CpuColumns(self._ts.tolist(), self._dur.tolist(), self._rf_id, self._names, self._tids)
        del trace.cpu_events  # read through ``KinetoTrace.__getattr__``: ``fill`` makes them
        trace.deferred_cpu = self
        self._path = trace.path
        trace.cpu_columns_cache = (self.events, columns)

    def find_shelved(self, shelf: mmap.mmap | None) -> bool:
        """Take the child's ``shelf`` (``ForkedCall.shelf()``, once every chunk has come); False
        when a chunk said to be on it is not (then the events cannot be made: the caller reads the
        file itself)."""
        self.shelf = shelf
        room = len(shelf) if shelf is not None else 0
        return all(chunk[0] + chunk[1] <= room for chunk in self._chunks if isinstance(chunk, tuple))

    def fill(self) -> list[KinetoEvent]:
        """Decode the events into ``events`` (in order, their ``Input Dims`` back) and return it.
        Events that were not sent are read again from the file, as the child read and checked
        them (``TraceInputError`` if it no longer has as many)."""
        chunks, self._chunks = self._chunks, []
        if None in chunks:  # not sent
            self.shelf = None
            trace = read_kineto_trace(self._path)
            check_kineto_trace(trace)
            if len(trace.cpu_events) != self.count:
                raise TraceInputError(self._path, "changed while it was being read")
            self.events += trace.cpu_events
            return self.events
        shelf, self.shelf = self.shelf, None  # unmapped once done: the events hold copies
        view = memoryview(shelf) if shelf is not None else None
        for chunk in chunks:
            if isinstance(chunk, tuple):
                at, size = chunk
                self.events += _events(view[at:at + size])
                _forget(shelf, at, size)
            else:
                self.events += _events(chunk)
        return self.events


def _forget(shelf: mmap.mmap, at: int, size: int) -> None:
    """Drop the whole pages of ``shelf[at:at + size]`` from this process (its resident size then
    holds one chunk of the shelf at a time, not all of it)."""
    start = -(-at // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (at + size) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start and hasattr(shelf, "madvise"):
        shelf.madvise(mmap.MADV_DONTNEED, start, end - start)


def nesting_to_wire(nesting: CpuNesting) -> bytes:
    """The nesting's columns as machine arrays, one after the other: parents (int64), then
    exclusive durations and ends (float64), then the rounded exclusive durations (float64) when
    the nesting has them, all of one length."""
    columns = [array("q", nesting.parents), array("d", nesting.exclusive), nesting.end]
    if nesting.rounded is not None:
        columns.append(array("d", nesting.rounded))
    return b"".join([column.tobytes() for column in columns])


def nesting_from_wire(trace: KinetoTrace, data) -> None:
    """Put ``nesting_to_wire``'s columns on ``trace`` as its ``cpu_nesting`` (for its present
    ``cpu_events``: the values bit for bit). Raises ``ValueError`` when they are not of its length."""
    n = trace.cpu_count()
    if len(data) not in (24 * n, 32 * n):
        raise ValueError(f"{len(data)} bytes of nesting for {n} CPU events")
    view = memoryview(data)
    parents, exclusive, ends, rounded = array("q"), array("d"), array("d"), array("d")
    for k, column in enumerate((parents, exclusive, ends, rounded)[:len(data) // (8 * n) if n else 3]):
        column.frombytes(view[8 * n * k:8 * n * (k + 1)])
    # The parents as ``nest_cpu_events`` makes them, one int object per parent, not one per event.
    ints = list(range(n))
    ints.append(-1)  # ints[-1]: the top level's -1
    parents = list(map(ints.__getitem__, parents))
    del ints
    nesting = CpuNesting(parents, exclusive.tolist(), ends, rounded.tolist() if len(data) == 32 * n else None)
    trace.cpu_nesting = (trace.cpu_events_key(), nesting)


_ARGS, _INPUT_DIMS, _RF_ID = (operator.attrgetter(name) for name in ("args", "input_dims", "rf_id"))
_TS, _DUR, _NAME, _TID = (operator.attrgetter(name) for name in ("ts", "dur", "name", "tid"))

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

Then, while the parent decodes that, the child nests the CPU events (``durations.cpu_nesting``,
which linking needs and which needs nothing but this trace) and sends the nesting's three columns
as machine arrays (``nesting_to_wire``); ``finish`` puts them on the trace (C conversions), or
leaves the nesting to be computed where it is needed if they do not come. When there is no child (a small file, no ``fork``)
or it failed for any reason (a bad file, a trace the check refuses), ``finish`` gives None and the
caller reads and checks the file itself, so a bad file fails with the same ``TraceInputError``, in
the same order, as without a child.

Cost, for n events: the child reads as the serial path does, plus one O(n) pass and the encode,
then the nesting sweep; the parent decodes the msgpack and puts the dims back with C loops (about a
quarter of reading the JSON), and takes the nesting's columns with three C conversions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os
from array import array
from collections import deque
from collections.abc import Iterator
from itertools import repeat
from pathlib import Path
from typing import Callable

import msgspec
from msgspec.structs import force_setattr

from .durations import CpuNesting, nest_cpu_events
from .forked import ForkedCall, can_fork, spare_core
from .kineto_reader import NO_ARGS, KinetoEvent, KinetoTrace, read_kineto_trace
from .sanity import check_kineto_trace

# Below this size on disk (about a 30 MB gzip-compressed trace's JSON) the serial read is quick.
FORK_MIN_BYTES = 2 << 20

_NO_DIMS = NO_ARGS.input_dims


class _Head(msgspec.Struct, array_like=True):
    trace: KinetoTrace  # without its events: they follow in chunks
    warnings: list[str]  # of ``sanity.check_kineto_trace``, run by the child too
    sizes: list[int]  # events per list (cpu, runtime, gpu, python)


class _Chunk(msgspec.Struct, array_like=True):
    events: list[KinetoEvent]  # without their ``Input Dims`` (carried below)
    # The positions (in the chunk) of the events with ``Input Dims``, and those dims (raw JSON
    # values) in one JSON array, carried as a msgpack binary.
    dims_at: list[int]
    dims: bytes


_HEAD, _CHUNK = msgspec.msgpack.Decoder(_Head), msgspec.msgpack.Decoder(_Chunk)
CHUNK_EVENTS = 1 << 15  # events per part: the parent decodes one while the child encodes the next
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def start(path: str | os.PathLike) -> ForkedCall | None:
    """A child reading the Kineto trace at ``path``, or None (small or unreadable file, no fork, a
    single core)."""
    try:
        big = Path(path).stat().st_size >= FORK_MIN_BYTES
    except OSError:
        return None
    if not big or not can_fork() or not spare_core():
        return None
    try:
        return ForkedCall(lambda: _read_and_check(path))
    except OSError:
        return None


def _read_and_check(path) -> Iterator[bytes]:
    """The child's work: the checked trace (``to_wire``'s parts), then its CPU events' nesting."""
    trace = read_kineto_trace(path, own_dims=False)
    yield from to_wire(trace, check_kineto_trace(trace))
    yield nesting_to_wire(nest_cpu_events(trace.cpu_events))


def finish(child: ForkedCall | None, received: Callable[[], None] | None = None
           ) -> tuple[KinetoTrace, list[str]] | None:
    """The child's trace, checked, with the warnings of the check and, when it came, its CPU
    events' nesting (``KinetoTrace.cpu_nesting``); or None (no child, or it failed (a bad file, a
    trace the check refuses): the caller reads and checks the file itself). ``received()`` is
    called once, as soon as the child has made all its parts (its core is free: checked before each
    part is taken, while the last ones may still be on their way), else once it has exited; at once
    when there is no child."""
    told = [received] if received is not None else []
    parts = _telling(child, told) if child is not None else iter(())
    checked = None
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, StopIteration):
        checked = from_wire(parts)
    nesting = next(parts, None) if checked is not None else None
    if child is not None:
        child.cancel()
    if told:
        told.pop()()
    if nesting is not None:
        with contextlib.suppress(ValueError):
            nesting_from_wire(checked[0], nesting)
    return checked


def _telling(child: ForkedCall, told: list) -> Iterator:
    """The child's parts; before each, calls (and takes out) the callback in ``told`` once the
    child has made them all."""
    for part in child.parts():
        if told and child.made():
            told.pop()()
        yield part


def _lists(trace) -> tuple:
    return trace.cpu_events, trace.runtime_events, trace.gpu_events, trace.python_events


def to_wire(trace: KinetoTrace, warnings: list[str]) -> Iterator[bytes]:
    """The trace and its check's warnings as msgpack parts: the trace without its events (``_Head``),
    then each event list in chunks of ``CHUNK_EVENTS`` (``_Chunk``). Each ``Input Dims`` leaves its
    event (reset in place to the default, so the event's map omits it) for one JSON array per chunk,
    beside the positions of the events they belong to."""
    lists = _lists(trace)
    bare = dataclasses.replace(trace, cpu_events=[], runtime_events=[], gpu_events=[], python_events=[])
    yield msgspec.msgpack.encode(_Head(bare, warnings, [len(events) for events in lists]))
    encode = msgspec.msgpack.Encoder().encode
    for events in lists:
        for start in range(0, len(events), CHUNK_EVENTS):
            chunk = events[start:start + CHUNK_EVENTS]
            args = list(map(_ARGS, chunk))
            positions = [i for i, d in enumerate(map(_INPUT_DIMS, args)) if d is not _NO_DIMS]
            carried = list(map(args.__getitem__, positions))
            dims = b"[" + b",".join(map(_INPUT_DIMS, carried)) + b"]"
            deque(map(force_setattr, carried, repeat("input_dims"), repeat(_NO_DIMS)), maxlen=0)
            yield encode(_Chunk(chunk, positions, dims))


def from_wire(parts: Iterator) -> tuple[KinetoTrace, list[str]]:
    """The trace and warnings ``to_wire`` encoded, taken from ``parts`` (the parts after them are
    left there), each ``Input Dims`` back in its event: a view into its chunk's JSON array (which
    holds only dims), split in C by one JSON decode and put back by C loops, no Python per event.
    Raises ``StopIteration`` when the parts end early."""
    head = _HEAD.decode(next(parts))
    for events, size in zip(_lists(head.trace), head.sizes):
        while len(events) < size:
            chunk = _CHUNK.decode(next(parts))
            args = map(_ARGS, map(chunk.events.__getitem__, chunk.dims_at))
            deque(map(force_setattr, args, repeat("input_dims"), _RAW_LIST.decode(chunk.dims)), maxlen=0)
            events += chunk.events
        if len(events) != size:
            raise msgspec.ValidationError(f"{len(events)} events for {size}")
    return head.trace, head.warnings


def nesting_to_wire(nesting: CpuNesting) -> bytes:
    """The nesting's three columns as machine arrays, one after the other: parents (int64), then
    exclusive durations and ends (float64), all of one length."""
    return b"".join((array("q", nesting.parents).tobytes(), array("d", nesting.exclusive).tobytes(),
                     nesting.end.tobytes()))


def nesting_from_wire(trace: KinetoTrace, data) -> None:
    """Put ``nesting_to_wire``'s columns on ``trace`` as its ``cpu_nesting`` (for its present
    ``cpu_events``: the values bit for bit). Raises ``ValueError`` when they are not of its length."""
    n = len(trace.cpu_events)
    if len(data) != 24 * n:
        raise ValueError(f"{len(data)} bytes of nesting for {n} CPU events")
    view = memoryview(data)
    parents, exclusive, ends = array("q"), array("d"), array("d")
    for k, column in enumerate((parents, exclusive, ends)):
        column.frombytes(view[8 * n * k:8 * n * (k + 1)])
    # The parents as ``nest_cpu_events`` makes them, one int object per parent, not one per event.
    ints = list(range(n))
    ints.append(-1)  # ints[-1]: the top level's -1
    parents = list(map(ints.__getitem__, parents))
    del ints
    trace.cpu_nesting = (trace.cpu_events, CpuNesting(parents, exclusive.tolist(), ends))


_ARGS = operator.attrgetter("args")
_INPUT_DIMS = operator.attrgetter("input_dims")

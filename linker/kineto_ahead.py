"""Read a large Kineto trace in a forked child while the parent reads the ET (the two files are
independent until matching).

``start(path)`` forks (``forked.ForkedCall``) while the process is still small, so the parent
pays no copy-on-write for what it then builds. The child runs ``read_kineto_trace`` and the input
check ``sanity.check_kineto_trace``, and hands back the checked ``KinetoTrace`` and the check's
warnings encoded with msgpack (``to_wire``): the events as compact maps (default fields
left out), each ``Input Dims`` (raw JSON bytes, which msgpack would otherwise splice in as msgpack)
carried as a msgpack binary inside its ``Raw``. ``finish(child)`` decodes that in C (``from_wire``)
and turns each ``Input Dims`` back into its own JSON bytes: the same trace and warnings the serial
read and check give (tests/test_read_paths.py). When there is no child (a small file, no ``fork``)
or it failed for any reason (a bad file, a trace the check refuses), ``finish`` gives None and the
caller reads and checks the file itself, so a bad file fails with the same ``TraceInputError``, in
the same order, as without a child.

Cost, for n events: the child reads as the serial path does, plus one O(n) pass and the encode;
the parent decodes the msgpack and makes one O(n) pass (about a third of reading the JSON).
"""

from __future__ import annotations

import contextlib
import operator
import os
from collections import deque
from itertools import repeat
from pathlib import Path

import msgspec
from msgspec.structs import force_setattr

from .forked import ForkedCall, can_fork
from .kineto_reader import NO_ARGS, FlowEnd, KinetoEvent, KinetoTrace, read_kineto_trace
from .sanity import check_kineto_trace

# Below this size on disk (about a 30 MB gzip-compressed trace's JSON) the serial read is quick.
FORK_MIN_BYTES = 2 << 20

_NO_DIMS = NO_ARGS.input_dims


class _Wire(msgspec.Struct, array_like=True):
    path: str
    pid: int | None
    rank: int | None
    world_size: int | None
    cpu_events: list[KinetoEvent]
    runtime_events: list[KinetoEvent]
    gpu_events: list[KinetoEvent]
    flows: dict[int | str, list[FlowEnd]]
    python_events: list[KinetoEvent]
    warnings: list[str]  # of ``sanity.check_kineto_trace``, run by the child too


_BINARY = msgspec.msgpack.Decoder(bytes)


def start(path: str | os.PathLike) -> ForkedCall | None:
    """A child reading the Kineto trace at ``path``, or None (small or unreadable file, no fork)."""
    try:
        big = Path(path).stat().st_size >= FORK_MIN_BYTES
    except OSError:
        return None
    if not big or not can_fork():
        return None
    try:
        return ForkedCall(lambda: _read_and_check(path))
    except OSError:
        return None


def _read_and_check(path) -> bytes:
    trace = read_kineto_trace(path, own_dims=False)
    return to_wire(trace, check_kineto_trace(trace))


def finish(child: ForkedCall | None) -> tuple[KinetoTrace, list[str]] | None:
    """The child's trace, checked, with the warnings of the check; or None (no child, or it failed
    (a bad file, a trace the check refuses): the caller reads and checks the file itself)."""
    if child is None:
        return None
    data = child.result()
    if data is None:
        return None
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
        return from_wire(data)
    return None


def _lists(trace) -> tuple:
    return trace.cpu_events, trace.runtime_events, trace.gpu_events, trace.python_events


def to_wire(trace: KinetoTrace, warnings: list[str]) -> bytes:
    """The trace and its check's warnings as msgpack bytes (each ``Input Dims`` replaced in place
    by its wrapped form)."""
    encode = msgspec.msgpack.encode
    for events in _lists(trace):
        for event in events:
            dims = event.args.input_dims
            if dims is not _NO_DIMS:
                force_setattr(event.args, "input_dims", msgspec.Raw(encode(bytes(dims))))
    return msgspec.msgpack.encode(_Wire(
        trace.path, trace.pid, trace.rank, trace.world_size, trace.cpu_events, trace.runtime_events,
        trace.gpu_events, trace.flows, trace.python_events, warnings))


def from_wire(data) -> tuple[KinetoTrace, list[str]]:
    """The trace and warnings ``to_wire`` encoded, each ``Input Dims`` its own JSON bytes again."""
    wire = msgspec.msgpack.decode(data, type=_Wire)
    for events in _lists(wire):
        args = [event.args for event in events]
        wrapped = [a for a in args if a.input_dims is not _NO_DIMS]
        dims = map(msgspec.Raw, map(_BINARY.decode, map(_INPUT_DIMS, wrapped)))
        deque(map(force_setattr, wrapped, repeat("input_dims"), dims), maxlen=0)  # a C loop
    trace = KinetoTrace(path=wire.path, pid=wire.pid, rank=wire.rank, world_size=wire.world_size,
                        cpu_events=wire.cpu_events, runtime_events=wire.runtime_events,
                        gpu_events=wire.gpu_events, flows=wire.flows, python_events=wire.python_events)
    return trace, wire.warnings


_INPUT_DIMS = operator.attrgetter("input_dims")

"""Run one function in a forked child process and take back the bytes it returns, through a pipe.

``ForkedCall(fn)`` forks; the child runs ``fn()`` (which sees the parent's memory as it was at the
fork, copy-on-write: no pickling of inputs) and writes the returned bytes to a pipe, then exits
with ``os._exit`` (no atexit handlers, no buffered output flushed twice). ``result()`` reads them
and reaps the child; it returns None when the child failed for any reason (an exception, a signal,
an incomplete payload): the caller then does the work itself, so that any error surfaces exactly as
it would without a child. An ``fn`` that returns an iterator (a generator) sends each of its byte
strings as it is made (from a writer thread: making the next does not wait for the parent to read
this one), and ``parts()`` gives them to the parent as they come: the parent can work on the first
while the child makes the next. ``cancel()`` kills and reaps
a child still running (Ctrl-C, an error in the parent). No temporary file is used; a reaped child
leaves no zombie.

Ctrl-C and SIGTERM are blocked in the parent around ``fork`` so that a signal arriving then is taken
by the parent after the child is registered (and cancelled), never by the child running the
parent's code. Only meant for a single-threaded parent (``can_fork``). Cost: the fork (page tables
of the parent) plus the payload's copy through the pipe.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator
from queue import Full, Queue
from typing import Callable

try:
    import fcntl
except ImportError:  # no fork there either: ``can_fork`` says so
    fcntl = None

_HEADER = 8  # payload length, little-endian
_READ_SIZE = 1 << 20
_PIPE_BYTES = 1 << 20  # the pipe's size where the system allows it (Linux: at most pipe-max-size)
_BLOCKED = {signal.SIGINT, signal.SIGTERM}
_PARTS_AHEAD = 2  # parts made and waiting for the writer thread (one more is being written)


def can_fork() -> bool:
    """True where ``os.fork`` exists and this process runs a single thread (forking a process
    with other threads can deadlock the child on a lock one of them held)."""
    return hasattr(os, "fork") and hasattr(signal, "pthread_sigmask") and threading.active_count() == 1



class ForkedCall:
    """``fn()`` (returning bytes, or an iterator of bytes) running in a forked child; see the
    module docstring."""

    def __init__(self, fn: Callable[[], bytes | Iterator[bytes]]):
        """Fork and start ``fn`` in the child. Raises ``OSError`` when no process can be made."""
        self._pid = 0
        self._fd = -1
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # a pipe-full per copy, not 64 KB
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
        try:
            pid = os.fork()
        except BaseException:
            os.close(read_end)
            os.close(write_end)
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            raise
        if pid == 0:
            _run_child(fn, read_end, write_end, previous)  # never returns
        os.close(write_end)
        self._pid, self._fd = pid, read_end
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a Ctrl-C that came meanwhile raises here
        except BaseException:
            self.cancel()
            raise

    def result(self) -> memoryview | None:
        """The child's bytes, once it has exited; None if it failed. Blocks until then. The payload
        is read straight into one buffer of the size its header announces (no second copy)."""
        if not self._pid:
            return None
        header = self._read_into(bytearray(_HEADER))
        payload = None if header is None else self._read_into(bytearray(int.from_bytes(header, "little")))
        complete = payload is not None and not os.read(self._fd, 1)  # then nothing follows
        status = self._reap()
        if status != 0 or not complete:
            return None
        return memoryview(payload)

    def parts(self) -> Iterator[memoryview]:
        """Each byte string the child sends (``fn`` returned an iterator), as it comes; they stop
        at the end, or at the first that does not come whole (the child failed: those before it
        came whole, so they stand). The child is reaped once they have stopped; a caller that stops
        taking them early calls ``cancel()``."""
        while self._pid:
            header = self._read_into(bytearray(_HEADER))
            payload = None if header is None else self._read_into(bytearray(int.from_bytes(header, "little")))
            if payload is None:
                break
            yield memoryview(payload)
        self._reap()

    def _read_into(self, buffer: bytearray) -> bytearray | None:
        """``buffer`` filled from the pipe, or None when the child closed it before."""
        view = memoryview(buffer)
        filled = 0
        while filled < len(buffer):
            n = os.readv(self._fd, [view[filled:filled + _READ_SIZE]])
            if not n:
                return None
            filled += n
        view.release()
        return buffer

    def cancel(self) -> None:
        """Kill the child if it still runs and reap it; idempotent."""
        if self._pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self._reap()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit ``os`` may be gone already
            self.cancel()  # a child nobody holds any more (a caller that forgot ``cancel``) is not left behind

    def _reap(self) -> int:
        pid, self._pid = self._pid, 0
        if self._fd != -1:
            os.close(self._fd)
            self._fd = -1
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries already
                continue
            except ChildProcessError:
                return -1
        return os.waitstatus_to_exitcode(status)


def _run_child(fn: Callable[[], bytes | Iterator[bytes]], read_end: int, write_end: int, mask) -> None:
    status = 1
    try:
        os.close(read_end)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        gc.disable()  # a collection would touch (hence copy) every object shared with the parent
        returned = fn()
        if isinstance(returned, Iterator):
            _send_parts(write_end, returned)
        else:
            _send(write_end, returned)
        status = 0
    except BaseException:  # the parent sees the failure and does the work itself
        pass
    finally:
        os._exit(status)


def _send(fd: int, payload) -> None:
    _write_all(fd, len(payload).to_bytes(_HEADER, "little"))
    _write_all(fd, payload)


def _send_parts(fd: int, parts: Iterator) -> None:
    """Send each part from a writer thread, so that the child makes the next part while the parent
    has yet to read this one (a full pipe makes a write wait for the reader). At most
    ``_PARTS_AHEAD`` parts wait for the writer: a child whose parent stops reading stops making
    parts soon after (the parts it would make next may never be asked for). The parts made before
    a failure of ``parts`` are sent whole, then the failure is raised; a failed write (the parent
    has gone) stops the parts."""
    queue: Queue = Queue(maxsize=_PARTS_AHEAD)
    failed: list[OSError] = []

    def put(item) -> None:
        while not failed and writer.is_alive():
            try:
                queue.put(item, timeout=0.1)
                return
            except Full:
                continue

    def write() -> None:
        while (payload := queue.get()) is not None:
            try:
                _send(fd, payload)
            except OSError as err:
                failed.append(err)
                return

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        for payload in parts:
            if failed:
                break
            put(payload)
    finally:
        put(None)
        writer.join()
    if failed:
        raise failed[0]


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]

"""The output sink: files that appear only complete, written from a thread, with room made early.

``atomic_output(path)`` gives a binary stream that becomes ``path`` only if its block finishes
without an exception: the data goes to a hidden temporary file beside the target, renamed at the
end and removed on any exception, Ctrl-C and SIGTERM (``files.terminate_as_interrupt``); a full
disk is a one-line ``TraceInputError``. ``.gz`` paths are gzip-compressed. ``BackgroundWriter``
writes a writer's chunks from a thread.

Writing a 400 MB ET+ into the page cache is not free: on this project's 2-core VM, 410 MB took the
writer thread 0.3-1.0 s, more than encoding it (0.3 s), so it bounded the JSON write. Two remedies,
both leaving the file's bytes as they would be (``atomic_output`` cuts the file where the
writing ended):

- ``reserve_space``: the file system allocates the blocks in one call (Linux ``fallocate(2)``)
  instead of page by page as the writes come (ext4's delayed allocation). Writers call it once their
  first piece tells the size. Best effort; never glibc's emulation, which writes zeros.
- ``prefilled(path, size)``: while the block runs (the link, when a core is idle), a thread writes
  ``size`` zero bytes into the hidden temporary file the output will be written to, so the output's
  page-cache pages exist when the real bytes come and writing them is a copy. The block gets a
  ``Prefill``, the owner of that file: given to ``atomic_output(path, prefill=...)``, it hands the
  file over; what it still holds at the end of the block (an error, Ctrl-C, an output not written)
  is removed. ``prefill_later(path)``: the same, started when the block says so
  (``Prefill.start``: ``pipeline`` starts it once the ET is read, so that it is done before the
  write comes). Whether and how much to prefill is the schedule's decision
  (``Schedule.prefill_size``: only with a spare core).

Cost: O(1) calls for a reservation; a prefill writes ``size`` bytes from its own thread (the GIL is
released while it writes).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gzip
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Callable, Iterator

from linker.model.errors import TraceInputError
from linker.read.files import check_output_paths

_PREFILL_PIECE = 8 << 20  # zero bytes per write of the filling thread


def hidden_temporary(out: Path) -> tuple[int, str]:
    """A new hidden temporary file beside ``out`` (``.NAME.XXXX.tmp``): (descriptor, path)."""
    directory = out.parent if str(out.parent) else Path(".")
    return tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=directory)


def reserve_space(stream: IO[bytes], size: int) -> None:
    """Have the file system allocate the first ``size`` bytes of the plain output file behind
    ``stream`` (one of ``atomic_output``'s) now, in one call. Nothing for gzip streams or when the
    call is refused (no support, no space: the real write then reports it). O(1)."""
    if size > 0 and not isinstance(stream, gzip.GzipFile):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            _allocate(stream.fileno(), size)


def _allocate(fd: int, size: int) -> None:
    allocate = _fallocate()
    if allocate is not None:
        allocate(fd, 0, 0, size)  # refused: -1 and errno, ignored (best effort)


@functools.lru_cache(maxsize=None)
def _fallocate():
    """libc's ``fallocate`` (64-bit offsets) as a Python callable, or None off Linux / without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        function = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int
    return function


class _Filler:
    """A thread writing ``size`` zero bytes into ``fd`` from offset 0 (positional writes: the
    descriptor's own offset stays 0), stopping early when asked or on any write error. ``grow``
    raises the size: the thread goes on, or a new one goes on where it ended."""

    def __init__(self, fd: int, tmp: str, size: int):
        self.fd, self.tmp, self.size = fd, tmp, 0
        self._offset = 0
        self._running = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.grow(size)

    def _run(self) -> None:
        zeros = memoryview(bytes(_PREFILL_PIECE))
        try:
            _allocate(self.fd, self.size)  # refused: nothing (best effort)
            while True:
                with self._lock:
                    if self._offset >= self.size or self._stop.is_set():
                        return
                    size = self.size
                self._offset += os.pwrite(self.fd, zeros[:min(_PREFILL_PIECE, size - self._offset)], self._offset)
        except OSError:
            return
        finally:
            with self._lock:
                self._running = False

    def grow(self, size: int) -> None:
        with self._lock:
            if size <= self.size or self._stop.is_set():
                return
            self.size = size
            if self._running:
                return
            self._running = True
        self._thread = threading.Thread(target=self._run, name="prefill-output", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class Prefill:
    """The prefilled temporary file of one output (``prefill_later``), until the writer takes it.

    ``start(size)`` makes the file and starts filling it (nothing when ``size`` <= 0 or the file
    cannot be made: the writer then makes its own); called again with a larger size, it fills
    more. ``take(out)`` hands the file to the writer of ``out`` (``atomic_output``), filling
    stopped, or gives None (none was made, or it was made for another path). ``discard()``
    removes a file never taken: ``prefill_later`` calls it at the end of its block."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(os.path.abspath(path))
        self._filler: _Filler | None = None
        self._done = False  # taken or discarded: no file is made any more

    def start(self, size: int) -> None:
        if self._filler is not None:
            self._filler.grow(size)
            return
        if size <= 0 or self._done or not hasattr(os, "pwrite"):
            return
        try:
            fd, tmp = hidden_temporary(self.path)
        except OSError:
            return
        self._filler = _Filler(fd, tmp, size)

    def take(self, out: Path) -> tuple[int, str] | None:
        """The (descriptor, path) of the file, its filling stopped (the caller now owns both), or
        None."""
        filler = self._filler
        if filler is None or Path(os.path.abspath(out)) != self.path:
            return None
        self._filler, self._done = None, True
        filler.stop()
        return filler.fd, filler.tmp

    def discard(self) -> None:
        """Stop the filling and remove the file if the writer never took it; idempotent."""
        filler, self._filler, self._done = self._filler, None, True
        if filler is not None:
            filler.stop()
            os.close(filler.fd)
            with contextlib.suppress(OSError):
                os.unlink(filler.tmp)


@contextlib.contextmanager
def prefilled(path: str | os.PathLike, size: int) -> Iterator[Prefill]:
    """Prefill the temporary file of output ``path`` with ``size`` bytes while the block runs; the
    ``Prefill`` goes to ``atomic_output`` (nothing is made when ``size`` <= 0 or the file cannot
    be: ``atomic_output`` then makes its own)."""
    with prefill_later(path) as prefill:
        prefill.start(size)
        yield prefill


@contextlib.contextmanager
def prefill_later(path: str | os.PathLike) -> Iterator[Prefill]:
    """``prefilled``, started when the block calls ``start`` with a size (from the moment a core
    is free, say); calling it again with a larger size prefills more. The file lives as long as
    the block, unless the writer took it."""
    prefill = Prefill(path)
    try:
        yield prefill
    finally:
        prefill.discard()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask



def _write_problem(err: OSError) -> str:
    if err.errno == errno.ENOSPC:
        return "cannot write: no space left on device (nothing was left behind)"
    if err.errno == errno.EDQUOT:
        return "cannot write: disk quota exceeded (nothing was left behind)"
    return f"cannot write: {err.strerror or err}"


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, protected: tuple = (), prefill: Prefill | None = None
                  ) -> Iterator[IO[bytes]]:
    """Open a binary stream that becomes ``path`` only if the block finishes without an exception.

    Data goes to a temporary file in the same directory (the one ``prefill`` has been filling for
    ``path``, if any), renamed over ``path`` at the end, so a reader never sees a half-written
    output; the file ends where the writing did (room reserved or prefilled beyond it is given
    back). ``.gz`` paths are gzip-compressed. Writing to any of the ``protected`` paths (the
    inputs) is refused with ``TraceInputError``.
    """
    out = Path(path)
    check_output_paths([out], protected)
    try:
        fd, tmp = (prefill.take(out) if prefill is not None else None) or hidden_temporary(out)
    except OSError as err:
        raise TraceInputError(out, _write_problem(err)) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
        with os.fdopen(fd, "wb") as raw:
            if out.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
                    yield gz
            else:
                yield raw
                raw.truncate()
        os.replace(tmp, out)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise TraceInputError(out, _write_problem(err)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class BackgroundWriter:
    """Writes byte chunks to ``stream`` from a thread, so writing (and gzip compression, which
    releases the GIL) overlaps the caller's encoding of the next chunks.

    ``write`` queues a chunk (at most ``depth`` wait; then it blocks); ``close`` waits for every
    chunk to be written and raises the first write error, if any (``write`` raises it too, early).
    A caller that encodes into buffers (``msgspec``'s ``encode_into``) takes one with ``buffer()``
    and queues a slice of it with ``write_buffer``; the thread hands it back for reuse once written,
    so each chunk is encoded into memory already touched, without a new ``bytes`` grown to its size
    (on the large CPU pair's JSON, 0.31-0.39 -> 0.20 s of encoding). Cost: one thread, at most
    ``depth`` chunks waiting; with buffers, up to ``depth + 1`` of them kept, each as large as the
    largest chunk it held, until the writer is dropped."""

    def __init__(self, stream: IO[bytes], depth: int = 8):
        import queue
        import threading

        self._stream = stream
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._free: queue.Queue = queue.Queue()  # buffers written, to be filled again
        self._buffers = depth + 1  # made at most: one being filled while ``depth`` wait
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="write-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            chunk = self._queue.get()
            if chunk is None:
                return
            buffer = None
            if isinstance(chunk, tuple):  # (buffer, start, end) of ``write_buffer``
                buffer, start, end = chunk
                chunk = memoryview(buffer)[start:end]
            if self._error is None:
                try:
                    self._stream.write(chunk)
                except BaseException as err:  # raised in the caller's thread
                    self._error = err
            if buffer is not None:
                chunk.release()  # the buffer may be resized again
                self._free.put(buffer)

    def write(self, chunk: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(chunk)

    def buffer(self) -> bytearray:
        """A buffer to fill and queue with ``write_buffer``: a new one while fewer than ``depth + 1``
        were made, else the next one written (waiting for it)."""
        if self._free.empty() and self._buffers > 0:
            self._buffers -= 1
            return bytearray()
        return self._free.get()

    def write_buffer(self, buffer: bytearray, start: int, end: int) -> None:
        """Queue ``buffer[start:end]`` (a buffer of ``buffer()``, not to be touched until it comes
        back from ``buffer()``)."""
        if self._error is not None:
            raise self._error
        self._queue.put((buffer, start, end))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

"""The output sink: files that appear only complete, written from a thread, with room made early.

``atomic_output(path)`` gives a binary stream that becomes ``path`` only if its block finishes
without an exception: the data goes to a hidden temporary file beside the target, renamed at the
end and removed on any exception, Ctrl-C and SIGTERM (``files.terminate_as_interrupt``); a full
disk is a one-line ``TraceInputError``. ``.gz`` paths are gzip-compressed, by ISA-L's deflate at
its default level (2) when ``isal`` is installed (it is a dependency): about ten times zlib's level 6
(1.4 GB/s against 140 MB/s on ET+ JSON), for files about a third larger (ET+ JSON 10.5 against
7.3 MB per 120 MB, ``.et`` 13.0 against 10.0); without it, zlib's level 6. Either is read by any
gzip reader. ``BackgroundWriter`` writes a writer's chunks from a thread (both deflates let it run
beside the encoder: they release the GIL).

``reserve_space``: the file system allocates an output's blocks in one call (Linux
``fallocate(2)``) instead of page by page as the writes come (ext4's delayed allocation); writers
call it once their first piece tells the size. Best effort, never glibc's emulation (which writes
zeros); ``atomic_output`` cuts the file where the writing ended, so the bytes are the same.

``OutputRoom``: the page-cache pages of a large output made before its bytes come. A thread writes
zeros into the hidden temporary file the output will be written to (while the ET+ is linked and
planned, on a core nothing else uses then: ``Schedule.output_room`` decides); ``atomic_output``
takes that file, stopping the thread where it got to, so the real write copies into pages that
exist. On this project's 2-core VM a new page-cache page costs several times a reused one (410 MB
written into a new file: 0.5-1.0 s; into an existing one: 0.04 s), and the JSON writer waited for
its writer thread 0.3 s of its 0.6 s. The bytes written are the same (the file is cut where the
writing ended).

Cost: O(1) calls for a reservation; a room writes its size in zeros from its own thread (the GIL is
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
from pathlib import Path
from typing import IO, Iterator

from linker.model.errors import TraceInputError
from linker.read.files import check_output_paths

try:  # ISA-L's deflate: the module docstring says what it buys and costs
    from isal.igzip import GzipFile as _GzipWriter

    GZIP_LEVEL = 2
except ImportError:  # pragma: no cover - isal is a dependency
    _GzipWriter, GZIP_LEVEL = gzip.GzipFile, 6


ROOM_PIECE = 8 << 20  # zero bytes per write of an ``OutputRoom``'s thread


class OutputRoom:
    """A hidden temporary file beside ``out`` that a thread fills with ``size`` zero bytes, for
    ``atomic_output`` to write ``out`` into (module docstring). ``take`` stops the thread and
    hands the file over; ``discard`` (when the output is not written) removes it. The thread stops
    silently at any write error (a full disk: the real write then says so). O(1) calls; the
    thread writes ``size`` bytes."""

    def __init__(self, out: str | os.PathLike, size: int):
        import threading

        self.out = Path(out)
        self.size = size
        self._stop = threading.Event()
        self.fd, self.tmp = hidden_temporary(self.out)  # OSError: no room made (the caller goes without)
        self._thread = threading.Thread(target=self._fill, name="et-link output room", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        zeros = memoryview(bytes(ROOM_PIECE))
        offset = 0
        try:
            while offset < self.size and not self._stop.is_set():
                offset += os.pwrite(self.fd, zeros[:min(ROOM_PIECE, self.size - offset)], offset)
        except OSError:
            pass

    def take(self) -> tuple[int, str] | None:
        """The (descriptor, path) of the file, its thread stopped; None once taken or discarded."""
        self._stop.set()
        self._thread.join()
        if self.fd < 0:
            return None
        taken, self.fd = (self.fd, self.tmp), -1
        return taken

    def discard(self) -> None:
        """Stop the thread and remove the file, unless ``atomic_output`` took it."""
        taken = self.take()
        if taken is not None:
            with contextlib.suppress(OSError):
                os.close(taken[0])
            with contextlib.suppress(OSError):
                os.unlink(taken[1])


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
def atomic_output(path: str | os.PathLike, protected: tuple = (),
                  room: OutputRoom | None = None) -> Iterator[IO[bytes]]:
    """Open a binary stream that becomes ``path`` only if the block finishes without an exception.

    Data goes to a temporary file in the same directory, renamed over ``path`` at the end, so a
    reader never sees a half-written output; the file ends where the writing did (room reserved
    beyond it is given back). ``.gz`` paths are gzip-compressed. Writing to any of the ``protected`` paths (the
    inputs) is refused with ``TraceInputError``. ``room``: an ``OutputRoom`` made for ``path``,
    whose file is written into (plain outputs; else it is discarded).
    """
    out = Path(path)
    check_output_paths([out], protected)
    taken = None
    if room is not None and room.out == out and not out.name.endswith(".gz"):
        taken = room.take()
    elif room is not None:  # made for another file: not written into
        room.discard()
    try:
        fd, tmp = taken if taken is not None else hidden_temporary(out)
    except OSError as err:
        raise TraceInputError(out, _write_problem(err)) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
        with os.fdopen(fd, "wb") as raw:
            if out.name.endswith(".gz"):
                with _GzipWriter(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
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

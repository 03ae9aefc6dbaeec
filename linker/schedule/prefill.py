"""Making room for a large output before its bytes are written.

Writing a 400 MB ET+ into the page cache is not free: on this project's 2-core VM, 410 MB took the
writer thread 0.3-1.0 s, more than encoding it (0.3 s), so it bounded the JSON write. Two remedies,
both leaving the file's bytes as they would be (``fileio.atomic_output`` cuts the file where the
writing ended):

- ``reserve_space``: the file system allocates the blocks in one call (Linux ``fallocate(2)``)
  instead of page by page as the writes come (ext4's delayed allocation). Writers call it once their
  first piece tells the size. Best effort; never glibc's emulation, which writes zeros.
- ``prefilled(path, size)``: while the block runs (the link, when a core is idle), a thread writes
  ``size`` zero bytes into the hidden temporary file the output will be written to, so the output's
  page-cache pages exist when the real bytes come and writing them is a copy. ``atomic_output`` takes
  that file (``take_prefilled``); if it never does (an error, Ctrl-C), the file is removed at the end
  of the block. ``prefill_later(path)``: the same, started when the block says so (``pipeline``
  starts it once the ET is read, so that it is done before the write comes: a write that
  overtook it took 0.4-0.8 s instead of 0.2, and a prefill can take 0.4 s or 0.9). Only worth it
  with a spare core: ``pipeline`` uses it for one pair's large plain JSON output, never in batch
  workers.

Cost: O(1) calls for a reservation; a prefill writes ``size`` bytes from its own thread (the GIL is
released while it writes).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Callable, Iterator

_PREFILL_PIECE = 8 << 20  # zero bytes per write of the filling thread
_prefilled: dict[str, _Filler] = {}  # absolute output path -> its filling thread


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


@contextlib.contextmanager
def prefilled(path: str | os.PathLike, size: int) -> Iterator[None]:
    """Prefill the temporary file of output ``path`` with ``size`` bytes while the block runs
    (nothing when ``size`` <= 0 or the file cannot be made: ``atomic_output`` then makes its own)."""
    with prefill_later(path) as start:
        start(size)
        yield


@contextlib.contextmanager
def prefill_later(path: str | os.PathLike) -> Iterator[Callable[[int], None]]:
    """``prefilled``, started when the block calls the function it is given with a size (from
    the moment a core is free, say); calling it again with a larger size prefills more."""
    key = os.path.abspath(path)
    fillers: list[_Filler] = []

    def start(size: int) -> None:
        if fillers:
            fillers[0].grow(size)
            return
        if size <= 0 or key in _prefilled or not hasattr(os, "pwrite"):
            return
        try:
            fd, tmp = hidden_temporary(Path(path))
        except OSError:
            return
        _prefilled[key] = filler = _Filler(fd, tmp, size)
        fillers.append(filler)

    try:
        yield start
    finally:
        for filler in fillers:
            if _prefilled.get(key) is filler:  # never taken: the output was not written
                del _prefilled[key]
                filler.stop()
                os.close(filler.fd)
                with contextlib.suppress(OSError):
                    os.unlink(filler.tmp)


def take_prefilled(out: Path) -> tuple[int, str] | None:
    """The (descriptor, path) of ``out``'s prefilled temporary file, its filling stopped (the caller
    now owns both), or None."""
    filler = _prefilled.pop(os.path.abspath(out), None)
    if filler is None:
        return None
    filler.stop()
    return filler.fd, filler.tmp

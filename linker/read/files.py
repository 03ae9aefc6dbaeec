"""Reading trace files (plain or gzip) and checking output paths before any work.

Every failure a user can fix becomes a one-line ``TraceInputError`` naming the file: missing or
unreadable input, JSON that cannot be decoded (invalid UTF-8, nesting too deep), an output path that
is an input, a directory, or in a missing or read-only directory. Outputs themselves are written by
``write.sink`` (atomically); SIGTERM is raised as ``Terminated`` so that its cleanup runs (see
``terminate_as_interrupt``). Cost: O(1) per path check; reading is one pass.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import signal
import stat
import zlib
from pathlib import Path
from typing import IO, Any, Callable

from linker.model.errors import TraceInputError
from linker.model.machine import available_memory_bytes

try:  # ISA-L's inflate: the same bytes as zlib's, in about half the time (docs/performance.md)
    from isal import isal_zlib as inflating
except ImportError:  # a platform without its wheel: the standard library's
    inflating = zlib

GZIP_MAGIC = b"\x1f\x8b"

MAX_INFLATED_ENV = "ET_LINK_MAX_INFLATED"  # bytes; set by --max-inflated, inherited by the batch's workers
INFLATED_SHARE_OF_AVAILABLE = 0.5  # the text may take this share of the free memory: its decode needs more


def inflate_limit() -> int | None:
    """The most bytes a gzip input may inflate to: ``ET_LINK_MAX_INFLATED`` (``--max-inflated``)
    when set, else ``INFLATED_SHARE_OF_AVAILABLE`` of the memory available now (the decoded trace
    takes at least as much again as its text); None where neither is known. One read of
    /proc/meminfo."""
    given = os.environ.get(MAX_INFLATED_ENV)
    if given:
        return int(given)
    available = available_memory_bytes()
    return int(available * INFLATED_SHARE_OF_AVAILABLE) if available else None


def _too_large(path: Path, limit: int) -> TraceInputError:
    return TraceInputError(path, f"gzip input inflates past {limit / 2**20:,.0f} MiB, more than this machine can "
                                 f"hold for it (--max-inflated SIZE sets the limit)")


def open_input(path: str | os.PathLike) -> IO[bytes]:
    """Open an input file for binary reading; ``TraceInputError`` (one line) when it cannot be."""
    p = Path(path)
    with contextlib.suppress(OSError):
        if stat.S_ISCHR(p.stat().st_mode) or stat.S_ISBLK(p.stat().st_mode):  # /dev/zero never ends
            raise TraceInputError(p, "is a device, not a trace file")
    try:
        return open(p, "rb")
    except FileNotFoundError:
        raise TraceInputError(p, "no such file") from None
    except IsADirectoryError:
        raise TraceInputError(p, "is a directory, not a trace file") from None
    except OSError as err:
        raise TraceInputError(p, f"cannot read: {err.strerror or err}") from None


def looks_like_json(head: bytes) -> bool:
    """Whether a file whose (inflated) text begins with ``head`` is JSON: '{' after any whitespace
    (an ET, ET+ or Kineto document; a Chakra ``.et`` begins with a varint length). How a reader
    given either kind tells them apart: by content, never by the file's name."""
    return head.lstrip()[:1] == b"{"


def read_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of a file, inflated first when it is gzip (told by its magic, not
    its suffix); fewer when the file is shorter. ``TraceInputError`` (one line) when it cannot be
    opened or read, or its gzip data ends before it does. Cost: O(size) and the compressed bytes
    that hold them."""
    with open_input(path) as raw:
        try:
            head = raw.read(size)
            if head[:2] != GZIP_MAGIC:
                return head
            raw.seek(0)
            inflater, head = zlib.decompressobj(zlib.MAX_WBITS | 16), b""
            while len(head) < size and not inflater.eof:
                compressed = raw.read(1 << 16)
                if not compressed:
                    raise TraceInputError(path, "cannot read: its gzip data ends early (a cut-off file?)")
                head += inflater.decompress(compressed, size - len(head))
            return head
        except (OSError, zlib.error) as err:
            raise TraceInputError(path, f"cannot read: {err}") from None


def read_trace_bytes(path: str | os.PathLike, inflate_into: Callable[[int], Any] | None = None
                     ) -> bytes | bytearray | memoryview:
    """Return the decompressed bytes of a trace file; gzip is detected by its magic bytes.

    Gzip is inflated into one buffer of the text's size (``_gunzip``), so peak memory stays near the
    size of the result (``gzip.decompress`` holds about twice that). That buffer is
    ``inflate_into(size)`` when given and not None (a writable buffer of exactly ``size`` bytes:
    ``schedule.fields_child``'s shared text); the result is then a memoryview of it, unless the text did not
    fit (several gzip members: the trailer gives the last one's size), when it goes on in a private
    buffer. Raises ``TraceInputError`` for a missing, unreadable, empty or truncated file. Cost: one
    read, one pass of inflation.
    """
    p = Path(path)
    with open_input(p) as stream:
        data = _mapped(stream)
        if data is None:
            try:
                data = stream.read()
            except OSError as err:
                raise TraceInputError(p, f"cannot read: {err.strerror or err}") from None
    if data[:2] == GZIP_MAGIC:
        data = _gunzip(p, data, inflate_into)
    if not len(data) or (len(data) < (1 << 20) and not bytes(data).strip()):
        raise TraceInputError(p, "file is empty")
    return data


MAP_AT_LEAST = 1 << 20  # smaller files are read: a mapping saves nothing there


def _mapped(stream: IO[bytes]) -> mmap.mmap | None:
    """The file behind ``stream`` mapped read-only and private, its pages mapped at once
    (``MAP_POPULATE`` where there is one), or None when it is small or cannot be mapped (a pipe, a
    device, a file system without mappings): the caller reads it. A file the page cache holds (a
    trace just written) is then neither copied nor given new memory: for a 365 MB ET, 0.02 s
    against 0.19-0.22 s for ``read()`` (docs/performance.md). The mapping lives as long as the
    bytes decoded from it that refer to it (``msgspec.Raw``); as for any mapped file, an input cut
    short by another program while et-link runs ends the run (``SIGBUS``), where a copy would not
    have noticed. O(1) calls."""
    try:
        size = os.fstat(stream.fileno()).st_size
        if size < MAP_AT_LEAST:
            return None
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
        return mmap.mmap(stream.fileno(), size, flags=flags, prot=mmap.PROT_READ)
    except (OSError, ValueError, TypeError, AttributeError):  # no fileno or no mapping here (Windows: no flags)
        return None


def _gunzip(path: Path, compressed: bytes, inflate_into=None) -> bytes | bytearray | memoryview:
    """Inflate every gzip member (with ``inflating``: ISA-L's inflate when installed, else zlib's).

    The trailer gives the last member's size (ISIZE, mod 2**32); when that size is possible for the
    file (a truncated file ends in arbitrary bytes: ``plausible_gzip_size``) and ``inflate_into``
    gives a buffer of it, the text is inflated into that buffer (``_gunzip_into``). zlib inflates
    the same way into a bytearray of that size (its one call would hold the text twice while
    joining). ISA-L inflates each member in one call, which sizes its result as it goes (one
    buffer of the text's size, never a second: measured); several members are joined."""
    isize = int.from_bytes(compressed[-4:], "little") if len(compressed) >= 18 else 0
    size = isize if plausible_gzip_size(len(compressed), isize) else 0
    limit = inflate_limit()
    if limit is not None and size > limit:  # the trailer says so: refused before inflating anything
        raise _too_large(path, limit)
    out = inflate_into(size) if inflate_into is not None and size else None
    if out is None and inflating is zlib:
        out = bytearray(size)
    if out is not None:
        return _gunzip_into(path, compressed, out, limit)
    members = []
    rest = compressed
    total = 0
    while len(rest):  # one iteration per gzip member
        inflater = inflating.decompressobj(wbits=31)
        room = limit - total + 1 if limit is not None else 0  # max_length 0: no bound
        try:
            members.append(inflater.decompress(rest, room))
        except inflating.error as err:
            raise TraceInputError(path, f"gzip data is corrupt ({err})") from None
        total += len(members[-1])
        if limit is not None and total > limit:
            raise _too_large(path, limit)
        if not inflater.eof:
            raise TraceInputError(path, "gzip data is truncated")
        rest = inflater.unused_data
        if not rest.strip(b"\x00"):
            break
    return members[0] if len(members) == 1 else b"".join(members)


def _gunzip_into(path: Path, compressed: bytes, out, limit: int | None = None) -> bytearray | memoryview:
    """``_gunzip`` into ``out`` (a bytearray, which grows if short, or a fixed buffer): output comes
    in bounded pieces (``max_length``), each copied once into place: no regrowth copies, no second
    full-size buffer. For a fixed buffer a view of its filled part is returned; if it turns out short
    (several members), the text is copied into a private buffer, which grows. Past ``limit`` bytes
    (``inflate_limit``) it stops with a one-line error, holding at most one piece more."""
    filled = 0
    rest = memoryview(compressed)
    while len(rest):  # one iteration per gzip member
        inflater = inflating.decompressobj(wbits=31)
        feed = b""
        try:
            while not inflater.eof:
                if not len(feed) and len(rest):  # input in slices: a tail left over is a small copy
                    feed, rest = rest[:_FEED], rest[_FEED:]
                piece = inflater.decompress(feed, _CHUNK)
                feed = inflater.unconsumed_tail
                if not piece and not len(feed) and not len(rest):
                    break
                end = filled + len(piece)
                if limit is not None and end > limit:
                    raise _too_large(path, limit)
                if end > len(out):
                    if not isinstance(out, bytearray):  # the fixed buffer is short
                        out = bytearray(memoryview(out)[:filled])
                    out.extend(bytes(max(end - len(out), len(out) // 2)))
                out[filled:end] = piece
                filled = end
        except inflating.error as err:
            raise TraceInputError(path, f"gzip data is corrupt ({err})") from None
        if not inflater.eof:
            raise TraceInputError(path, "gzip data is truncated")
        following = inflater.unused_data + bytes(feed) + bytes(rest)
        if not following.strip(b"\x00"):
            break
        rest = memoryview(following)
    if not isinstance(out, bytearray):
        return memoryview(out)[:filled]
    del out[filled:]
    return out


_CHUNK = 1 << 20  # inflated bytes per piece (small: reused by malloc, cache-warm)
_FEED = 1 << 16  # compressed bytes per slice of input: the tail left over is copied per piece, so it stays small
MAX_GZIP_RATIO = 1032.0  # deflate cannot do better: a larger ISIZE means a truncated/corrupt file


def plausible_gzip_size(compressed_bytes: int, isize: int) -> bool:
    """Whether a gzip trailer's ISIZE can be the inflated size of a file of ``compressed_bytes``."""
    return compressed_bytes <= isize <= compressed_bytes * MAX_GZIP_RATIO


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when two paths name the same existing file (or the same path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same cleanup (temporary files removed) runs."""


def terminate_as_interrupt() -> None:
    """Make SIGTERM raise ``Terminated`` in the main thread (a KeyboardInterrupt subclass)."""

    def handler(signum, frame):
        raise Terminated()

    with contextlib.suppress(ValueError):  # not the main thread: leave the default
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def decoding(path: str | os.PathLike, what: str = "trace"):
    """Turn decoder failures that carry no file name into ``TraceInputError`` for ``path``.

    Covers JSON nested too deeply for the decoder (``RecursionError``), text that is not UTF-8, and
    integers too large for the decoder. ``TraceInputError`` passes through unchanged.
    """
    try:
        yield
    except TraceInputError:
        raise
    except RecursionError:
        raise TraceInputError(path, f"not a usable {what}: JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise TraceInputError(path, f"not a usable {what}: it contains bytes that are not UTF-8 text") from None
    except OverflowError as err:
        raise TraceInputError(path, f"not a usable {what}: a number is out of range ({err})") from None


def _writable_directory(path: Path) -> str | None:
    """Why an output cannot be created in ``path``'s directory (None when it can)."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.exists():
        return f"output directory {directory} does not exist"
    if not directory.is_dir():
        return f"{directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"output directory {directory} is not writable"
    return None


def check_output_paths(outputs: list, inputs: tuple = ()) -> None:
    """Refuse, before any work, outputs that could not be written or would destroy something.

    Each output (None entries are skipped) must not be an input, not be another output, not be a
    directory, and must lie in an existing writable directory. Raises ``TraceInputError`` naming the
    offending output. O(outputs * inputs).
    """
    seen: list[Path] = []
    for raw in outputs:
        if raw is None:
            continue
        out = Path(raw)
        for p in inputs:
            if same_file(out, p):
                raise TraceInputError(out, "output path is one of the input files; refusing to overwrite it")
        for other in seen:
            if same_file(out, other):
                raise TraceInputError(out, "the same path is given for two outputs (ET+ and --report?)")
        if out.is_dir():
            raise TraceInputError(out, "output path is a directory; give a file name")
        if out.exists() and not out.is_file():  # /dev/null, a FIFO, ...: renaming over it would replace it
            raise TraceInputError(out, "output path exists and is not a regular file")
        problem = _writable_directory(out)
        if problem:
            raise TraceInputError(out, problem)
        seen.append(out)


@contextlib.contextmanager
def collector_paused(leave_off: bool = False):
    """Pause Python's cyclic garbage collector for the block (restored after, even on error, unless
    ``leave_off``: a process that ends with the block exits without collecting).

    Reading or linking a large trace allocates millions of small objects that are never garbage (nodes,
    events, columns); each full collection walks all of them, which more than doubled the time
    of a large link. Reference counting still frees everything as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled and not leave_off:
            gc.enable()

"""Encode the ET's share of the ``.et`` node messages in a forked child while the parent links.

Most of a Chakra ``.et`` written from a PyTorch ET comes from the ET alone: each op's ``inputs``,
``outputs`` and own attributes (``chakra_encode.EtOnlyFields``: 159 of 213 MB on the large pair,
and 1.4 of the 2.2 s the encoder takes). Nothing of the link or the plan goes into them, so the core
left idle once the Kineto child (``schedule.kineto_child``) is done can encode them while the parent decodes
Kineto's hand-over, links and plans:

- ``start(et_path)``, at the start of a pair, while the process is still small (a cheap fork, no
  copy-on-write later): for an ET of the schedule's ``child_min_bytes`` or more, a shared anonymous mapping for the
  encoded fields, and for a gzip ET one for its text, of the size its trailer gives; the parent
  inflates into it (``inflate_into``, given to ``read.et.read_execution_trace``). A plain ET is
  mapped from its file by the child. Then a child is forked, which waits.
- ``go(et)``, once the parent has read the ET (the Kineto child is then about done: its core
  is free, or soon): the child decodes the same text again, leanly (a node's
  id and its raw ``inputs``/``outputs``/``attrs``, each node freed once encoded), writes the ids,
  then each node's fields into the shared area in node order, reporting its progress every
  ``batch_nodes`` nodes (the schedule's ``fields_batch_nodes``). A flat-layout ET, or a text that did not land in
  the shared mapping, stops the child instead.
- ``take(et)``, when the ``.et`` is written: ``PreEncoded``, once the ids match the parent's
  nodes one for one, else None. The writer takes a node's fields from it if the child has reported
  them done, else encodes them itself (the same bytes): the two share the work, the parent never
  waits for the child (unless the schedule says ``wait_for_fields``: then ``take`` waits until the
  child is done or has ended), and a child that fails at any point only leaves more to the parent.
  ``PreEncoded`` gives the area's pages back a batch at a time once the writer is past them.

Cost: the child's lean decode and encoding (about 0.4 + 1.4 s of CPU for 360k nodes), on the core
the parent leaves idle; in the parent, O(nodes) to check the ids and one slice per node. On the
large pair the ``.et`` went from 5.3 to 4.1 s, the parent taking 360,689 of its 360,690 ops'
fields from the child. Memory: the text is shared, not copied; the area holds the fields the child
has encoded ahead of the writer (up to about a hundred MB on the large pair). Largest process
1,014-1,032 MiB (was 1,020); the parent and this child together (Pss) at most about 1,200 MiB
(was 1,067, with the Kineto child).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from array import array
from collections import Counter
from pathlib import Path

import msgspec

from linker.write.chakra_encode import AttrEncoder, EtOnlyFields
from linker.read.et import FLAT
from linker.read.files import GZIP_MAGIC, plausible_gzip_size
from linker.schedule.fork import ForkedCall

_COUNT = 8  # bytes of a message between the processes: an int64, little-endian


class _Node(msgspec.Struct):
    """What of an ET node ``EtOnlyFields`` reads, and its id (other keys skipped)."""

    id: int
    inputs: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    outputs: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    attrs: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _Document(msgspec.Struct):
    nodes: list[_Node]


_DECODER = msgspec.json.Decoder(_Document)


class FieldsAhead:
    """The child encoding an ET's fields, and the shared mappings it works in (``start``).

    The child writes, in node order, each node's fields into ``area`` and where they end into
    ``index`` (after the nodes' ids and a 0), and reports through a pipe: first the number of nodes
    (the ids are written), then after each ``batch_nodes`` nodes how many are done. A pipe write and
    read order the two processes' memory, so what the parent has been told is done is there to read.
    ``wait``: ``take`` waits for the child to be done (or to end) before it hands out the fields."""

    def __init__(self, path: Path, gzipped: bool, text_size: int, batch_nodes: int, wait: bool = False):
        self._path, self._gzipped = path, gzipped
        self.batch_nodes, self._wait = batch_nodes, wait
        self._text = mmap.mmap(-1, text_size) if gzipped else None
        self._area = mmap.mmap(-1, text_size)  # the fields are smaller than their JSON text
        # ids then ends, int64 each: a node's JSON text takes at least 18 bytes ({"id":0,"name":""})
        self._index = mmap.mmap(-1, 8 * (2 * (text_size // 18) + 3))
        self._inflated = False
        self.ended = False  # the child's progress pipe is closed: nothing more will be reported
        self._child: ForkedCall | None = None
        go_read, self._go = os.pipe()
        self._progress, progress_write = os.pipe()
        try:
            self._child = ForkedCall(lambda: self._encode(go_read, progress_write))
        except OSError:
            self._close_pipes()
            raise
        finally:
            os.close(go_read)
            os.close(progress_write)

    def inflate_into(self, size: int) -> mmap.mmap | None:
        """The shared mapping to inflate the ET's text into, if ``size`` is the one it was made
        for (``files.read_trace_bytes``)."""
        if self._text is None or size != len(self._text):
            return None
        self._inflated = True
        return self._text

    def go(self, et) -> None:
        """Let the child encode ``et``'s fields, or stop it when it cannot (a flat layout, a text
        that did not land in the shared mapping). O(1)."""
        length = et.text_bytes
        if et.layout == FLAT:
            length = -1
        elif self._gzipped and not (self._inflated and length <= len(self._text)):
            length = -1
        elif not self._gzipped and length != len(self._area):  # the area has the file's size
            length = -1
        self._send(length)
        if length < 0:
            self.cancel()

    def take(self, et) -> PreEncoded | None:
        """The fields of ``et``'s nodes as the child encodes them (``PreEncoded``), once it has
        decoded the text (blocks until then; with ``wait``, until it is done or has ended); None
        when it failed or its nodes are not ``et``'s (ids compared in order). O(nodes)."""
        if self._child is None or self._go != -1:  # stopped, or never told to go
            self.cancel()
            return None
        n = _read_count(self._progress)
        if n != len(et.nodes) or self._index[:8 * n] != array("q", et.ids).tobytes():
            self.cancel()
            return None
        done = 0
        while self._wait and done < n:
            count = _read_count(self._progress)
            if count < 0:  # the child ended: what it reported before stays done
                self.ended = True
                break
            done = count
        os.set_blocking(self._progress, False)
        return PreEncoded(self, n, done)

    def cancel(self) -> None:
        """Stop the child if it still runs (killed, reaped) and close the pipes; idempotent."""
        self._send(-1)
        child, self._child = self._child, None
        if child is not None:
            child.cancel()
        self._close_pipes()

    def _send(self, length: int) -> None:
        if self._go != -1:
            with contextlib.suppress(OSError):
                os.write(self._go, length.to_bytes(_COUNT, "little", signed=True))
            os.close(self._go)
            self._go = -1

    def _close_pipes(self) -> None:
        for name in ("_go", "_progress"):
            fd = getattr(self, name)
            if fd != -1:
                os.close(fd)
                setattr(self, name, -1)

    def done(self) -> int:
        """How many nodes the child has reported done since last asked (without waiting), or -1
        (nothing new). Sets ``ended`` once the child has closed its end (exited)."""
        latest = -1
        with contextlib.suppress(BlockingIOError, OSError):
            while not self.ended:
                message = os.read(self._progress, 64 * _COUNT)
                if not message:
                    self.ended = True
                    break
                usable = len(message) - len(message) % _COUNT  # whole messages: they are written whole
                if usable:
                    latest = int.from_bytes(message[usable - _COUNT:usable], "little", signed=True)
        return latest

    # -- in the child ---------------------------------------------------------------------------

    def _encode(self, go_read: int, progress: int) -> bytes:
        """Wait for ``go``, write the ids, then every node's fields and their ends, reporting as it
        goes. Raises on anything unexpected: the parent encodes what was not reported done."""
        os.close(self._go)  # the parent's ends: end of file here if the parent dies
        os.close(self._progress)
        length = _read_count(go_read)
        if length < 0:
            raise RuntimeError("stopped")
        nodes = _DECODER.decode(self._text_view(length)).nodes
        n = len(nodes)
        index = memoryview(self._index).cast("q")
        if 2 * n + 1 > len(index):
            raise RuntimeError("more nodes than expected")
        index[:n] = array("q", [node.id for node in nodes])
        index[n] = 0  # then node u's fields end at index[n + 1 + u]
        _write_count(progress, n)
        fields = EtOnlyFields(AttrEncoder())
        area, batch = self._area, self.batch_nodes
        at = 0
        nodes.reverse()
        for u in range(n):
            node = nodes.pop()  # freed once encoded: the lean nodes shrink as the area fills
            encoded = fields(node)
            end = at + len(encoded)
            area[at:end] = encoded  # past the end: IndexError (the parent encodes the rest)
            index[n + 1 + u] = at = end
            if u % batch == batch - 1:
                _write_count(progress, u + 1)
        _write_count(progress, n)
        return b""

    def _text_view(self, length: int):
        if self._gzipped:
            return memoryview(self._text)[:length]
        with open(self._path, "rb") as stream:
            if os.fstat(stream.fileno()).st_size != length:
                raise RuntimeError("the file changed")
            return memoryview(mmap.mmap(stream.fileno(), length, prot=mmap.PROT_READ))


class PreEncoded:
    """The fields the child has encoded so far, a chunk of the write order at a time: ``chunk``
    gives each op's bytes, or None where the child has not reported them done (the caller then
    encodes them itself). Each op comes in one chunk only. ``chunk`` takes the child's progress
    first, and gives back to the system the part of the area holding a batch of nodes (the child's
    ``batch_nodes``) once they have all been in chunks (the write order keeps a handful of batches
    open at a time on the traces we have: 5 of 177 on the large pair), so the fields never sit in
    memory whole. ``released``: the bytes of the area given back; ``batches_open()``: the batches
    with nodes not yet in a chunk."""

    __slots__ = ("_ahead", "_area", "_batch", "_bounds", "_done", "_left", "_asked", "released")

    def __init__(self, ahead: FieldsAhead, n: int, done: int = 0):
        self._ahead, self._area, self._batch = ahead, ahead._area, ahead.batch_nodes
        self._bounds = memoryview(ahead._index).cast("q")[n:2 * n + 1]  # node u: bounds[u]:bounds[u + 1]
        self._done = done
        batch = self._batch
        self._left = [batch] * (n // batch) + ([n % batch] if n % batch else [])  # not yet in a chunk
        self._asked: list[int] = []  # batches all in chunks, their area still held
        self.released = 0

    def chunk(self, order) -> list[bytes | None]:
        """The fields of each node of ``order`` (None: not done yet, or not an ET op). O(len(order))."""
        self._refresh()
        area, bounds, done = self._area, self._bounds, self._done
        fields = [area[bounds[u]:bounds[u + 1]] if u < done else None for u in order]
        left, asked, n, batch = self._left, self._asked, len(bounds) - 1, self._batch
        for b, count in Counter([u // batch for u in order if u < n]).items():
            left[b] -= count
            if not left[b]:
                asked.append(b)
        return fields

    def batches_open(self) -> int:
        """How many batches still have nodes that were not in a chunk. O(batches)."""
        return sum(1 for count in self._left if count)

    def _refresh(self) -> None:
        """Take the child's latest progress; give back the batches all asked for and written by the
        child. O(messages waiting + batches held)."""
        done = self._ahead.done()
        if done > self._done:
            self._done = done
        if self._asked:
            kept = []
            batch = self._batch
            for b in self._asked:
                last = min((b + 1) * batch, len(self._bounds) - 1)
                if last <= self._done:  # else the child has still to write it
                    self._release(self._bounds[b * batch], self._bounds[last])
                else:
                    kept.append(b)
            self._asked = kept

    def _release(self, start: int, end: int) -> None:
        """Free the whole pages of the area between the two offsets (punched out of the shared
        memory: gone for the child too, which will not read them)."""
        start = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        end -= end % mmap.PAGESIZE
        if end > start and _REMOVE is not None:
            with contextlib.suppress(OSError, ValueError):
                self._area.madvise(_REMOVE, start, end - start)
                self.released += end - start


_REMOVE = getattr(mmap, "MADV_REMOVE", None)


def _write_count(fd: int, value: int) -> None:
    os.write(fd, value.to_bytes(_COUNT, "little", signed=True))  # 8 bytes: written whole


def _read_count(fd: int) -> int:
    """One message (blocking); -1 at end of file."""
    message = b""
    while len(message) < _COUNT:
        piece = os.read(fd, _COUNT - len(message))
        if not piece:
            return -1
        message += piece
    return int.from_bytes(message, "little", signed=True)


def start(et_path, min_bytes: int, batch_nodes: int, wait: bool = False) -> FieldsAhead | None:
    """A child to encode the fields of the ET at ``et_path`` (gzip or plain JSON of ``min_bytes``
    or more: the schedule's threshold, ``Schedule.fields_encoder``), or None (a smaller or
    unreadable file, an implausible gzip trailer, no process could be made). ``batch_nodes`` (the
    schedule's ``fields_batch_nodes``) and ``wait``: see ``FieldsAhead``."""
    if not hasattr(mmap, "PROT_READ"):
        return None
    path = Path(et_path)
    try:
        with open(path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size < min_bytes:
                return None
            gzipped = stream.read(2) == GZIP_MAGIC
            if gzipped:
                stream.seek(size - 4)
                text_size = int.from_bytes(stream.read(4), "little")
                if not plausible_gzip_size(size, text_size):
                    return None
            else:
                text_size = size
        return FieldsAhead(path, gzipped, text_size, batch_nodes, wait)
    except (OSError, ValueError):
        return None

"""Read and write Chakra protobuf execution traces (``.et``, ``.et.gz``).

File framing (docs/formats.md): a stream of protobuf messages, each preceded by its byte length as a
base-128 varint; one ``GlobalMetadata`` first, then one ``Node`` per op; no magic number; the
whole stream may be gzip-compressed (detected here by the gzip magic bytes, not by the suffix).

Reading streams: ``open_et`` parses the metadata and hands out nodes one at a time, so memory is
bounded by the largest message plus a 1 MiB read buffer, whatever the node count. Writing goes to
a temporary file that replaces the target only when the ``EtWriter`` block ends without an error.

Errors a user can fix (missing, empty, truncated or non-Chakra files) raise ``TraceFormatError``,
whose message names the file and the byte offset of the problem.
"""

from __future__ import annotations

import contextlib
import gzip
import mmap
import os
import zlib
from pathlib import Path
from typing import IO, Any, Iterator, NamedTuple

from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError, Message

from linker.model import et_def_pb2 as pb
from linker.model.errors import TraceInputError
from linker.read.files import GZIP_MAGIC, looks_like_json, open_input, read_head
from linker.write.sink import BackgroundWriter, atomic_output, reserve_space
from linker.write.protobuf_wire import MAX_VARINT_BYTES, decode_varint, encode_varint

GlobalMetadata = pb.GlobalMetadata
Node = pb.Node
AttributeProto = pb.AttributeProto

READ_CHUNK_BYTES = 1 << 20
WRITE_FLUSH_BYTES = 1 << 20
BACKGROUND_BLOCKS = 2  # blocks (about a MB each) waiting for a background writer
# protobuf refuses messages of 2 GiB or more; a larger length prefix means the bytes are not a frame.
MAX_MESSAGE_BYTES = (1 << 31) - 1

# The kinds of AttributeProto.value whose Python value is a list wrapper message (``.values``).
_LIST_KINDS = frozenset(
    f.name for f in AttributeProto.DESCRIPTOR.oneofs_by_name["value"].fields if f.name.endswith("_list")
)


class TraceFormatError(TraceInputError):
    """A trace file cannot be read: missing, empty, truncated, corrupt, or not the expected format.

    ``str(err)`` is ``"<path>: <problem>"``; ``err.path`` and ``err.problem`` hold the parts.
    Subclass of ``TraceInputError`` so the CLI reports it as a one-line user error.
    """


# ---------------------------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------------------------


class Frame(NamedTuple):
    """One length-delimited message of the stream.

    ``index``: 0 for the first message (the metadata); ``offset``: byte offset of its length prefix
    in the uncompressed stream; ``payload``: the message bytes.
    """

    index: int
    offset: int
    payload: bytes


def _refill(stream: IO[bytes], path: Path, rest: bytes, wanted: int, offset: int) -> tuple[bytes, bool]:
    """Return ``rest`` extended from ``stream`` to at least ``wanted`` bytes (fewer only at end of
    stream) and whether the end was reached. Reads ``READ_CHUNK_BYTES`` or more at a time."""
    parts = [rest]
    missing = wanted - len(rest)
    eof = False
    while missing > 0:
        try:
            chunk = stream.read(max(missing, READ_CHUNK_BYTES))
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise TraceFormatError(path, f"gzip data is truncated or corrupt near byte {offset} ({err})") from None
        except OSError as err:
            raise TraceFormatError(path, f"cannot read: {err.strerror or err}") from None
        if not chunk:
            eof = True
            break
        parts.append(chunk)
        missing -= len(chunk)
    return b"".join(parts), eof


def _long_varint(buffer: bytes, pos: int, path: Path, index: int, start: int) -> tuple[int, int]:
    """Decode a length prefix of two or more bytes at ``pos``; return (value, next position)."""
    try:
        return decode_varint(buffer, pos)
    except IndexError:
        raise TraceFormatError(path, f"truncated: message #{index} length prefix at byte {start} is cut off") from None
    except ValueError:
        raise TraceFormatError(path, f"not a Chakra trace: bad length prefix at byte {start} (message #{index})") from None


def _scan_frames(stream: IO[bytes], path: Path, base: int = 0, index: int = 0) -> Iterator[Frame]:
    """Cut a binary stream into ``Frame``s; ``base`` and ``index`` are the file offset and the
    message number of the stream's first frame (0 from the start of a file). Cost: O(stream
    bytes); memory O(largest frame + chunk)."""
    buffer, pos, eof = b"", 0, False  # base: file offset of buffer[0]
    while True:
        if len(buffer) - pos < MAX_VARINT_BYTES and not eof:
            base += pos
            buffer, eof = _refill(stream, path, buffer[pos:], MAX_VARINT_BYTES, base)
            pos = 0
        if pos == len(buffer):
            return
        start = base + pos
        length = buffer[pos]
        if length < 0x80:
            pos += 1
        else:
            length, pos = _long_varint(buffer, pos, path, index, start)
            if length > MAX_MESSAGE_BYTES:
                raise TraceFormatError(
                    path, f"not a Chakra trace: message #{index} at byte {start} claims {length} bytes"
                )
        if len(buffer) - pos < length:
            if not eof:
                base += pos
                buffer, eof = _refill(stream, path, buffer[pos:], length, base)
                pos = 0
            available = len(buffer) - pos
            if available < length:
                raise TraceFormatError(
                    path,
                    f"truncated: message #{index} at byte {start} needs {length} bytes, "
                    f"only {available} remain (or not a Chakra trace)",
                )
        yield Frame(index, start, buffer[pos : pos + length])
        pos += length
        index += 1


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open ``path`` for reading, transparently gunzipping when it starts with the gzip magic.

    Raises ``TraceFormatError`` when the file cannot be opened.
    """
    path = Path(path)
    try:
        raw = open_input(path)
    except TraceInputError as err:
        raise TraceFormatError(path, err.problem) from None
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError as err:
        raw.close()
        raise TraceFormatError(path, f"cannot read: {err.strerror or err}") from None
    if magic == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def iter_frames(path: str | os.PathLike) -> Iterator[Frame]:
    """Yield every length-delimited message of a ``.et``/``.et.gz`` file as a ``Frame``, in order.

    Raises ``TraceFormatError`` for a missing, empty (no bytes after decompression), truncated or
    garbled file. Cost: O(file size) time, O(largest message) memory.
    """
    p = Path(path)
    stream = open_binary(p)
    with contextlib.closing(stream):
        frames = _scan_frames(stream, p)
        first = next(frames, None)
        if first is None:
            raise TraceFormatError(p, "file is empty (no GlobalMetadata message)")
        yield first
        yield from frames


def frame_boundary(path: str | os.PathLike, at: int) -> tuple[int, int] | None:
    """(offset, message number) of the first frame starting at or after byte ``at`` of a plain
    (not gzip) ``.et``, found by walking the length prefixes from the start; None for a gzip file,
    a file that ends first, or bytes that are not frames (the full read reports those).
    Cost: one varint per frame before ``at``, the file mapped, never copied."""
    p = Path(path)
    try:
        with open(p, "rb") as raw, mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:2] == GZIP_MAGIC:
                return None
            pos, index, end = 0, 0, len(data)
            while pos < at:
                length, pos = decode_varint(data, pos)
                pos += length
                index += 1
            return (pos, index) if pos < end else None
    except (OSError, ValueError, IndexError):  # IndexError, ValueError: the bytes end in or are not a prefix
        return None


def iter_frames_from(path: str | os.PathLike, offset: int, index: int) -> Iterator[Frame]:
    """``iter_frames`` of a plain ``.et`` from the frame at ``offset`` (message number ``index``,
    as ``frame_boundary`` gives them) to the end; same checks and messages. O(bytes read)."""
    p = Path(path)
    stream = open_binary(p)
    with contextlib.closing(stream):
        stream.seek(offset)
        yield from _scan_frames(stream, p, offset, index)


def parse_metadata(frame: Frame, path: str | os.PathLike) -> pb.GlobalMetadata:
    """Decode a frame as ``GlobalMetadata``; ``TraceFormatError`` when the bytes are not protobuf."""
    return _parse(pb.GlobalMetadata, frame, path)


def parse_node(frame: Frame, path: str | os.PathLike) -> pb.Node:
    """Decode a frame as ``Node``; ``TraceFormatError`` when the bytes are not protobuf."""
    return _parse(pb.Node, frame, path)


def _parse(message_type: type, frame: Frame, path: str | os.PathLike) -> Any:
    message = message_type()
    try:
        message.ParseFromString(frame.payload)
    except (DecodeError, RuntimeError, ValueError) as err:
        if frame.index == 0 and _starts_like_json(path):
            raise TraceFormatError(path, "this is JSON (an ET or ET+?), not a Chakra protobuf trace") from None
        raise TraceFormatError(
            path,
            f"message #{frame.index} at byte {frame.offset} is not a valid "
            f"{message_type.DESCRIPTOR.name} ({err}); truncated or not a Chakra trace",
        ) from None
    return message


def _starts_like_json(path: str | os.PathLike) -> bool:
    """True when the (decompressed) file starts with '{' (``read.files.looks_like_json``, as
    ``sim.load.file_kind`` tells a file's kind). Only asked on the error path."""
    try:
        return looks_like_json(read_head(Path(path), 64))
    except TraceInputError:
        return False


def has_unknown_fields(message: Message) -> bool:
    """True when ``message`` was parsed from bytes holding top-level fields its type does not know.

    Used to spot a first message that is not a ``GlobalMetadata``. Cost: O(#unknown fields).
    """
    return len(unknown_fields.UnknownFieldSet(message)) > 0


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


class EtReader:
    """An open Chakra trace: ``metadata`` is parsed on open, ``nodes()`` streams the rest.

    Use as a context manager (or call ``close``). ``nodes()`` can be iterated once.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._frames = iter_frames(self.path)
        try:
            self.metadata_frame: Frame = next(self._frames)
            self.metadata: pb.GlobalMetadata = parse_metadata(self.metadata_frame, self.path)
        except BaseException:
            self._frames.close()
            raise
        self._nodes_taken = False

    def nodes(self) -> Iterator[pb.Node]:
        """Yield the ``Node`` messages in file order. Cost: O(message) per node."""
        if self._nodes_taken:
            raise RuntimeError(f"{self.path}: nodes() can be iterated only once per open_et")
        self._nodes_taken = True
        for frame in self._frames:
            yield parse_node(frame, self.path)

    def node_frames(self) -> Iterator[Frame]:
        """Yield the raw node frames (undecoded), sharing the one-pass stream with ``nodes``."""
        if self._nodes_taken:
            raise RuntimeError(f"{self.path}: nodes can be iterated only once per open_et")
        self._nodes_taken = True
        yield from self._frames

    def close(self) -> None:
        self._frames.close()

    def __enter__(self) -> EtReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_et(path: str | os.PathLike) -> EtReader:
    """Open a ``.et``/``.et.gz`` file: parses its ``GlobalMetadata`` now, nodes on demand.

    Raises ``TraceFormatError`` if the file is missing, empty or its first message is garbled.
    """
    return EtReader(path)


def read_et(path: str | os.PathLike) -> Iterator[pb.GlobalMetadata | pb.Node]:
    """Yield the file's messages in order: its ``GlobalMetadata``, then every ``Node``.

    Streaming; raises ``TraceFormatError`` on a bad file (possibly after some nodes were yielded).
    """
    with open_et(path) as reader:
        yield reader.metadata
        yield from reader.nodes()


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


class EtWriter:
    """Write a Chakra trace: ``write_metadata`` once, then ``write_node`` per node.

    ``with EtWriter(path) as w: ...`` writes to a temporary file beside ``path`` (gzip-compressed
    when ``path`` ends with ``.gz``) and renames it over ``path`` when the block ends normally; on
    an exception the temporary file is deleted and ``path`` is untouched. Ending the block without
    metadata is an error (the file would not be a Chakra trace). An empty ``GlobalMetadata`` is
    refused: its zero-length frame reads as end-of-file in the reference reader.
    ``background=True``: blocks are written (and gzip-compressed) by a thread
    (``read.files.BackgroundWriter``, at most ``BACKGROUND_BLOCKS`` waiting) while the caller encodes
    the next ones; a write error is raised by a later write or at the end of the block.
    Cost: O(bytes written); output is flushed in blocks of ``flush_bytes`` (``WRITE_FLUSH_BYTES``).
    """

    def __init__(self, path: str | os.PathLike, protected: tuple = (), background: bool = False,
                 flush_bytes: int = WRITE_FLUSH_BYTES):
        self.path = Path(path)
        self._flush_bytes = flush_bytes  # bytes gathered before a block is written (or handed to the thread)
        self._protected = protected
        self._background = background
        self._output: contextlib.AbstractContextManager[IO[bytes]] | None = None
        self._stream: IO[bytes] | None = None
        self._writer: BackgroundWriter | None = None
        self._pending = bytearray()
        self.metadata_written = False
        self.nodes_written = 0

    def __enter__(self) -> EtWriter:
        self._output = atomic_output(self.path, self._protected)
        self._stream = self._output.__enter__()
        if self._background:
            self._writer = BackgroundWriter(self._stream, depth=BACKGROUND_BLOCKS)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool | None:
        if self._output is None:
            raise ValueError("EtWriter used without 'with'")
        if exc_type is not None:
            with contextlib.suppress(BaseException):  # the first error is the one reported
                self._close_writer()
            return self._output.__exit__(exc_type, exc, tb)  # deletes the temporary file
        try:
            if not self.metadata_written:
                raise ValueError(f"{self.path}: no GlobalMetadata was written; file not created")
            self._flush()
            self._close_writer()
        except BaseException as error:
            with contextlib.suppress(BaseException):
                self._close_writer()
            self._output.__exit__(type(error), error, error.__traceback__)
            raise
        return self._output.__exit__(None, None, None)

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def _write(self, data: bytes) -> None:
        if self._writer is not None:
            self._writer.write(data)
        else:
            self._stream.write(data)

    def write_metadata(self, metadata: pb.GlobalMetadata) -> None:
        """Write the ``GlobalMetadata`` message; must come first and exactly once."""
        if self.metadata_written:
            raise ValueError("GlobalMetadata already written")
        payload = metadata.SerializeToString()
        if not payload:
            raise ValueError("empty GlobalMetadata: readers would take its zero-length frame for end-of-file")
        self._append(payload)
        self.metadata_written = True

    def write_node(self, node: pb.Node) -> None:
        """Write one ``Node`` message (after the metadata). An all-default Node (zero bytes) is
        refused, for the same end-of-file reason as an empty metadata."""
        if not self.metadata_written:
            raise ValueError("write_metadata must be called before write_node")
        payload = node.SerializeToString()
        if not payload:
            raise ValueError("empty Node (every field default): readers would take it for end-of-file")
        self._append(payload)
        self.nodes_written += 1

    def reserve(self, size: int) -> None:
        """Have the file's first ``size`` bytes allocated now (``sink.reserve_space``: best effort;
        the file still ends where the writing does)."""
        reserve_space(self._stream, size)

    def write_frames_bytes(self, frames: bytes, count: int) -> None:
        """Write ``count`` already framed ``Node`` messages held in ``frames``. O(bytes)."""
        if not self.metadata_written:
            raise ValueError("write_metadata must be called before write_node")
        self._flush()
        self._write(frames)
        self.nodes_written += count

    def _append(self, payload: bytes) -> None:
        if self._stream is None:
            raise ValueError("EtWriter used without 'with'")
        self._pending += encode_varint(len(payload))
        self._pending += payload
        if len(self._pending) >= self._flush_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._pending and self._stream is not None:
            self._write(self._pending)
            self._pending = bytearray()  # a new one: the writer thread may still hold the old one


# ---------------------------------------------------------------------------------------------
# Attributes and dumping
# ---------------------------------------------------------------------------------------------

_MISSING: Any = object()


def attr_value(attr: pb.AttributeProto) -> Any:
    """Return the Python value of an ``AttributeProto`` (list kinds as a ``list``; None if unset)."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    return list(value.values) if kind in _LIST_KINDS else value


def find_attr(message: pb.Node | pb.GlobalMetadata, name: str) -> pb.AttributeProto | None:
    """Return the first attribute called ``name`` of a node or metadata, or None. Cost: O(#attrs)."""
    for attr in message.attr:
        if attr.name == name:
            return attr
    return None


def get_attr(message: pb.Node | pb.GlobalMetadata, name: str, default: Any = _MISSING) -> Any:
    """Return the value of attribute ``name`` (see ``attr_value``).

    Raises ``KeyError`` when absent and no ``default`` is given. Cost: O(#attrs).
    """
    attr = find_attr(message, name)
    if attr is None:
        if default is _MISSING:
            raise KeyError(name)
        return default
    return attr_value(attr)


def attr_dict(message: pb.Node | pb.GlobalMetadata) -> dict[str, Any]:
    """Return ``{name: value}`` for all attributes (first one wins on duplicate names)."""
    out: dict[str, Any] = {}
    for attr in message.attr:
        out.setdefault(attr.name, attr_value(attr))
    return out


def make_attr(name: str, value: Any, kind: str | None = None) -> pb.AttributeProto:
    """Build an ``AttributeProto``. ``kind`` is the oneof member (``"uint64_val"``, ``"int64_list"``…);
    by default bool -> bool_val, int -> int64_val, float -> double_val, str -> string_val,
    bytes -> bytes_val, and a list of those -> the matching ``*_list``.
    """
    if kind is None:
        kind = _infer_kind(value)
    attr = pb.AttributeProto(name=name)
    if kind in _LIST_KINDS:
        getattr(attr, kind).values.extend(value)
    else:
        setattr(attr, kind, value)
    return attr


def _infer_kind(value: Any) -> str:
    scalar_kinds = ((bool, "bool"), (int, "int64"), (float, "double"), (str, "string"), (bytes, "bytes"))
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("cannot infer the kind of an empty list; pass kind=")
        for py_type, kind in scalar_kinds:
            if all(isinstance(v, py_type) for v in value):
                return f"{kind}_list"
    else:
        for py_type, kind in scalar_kinds:
            if isinstance(value, py_type):
                return f"{kind}_val"
    raise ValueError(f"cannot infer the attribute kind of {value!r}; pass kind=")


def message_to_dict(message: Message) -> dict[str, Any]:
    """Return a JSON-ready dict of the fields set on ``message``, in field-number order.

    Integers stay integers (unlike ``json_format``, which quotes 64-bit ones), enums become their
    names (the number if unknown), bytes become latin-1 strings, nested messages recurse.
    Cost: O(message size).
    """
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if _is_repeated(field):
            out[field.name] = [_field_value(field, v) for v in value]
        else:
            out[field.name] = _field_value(field, value)
    return out


def _is_repeated(field: Any) -> bool:
    is_repeated = getattr(field, "is_repeated", None)  # protobuf >= 6
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == field.LABEL_REPEATED


def _field_value(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        return message_to_dict(value)
    if field.enum_type is not None:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value


def iter_dump_records(path: str | os.PathLike, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield ``{"metadata": {...}}`` then ``{"node": {...}}`` per node (at most ``limit`` nodes).

    Streaming: O(1) nodes in memory. For ``et-link dump``.
    """
    with open_et(path) as reader:
        yield {"metadata": message_to_dict(reader.metadata)}
        for count, node in enumerate(reader.nodes()):
            if limit is not None and count >= limit:
                return
            yield {"node": message_to_dict(node)}

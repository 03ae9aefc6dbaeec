"""The protobuf wire format, as the ``.et`` encoder writes it: varints, and field tags named from
the schema's descriptors (``et_def_pb2``), so no tag byte is written out by hand; and the one
varint decoder of the readers that walk ``.et`` bytes without parsing them (``decode_varint``).

A field is its tag (``field number << 3 | wire type``, a varint), then a varint value (wire type 0)
or a varint length and that many bytes (wire type 2: strings, messages, packed repeated ints).
Every function here is pure and costs O(bytes written). ``encode_varint`` writes one value,
``varint_rows`` a column of them (the same bytes: a test compares the two).
"""

from __future__ import annotations

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor

MAX_INT64 = (1 << 63) - 1
MIN_INT64 = -MAX_INT64 - 1
UINT64_MASK = (1 << 64) - 1

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
MAX_VARINT_BYTES = 10  # a 64-bit value: 7 bits a byte


def encode_varint(value: int) -> bytes:
    """Return the base-128 varint encoding of a non-negative int. Cost: O(bytes); table lookups
    of 14 bits at a time below 2**56."""
    if value < SMALL_VARINTS_END:
        if value < 0:
            raise ValueError(f"varint of a negative value: {value}")
        return SMALL_VARINTS[value]
    if value < 1 << 28:  # ids of large traces
        return CONTINUED_PAIRS[value & 0x3FFF] + SMALL_VARINTS[value >> 14]
    if value < 1 << 42:
        return CONTINUED_PAIRS[value & 0x3FFF] + CONTINUED_PAIRS[value >> 14 & 0x3FFF] + SMALL_VARINTS[value >> 28]
    if value < 1 << 56:  # times in µs since the epoch
        return (CONTINUED_PAIRS[value & 0x3FFF] + CONTINUED_PAIRS[value >> 14 & 0x3FFF]
                + CONTINUED_PAIRS[value >> 28 & 0x3FFF] + SMALL_VARINTS[value >> 42])
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints of a column of non-negative int64 values: a (len, w) uint8 matrix whose row i
    holds value i's varint from its first byte (w: the longest; the rest of a row is 0), and each
    varint's length. Raises ValueError for a negative value, as ``encode_varint``. Array passes,
    O(len * w)."""
    values = np.asarray(values, dtype=np.int64)
    if values.size and values.min() < 0:
        raise ValueError(f"varint of a negative value: {int(values.min())}")
    lengths = np.searchsorted(_VARINT_LIMITS, values, side="right") + 1
    width = int(lengths.max()) if len(values) else 1
    shifts = np.arange(0, 7 * width, 7, dtype=np.int64)
    rows = ((values[:, None] >> shifts) & 0x7F).astype(np.uint8)
    rows |= (np.arange(width) < lengths[:, None] - 1).view(np.uint8) << 7  # every byte but the last continues
    return rows, lengths


_VARINT_LIMITS = np.array([1 << 7 * k for k in range(1, MAX_VARINT_BYTES - 1)], dtype=np.int64)  # 2**7 ... 2**56


def decode_varint(data, pos: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at ``pos`` of ``data`` (bytes, or
    anything indexed by position to ints, such as an mmap). Raises IndexError when ``data`` ends
    inside the varint, ValueError when it runs over ``MAX_VARINT_BYTES`` bytes. O(its bytes)."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    for at in range(pos + 1, pos + MAX_VARINT_BYTES):
        byte = data[at]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at + 1
        shift += 7
    raise ValueError(f"the varint at byte {pos} runs over {MAX_VARINT_BYTES} bytes")


# For encoders that inline the common cases: the varint of v < SMALL_VARINTS_END is
# SMALL_VARINTS[v]; of v < 2**28, CONTINUED_PAIRS[v & 0x3FFF] + SMALL_VARINTS[v >> 14].
SMALL_VARINTS_END = 1 << 14
SMALL_VARINTS = [bytes((v,)) if v < 0x80 else bytes((v & 0x7F | 0x80, v >> 7)) for v in range(SMALL_VARINTS_END)]
# The low 14 bits of a larger value: two bytes, both with the continuation bit.
CONTINUED_PAIRS = [bytes((v & 0x7F | 0x80, v >> 7 | 0x80)) for v in range(SMALL_VARINTS_END)]


def is_int64(value) -> bool:
    """A Python int (not a bool) that fits an int64 field."""
    return type(value) is int and MIN_INT64 <= value <= MAX_INT64


_FIXED64_TYPES = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
_FIXED32_TYPES = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32}
_DELIMITED_TYPES = {FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE}


def _is_packed(field: FieldDescriptor) -> bool:
    packed = getattr(field, "is_packed", None)  # protobuf >= 5
    if packed is not None:
        return bool(packed)
    # proto3 (the schema's syntax): repeated scalars are packed unless an option says otherwise
    repeated = field.label == FieldDescriptor.LABEL_REPEATED
    return repeated and field.type not in _DELIMITED_TYPES and field.GetOptions().packed is not False


def wire_type(field: FieldDescriptor) -> int:
    """How a field's values are written: packed repeated and string/bytes/message fields are
    length-delimited, the others by their scalar type."""
    if field.type in _DELIMITED_TYPES or _is_packed(field):
        return LENGTH_DELIMITED
    if field.type in _FIXED64_TYPES:
        return FIXED64
    if field.type in _FIXED32_TYPES:
        return FIXED32
    return VARINT


def tag(message: Descriptor | type, name: str) -> bytes:
    """The tag bytes of field ``name`` of a message type (its descriptor or generated class)."""
    descriptor = getattr(message, "DESCRIPTOR", message)
    field = descriptor.fields_by_name[name]
    return encode_varint(field.number << 3 | wire_type(field))


def tags(message: Descriptor | type, *names: str) -> tuple[bytes, ...]:
    """The tags of several fields, in the order named."""
    return tuple(tag(message, name) for name in names)


def delimited(field_tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return field_tag + encode_varint(len(payload)) + payload


def packed(field_tag: bytes, values: list[int]) -> bytes:
    """A packed repeated uint64 field; nothing for no values (as protobuf writes it)."""
    if not values:
        return b""
    return delimited(field_tag, b"".join([encode_varint(v) for v in values]))

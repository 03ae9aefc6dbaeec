"""An independent decoder of the protobuf wire format, for cross-checking ``linker.model.et_def_pb2``.

It knows only the wire format (varints, 64/32-bit fixed fields, length-delimited fields) and, for
the Chakra messages, which field numbers hold nested messages, packed varints or zigzag / signed
integers. It does not import protobuf or the generated module.

Decoded messages are ``dict[int, list[value]]``: field number -> values in file order (repeated
fields collect several). Values: int for varints and fixed fields, bytes for length-delimited ones,
unless a schema map below says the field is a nested message (-> dict) or packed varints (-> list).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

WIRE_VARINT, WIRE_FIXED64, WIRE_LENGTH, WIRE_FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not valid protobuf wire format."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode one varint at ``pos``; return (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("varint runs past the end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def as_int64(value: int) -> int:
    """Reinterpret an unsigned 64-bit varint as two's-complement int64."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def zigzag_decode(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def split_frames(data: bytes) -> list[bytes]:
    """Split a length-delimited stream (varint length + message, repeated) into messages."""
    frames, pos = [], 0
    while pos < len(data):
        length, pos = read_varint(data, pos)
        if pos + length > len(data):
            raise WireError("frame runs past the end")
        frames.append(data[pos : pos + length])
        pos += length
    return frames


def read_stream(path: str | Path) -> list[bytes]:
    """Read a .et / .et.gz file (gzip by magic bytes) and split it into raw messages."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return split_frames(data)


def decode_fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """Decode a message into (field number, wire type, raw value) triples, in order."""
    fields, pos = [], 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == WIRE_VARINT:
            value, pos = read_varint(data, pos)
        elif wire_type == WIRE_FIXED64:
            if pos + 8 > len(data):
                raise WireError("fixed64 runs past the end")
            value, pos = struct.unpack_from("<Q", data, pos)[0], pos + 8
        elif wire_type == WIRE_LENGTH:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise WireError("length-delimited field runs past the end")
            value, pos = data[pos : pos + length], pos + length
        elif wire_type == WIRE_FIXED32:
            if pos + 4 > len(data):
                raise WireError("fixed32 runs past the end")
            value, pos = struct.unpack_from("<I", data, pos)[0], pos + 4
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        fields.append((number, wire_type, value))
    return fields


def unpack_varints(data: bytes) -> list[int]:
    values, pos = [], 0
    while pos < len(data):
        value, pos = read_varint(data, pos)
        values.append(value)
    return values


# --- Chakra message shapes (field numbers of schema/et_def.proto, typed here by hand) ----------

# AttributeProto scalar value fields: number -> converter from the raw wire value.
_ATTR_SCALARS = {
    3: lambda raw: struct.unpack("<d", struct.pack("<Q", raw))[0],  # double_val
    5: lambda raw: struct.unpack("<f", struct.pack("<I", raw))[0],  # float_val
    7: lambda raw: as_int64(raw) if raw >= 1 << 31 else raw,  # int32_val (negative: 10-byte varint)
    9: as_int64,  # int64_val
    11: int,  # uint32_val
    13: int,  # uint64_val
    15: zigzag_decode,  # sint32_val
    17: zigzag_decode,  # sint64_val
    19: int,  # fixed32_val
    21: int,  # fixed64_val
    23: lambda raw: raw - (1 << 32) if raw >= 1 << 31 else raw,  # sfixed32_val
    25: lambda raw: raw - (1 << 64) if raw >= 1 << 63 else raw,  # sfixed64_val
    27: bool,  # bool_val
    29: lambda raw: raw.decode("utf-8"),  # string_val
    31: bytes,  # bytes_val
}
# AttributeProto list fields whose element is a varint: number -> element converter.
_ATTR_VARINT_LISTS = {
    8: as_int64, 10: as_int64, 12: int, 14: int, 16: zigzag_decode, 18: zigzag_decode, 28: bool
}
_ATTR_STRING_LIST = 30


def decode_attr(data: bytes) -> dict[int, object]:
    """AttributeProto -> {1: name, 2: doc_string, <value field number>: converted value}.

    Supports the scalar kinds and the varint / string list kinds (enough for Chakra traces).
    """
    out: dict[int, object] = {}
    for number, wire_type, raw in decode_fields(data):
        if number in (1, 2):
            out[number] = raw.decode("utf-8")
        elif number in _ATTR_SCALARS:
            out[number] = _ATTR_SCALARS[number](raw)
        elif number in _ATTR_VARINT_LISTS:
            convert = _ATTR_VARINT_LISTS[number]
            values = [] if wire_type != WIRE_LENGTH else [
                convert(v) for n, w, r in decode_fields(raw) if n == 1
                for v in (unpack_varints(r) if w == WIRE_LENGTH else [r])
            ]
            out[number] = values
        elif number == _ATTR_STRING_LIST:
            out[number] = [r.decode("utf-8") for n, _, r in decode_fields(raw) if n == 1]
        else:
            out[number] = raw
    return out


def decode_io_info(data: bytes) -> dict[int, str]:
    """IOInfo -> {1: values, 2: shapes, 3: types, 4: strides} (strings)."""
    return {number: raw.decode("utf-8") for number, _, raw in decode_fields(data)}


def decode_metadata(data: bytes) -> dict[int, list]:
    """GlobalMetadata -> {1: [version], 2: [attr dicts]}."""
    out: dict[int, list] = {}
    for number, _, raw in decode_fields(data):
        if number == 1:
            out.setdefault(1, []).append(raw.decode("utf-8"))
        elif number == 2:
            out.setdefault(2, []).append(decode_attr(raw))
        else:
            out.setdefault(number, []).append(raw)
    return out


def decode_node(data: bytes) -> dict[int, list]:
    """Node -> field number -> list of values: ids and times as ints, name as str,
    ctrl/data deps flattened (packed or not), inputs/outputs as IOInfo dicts, attrs as dicts."""
    out: dict[int, list] = {}
    for number, wire_type, raw in decode_fields(data):
        values = out.setdefault(number, [])
        if number in (4, 5):  # repeated uint64, packed (wire 2) or one per field (wire 0)
            values.extend(unpack_varints(raw) if wire_type == WIRE_LENGTH else [raw])
        elif number == 2:
            values.append(raw.decode("utf-8"))
        elif number in (8, 9):
            values.append(decode_io_info(raw))
        elif number == 10:
            values.append(decode_attr(raw))
        else:
            values.append(raw)
    return out

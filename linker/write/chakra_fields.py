"""The part of a ``Node`` that comes from the ET alone, as wire bytes: ``inputs`` and ``outputs``
(``IOInfo``: the node's own JSON text of values, shapes, types and strides) and a CPU op's own
attributes. ``EtOnlyFields`` is what the ``.et`` encoder (``chakra_encode.NodeFrames``) writes
between an op's times and its time split, and what a forked child may encode ahead
(``schedule.fields_child``).

What repeats is encoded once and kept as bytes: per distinct IO shapes/types/strides their
``IOInfo`` fields (a training step repeats a few hundred of them over hundreds of thousands of
ops: only ``values`` is encoded per op); the ``attrs`` entries after PyTorch's ``rf_id``,
``fw_parent``, ``seq_id`` (scope, tid, op schema...) cached by their text, the fw_parent / seq_id
entries too (``CpuAttrs``). Texts written otherwise than PyTorch writes them take the general
functions (``io_fields``, ``AttrEncoder.cpu_attr_bytes``), which give the same bytes.
Cost: O(size of the raw texts) per op; memory: the caches, each bounded.
"""

from __future__ import annotations

from typing import Any

import msgspec

from linker.model import et_def_pb2 as pb
from linker.plan.comm import IOParts
from linker.read.et import UNSET, EtNode
from linker.write.chakra_attrs import (ATTR, MAX_CACHED, MAX_CACHED_VALUES, PER_OP_ATTRS, AttrEncoder, int64_attr,
                                       int64_head)
from linker.write.protobuf_wire import (CONTINUED_PAIRS, MAX_INT64, MIN_INT64, SMALL_VARINTS, SMALL_VARINTS_END,
                                        delimited, encode_varint, is_int64, tags)

INPUTS, OUTPUTS = tags(pb.Node, "inputs", "outputs")
_IO_TAGS = tags(pb.IOInfo, "values", "shapes", "types", "strides")
_VALUES = _IO_TAGS[0]
_VALUES_SIZE = len(_VALUES)


def text(raw: Any) -> str:
    """Raw JSON bytes (``msgspec.Raw`` or bytes) as text; "" when absent."""
    if raw is None or raw is UNSET:
        return ""
    return str(raw, "utf-8", "replace")


def utf8(raw: Any) -> bytes:
    """What protobuf writes for the text ``text`` makes of raw JSON bytes."""
    data = bytes(raw)
    return data if data.isascii() else text(raw).encode("utf-8")


def io_bytes(values: Any, shapes: Any, types: Any, strides: Any = None) -> bytes:
    """An ``IOInfo`` message's wire bytes (empty strings are not written, as protobuf does)."""
    out = b""
    for field_tag, raw in zip(_IO_TAGS, (values, shapes, types, strides)):
        if raw is None or raw is UNSET:
            continue
        data = utf8(raw)
        if data:
            out += field_tag + encode_varint(len(data)) + data
    return out


IO_DECODER = msgspec.json.Decoder(IOParts)


def io_fields(node, flat: bool) -> bytes:
    """``inputs`` and ``outputs`` of a node (ET op or GPU op): present (if empty) whenever the node
    has them. O(size of the raw inputs/outputs)."""
    out = b""
    if flat:
        if node.inputs is not UNSET:
            out += delimited(INPUTS, io_bytes(node.inputs, node.input_shapes, node.input_types))
        if node.outputs is not UNSET:
            out += delimited(OUTPUTS, io_bytes(node.outputs, node.output_shapes, node.output_types))
        return out
    for raw, field_tag in ((node.inputs, INPUTS), (node.outputs, OUTPUTS)):
        if raw is UNSET or raw is None:
            continue
        try:
            parts = IO_DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            out += delimited(field_tag, io_bytes(raw, None, None))
            continue
        out += delimited(field_tag, io_bytes(parts.values, parts.shapes, parts.types,
                                             parts.strides if len(parts.strides) else None))
    return out


class IoFields:
    """The ``inputs`` or ``outputs`` field (``field_tag``) of nested-layout nodes: ``values``
    encoded per node, the shapes/types/strides fields taken from a cache by their text (a few
    hundred distinct in a training step). O(len(raw)) per node; memory O(distinct shapes/types/
    strides) fields."""

    def __init__(self, field_tag: bytes):
        self._tag = field_tag
        self._tails: dict[bytes, bytes] = {}

    def __call__(self, raw: Any) -> bytes:
        try:
            parts = IO_DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return delimited(self._tag, io_bytes(raw, None, None))
        # Complete JSON texts joined by a newline: the key stays injective.
        key = b"\n".join((parts.shapes, parts.types, parts.strides))
        tail = self._tails.get(key)
        if tail is None:
            tail = io_bytes(None, parts.shapes, parts.types, parts.strides if len(parts.strides) else None)
            if len(self._tails) < MAX_CACHED:
                self._tails[key] = tail
        values = bytes(parts.values)
        if not values.isascii():
            values = utf8(values)
        size = len(values)
        if not size:
            return delimited(self._tag, tail)
        size_bytes = SMALL_VARINTS[size] if size < SMALL_VARINTS_END else encode_varint(size)
        total = _VALUES_SIZE + len(size_bytes) + size + len(tail)
        total_bytes = SMALL_VARINTS[total] if total < SMALL_VARINTS_END else encode_varint(total)
        return b"".join((self._tag, total_bytes, _VALUES, size_bytes, values, tail))


class _Attr(msgspec.Struct, gc=False):
    """An ``attrs`` entry (its ``type`` skipped)."""

    name: str
    value: Any = None


_ENTRY_DECODER = msgspec.json.Decoder(_Attr)
_ENTRIES_DECODER = msgspec.json.Decoder(list[_Attr])
_ENTRY_SEPARATOR = b"},{"
_RF_ID_ENTRY = b'[{"name": "rf_id", "type": "uint64", "value": '  # + digits: what PyTorch writes first
_FW_PARENT_ENTRY = b'"name": "fw_parent", "type": "uint64", "value": '
_SEQ_ID_ENTRY = b'"name": "seq_id", "type": "int64", "value": '
_RF_ID_HEAD = int64_head("rf_id")  # rf_id: unique per op, never cached
_FW_PARENT_HEAD, _SEQ_ID_HEAD = int64_head("fw_parent"), int64_head("seq_id")
_NOT_FAST = False  # cached for a text the fast path does not take


class CpuAttrs:
    """``Node.attr`` bytes of a nested-layout op from its raw ``attrs`` text, as
    ``AttrEncoder.cpu_attr_bytes`` gives them, without decoding what repeats.

    PyTorch writes ``[{rf_id}, {fw_parent}, {seq_id}, {scope}, ...]``: the text is split at its
    first three ``},{``; the rf_id entry must be the exact text ``_RF_ID_ENTRY`` + digits, and each
    other piece (the second entry, the third, the rest of the list) is looked up by its text,
    decoded once on a miss. Each piece decoding as JSON on its own means the splits were between
    entries (a ``},{`` inside a string would leave a piece with an unclosed string). Returns None
    for any other text: the caller takes the general path. O(len(text)) per op."""

    def __init__(self, attrs: AttrEncoder, max_cached_values: int = MAX_CACHED_VALUES):
        self._attrs = attrs
        self._max_cached = max_cached_values  # texts kept per cache (``_cache``)
        self._second: dict[bytes, bytes | bool] = {}
        self._seq_id: dict[bytes, bytes | bool] = {}
        self._rest: dict[bytes, bytes | bool] = {}
        # is_cpu_op, then the rf_id attribute's tag, length and head, by the length of its varint
        self._rf_id_heads = [attrs.is_cpu_op + ATTR + SMALL_VARINTS[len(_RF_ID_HEAD) + size] + _RF_ID_HEAD
                             for size in range(11)]

    def __call__(self, raw: Any) -> bytes | None:
        pieces = bytes(raw).split(_ENTRY_SEPARATOR, 3)
        if len(pieces) != 4:
            return None
        first, second, third, rest = pieces
        if not first.startswith(_RF_ID_ENTRY):
            return None
        digits = first[len(_RF_ID_ENTRY):]
        if not digits.isdigit() or (digits[0] == 48 and len(digits) > 1):  # 48: "0" (a JSON int)
            return None
        seq_id = self._seq_id.get(third)
        if seq_id is None:
            seq_id = self._cache(self._seq_id, third, self._seq_id_of(third))
        shared = self._second.get(second)
        if shared is None:
            shared = self._cache(self._second, second, self._second_of(second))
        rest_bytes = self._rest.get(rest)
        if rest_bytes is None:
            rest_bytes = self._cache(self._rest, rest, self._shared_of(b"[{" + rest))
        rf_id = int(digits)
        if seq_id is _NOT_FAST or shared is _NOT_FAST or rest_bytes is _NOT_FAST or rf_id > MAX_INT64:
            return None
        if rf_id < SMALL_VARINTS_END:
            value = SMALL_VARINTS[rf_id]
        elif rf_id < 1 << 28:
            value = CONTINUED_PAIRS[rf_id & 0x3FFF] + SMALL_VARINTS[rf_id >> 14]
        else:
            value = encode_varint(rf_id)
        return b"".join((self._rf_id_heads[len(value)], value, seq_id, shared, rest_bytes))

    def _cache(self, cache: dict, text: bytes, encoded: bytes | bool) -> bytes | bool:
        """Keeps the recent texts: emptied when full (seq_id / fw_parent values move on with time)."""
        if len(cache) >= self._max_cached:
            cache.clear()
        cache[text] = encoded
        return encoded

    def _second_of(self, text: bytes) -> bytes | bool:
        return _written_int64(text, _FW_PARENT_ENTRY, _FW_PARENT_HEAD) or self._shared_of(b"[{" + text + b"}]")

    def _seq_id_of(self, text: bytes) -> bytes | bool:
        encoded = _written_int64(text, _SEQ_ID_ENTRY, _SEQ_ID_HEAD)
        if encoded:
            return encoded
        try:
            entry = _ENTRY_DECODER.decode(b"{" + text + b"}")
        except (msgspec.DecodeError, msgspec.ValidationError):
            return _NOT_FAST
        if entry.name != "seq_id" or not is_int64(entry.value):
            return _NOT_FAST
        return self._attrs.int64_attrs([("seq_id", entry.value)])

    def _shared_of(self, text: bytes) -> bytes | bool:
        """Attributes other than the per-op ids, in order (null values and ``is_cpu_op`` left out)."""
        try:
            entries = _ENTRIES_DECODER.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return _NOT_FAST
        pairs = [(e.name, e.value) for e in entries if e.value is not None and e.name != "is_cpu_op"]
        if any(name in PER_OP_ATTRS for name, _ in pairs):
            return _NOT_FAST
        return self._attrs.encode_pairs(pairs)


def _written_int64(text: bytes, entry: bytes, head: bytes) -> bytes | None:
    """The int64 attribute ``head`` of an entry written exactly as PyTorch writes it (``entry``
    then an int64 literal), without decoding; None for any other text."""
    if text.startswith(entry):
        value = _int_literal(text[len(entry):])
        if value is not None and MIN_INT64 <= value <= MAX_INT64:
            return int64_attr(head, value)
    return None


def _int_literal(text: bytes) -> int | None:
    """The value of a JSON integer literal (the whole text), else None."""
    digits = text[1:] if text[:1] == b"-" else text
    if not digits.isdigit() or (digits[0] == 48 and len(digits) > 1):  # 48: "0"
        return None
    return int(text)


class EtOnlyFields:
    """The part of a CPU op's ``Node`` that comes from the ET alone: its ``inputs``, ``outputs``
    and own attributes (``is_cpu_op``, then the ET's), as ``NodeFrames`` writes them between the
    op's times and its time split; ``io`` alone for a GPU op. ``flat``: the ET's node layout.
    A nested-layout ``node`` needs only ``inputs``, ``outputs`` and ``attrs`` (``fields_child``
    calls it on a leaner struct). O(size of the three raw texts) per op; memory: the caches of
    ``IoFields``, ``CpuAttrs``, ``attrs``."""

    def __init__(self, attrs: AttrEncoder, flat: bool = False):
        self._flat = flat
        self._plain_attrs = attrs.cpu_attr_bytes
        self.cpu_attrs = CpuAttrs(attrs)
        self.inputs, self.outputs = IoFields(INPUTS), IoFields(OUTPUTS)

    def io(self, node) -> bytes:
        """``inputs`` and ``outputs`` of any node, those of a nested layout through the caches."""
        if self._flat:
            return io_fields(node, True)
        inputs, outputs = node.inputs, node.outputs
        head = b""
        if inputs is not UNSET and inputs is not None:
            head = self.inputs(inputs)
        if outputs is not UNSET and outputs is not None:
            head += self.outputs(outputs)
        return head

    def __call__(self, node: EtNode) -> bytes:
        if self._flat:
            return io_fields(node, True) + self._plain_attrs(node, True)
        attrs = node.attrs
        return self.io(node) + ((attrs is not UNSET and self.cpu_attrs(attrs)) or self._plain_attrs(node, False))

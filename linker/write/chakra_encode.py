"""Chakra ``Node`` messages of ET ops as protobuf wire bytes, written directly (no message objects).

Each function writes exactly what protobuf serialises for the same fields: known fields in
field-number order, proto3 defaults left out, repeated ids packed, strings as UTF-8 (the tests
read every message back with protobuf and with an independent wire reader, and compare the fast
path with the plain one).

Two paths give the same bytes:
- the plain one, ``cpu_node_bytes``: any ET layout, any attribute values; O(size of the node);
- ``NodeFrames``: whole chunks of framed nodes (varint length + bytes) built with list appends and
  one join. What repeats is encoded once and kept as bytes: per op name its ``name``/``type``
  fields; per distinct IO shapes/types/strides their ``IOInfo`` fields (a training step repeats a
  few hundred of them over hundreds of thousands of ops: only ``values`` is encoded per op); the
  ``attrs`` entries after PyTorch's ``rf_id``, ``fw_parent``, ``seq_id`` (scope, tid, op schema...)
  as ``Node.attr`` fields cached by their text, the fw_parent / seq_id entries too (``CpuAttrs``);
  the time-split int attributes by value. The fields of flat-layout ops and of unusual ``attrs``
  texts come from the plain path's functions; GPU ops from a callback of the caller.
Cost: O(output bytes) plus O(1) dict look-ups per op; memory: the caches, each bounded to
``MAX_CACHED`` entries (``MAX_CACHED_VALUES`` for per-op values), and one chunk of output.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Callable, Iterator

import msgspec
import orjson

from linker.write import et_def_pb2 as pb
from linker.plan.comm import PROCESS_GROUP_INIT, IOParts, is_int
from linker.plan.deps import PARENT, THREAD_ORDER
from linker.write.chakra_wire import CONTINUED_PAIRS, SMALL_VARINTS, SMALL_VARINTS_END, encode_varint, make_attr
from linker.read.et import FLAT, UNSET, EtNode, decode_attr_values

MAX_INT64 = (1 << 63) - 1
MIN_INT64 = -MAX_INT64 - 1
UINT64_MASK = (1 << 64) - 1
MAX_CACHED = 1 << 16
# Caches of per-op values (fw_parent / seq_id entries, durations): a few MB at most (the write runs
# when the process is at its largest); the attrs pieces' caches keep the recent values (emptied when
# full), the durations' the first values seen.
MAX_CACHED_VALUES = 1 << 12
_TYPE_NAMES = {value: pb.NodeType.Name(value) for value in pb.NodeType.values()}

# ---------------------------------------------------------------------------------------------
# Attributes
# ---------------------------------------------------------------------------------------------

AttrSpec = tuple  # (name, AttributeProto value kind, value)


def attr_spec(name: str, value: Any) -> AttrSpec | None:
    """How an ET attribute value is stored: ints as int64 (uint64 beyond int64), floats double,
    bools, strings, int/str lists; anything else as its JSON text. None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return name, "bool_val", value
    if isinstance(value, int):
        return name, "int64_val" if MIN_INT64 <= value <= MAX_INT64 else "uint64_val", value
    if isinstance(value, float):
        return name, "double_val", value
    if isinstance(value, str):
        return name, "string_val", value
    if isinstance(value, list) and value:
        if all(is_int(v) and MIN_INT64 <= v <= MAX_INT64 for v in value):
            return name, "int64_list", tuple(value)
        if all(isinstance(v, str) for v in value):
            return name, "string_list", tuple(value)
    return name, "string_val", orjson.dumps(value).decode()


def int64_head(name: str) -> bytes:
    """An int64 attribute's ``name`` field (1) and the ``int64_val`` tag (field 9, varint)."""
    encoded = name.encode("utf-8")
    return b"\x0a" + encode_varint(len(encoded)) + encoded + b"\x48"


def int64_attr(head: bytes, value: int) -> bytes:
    """``Node.attr`` (field 10) of an int64 attribute: its head, then the varint of the two's
    complement of ``value``."""
    varint = encode_varint(value if value >= 0 else value & UINT64_MASK)
    return b"\x52" + encode_varint(len(head) + len(varint)) + head + varint


class AttrEncoder:
    """Serialises node attributes as ``Node.attr`` wire bytes, caching what repeats.

    A CPU op's attributes other than its per-op ids (``rf_id``, ``seq_id``) are encoded once per
    distinct combination; ``int64_val`` attributes are encoded directly (``int64_attr``). Each
    cache holds at most ``max_entries`` items.
    """

    def __init__(self, max_entries: int = MAX_CACHED):
        self._specs: dict[AttrSpec, bytes] = {}
        self._blobs: dict[tuple, bytes] = {}
        self._heads: dict[str, bytes] = {}
        self._max_entries = max_entries
        self.is_cpu_op = self.encode(_IS_CPU_OP)

    def int64_attrs(self, pairs: list[tuple[str, int]]) -> bytes:
        """``Node.attr`` bytes of (name, int) pairs known to fit int64 (no spec, no cache)."""
        heads = self._heads
        out = []
        for name, value in pairs:
            head = heads.get(name)
            if head is None:
                head = heads[name] = int64_head(name)
            out.append(int64_attr(head, value))
        return b"".join(out)

    def encode(self, spec: AttrSpec) -> bytes:
        """Wire bytes of one attribute as a ``Node.attr`` field."""
        name, kind, value = spec
        if kind == "int64_val":
            return self.int64_attrs([(name, value)])
        encoded = self._specs.get(spec)
        if encoded is None:
            holder = pb.Node()
            holder.attr.append(make_attr(name, value, kind))
            encoded = holder.SerializeToString()
            if len(self._specs) < self._max_entries:
                self._specs[spec] = encoded
        return encoded

    def encode_all(self, specs: Iterator[AttrSpec]) -> bytes:
        return b"".join(self.encode(spec) for spec in specs)

    def shared_bytes(self, pairs: list[tuple[str, Any]]) -> bytes:
        """The attributes other than the per-op ids, cached per distinct combination."""
        shared = tuple(pairs)
        try:
            blob = self._blobs.get(shared)
            cacheable = True
        except TypeError:  # a list value: not hashable
            blob, cacheable = None, False
        if blob is None:
            blob = self.encode_all(_specs_of(shared))
            if cacheable and len(self._blobs) < self._max_entries:
                self._blobs[shared] = blob
        return blob

    def cpu_attr_bytes(self, node: EtNode, flat: bool) -> bytes:
        """``is_cpu_op`` true, the op's ``rf_id`` / ``seq_id``, then its other ET attributes. O(#attrs)."""
        own: list = []
        shared: list = []
        for pair in _cpu_attr_pairs(node, flat):
            (own if pair[0] in PER_OP_ATTRS else shared).append(pair)
        if all(type(value) is int and MIN_INT64 <= value <= MAX_INT64 for _, value in own):
            own_bytes = self.int64_attrs(own)  # the usual rf_id / seq_id: what attr_spec gives them
        else:
            own_bytes = self.encode_all(_specs_of(own))
        return self.is_cpu_op + own_bytes + self.shared_bytes(shared)


_IS_CPU_OP = ("is_cpu_op", "bool_val", True)
_FLAT_ATTRS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema")
PER_OP_ATTRS = frozenset({"rf_id", "seq_id"})  # about unique per op: not cached in combination


def _cpu_attr_pairs(node: EtNode, flat: bool) -> list[tuple[str, Any]]:
    """The ET node's own metadata as (name, value), in file order (flat keys or ``attrs``)."""
    if flat:
        pairs = [(name, getattr(node, name)) for name in _FLAT_ATTRS]
        return [(name, value) for name, value in pairs if value is not UNSET and value is not None]
    if node.attrs is UNSET:
        return []
    return [(attr.name, attr.value) for attr in decode_attr_values(node)
            if attr.value is not None and attr.name != "is_cpu_op"]


def _specs_of(pairs) -> Iterator[AttrSpec]:
    for name, value in pairs:
        spec = attr_spec(name, value)
        if spec is not None:
            yield spec


def _micros(value: float) -> int:
    return max(0, round(value))


def busy_attrs(plan, i: int, node: EtNode) -> list[tuple[str, int]]:
    """The measured and simulated time split of a linked CPU op (int64 µs, rounded), as
    (name, value) of ``int64_val`` attributes."""
    busy = plan.busy
    gap = busy.host_gap[i]
    pairs = []
    if node.ts is not UNSET:
        pairs = [("inclusive_dur_micros", _micros(node.dur)),
                 ("exclusive_dur_micros", _micros(node.exclusive_dur)),
                 ("blocked_micros", _micros(busy.blocked[i]))]
    if gap > 0:
        pairs.append(("host_gap_micros", _micros(gap)))
    return pairs


# ---------------------------------------------------------------------------------------------
# The plain path
# ---------------------------------------------------------------------------------------------


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the payload's length, the payload."""
    return tag + encode_varint(len(payload)) + payload


def _text(raw: Any) -> str:
    """Raw JSON bytes (``msgspec.Raw`` or bytes) as text; "" when absent."""
    if raw is None or raw is UNSET:
        return ""
    return str(raw, "utf-8", "replace")


def utf8(raw: Any) -> bytes:
    """What protobuf writes for the text ``_text`` makes of raw JSON bytes."""
    text = bytes(raw)
    return text if text.isascii() else _text(raw).encode("utf-8")


def io_bytes(values: Any, shapes: Any, types: Any, strides: Any = None) -> bytes:
    """An ``IOInfo`` message's wire bytes (empty strings are not written, as protobuf does)."""
    out = b""
    for tag, raw in ((b"\x0a", values), (b"\x12", shapes), (b"\x1a", types), (b"\x22", strides)):
        if raw is None or raw is UNSET:
            continue
        text = utf8(raw)
        if text:
            out += tag + encode_varint(len(text)) + text
    return out


IO_DECODER = msgspec.json.Decoder(IOParts)


def _io_fields(node: EtNode, flat: bool) -> bytes:
    """``inputs`` (field 8) and ``outputs`` (field 9) of a CPU node: present (if empty) whenever
    the ET node has them. O(size of the raw inputs/outputs)."""
    out = b""
    if flat:
        if node.inputs is not UNSET:
            out += field(b"\x42", io_bytes(node.inputs, node.input_shapes, node.input_types))
        if node.outputs is not UNSET:
            out += field(b"\x4a", io_bytes(node.outputs, node.output_shapes, node.output_types))
        return out
    for raw, tag in ((node.inputs, b"\x42"), (node.outputs, b"\x4a")):
        if raw is UNSET or raw is None:
            continue
        try:
            parts = IO_DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            out += field(tag, io_bytes(raw, None, None))
            continue
        out += field(tag, io_bytes(parts.values, parts.shapes, parts.types,
                                   parts.strides if len(parts.strides) else None))
    return out


def _packed(tag: bytes, values: list[int]) -> bytes:
    if not values:
        return b""
    return field(tag, b"".join([encode_varint(v) for v in values]))


def _time_field(tag: bytes, value: Any) -> bytes:
    if value is UNSET or value is None:
        return b""
    micros = max(0, round(value))
    return tag + encode_varint(micros) if micros else b""


def cpu_node_bytes(node: EtNode, node_type: int, ctrl: list[int], data: list[int], duration: float,
                   flat: bool, attrs: AttrEncoder, extra_attrs: bytes = b"") -> bytes:
    """The wire bytes of a CPU op's ``Node`` (the plain path). O(size of the node)."""
    name = node.name.encode("utf-8")
    return b"".join((
        b"\x08" + encode_varint(node.id) if node.id else b"",
        field(b"\x12", name) if name else b"",
        b"\x18" + encode_varint(node_type) if node_type else b"",
        _packed(b"\x22", ctrl),
        _packed(b"\x2a", data),
        _time_field(b"\x30", node.ts),
        _time_field(b"\x38", duration),
        _io_fields(node, flat),
        attrs.cpu_attr_bytes(node, flat),
        extra_attrs,
    ))


def cpu_node_type(node: EtNode) -> int:
    return cpu_node_type_of(node.name)


# ---------------------------------------------------------------------------------------------
# The chunked path
# ---------------------------------------------------------------------------------------------


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
    for any other text: the caller takes the plain path. O(len(text)) per op."""

    def __init__(self, attrs: AttrEncoder):
        self._attrs = attrs
        self._second: dict[bytes, bytes | bool] = {}
        self._seq_id: dict[bytes, bytes | bool] = {}
        self._rest: dict[bytes, bytes | bool] = {}
        # is_cpu_op, then the rf_id attribute's tag, length and head, by the length of its varint
        self._rf_id_heads = [attrs.is_cpu_op + b"\x52" + SMALL_VARINTS[len(_RF_ID_HEAD) + size] + _RF_ID_HEAD
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

    @staticmethod
    def _cache(cache: dict, text: bytes, encoded: bytes | bool) -> bytes | bool:
        """Keeps the recent texts: emptied when full (seq_id / fw_parent values move on with time)."""
        if len(cache) >= MAX_CACHED_VALUES:
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
        if entry.name != "seq_id" or not _is_int64(entry.value):
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
        return self._attrs.encode_all(_specs_of(pairs))


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


def _is_int64(value: Any) -> bool:
    return type(value) is int and MIN_INT64 <= value <= MAX_INT64


class IoFields:
    """The ``inputs`` (tag 0x42) or ``outputs`` (0x4a) field of nested-layout ops: ``values``
    encoded per op, the shapes/types/strides fields taken from a cache by their text (a few
    hundred distinct in a training step). O(len(raw)) per op; memory O(distinct shapes/types/
    strides) fields."""

    def __init__(self, tag: bytes):
        self._tag = tag
        self._tails: dict[bytes, bytes] = {}

    def __call__(self, raw: Any) -> bytes:
        try:
            parts = IO_DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return field(self._tag, io_bytes(raw, None, None))
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
            return field(self._tag, tail)
        size_bytes = SMALL_VARINTS[size] if size < SMALL_VARINTS_END else encode_varint(size)
        total = 1 + len(size_bytes) + size + len(tail)
        total_bytes = SMALL_VARINTS[total] if total < SMALL_VARINTS_END else encode_varint(total)
        return b"".join((self._tag, total_bytes, b"\x0a", size_bytes, values, tail))


class EtOnlyFields:
    """The part of a nested-layout CPU op's ``Node`` that comes from the ET alone: its ``inputs``
    (field 8), ``outputs`` (9) and own attributes (``is_cpu_op``, then the ``attrs`` entries),
    as ``NodeFrames`` writes them between the op's times and its time split. ``node`` needs only
    ``inputs``, ``outputs`` and ``attrs`` (``chakra_ahead`` calls it on a leaner struct). O(size of
    the three raw texts) per op; memory: the caches of ``IoFields``, ``CpuAttrs``, ``attrs``."""

    def __init__(self, attrs: AttrEncoder):
        self._plain_attrs = attrs.cpu_attr_bytes
        self.cpu_attrs = CpuAttrs(attrs)
        self.inputs, self.outputs = IoFields(b"\x42"), IoFields(b"\x4a")

    def __call__(self, node) -> bytes:
        inputs, outputs, attrs = node.inputs, node.outputs, node.attrs
        head = b""
        if inputs is not UNSET and inputs is not None:
            head = self.inputs(inputs)
        if outputs is not UNSET and outputs is not None:
            head += self.outputs(outputs)
        return head + ((attrs is not UNSET and self.cpu_attrs(attrs)) or self._plain_attrs(node, False))


class _IntAttr:
    """One int64 attribute's ``Node.attr`` bytes, cached by value (small values repeat)."""

    def __init__(self, name: str):
        self._head = int64_head(name)
        self.cache: dict[int, bytes] = {}

    def miss(self, value: int) -> bytes:
        """The attribute of ``value`` (0 for a negative one), cached under ``value``."""
        encoded = int64_attr(self._head, value if value > 0 else 0)
        if len(self.cache) < MAX_CACHED_VALUES:
            self.cache[value] = encoded
        return encoded


class NodeFrames:
    """Framed ``Node`` bytes of ET ops and GPU ops, a chunk of the write order at a time.

    CPU ops are encoded here (duration: the busy time; then the op's own attributes, its time
    split and its dependency causes), GPU ops by ``gpu_payload(u, attrs)``. A nested-layout op's
    ``EtOnlyFields`` come from ``pre_encoded.chunk(order)`` when given (``chakra_ahead.PreEncoded``:
    encoded by a child while the parent linked; None where they are not there yet). The bytes
    equal the plain path's (``node_bytes``). Counts written node types into ``summary``."""

    def __init__(self, et_plus, plan, summary, gpu_payload: Callable[[int, AttrEncoder], bytes],
                 pre_encoded=None):
        self._et_plus, self._plan, self._summary = et_plus, plan, summary
        self._gpu_payload = gpu_payload
        self.attrs = AttrEncoder()
        self._et_fields = EtOnlyFields(self.attrs)
        self._pre_encoded = pre_encoded
        self._heads: dict[str, bytes] = {}  # op name -> its name and type fields
        self._ints = [_IntAttr(name) for name in _BUSY_ATTRS]
        self._causes: dict[str, bytes] = {}  # a single dependency's cause -> its attribute

    def chunk(self, order) -> bytes:
        """The frames (varint length + message) of the nodes in ``order``, joined."""
        et, plan, busy = self._et_plus.et, self._plan, self._plan.busy
        nodes, ids, n, gpu_nodes = et.nodes, et.ids, plan.cpu_count, self._et_plus.gpu_nodes
        ctrl_of, data_deps, sim, blocked, host_gap = plan.ctrl, plan.data_deps, busy.sim, busy.blocked, busy.host_gap
        prev, waits = plan.prev, plan.waits
        parent_cause, order_cause = self._cause(PARENT), self._cause(THREAD_ORDER)
        heads, causes_of, plain_attrs, pre_encoded = self._heads, self._causes, self.attrs.cpu_attr_bytes, self._pre_encoded
        # The ET's own fields of each op of the chunk, from the child where it has encoded them.
        fields_of = pre_encoded.chunk(order) if pre_encoded is not None else repeat(None)
        cpu_attrs, inputs, outputs = self._et_fields.cpu_attrs, self._et_fields.inputs, self._et_fields.outputs
        inclusive, exclusive, blocked_attr, gap_attr = self._ints
        inclusive_get, exclusive_get, blocked_get = inclusive.cache.get, exclusive.cache.get, blocked_attr.cache.get
        flat, small, end, varint, pairs = et.layout == FLAT, SMALL_VARINTS, SMALL_VARINTS_END, encode_varint, CONTINUED_PAIRS
        # Node ids: the varint inlined below 2**28 (see ``chakra_io.CONTINUED_PAIRS``). Start times
        # (µs since the epoch, >= 2**28): the varint of the bits above the low 14 kept from the
        # last op (the same for 16 ms), as ``encode_varint`` would write them.
        ts_high, ts_tail = None, b""
        out: list[bytes] = []
        append = out.append
        cpu_comm = plan.cpu_comm
        for u, fields in zip(order, fields_of):
            if u >= n or u in cpu_comm:  # GPU ops and CPU collectives: built as messages
                payload = self._gpu_payload(u, self.attrs)
            else:
                node = nodes[u]
                head = heads.get(node.name) or self._head(node.name)
                i = node.id
                if i:
                    i = small[i] if 0 <= i < end else pairs[i & 0x3FFF] + small[i >> 14] if 0 < i < 1 << 28 else varint(i)
                    parts = [b"\x08", i, head]
                else:
                    parts = [head]
                p = ctrl_of[u]
                if p >= 0:
                    c = ids[p]
                    c = small[c] if 0 <= c < end else pairs[c & 0x3FFF] + small[c >> 14] if 0 < c < 1 << 28 else varint(c)
                    parts += (b"\x22", small[len(c)], c)
                d = prev[u]
                if u in waits:  # several data dependencies (``plan.data_deps``)
                    deps = data_deps(u)
                    d, cause = deps[0] if len(deps) == 1 else (-1, None)
                    if d >= 0:
                        causes = causes_of.get(cause) or self._cause(cause)
                    else:
                        causes = self._many_deps(deps, parts) if deps else b""
                else:  # the thread's previous op or none: ``plan.data_deps`` inlined
                    causes = (parent_cause if d == p else order_cause) if d >= 0 else b""
                if d >= 0:
                    d = ids[d] if d < n else gpu_nodes[d - n].id
                    d = small[d] if 0 <= d < end else pairs[d & 0x3FFF] + small[d >> 14] if 0 < d < 1 << 28 else varint(d)
                    parts += (b"\x2a", small[len(d)], d)
                ts = node.ts
                if ts is not UNSET and ts is not None:
                    t = round(ts)
                    if t >> 14 == ts_high:  # the usual start time: the same high bits as the last one
                        parts += (b"\x30", pairs[t & 0x3FFF] + ts_tail)
                    elif t > 0:
                        parts += (b"\x30", small[t] if t < end else varint(t))
                        if t >= 1 << 28:
                            ts_high = t >> 14
                            ts_tail = pairs[ts_high & 0x3FFF] + varint(t >> 28)
                t = round(sim[u])
                if t > 0:
                    parts += (b"\x38", small[t] if t < end else varint(t))
                if flat:
                    parts += (_io_fields(node, True), plain_attrs(node, True))
                elif fields is not None:
                    parts.append(fields)
                else:  # ``EtOnlyFields`` inlined
                    if node.inputs is not UNSET and node.inputs is not None:
                        parts.append(inputs(node.inputs))
                    if node.outputs is not UNSET and node.outputs is not None:
                        parts.append(outputs(node.outputs))
                    parts.append((node.attrs is not UNSET and cpu_attrs(node.attrs)) or plain_attrs(node, False))
                if ts is not UNSET:  # the caches hold negative values too (written as 0)
                    t, e, b = round(node.dur), round(node.exclusive_dur), round(blocked[u])
                    parts += (inclusive_get(t) or inclusive.miss(t), exclusive_get(e) or exclusive.miss(e),
                              blocked_get(b) or blocked_attr.miss(b))
                gap = host_gap[u]
                if gap > 0:
                    t = round(gap)
                    parts.append(gap_attr.cache.get(t) or gap_attr.miss(t))
                parts.append(causes)
                payload = b"".join(parts)
            size = len(payload)
            if not size:
                raise ValueError("empty Node (every field default): readers would take it for end-of-file")
            append(small[size] if size < end else varint(size))
            append(payload)
        self._count(order)
        return b"".join(out)

    def _head(self, name: str) -> bytes:
        encoded = name.encode("utf-8")
        node_type = cpu_node_type_of(name)
        head = (field(b"\x12", encoded) if encoded else b"") + (b"\x18" + encode_varint(node_type) if node_type else b"")
        self._heads[name] = head
        return head

    def _cause(self, cause: str) -> bytes:
        encoded = self._causes[cause] = self.attrs.encode(("data_dep_causes", "string_list", (cause,)))
        return encoded

    def _many_deps(self, deps: list[tuple[int, str]], parts: list) -> bytes:
        """Appends a ``data_deps`` field of several ids to ``parts``; returns their causes attribute."""
        et, n = self._et_plus.et, self._plan.cpu_count
        ids = [et.ids[d] if d < n else self._et_plus.gpu_nodes[d - n].id for d, _ in deps]
        data = b"".join([encode_varint(i) for i in ids])
        parts += (b"\x2a", encode_varint(len(data)), data)
        return self.attrs.encode(("data_dep_causes", "string_list", tuple(cause for _, cause in deps)))

    def _count(self, order) -> None:
        """Counts the chunk's CPU ops by type (its GPU ops count themselves)."""
        n, nodes = self._plan.cpu_count, self._et_plus.et.nodes
        cpu = [u for u in order if u < n and u not in self._plan.cpu_comm]  # CPU collectives count themselves
        metadata = sum(1 for u in cpu if nodes[u].name == PROCESS_GROUP_INIT) if self._has_metadata() else 0
        counts = self._summary.counts_by_type
        counts[_TYPE_NAMES[pb.COMP_NODE]] += len(cpu) - metadata
        if metadata:
            counts[_TYPE_NAMES[pb.METADATA_NODE]] += metadata

    def _has_metadata(self) -> bool:
        return PROCESS_GROUP_INIT in self._heads


_BUSY_ATTRS = ("inclusive_dur_micros", "exclusive_dur_micros", "blocked_micros", "host_gap_micros")


def cpu_node_type_of(name: str) -> int:
    return pb.METADATA_NODE if name == PROCESS_GROUP_INIT else pb.COMP_NODE

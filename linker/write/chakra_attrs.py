"""``Node.attr`` fields as wire bytes: which ``AttributeProto`` kind an ET value is stored as
(``attr_spec``), and the encoder that writes them, caching what repeats (``AttrEncoder``).

A CPU op's attributes are ``is_cpu_op`` (true), its per-op ids (``rf_id``, ``seq_id``) in file
order, then its other ET metadata in file order (flat keys, or the ``attrs`` entries; null values
and the ET's own ``is_cpu_op`` left out). Cost: O(#attrs) per op; memory: the caches, each bounded
to ``MAX_CACHED`` entries.
"""

from __future__ import annotations

from typing import Any, Iterator

import orjson

from linker.model import et_def_pb2 as pb
from linker.plan.comm import is_int
from linker.read.et import UNSET, EtNode, decode_attr_values
from linker.write.chakra_wire import make_attr
from linker.write.protobuf_wire import (MAX_INT64, MIN_INT64, UINT64_MASK, delimited, encode_varint, is_int64, tag,
                                        tags)

MAX_CACHED = 1 << 16
# Caches of per-op values (fw_parent / seq_id entries, durations): a few MB at most (the write runs
# when the process is at its largest); the attrs pieces' caches keep the recent values (emptied when
# full), the durations' the first values seen.
MAX_CACHED_VALUES = 1 << 12

ATTR = tag(pb.Node, "attr")
_NAME, _INT64_VAL = tags(pb.AttributeProto, "name", "int64_val")

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
    """An int64 attribute's ``name`` field and the ``int64_val`` tag."""
    return delimited(_NAME, name.encode("utf-8")) + _INT64_VAL


def int64_attr(head: bytes, value: int) -> bytes:
    """``Node.attr`` of an int64 attribute: its head (``int64_head``), then the value's varint."""
    varint = encode_varint(value if value >= 0 else value & UINT64_MASK)  # int64: two's complement
    return ATTR + encode_varint(len(head) + len(varint)) + head + varint


class AttrEncoder:
    """Serialises node attributes as ``Node.attr`` wire bytes, caching what repeats.

    A CPU op's attributes other than its per-op ids (``rf_id``, ``seq_id``) are encoded once per
    distinct combination; ``int64_val`` attributes are encoded directly (``int64_attr``), the
    other kinds through protobuf once per distinct (name, kind, value). Each cache holds at most
    ``max_entries`` items.
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

    def encode_pairs(self, pairs) -> bytes:
        """The (name, value) pairs' attributes, each stored as ``attr_spec`` says (nulls left out)."""
        return self.encode_all(specs_of(pairs))

    def shared_bytes(self, pairs: list[tuple[str, Any]]) -> bytes:
        """The attributes other than the per-op ids, cached per distinct combination."""
        shared = tuple(pairs)
        try:
            blob = self._blobs.get(shared)
            cacheable = True
        except TypeError:  # a list value: not hashable
            blob, cacheable = None, False
        if blob is None:
            blob = self.encode_pairs(shared)
            if cacheable and len(self._blobs) < self._max_entries:
                self._blobs[shared] = blob
        return blob

    def cpu_attr_bytes(self, node: EtNode, flat: bool) -> bytes:
        """``is_cpu_op`` true, the op's ``rf_id`` / ``seq_id``, then its other ET attributes. O(#attrs)."""
        own: list = []
        shared: list = []
        for pair in cpu_attr_pairs(node, flat):
            (own if pair[0] in PER_OP_ATTRS else shared).append(pair)
        if all(is_int64(value) for _, value in own):
            own_bytes = self.int64_attrs(own)  # the usual rf_id / seq_id: what attr_spec gives them
        else:
            own_bytes = self.encode_pairs(own)
        return self.is_cpu_op + own_bytes + self.shared_bytes(shared)


_IS_CPU_OP = ("is_cpu_op", "bool_val", True)
_FLAT_ATTRS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema")
PER_OP_ATTRS = frozenset({"rf_id", "seq_id"})  # about unique per op: not cached in combination


def cpu_attr_pairs(node: EtNode, flat: bool) -> list[tuple[str, Any]]:
    """The ET node's own metadata as (name, value), in file order (flat keys or ``attrs``)."""
    if flat:
        pairs = [(name, getattr(node, name)) for name in _FLAT_ATTRS]
        return [(name, value) for name, value in pairs if value is not UNSET and value is not None]
    if node.attrs is UNSET:
        return []
    return [(attr.name, attr.value) for attr in decode_attr_values(node)
            if attr.value is not None and attr.name != "is_cpu_op"]


def specs_of(pairs) -> Iterator[AttrSpec]:
    """The ``attr_spec`` of each (name, value) pair, nulls left out."""
    for name, value in pairs:
        spec = attr_spec(name, value)
        if spec is not None:
            yield spec

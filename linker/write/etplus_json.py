"""Write the ET+ as JSON: the input document with the ET+ fields and GPU nodes added.

Untouched parts (inputs, outputs, unknown keys) are written back from the raw bytes they were read
as. The bytes are exactly ``msgspec.json.encode`` of the document with ``nodes`` = all ET+ nodes,
produced in pieces: the header once, then the nodes a few thousand at a time (the later-piece
nodes made from their columns a chunk at a time, ``link.etplus.PieceRows``), each encoded into a
reused buffer handed to a writer thread (``write.sink.BackgroundWriter``, at most
``WRITE_QUEUE_PIECES`` waiting) while the next is encoded. Memory: a few pieces, not a second copy
of the document. ``.gz`` paths are gzip-compressed (in the writer thread). The file
appears only when complete (``write.sink.atomic_output``); its blocks are reserved at once from the size
the first piece suggests (``write.sink.reserve_space``). Cost: O(output bytes).
"""

from __future__ import annotations

import os
from typing import Iterator

import msgspec

from linker.link.etplus import EtPlus
from linker.write.sink import BackgroundWriter, OutputRoom, atomic_output, reserve_space

NODES_PER_PIECE = 4096
WRITE_QUEUE_PIECES = 3  # pieces (~4.5 MB each on large traces) waiting for the writer: gzip is the slow side
_NODES_KEY = b'"nodes":[0]'  # a placeholder list: an empty one is omitted (omit_defaults)
_COMMA = ord(",")


def _write_document(et_plus: EtPlus, writer: BackgroundWriter, nodes_per_piece: int) -> Iterator[int]:
    """Queue the ET+ JSON document on ``writer``, in order: the header, then the nodes
    ``nodes_per_piece`` at a time, each encoded into one of the writer's buffers (its list's
    brackets cut, the first replaced by the comma that follows the previous piece), then the
    document's end. Yields the bytes queued so far after each piece."""
    doc = et_plus.et.header
    original = doc.nodes
    doc.nodes = [0]
    try:
        frame = msgspec.json.encode(doc)
    finally:
        doc.nodes = original
    # Only a key can match: a quote inside a JSON string is escaped.
    open_at = frame.index(_NODES_KEY) + len(_NODES_KEY) - 2
    writer.write(frame[:open_at])
    written = open_at
    encode_into = msgspec.json.Encoder().encode_into
    first = True
    rows = et_plus.piece_rows
    for nodes in (et_plus.et.nodes, et_plus.gpu_nodes, rows or ()):
        for start in range(0, len(nodes), nodes_per_piece):
            buffer = writer.buffer()
            chunk = nodes[start:start + nodes_per_piece] if nodes is not rows else rows.nodes(start, start + nodes_per_piece)
            encode_into(chunk, buffer)  # "[...]", at its length
            end, lead = len(buffer) - 1, int(first)
            if not first:
                buffer[0] = _COMMA
            writer.write_buffer(buffer, lead, end)
            written += end - lead
            first = False
            yield written
    writer.write(frame[open_at + 1:])


def write_et_plus_json(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = (),
                       nodes_per_piece: int = NODES_PER_PIECE, room: OutputRoom | None = None) -> None:
    """Write ``et_plus`` as ET+ JSON to ``path`` (``atomic_output``, into ``room``'s file when
    given), its nodes encoded ``nodes_per_piece`` at a time (the bytes are the same for any number)."""
    with atomic_output(path, protected, room) as out:
        writer = BackgroundWriter(out, depth=WRITE_QUEUE_PIECES)
        try:
            for k, written in enumerate(_write_document(et_plus, writer, nodes_per_piece)):
                if k == 0:  # the header and the first nodes: the file's size, extrapolated
                    reserve_space(out, _expected_size(et_plus, written))
        finally:
            writer.close()


def _expected_size(et_plus: EtPlus, first_bytes: int) -> int:
    """The document's size guessed from its first ``first_bytes`` (header + first piece of nodes),
    GPU nodes counted as large as CPU nodes: a guess for ``reserve_space``, which forgives errors."""
    nodes = len(et_plus.et.nodes) + len(et_plus.gpu_nodes) + len(et_plus.piece_rows or ())
    sampled = min(nodes, NODES_PER_PIECE)
    return first_bytes * nodes // max(sampled, 1) + (1 << 16)

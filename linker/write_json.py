"""Write the ET+ as JSON: the input document with the ET+ fields and GPU nodes added.

Untouched parts (inputs, outputs, unknown keys) are written back from the raw bytes they were read
as. One msgspec encode of the whole document; ``.gz`` paths are gzip-compressed. The file appears
only when complete (``fileio.atomic_output``).
"""

from __future__ import annotations

import os

import msgspec

from .etplus import EtPlus
from .fileio import atomic_output


def write_et_plus_json(et_plus: EtPlus, path: str | os.PathLike, protected: tuple = ()) -> None:
    doc = et_plus.et.header
    original = doc.nodes
    doc.nodes = et_plus.all_nodes()
    try:
        data = msgspec.json.encode(doc)
    finally:
        doc.nodes = original
    with atomic_output(path, protected) as out:
        out.write(data)

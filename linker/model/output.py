"""What an ET+ output is: its path, its format and whether it is gzip-compressed, decided once.

``Output.of(path)`` reads the format from the path's suffix (``.et``/``.et.gz``: Chakra protobuf;
anything else: ET+ JSON) and the compression from a final ``.gz``. Everything downstream (the
plan, the writers, the schedule) asks the value, never the path string. Cost: O(1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

JSON = "json"
CHAKRA = "et"
CHAKRA_SUFFIXES = (".et", ".et.gz")


@dataclass(frozen=True)
class Output:
    """An ET+ output file: ``format`` is ``JSON`` or ``CHAKRA``; ``compressed``: gzip."""

    path: Path
    format: str
    compressed: bool

    @classmethod
    def of(cls, path: str | os.PathLike) -> Output:
        """The output at ``path``, its format and compression read from the suffix."""
        name = str(path)
        return cls(Path(path), CHAKRA if name.endswith(CHAKRA_SUFFIXES) else JSON, name.endswith(".gz"))

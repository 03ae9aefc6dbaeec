"""Check a trace file against the invariants its consumers rely on (``et-link validate``).

Formats: Chakra protobuf (``.et``, ``.et.gz``) and ET / ET+ JSON (``.json``, ``.json.gz``, both node
layouts: ``parent`` in schema 1.0.1, ``ctrl_deps`` in later schemas). The format is chosen by the
file content (JSON starts with ``{``), not by the suffix alone.

Invariants (ASTRA-sim's feeder aborts on the graph ones):
- node ids are unique;
- every ``ctrl_deps`` / ``data_deps`` / ``parent`` id is a node of the file (the ET process root,
  whose parent is itself, and in ET+ JSON a rank's start delay node (docs/rank-start.md), a root
  like it, are the allowed self-references);
- the graph of ctrl + data dependencies is acyclic (a node on a cycle is named);
- Chakra: the first message is a non-empty ``GlobalMetadata``; COMM nodes carry ``comm_type``
  (collectives) and ``comm_size`` > 0 as ``int64_val``, are not CPU ops, and collectives whose
  ``comm_type`` ASTRA-sim cannot simulate are warned about; so is a dependency written after the
  node that has it (et-link writes a topological order: a streaming reader meets it late).

Cost: one streaming pass over a Chakra file (one msgspec pass for JSON), then O(nodes + deps)
time for the graph checks. Memory: O(nodes + deps) in flat arrays plus one id -> index dict
(JSON: the file's bytes plus the few keys checked per node).

| module | what |
|---|---|
| ``report`` | violation kinds, ``Violation``, ``ValidationResult``, the log that counts them, ``format_result`` |
| ``graph`` | ``DependencyTable`` and the checks both formats share: ids, dangling dependencies, cycles |
| ``chakra`` | ``validate_chakra``: framing, metadata, node types, communication attributes |
| ``et_json`` | ``validate_json``: ET / ET+ JSON, both node layouts |
"""

from __future__ import annotations

import os
from pathlib import Path

from linker.read.files import looks_like_json
from linker.write.chakra_wire import TraceFormatError, open_binary
from linker.write.validate.chakra import validate_chakra
from linker.write.validate.et_json import validate_json
from linker.write.validate.report import (DEFAULT_MAX_EXAMPLES, ERROR, VIOLATION_KINDS, WARNING, ValidationResult,
                                          Violation, format_result)

__all__ = ["DEFAULT_MAX_EXAMPLES", "ERROR", "VIOLATION_KINDS", "WARNING", "ValidationResult", "Violation",
           "format_result", "validate_chakra", "validate_file", "validate_json"]


def _looks_like_json(path: Path) -> bool:
    """True when the (decompressed) content starts with '{' after whitespace. Reads a few KiB."""
    stream = open_binary(path)
    try:
        head = stream.read(4096)
    except (OSError, EOFError):
        return False
    finally:
        stream.close()
    return looks_like_json(head)


def validate_file(path: str | os.PathLike, max_examples: int = DEFAULT_MAX_EXAMPLES) -> ValidationResult:
    """Validate a Chakra protobuf or ET/ET+ JSON file; the format is detected from the content.

    ``max_examples``: node ids kept per violation kind. Raises ``TraceFormatError`` for a file
    that cannot be decoded. See ``validate_chakra`` / ``validate_json`` for costs.
    """
    p = Path(path)
    if _looks_like_json(p):
        return validate_json(p, max_examples)
    if p.name.endswith((".json", ".json.gz")):  # named JSON, but is not: maybe a renamed Chakra file
        try:
            return validate_chakra(p, max_examples)
        except TraceFormatError as err:
            raise TraceFormatError(p, "not JSON (it does not start with '{') and not a Chakra trace "
                                   f"either ({err.problem})") from None
    return validate_chakra(p, max_examples)

"""What ``et-link validate`` reports: the kinds of violation (name, severity, meaning), each
kind's count and first examples (``Violation``), a file's ``ValidationResult`` and its text
(``format_result``). ``ViolationLog`` counts them as the checks go. Plain data; O(1) per add.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MAX_EXAMPLES = 20

ERROR = "error"
WARNING = "warning"

FORMAT_CHAKRA = "chakra"
FORMAT_ET_JSON = "et-json"


@dataclass(frozen=True)
class ViolationKind:
    """A kind of violation: its name (stable, for scripts), severity and one-line meaning."""

    name: str
    severity: str
    description: str


_KIND_LIST = (
    ViolationKind("metadata_empty", ERROR, "the GlobalMetadata message is empty (reads as end-of-file)"),
    ViolationKind("metadata_not_first", ERROR, "the first message is a Node, not a GlobalMetadata"),
    ViolationKind("metadata_unknown_fields", WARNING, "GlobalMetadata has fields this schema does not know"),
    ViolationKind("empty_message", ERROR, "zero-length Node message (the reference reader stops there)"),
    ViolationKind("bad_id", ERROR, "node id missing or not an integer"),
    ViolationKind("duplicate_id", ERROR, "node id used by more than one node"),
    ViolationKind("missing_parent", ERROR, "JSON node has neither 'parent' nor 'ctrl_deps'"),
    ViolationKind("bad_dependency", ERROR, "dependency value is not an integer id"),
    ViolationKind("dangling_parent", ERROR, "'parent' id is not a node of the file"),
    ViolationKind("dangling_ctrl_dep", ERROR, "ctrl_deps id is not a node of the file"),
    ViolationKind("dangling_data_dep", ERROR, "data_deps id is not a node of the file"),
    ViolationKind("cycle", ERROR, "cycle in the ctrl+data dependency graph (count: disjoint cycles found)"),
    ViolationKind("dependency_written_later", WARNING,
                  ".et dependency written after the node that has it (a streaming reader meets it late)"),
    ViolationKind("unknown_node_type", ERROR, "node type is not a NodeType value"),
    ViolationKind("invalid_node_type", WARNING, "node type is INVALID_NODE (skipped by ASTRA-sim)"),
    ViolationKind("comm_on_cpu", ERROR, "COMM node marked is_cpu_op=true (ASTRA-sim: comm node should not be on CPU)"),
    ViolationKind("comm_type_missing", ERROR, "collective node without a comm_type attribute"),
    ViolationKind("comm_type_unknown", ERROR, "comm_type is not a CollectiveCommType value"),
    ViolationKind("comm_type_unsupported", WARNING, "collective type ASTRA-sim cannot simulate"),
    ViolationKind("comm_size_missing", ERROR, "COMM node without a comm_size attribute"),
    ViolationKind("comm_size_not_positive", ERROR, "comm_size is not > 0"),
    ViolationKind("comm_peer_missing", ERROR, "send node without comm_dst / recv node without comm_src"),
    ViolationKind("comm_attr_kind", WARNING, "comm attribute not stored as int64_val"),
)
VIOLATION_KINDS: dict[str, ViolationKind] = {kind.name: kind for kind in _KIND_LIST}
_KIND_ORDER = {kind.name: position for position, kind in enumerate(_KIND_LIST)}


@dataclass
class Violation:
    """All occurrences of one kind: total ``count``, the first offending ``node_ids`` and, aligned
    with them, a short ``details`` text each (e.g. the missing dependency)."""

    kind: str
    severity: str
    description: str
    count: int = 0
    node_ids: list[int] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


@dataclass
class ValidationResult:
    """Outcome of ``validate_file``. ``ok`` is True when there is no error (warnings allowed).

    ``counts_by_type``: Chakra NodeType name -> count; for JSON ``{"cpu": n, "gpu": m}`` where a
    GPU node is one whose ``cat`` is kernel / gpu_memcpy / gpu_memset.
    """

    path: str
    file_format: str
    layout: str
    schema: str | None
    node_count: int
    counts_by_type: dict[str, int]
    violations: list[Violation]
    ok: bool

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == ERROR]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == WARNING]

    def violation(self, kind: str) -> Violation | None:
        """The violation of that kind, or None when the file has none."""
        return next((v for v in self.violations if v.kind == kind), None)


class ViolationLog:
    """Counts violations by kind, keeping the first ``max_examples`` node ids of each. O(1) per add."""

    def __init__(self, max_examples: int):
        self._max_examples = max_examples
        self._by_kind: dict[str, Violation] = {}

    def add(self, kind_name: str, node_id: int, detail: str = "") -> None:
        violation = self._by_kind.get(kind_name)
        if violation is None:
            kind = VIOLATION_KINDS[kind_name]
            violation = self._by_kind[kind_name] = Violation(kind.name, kind.severity, kind.description)
        violation.count += 1
        if len(violation.node_ids) < self._max_examples:
            violation.node_ids.append(node_id)
            violation.details.append(detail)

    def violations(self) -> list[Violation]:
        """Errors first, then warnings; within a severity in the order of ``VIOLATION_KINDS``."""
        return sorted(self._by_kind.values(), key=lambda v: (v.severity != ERROR, _KIND_ORDER[v.kind]))



def make_result(
    path: Path, file_format: str, layout: str, schema: str | None, node_count: int,
    counts: dict[str, int], log: ViolationLog,
) -> ValidationResult:
    violations = log.violations()
    ok = not any(v.severity == ERROR for v in violations)
    return ValidationResult(str(path), file_format, layout, schema, node_count, counts, violations, ok)


def format_result(result: ValidationResult, examples: int = 5) -> str:
    """Human-readable report: verdict, node counts, then each violation with a few examples."""
    verdict = "OK" if result.ok else "FAILED"
    kind = "Chakra protobuf" if result.file_format == FORMAT_CHAKRA else f"ET JSON, '{result.layout}' layout"
    schema = f", schema {result.schema}" if result.schema else ""
    lines = [f"{result.path}: {verdict} ({kind}, {result.node_count:,} nodes{schema})"]
    counts = ", ".join(f"{name} {count:,}" for name, count in sorted(result.counts_by_type.items()))
    lines.append(f"  nodes by type: {counts or 'none'}")
    for violation in result.violations:
        lines.append(
            f"  {violation.severity.upper():7} {violation.kind} x{violation.count:,}: {violation.description}"
        )
        for node_id, detail in list(zip(violation.node_ids, violation.details))[:examples]:
            lines.append(f"          node {node_id}" + (f": {detail}" if detail else ""))
        hidden = violation.count - min(examples, len(violation.node_ids))
        if hidden > 0:
            lines.append(f"          ... {hidden:,} more")
    if not result.violations:
        lines.append("  no violations")
    return "\n".join(lines)
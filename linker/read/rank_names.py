"""A trace file's rank from its name: one set of rules for ``et-link batch`` and ``et-link simulate``.

``rank_from_name`` (batch pairing) tries the keyword patterns (``rank3``, ``worker3_…``, ``…_eg_3``,
``kineto_3``) on the file name, then on its directory's name, then the only number in the name, and
reports every ambiguity; ``rank_in_name`` (simulate) takes the first ``rank<N>`` keyword of the file
name or of its directory's name. Cost: O(len(path)).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

RANK_KEYWORD = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)

# File-name patterns for a rank, tried in this order (case-insensitive); the first pattern that
# matches decides. A name without any of them may still hold exactly one number.
NAME_RANK_PATTERNS = (
    RANK_KEYWORD,
    re.compile(r"worker[-_]?(\d+)", re.IGNORECASE),
    # not "." as separator: "kineto.1700000000.json" holds a timestamp, not a rank
    re.compile(r"(?<![a-z0-9])(?:eg|et|kineto|trace|chakra)[-_](\d+)(?!\d)", re.IGNORECASE),
)
TRACE_SUFFIXES = (".gz", ".json", ".et", ".pt", ".trace")


@dataclass
class RankOfFile:
    """A file's rank and where it came from (``source``: "distributedInfo", "file name",
    "--rank-pattern"); ``rank`` None with a ``problem`` when none could be found.
    ``keyword``: the name-derived rank came from a keyword pattern (rank3, worker3…), not from a
    lone number."""

    path: Path
    rank: int | None
    source: str
    problem: str | None = None
    keyword: bool = False
    world_size: int | None = None


def _name_stem(name: str) -> str:
    """The file name without trace suffixes (``rank3.kineto.json.gz`` -> ``rank3.kineto``)."""
    changed = True
    while changed:
        changed = False
        for suffix in TRACE_SUFFIXES:
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                name, changed = name[: -len(suffix)], True
    return name


def rank_from_name(path: Path, pattern: re.Pattern | None = None) -> RankOfFile:
    """A file's rank from its name. O(len(path)).

    With ``pattern`` (``--rank-pattern``): its group ``rank`` (or first group) on the file name,
    else on the whole path. Otherwise: the keyword patterns (``NAME_RANK_PATTERNS``) on the file
    name, then on its directory's name; else the only number in the file name. Several different
    candidates, or none, give a ``problem``.
    """
    if pattern is not None:
        match = pattern.search(path.name) or pattern.search(str(path))
        if not match:
            return RankOfFile(path, None, "--rank-pattern", f"--rank-pattern {pattern.pattern!r} does not match")
        group = match.group("rank") if "rank" in pattern.groupindex else match.group(1)
        if group is None or not group.isdigit():
            return RankOfFile(path, None, "--rank-pattern", f"--rank-pattern matched {match.group(0)!r}, not a number")
        return RankOfFile(path, int(group), "--rank-pattern")
    for part in (path.name, path.parent.name):
        for keyword in NAME_RANK_PATTERNS:
            numbers = sorted({int(n) for n in keyword.findall(part)})
            if len(numbers) == 1:
                return RankOfFile(path, numbers[0], "file name", keyword=True)
            if numbers:
                return RankOfFile(path, None, "file name",
                                  f"name {part!r} holds several ranks {numbers}; use --rank-pattern")
    numbers = sorted({int(n) for n in re.findall(r"\d+", _name_stem(path.name))})
    if len(numbers) == 1:
        return RankOfFile(path, numbers[0], "file name")
    if numbers:
        return RankOfFile(path, None, "file name",
                          f"no rank: the name holds several numbers {numbers}; use --rank-pattern")
    return RankOfFile(path, None, "file name", "no rank in the file name")


def rank_in_name(path: str | os.PathLike) -> int | None:
    """The rank a file name states ("rank3_plus.et", "rank_3/…"), or None."""
    match = RANK_KEYWORD.search(Path(path).name) or RANK_KEYWORD.search(Path(path).parent.name)
    return int(match.group(1)) if match else None

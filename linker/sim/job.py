"""Which files make the job ``et-link simulate`` replays, each file's rank, and the process groups.

Inputs: files (``.et``, ``.et.gz``, ET+ JSON) or a batch output directory, whose replayable files
are its ``*.et``, ``*.et.gz``, ``*_plus.json`` and ``*_plus.json.gz``. A file's rank comes from
its name (``rank3_plus.et``, ``rank_3/…``); when some name states none, ranks are the files'
positions in the sorted list. Process groups: the ``--comm-groups`` JSON file
(``{"<pg id>": [global ranks]}``), else ``comm_groups.json`` beside the inputs (as ``et-link
batch`` writes it), else none (every collective is among all ranks). Cost: O(files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from linker.model.errors import TraceInputError
from linker.read.files import open_input
from linker.read.rank_names import rank_in_name

COMM_GROUPS_FILE = "comm_groups.json"
_REPLAYABLE_SUFFIXES = (".et", ".et.gz", "_plus.json", "_plus.json.gz")


@dataclass
class JobInputs:
    """The files to replay with their ranks (sorted by rank), the comm-group file used (or None),
    and remarks for the report."""

    files: list[tuple[Path, int]]
    comm_groups_path: Path | None
    notes: list[str]


def _directory_files(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(_REPLAYABLE_SUFFIXES))
    if not files:
        raise TraceInputError(directory, "no .et, .et.gz, *_plus.json or *_plus.json.gz file in this directory")
    return files


def resolve_inputs(paths: list[Path], comm_groups: Path | None = None) -> JobInputs:
    """Expand directories, give every file a rank, find the comm-group file. Raises TraceInputError."""
    files: list[Path] = []
    directories: list[Path] = []
    for path in paths:
        if path.is_dir():
            directories.append(path)
            files += _directory_files(path)
        elif not path.exists():
            raise TraceInputError(path, "no such file")
        else:
            files.append(path)
    notes: list[str] = []
    named = [rank_in_name(p) for p in files]
    if len(files) > 1 and None in named:
        ranks = list(range(len(files)))
        files = sorted(files)
        notes.append("some file names state no rank: ranks are the files' positions in name order")
    else:
        ranks = [r if r is not None else 0 for r in named]
        seen: dict[int, Path] = {}
        for path, rank in zip(files, ranks):
            if rank in seen:
                raise TraceInputError(path, f"rank {rank} is also the rank of {seen[rank]}; give each rank once")
            seen[rank] = path
    pairs = sorted(zip(files, ranks), key=lambda pair: pair[1])
    if comm_groups is None and len(pairs) > 1:
        candidates = {d / COMM_GROUPS_FILE for d in directories} | {p.parent / COMM_GROUPS_FILE for p, _ in pairs}
        found = sorted(c for c in candidates if c.is_file())
        if found:
            comm_groups = found[0]
            notes.append(f"process groups from {comm_groups}")
    return JobInputs(pairs, comm_groups, notes)


def read_comm_groups(path: str | os.PathLike) -> dict[str, list[int]]:
    """``{"<pg id>": [global ranks]}`` from a JSON file. Raises TraceInputError when malformed."""
    p = Path(path)
    with open_input(p) as stream:
        text = stream.read()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise TraceInputError(p, f"not JSON ({err})") from None
    if not isinstance(data, dict):
        raise TraceInputError(p, 'a comm-group file is a JSON object {"<pg id>": [ranks]}')
    groups: dict[str, list[int]] = {}
    for key, ranks in data.items():
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise TraceInputError(p, f"process group {key!r}: expected a list of integer ranks")
        groups[str(key)] = ranks
    return groups

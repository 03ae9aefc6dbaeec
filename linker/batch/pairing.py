"""Pair ET and Kineto files by rank (step 1 of ``et-link batch``).

A Kineto file's rank comes from its ``distributedInfo.rank`` (read from the file's header only,
``read_distributed_info``), otherwise from the file name (``linker.read.rank_names``); ``--rank-pattern``
takes every rank from the name instead. Every problem (no rank, duplicated rank, rank on one side
only, name contradicting the content) is collected and reported before any work starts.
Cost: O(files) plus one header read per Kineto file.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from linker.read.files import GZIP_MAGIC
from linker.batch.collectives import format_ranks
from linker.read.rank_names import RankOfFile, rank_from_name
from linker.read.timing_ranks import timing_rank_files
from linker.batch.errors import BatchSetupError

HEAD_BYTES = 1 << 20  # distributedInfo must appear within this many uncompressed bytes
HEAD_CHUNK = 64 << 10


@dataclass
class DistributedInfo:
    rank: int | None
    world_size: int | None


@dataclass
class RankPair:
    rank: int
    et: Path | None  # None: Kineto-only (the host graph is built from the Kineto trace)
    kineto: Path
    rank_source: str


@dataclass
class Pairing:
    """``pairs`` sorted by rank; ``problems`` block the batch; ``notes`` are printed only."""

    pairs: list[RankPair]
    problems: list[str]
    notes: list[str]
    world_size: int | None = None


def _open_decompressed(path: Path):
    """A binary stream of the file's content, gunzipped when it starts with the gzip magic."""
    raw = open(path, "rb")
    if raw.read(2) == GZIP_MAGIC:
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb")
    raw.seek(0)
    return raw


def _decode_object_at(buffer: bytes, start: int) -> object | None:
    """The JSON value starting at ``buffer[start:]`` (after the colon), or None if incomplete."""
    text = buffer[start:].decode("utf-8", errors="replace").lstrip()
    if text.startswith(":"):
        text = text[1:]
    try:
        value, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        return None
    return value


def read_distributed_info(path: str | os.PathLike, head_bytes: int = HEAD_BYTES) -> DistributedInfo | None:
    """``distributedInfo`` {rank, world_size} of a Kineto file, or None when the header lacks it.

    Reads (and gunzips) only the file's header: Kineto writes ``distributedInfo`` before
    ``traceEvents``, so the search stops at ``traceEvents`` or after ``head_bytes``. Unreadable or
    corrupt files give None (linking reports their error later). Cost: O(header), typically a few KiB.
    """
    key, stop = b'"distributedInfo"', b'"traceEvents"'
    buffer = b""
    try:
        with _open_decompressed(Path(path)) as stream:
            while True:
                chunk = stream.read(HEAD_CHUNK)
                buffer += chunk
                exhausted = not chunk or len(buffer) >= head_bytes
                at, end_of_header = buffer.find(key), buffer.find(stop)
                if at >= 0 and (end_of_header < 0 or at < end_of_header):
                    value = _decode_object_at(buffer, at + len(key))
                    if isinstance(value, dict):
                        return _distributed_info(value)
                    if exhausted:
                        return None
                elif end_of_header >= 0 or exhausted:
                    return None
    except (OSError, EOFError, zlib.error):
        return None


def _distributed_info(value: dict) -> DistributedInfo | None:
    rank, world = value.get("rank"), value.get("world_size")
    rank = int(rank) if isinstance(rank, int) or (isinstance(rank, str) and rank.isdigit()) else None
    world = int(world) if isinstance(world, int) or (isinstance(world, str) and world.isdigit()) else None
    return DistributedInfo(rank, world) if rank is not None else None


def kineto_rank(path: Path, pattern: re.Pattern | None = None) -> RankOfFile:
    """A Kineto file's rank: ``distributedInfo.rank`` unless ``pattern`` is given, else the name.

    A keyword rank in the name (``rank3``) that contradicts ``distributedInfo`` is a problem.
    Cost: the file header (``read_distributed_info``).
    """
    named = rank_from_name(path, pattern)
    if pattern is not None:
        return named
    info = read_distributed_info(path)
    if info is None:
        if named.problem:
            named.problem += " and no distributedInfo in the file header"
        return named
    if named.rank is not None and named.keyword and named.rank != info.rank:
        return RankOfFile(path, None, "distributedInfo",
                          f"distributedInfo says rank {info.rank} but the name says rank {named.rank}; "
                          "use --rank-pattern to take ranks from names")
    return RankOfFile(path, info.rank, "distributedInfo", world_size=info.world_size)


def expand_glob(pattern: str) -> list[Path]:
    """Files matching a shell glob (``**`` allowed), absolute, sorted; directories are dropped."""
    matches = glob.glob(os.path.expanduser(pattern), recursive=True)
    return sorted(Path(m).absolute() for m in matches if os.path.isfile(m))


def _group_by_rank(files: list[RankOfFile], kind: str, problems: list[str]) -> tuple[dict[int, RankOfFile], set[int]]:
    """Files by rank; problems for files without a rank and for duplicated ranks (also returned)."""
    by_rank: dict[int, list[RankOfFile]] = {}
    for f in files:
        if f.rank is None:
            problems.append(f"{kind} file {f.path}: {f.problem}")
        else:
            by_rank.setdefault(f.rank, []).append(f)
    unique, duplicated = {}, set()
    for rank, group in sorted(by_rank.items()):
        if len(group) > 1:
            listed = ", ".join(f"{g.path} ({g.source})" for g in group)
            problems.append(f"rank {rank}: {len(group)} {kind} files: {listed}")
            duplicated.add(rank)
        else:
            unique[rank] = group[0]
    return unique, duplicated


def pair_rank_files(et_paths: list[Path], kineto_paths: list[Path],
                    rank_pattern: str | re.Pattern | None = None, skip_unpaired: bool = False,
                    pid_ranks: dict[int, int] | None = None) -> Pairing:
    """Pair ET and Kineto files by rank; every ambiguity becomes a ``problem`` (nothing guessed).

    ``skip_unpaired``: a rank with only one of its two files is left out with a note instead of
    being a problem (``--skip-unpaired``: link the complete ranks).

    Cost: O(files) plus one header read per Kineto file (``read_distributed_info``).
    """
    pattern = re.compile(rank_pattern) if isinstance(rank_pattern, str) else rank_pattern
    if pattern is not None and pattern.groups < 1:
        raise BatchSetupError(f"--rank-pattern {pattern.pattern!r} needs a group around the rank number, "
                              r"e.g. 'rank(\d+)'")
    problems: list[str] = []
    notes: list[str] = []
    both = sorted(set(et_paths) & set(kineto_paths))
    problems += [f"{p} matches both --et and --kineto" for p in both]
    et_files = [rank_from_name(p, pattern) for p in et_paths if p not in both]
    kineto_files = timing_rank_files([p for p in kineto_paths if p not in both], pattern, kineto_rank, pid_ranks)
    ets, et_duplicated = _group_by_rank(et_files, "ET", problems)
    kinetos, kineto_duplicated = _group_by_rank(kineto_files, "Kineto", problems)
    unpaired = notes if skip_unpaired else problems
    skipped = "; rank skipped (--skip-unpaired)" if skip_unpaired else " (--skip-unpaired links the other ranks)"
    for rank in sorted(set(ets) - set(kinetos) - kineto_duplicated):
        unpaired.append(f"rank {rank}: ET file {ets[rank].path} has no Kineto file{skipped}")
    for rank in sorted(set(kinetos) - set(ets) - et_duplicated):
        unpaired.append(f"rank {rank}: Kineto file {kinetos[rank].path} has no ET file{skipped}")
    pairs = [RankPair(r, ets[r].path, kinetos[r].path, kinetos[r].source)
             for r in sorted(set(ets) & set(kinetos))]
    if not et_paths:  # Kineto-only job: every Kineto file is a rank of its own
        problems = [p for p in problems if "has no ET file" not in p]
        pairs = [RankPair(r, None, k.path, k.source) for r, k in sorted(kinetos.items())]
    worlds = {f.world_size for f in kineto_files if f.world_size is not None}
    world = None
    if len(worlds) > 1:
        problems.append(f"Kineto files disagree on distributedInfo.world_size: {sorted(worlds)} "
                        "(files of different jobs?)")
    elif worlds:
        world = worlds.pop()
        missing = sorted(set(range(world)) - {p.rank for p in pairs})
        if missing and not problems and not skip_unpaired:
            notes.append(f"world size is {world} but ranks {format_ranks(missing)} were not given; "
                         f"linking the {len(pairs)} given")
        beyond = [p.rank for p in pairs if p.rank >= world]
        if beyond:
            problems.append(f"ranks {format_ranks(beyond)} are >= the world size {world}")
    return Pairing(pairs, problems, notes, world)

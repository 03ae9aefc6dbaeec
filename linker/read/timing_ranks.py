"""Ranks of the timing files of a job, where one Nsight Systems file may hold every rank.

``nsys profile torchrun ...`` records all ranks' processes in one file: each process with PyTorch
ranges is then a rank, numbered in pid order (rank 0 = the smallest pid). A job given as one such
file gets one ``TimingSelection`` per process; files of other kinds (Kineto JSON, single-process
SQLite files among several) keep their usual rank (``rank_of``: distributedInfo or the name).
Cost: one aggregate query per SQLite file (``sqlite_processes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from linker.model.errors import OptionError, TraceInputError
from linker.read.rank_names import RankOfFile
from linker.read.timing import TimingSelection, export_processes, is_profiler_export

PID_ORDER = "process (pid order)"


def parse_pid_ranks(text: str) -> dict[int, int]:
    """``"4242:0,4243:1"`` -> {4242: 0, 4243: 1}. Raises OptionError naming what is wrong."""
    mapping: dict[int, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        pid, sep, rank = item.partition(":")
        if not sep or not pid.strip().isdigit() or not rank.strip().isdigit():
            raise OptionError(f"{item!r} is not PID:RANK (e.g. 4242:0)")
        if int(pid) in mapping:
            raise OptionError(f"pid {pid.strip()} is given twice")
        mapping[int(pid)] = int(rank)
    if not mapping:
        raise OptionError("give PID:RANK pairs, e.g. 4242:0,4243:1")
    if len(set(mapping.values())) < len(mapping):
        raise OptionError("two pids are given the same rank")
    return mapping


def timing_rank_files(paths: list[Path], pattern, rank_of: Callable,
                      pid_ranks: dict[int, int] | None = None) -> list[RankOfFile]:
    """A ``RankOfFile`` per rank: one per PyTorch process of a lone SQLite file (rank: pid order,
    or ``pid_ranks[pid]``; a process it leaves out, or a pid it names that the file lacks, is a
    problem), else one per file (``rank_of(path, pattern)``); a multi-process SQLite file among
    several files is a problem (its ranks would collide with the others')."""
    files = []
    for path in paths:
        if not is_profiler_export(path):
            files.append(rank_of(path, pattern))
            continue
        try:
            pids = export_processes(path)
        except TraceInputError as err:
            files.append(RankOfFile(path, None, PID_ORDER, err.problem))
            continue
        if len(paths) == 1:
            files += _process_ranks(path, pids, pid_ranks)
        elif len(pids) > 1:
            files.append(RankOfFile(path, None, PID_ORDER, f"holds {len(pids)} PyTorch processes: give it "
                                    "alone to --kineto (one rank per process, in pid order)"))
        else:
            named = rank_of(path, pattern)
            files.append(RankOfFile(TimingSelection(path, pids[0]), named.rank, named.source, named.problem,
                                    named.keyword, named.world_size) if pids else named)
    return files


def _process_ranks(path: Path, pids: list[int], pid_ranks: dict[int, int] | None) -> list[RankOfFile]:
    if not pids:
        return [RankOfFile(path, None, PID_ORDER, "no process with PyTorch NVTX ranges")]
    if pid_ranks is None:
        return [RankOfFile(TimingSelection(path, pid), rank, PID_ORDER) for rank, pid in enumerate(pids)]
    files = [RankOfFile(TimingSelection(path, pid), pid_ranks.get(pid), "--pid-ranks",
                        None if pid in pid_ranks else "--pid-ranks gives this process no rank")
             for pid in pids]
    files += [RankOfFile(path, None, "--pid-ranks", f"--pid-ranks names pid {pid}, which has no PyTorch "
                         f"ranges here (processes: {', '.join(map(str, pids))})")
              for pid in sorted(set(pid_ranks) - set(pids))]
    return files

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

from linker.model.errors import TraceInputError
from linker.read.rank_names import RankOfFile
from linker.read.timing import TimingSelection, is_sqlite_file, sqlite_processes

PID_ORDER = "process (pid order)"


def timing_rank_files(paths: list[Path], pattern, rank_of: Callable) -> list[RankOfFile]:
    """A ``RankOfFile`` per rank: one per PyTorch process of a lone SQLite file, else one per
    file (``rank_of(path, pattern)``); a multi-process SQLite file among several files is a
    problem (its ranks would collide with the others')."""
    files = []
    for path in paths:
        if not is_sqlite_file(path):
            files.append(rank_of(path, pattern))
            continue
        try:
            pids = sqlite_processes(path)
        except TraceInputError as err:
            files.append(RankOfFile(path, None, PID_ORDER, err.problem))
            continue
        if len(paths) == 1:
            files += [RankOfFile(TimingSelection(path, pid), rank, PID_ORDER) for rank, pid in enumerate(pids)]
            if not pids:
                files.append(RankOfFile(path, None, PID_ORDER, "no process with PyTorch NVTX ranges"))
        elif len(pids) > 1:
            files.append(RankOfFile(path, None, PID_ORDER, f"holds {len(pids)} PyTorch processes: give it "
                                    "alone to --kineto (one rank per process, in pid order)"))
        else:
            named = rank_of(path, pattern)
            files.append(RankOfFile(TimingSelection(path, pids[0]), named.rank, named.source, named.problem,
                                    named.keyword, named.world_size) if pids else named)
    return files

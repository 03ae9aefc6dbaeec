"""Link every rank of a job: ``et-link batch``.

Steps, each one a plain function over plain data:

1. **Pair** ET and Kineto files by rank (``pair_rank_files``): a Kineto file's rank comes from its
   ``distributedInfo.rank`` (read from the file's header only, see ``read_distributed_info``),
   otherwise from the file name (``rank3``, ``worker3_…``, ``…_eg_3``, ``kineto_3``, or the only
   number in the name); ``--rank-pattern`` takes every rank from the name instead. Every problem
   (no rank, duplicated rank, rank on one side only, name contradicting the content) is collected
   and reported before any work starts.
2. **Plan** one ``RankTask`` per rank with its output paths in the output directory
   (``rank<N>_plus.json``, or ``rank.<N>.et`` as ASTRA-sim names a job's workload files,
   ``rank<N>.report.json``) and skip the ranks whose outputs are already
   complete (``completed_result``: the report sidecar written after a successful link records the
   output's and inputs' size and mtime and the link options).
3. **Run** the tasks, one fresh process per rank: locally (``run_local``: forked workers, no more at
   once than ``--workers`` and than fit in available memory by ``estimate_peak_bytes``) or on a Dask
   cluster (``run_dask``: each task runs ``python`` in a subprocess on a worker). A failing rank
   only records its error. Each worker also records the rank's communication ops per process
   group in its report sidecar (``job_check.rank_collectives``).
4. **Check the job** (``job_check.check_job``): the job's process groups (``comm_groups.json``
   for ``--format et``) and the cross-rank comparison of every group's collectives.
5. **Summarise** (``summarize_totals``, ``find_outliers``, ``format_table``): per-rank table, job
   totals, ranks that stand out; ``summary.json``.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import logging
import multiprocessing
import os
import pickle
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait as wait_for_ready
from pathlib import Path
from typing import Callable

import orjson

from .errors import MismatchedPairError, TraceInputError
from .fileio import GZIP_MAGIC, atomic_output, plausible_gzip_size
from .job_check import COMM_GROUPS_FILE, SIDECAR_KEY, CollectiveCheck, check_job, format_check, format_ranks
from .link import LinkOptions
from .progress import BatchProgress

log = logging.getLogger("et_link")

EXIT_RANKS_FAILED = 5

# --- memory model -------------------------------------------------------------------------------
# Peak RSS of one rank ~= PEAK_BASE_BYTES + PEAK_BYTES_PER_INPUT_BYTE * (uncompressed ET + Kineto
# bytes). Measured with ``scripts/bench_batch.py --memory`` (fresh process per pair, ru_maxrss minus
# the RSS after imports, 18 MB), (peak - base) / input:
#   param_dlrm rank 0 (1.7 MB of JSON): 25 MB peak, 3.99;  param_linear (21.5 MB): 105 MB, 4.22;
#   transformer 12 layers x 12 steps (135k ET nodes, 196 MB): 606 MB, 3.14;
#   transformer 48 layers x 8 steps (361k ET nodes, 524 MB): 1,536 MB, 3.04.
# The factor is the largest ratio plus ~25% (an underestimate risks the OOM killer, an overestimate
# only costs parallelism); the base covers the interpreter, the imports and, for forked local
# workers, the parent's pages (34 MB measured).
PEAK_BASE_BYTES = 48 << 20
PEAK_BYTES_PER_INPUT_BYTE = 5.3
# Share of MemAvailable the local runner plans to use (the rest is left to the system).
MEMORY_BUDGET_SHARE = 0.85
# gzip stores the uncompressed size modulo 2**32; for big files the wrap count is estimated from
# this typical JSON trace compression ratio (measured 16-28x on the traces here).
TYPICAL_GZIP_RATIO = 18.0

HEAD_BYTES = 1 << 20  # distributedInfo must appear within this many uncompressed bytes
HEAD_CHUNK = 64 << 10
SIDECAR_VERSION = 2  # 2: the sidecar holds the rank's collectives

# File-name patterns for a rank, tried in this order (case-insensitive); the first pattern that
# matches decides. A name without any of them may still hold exactly one number.
NAME_RANK_PATTERNS = (
    re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE),
    re.compile(r"worker[-_]?(\d+)", re.IGNORECASE),
    # not "." as separator: "kineto.1700000000.json" holds a timestamp, not a rank
    re.compile(r"(?<![a-z0-9])(?:eg|et|kineto|trace|chakra)[-_](\d+)(?!\d)", re.IGNORECASE),
)
TRACE_SUFFIXES = (".gz", ".json", ".et", ".pt", ".trace")

# A rank stands out when its linked % (or GPU %) is this many points below the median, or more
# than OUTLIER_MADS median absolute deviations below it, whichever is larger.
OUTLIER_MIN_POINTS = 5.0
OUTLIER_MADS = 3.0
OUTLIER_SLOW_FACTOR = 2.0  # and at least OUTLIER_SLOW_MIN_SECONDS above the median
OUTLIER_SLOW_MIN_SECONDS = 1.0
OUTLIER_MEMORY_FACTOR = 1.5  # and at least OUTLIER_MEMORY_MIN_BYTES above the median
OUTLIER_MEMORY_MIN_BYTES = 100 << 20
OUTLIER_EXTRA_WARNINGS = 2


class BatchSetupError(Exception):
    """The batch cannot start (bad option, no files, missing optional dependency). One line."""


class PairingError(BatchSetupError):
    """ET and Kineto files could not be paired unambiguously; ``problems`` lists every issue."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(f"{len(problems)} pairing problem(s); nothing was linked")


# --- pairing ------------------------------------------------------------------------------------


@dataclass
class DistributedInfo:
    rank: int | None
    world_size: int | None


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
                    rank_pattern: str | re.Pattern | None = None, skip_unpaired: bool = False) -> Pairing:
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
    kineto_files = [kineto_rank(p, pattern) for p in kineto_paths if p not in both]
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


# --- tasks and results --------------------------------------------------------------------------


@dataclass
class RankTask:
    """Everything a worker needs to link one rank (picklable; paths absolute)."""

    rank: int
    et: Path | None  # None: Kineto-only
    kineto: Path
    output: Path
    report_path: Path
    options: LinkOptions
    input_bytes: int  # uncompressed ET + Kineto bytes (estimate for gzip files over 4 GiB)
    estimated_peak_bytes: int


@dataclass
class RankResult:
    """Outcome of one rank. ``status``: "linked", "skipped" (output already complete: figures
    are from the run that wrote it) or "failed" (``error`` says why)."""

    rank: int
    status: str
    et: str | None
    kineto: str
    output: str | None = None
    report: str | None = None
    error: str | None = None
    method: str | None = None
    et_ops: int = 0
    linked_ops: int = 0
    linked_pct: float | None = None
    gpu_events: int = 0
    gpu_events_linked: int = 0
    gpu_linked_pct: float | None = None
    warnings: list[str] = field(default_factory=list)
    wall_seconds: float | None = None
    peak_rss_bytes: int | None = None
    base_rss_bytes: int | None = None
    input_bytes: int = 0
    estimated_peak_bytes: int = 0
    host: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "failed"


def uncompressed_size(path: Path) -> int:
    """Bytes after gunzip (gzip trailer ISIZE, wrap count estimated past 4 GiB), else file size. O(1)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC or size < 20:
            return size
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    if size * TYPICAL_GZIP_RATIO < (1 << 32):
        # A truncated file ends in arbitrary bytes: an impossible ratio falls back to the typical one.
        return isize if plausible_gzip_size(size, isize) else int(size * TYPICAL_GZIP_RATIO)
    wraps = max(round((size * TYPICAL_GZIP_RATIO - isize) / (1 << 32)), 0)
    return isize + wraps * (1 << 32)


def estimate_peak_bytes(input_bytes: int) -> int:
    """Expected peak RSS of a rank from its uncompressed input bytes (see the memory model)."""
    return int(PEAK_BASE_BYTES + PEAK_BYTES_PER_INPUT_BYTE * input_bytes)


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo, or None where there is none."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def output_name(rank: int, fmt: str, compressed: bool) -> str:
    """``rank<N>_plus.json``, or ``rank.<N>.et`` (ASTRA-sim reads a job's workload as
    ``<prefix>.<rank>.et``, here prefix ``<output dir>/rank``); plus ``.gz`` when asked."""
    name = f"rank.{rank}.et" if fmt == "et" else f"rank{rank}_plus.json"
    return name + (".gz" if compressed else "")


def make_task(pair: RankPair, output_dir: Path, options: LinkOptions, fmt: str, compressed: bool) -> RankTask:
    """The task of one pair; its input size is read from the files' sizes and gzip trailers. O(1)."""
    try:
        input_bytes = (uncompressed_size(pair.et) if pair.et else 0) + uncompressed_size(pair.kineto)
    except OSError:
        input_bytes = 0  # unreadable: the link reports it
    return RankTask(
        rank=pair.rank, et=pair.et, kineto=pair.kineto,
        output=output_dir / output_name(pair.rank, fmt, compressed),
        report_path=output_dir / f"rank{pair.rank}.report.json",
        options=options, input_bytes=input_bytes, estimated_peak_bytes=estimate_peak_bytes(input_bytes))


def _file_stamp(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _base_result(task: RankTask, status: str) -> RankResult:
    return RankResult(rank=task.rank, status=status, et=str(task.et) if task.et else None, kineto=str(task.kineto),
                      input_bytes=task.input_bytes, estimated_peak_bytes=task.estimated_peak_bytes,
                      host=socket.gethostname())


def failed_result(task: RankTask, error: str, wall: float | None = None, peak: int | None = None) -> RankResult:
    result = _base_result(task, "failed")
    result.error, result.wall_seconds, result.peak_rss_bytes = error, wall, peak
    return result


def _fill_from_report(result: RankResult, report: dict) -> RankResult:
    result.method = report.get("method")
    for name in ("et_ops", "linked_ops", "gpu_events", "gpu_events_linked"):
        setattr(result, name, int(report.get(name) or 0))
    result.linked_pct = report.get("linked_pct")
    result.gpu_linked_pct = report.get("gpu_linked_pct")
    result.warnings = list(report.get("warnings") or [])
    return result


def run_rank_task(task: RankTask) -> RankResult:
    """Link one rank in this process and write its output and report sidecar; never raises.

    The sidecar (``task.report_path``) is the link report plus a ``batch`` record of the output's
    and inputs' size/mtime, the options, wall time and peak RSS, and the rank's communication
    ops (``collectives``, see ``job_check``); it is removed first and written last, so it exists
    only next to a complete output. Peak memory is this process's
    ``ru_maxrss``: meaningful because every task runs in a fresh process.
    """
    from .job_check import rank_collectives
    from .pipeline import link_pair

    started = time.perf_counter()
    base = _current_rss_bytes()
    with contextlib.suppress(OSError):
        task.report_path.unlink()
    try:
        outcome = link_pair(task.et, task.kineto, task.output, task.options)
        collectives = rank_collectives(outcome.et_plus).to_record()
        outcome.et_plus = None
    except MismatchedPairError as err:
        return failed_result(task, f"not the same run: {err}", time.perf_counter() - started, _peak_rss_bytes())
    except (TraceInputError, ValueError, OSError) as err:
        return failed_result(task, str(err), time.perf_counter() - started, _peak_rss_bytes())
    except MemoryError:
        return failed_result(task, "out of memory", time.perf_counter() - started, _peak_rss_bytes())
    except Exception as err:  # an et-link bug must not stop the other ranks
        log.debug("rank %d: internal error", task.rank, exc_info=True)
        return failed_result(task, f"internal error: {type(err).__name__}: {err}",
                             time.perf_counter() - started, _peak_rss_bytes())
    wall, peak = time.perf_counter() - started, _peak_rss_bytes()
    result = _fill_from_report(_base_result(task, "linked"), outcome.report.to_dict())
    result.output, result.report = str(task.output), str(task.report_path)
    result.wall_seconds, result.peak_rss_bytes, result.base_rss_bytes = wall, peak, base
    record = {"version": SIDECAR_VERSION, "output": _file_stamp(task.output),
              "inputs": [_file_stamp(p) for p in (task.et, task.kineto) if p],
              "options": asdict(task.options), "wall_seconds": round(wall, 3),
              "peak_rss_bytes": peak, "base_rss_bytes": base, "host": result.host}
    try:
        with atomic_output(task.report_path) as out:
            out.write(orjson.dumps(outcome.report.to_dict() | {"batch": record, SIDECAR_KEY: collectives},
                                   option=orjson.OPT_INDENT_2))
    except (OSError, TraceInputError) as err:
        result.warnings.append(f"report sidecar not written ({err}); the rank will be linked again next run")
    return result


def completed_result(task: RankTask, verify: bool = False) -> RankResult | None:
    """The recorded result when the rank's output is complete, else None.

    Complete = the sidecar exists and its recorded output size/mtime, input sizes/mtimes and link
    options equal the current ones (and, with ``verify``, ``validate_file`` passes on the output).
    Cost: a few ``stat`` calls and one small JSON read (``verify``: one validation pass).
    """
    try:
        doc = orjson.loads(task.report_path.read_bytes())
        record = doc["batch"]
        if record.get("version") != SIDECAR_VERSION or record.get("options") != asdict(task.options):
            return None
        current = [_file_stamp(p) for p in (task.output, task.et, task.kineto) if p]
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None
    if [record.get("output")] + list(record.get("inputs") or []) != current:
        return None
    if verify and not _output_is_valid(task.output):
        return None
    result = _fill_from_report(_base_result(task, "skipped"), doc)
    result.output, result.report = str(task.output), str(task.report_path)
    result.wall_seconds = record.get("wall_seconds")
    result.peak_rss_bytes = record.get("peak_rss_bytes")
    result.base_rss_bytes = record.get("base_rss_bytes")
    result.host = record.get("host") or result.host
    return result


def _output_is_valid(path: Path) -> bool:
    from .validate import validate_file

    try:
        return validate_file(path).ok
    except Exception:  # undecodable output: not complete
        return False


# --- running: local processes -------------------------------------------------------------------


@dataclass
class _Running:
    task: RankTask
    process: multiprocessing.process.BaseProcess
    connection: object  # the parent's end of the result pipe


def _exit_on_sigterm(signum, frame) -> None:
    sys.exit(128 + signum)  # unwinds, so a half-written output's temporary file is removed


def _local_child(task: RankTask, connection) -> None:
    """Body of a local worker process: ignore Ctrl-C (the parent stops us with SIGTERM), link,
    send the result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the parent around start()
    connection.send(run_rank_task(task))
    connection.close()


def _start_with_sigint_blocked(process) -> None:
    """Start a worker with Ctrl-C blocked, so that a Ctrl-C during the fork cannot reach the child
    before it ignores SIGINT (that race printed a child's traceback); a Ctrl-C meanwhile is
    delivered to this process when the mask is restored."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _process_context() -> multiprocessing.context.BaseContext:
    """``fork`` (no interpreter start, the parent's imports reused) when this process has a single
    thread; ``forkserver`` (preloaded with the linker) when threads exist, where fork is unsafe."""
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["linker.pipeline", "linker.batch"])
    return context


def _exit_description(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        hint = " (killed: out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"worker process died with signal {name}{hint}"
    return f"worker process exited with status {exitcode} without a result"


def pick_next_task(pending: list[RankTask], memory_in_use: int, budget: int | None, running: int) -> int | None:
    """Index in ``pending`` (largest first) of the first task whose estimate fits the memory left;
    with nothing running the first task always starts (alone) so the batch cannot stall. O(pending)."""
    if not pending:
        return None
    if budget is None or running == 0:
        return 0
    for i, task in enumerate(pending):
        if memory_in_use + task.estimated_peak_bytes <= budget:
            return i
    return None


def run_local(tasks: list[RankTask], workers: int, memory_budget: int | None,
              progress: BatchProgress | None = None) -> list[RankResult]:
    """Run each task in a fresh local process, at most ``workers`` at once and (when
    ``memory_budget`` is given) only while the sum of running tasks' ``estimated_peak_bytes`` fits.

    Largest tasks first. A crashed worker (e.g. killed by the OOM killer) is that rank's failure.
    On KeyboardInterrupt the running workers are terminated and the interrupt re-raised.
    Cost: O(tasks^2) in the worst case for the memory fit scan (fine up to 10^4 ranks).
    """
    context = _process_context()
    pending = sorted(tasks, key=lambda t: (-t.estimated_peak_bytes, t.rank))
    running: dict[int, _Running] = {}
    results: list[RankResult] = []
    try:
        while pending or running:
            while len(running) < workers:
                in_use = sum(r.task.estimated_peak_bytes for r in running.values())
                index = pick_next_task(pending, in_use, memory_budget, len(running))
                if index is None:
                    break
                task = pending.pop(index)
                if memory_budget is not None and task.estimated_peak_bytes > memory_budget:
                    message = (f"rank {task.rank}: estimated peak memory {task.estimated_peak_bytes / 2**30:.1f} GiB "
                               f"exceeds the memory budget {memory_budget / 2**30:.1f} GiB; running it alone")
                    if progress:
                        progress.note(message)
                    else:
                        log.warning("%s", message)
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_local_child, args=(task, sender), name=f"et-link-rank{task.rank}")
                _start_with_sigint_blocked(process)
                sender.close()
                running[task.rank] = _Running(task, process, receiver)
                if progress:
                    progress.started(task.rank)
            ready = set(wait_for_ready([r.connection for r in running.values()]
                                       + [r.process.sentinel for r in running.values()], timeout=0.2))
            for rank, entry in list(running.items()):
                if entry.connection in ready or entry.process.sentinel in ready:
                    result = _collect(entry)
                    del running[rank]
                    results.append(result)
                    _report_done(progress, entry.task, result)
            if progress:
                progress.tick()
    except BaseException:
        for entry in running.values():
            entry.process.terminate()
        for entry in running.values():
            entry.process.join(5)
            if entry.process.is_alive():
                entry.process.kill()
                entry.process.join()
        raise
    return results


def _collect(entry: _Running) -> RankResult:
    result = None
    try:
        if entry.connection.poll():
            result = entry.connection.recv()
    except (EOFError, OSError, pickle.UnpicklingError):
        result = None
    entry.process.join()
    entry.connection.close()
    if isinstance(result, RankResult):
        return result
    return failed_result(entry.task, _exit_description(entry.process.exitcode))


# --- running: Dask ------------------------------------------------------------------------------

_CHILD_CODE = "from linker.batch import child_main; child_main()"


def child_main() -> None:
    """Entry of ``run_rank_subprocess``'s child: a pickled RankTask on stdin, the pickled
    RankResult on stdout (anything else the linker prints goes to stderr)."""
    task = pickle.load(sys.stdin.buffer)
    result_stream = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    pickle.dump(run_rank_task(task), result_stream)
    result_stream.close()


def run_rank_subprocess(task: RankTask) -> RankResult:
    """Run ``run_rank_task`` in a fresh Python process (Dask task body). Never raises.

    The fresh process gives the rank its own peak-memory figure and keeps a crash (or the OOM
    killer) from taking the Dask worker down. The child finds this package via PYTHONPATH.
    """
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD_CODE], input=pickle.dumps(task),
                              capture_output=True, env=env, check=False)
    except OSError as err:
        return failed_result(task, f"cannot start a Python process on {socket.gethostname()}: {err}")
    if proc.returncode == 0:
        with contextlib.suppress(Exception):
            result = pickle.loads(proc.stdout)
            if isinstance(result, RankResult):
                return result
    stderr = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()
    detail = f": {stderr[-1]}" if stderr else ""
    return failed_result(task, _exit_description(proc.returncode) + detail, time.perf_counter() - started)


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise BatchSetupError("--scheduler needs Dask: install it with  pip install 'et-link[dask]'") from None
    return distributed


def run_dask(tasks: list[RankTask], scheduler: str, progress: BatchProgress | None = None,
             connect_timeout: float = 30.0) -> list[RankResult]:
    """Run the tasks on an existing Dask cluster (``scheduler`` address, e.g. tcp://host:8786).

    Each task is ``run_rank_subprocess`` on a worker (one fresh process per rank there too), so
    workers must see the same paths (shared storage) and have et-link installed. Placement and
    concurrency are Dask's (one task per worker thread). A lost task is that rank's failure.
    """
    distributed = _import_distributed()
    try:
        client = distributed.Client(scheduler, timeout=connect_timeout, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise BatchSetupError(f"cannot connect to the Dask scheduler {scheduler}: {err}") from None
    results: list[RankResult] = []
    futures: dict = {}
    try:
        token = f"{os.getpid()}-{time.time_ns()}"
        for task in sorted(tasks, key=lambda t: (-t.estimated_peak_bytes, t.rank)):
            future = client.submit(run_rank_subprocess, task, key=f"et-link-rank{task.rank}-{token}",
                                   pure=False, retries=0)
            futures[future] = task
            if progress:
                progress.started(task.rank)
        pending = distributed.as_completed(list(futures), loop=client.loop)
        for future in pending:
            task = futures[future]
            try:
                result = future.result()
            except Exception as err:
                result = failed_result(task, f"Dask task failed: {type(err).__name__}: {err}")
            results.append(result)
            _report_done(progress, task, result)
    except BaseException:
        client.cancel(list(futures))
        raise
    finally:
        client.close()
    return results


# --- summary ------------------------------------------------------------------------------------


@dataclass
class Outlier:
    rank: int
    metric: str
    value: float | str
    typical: float | str
    reason: str


@dataclass
class BatchTotals:
    ranks: int
    linked: int
    skipped: int
    failed: int
    et_ops: int
    linked_ops: int
    linked_pct: float
    gpu_events: int
    gpu_events_linked: int
    gpu_linked_pct: float
    warnings: int
    rank_seconds: float  # sum of per-rank wall times of the ranks linked in this run
    elapsed_seconds: float  # this run, pairing to summary
    max_peak_rss_bytes: int | None
    median_peak_rss_bytes: int | None
    median_rank_seconds: float | None


@dataclass
class BatchSummary:
    output_dir: str
    executor: str  # "local (N workers)" or the scheduler address
    ranks: list[RankResult]
    totals: BatchTotals
    outliers: list[Outlier]
    notes: list[str]
    options: dict
    collectives: CollectiveCheck | None = None

    @property
    def failed(self) -> list[RankResult]:
        return [r for r in self.ranks if r.status == "failed"]

    def to_dict(self) -> dict:
        return asdict(self)


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


def summarize_totals(results: list[RankResult], elapsed: float) -> BatchTotals:
    """Job totals; percentages are over all ops of the ranks that have figures. O(ranks)."""
    with_figures = [r for r in results if r.ok]
    et_ops = sum(r.et_ops for r in with_figures)
    linked_ops = sum(r.linked_ops for r in with_figures)
    gpu = sum(r.gpu_events for r in with_figures)
    gpu_linked = sum(r.gpu_events_linked for r in with_figures)
    peaks = [r.peak_rss_bytes for r in with_figures if r.peak_rss_bytes]
    walls = [r.wall_seconds for r in with_figures if r.wall_seconds is not None]
    return BatchTotals(
        ranks=len(results), linked=sum(r.status == "linked" for r in results),
        skipped=sum(r.status == "skipped" for r in results), failed=sum(r.status == "failed" for r in results),
        et_ops=et_ops, linked_ops=linked_ops, linked_pct=_pct(linked_ops, et_ops),
        gpu_events=gpu, gpu_events_linked=gpu_linked, gpu_linked_pct=_pct(gpu_linked, gpu) if gpu else 100.0,
        warnings=sum(len(r.warnings) for r in with_figures),
        rank_seconds=round(sum(r.wall_seconds or 0.0 for r in results if r.status == "linked"), 3),
        elapsed_seconds=round(elapsed, 3),
        max_peak_rss_bytes=max(peaks) if peaks else None,
        median_peak_rss_bytes=int(statistics.median(peaks)) if peaks else None,
        median_rank_seconds=round(statistics.median(walls), 3) if walls else None)


def _low_outliers(results: list[RankResult], metric: str, label: str) -> list[Outlier]:
    values = [(r.rank, getattr(r, metric)) for r in results if getattr(r, metric) is not None]
    if len(values) < 3:
        return []
    median = statistics.median(v for _, v in values)
    mad = statistics.median(abs(v - median) for _, v in values)
    threshold = median - max(OUTLIER_MIN_POINTS, OUTLIER_MADS * mad)
    return [Outlier(rank, metric, value, round(median, 3),
                    f"{label} {value:.2f}% vs median {median:.2f}%")
            for rank, value in values if value < threshold]


def _high_outliers(results: list[RankResult], metric: str, factor: float, floor: float,
                   describe: Callable[[float], str], label: str) -> list[Outlier]:
    values = [(r.rank, getattr(r, metric)) for r in results if getattr(r, metric)]
    if len(values) < 3:
        return []
    median = statistics.median(v for _, v in values)
    return [Outlier(rank, metric, value, median, f"{label} {describe(value)} vs median {describe(median)}")
            for rank, value in values if value > factor * median and value > median + floor]


def find_outliers(results: list[RankResult]) -> list[Outlier]:
    """Ranks that stand out from the others (needs >= 3 ranks with figures). O(ranks log ranks).

    Low linked % or GPU-attached % (``OUTLIER_MIN_POINTS`` / ``OUTLIER_MADS`` below the median),
    a linking method other than the majority's, many more warnings, slow or memory-hungry ranks.
    """
    ok = [r for r in results if r.ok]
    outliers = _low_outliers(ok, "linked_pct", "linked")
    outliers += _low_outliers(ok, "gpu_linked_pct", "GPU ops attached")
    methods = [r.method for r in ok if r.method]
    if len(methods) >= 3:
        majority, count = max(((m, methods.count(m)) for m in set(methods)), key=lambda mc: (mc[1], mc[0]))
        if count > len(methods) / 2:
            outliers += [Outlier(r.rank, "method", r.method, majority, f"method {r.method}, most ranks used {majority}")
                         for r in ok if r.method and r.method != majority]
    if len(ok) >= 3:
        typical = statistics.median(len(r.warnings) for r in ok)
        outliers += [Outlier(r.rank, "warnings", len(r.warnings), typical,
                             f"{len(r.warnings)} warnings vs median {typical:g}")
                     for r in ok if len(r.warnings) > typical + OUTLIER_EXTRA_WARNINGS]
    outliers += _high_outliers(ok, "wall_seconds", OUTLIER_SLOW_FACTOR, OUTLIER_SLOW_MIN_SECONDS,
                               lambda s: f"{s:.1f}s", "slow:")
    outliers += _high_outliers(ok, "peak_rss_bytes", OUTLIER_MEMORY_FACTOR, OUTLIER_MEMORY_MIN_BYTES,
                               lambda b: f"{b / 2**20:.0f} MB", "memory:")
    return sorted(outliers, key=lambda o: (o.rank, o.metric))


def _cell(value: float | None, width: int, decimals: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}.{decimals}f}"


def format_table(summary: BatchSummary) -> str:
    """The printed table: one row per rank, the totals, the ranks that stand out, the errors."""
    header = f"{'rank':>5} {'status':<8} {'method':<12} {'linked%':>8} {'gpu%':>8} {'warn':>5} {'wall s':>8} {'peak MB':>8}"
    lines = [header, "-" * len(header)]
    for r in summary.ranks:
        peak = r.peak_rss_bytes / 2**20 if r.peak_rss_bytes else None
        lines.append(f"{r.rank:>5} {r.status:<8} {(r.method or '-'):<12} {_cell(r.linked_pct, 8, 2)} "
                     f"{_cell(r.gpu_linked_pct, 8, 2)} {len(r.warnings) if r.ok else '-':>5} "
                     f"{_cell(r.wall_seconds, 8, 2)} {_cell(peak, 8, 0)}")
    t = summary.totals
    lines.append("-" * len(header))
    lines.append(f"total: {t.ranks} ranks ({t.linked} linked, {t.skipped} skipped as complete, {t.failed} failed); "
                 f"ET ops linked {t.linked_ops}/{t.et_ops} ({t.linked_pct:.2f}%), GPU ops attached "
                 f"{t.gpu_events_linked}/{t.gpu_events} ({t.gpu_linked_pct:.2f}%), {t.warnings} warnings")
    peak = f"{t.max_peak_rss_bytes / 2**20:.0f} MB" if t.max_peak_rss_bytes else "-"
    lines.append(f"time: {t.elapsed_seconds:.2f}s elapsed, {t.rank_seconds:.2f}s of rank work "
                 f"({summary.executor}); peak memory of a rank: max {peak}")
    if summary.outliers:
        lines.append("ranks that stand out:")
        lines += [f"  rank {o.rank}: {o.reason}" for o in summary.outliers]
    if summary.failed:
        lines.append("failed ranks:")
        lines += [f"  rank {r.rank}: {r.error}" for r in summary.failed]
    if summary.collectives is not None:
        lines += format_check(summary.collectives)
    return "\n".join(lines)


def write_summary(summary: BatchSummary, path: Path) -> None:
    with atomic_output(path) as out:
        out.write(orjson.dumps(summary.to_dict(), option=orjson.OPT_INDENT_2))


# --- the batch ----------------------------------------------------------------------------------


@dataclass
class BatchConfig:
    """``et-link batch`` options. ``workers`` None = CPU count; ``memory_budget`` None =
    ``MEMORY_BUDGET_SHARE`` of MemAvailable (local runs only)."""

    et_glob: str | None  # None: Kineto-only ranks
    kineto_glob: str
    output_dir: Path
    options: LinkOptions = field(default_factory=LinkOptions)
    fmt: str = "json"
    gzip: bool = False
    workers: int | None = None
    scheduler: str | None = None
    rank_pattern: str | None = None
    redo: bool = False
    verify_existing: bool = False
    memory_budget: int | None = None
    skip_unpaired: bool = False  # link the ranks that have both files; note the others


@dataclass
class BatchPlan:
    pairing: Pairing
    to_run: list[RankTask]
    complete: list[RankResult]


def default_workers() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:
        return os.cpu_count() or 1


def plan_batch(config: BatchConfig) -> BatchPlan:
    """Find and pair the files, make the tasks, set aside the complete ranks.

    Raises ``BatchSetupError`` (no files, bad format) or ``PairingError`` before anything is
    written. Creates the output directory. Cost: O(files) + one header read per Kineto file +
    a few stats per rank.
    """
    if config.fmt not in ("json", "et"):
        raise BatchSetupError(f"unknown --format {config.fmt!r}; choose json or et")
    et_paths = expand_glob(config.et_glob) if config.et_glob is not None else []
    kineto_paths = expand_glob(config.kineto_glob)
    if not et_paths and config.et_glob is not None:
        raise BatchSetupError(f"no file matches --et {config.et_glob!r}")
    if not kineto_paths:
        raise BatchSetupError(f"no file matches --kineto {config.kineto_glob!r}")
    pairing = pair_rank_files(et_paths, kineto_paths, config.rank_pattern, config.skip_unpaired)
    if pairing.problems:
        raise PairingError(pairing.problems)
    output_dir = Path(config.output_dir).absolute()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BatchSetupError(f"cannot create the output directory {output_dir}: {err}") from None
    if not output_dir.is_dir() or not os.access(output_dir, os.W_OK | os.X_OK):
        raise BatchSetupError(f"{output_dir}: the output directory is not writable")
    tasks = [make_task(p, output_dir, config.options, config.fmt, config.gzip) for p in pairing.pairs]
    complete, to_run = [], []
    for task in tasks:
        done = None if config.redo else completed_result(task, config.verify_existing)
        (complete if done else to_run).append(done or task)
    return BatchPlan(pairing, to_run, complete)


def _report_done(progress: BatchProgress | None, task: RankTask, result: RankResult) -> None:
    if progress:
        progress.finished(task.rank, result.ok, task.input_bytes, _finished_line(result))


def _finished_line(result: RankResult) -> str:
    if not result.ok:
        return f"rank {result.rank} FAILED: {result.error}"
    peak = f", {result.peak_rss_bytes / 2**20:.0f} MB" if result.peak_rss_bytes else ""
    return (f"rank {result.rank}: {result.method}, linked {result.linked_pct:.2f}%, GPU ops "
            f"{result.gpu_linked_pct:.2f}%, {result.wall_seconds or 0:.2f}s{peak}")


def run_batch(config: BatchConfig, progress_stream=None, interactive: bool | None = None,
              quiet: bool = False) -> BatchSummary:
    """Plan, run and summarise a batch; writes ``summary.json`` in the output directory.

    Raises ``BatchSetupError``/``PairingError`` before any work; afterwards rank failures are
    recorded in the summary, never raised. Progress goes to ``progress_stream`` (stderr).
    """
    started = time.monotonic()
    if config.scheduler:
        _import_distributed()  # fail before anything is written
    plan = plan_batch(config)
    workers = config.workers or default_workers()
    if workers < 1:
        raise BatchSetupError("--workers must be at least 1")
    progress = BatchProgress(len(plan.to_run), sum(t.input_bytes for t in plan.to_run), progress_stream,
                             interactive, "submitted" if config.scheduler else "running", quiet)
    for note in plan.pairing.notes:
        progress.note(note)
    if plan.complete:
        progress.note(f"{len(plan.complete)} rank(s) already complete, skipped (--redo to link them again): "
                      f"{format_ranks(r.rank for r in plan.complete)}")

    if config.scheduler:
        executor = f"Dask scheduler {config.scheduler}"
        results = run_dask(plan.to_run, config.scheduler, progress) if plan.to_run else []
    else:
        available = available_memory_bytes()
        budget = config.memory_budget or (int(available * MEMORY_BUDGET_SHARE) if available else None)
        executor = f"local, {workers} workers" + (f", memory budget {budget / 2**30:.1f} GiB" if budget else "")
        results = run_local(plan.to_run, workers, budget, progress) if plan.to_run else []
    progress.close()
    ranks = sorted(results + plan.complete, key=lambda r: r.rank)
    output_dir = Path(config.output_dir).absolute()
    collectives = check_job({r.rank: r.report for r in ranks if r.ok}, [r.rank for r in ranks],
                            plan.pairing.world_size, output_dir / COMM_GROUPS_FILE if config.fmt == "et" else None)
    elapsed = time.monotonic() - started
    summary = BatchSummary(
        output_dir=str(output_dir), executor=executor, ranks=ranks,
        totals=summarize_totals(ranks, elapsed), outliers=find_outliers(ranks), notes=plan.pairing.notes,
        options={"link": asdict(config.options), "format": config.fmt, "gzip": config.gzip,
                 "et": config.et_glob, "kineto": config.kineto_glob, "rank_pattern": config.rank_pattern},
        collectives=collectives)
    write_summary(summary, Path(summary.output_dir) / "summary.json")
    return summary


def parse_bytes(text: str) -> int:
    """``8G``, ``512M``, ``1.5GiB``, ``1000000`` -> bytes (binary multiples). Raises ValueError."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 8G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match.group(2).lower()]
    value = int(float(match.group(1)) * scale)
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value

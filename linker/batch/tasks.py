"""What a worker is given (``RankTask``, step 2 of ``et-link batch``) and what it gives back
(``RankResult``); output names; the progress line of a finished rank. Cost: O(1) per rank.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from linker.link.recipe import LinkOptions
from linker.link.report import gpu_headline_parts
from linker.batch.progress import BatchProgress
from linker.batch.memory import estimate_peak_bytes, uncompressed_size
from linker.batch.pairing import RankPair


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
    gpu_not_attached: dict[str, int] = field(default_factory=dict)  # headline part -> GPU events (not "attached")
    warnings: list[str] = field(default_factory=list)
    wall_seconds: float | None = None
    peak_rss_bytes: int | None = None
    base_rss_bytes: int | None = None
    input_bytes: int = 0
    estimated_peak_bytes: int = 0
    host: str = ""
    # The output's (earliest measured start, latest measured end), µs, as ``et-link simulate``
    # reads them (``plan.rank_start.et_plus_span``); None when not known (the output is then read).
    measured_span: list[float] | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"


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


def base_result(task: RankTask, status: str) -> RankResult:
    return RankResult(rank=task.rank, status=status, et=str(task.et) if task.et else None, kineto=str(task.kineto),
                      input_bytes=task.input_bytes, estimated_peak_bytes=task.estimated_peak_bytes,
                      host=socket.gethostname())


def failed_result(task: RankTask, error: str, wall: float | None = None, peak: int | None = None) -> RankResult:
    result = base_result(task, "failed")
    result.error, result.wall_seconds, result.peak_rss_bytes = error, wall, peak
    return result


def fill_from_report(result: RankResult, report: dict) -> RankResult:
    result.method = report.get("method")
    for name in ("et_ops", "linked_ops", "gpu_events", "gpu_events_linked"):
        setattr(result, name, int(report.get(name) or 0))
    result.linked_pct = report.get("linked_pct")
    result.gpu_linked_pct = report.get("gpu_linked_pct")
    if report.get("gpu_accounting"):  # the link's headline: every GPU event of the file, not the window's
        parts = gpu_headline_parts(report["gpu_accounting"])
        result.gpu_events, result.gpu_events_linked = sum(parts.values()), parts["attached"]
        result.gpu_not_attached = {part: count for part, count in parts.items() if part != "attached" and count}
        result.gpu_linked_pct = round(100.0 * parts["attached"] / result.gpu_events, 3) if result.gpu_events else 100.0
    result.warnings = list(report.get("warnings") or [])
    return result


def report_done(progress: BatchProgress | None, task: RankTask, result: RankResult) -> None:
    if progress:
        progress.finished(task.rank, result.ok, task.input_bytes, finished_line(result))


def finished_line(result: RankResult) -> str:
    if not result.ok:
        return f"rank {result.rank} FAILED: {result.error}"
    peak = f", {result.peak_rss_bytes / 2**20:.0f} MB" if result.peak_rss_bytes else ""
    return (f"rank {result.rank}: {result.method}, linked {result.linked_pct:.2f}%, GPU events attached "
            f"{result.gpu_linked_pct:.2f}%, {result.wall_seconds or 0:.2f}s{peak}")

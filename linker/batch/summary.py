"""Summarise a batch (step 5 of ``et-link batch``): job totals, the ranks that stand out, the
printed table, ``summary.json``. Cost: O(ranks log ranks).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import orjson

from linker.link.report import GPU_PART_WORDS
from linker.write.sink import atomic_output
from linker.batch.collectives import CollectiveCheck, format_check
from linker.batch.tasks import RankResult

# A rank stands out when its linked % (or GPU %) is this many points below the median, or more
# than OUTLIER_MADS median absolute deviations below it, whichever is larger.
OUTLIER_MIN_POINTS = 5.0
OUTLIER_MADS = 3.0
OUTLIER_SLOW_FACTOR = 2.0  # and at least OUTLIER_SLOW_MIN_SECONDS above the median
OUTLIER_SLOW_MIN_SECONDS = 1.0
OUTLIER_MEMORY_FACTOR = 1.5  # and at least OUTLIER_MEMORY_MIN_BYTES above the median
OUTLIER_MEMORY_MIN_BYTES = 100 << 20
OUTLIER_EXTRA_WARNINGS = 2


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
    simulator: dict | None = None  # rank start offsets and the ASTRA-sim setup (``job.simulator_setup``)

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


def _with_gpu_reasons(outlier: Outlier, results: list[RankResult]) -> Outlier:
    """The GPU-attached outlier with the rank's reasons, in the single-pair summary's words
    (``link.report.GPU_PART_WORDS``: "64 launched before the trace")."""
    rank = next(r for r in results if r.rank == outlier.rank)
    reasons = ", ".join(f"{count:,} {GPU_PART_WORDS.get(part, part)}" for part, count in rank.gpu_not_attached.items())
    if reasons:
        outlier.reason += f" ({reasons})"
    return outlier


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
    outliers += [_with_gpu_reasons(o, ok) for o in _low_outliers(ok, "gpu_linked_pct", "GPU ops attached")]
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
    lines += (summary.simulator or {}).get("lines", [])
    return "\n".join(lines)


def write_summary(summary: BatchSummary, path: Path) -> None:
    with atomic_output(path) as out:
        out.write(orjson.dumps(summary.to_dict(), option=orjson.OPT_INDENT_2))

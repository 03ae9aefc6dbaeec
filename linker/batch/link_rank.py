"""Link one rank in this process and keep the record that lets a rerun skip it.

``run_rank_task`` is the body of every worker (local or Dask); ``completed_result`` reads the
report sidecar back to tell whether a rank's output is already complete. Cost: one link; a few
``stat`` calls and one small JSON read per skipped rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import time
from dataclasses import asdict
from pathlib import Path

import orjson

from linker.model.errors import EtLinkError, MismatchedPairError, TraceInputError
from linker.write.sink import atomic_output
from linker.batch.collectives import SIDECAR_KEY
from linker.batch.tasks import RankResult, RankTask, base_result, failed_result, fill_from_report

log = logging.getLogger("et_link")

SIDECAR_VERSION = 2  # 2: the sidecar holds the rank's collectives


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


def run_rank_task(task: RankTask) -> RankResult:
    """Link one rank in this process and write its output and report sidecar; never raises.

    The sidecar (``task.report_path``) is the link report plus a ``batch`` record of the output's
    and inputs' size/mtime, the options, wall time and peak RSS, and the rank's communication
    ops (``collectives``, see ``batch.collectives``); it is removed first and written last, so it exists
    only next to a complete output. Peak memory is this process's
    ``ru_maxrss``: meaningful because every task runs in a fresh process.
    """
    from linker.batch.collectives import rank_collectives
    from linker.pipeline import link_pair
    from linker.plan.rank_start import et_plus_span
    from linker.sim.file_waits import add_file_waits

    started = time.perf_counter()
    base = _current_rss_bytes()
    with contextlib.suppress(OSError):
        task.report_path.unlink()
    try:
        outcome = link_pair(task.et, task.kineto, task.output, task.options)  # Schedule.serial()
        collectives = rank_collectives(outcome.et_plus).to_record()
        span = et_plus_span(outcome.et_plus)
        wait_nodes = add_file_waits(outcome, task.options.waits, keep_link=False)
        outcome.et_plus = None
    except MismatchedPairError as err:
        return failed_result(task, f"not the same run: {err}", time.perf_counter() - started, _peak_rss_bytes())
    except (EtLinkError, OSError) as err:  # the rank's files or options; anything else is a bug (below)
        return failed_result(task, str(err), time.perf_counter() - started, _peak_rss_bytes())
    except MemoryError:
        return failed_result(task, "out of memory", time.perf_counter() - started, _peak_rss_bytes())
    except Exception as err:  # an et-link bug must not stop the other ranks
        log.debug("rank %d: internal error", task.rank, exc_info=True)
        return failed_result(task, f"internal error: {type(err).__name__}: {err}",
                             time.perf_counter() - started, _peak_rss_bytes())
    wall, peak = time.perf_counter() - started, _peak_rss_bytes()
    result = fill_from_report(base_result(task, "linked"), outcome.report.to_dict())
    result.output, result.report = str(task.output), str(task.report_path)
    result.wall_seconds, result.peak_rss_bytes, result.base_rss_bytes = wall, peak, base
    result.measured_span = list(span) if span is not None else None
    record = {"version": SIDECAR_VERSION, "output": _file_stamp(task.output),
              "inputs": [_file_stamp(p) for p in (task.et, task.kineto) if p],
              "options": asdict(task.options), "wall_seconds": round(wall, 3),
              "peak_rss_bytes": peak, "base_rss_bytes": base, "host": result.host,
              "measured_span": result.measured_span, "wait_nodes": wait_nodes}
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
    result = fill_from_report(base_result(task, "skipped"), doc)
    result.output, result.report = str(task.output), str(task.report_path)
    result.wall_seconds = record.get("wall_seconds")
    result.peak_rss_bytes = record.get("peak_rss_bytes")
    result.base_rss_bytes = record.get("base_rss_bytes")
    result.host = record.get("host") or result.host
    span = record.get("measured_span")
    if isinstance(span, list) and len(span) == 2 and all(isinstance(v, (int, float)) for v in span):
        result.measured_span = [float(v) for v in span]
    return result


def _output_is_valid(path: Path) -> bool:
    from linker.write.validate import validate_file

    try:
        return validate_file(path).ok
    except Exception:  # undecodable output: not complete
        return False

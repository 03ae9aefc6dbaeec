"""One pair from files to files: read, link, write the ET+ and the report.

``link_pair`` is what the CLI and the batch runner call for each (ET, Kineto) pair.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from .et_reader import read_execution_trace
from .etplus import build_et_plus
from .fileio import atomic_output
from .kineto_reader import read_kineto_trace
from .link import LinkOptions, link
from .report import LinkReport

log = logging.getLogger("et_link")

JSON_SUFFIXES = (".json", ".json.gz")
CHAKRA_SUFFIXES = (".et", ".et.gz")


def default_output_path(et_path: str | os.PathLike, fmt: str = "json") -> Path:
    """``<ET name>_plus.json`` (or ``.et``) beside the ET; ``x.json.gz`` -> ``x_plus.json``."""
    p = Path(et_path)
    stem = p.name
    for suffix in (".gz", ".json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return p.with_name(f"{stem}_plus.{'et' if fmt == 'et' else 'json'}")


def output_format(path: str | os.PathLike) -> str:
    """"json" or "et" from the output path's suffix (json when unknown)."""
    name = str(path)
    return "et" if name.endswith(CHAKRA_SUFFIXES) else "json"


@dataclass
class PairOutcome:
    report: LinkReport
    output: Path
    report_path: Path | None


def write_report(report: LinkReport, path: str | os.PathLike, protected: tuple = ()) -> None:
    with atomic_output(path, protected) as out:
        out.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))


def add_simulation_counts(report: LinkReport, et_plus) -> None:
    """Copy the dependency plan's counts (data dependencies by cause, waits, busy split) into the
    report, once a writer has computed the plan."""
    summary = et_plus.plan_summary
    if summary is None:
        return
    busy = et_plus.plan.busy
    report.dependency_causes = dict(sorted(summary.dependency_causes.items()))
    report.dependencies = sum(summary.dependency_causes.values())
    report.simulation = {
        "blocked_us": round(sum(busy.blocked), 3), "host_gap_us": round(sum(busy.host_gap), 3),
        "sim_busy_us": round(sum(busy.sim), 3), "main_thread": busy.main_tid,
        "fork_join_edges": len(busy.cross), "wait_edges": summary.wait_edges,
        "copy_wait_edges": summary.copy_wait_edges, "waits_skipped": dict(summary.waits_skipped),
    }


def link_pair(
    et_path: str | os.PathLike,
    kineto_path: str | os.PathLike,
    output: str | os.PathLike | None = None,
    options: LinkOptions | None = None,
    report_path: str | os.PathLike | None = None,
) -> PairOutcome:
    """Link one pair and write the ET+ (JSON or Chakra by suffix) and, if asked, the report.

    Raises ``TraceInputError`` (bad file) or ``MismatchedPairError`` (different runs); then
    nothing is written.
    """
    output = Path(output) if output else default_output_path(et_path)
    protected = (et_path, kineto_path)
    et = read_execution_trace(et_path)
    log.info("read ET %s: %d nodes, schema %r (%s layout)", et_path, len(et), et.schema, et.layout)
    kineto = read_kineto_trace(kineto_path)
    log.info("read Kineto %s: %d CPU events, %d GPU events", kineto_path,
             len(kineto.cpu_events), len(kineto.gpu_events))
    result = link(et, kineto, options)
    et_plus = build_et_plus(result)
    if output_format(output) == "et":
        from .write_chakra import write_et_plus_chakra

        write_et_plus_chakra(et_plus, output, protected)
    else:
        from .sim_fields import annotate_et_plus
        from .write_json import write_et_plus_json

        annotate_et_plus(et_plus)
        write_et_plus_json(et_plus, output, protected)
    add_simulation_counts(result.report, et_plus)
    if report_path:
        write_report(result.report, report_path, protected)
    return PairOutcome(result.report, output, Path(report_path) if report_path else None)

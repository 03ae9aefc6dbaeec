"""One pair from files to files: read, link, write the ET+ and the report.

``link_pair`` is what the CLI and the batch runner call for each (ET, Kineto) pair.
"""

from __future__ import annotations

import contextlib
import gc
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


def read_pair(et_path: str | os.PathLike, kineto_path: str | os.PathLike):
    """Read the ET, then the Kineto trace (an ET error is raised first).

    One after the other on purpose: reading the Kineto trace in a thread beside the ET measured
    1.4x slower (4.1-4.4 s vs 2.9 s on the large pair): msgspec decodes hold the GIL, and the
    thread inflating gzip waits a switch interval each time it wants the GIL back."""
    return read_execution_trace(et_path), read_kineto_trace(kineto_path)


@contextlib.contextmanager
def collector_paused():
    """Pause Python's cyclic garbage collector for the block (restored after, even on error).

    Reading a large pair allocates millions of small objects that are never garbage (nodes,
    events, columns); each full collection walks all of them, which more than doubled the time
    of a large link. Reference counting still frees everything as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
    with collector_paused():
        return _link_pair(et_path, kineto_path, output, options, report_path)


def _link_pair(et_path, kineto_path, output, options, report_path) -> PairOutcome:
    output = Path(output) if output else default_output_path(et_path)
    protected = (et_path, kineto_path)
    et, kineto = read_pair(et_path, kineto_path)
    log.info("read ET %s: %d nodes, schema %r (%s layout)", et_path, len(et), et.schema, et.layout)
    log.info("read Kineto %s: %d CPU events, %d GPU events", kineto_path,
             len(kineto.cpu_events), len(kineto.gpu_events))
    result = link(et, kineto, options)
    et_plus = build_et_plus(result)
    if output_format(output) == "et":
        from .write_chakra import write_et_plus_chakra

        write_et_plus_chakra(et_plus, output, protected)
    else:
        from .write_json import write_et_plus_json

        write_et_plus_json(et_plus, output, protected)
    if report_path:
        write_report(result.report, report_path, protected)
    return PairOutcome(result.report, output, Path(report_path) if report_path else None)

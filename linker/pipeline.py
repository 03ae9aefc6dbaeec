"""One pair from files to files: check outputs, read, check inputs, link, write ET+ and report.

``link_pair`` is what the CLI and the batch runner call for each (ET, Kineto) pair, or for a Kineto
trace alone. Order matters
for trust: output paths are checked before any reading or linking (``fileio.check_output_paths``),
the decoded inputs go through ``sanity`` (refuse or repair, with warnings), and the report is
written to its temporary file before the ET+ so that a failure leaves neither. Every user-fixable
failure is a ``TraceInputError`` naming the file. Cost: that of reading + linking + writing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from linker.schedule import kineto_child as kineto_ahead

from linker.schedule import prefill as output_space
from linker.read.et import read_execution_trace
from linker.model.errors import TraceInputError
from linker.link.etplus import EtPlus, build_et_plus
from linker.read.files import atomic_output, check_output_paths, collector_paused, decoding
from linker.schedule.fork import spare_core
from linker.read.kineto import read_kineto_trace
from linker.read.timing import is_sqlite_file, read_timing_trace, source_notes, seq_agreement
from linker.link.recipe import LinkOptions, link
from linker.link.report import LinkReport
from linker.read.sanity import check_execution_trace, check_kineto_trace

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
    seconds: float = 0.0  # wall time of the whole pair: read, check, link, write
    et_plus: EtPlus | None = None  # what was written (the batch reads its collectives)


def _report_bytes(report: LinkReport) -> bytes:
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2)


def read_pair(et_path, kineto_path, read_ahead: bool = True, fields=None, rf_id_first: bool = False,
              et_read: Callable[[object], object] | None = None):
    """Read both files and run the input sanity checks. Returns (et, kineto, warnings).

    With ``read_ahead`` a large Kineto trace is read and checked by a forked child meanwhile
    (``kineto_ahead``: faster when a core is free, about 0.7 s more CPU on a 400k-event trace, so
    batch workers, which already fill the cores, turn it off); errors are those of reading and
    checking the files one after the other (the ET's first), whichever process met them.
    ``fields`` (a ``chakra_ahead.FieldsAhead``): the ET is inflated into its shared text, and its
    child told to go once the ET is read (the Kineto child is about done: going then, rather than
    once it was, took 0.1 s off a large ``.et``).
    With a Kineto child, the ET's own work (input check, tree order: ``_EtAhead``) comes next,
    while the child finishes (nesting its CPU events, on a CPU run whose ET is the larger file) or
    still reads (a Kineto trace larger than its ET, as GPU runs have); taking the child's trace is
    then quick (``kineto_ahead.finish``: the CPU events stay encoded until read). ``rf_id_first``:
    the link will try record-function ids first; a CPU trace with ids then keeps its CPU events in
    the file, where they are read again only if something reads them (``kineto_ahead.start``).
    ``et_read(et)`` is called once the ET is read (the output's prefill starts then)."""
    child = kineto_ahead.start(kineto_path, rf_id_first) if read_ahead and not is_sqlite_file(kineto_path) else None
    ahead = None
    try:
        with decoding(et_path, "Execution Trace"):
            et = read_execution_trace(et_path, fields.inflate_into if fields is not None else None)
        log.info("read ET %s: %d nodes, schema %r (%s layout)", et_path, len(et), et.schema, et.layout)
        if et_read is not None:
            et_read(et)
        if fields is not None:
            fields.go(et)
        if child is not None:
            ahead = _EtAhead(et)
        checked = kineto_ahead.finish(child)
        if checked is None:
            kineto = _read_kineto(kineto_path, et.pid)
            checked = kineto, check_kineto_trace(kineto)
        else:
            _log_kineto(kineto_path, checked[0])
    finally:
        if child is not None:
            child.cancel()
    kineto, kineto_warnings = checked
    return et, kineto, _et_warnings(et, ahead) + kineto_warnings


class _EtAhead:
    """The ET's input check and the plan's part that needs only the ET (``chakra_deps.tree_order``,
    kept on the ET), run while the parent would wait for the Kineto child: the check's outcome,
    warnings or refusal, is kept and given where reading the files one after the other has it
    (``_et_warnings``: after the Kineto file is read, so a bad Kineto file is still named first).
    The tree order waits for a check that passed: a repair may change the columns."""

    def __init__(self, et):
        self.warnings: list[str] = []
        self.refusal: TraceInputError | None = None
        try:
            self.warnings = check_execution_trace(et)
        except TraceInputError as err:
            self.refusal = err
            return
        from linker.plan.deps import tree_order

        tree_order(et)


def _et_warnings(et, ahead: _EtAhead | None) -> list[str]:
    """The ET input check's warnings (``check_execution_trace``), or its refusal raised; from
    ``ahead`` when it ran there."""
    if ahead is None:
        return check_execution_trace(et)
    if ahead.refusal is not None:
        raise ahead.refusal
    return ahead.warnings


def _read_kineto(kineto_path, prefer_pid=None):
    """The timing trace (Kineto, or an Nsight Systems / nvprof SQLite file: ``read_timing_trace``;
    ``prefer_pid``, the ET's, picks the process of a multi-process file), with decode errors named
    against the file."""
    with decoding(kineto_path, "Kineto trace"):
        kineto = read_timing_trace(kineto_path, prefer_pid, read_kineto_trace)
    _log_kineto(kineto_path, kineto)
    return kineto


def _log_kineto(kineto_path, kineto) -> None:
    log.info("read Kineto %s: %d CPU events, %d GPU events", kineto_path,
             kineto.cpu_count(), len(kineto.gpu_events))


def _write_et_plus(et_plus, output: Path, protected: tuple, et_path, fields=None) -> None:
    try:
        if output_format(output) == "et":
            from linker.write.chakra import write_et_plus_chakra

            pre_encoded = fields.take(et_plus.et) if fields is not None else None
            write_et_plus_chakra(et_plus, output, protected, pre_encoded)
        else:
            from linker.write.etplus_json import write_et_plus_json

            write_et_plus_json(et_plus, output, protected)
    except (ValueError, OverflowError) as err:
        # A value of the input that the output format cannot hold (nothing was left behind).
        raise TraceInputError(et_path, f"cannot be written as {output.name}: {err}") from None


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


def plan_simulation(et_plus, output: Path, report: LinkReport) -> None:
    """Compute the dependency plan (busy durations, dependencies with causes) once, before the
    report and the ET+ are written; for JSON output also fill the ET+ simulation fields."""
    from linker.plan.deps import dependency_plan

    dependency_plan(et_plus)
    if output_format(output) != "et":
        from linker.plan.json_fields import annotate_et_plus

        annotate_et_plus(et_plus)
    add_simulation_counts(report, et_plus)


def link_pair(
    et_path: str | os.PathLike | None,
    kineto_path: str | os.PathLike,
    output: str | os.PathLike | None = None,
    options: LinkOptions | None = None,
    report_path: str | os.PathLike | None = None,
    read_ahead: bool = True,
) -> PairOutcome:
    """Link one pair and write the ET+ (JSON or Chakra by suffix) and, if asked, the report.

    With ``et_path`` None the host graph comes from the Kineto trace alone (``kineto_graph``; the
    default output is then ``<Kineto name>_plus.json`` beside it). ``read_ahead``: a core is
    spare, so a large Kineto trace is read by a forked child (``read_pair``) and a large JSON output
    is prefilled while linking (``output_space.prefill_later``); batch workers turn it off. Raises
    ``TraceInputError`` (bad file) or ``MismatchedPairError`` (different runs); then nothing is written.
    """
    with collector_paused():
        return _link_pair(et_path, kineto_path, output, options, report_path, read_ahead)


def _link_pair(et_path, kineto_path, output, options, report_path, read_ahead) -> PairOutcome:
    started = time.perf_counter()
    beside = et_path if et_path is not None else kineto_path
    defaulted = not output
    output = Path(output) if output else default_output_path(beside)
    protected = tuple(p for p in (et_path, kineto_path) if p is not None)
    try:
        check_output_paths([output, report_path], protected)
    except TraceInputError as err:
        if defaulted and err.path == str(output):
            raise TraceInputError(output, f"{err.problem} (the default output beside the input; choose "
                                  "another with -o)") from None
        raise
    if et_path is None:
        return _link_and_write(_link_kineto_alone(kineto_path), output, report_path, protected, beside, started)
    fields = _fields_ahead(et_path, output) if read_ahead else None
    try:
        rf_id_first = (options or LinkOptions()).method in ("auto", "rf_id")
        with output_space.prefill_later(output) as prefill:
            et_read = (lambda et: prefill(_prefill_bytes(output, et))) if read_ahead and spare_core() else None
            et, kineto, input_warnings = read_pair(et_path, kineto_path, read_ahead, fields, rf_id_first, et_read)
            if et_read is not None:
                prefill(_prefill_bytes(output, et, kineto))  # its GPU ops too, now known
            result = link(et, kineto, options)
            result.report.warnings[:0] = input_warnings
            return _link_and_write(result, output, report_path, protected, beside, started, fields)
    finally:
        if fields is not None:
            fields.cancel()


def _fields_ahead(et_path, output: Path):
    """For a ``.et`` output: the child encoding the ET's own fields of its ops meanwhile
    (``chakra_ahead``; None for a small ET or where it cannot run)."""
    if output_format(output) != "et":
        return None
    from linker.schedule import fields_child as chakra_ahead

    return chakra_ahead.start(et_path)


PREFILL_MIN_BYTES = 64 << 20  # smaller outputs are written quickly enough as they come


def _prefill_bytes(output: Path, et, kineto=None) -> int:
    """How much of a plain JSON output to prefill while linking (``output_space.prefill_later``):
    the ET's text plus a little per node and GPU op (under the ET+ on the traces we have: 388 of
    410 MB on the large pair; without ``kineto``, the ET's part); 0 for other formats and outputs
    under ``PREFILL_MIN_BYTES``."""
    if not str(output).endswith(".json"):
        return 0
    guess = et.text_bytes + 64 * len(et.nodes) + (256 * len(kineto.gpu_events) if kineto is not None else 0)
    return guess if guess >= PREFILL_MIN_BYTES else 0


def _link_and_write(result, output: Path, report_path, protected: tuple, beside, started: float,
                    fields=None) -> PairOutcome:
    """Build the ET+ of ``result``, plan it, write the report and the ET+ (``fields``: see
    ``_fields_ahead``)."""
    _note_timing_source(result)
    et_plus = build_et_plus(result)
    plan_simulation(et_plus, output, result.report)
    report_output = atomic_output(report_path, protected) if report_path else contextlib.nullcontext()
    with report_output as report_stream:
        if report_stream is not None:
            report_stream.write(_report_bytes(result.report))
            report_stream.flush()  # a full disk shows here, before the ET+ is written
        _write_et_plus(et_plus, output, protected, beside, fields)
    return PairOutcome(result.report, output, Path(report_path) if report_path else None,
                       time.perf_counter() - started, et_plus)


def _link_kineto_alone(kineto_path: str | os.PathLike):
    """No ET: read and check the Kineto trace, build the host graph from it and attach its GPU work."""
    from linker.link.kineto_only import link_kineto_only

    kineto = _read_kineto(kineto_path)
    warnings = check_kineto_trace(kineto)
    result = link_kineto_only(kineto)
    result.report.warnings[:0] = warnings
    return result


def _note_timing_source(result) -> None:
    """Put what the timing source says about itself (an Nsight Systems / nvprof file: kind,
    version, ranges left out; the seq check of a link by order) into the report."""
    notes, warnings = source_notes(result.kineto)
    if result.report.host_graph == "execution trace" and result.match.method != "rf_id":
        check = seq_agreement(result.et, result.kineto, result.match.event_of_op)
        notes += [check] if check else []
        warnings += [check] if check and "BELOW" in check else []
    result.report.method_reason.extend(notes)
    result.report.warnings.extend(w for w in warnings if w not in result.report.warnings)

"""One pair from files to files: check outputs, read, check inputs, link, write ET+ and report.

``link_pair`` is what the CLI and the batch runner call for each (ET, Kineto) pair, or for a Kineto
trace alone, under a ``Schedule`` (serial unless told: the CLI's is ``Schedule.auto()``). The
output is decided once (``Output.of``: path, format, compression). Order matters
for trust: output paths are checked before any reading or linking (``files.check_output_paths``),
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
from typing import TYPE_CHECKING, Callable, NamedTuple

import orjson

from linker.link.etplus import EtPlus, build_et_plus
from linker.read.timing import read_timing_trace, seq_agreement, source_notes
from linker.link.recipe import LinkOptions, link
from linker.link.report import LinkReport
from linker.model.errors import TraceInputError
from linker.model.output import CHAKRA, Output
from linker.read.et import read_execution_trace
from linker.read.files import check_output_paths, decoding
from linker.read.kineto import read_kineto_trace
from linker.read.sanity import check_execution_trace, check_kineto_trace
from linker.schedule import Schedule
from linker.schedule.kineto_child import CheckedKineto, finish
from linker.write.sink import atomic_output

if TYPE_CHECKING:
    from linker.plan.dependency_plan import WriteSummary

log = logging.getLogger("et_link")

def default_output_path(et_path: str | os.PathLike, fmt: str = "json") -> Path:
    """``<ET name>_plus.json`` (or ``.et``) beside the ET; ``x.json.gz`` -> ``x_plus.json``."""
    p = Path(et_path)
    stem = p.name
    for suffix in (".gz", ".json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return p.with_name(f"{stem}_plus.{'et' if fmt == 'et' else 'json'}")


@dataclass
class PairOutcome:
    report: LinkReport
    output: Path
    report_path: Path | None
    seconds: float = 0.0  # wall time of the whole pair: read, check, link, write
    et_plus: EtPlus | None = None  # what was written (the batch reads its collectives)
    written: WriteSummary | None = None  # what the ``.et`` writer wrote and decided (None for JSON)


def _report_bytes(report: LinkReport) -> bytes:
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2)


class Inputs(NamedTuple):
    """Both inputs read and checked: the ET, the Kineto trace, the checks' warnings (the ET's
    first), and what was computed beside the reading (None when it was not: the link computes
    it): the Kineto CPU events' nesting."""

    et: object
    kineto: object
    warnings: list[str]
    nesting: object = None
    child: object = None  # the Kineto child, kept while its pending CPU events may be read
    tree: object = None  # the checked ET's ``plan.deps.TreeOrder``, made while a Kineto child worked


def _cancel(child) -> None:
    if child is not None:
        child.cancel()


def read_pair(et_path, kineto_path, schedule: Schedule | None = None):
    """Read both files and run the input sanity checks. Returns (et, kineto, warnings).

    Errors are those of reading and checking the files one after the other (the ET's first),
    under any ``schedule`` (default ``Schedule.serial()``)."""
    inputs = read_inputs(et_path, kineto_path, schedule or Schedule.serial())
    try:
        inputs.kineto.decode_cpu_events()  # taken from the child before it goes
    finally:
        _cancel(inputs.child)
    return inputs[:3]


def read_inputs(et_path, kineto_path, schedule: Schedule, fields=None) -> Inputs:
    """``read_pair``'s work, with what was computed beside it. Under a schedule with a Kineto
    child (``Schedule.kineto_reader``) the Kineto trace is read, checked and nested by the child
    while this process reads the ET, then checks it; a child that failed leaves the Kineto read to
    this process (same trace, same errors). ``fields`` (a ``fields_child.FieldsAhead``): the ET is
    inflated into its shared text, and its child told to go once the Kineto child is done. The caller
    cancels ``Inputs.child`` once done with the Kineto trace (its CPU events stay on the child
    until read)."""
    child = schedule.kineto_reader(kineto_path)
    try:
        with decoding(et_path, "Execution Trace"):
            et = read_execution_trace(et_path, fields.inflate_into if fields is not None else None)
        log.info("read ET %s: %d nodes, schema %r (%s layout)", et_path, len(et), et.schema, et.layout)
        ahead = _EtChecked(et)  # beside a Kineto child still at work; its refusal comes after the Kineto read
        tree = None
        if child is not None and ahead.refusal is None:  # the plan's tree order, made while the child works
            from linker.plan.deps import tree_order

            tree = tree_order(et)
        checked = finish(child)
        if fields is not None:  # not before: beside the Kineto child it slowed the reading (docs/performance.md)
            fields.go(et)
        if checked is None:
            child = None  # reaped
            kineto = _read_kineto(kineto_path, et.pid)
            checked = CheckedKineto(kineto, check_kineto_trace(kineto))
        else:
            _log_kineto(kineto_path, checked.trace)
        return Inputs(et, checked.trace, ahead.result() + checked.warnings, checked.nesting, child, tree)
    except BaseException:
        _cancel(child)
        raise


class _EtChecked:
    """The ET's input check, made while a Kineto child still works. Its outcome, warnings or
    refusal, is kept and given where reading the files one after the other has it (``result``:
    after the Kineto file is read, so a bad Kineto file is still named first)."""

    def __init__(self, et):
        self.warnings: list[str] = []
        self.refusal: TraceInputError | None = None
        try:
            self.warnings = check_execution_trace(et)
        except TraceInputError as err:
            self.refusal = err

    def result(self) -> list[str]:
        """The check's warnings, or its refusal raised."""
        if self.refusal is not None:
            raise self.refusal
        return self.warnings


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


def _write_et_plus(et_plus, output: Output, protected: tuple, et_path, fields=None,
                   room=None) -> WriteSummary | None:
    """Write the ET+; the ``.et`` writer's summary, None for JSON (``room``: its file's
    ``write.sink.OutputRoom``, or None)."""
    try:
        if output.format == CHAKRA:
            from linker.write.chakra import write_et_plus_chakra

            pre_encoded = fields.take(et_plus.et) if fields is not None else None
            return write_et_plus_chakra(et_plus, output.path, protected, pre_encoded)
        from linker.write.etplus_json import write_et_plus_json

        write_et_plus_json(et_plus, output.path, protected, room=room)
        return None
    except (ValueError, OverflowError) as err:
        # A value of the input that the output format cannot hold (nothing was left behind).
        raise TraceInputError(et_path, f"cannot be written as {output.path.name}: {err}") from None


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
        "blocked_us": round(sum(busy.blocked.tolist()), 3), "host_gap_us": round(sum(busy.host_gap.tolist()), 3),
        "deferred_us": round(sum(busy.deferred.tolist()), 3),
        "sim_busy_us": round(sum(busy.sim.tolist()), 3), "main_thread": busy.main_tid,
        "fork_join_edges": len(busy.cross), "wait_edges": summary.wait_edges,
        "copy_wait_edges": summary.copy_wait_edges, "waits_skipped": dict(summary.waits_skipped),
        "blocking_copies": len(busy.blocking_copies), "clock_skew": busy.clock_skew,
        "cpu_collectives": len(et_plus.plan.cpu_comm),
    }
    if summary.comm_unresolved:  # in the report's warnings, so stderr says what the report says
        report.warnings.append("communication kernels replayed as plain GPU compute (their collective is not "
                               "known: " + "; ".join(f"{n} {why}" for why, n in sorted(summary.comm_unresolved.items())) + ")")
    unnamed = summary.cpu_comm_unnamed
    if unnamed["collectives"]:
        report.warnings.append(f"{unnamed['collectives']} CPU collectives name no process group (gloo records none) "
                               f"and the job had {unnamed['groups']}: all taken as the world group's, so another "
                               "group's are matched across ranks as if the world's")
    if unnamed["point_to_point"]:
        report.warnings.append(f"{unnamed['point_to_point']} CPU sends and receives name no process group and the job "
                               f"had {unnamed['groups']}: their peer is unknown, kept as CPU ops (their wait stays "
                               "busy time)")
    if summary.ctrl_deps_dropped:
        report.warnings.append(f"{summary.ctrl_deps_dropped} ops name a parent missing from the ET: written without it")


def plan_simulation(et_plus, output: Output, report: LinkReport, tree=None) -> None:
    """Compute the dependency plan (busy durations, dependencies with causes) once, before the
    report and the ET+ are written; for JSON output also fill the ET+ simulation fields.
    ``tree``: the ET's ``plan.deps.TreeOrder`` made while reading (``Inputs.tree``), or None."""
    from linker.plan.deps import dependency_plan

    dependency_plan(et_plus, tree=tree)
    if output.format != CHAKRA:
        from linker.plan.json_fields import annotate_et_plus

        annotate_et_plus(et_plus)
    add_simulation_counts(report, et_plus)


def link_pair(
    et_path: str | os.PathLike | None,
    kineto_path: str | os.PathLike,
    output: str | os.PathLike | None = None,
    options: LinkOptions | None = None,
    report_path: str | os.PathLike | None = None,
    schedule: Schedule | None = None,
    progress: Callable[[str], None] | None = None,
) -> PairOutcome:
    """Link one pair and write the ET+ (JSON or Chakra by suffix: ``Output.of``) and, if asked,
    the report.

    With ``et_path`` None the host graph comes from the Kineto trace alone (``kineto_only``; the
    default output is then ``<Kineto name>_plus.json`` beside it). ``schedule`` (default
    ``Schedule.serial()``; the CLI gives ``Schedule.auto()``) lays the work out over processes and
    threads; the outputs and errors are the same under every one. Raises ``TraceInputError`` (bad
    file) or ``MismatchedPairError`` (different runs); then nothing is written. ``progress``: called
    with "reading", "linking", "writing" as each stage starts.
    """
    schedule = schedule or Schedule.serial()
    with schedule.collector_paused():
        return _link_pair(et_path, kineto_path, output, options, report_path, schedule, progress or _silent)


def _silent(stage: str) -> None:
    pass


def _link_pair(et_path, kineto_path, output, options, report_path, schedule: Schedule, progress) -> PairOutcome:
    started = time.perf_counter()
    beside = et_path if et_path is not None else kineto_path
    defaulted = not output
    output = Output.of(output if output else default_output_path(beside))
    protected = tuple(p for p in (et_path, kineto_path) if p is not None)
    try:
        check_output_paths([output.path, report_path], protected)
    except TraceInputError as err:
        if defaulted and err.path == str(output.path):
            raise TraceInputError(output.path, f"{err.problem} (the default output beside the input; choose "
                                  "another with -o)") from None
        raise
    progress("reading")
    if et_path is None:
        result = _link_kineto_alone(kineto_path, progress)
        return _link_and_write(result, output, report_path, protected, beside, started, progress=progress)
    fields = schedule.fields_encoder(et_path, output)
    inputs = room = None
    try:
        inputs = read_inputs(et_path, kineto_path, schedule, fields)
        progress("linking")
        result = link(inputs.et, inputs.kineto, options, inputs.nesting)
        room = schedule.room_for(output, inputs.et.text_bytes)
        result.report.warnings[:0] = inputs.warnings
        return _link_and_write(result, output, report_path, protected, beside, started, fields, progress,
                               inputs.tree, room)
    finally:
        if room is not None:
            room.discard()  # nothing, once the write took it
        if fields is not None:
            fields.cancel()
        if inputs is not None:
            _cancel(inputs.child)


def _link_and_write(result, output: Output, report_path, protected: tuple, beside, started: float,
                    fields=None, progress=_silent, tree=None, room=None) -> PairOutcome:
    """Build the ET+ of ``result``, plan it, write the report and the ET+ (``fields``: the ET's
    own fields encoded by a child, ``Schedule.fields_encoder``; ``tree``: ``Inputs.tree``;
    ``room``: the output file's ``Schedule.room_for``)."""
    progress("writing")
    _note_timing_source(result)
    et_plus = build_et_plus(result)
    plan_simulation(et_plus, output, result.report, tree)
    report_output = atomic_output(report_path, protected) if report_path else contextlib.nullcontext()
    with report_output as report_stream:
        if report_stream is not None:
            report_stream.write(_report_bytes(result.report))
            report_stream.flush()  # a full disk shows here, before the ET+ is written
        written = _write_et_plus(et_plus, output, protected, beside, fields, room)
    return PairOutcome(result.report, output.path, Path(report_path) if report_path else None,
                       time.perf_counter() - started, et_plus, written)


def write_linked(result, output: str | os.PathLike, report_path: str | os.PathLike | None = None) -> PairOutcome:
    """Write an in-memory link ``result`` (``recipe.link``) as ``link_pair`` does: the ET+ (JSON or
    Chakra by suffix) and, if asked, the report; the inputs are refused as outputs."""
    output = Output.of(output)
    protected = tuple(p for p in (result.et.path, result.kineto.path) if p)
    check_output_paths([output.path, report_path], protected)
    return _link_and_write(result, output, report_path, protected, protected[0] if protected else output.path,
                           time.perf_counter())


def _link_kineto_alone(kineto_path: str | os.PathLike, progress=_silent):
    """No ET: read and check the Kineto trace, build the host graph from it and attach its GPU work."""
    from linker.link.kineto_only import link_kineto_only

    kineto = _read_kineto(kineto_path)
    warnings = check_kineto_trace(kineto)
    progress("linking")
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

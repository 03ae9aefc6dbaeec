"""``et-link simulate``: resolve the inputs, load every rank, replay, report, optionally write the trace.

Kept out of ``linker/cli.py`` so the command there stays a thin option parser. User mistakes raise
``TraceInputError`` / ``ValueError`` with a one-line message (the CLI prints it and exits 2); no output
file is written then. Cost: the sum of the loads, the replay and the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from linker.schedule import Schedule
from linker.model.errors import TraceInputError
from linker.sim.engine import MODELS, Scale, measured_release, replay
from linker.sim.job import read_comm_groups, resolve_inputs
from linker.sim.load import load_graph
from linker.sim.perfetto import write_trace
from linker.sim.report import build_report, format_text

RANK_STARTS = ("measured", "zero")


@dataclass
class SimulateOptions:
    files: list[Path]
    model: str = "astra-sim"
    scale: str = ""
    comm_groups: Path | None = None
    json_output: bool = False
    trace_out: Path | None = None
    top: int = 10
    rank_start: str = "measured"


def run_simulate(options: SimulateOptions, schedule: Schedule | None = None) -> tuple[str, bool]:
    """Run the whole command; return what to print on stdout and whether every node ran. The
    cyclic garbage collector is paused meanwhile (the graphs are millions of objects, never
    garbage). ``schedule``: default ``Schedule.serial()`` (the CLI's: ``Schedule.auto()``)."""
    schedule = schedule or Schedule.serial()
    with schedule.collector_paused():
        return _run_simulate(options, schedule)


def _run_simulate(options: SimulateOptions, schedule: Schedule) -> tuple[str, bool]:
    if options.model not in MODELS:
        raise ValueError(f"unknown --model {options.model!r}; choose one of {', '.join(MODELS)}")
    if options.rank_start not in RANK_STARTS:
        raise ValueError(f"unknown --rank-start {options.rank_start!r}; choose one of {', '.join(RANK_STARTS)}")
    if options.top < 0:
        raise ValueError("--top must be at least 0")
    scale = Scale.parse(options.scale)
    inputs = resolve_inputs(options.files, options.comm_groups)
    if options.trace_out is not None:
        for path, _ in inputs.files:
            if options.trace_out.exists() and options.trace_out.samefile(path):
                raise TraceInputError(options.trace_out, "--trace-out is one of the input files; refusing to overwrite it")
        if not options.trace_out.parent.is_dir():
            raise TraceInputError(options.trace_out, "output directory does not exist")
    groups = read_comm_groups(inputs.comm_groups_path) if inputs.comm_groups_path is not None else None
    graphs = [load_graph(path, rank, schedule) for path, rank in inputs.files]
    release, notes = None, list(inputs.notes)
    if len(graphs) > 1 and options.rank_start == "measured":
        release = measured_release(graphs)
        if release is None:
            notes.append("the ranks' measured start times do not look like one clock: every rank starts at 0")
    result = replay(graphs, options.model, scale, groups, release)
    report, _, _ = build_report(result, options.top)
    report.notes = notes + report.notes
    if options.trace_out is not None:
        write_trace(result, options.trace_out, tuple(path for path, _ in inputs.files))
    text = orjson.dumps(report.to_json()).decode() if options.json_output else format_text(report)
    schedule.keep_until_exit(graphs, result)  # a one-shot run exits without freeing them
    return text, report.finished

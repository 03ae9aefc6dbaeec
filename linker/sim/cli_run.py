"""``et-link simulate``: resolve the inputs, load every rank, replay, report, optionally write the trace.

Kept out of ``linker/cli.py`` so the command there stays a thin option parser. User mistakes raise
``TraceInputError`` / ``OptionError`` with a one-line message (the CLI prints it and exits 2); no output
file is written then. Cost: the sum of the loads, the replay and the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from linker.model.errors import OptionError, TraceInputError
from linker.plan.rank_start import MEASURED, RANK_STARTS, delay_positions
from linker.schedule import Schedule
from linker.model.waits import MEASURED_WAITS, check_waits
from linker.sim.engine import (MODELS, Scale, file_wait_nodes, measured_holds, measured_release, replay,
                               what_if_holds)
from linker.sim.graph import SimGraph
from linker.sim.hints import lanes_hints
from linker.sim.job import JobInputs, read_comm_groups, resolve_inputs
from linker.sim.load import load_graph
from linker.sim.network import NetworkSpec
from linker.sim.report import build_report, format_text, waits_summary
from linker.sim.simulation import Simulation



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
    explain: bool = False
    html: Path | None = None
    waits: str = MEASURED_WAITS
    network: str = ""  # ``--network bandwidth=RATE[,latency=TIME][,medium=bus|links]``; "" = as measured


STAGES = ("loading", "replaying", "reporting", "writing")


def run_simulate(options: SimulateOptions, progress: Callable[..., None] | None = None,
                 schedule: Schedule | None = None) -> tuple[str, bool]:
    """Run the whole command; return what to print on stdout and whether every node ran. The
    cyclic garbage collector is paused meanwhile (the graphs are millions of objects, never garbage).
    ``progress(stage, detail="")`` is called as each of ``STAGES`` starts (loading: per rank);
    ``schedule``: default ``Schedule.serial()`` (the CLI's: ``Schedule.auto()``)."""
    progress, schedule = progress or _silent, schedule or Schedule.serial()
    with schedule.collector_paused():
        inputs = _checked_inputs(options)
        simulation = simulate_inputs(inputs, options, progress, schedule)
        if options.trace_out is not None or options.html is not None:
            progress("writing")
        if options.trace_out is not None:
            simulation.write_trace(options.trace_out)
        if options.html is not None:
            simulation.write_html(options.html)
        report = simulation.report
        text = orjson.dumps(report.to_json()).decode() if options.json_output else format_text(report)
        schedule.keep_until_exit(simulation)  # a one-shot run exits without freeing it
        return text, report.finished


def _rank_release(graphs: list[SimGraph], rank_start: str) -> list[float] | None:
    """When each rank starts (docs/rank-start.md): ``measured`` = the offsets the files' delay nodes
    carry (``et-link batch`` writes them; ASTRA-sim replays them the same way), else, for files
    without them, the same rule applied to their measured times; ``zero`` = every rank at 0. The
    delay nodes are given duration 0 either way: the release replaces them, so each rank's
    simulated step still starts at its first op. O(n)."""
    carried = []
    for graph in graphs:
        positions = delay_positions(graph.names)
        carried.append(sum(graph.duration[u] for u in positions))
        for u in positions:
            graph.duration[u] = 0.0
    if rank_start != MEASURED:
        return None
    if any(carried):
        return carried
    return measured_release(graphs) if len(graphs) > 1 else None


def simulate(options: SimulateOptions, progress: Callable[..., None] | None = None,
             schedule: Schedule | None = None) -> Simulation:
    """Check the options, read the files, replay them and build the report (no output written).
    Raises ``TraceInputError`` / ``OptionError`` on a user mistake."""
    schedule = schedule or Schedule.serial()
    with schedule.collector_paused():
        return simulate_inputs(_checked_inputs(options), options, progress or _silent, schedule)


def _silent(stage: str, detail: str = "") -> None:
    pass


def _checked_inputs(options: SimulateOptions) -> JobInputs:
    """The options checked and the inputs resolved, before anything is read."""
    if options.model not in MODELS:
        raise OptionError(f"unknown --model {options.model!r}; choose one of {', '.join(MODELS)}")
    if options.rank_start not in RANK_STARTS:
        raise OptionError(f"unknown --rank-start {options.rank_start!r}; choose one of {', '.join(RANK_STARTS)}")
    check_waits(options.waits)
    if options.top < 0:
        raise OptionError("--top must be at least 0")
    Scale.parse(options.scale)
    if options.network:
        NetworkSpec.parse(options.network)
    inputs = resolve_inputs(options.files, options.comm_groups)
    for option, out in (("--trace-out", options.trace_out), ("--html", options.html)):
        if out is None:
            continue
        for path, _ in inputs.files:
            if out.exists() and out.samefile(path):
                raise TraceInputError(out, f"{option} is one of the input files; refusing to overwrite it")
        if not out.parent.is_dir():
            raise TraceInputError(out, "output directory does not exist")
    if options.html is not None:
        from linker.sim.view import ViewUnavailable, require_plotly
        try:
            require_plotly()  # before any reading: a missing extra is told at once
        except ViewUnavailable as err:
            raise TraceInputError(options.html, str(err)) from None
    return inputs


def simulate_inputs(inputs: JobInputs, options: SimulateOptions, progress: Callable[..., None],
                    schedule: Schedule) -> Simulation:
    """Load every rank, replay, build the report (with the readers' notes and the lanes hint)."""
    scale = Scale.parse(options.scale)
    network = NetworkSpec.parse(options.network) if options.network else None
    groups = read_comm_groups(inputs.comm_groups_path) if inputs.comm_groups_path is not None else None
    graphs = []
    for k, (path, rank) in enumerate(inputs.files):
        progress("loading", f"rank {rank}, {k + 1} of {len(inputs.files)}" if len(inputs.files) > 1 else "")
        graphs.append(load_graph(path, rank, schedule))
    release, notes = _rank_release(graphs, options.rank_start), list(inputs.notes)
    if release is None and len(graphs) > 1 and options.rank_start == MEASURED:
        notes.append("the ranks' measured start times do not look like one clock: every rank starts at 0")
    progress("replaying")
    holds = measured_holds(graphs, options.model)
    in_files = file_wait_nodes(options.model)  # the files' wait nodes replayed (astra-sim) or not (lanes)
    if holds and (scale != Scale() or network is not None):  # a what-if: each wait as the trace's replay held it
        holds = what_if_holds(replay(graphs, options.model, Scale(), groups, release, holds, wait_nodes=in_files))
    measured = options.waits == MEASURED_WAITS
    result = replay(graphs, options.model, scale, groups, release, holds if measured else None, network,
                    wait_nodes=measured and in_files)
    # The other way of replaying the waits, for its ratio (the same replay when nothing is held).
    waited = holds or any(graph.wait_nodes for graph in graphs)
    other = replay(graphs, options.model, scale, groups, release, None if measured else holds, network,
                   wait_nodes=not measured and in_files) if waited else result
    progress("reporting")
    report, critical, _ = build_report(result, options.top, options.explain)
    report.waits = waits_summary(options.waits, result if measured else other, other if measured else result,
                                 report.measured_us)
    report.network = result.network
    notes += lanes_hints(graphs, options.model, [rank.ratio for rank in report.ranks], result, critical)
    report.notes = notes + report.notes
    return Simulation(report, result, critical, tuple(path for path, _ in inputs.files))

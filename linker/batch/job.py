"""The whole batch: plan (pair, make the tasks, set aside complete ranks), run locally or on Dask,
check the job's collectives (``batch.collectives``), summarise. Cost: O(files) + the ranks' links.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from linker.batch.collectives import COMM_GROUPS_FILE, check_job, format_ranks
from linker.link.recipe import LinkOptions
from linker.model.errors import OptionError
from linker.schedule import Schedule
from linker.batch.progress import BatchProgress
from linker.batch.errors import BatchSetupError, PairingError
from linker.batch.folder_lock import owned_folder
from linker.batch.link_rank import completed_result
from linker.batch.local import run_local
from linker.batch.memory import (GRAPH_BYTES_PER_OUTPUT_BYTE, MEMORY_BUDGET_SHARE, REWRITE_BYTES_PER_OUTPUT_BYTE,
                                 available_memory_bytes, estimate_output_work_bytes, uncompressed_size)
from linker.batch.pairing import Pairing, expand_glob, pair_rank_files
from linker.batch.remote import import_distributed, run_dask
from linker.batch.summary import BatchSummary, find_outliers, summarize_totals, write_summary
from linker.batch.tasks import RankResult, RankTask, make_task


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
    rank_start: str = "measured"  # each rank's start offset in the outputs (``plan.rank_start``)
    simulator: dict | None = None  # ASTRA-sim setup overrides (``batch.astra_setup``); --format et only
    pid_ranks: dict[int, int] | None = None  # one nsys file of every rank: pid -> rank (default: pid order)
    network: str = ""  # a what-if link (``simulate --network``'s spec) answered in summary.json; "": none


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


def plan_batch(config: BatchConfig, pairing=None) -> BatchPlan:
    """Find and pair the files (unless ``pairing``, ``pair_inputs``'s, is given), make the tasks, set
    aside the complete ranks.

    Raises ``BatchSetupError`` (no files, bad format) or ``PairingError`` before anything is
    written. Creates the output directory. Cost: O(files) + one header read per Kineto file +
    a few stats per rank.
    """
    return _prepare_folder(config, pairing or pair_inputs(config))


def pair_inputs(config: BatchConfig):
    """The ``Pairing`` of the job's files; raises ``BatchSetupError`` / ``PairingError``, writes
    nothing."""
    if config.fmt not in ("json", "et"):
        raise BatchSetupError(f"unknown --format {config.fmt!r}; choose json or et")
    et_paths = expand_glob(config.et_glob) if config.et_glob is not None else []
    kineto_paths = expand_glob(config.kineto_glob)
    if not et_paths and config.et_glob is not None:
        raise BatchSetupError(f"no file matches --et {config.et_glob!r}")
    if not kineto_paths:
        raise BatchSetupError(f"no file matches --kineto {config.kineto_glob!r}")
    pairing = pair_rank_files(et_paths, kineto_paths, config.rank_pattern, config.skip_unpaired, config.pid_ranks)
    if pairing.problems:
        raise PairingError(pairing.problems)
    return pairing


def _prepare_folder(config: BatchConfig, pairing) -> BatchPlan:
    """The output folder made and checked, the tasks, the complete ranks set aside."""
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


def run_batch(config: BatchConfig, progress_stream=None, interactive: bool | None = None,
              quiet: bool = False, schedule: Schedule | None = None) -> BatchSummary:
    """Plan, run and summarise a batch; writes ``summary.json`` in the output directory.
    ``schedule`` (serial by default; the CLI's is ``Schedule.auto()``) decides whether the outputs
    are rewritten for their rank start by forked children, as many as the ranks run at once.

    Raises ``BatchSetupError``/``PairingError`` (``OptionError`` for a bad ``network``) before any
    work; afterwards rank failures are
    recorded in the summary, never raised. Progress goes to ``progress_stream`` (stderr). The
    output folder is this run's while it runs (``folder_lock``): a folder another run holds raises
    ``FolderBusyError`` (a ``BatchSetupError``) before anything is written.
    """
    started = time.monotonic()
    if config.scheduler:
        import_distributed()  # fail before anything is written
    workers = config.workers or default_workers()
    if workers < 1:
        raise BatchSetupError("--workers must be at least 1")
    if config.network:
        from linker.sim.network import NetworkSpec

        NetworkSpec.parse(config.network)  # a bad --network: OptionError before any work
    pairing = pair_inputs(config)
    warn = (lambda text: print(text, file=progress_stream or sys.stderr))
    with owned_folder(config.output_dir, "et-link batch", warn):
        return _run_planned(config, plan_batch(config, pairing), workers, started, progress_stream, interactive,
                            quiet, schedule)


def _run_planned(config: BatchConfig, plan: BatchPlan, workers: int, started: float, progress_stream,
                 interactive: bool | None, quiet: bool, schedule: Schedule | None) -> BatchSummary:
    progress = BatchProgress(len(plan.to_run), sum(t.input_bytes for t in plan.to_run), progress_stream,
                             interactive, "submitted" if config.scheduler else "running", quiet)
    for note in plan.pairing.notes:
        progress.note(note)
    if plan.complete:
        progress.note(f"{len(plan.complete)} rank(s) already complete, skipped (--redo to link them again): "
                      f"{format_ranks(r.rank for r in plan.complete)}")

    available = available_memory_bytes()
    budget = config.memory_budget or (int(available * MEMORY_BUDGET_SHARE) if available else None)
    if config.scheduler:
        executor = f"Dask scheduler {config.scheduler}"
        results = run_dask(plan.to_run, config.scheduler, progress) if plan.to_run else []
    else:
        executor = f"local, {workers} workers" + (f", memory budget {budget / 2**30:.1f} GiB" if budget else "")
        results = run_local(plan.to_run, workers, budget, progress) if plan.to_run else []
    progress.close()
    ranks = sorted(results + plan.complete, key=lambda r: r.rank)
    output_dir = Path(config.output_dir).absolute()
    collectives = check_job({r.rank: r.report for r in ranks if r.ok}, [r.rank for r in ranks],
                            plan.pairing.world_size, output_dir / COMM_GROUPS_FILE if config.fmt == "et" else None)
    setup = simulator_setup(config, ranks, output_dir, schedule, workers, budget)
    elapsed = time.monotonic() - started
    summary = BatchSummary(
        output_dir=str(output_dir), executor=executor, ranks=ranks,
        totals=summarize_totals(ranks, elapsed), outliers=find_outliers(ranks), notes=plan.pairing.notes,
        options={"link": asdict(config.options), "format": config.fmt, "gzip": config.gzip,
                 "et": config.et_glob, "kineto": config.kineto_glob, "rank_pattern": config.rank_pattern,
                 "rank_start": config.rank_start},
        collectives=collectives, simulator=setup)
    write_summary(summary, Path(summary.output_dir) / "summary.json")
    return summary


def simulator_setup(config: BatchConfig, ranks: list[RankResult], output_dir: Path, schedule: Schedule | None = None,
                    workers: int = 1, memory_budget: int | None = None) -> dict | None:
    """Once every rank is linked: for ``--format et`` each output read back as a replay graph,
    each rank's start offset written into its output (``rank_start``), then, for ``--format et``,
    the ASTRA-sim configuration and ``run`` script in ``astra/`` (``astra_setup``). The reads and
    the rewrites run in up to ``workers`` forked children when ``schedule`` has them
    (``Schedule.each_output``), as many as fit ``memory_budget``. None when no rank was linked.
    Raises TraceInputError when an output cannot be read back or rewritten."""
    from linker.batch.rank_start import apply_rank_starts
    from linker.plan.rank_start import MEASURED

    done = [r for r in ranks if r.ok and r.output]
    if not done:
        return None
    files = [(Path(r.output), r.rank) for r in done]
    # The ASTRA-sim setup reads the graphs; the offsets need only each rank's measured span, which
    # its worker handed over (read back from the output only when it did not). The simulator's
    # modules are imported only when they are used (a JSON job's workers hand every span over).
    sizes = list(map(_output_bytes, files))
    graphs = []
    if config.fmt == "et":
        processes = _fitting(workers, memory_budget, max(sizes), GRAPH_BYTES_PER_OUTPUT_BYTE)
        graphs = _load_graphs(files, sizes, schedule, processes)
    spans = []
    if config.rank_start == MEASURED and len(files) > 1:
        spans = [graph.measured_span() for graph in graphs] or [
            tuple(r.measured_span) if r.measured_span else _load_graph(path, rank, schedule).measured_span()
            for r, (path, rank) in zip(done, files)]
    starts = apply_rank_starts(files, spans, {r.rank: Path(r.report) for r in done if r.report},
                               config.rank_start, frozenset(r.rank for r in done if r.status == "linked"), graphs,
                               schedule, _fitting(workers, memory_budget, max(sizes), REWRITE_BYTES_PER_OUTPUT_BYTE),
                               sizes)
    setup = {"rank_start": starts.to_json(), "lines": starts.lines()}
    if config.fmt == "et":
        from linker.batch.astra_setup import SETUP_DIR, write_setup
        from linker.sim.job import read_comm_groups

        groups_path = output_dir / COMM_GROUPS_FILE
        groups = read_comm_groups(groups_path) if groups_path.is_file() else None
        astra = write_setup(files, graphs, groups, output_dir / SETUP_DIR, config.simulator or {})
        setup["astra_sim"] = {k: v for k, v in astra.items() if k != "lines"}
        setup["lines"] += astra["lines"]
    _add_network(setup, config, graphs, output_dir)
    return setup


def _add_network(setup: dict, config: BatchConfig, graphs: list, output_dir: Path) -> None:
    """``setup["network"]`` (``job_network``): the fitted network of the job's collectives (from
    ``graphs``, read for ``--format et``) and, with ``config.network``, the what-if's answer
    (``et-link simulate`` of the written outputs; its fit is then the one recorded)."""
    if not graphs and not config.network:
        return
    from linker.batch.job_network import fitted_networks, network_lines, network_record, what_if
    from linker.sim.job import read_comm_groups

    predicted = what_if(output_dir, config.network) if config.network else None
    if predicted is not None:
        fitted = predicted["network"]["fitted"]
    else:
        groups_path = output_dir / COMM_GROUPS_FILE
        groups = read_comm_groups(groups_path) if groups_path.is_file() else None
        fitted = [fit.to_json() for fit in fitted_networks(graphs, groups)]
    setup["network"] = network_record(fitted, predicted)
    setup["lines"] += network_lines(setup["network"])


def _fitting(workers: int, memory_budget: int | None, largest: int, per_output_byte: float) -> int:
    """How many outputs to work on at once: ``workers``, fewer when the memory budget holds fewer
    works on the largest output (``memory.estimate_output_work_bytes``)."""
    if memory_budget is None:
        return workers
    return min(workers, memory_budget // estimate_output_work_bytes(largest, per_output_byte))


def _load_graphs(files: list[tuple[Path, int]], sizes: list[int], schedule: Schedule | None,
                 processes: int) -> list:
    """Each rank's output (of ``sizes`` bytes) as a replay graph: read by up to ``processes`` forked
    children when the schedule has them for this job (``Schedule.each_output``; a graph comes back
    pickled, 30 MB and 0.1 s for a rank of 360k nodes), else one after the other here, a large
    ``.et`` in two processes when the schedule splits loads."""
    schedule = schedule or Schedule.serial()
    loaded = schedule.each_output(_load_graph, files, sizes, processes)
    return [box[0] if box is not None else _load_graph(path, rank, schedule)
            for box, (path, rank) in zip(loaded, files)]


def _output_bytes(file: tuple[Path, int]) -> int:
    """An output's uncompressed bytes (0 when it cannot be read: its rewrite or read says why)."""
    try:
        return uncompressed_size(file[0])
    except OSError:
        return 0


def _load_graph(path: Path, rank: int, schedule: Schedule | None = None):
    """A rank's output as a replay graph (a large ``.et`` in two processes when ``schedule`` says
    so: ``Schedule.splits_load``)."""
    from linker.sim.load import load_graph

    return load_graph(path, rank, schedule)


def parse_bytes(text: str) -> int:
    """``8G``, ``512M``, ``1.5GiB``, ``1000000`` -> bytes (binary multiples). Raises OptionError."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not match:
        raise OptionError(f"not a size: {text!r} (use e.g. 512M, 8G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[match.group(2).lower()]
    value = int(float(match.group(1)) * scale)
    if value <= 0:
        raise OptionError(f"size must be positive: {text!r}")
    return value

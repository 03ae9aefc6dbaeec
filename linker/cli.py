"""The ``et-link`` command.

``et-link --et-file ET --kineto-file K [...]`` links one pair (the classic interface);
``et-link validate FILE``, ``et-link dump FILE.et`` and ``et-link batch ...`` are subcommands.
User mistakes (bad files, different runs, bad options: ``model.errors.EtLinkError``) print one
line and exit non-zero; the exit statuses are the table ``exit_status.EXIT_STATUS_TABLE`` (also in
``--help`` and the README). Any other exception is a bug in et-link: its traceback is printed with
a line asking for a report (status 1, ``_report_bug``).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer

from linker import __version__

from linker.schedule import Schedule, process_exit
from linker.model.errors import EtLinkError, MismatchedPairError, OptionError, TraceInputError
from linker.model.waits import MEASURED_WAITS, WAITS, check_waits, wants_file_waits
from linker.model.exit_status import (
    EXIT_BELOW_MIN_LINKED,
    EXIT_BROKEN_PIPE,
    EXIT_COLLECTIVE_MISMATCH,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_RANKS_FAILED,
    EXIT_SIM_STUCK,
    EXIT_STATUS_TABLE,
    EXIT_TERMINATED,
    EXIT_UNREADABLE,
)
from linker.read.files import Terminated, terminate_as_interrupt
from linker.link.recipe import METHODS, LinkOptions
from linker.model.progress import StageProgress, is_terminal

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LINK_STAGES = ("reading", "linking", "writing")


def _choices(values) -> str:
    """The metavar listing an option's choices: "[auto|rf_id|exact|approximate]"."""
    return "[" + "|".join(values) + "]"


# Options that mean the same in several commands, declared once (typer reads the ``Annotated`` part).
ExactMatchOption = Annotated[bool, typer.Option("--exact-match", help="Same as --match exact.")]
ApproximateOption = Annotated[bool, typer.Option("--approximate", help="Same as --match approximate.")]
AnnotationOption = Annotated[Optional[str], typer.Option(
    "--annotation", metavar="NAME", help="Cut Kineto iterations where an op whose name contains this ends.")]
MaxDepthOption = Annotated[int, typer.Option("--max-depth", help="Approximate matching: tree depth matched structurally.")]
LogLevelOption = Annotated[str, typer.Option("--log-level", metavar=_choices(LOG_LEVELS), help="What to log on stderr.")]
MaxInflatedOption = Annotated[Optional[str], typer.Option(
    "--max-inflated", metavar="SIZE", help="Refuse a gzip input that inflates past SIZE (e.g. 8G; default: half "
    "of the memory available), before memory runs out.")]
FileWaitsOption = Annotated[str, typer.Option(
    "--waits", metavar=_choices(WAITS),
    help="measured: an output with GPU ops carries, as wait nodes with their cause, the measured waits no "
    "dependency explains (an op that started after everything it depends on had finished), so that "
    "ASTRA-sim and et-link simulate replay the step as measured (docs/fidelity.md); explained: the graph's "
    "own dependencies only.")]
# The ASTRA-sim setup of ``batch --format et`` and ``astra-setup``: each overrides what is fitted.
AstraTopologyOption = Annotated[Optional[str], typer.Option(
    "--astra-topology", metavar=_choices(("Ring", "Switch", "FullyConnected")),
    help="ASTRA-sim setup: network topology (Ring, Switch or FullyConnected) instead of the fitted one.")]
AstraNpusOption = Annotated[Optional[int], typer.Option(
    "--astra-npus", help="ASTRA-sim setup: NPU count (default: the ranks, at least 2: a single pair runs as 2 NPUs).")]
AstraBandwidthOption = Annotated[Optional[float], typer.Option(
    "--astra-bandwidth", metavar="GB/S", help="ASTRA-sim setup: link bandwidth in GB/s (2^30 bytes) instead of the fitted one.")]
AstraLatencyOption = Annotated[Optional[float], typer.Option(
    "--astra-latency", metavar="NS", help="ASTRA-sim setup: link latency in ns instead of the fitted one.")]
AstraCpuCollectivesOption = Annotated[str, typer.Option(
    "--astra-cpu-collectives", metavar=_choices(("measured", "network")),
    help="ASTRA-sim setup, CPU collectives (gloo, MPI, UCC) in the workload copies: measured = a meeting of "
    "the ranks, then each rank's replayed time (the network file does not move them); network = the meeting, "
    "then a collective of the bytes the network carried on the CPU collectives' fitted bus, then the rest "
    "as measured, so that network.yml's bandwidth moves them (a job of CPU collectives only; docs/whatif.md).")]


def _exit_epilog() -> str:
    lines = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_STATUS_TABLE)
    return "\b\nExit statuses:\n" + lines


app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    invoke_without_command=True,
    no_args_is_help=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Link a PyTorch Execution Trace with its Kineto trace into an enhanced ET (ET+).",
    epilog=_exit_epilog(),
)


def fail(message: str, code: int = EXIT_INPUT) -> None:
    typer.echo(f"et-link: error: {message}", err=True)
    raise typer.Exit(code)


def _report_bug(context: str = "") -> None:
    """Print the traceback of the exception being handled, which is no user's mistake (not an
    ``EtLinkError``), and a line asking for a report. The caller exits with ``EXIT_INTERNAL``."""
    typer.echo(traceback.format_exc().rstrip(), err=True)
    where = f" ({context})" if context else ""
    typer.echo(f"et-link: internal error{where}: a bug in et-link, not a problem with your files or options; "
               "please report it with the traceback above", err=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"et-link {__version__}")
        raise typer.Exit(EXIT_OK)


def _chosen_method(exact_match: bool, approximate: bool, match: str) -> str:
    """The matching method of --exact-match / --approximate / --match (at most one given)."""
    if sum((exact_match, approximate, match != "auto")) > 1:
        fail("choose one of --exact-match, --approximate, --match")
    method = "exact" if exact_match else "approximate" if approximate else match
    if method not in METHODS:
        fail(f"unknown --match {method!r}; choose one of {', '.join(METHODS)}")
    return method

def _check_options(window: Optional[int], max_depth: int, min_linked: Optional[float],
                   annotation: Optional[str]) -> None:
    """Range checks done before any file is read."""
    if window is not None and window < 0:
        fail(f"--window {window}: window indices start at 0")
    if max_depth < 1:
        fail(f"--max-depth {max_depth}: must be at least 1")
    if min_linked is not None and not 0 <= min_linked <= 100:
        fail(f"--min-linked {min_linked:g}: must be a percentage from 0 to 100")
    if annotation is not None and not annotation.strip():
        fail("--annotation: give a non-empty name")


def _set_max_inflated(size: Optional[str]) -> None:
    """``--max-inflated``: the inflate limit of this process and of the workers it starts
    (``read.files.inflate_limit``, through its environment variable)."""
    if size is None:
        return
    from linker.batch.job import parse_bytes
    from linker.read.files import MAX_INFLATED_ENV

    try:
        os.environ[MAX_INFLATED_ENV] = str(parse_bytes(size))
    except OptionError as err:
        fail(f"--max-inflated: {err}")


def _stop_status(stop: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED


def _stopped(stop: KeyboardInterrupt, left: str) -> typer.Exit:
    """Say that Ctrl-C (or SIGTERM: ``Terminated``) stopped the run and what was ``left``; the exit to raise."""
    typer.echo(f"et-link: {'terminated' if isinstance(stop, Terminated) else 'interrupted'}; {left}", err=True)
    return typer.Exit(_stop_status(stop))

_one_shot = False  # set by ``main``: this process ends with the command


def _schedule() -> Schedule:
    """The schedule of a command: ``Schedule.auto()``, one-shot when run from ``main`` (the
    ``et-link`` process; not when ``app`` is called in another program's process)."""
    return Schedule.auto(one_shot=_one_shot)


def write_stdout(text: str) -> None:
    """Print ``text`` and a newline on stdout; a reader gone away (``et-link ... | head``) ends the
    command quietly with ``EXIT_BROKEN_PIPE`` (stdout is pointed at /dev/null, so the exit's own
    flush cannot complain)."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        _broken_pipe()


def _broken_pipe() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise typer.Exit(EXIT_BROKEN_PIPE)


def _progress(quiet: bool) -> bool:
    """Whether to draw progress bars: not with -q, and only on a terminal."""
    return not quiet and is_terminal(sys.stderr)


def _run_pair(et_file: Path, kineto_file: Path, output_file, options: LinkOptions, report, schedule: Schedule,
              quiet: bool = True):
    """``link_pair`` under ``schedule`` with every failure turned into one line and its exit status;
    a progress bar on stderr when it takes a while (not with ``quiet``, only on a terminal)."""
    from linker.pipeline import link_pair

    pair = f"{et_file} + {kineto_file}" if et_file is not None else str(kineto_file)
    try:
        with StageProgress("et-link", LINK_STAGES, enabled=_progress(quiet)) as bar:
            return link_pair(et_file, kineto_file, output_file, options, report, schedule, progress=bar.stage)
    except MismatchedPairError as err:
        fail(f"{pair}: {err}", EXIT_MISMATCH)
    except EtLinkError as err:
        fail(str(err), EXIT_INPUT)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
        raise _stopped(stop, "no output was left behind")
    except MemoryError:
        fail(f"{pair}: out of memory while linking", EXIT_INPUT)
    except Exception:  # a bug in et-link
        _report_bug(pair)
        raise typer.Exit(EXIT_INTERNAL)


def _setup_logging(level: str) -> None:
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        fail(f"unknown --log-level {level!r} (use {', '.join(LOG_LEVELS)})")
    logging.basicConfig(level=numeric, format="et-link: %(levelname)s: %(message)s", stream=sys.stderr)


@app.callback()
def main_command(
    ctx: typer.Context,
    et_file: Optional[Path] = typer.Option(None, "--et-file", help="Execution Trace (.json or .json.gz). "
                                           "Without it the host graph is built from the Kineto trace alone."),
    kineto_file: Optional[Path] = typer.Option(None, "--kineto-file", help="Timing trace: Kineto (.json or "
                                               ".json.gz), or an Nsight Systems SQLite export or nvprof database "
                                               "(told apart by content)."),
    output_file: Optional[Path] = typer.Option(
        None, "--output-file", "-o",
        help="ET+ output: .json / .json.gz (ET+ JSON) or .et / .et.gz (Chakra protobuf). "
             "Default: <ET name>_plus.json beside the ET (<Kineto name>_plus.json without an ET)."),
    match: str = typer.Option("auto", "--match", metavar=_choices(METHODS),
                              help="Linking method. auto = rf_id when the ids validate, else exact (order), "
                              "falling back to approximate (structure)."),
    exact_match: ExactMatchOption = False,
    approximate: ApproximateOption = False,
    annotation: AnnotationOption = None,
    window: Optional[int] = typer.Option(None, "--window", help="Link against this Kineto iteration "
                                         "window (index shown in the report) instead of choosing by content."),
    max_depth: MaxDepthOption = 10,
    report: Optional[Path] = typer.Option(None, "--report", help="Write the link report (JSON) here."),
    force: bool = typer.Option(False, "--force", help="Link even if the files look like different runs."),
    min_linked: Optional[float] = typer.Option(
        None, "--min-linked", metavar="PCT", help="Exit with status 6 when less than PCT % of the ET ops "
        "are linked (the outputs are still written)."),
    waits: FileWaitsOption = MEASURED_WAITS,
    max_inflated: MaxInflatedOption = None,
    log_level: LogLevelOption = "WARNING",
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary and no progress bar on stderr."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    _set_max_inflated(max_inflated)  # before a subcommand too: et-link --max-inflated 8G batch ...
    if ctx.invoked_subcommand is not None:
        return
    terminate_as_interrupt()
    _setup_logging(log_level)
    if kineto_file is None:
        names = ", ".join(command.name for command in app.registered_commands if command.name)
        fail(f"--kineto-file is required, with --et-file or alone (or use a subcommand: {names}; see --help)")
    method = _chosen_method(exact_match, approximate, match)
    _check_options(window, max_depth, min_linked, annotation)
    if et_file is None and (method != "auto" or annotation is not None or window is not None):
        typer.echo("et-link: warning: without --et-file there is nothing to match: "
                   "--match/--annotation/--window are ignored", err=True)
    _check_waits(waits)
    options = LinkOptions(method=method, annotation=annotation, window=window, force=force,
                          max_depth=max_depth, waits=waits)
    schedule = _schedule()
    outcome = _run_pair(et_file, kineto_file, output_file, options, report, schedule, quiet)
    schedule.keep_until_exit(outcome)
    try:
        wait_nodes = _write_file_waits(outcome, waits, schedule)
        _finish_pair(outcome, et_file, kineto_file, quiet, min_linked, wait_nodes)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM after the outputs were complete: they are kept
        typer.echo("et-link: stopped after the outputs were written (they are complete)", err=True)
        raise typer.Exit(_stop_status(stop))


def _check_waits(waits: str) -> None:
    try:
        check_waits(waits)
    except OptionError as err:
        fail(str(err))


def _write_file_waits(outcome, waits: str, schedule: Schedule) -> str:
    """The device's holds written into the output as dependencies, then, under ``--waits measured``,
    its measured waits as wait nodes (``sim.file_waits``, imported only when the output needs
    them), in lines of words for the summary ("" for neither); a failure in one line."""
    if not wants_file_waits(outcome, waits):
        return ""
    from linker.sim.file_waits import waits_in_words, write_wait_step

    outcome.et_plus = None  # the link's state, freed: the read-back's memory comes in its place, not on top

    try:
        edges, written = write_wait_step(outcome.output, waits, schedule)
    except EtLinkError as err:
        fail(f"{err} (the output is as linked: without the wait step's edges and wait nodes)", EXIT_INPUT)
    lines = []
    if edges:
        lines.append(f"kernels that waited for another stream's kernel to free the device: {edges}, each written as "
                     f"a dependency on the part of that kernel that ran until it started (other_stream_kernel)")
    if written:
        lines.append(f"measured waits no dependency explains: {len(written)} wait node(s) written (--waits explained "
                     f"leaves them out); by cause, how many and their time: {waits_in_words(written)}")
    return "\n".join(lines)


def _finish_pair(outcome, et_file: Path, kineto_file: Path, quiet: bool, min_linked: Optional[float],
                 wait_nodes: str = "") -> None:
    """The summary and the --min-linked verdict, once the outputs are written (``wait_nodes``: the
    edges and wait nodes the wait step wrote, in lines of words)."""
    if not quiet:
        typer.echo(outcome.report.summary(outcome.seconds), err=True)
        for line in wait_nodes.splitlines():
            typer.echo(f"  {line}", err=True)
        typer.echo(f"  wrote {outcome.output}" + (f", report {outcome.report_path}" if outcome.report_path else ""),
                   err=True)
    if min_linked is not None and outcome.report.linked_pct < min_linked:
        fail(f"{et_file} + {kineto_file}: linked {outcome.report.linked_pct:.2f}% of ET ops, below "
             f"--min-linked {min_linked:g} (outputs written)", EXIT_BELOW_MIN_LINKED)


@app.command("validate")
def validate_command(
    files: list[Path] = typer.Argument(..., help="ET, ET+ (.json/.json.gz) or Chakra (.et/.et.gz) files."),
    examples: int = typer.Option(5, "--examples", help="How many offenders to name per kind of violation."),
) -> None:
    """Check ids, dependencies and cycles (and Chakra COMM attributes). Exit 4 on a violation,
    7 when a file cannot be read (7 wins when both happen)."""
    from linker.read.files import decoding
    from linker.write.validate import format_result, validate_file

    terminate_as_interrupt()
    if examples < 0:
        fail(f"--examples {examples}: must be 0 or more")
    invalid = unreadable = False
    for path in files:
        try:
            with decoding(path, "trace"):
                result = validate_file(path, max(examples, 1))
        except TraceInputError as err:
            typer.echo(f"et-link: error: {err}", err=True)
            unreadable = True
            continue
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED)
        except Exception:  # a bug in et-link
            _report_bug(str(path))
            raise typer.Exit(EXIT_INTERNAL)
        write_stdout(format_result(result, examples))
        invalid = invalid or not result.ok
    if unreadable:
        raise typer.Exit(EXIT_UNREADABLE)
    if invalid:
        raise typer.Exit(EXIT_INVALID)


@app.command("dump")
def dump_command(
    file: Path = typer.Argument(..., help="A Chakra protobuf trace (.et or .et.gz)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Print at most this many nodes."),
) -> None:
    """Print a Chakra .et file as JSON lines: the metadata, then one object per node."""
    import orjson

    from linker.write.chakra_wire import iter_dump_records
    from linker.read.files import decoding

    if limit is not None and limit < 0:
        fail(f"--limit {limit}: must be 0 or more")
    if file.name.endswith((".json", ".json.gz")):
        fail(f"{file}: dump reads Chakra protobuf files (.et, .et.gz), not JSON; use 'et-link validate' for JSON")
    try:
        out = sys.stdout.buffer
        with decoding(file, "Chakra trace"):
            for record in iter_dump_records(file, limit):
                out.write(orjson.dumps(record) + b"\n")
        out.flush()
    except TraceInputError as err:
        fail(str(err))
    except BrokenPipeError:
        _broken_pipe()
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command("batch")
def batch_command(
    et: Optional[str] = typer.Option(None, "--et", metavar="GLOB", help="Glob of the ranks' Execution Traces (quote it), e.g. "
                                     "'run/rank*.et.json.gz'. Omitted: each rank's host graph is built from its Kineto trace."),
    kineto: str = typer.Option(..., "--kineto", metavar="GLOB", help="Glob of the ranks' timing traces (quote it): Kineto, or "
                               "Nsight Systems / nvprof SQLite; one nsys file holding every rank gives one rank "
                               "per process, in pid order."),
    output_dir: Path = typer.Option(..., "--output-dir", help="Where the ET+ files, rank<N>.report.json and "
                                    "summary.json go (created if missing)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local ranks linked at once (default: CPU "
                                          "count; fewer when memory is short)."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", metavar="ADDRESS", help="Run on this Dask scheduler "
                                            "(tcp://host:port); paths must be on storage the workers share."),
    rank_pattern: Optional[str] = typer.Option(None, "--rank-pattern", metavar="REGEX", help="Regex with one group (or "
                                               "(?P<rank>...)) taking every file's rank from its name, "
                                               "instead of distributedInfo / the default name patterns."),
    match: str = typer.Option("auto", "--match", metavar=_choices(METHODS), help="Linking method (see et-link --help)."),
    exact_match: ExactMatchOption = False,
    approximate: ApproximateOption = False,
    annotation: AnnotationOption = None,
    window: Optional[int] = typer.Option(None, "--window", help="Link every rank against this Kineto window index."),
    max_depth: MaxDepthOption = 10,
    force: bool = typer.Option(False, "--force", help="Link even if a pair looks like different runs."),
    redo: bool = typer.Option(False, "--redo", help="Link again the ranks whose output is already complete."),
    verify_existing: bool = typer.Option(False, "--verify-existing", help="Before skipping a complete rank, "
                                         "also validate its output file (slower)."),
    fmt: str = typer.Option("json", "--format", metavar=_choices(("json", "et")), help="json (ET+ JSON) or et (Chakra protobuf)."),
    gzip_output: bool = typer.Option(False, "--gzip", help="Gzip the outputs (.json.gz / .et.gz)."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", metavar="SIZE", help="Memory the local ranks may use "
                                                "together, e.g. 16G (default: 85% of MemAvailable)."),
    allow_mismatch: bool = typer.Option(False, "--allow-mismatch", help="Exit 0 even when the ranks' collectives "
                                        "disagree (the mismatch is still reported; otherwise exit status 8)."),
    skip_unpaired: bool = typer.Option(False, "--skip-unpaired", help="Link the ranks that have both files; "
                                       "a rank missing its ET or Kineto file is noted, not fatal."),
    rank_start: str = typer.Option("measured", "--rank-start", metavar=_choices(("measured", "zero")),
                                   help="measured: each rank's start offset "
                                   "(from the job's earliest measured start) written as a leading delay node "
                                   "(docs/rank-start.md); zero: none, every rank starts at 0."),
    astra_topology: AstraTopologyOption = None,
    astra_npus: AstraNpusOption = None,
    astra_bandwidth: AstraBandwidthOption = None,
    astra_latency: AstraLatencyOption = None,
    astra_cpu_collectives: AstraCpuCollectivesOption = "measured",
    pid_ranks: Optional[str] = typer.Option(None, "--pid-ranks", metavar="PID:RANK,...", help="One Nsight "
                                            "Systems file holding every rank: the rank of each process, e.g. "
                                            "4242:0,4243:1 (default: pid order)."),
    waits: FileWaitsOption = MEASURED_WAITS,
    network: str = typer.Option("", "--network", metavar="bandwidth=RATE[,latency=TIME][,medium=bus|links]",
                                help="A what-if link answered in summary.json, as et-link simulate DIR --network "
                                "answers it (docs/whatif.md); the job's fitted network is there anyway (--format et)."),
    max_inflated: MaxInflatedOption = None,
    log_level: LogLevelOption = "WARNING",
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr (the table is still printed)."),
) -> None:
    """Link all ranks of a job: pair ET and Kineto files by rank, link each rank in its own process
    (locally or on Dask), skip ranks already done, check that the ranks' collectives agree, print a
    table and write summary.json (with --format et also comm_groups.json and an ASTRA-sim setup in
    astra/: network, system and memory files and a run script; docs/astra-sim.md)."""
    from linker.batch import BatchConfig, PairingError, format_table, parse_bytes, run_batch

    terminate_as_interrupt()
    _setup_logging(log_level)
    _set_max_inflated(max_inflated)
    method = _chosen_method(exact_match, approximate, match)
    _check_options(window, max_depth, None, annotation)
    if workers is not None and workers < 1:
        fail("--workers must be at least 1")
    try:
        budget = parse_bytes(memory_budget) if memory_budget else None
    except OptionError as err:
        fail(f"--memory-budget: {err}")
    ranks_of_pids = None
    if pid_ranks is not None:
        from linker.read.timing_ranks import parse_pid_ranks

        try:
            ranks_of_pids = parse_pid_ranks(pid_ranks)
        except OptionError as err:
            fail(f"--pid-ranks: {err}")
    _check_waits(waits)
    options = LinkOptions(method=method, annotation=annotation, window=window, force=force, max_depth=max_depth,
                          waits=waits)
    simulator = _astra_overrides(rank_start, astra_topology, astra_npus, astra_bandwidth, astra_latency,
                                 astra_cpu_collectives)
    config = BatchConfig(et_glob=et, kineto_glob=kineto, output_dir=output_dir, options=options, fmt=fmt,
                         gzip=gzip_output, workers=workers, scheduler=scheduler, rank_pattern=rank_pattern,
                         redo=redo, verify_existing=verify_existing, memory_budget=budget,
                         skip_unpaired=skip_unpaired, rank_start=rank_start, simulator=simulator,
                         pid_ranks=ranks_of_pids, network=network)
    try:
        summary = run_batch(config, quiet=quiet, schedule=_schedule())
    except PairingError as err:
        for problem in err.problems:
            typer.echo(f"et-link: pairing: {problem}", err=True)
        fail(str(err))
    except EtLinkError as err:  # the batch cannot start, or a file (e.g. summary.json cannot be written)
        fail(str(err))
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
        raise _stopped(stop, "running ranks stopped (complete ranks are kept)")
    write_stdout(format_table(summary))
    write_stdout(f"summary: {Path(summary.output_dir) / 'summary.json'}")
    if summary.failed:
        raise typer.Exit(EXIT_RANKS_FAILED)
    if summary.collectives is not None and summary.collectives.mismatch and not allow_mismatch:
        raise typer.Exit(EXIT_COLLECTIVE_MISMATCH)


def _astra_overrides(rank_start: str, topology: Optional[str], npus: Optional[int], bandwidth: Optional[float],
                     latency: Optional[float], cpu_collectives: str = "measured") -> dict:
    """The ASTRA-sim setup overrides of the options, checked (``fail`` on a bad value); the CPU
    collectives' form under ``cpu_collectives`` when it is not the default."""
    from linker.batch.astra_collectives import check_form
    from linker.plan.rank_start import check_rank_start
    from linker.sim.network_fit import check_overrides

    try:
        check_rank_start(rank_start)
        overrides = check_overrides(topology, npus, bandwidth, latency)
        if check_form(cpu_collectives) != "measured":
            overrides["cpu_collectives"] = cpu_collectives
        return overrides
    except OptionError as err:
        fail(str(err))


@app.command("astra-setup")
def astra_setup_command(
    files: list[Path] = typer.Argument(..., help="The .et file of a single pair, or a job's .et files / batch output "
                                       "directory."),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Where the setup goes (default: astra/ beside "
                                              "the first file)."),
    astra_topology: AstraTopologyOption = None,
    astra_npus: AstraNpusOption = None,
    astra_bandwidth: AstraBandwidthOption = None,
    astra_latency: AstraLatencyOption = None,
    astra_cpu_collectives: AstraCpuCollectivesOption = "measured",
) -> None:
    """Write an ASTRA-sim setup (network, system and memory configuration, run script) for .et files
    already written: what `batch --format et` writes beside a job, for a single pair too (run as 2
    NPUs). The network is fitted to the files' collectives (docs/astra-sim.md)."""
    from linker.batch.astra_setup import setup_for_files

    simulator = _astra_overrides("measured", astra_topology, astra_npus, astra_bandwidth, astra_latency,
                                 astra_cpu_collectives)
    try:
        lines = setup_for_files(files, output_dir, simulator)
    except EtLinkError as err:
        fail(str(err))
    typer.echo("\n".join(lines))


@app.command("astra-run")
def astra_run_command(
    directory: Path = typer.Argument(..., metavar="DIR", help="A batch output directory (--format et) or the ASTRA-sim setup folder "
                                     "(astra/) that batch or astra-setup wrote."),
    binary: Optional[str] = typer.Option(None, "--bin", metavar="PATH", help="The ASTRA-sim analytical binary "
                                         "(default: $ASTRA_SIM_BIN)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
) -> None:
    """Run the ASTRA-sim setup in DIR and set its answer beside the measured times: per rank and for
    the job, simulated (ASTRA-sim's 'sys[i] finished' cycles, ns), measured, ratio. Exit 2 when the
    binary or the setup is missing, 10 when ASTRA-sim fails (docs/astra-sim.md)."""
    from linker.batch.astra_run import AstraRunError, astra_run
    from linker.batch.errors import BatchSetupError
    from linker.model.exit_status import EXIT_ASTRA_FAILED

    terminate_as_interrupt()
    try:
        output = astra_run(directory, binary, json_output)
    except AstraRunError as err:
        fail(str(err), EXIT_ASTRA_FAILED)
    except (TraceInputError, BatchSetupError) as err:
        fail(str(err))
    except KeyboardInterrupt as stop:
        raise _stopped(stop, "ASTRA-sim was stopped")
    write_stdout(output)


@app.command("simulate")
def simulate_command(
    files: list[Path] = typer.Argument(..., help="One rank's .et / .et.gz / ET+ JSON, or several files of one "
                                       "job (or a batch output directory): replayed together."),
    model: str = typer.Option("astra-sim", "--model", metavar=_choices(("astra-sim", "lanes")), help="astra-sim: one CPU op, one GPU compute op and one "
                              "collective in flight per rank, the ready one with the smallest id first, as "
                              "ASTRA-sim issues them; lanes: each CPU thread and GPU stream its own unit, in the "
                              "order its work became ready."),
    scale: str = typer.Option("", "--scale", metavar="cpu=F,gpu=F,comm=F", help="What-if duration factors, e.g. cpu=0.5,gpu=1,comm=2."),
    network: str = typer.Option("", "--network", metavar="bandwidth=RATE[,latency=TIME][,medium=bus|links]",
                                help="What-if link for the collectives, e.g. bandwidth=1Gbit/s or bandwidth=25GB/s,"
                                "latency=5us: their network part, fitted to the trace's own collectives, moves to this "
                                "link; the rest of their time is kept as measured (docs/whatif.md)."),
    comm_groups: Optional[Path] = typer.Option(None, "--comm-groups", help='Process groups as JSON {"<pg id>": list of global ranks} '
                                               "(default: comm_groups.json beside the inputs, else all ranks)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of the text report."),
    trace_out: Optional[Path] = typer.Option(None, "--trace-out", help="Write a Chrome/Perfetto trace with the "
                                             "measured and the simulated timeline side by side (.json, or "
                                             ".json.gz compressed; open it in ui.perfetto.dev)."),
    top: int = typer.Option(10, "--top", help="How many ops of the critical path to list."),
    rank_start: str = typer.Option("measured", "--rank-start", metavar=_choices(("measured", "zero")), help="Job replay: measured = each rank starts at "
                                   "its measured start offset (when the ranks' clocks agree); zero = all at 0."),
    waits: str = typer.Option("measured", "--waits", metavar=_choices(("measured", "explained")), help="measured: an op "
                              "that started after everything it depends on had finished (a GPU op on an idle stream, "
                              "a host op after a blocking call that waited for work outside the trace) waits as long "
                              "in the replay (the measured step is reproduced); explained: the graph's own "
                              "prediction, those waits left out. Both ratios are printed either way."),
    explain: bool = typer.Option(False, "--explain", help="List where the simulated timeline drifts from the "
                                 "measured one: the first and the largest places on the critical path (node, lane, "
                                 "drift, the edge or resource that held it)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write one self-contained HTML page (opens offline) "
                                        "drawing measured vs simulated lanes per rank, the critical path, divergence "
                                        "points, busy time and the top critical-path ops. Needs pip install "
                                        "'et-link[view]'."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no 'wrote' lines on stderr."),
) -> None:
    """Replay the trace(s) as ASTRA-sim would and compare the simulated step with the measured one.
    Exit status 9 when the graph cannot finish (never-issued nodes or a stalled collective; reported)."""
    from linker.sim.cli_run import SimulateOptions, run_simulate

    from linker.sim.cli_run import STAGES

    try:
        with StageProgress("et-link simulate", STAGES, enabled=_progress(quiet)) as bar:
            output, finished = run_simulate(SimulateOptions(
                files, model, scale, comm_groups, json_output, trace_out, top, rank_start,
                explain=explain, html=html, waits=waits, network=network), bar.stage, _schedule())
    except EtLinkError as err:
        fail(str(err))
    if not quiet:
        for what, path in (("trace", trace_out), ("HTML view", html)):
            if path is not None:
                typer.echo(f"et-link simulate: wrote {what} {path}", err=True)
    write_stdout(output)
    if not finished:
        raise typer.Exit(EXIT_SIM_STUCK)


def _expanded_glob(argv: list[str]) -> str | None:
    """The ``batch`` option (``--et`` / ``--kineto``) whose glob the shell expanded (more than one
    word before the next option), or None."""
    if len(argv) < 2 or argv[1] != "batch":
        return None
    for i, arg in enumerate(argv[:-2]):
        if arg in ("--et", "--kineto") and not argv[i + 2].startswith("-"):
            return arg
    return None


def main() -> None:
    """The ``et-link`` entry point: one command, then the process ends (``process_exit``: a
    command run under ``Schedule.auto()`` kept what it built, and it is not freed)."""
    global _one_shot
    _one_shot = True
    expanded = _expanded_glob(sys.argv)
    if expanded is not None:
        typer.echo(f"et-link: error: {expanded} got several files: the shell expanded your glob; quote it "
                   f"({expanded} 'run/rank*.json.gz')", err=True)
        raise SystemExit(EXIT_INPUT)
    try:
        app()
    except SystemExit as stop:
        if process_exit.kept_anything() and isinstance(stop.code, (int, type(None))):
            process_exit.exit_now(stop.code or 0)
        raise
    except Exception:  # a bug no command caught (typer passes it on: its pretty exceptions are off)
        _report_bug()
        raise SystemExit(EXIT_INTERNAL) from None


if __name__ == "__main__":
    main()

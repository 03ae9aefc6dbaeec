"""The ``et-link`` command.

``et-link --et-file ET --kineto-file K [...]`` links one pair (the classic interface);
``et-link validate FILE``, ``et-link dump FILE.et`` and ``et-link batch ...`` are subcommands.
User mistakes (bad files, different runs, bad options) print one line and exit non-zero.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from .errors import MismatchedPairError, TraceInputError
from .link import METHODS, LinkOptions

EXIT_INPUT = 2
EXIT_MISMATCH = 3
EXIT_INVALID = 4

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    invoke_without_command=True,
    no_args_is_help=False,
    help="Link a PyTorch Execution Trace with its Kineto trace into an enhanced ET (ET+).",
)


def fail(message: str, code: int = EXIT_INPUT) -> None:
    typer.echo(f"et-link: error: {message}", err=True)
    raise typer.Exit(code)


def _setup_logging(level: str) -> None:
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        fail(f"unknown --log-level {level!r} (use DEBUG, INFO, WARNING, ERROR)")
    logging.basicConfig(level=numeric, format="et-link: %(levelname)s: %(message)s", stream=sys.stderr)


@app.callback()
def main_command(
    ctx: typer.Context,
    et_file: Optional[Path] = typer.Option(None, "--et-file", help="Execution Trace (.json or .json.gz)."),
    kineto_file: Optional[Path] = typer.Option(None, "--kineto-file", help="Kineto trace (.json or .json.gz)."),
    output_file: Optional[Path] = typer.Option(
        None, "--output-file", "-o",
        help="ET+ output: .json / .json.gz (ET+ JSON) or .et / .et.gz (Chakra protobuf). "
             "Default: <ET name>_plus.json beside the ET."),
    match: str = typer.Option("auto", "--match", help=f"Linking method: {', '.join(METHODS)}. "
                              "auto = rf_id when the ids validate, else exact (order), "
                              "falling back to approximate (structure)."),
    exact_match: bool = typer.Option(False, "--exact-match", help="Same as --match exact."),
    approximate: bool = typer.Option(False, "--approximate", help="Same as --match approximate."),
    annotation: Optional[str] = typer.Option(
        None, "--annotation", help="Cut Kineto iterations where an op whose name contains this ends."),
    window: Optional[int] = typer.Option(None, "--window", help="Link against this Kineto iteration "
                                         "window (index shown in the report) instead of choosing by content."),
    max_depth: int = typer.Option(10, "--max-depth", help="Approximate matching: tree depth matched structurally."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the link report (JSON) here."),
    force: bool = typer.Option(False, "--force", help="Link even if the files look like different runs."),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary on stderr."),
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    _setup_logging(log_level)
    if et_file is None or kineto_file is None:
        typer.echo(ctx.get_help(), err=True)
        fail("--et-file and --kineto-file are required (or use a subcommand: validate, dump, batch)")
    if sum((exact_match, approximate, match != "auto")) > 1:
        fail("choose one of --exact-match, --approximate, --match")
    method = "exact" if exact_match else "approximate" if approximate else match
    if method not in METHODS:
        fail(f"unknown --match {method!r}; choose one of {', '.join(METHODS)}")
    from .pipeline import link_pair

    options = LinkOptions(method=method, annotation=annotation, window=window, force=force,
                          max_depth=max_depth)
    try:
        outcome = link_pair(et_file, kineto_file, output_file, options, report)
    except TraceInputError as err:
        fail(str(err), EXIT_INPUT)
    except MismatchedPairError as err:
        fail(f"{et_file} + {kineto_file}: {err}", EXIT_MISMATCH)
    except ValueError as err:
        fail(str(err), EXIT_INPUT)
    if not quiet:
        typer.echo(outcome.report.summary(), err=True)
        typer.echo(f"  wrote {outcome.output}" + (f", report {outcome.report_path}" if outcome.report_path else ""),
                   err=True)


@app.command("validate")
def validate_command(
    files: list[Path] = typer.Argument(..., help="ET, ET+ (.json/.json.gz) or Chakra (.et/.et.gz) files."),
    examples: int = typer.Option(5, "--examples", help="How many offenders to name per kind of violation."),
) -> None:
    """Check ids, dependencies and cycles (and Chakra COMM attributes); non-zero exit on a violation."""
    from .validate import format_result, validate_file

    failed = False
    for path in files:
        try:
            result = validate_file(path)
        except TraceInputError as err:
            typer.echo(f"et-link: error: {err}", err=True)
            failed = True
            continue
        typer.echo(format_result(result, examples))
        failed = failed or not result.ok
    if failed:
        raise typer.Exit(EXIT_INVALID)


@app.command("dump")
def dump_command(
    file: Path = typer.Argument(..., help="A Chakra protobuf trace (.et or .et.gz)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Print at most this many nodes."),
) -> None:
    """Print a Chakra .et file as JSON lines: the metadata, then one object per node."""
    import orjson

    from .chakra_io import iter_dump_records

    try:
        out = sys.stdout.buffer
        for record in iter_dump_records(file, limit):
            out.write(orjson.dumps(record) + b"\n")
        out.flush()
    except TraceInputError as err:
        fail(str(err))
    except BrokenPipeError:
        pass


@app.command("batch")
def batch_command(
    et: str = typer.Option(..., "--et", help="Glob of the ranks' Execution Traces (quote it), e.g. 'run/rank*.et.json.gz'."),
    kineto: str = typer.Option(..., "--kineto", help="Glob of the ranks' Kineto traces (quote it)."),
    output_dir: Path = typer.Option(..., "--output-dir", help="Where the ET+ files, rank<N>.report.json and "
                                    "summary.json go (created if missing)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local ranks linked at once (default: CPU "
                                          "count; fewer when memory is short)."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Run on this Dask scheduler "
                                            "(tcp://host:port); paths must be on storage the workers share."),
    rank_pattern: Optional[str] = typer.Option(None, "--rank-pattern", help="Regex with one group (or "
                                               "(?P<rank>...)) taking every file's rank from its name, "
                                               "instead of distributedInfo / the default name patterns."),
    match: str = typer.Option("auto", "--match", help=f"Linking method: {', '.join(METHODS)}."),
    exact_match: bool = typer.Option(False, "--exact-match", help="Same as --match exact."),
    approximate: bool = typer.Option(False, "--approximate", help="Same as --match approximate."),
    annotation: Optional[str] = typer.Option(
        None, "--annotation", help="Cut Kineto iterations where an op whose name contains this ends."),
    window: Optional[int] = typer.Option(None, "--window", help="Link every rank against this Kineto window index."),
    max_depth: int = typer.Option(10, "--max-depth", help="Approximate matching: tree depth matched structurally."),
    force: bool = typer.Option(False, "--force", help="Link even if a pair looks like different runs."),
    redo: bool = typer.Option(False, "--redo", help="Link again the ranks whose output is already complete."),
    verify_existing: bool = typer.Option(False, "--verify-existing", help="Before skipping a complete rank, "
                                         "also validate its output file (slower)."),
    fmt: str = typer.Option("json", "--format", help="json (ET+ JSON) or et (Chakra protobuf)."),
    gzip_output: bool = typer.Option(False, "--gzip", help="Gzip the outputs (.json.gz / .et.gz)."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Memory the local ranks may use "
                                                "together, e.g. 16G (default: 85% of MemAvailable)."),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr (the table is still printed)."),
) -> None:
    """Link all ranks of a job: pair ET and Kineto files by rank, link each rank in its own process
    (locally or on Dask), skip ranks already done, print a table and write summary.json."""
    from .batch import EXIT_RANKS_FAILED, BatchConfig, BatchSetupError, PairingError, format_table, parse_bytes, run_batch

    _setup_logging(log_level)
    if sum((exact_match, approximate, match != "auto")) > 1:
        fail("choose one of --exact-match, --approximate, --match")
    method = "exact" if exact_match else "approximate" if approximate else match
    if method not in METHODS:
        fail(f"unknown --match {method!r}; choose one of {', '.join(METHODS)}")
    if workers is not None and workers < 1:
        fail("--workers must be at least 1")
    try:
        budget = parse_bytes(memory_budget) if memory_budget else None
    except ValueError as err:
        fail(f"--memory-budget: {err}")
    options = LinkOptions(method=method, annotation=annotation, window=window, force=force, max_depth=max_depth)
    config = BatchConfig(et_glob=et, kineto_glob=kineto, output_dir=output_dir, options=options, fmt=fmt,
                         gzip=gzip_output, workers=workers, scheduler=scheduler, rank_pattern=rank_pattern,
                         redo=redo, verify_existing=verify_existing, memory_budget=budget)
    try:
        summary = run_batch(config, quiet=quiet)
    except PairingError as err:
        for problem in err.problems:
            typer.echo(f"et-link: pairing: {problem}", err=True)
        fail(str(err))
    except BatchSetupError as err:
        fail(str(err))
    except KeyboardInterrupt:
        typer.echo("et-link: interrupted; running ranks stopped (complete ranks are kept)", err=True)
        raise typer.Exit(130)
    typer.echo(format_table(summary))
    typer.echo(f"summary: {Path(summary.output_dir) / 'summary.json'}")
    if summary.failed:
        raise typer.Exit(EXIT_RANKS_FAILED)


@app.command("simulate")
def simulate_command(
    files: list[Path] = typer.Argument(..., help="One rank's .et / .et.gz / ET+ JSON, or several files of one "
                                       "job (or a batch output directory): replayed together."),
    model: str = typer.Option("astra-sim", "--model", help="astra-sim: one CPU op, one GPU compute op and one "
                              "collective in flight per rank; lanes: each CPU thread and GPU stream its own unit."),
    scale: str = typer.Option("", "--scale", help="What-if duration factors, e.g. cpu=0.5,gpu=1,comm=2."),
    comm_groups: Optional[Path] = typer.Option(None, "--comm-groups", help='Process groups {"<pg id>": [ranks]} '
                                               "(default: comm_groups.json beside the inputs, else all ranks)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of the text report."),
    trace_out: Optional[Path] = typer.Option(None, "--trace-out", help="Write a Chrome/Perfetto trace with the "
                                             "measured and the simulated timeline side by side."),
    top: int = typer.Option(10, "--top", help="How many ops of the critical path to list."),
) -> None:
    """Replay the trace(s) as ASTRA-sim would and compare the simulated step with the measured one.
    Exit status 6 when the graph cannot finish (never-issued nodes or a stalled collective; reported)."""
    from .sim.cli_run import EXIT_STUCK, SimulateOptions, run_simulate

    try:
        output, finished = run_simulate(SimulateOptions(files, model, scale, comm_groups, json_output, trace_out, top))
    except TraceInputError as err:
        fail(str(err))
    except ValueError as err:
        fail(str(err))
    sys.stdout.write(output + "\n")
    if not finished:
        raise typer.Exit(EXIT_STUCK)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

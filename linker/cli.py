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


def main() -> None:
    app()


if __name__ == "__main__":
    main()

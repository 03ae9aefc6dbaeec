"""A bug in et-link is not a user's mistake: its traceback is printed with a line asking for a
report (status 1), never the one-line ``et-link: error:`` a bad file or option gets. User errors
are the ``EtLinkError`` family; a plain ``ValueError`` raised inside is a bug."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from conftest import fixture_pair
from linker import cli
from linker.model.errors import EtLinkError, MismatchedPairError, OptionError, TraceInputError

ET, KINETO = fixture_pair("cpu", "mlp_steps")
REPORT_NOTE = "a bug in et-link, not a problem with your files or options; please report it with the traceback above"


def _slip(*args, **kwargs):
    raise ValueError("an internal slip")


def test_user_errors_share_one_base():
    from linker.batch.errors import BatchSetupError, PairingError
    from linker.batch.folder_lock import FolderBusyError
    from linker.sim.view import ViewUnavailable
    from linker.write.chakra_wire import TraceFormatError

    for error in (TraceInputError, MismatchedPairError, OptionError, BatchSetupError, PairingError,
                  FolderBusyError, TraceFormatError, ViewUnavailable):
        assert issubclass(error, EtLinkError), error
    assert issubclass(OptionError, ValueError)  # what a library caller passing a bad argument expects
    assert not issubclass(ValueError, EtLinkError)


@pytest.mark.parametrize("arguments, line", [
    (["--max-inflated", "lots"], "--max-inflated: not a size: 'lots' (use e.g. 512M, 8G)"),
    (["batch", "--memory-budget", "0"], "--memory-budget: size must be positive: '0'"),
    (["batch", "--pid-ranks", "4242"], "--pid-ranks: '4242' is not PID:RANK (e.g. 4242:0)"),
    (["batch", "--astra-npus", "1"], "--astra-npus 1: ASTRA-sim needs at least 2 NPUs"),
])
def test_a_bad_option_value_is_still_one_line(tmp_path, arguments, line):
    """Option values parsed by the wings (``OptionError``), one line each as before."""
    if arguments[0] == "batch":
        arguments = [*arguments, "--et", str(tmp_path / "rank*.et.json.gz"), "--kineto",
                     str(tmp_path / "rank*.kineto.json.gz"), "--output-dir", str(tmp_path / "out")]
    else:
        arguments = [*arguments, "--et-file", str(ET), "--kineto-file", str(KINETO), "-o", str(tmp_path / "out.json")]
    result = CliRunner().invoke(cli.app, arguments)
    assert result.exit_code == cli.EXIT_INPUT, result.stderr
    assert result.stderr.strip().splitlines() == [f"et-link: error: {line}"]


def test_a_plain_value_error_inside_linking_is_reported_as_a_bug(tmp_path, monkeypatch):
    import linker.pipeline

    monkeypatch.setattr(linker.pipeline, "build_et_plus", _slip)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(cli.app, ["--et-file", str(ET), "--kineto-file", str(KINETO), "-o", str(out), "-q"])
    assert result.exit_code == cli.EXIT_INTERNAL, result.stderr
    assert "Traceback (most recent call last)" in result.stderr and "ValueError: an internal slip" in result.stderr
    assert "et-link: error:" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"et-link: internal error ({ET} + {KINETO}): {REPORT_NOTE}"
    assert not out.exists()


def test_a_bug_no_command_catches_is_reported_by_the_entry_point(tmp_path):
    """``simulate`` has no catch-all of its own: ``cli.main`` (the ``et-link`` program) prints the
    traceback and the note. Run as a program, the slip planted before ``main`` starts."""
    program = textwrap.dedent(f"""
        import sys
        import linker.sim.cli_run

        def slip(*args, **kwargs):
            raise ValueError("an internal slip")

        linker.sim.cli_run._checked_inputs = slip
        sys.argv = ["et-link", "simulate", {str(tmp_path / "rank0.et")!r}]
        from linker.cli import main
        main()
    """)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert proc.returncode == cli.EXIT_INTERNAL, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr and "ValueError: an internal slip" in proc.stderr
    assert "et-link: error:" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"et-link: internal error: {REPORT_NOTE}"


def test_an_option_error_from_the_same_place_is_one_line(tmp_path):
    """The same command, a user's mistake instead (``--scale`` that is not a number): one line, exit 2."""
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "simulate", str(tmp_path / "rank0.et"),
                           "--scale", "cpu=fast"], capture_output=True, text=True)
    assert proc.returncode == cli.EXIT_INPUT, proc.stderr
    assert proc.stderr.strip().splitlines() == ["et-link: error: bad --scale factor 'fast' for cpu"]

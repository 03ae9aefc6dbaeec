"""Progress bars on stderr: drawn on a terminal (a pseudo-terminal here), never with ``-q`` nor
when stderr is a pipe; the command's own output is the same either way.

The commands run as processes, as a user runs them. ``StageProgress`` waits ``DELAY_SECONDS``
(2 s) before drawing, longer than these small inputs take, so the processes start through a
one-line launcher that sets the delay to 0 first.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES
from sim_graphs import coll, cpu, write_et

LAUNCH = "import linker.model.progress as p; p.DELAY_SECONDS = 0.0; from linker.cli import main; main()"
CPU_PAIR = FIXTURES / "cpu" / "mlp_steps"
ESC = b"\x1b["


def et_link(*args) -> list[str]:
    return [sys.executable, "-c", LAUNCH, *map(str, args)]


def run_in_pty(command: list[str], timeout: float = 120) -> tuple[int, bytes]:
    """Run with stdin, stdout and stderr on one pseudo-terminal; (exit status, everything written)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    written = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the follower side closed: the process is gone
                    break
                if not chunk:
                    break
                written += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=10), written
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()


def link_args(tmp_path: Path) -> list:
    return ["--et-file", CPU_PAIR / "et.json.gz", "--kineto-file", CPU_PAIR / "kineto.json.gz",
            "-o", tmp_path / "out.json"]


def test_link_draws_its_stages_on_a_terminal_then_the_summary(tmp_path):
    status, written = run_in_pty(et_link(*link_args(tmp_path)))
    assert status == 0, written
    for stage in (b"et-link: reading", b"et-link: linking", b"et-link: writing"):
        assert stage in written, written
    assert b"/3" in written  # stages done of 3
    summary = written.rindex(b"et-link: rf_id: linked")
    assert written.rfind(b"et-link: writing") < summary  # the bar comes first, then the summary


def test_link_draws_nothing_with_quiet_on_a_terminal(tmp_path):
    status, written = run_in_pty(et_link(*link_args(tmp_path), "-q"))
    assert status == 0 and b"et-link: reading" not in written and b"linked" not in written, written


def test_link_draws_nothing_when_stderr_is_a_pipe(tmp_path):
    proc = subprocess.run(et_link(*link_args(tmp_path)), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert b"et-link: reading" not in proc.stderr and ESC not in proc.stderr
    assert proc.stderr.startswith(b"et-link: rf_id: linked")


def three_ranks(directory: Path) -> Path:
    directory.mkdir()
    for rank in range(3):
        write_et(directory / f"rank{rank}_plus.et",
                 [cpu(1, 10 + rank, start=100), coll(2, 8, [1], pg="0", start=111 + rank)])
    return directory


def test_simulate_draws_ranks_loading_on_a_terminal_and_nothing_in_a_pipe(tmp_path):
    job = three_ranks(tmp_path / "job")
    status, written = run_in_pty(et_link("simulate", job))
    assert status == 0, written
    assert b"et-link simulate: loading (rank 2, 3 of 3)" in written and b"et-link simulate: replaying" in written
    assert b"job span" in written
    proc = subprocess.run(et_link("simulate", job), capture_output=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == b"" and b"job span" in proc.stdout
    status, written = run_in_pty(et_link("simulate", job, "-q"))
    assert status == 0 and b"loading" not in written and b"job span" in written


def rank_set(directory: Path) -> Path:
    directory.mkdir()
    for rank, name in enumerate(("mlp_steps", "dataloader")):
        shutil.copyfile(FIXTURES / "cpu" / name / "et.json.gz", directory / f"rank{rank}.et.json.gz")
        shutil.copyfile(FIXTURES / "cpu" / name / "kineto.json.gz", directory / f"rank{rank}.kineto.json.gz")
    return directory


def batch_args(traces: Path, out: Path) -> list:
    return ["batch", "--et", traces / "rank*.et.json.gz", "--kineto", traces / "rank*.kineto.json.gz",
            "--output-dir", out, "--workers", "1"]


def test_batch_bar_counts_ranks_on_a_terminal_only(tmp_path):
    traces = rank_set(tmp_path / "traces")
    status, written = run_in_pty(et_link(*batch_args(traces, tmp_path / "a")))
    assert status == 0, written
    assert b"2/2: 2 done, 0 failed" in written and b"ETA" in written and b"\xe2\x94\x81" in written  # rich's bar
    proc = subprocess.run(et_link(*batch_args(traces, tmp_path / "b")), capture_output=True, timeout=120)
    assert proc.returncode == 0 and ESC not in proc.stderr and b"ETA" not in proc.stderr
    assert proc.stderr.count(b"\n") == 2  # one line per finished rank
    status, written = run_in_pty(et_link(*batch_args(traces, tmp_path / "c"), "-q"))
    assert status == 0 and b"ETA" not in written and b"summary:" in written


@pytest.mark.parametrize("command", [["validate", CPU_PAIR / "et.json.gz"], ["simulate", "JOB"]])
def test_output_into_a_closed_pipe_exits_quietly(tmp_path, command):
    """``et-link ... | head -c 10``: the reader goes away; et-link stops with status 141, silently."""
    command = [three_ranks(tmp_path / "job") if part == "JOB" else part for part in command]
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    writer = subprocess.run(et_link(*command), stdout=reader.stdin, stderr=subprocess.PIPE, timeout=120)
    reader.stdin.close()
    reader.wait()
    # A small output may fit the pipe before head exits: then et-link ends normally (0).
    assert writer.returncode in (0, 141) and writer.stderr == b"", writer.stderr


def test_output_into_an_already_closed_pipe_exits_141_without_a_word(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: the first write fails with EPIPE
    try:
        proc = subprocess.run(et_link("validate", CPU_PAIR / "et.json.gz"), stdout=write_end,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == b"", proc.stderr

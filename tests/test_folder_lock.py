"""One writer per output folder (``batch.folder_lock``), with real processes: two batches started
together, a batch killed outright, a batch stopped with Ctrl-C, a Dask client, ``astra-setup``;
and a rank-start rewrite that cannot give a file a second delay node."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, SHARED_TRACES
from linker.batch.folder_lock import LOCK_NAME, FolderBusyError, owned_folder
from linker.plan.rank_start import DELAY_NODE_NAME

CPU_PAIRS = ("mlp_steps", "threads", "dataloader", "main_thread_only")


def rank_set(directory: Path) -> tuple[Path, str]:
    """Four CPU fixture pairs as the ranks of a job (they ship with the project, so nothing skips;
    small, so each batch takes a second or two, which is all the lock needs), linked to ``.et``:
    the rank files and the batch format."""
    directory.mkdir(parents=True)
    for rank, name in enumerate(CPU_PAIRS):
        shutil.copyfile(FIXTURES / "cpu" / name / "et.json.gz", directory / f"rank{rank}.et.json.gz")
        shutil.copyfile(FIXTURES / "cpu" / name / "kineto.json.gz", directory / f"rank{rank}.kineto.json.gz")
    return directory, "et"


def batch_args(traces: Path, out: Path, fmt: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "linker.cli", "batch", "--et", str(traces / "rank*.et.json.gz"),
            "--kineto", str(traces / "rank*.kineto.json.gz"), "--output-dir", str(out), "--format", fmt, "-q", *more]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("et-link: error")]


def outputs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.name.endswith((".et", "_plus.json")))


def validate_all(out: Path) -> None:
    files = outputs(out)
    assert files
    for path in files:
        proc = subprocess.run([sys.executable, "-m", "linker.cli", "validate", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, (path, proc.stdout, proc.stderr)


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, "the batch ended before its lock was seen"
        assert time.monotonic() < deadline
        time.sleep(0.002)


def test_a_held_folder_is_refused_in_one_line_and_left_alone(tmp_path):
    traces, fmt = rank_set(tmp_path / "t")
    out = tmp_path / "out"
    with owned_folder(out, "the test"):
        proc = subprocess.run(batch_args(traces, out, fmt), capture_output=True, text=True, timeout=120)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and str(out) in lines[0] and f"pid {os.getpid()}" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.joinpath(LOCK_NAME).exists()  # released by its owner


def test_two_batches_started_together_one_runs_the_other_stops(tmp_path):
    traces, fmt = rank_set(tmp_path / "t")
    out = tmp_path / "out"
    procs = [subprocess.Popen(batch_args(traces, out, fmt, "--workers", "1"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert len(error_lines(refused)) == 1 and "another et-link run writes this folder" in refused
    validate_all(out)
    assert not out.joinpath(LOCK_NAME).exists()


def test_a_killed_batch_leaves_a_stale_lock_the_next_run_takes_over(tmp_path):
    traces, fmt = rank_set(tmp_path / "t")
    out = tmp_path / "out"
    first = subprocess.Popen(batch_args(traces, out, fmt, "--workers", "1"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(out / LOCK_NAME, first)
    time.sleep(0.05)  # the owner has written its name
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    assert out.joinpath(LOCK_NAME).exists()
    stale = json.loads(out.joinpath(LOCK_NAME).read_text())
    assert stale["pid"] == first.pid and stale["host"] == socket.gethostname()
    again = subprocess.run(batch_args(traces, out, fmt), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"taking over the lock of pid {first.pid}" in again.stderr
    assert not out.joinpath(LOCK_NAME).exists()
    validate_all(out)


def _ctrl_c_as_in_a_terminal() -> None:
    """A shell starts a background job with SIGINT ignored, and the child would inherit that: the
    batch gets Ctrl-C's default, as a command typed in a terminal has it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_no_lock(tmp_path):
    traces, fmt = rank_set(tmp_path / "t")
    out = tmp_path / "out"
    running = subprocess.Popen(batch_args(traces, out, fmt, "--workers", "1"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    wait_for(out / LOCK_NAME, running)
    os.killpg(running.pid, signal.SIGINT)  # what a terminal sends the foreground group
    code = running.wait(30)
    stderr = running.stderr.read()
    assert code != 0 and "Traceback" not in stderr, stderr
    assert not out.joinpath(LOCK_NAME).exists()


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_lock_is_taken_still_removes_it(tmp_path, monkeypatch, number):
    """The window the Ctrl-C test above can hit by chance, made certain: the signal comes after the
    lock file is made and before the owner has written its name."""
    from linker.batch import folder_lock
    from linker.read.files import Terminated, terminate_as_interrupt

    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a test worker may ignore it)
    terminate_as_interrupt()
    real_read = folder_lock._read_owner

    def read_then_signal(fd):
        os.kill(os.getpid(), number)
        return real_read(fd)

    monkeypatch.setattr(folder_lock, "_read_owner", read_then_signal)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            with owned_folder(tmp_path / "out", "the test"):
                pytest.fail("the block ran although a signal came while the lock was taken")
        assert isinstance(caught.value, Terminated) == (number == signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the lock put it back
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert not (tmp_path / "out" / LOCK_NAME).exists()


def test_a_dask_client_holds_the_folder_too(tmp_path):
    if importlib.util.find_spec("distributed") is None:
        pytest.skip("dask[distributed] is not installed")
    traces, fmt = rank_set(tmp_path / "t")
    out = tmp_path / "out"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    common = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path)
    started = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                 "--port", str(port), "--dashboard-address", ":0"], **common)]
    started.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "1",
                                     "--nthreads", "1", "--host", "127.0.0.1", "--dashboard-address", ":0"], **common))
    try:
        procs = [subprocess.Popen(batch_args(traces, out, fmt, "--scheduler", address), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)]
        # The local batch starts once the Dask client holds the folder (its ranks take seconds more):
        # started at the same instant on a loaded machine, either could finish before the other began.
        deadline = time.monotonic() + 120
        while not (out / LOCK_NAME).exists() and procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        procs.append(subprocess.Popen(batch_args(traces, out, fmt, "--workers", "1"), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        results = [(p.wait(180), p.stderr.read()) for p in procs]
    finally:
        for process in reversed(started):
            with_group = process.pid
            try:
                os.killpg(with_group, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(10)
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert len(error_lines(refused)) == 1 and str(out) in refused
    validate_all(out)


def test_astra_setup_into_a_folder_a_batch_holds_is_refused(tmp_path):
    traces, fmt = rank_set(tmp_path / "t")
    out = tmp_path / "out"
    assert subprocess.run(batch_args(traces, out, fmt), capture_output=True, timeout=120).returncode == 0
    before = {p.name: p.read_bytes() for p in out.joinpath("astra").iterdir() if p.is_file()}
    with owned_folder(out, "the test"):
        proc = subprocess.run([sys.executable, "-m", "linker.cli", "astra-setup", str(out)], capture_output=True,
                              text=True, timeout=120)
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1 and str(out) in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in out.joinpath("astra").iterdir() if p.is_file()} == before
    again = subprocess.run([sys.executable, "-m", "linker.cli", "astra-setup", str(out)], capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    first = {p.name: p.read_bytes() for p in out.joinpath("astra").rglob("*") if p.is_file()}
    outputs_before = {p.name: p.read_bytes() for p in outputs(out)}
    third = subprocess.run([sys.executable, "-m", "linker.cli", "astra-setup", str(out)], capture_output=True,
                           text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    # a rewrite run twice leaves the same bytes: the ASTRA-sim copies and the outputs they come from
    assert {p.name: p.read_bytes() for p in out.joinpath("astra").rglob("*") if p.is_file()} == first
    assert {p.name: p.read_bytes() for p in outputs(out)} == outputs_before


def test_a_lock_naming_another_host_is_not_taken(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.joinpath(LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "command": "et-link batch"}))
    with pytest.raises(FolderBusyError, match="elsewhere.example"):
        with owned_folder(out, "the test"):
            pass
    assert out.joinpath(LOCK_NAME).exists()  # that owner's file stays


def _delay_nodes(path: Path) -> list[int]:
    from linker.write.chakra_wire import iter_frames
    from linker.batch.rank_start_et import node_head

    return [node_head(f.payload)[0] for f in iter_frames(path) if f.index and node_head(f.payload)[1] == DELAY_NODE_NAME]


def test_rank_start_rewrite_is_idempotent_and_never_doubles_the_delay_node(tmp_path):
    """Twice with the same offset: byte-identical. A rewrite handed a graph read before another
    rewrite (what two batches in one folder did): still one delay node, with the newest offset."""
    et_file = SHARED_TRACES / "param_dlrm" / "rank0.et.json.gz"
    if not et_file.exists():
        pytest.skip("needs ../shared/traces/param_dlrm (see README: Real test traces)")
    from linker.batch.rank_start import set_rank_start
    from linker.pipeline import link_pair
    from linker.sim.load import load_graph

    out = tmp_path / "rank.0.et"
    link_pair(et_file, SHARED_TRACES / "param_dlrm" / "rank0.kineto.json.gz", out)
    stale_graph = load_graph(out, 0)  # read before any delay node
    assert _delay_nodes(out) == []
    assert set_rank_start(out, 1234) is True
    once = out.read_bytes()
    assert set_rank_start(out, 1234) is False and out.read_bytes() == once
    assert set_rank_start(out, 1234, stale_graph) is False or out.read_bytes() == once
    assert out.read_bytes() == once and len(_delay_nodes(out)) == 1
    assert set_rank_start(out, 777, stale_graph) is True  # the stale graph misses the delay node
    assert len(_delay_nodes(out)) == 1
    assert load_graph(out, 0).duration[load_graph(out, 0).names.index(DELAY_NODE_NAME)] == 777
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "validate", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout

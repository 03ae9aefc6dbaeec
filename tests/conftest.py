"""Shared test fixtures: where the real traces are, and small helpers to link them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_TRACES = ROOT.parent / "shared" / "traces"
README_SECTION = "Real test traces"  # the README section naming their public sources and the layout


def shared_reason(path: Path) -> str:
    """Why a test skips without a shared trace, in words a fresh clone understands: the trace set
    it needs, relative to the checkout ("needs ../shared/traces/param_dlrm (see README: Real test
    traces)"), never an absolute path."""
    try:
        parts = Path(path).resolve().relative_to(SHARED_TRACES.resolve()).parts
    except ValueError:
        parts = ()
    where = "../shared/traces" + (f"/{parts[0]}" if parts else "")
    return f"needs {where} (see README: {README_SECTION})"


def shared_trace(*parts: str) -> Path:
    """A file under ../shared/traces, or skip the test (``shared_reason``) when it is absent."""
    path = SHARED_TRACES.joinpath(*parts)
    if not path.exists():
        pytest.skip(shared_reason(path))
    return path


def linked_rank(tmp_path: Path, job: Path, rank: int, suffix: str = ".json") -> Path:
    """The output of one rank of a captured job (``job``/host.<rank>.json.gz with its
    device.<rank>.json.gz) linked into ``tmp_path`` as JSON or ``.et`` (``suffix``), once per test."""
    from linker.pipeline import link_pair

    out = tmp_path / f"{job.name}_{rank}{suffix}"
    if not out.exists():
        link_pair(job / f"host.{rank}.json.gz", job / f"device.{rank}.json.gz", out)
    return out


def job_reports(tmp_path: Path, job: Path, ranks, model: str = "astra-sim") -> list[dict]:
    """``simulate``'s JSON report of a captured job's ranks (``linked_rank``) replayed together,
    linked as JSON, then as ``.et``, asserting every node ran."""
    from linker.sim.cli_run import SimulateOptions, run_simulate

    reports = []
    for suffix in (".json", ".et"):
        paths = [linked_rank(tmp_path, job, rank, suffix) for rank in ranks]
        text, finished = run_simulate(SimulateOptions(paths, model=model, json_output=True))
        assert finished
        reports.append(json.loads(text))
    return reports


def checked_by_script(script: str, outputs: list) -> list[dict]:
    """``scripts/<script>`` (``order_check.py``, ``attribution.py``) run with ``--json`` on the
    outputs: its one report per file, asserting it exited 0 (no contradicted edge; no share of CPU
    time on another op beyond the format's resolution)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--json", *map(str, outputs)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def assert_no_contradicted_edge_nor_moved_time(outputs: list) -> None:
    """``order_check.py`` finds no contradicted edge in the outputs and ``attribution.py`` no CPU
    time on an op other than the one that measured it (JSON: below 0.01%)."""
    checked_by_script("order_check.py", outputs)
    rows = checked_by_script("attribution.py", outputs)
    assert len(rows) == len(outputs) and all(row["share_pct"] < 0.01 for row in rows), rows


def dlrm_pair(rank: int) -> tuple[Path, Path]:
    return (shared_trace("param_dlrm", f"rank{rank}.et.json.gz"),
            shared_trace("param_dlrm", f"rank{rank}.kineto.json.gz"))


def fixture_pair(*parts: str) -> tuple[Path, Path]:
    directory = FIXTURES.joinpath(*parts)
    return directory / "et.json.gz", directory / "kineto.json.gz"


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one test process per core this run may use (one under
    ``taskset -c 0``), not per core of the machine (psutil's count, which dask brings in)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.fixture(params=["serial", "forced"])
def schedule(request):
    """Each schedule a test's outputs must not depend on: ``Schedule.serial()`` (all in this
    process) and ``Schedule.forced()`` (every child and thread, whatever the sizes and cores)."""
    from linker.schedule import Schedule

    return Schedule.serial() if request.param == "serial" else Schedule.forced()


_LINKED: dict[tuple, tuple] = {}


@pytest.fixture(scope="session")
def linked_once(tmp_path_factory):
    """``link(et, kineto, suffix=".json")``: the pair (``et`` None: the Kineto trace alone) linked
    with the default options once per test process, to ``plus<suffix>`` with its report beside it;
    returns (output, report, the ``link_pair`` outcome). Tests read these files and never change
    them: several modules check the same real outputs, and each real trace costs seconds to link."""
    from linker.pipeline import link_pair

    def link(et, kineto, suffix: str = ".json"):
        key = (str(et), str(kineto), suffix)
        if key not in _LINKED:
            folder = tmp_path_factory.mktemp("linked")
            output, report = folder / f"plus{suffix}", folder / "report.json"
            outcome = link_pair(et, kineto, output, None, report)
            _LINKED[key] = (output, report, outcome)
        return _LINKED[key]

    return link


_DLRM_BATCHES: dict[str, tuple] = {}


@pytest.fixture(scope="session")
def dlrm_batch(tmp_path_factory):
    """``batch(rank_start="measured")``: the 8-rank param_dlrm job linked by ``run_batch`` to JSON
    (default options) once per test process; returns (its summary, its output folder). Tests read
    the folder and never change it (each such batch costs seconds); skips without the traces."""
    import io

    from linker.batch import BatchConfig, run_batch

    def batch(rank_start: str = "measured"):
        source = SHARED_TRACES / "param_dlrm"
        if not source.is_dir():
            pytest.skip(shared_reason(source))
        if rank_start not in _DLRM_BATCHES:
            out = tmp_path_factory.mktemp("dlrm_batch") / "out"
            summary = run_batch(BatchConfig(str(source / "rank*.et.json.gz"), str(source / "rank*.kineto.json.gz"),
                                            out, rank_start=rank_start), progress_stream=io.StringIO(),
                                interactive=False)
            _DLRM_BATCHES[rank_start] = (summary, out)
        return _DLRM_BATCHES[rank_start]

    return batch

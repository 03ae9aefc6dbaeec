"""Shared test fixtures: where the real traces are, and small helpers to link them."""

from __future__ import annotations

import os
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

"""Shared test fixtures: where the real traces are, and small helpers to link them."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def shared_trace(*parts: str) -> Path:
    """A file under ../shared/traces, or skip the test when the shared traces are absent."""
    path = SHARED_TRACES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared traces not available ({path})")
    return path


def dlrm_pair(rank: int) -> tuple[Path, Path]:
    return (shared_trace("param_dlrm", f"rank{rank}.et.json.gz"),
            shared_trace("param_dlrm", f"rank{rank}.kineto.json.gz"))


def fixture_pair(*parts: str) -> tuple[Path, Path]:
    directory = FIXTURES.joinpath(*parts)
    return directory / "et.json.gz", directory / "kineto.json.gz"


@pytest.fixture(params=["serial", "forced"])
def schedule(request):
    """Each schedule a test's outputs must not depend on: ``Schedule.serial()`` (all in this
    process) and ``Schedule.forced()`` (every child and thread, whatever the sizes and cores)."""
    from linker.schedule import Schedule

    return Schedule.serial() if request.param == "serial" else Schedule.forced()

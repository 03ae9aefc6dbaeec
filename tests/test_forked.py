"""Work split across processes: ``linker.schedule.fork`` and the two-process read of a large ``.et``
by ``et-link simulate`` (``sim.load_chakra.load_chakra``), which must give the graph one process gives."""

from __future__ import annotations

import dataclasses
import gzip
import os
import pickle
import time

import pytest

from conftest import dlrm_pair, fixture_pair
from linker.schedule import fork as forked
from linker.write.chakra_wire import frame_boundary, iter_frames
from linker.model.errors import TraceInputError
from linker.link.recipe import LinkOptions
from linker.pipeline import link_pair
from linker.schedule import Schedule
from linker.sim.engine import replay
from linker.sim.load import load_graph
from linker.sim.report import build_report

pytestmark = pytest.mark.skipif(not forked.can_fork(), reason="no os.fork here")


def test_forked_call_runs_in_another_process_and_returns_its_bytes():
    child = forked.ForkedCall(lambda: pickle.dumps((os.getpid(), list(range(100_000)))))
    pid, values = pickle.loads(child.result())
    assert pid != os.getpid()
    assert values == list(range(100_000))


def test_forked_call_that_fails_returns_none_so_the_caller_does_the_work():
    def fail():
        raise TraceInputError("some/trace.et", "message #7 is not a valid Chakra Node")

    assert forked.ForkedCall(fail).result() is None


def test_forked_call_cancelled_leaves_no_child_behind():
    child = forked.ForkedCall(lambda: time.sleep(60) or b"")
    pid = child._pid
    assert pid > 0
    child.cancel()
    with pytest.raises(ChildProcessError):  # killed and reaped: nothing left to wait for
        os.waitpid(pid, os.WNOHANG)


def test_forked_call_sends_an_iterators_parts_as_they_are_made(tmp_path):
    ready = tmp_path / "first part read"

    def two_parts():
        yield b"first" * 100_000
        while not ready.exists():  # the parent has the first part before the second is made
            time.sleep(0.01)
        yield os.getpid().to_bytes(8, "little")

    child = forked.ForkedCall(two_parts)
    pid = child._pid
    parts = child.parts()
    assert bytes(next(parts)) == b"first" * 100_000
    ready.touch()
    assert int.from_bytes(next(parts), "little") == pid
    assert next(parts, None) is None
    with pytest.raises(ChildProcessError):  # reaped once its parts have ended
        os.waitpid(pid, os.WNOHANG)


def test_forked_call_makes_the_next_part_while_the_parent_has_not_read_this_one(tmp_path):
    """Parts far larger than a pipe holds: the child goes on making them before the parent reads."""
    made = tmp_path / "all parts made"

    def three_parts():
        for k in range(3):
            yield bytes([k]) * (4 << 20)
        made.touch()
        yield b"end"

    child = forked.ForkedCall(three_parts)
    deadline = time.monotonic() + 30
    while not made.exists() and time.monotonic() < deadline:  # nothing read yet
        time.sleep(0.01)
    assert made.exists()
    assert [bytes(p) for p in child.parts()] == [bytes([k]) * (4 << 20) for k in range(3)] + [b"end"]


def test_forked_parts_stop_at_a_failure_and_keep_those_that_came_whole():
    def fails_after_one():
        yield b"kept"
        raise TraceInputError("some/trace.json", "broken")

    assert [bytes(p) for p in forked.ForkedCall(fails_after_one).parts()] == [b"kept"]

    def fails_after_large_ones():  # parts still waiting for the parent when the failure comes
        yield b"a" * (2 << 20)
        yield b"b" * (2 << 20)
        raise TraceInputError("some/trace.json", "broken")

    assert [bytes(p) for p in forked.ForkedCall(fails_after_large_ones).parts()] == [b"a" * (2 << 20), b"b" * (2 << 20)]
    assert forked.ForkedCall(fails_after_one).result() is None  # one payload was asked for: not whole


def _graph_fields(graph) -> dict:
    fields = {f.name: getattr(graph, f.name) for f in dataclasses.fields(graph)}
    # NaN != NaN: compare the start column by its bytes
    fields["start"] = bytes(fields["start"])
    return fields


def _linked_et(tmp_path, et, kineto, name):
    out = tmp_path / name
    link_pair(et, kineto, out, LinkOptions(), None)
    return out


SERIAL, SPLIT = Schedule.serial(), Schedule.forced()  # a plain .et read by one process, or two


@pytest.mark.parametrize("pair", ["cpu_threads", "dlrm_rank3", "gpu_v111"])
def test_two_process_read_gives_the_one_process_graph(tmp_path, pair):
    """Also on a GPU output after its wait step (kernels' pieces, their edges, wait nodes)."""
    if pair == "gpu_v111":
        from linker.sim.file_waits import add_file_waits

        path = tmp_path / "gpu.et"
        outcome = link_pair(*fixture_pair("gpu", "gpu_v111"), path, LinkOptions(), None)
        assert add_file_waits(outcome, "measured") > 0
    else:
        et, kineto = fixture_pair("cpu", "threads") if pair == "cpu_threads" else dlrm_pair(3)
        path = _linked_et(tmp_path, et, kineto, f"{pair}.et")
    offset, index = frame_boundary(path, path.stat().st_size // 2)
    assert 0 < offset < path.stat().st_size and index > 1  # a real split, mid-file
    assert [f.offset for f in iter_frames(path)][index] == offset
    split = load_graph(path, 0, SPLIT)
    serial = load_graph(path, 0, SERIAL)
    assert _graph_fields(split) == _graph_fields(serial)
    assert build_report(replay([split]))[0].to_json() == build_report(replay([serial]))[0].to_json()


def test_two_process_read_reports_a_cut_file_as_one_process_does(tmp_path):
    et, kineto = fixture_pair("cpu", "threads")
    path = _linked_et(tmp_path, et, kineto, "threads.et")
    data = path.read_bytes()
    cut = tmp_path / "cut.et"
    cut.write_bytes(data[: len(data) - 5])  # the last message of the second half is truncated
    with pytest.raises(TraceInputError) as from_split:
        load_graph(cut, 0, SPLIT)
    with pytest.raises(TraceInputError) as from_serial:
        load_graph(cut, 0, SERIAL)
    assert "truncated" in str(from_split.value)
    assert str(from_split.value) == str(from_serial.value)


def test_gzip_et_is_read_in_one_process(tmp_path):
    et, kineto = fixture_pair("cpu", "threads")
    path = _linked_et(tmp_path, et, kineto, "threads.et")
    packed = tmp_path / "threads.et.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert frame_boundary(packed, 10) is None
    assert _graph_fields(load_graph(packed, 0, SPLIT)) | {"path": ""} == _graph_fields(load_graph(path, 0, SPLIT)) | {"path": ""}


def test_only_the_schedule_splits_the_read(tmp_path):
    """The library reads in one process unless told; ``auto`` splits only large files with a spare core."""
    et, kineto = fixture_pair("cpu", "threads")
    path = _linked_et(tmp_path, et, kineto, "threads.et")
    assert not SERIAL.splits_load(path) and SPLIT.splits_load(path)
    assert not Schedule.auto().splits_load(path)  # under its size threshold
    assert not Schedule.forced().splits_load(tmp_path / "absent.et")

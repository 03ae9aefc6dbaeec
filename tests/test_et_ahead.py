"""The ET's input check and tree order run in a forked child (``et_ahead``) while the parent takes
the Kineto child's parts: the same read, warnings, refusals, tree order and ET+ as the parent doing
that work itself, and the parent doing it whenever the child's check is not clean or fails."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from conftest import dlrm_pair, fixture_pair
from test_read_paths import refused_et_and_serial_errors, serial_read
from linker import chakra_deps, et_ahead, forked, kineto_ahead, pipeline
from linker.errors import TraceInputError
from linker.et_reader import parent_positions, read_execution_trace

needs_fork = pytest.mark.skipif(not forked.can_fork(), reason="no os.fork here")


def edited_et(tmp_path, edit) -> tuple:
    """The threads pair with its ET changed by ``edit(nodes)``."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    document = json.loads(gzip.decompress(et_path.read_bytes()))
    edit(document["nodes"])
    changed = tmp_path / "et.json"
    changed.write_text(json.dumps(document))
    return changed, kineto_path


def pair_of(case: str, tmp_path) -> tuple:
    if case == "repaired":  # a node whose parent is missing: the check re-attaches it
        return edited_et(tmp_path, lambda nodes: nodes[5].update(ctrl_deps=987654321))
    if case == "dlrm":
        return dlrm_pair(0)
    return fixture_pair(*case.split("/"))


def kineto_done_first(monkeypatch) -> list:
    """Both children fork for any size, and the ET is read only once the Kineto child has made all
    its parts (as on a CPU trace, whose ET is the larger file). Returns the list each call of
    ``et_ahead.finish`` appends its outcome to; ``_EtAhead`` (the parent's own work while it would
    wait) fails the test."""
    monkeypatch.setattr(kineto_ahead, "FORK_MIN_BYTES", 0)
    monkeypatch.setattr(et_ahead, "FORK_MIN_NODES", 0)
    real_read, real_finish, children = pipeline.read_execution_trace, et_ahead.finish, []
    real_start = kineto_ahead.start

    def start(path):
        children.append(real_start(path))
        return children[-1]

    def read_late(path, *args):
        child = children[-1] if children else None
        deadline = time.monotonic() + 30
        while child is not None and not child.sending() and time.monotonic() < deadline:
            time.sleep(0.01)  # the child has sent something, or failed and closed the pipe
        deadline = time.monotonic() + 1
        while child is not None and not child.made() and time.monotonic() < deadline:
            time.sleep(0.01)  # a child that failed never says it has made its parts
        return real_read(path, *args)

    outcomes = []

    def finish(child, et):
        assert child is not None, "the ET child was not started"
        outcomes.append(real_finish(child, et))
        return outcomes[-1]

    def no_parent_work(et, between):
        raise AssertionError("the parent checked the ET while waiting")

    monkeypatch.setattr(kineto_ahead, "start", start)
    monkeypatch.setattr(pipeline, "read_execution_trace", read_late)
    monkeypatch.setattr(et_ahead, "finish", finish)
    monkeypatch.setattr(pipeline._EtAhead, "__init__", no_parent_work)
    return outcomes


def same_tree_order(a, b) -> bool:
    return (a.by_id, a.preorder, list(a.parent), a.dropped, list(a.chains)) == (
        b.by_id, b.preorder, list(b.parent), b.dropped, list(b.chains))


@needs_fork
@pytest.mark.parametrize("case", ["cpu/threads", "gpu/gpu_v111", "cpu/autograd_threads", "repaired", "dlrm"])
def test_the_ets_work_in_a_child_is_the_parents(monkeypatch, tmp_path, case):
    et_path, kineto_path = pair_of(case, tmp_path)
    et, kineto, warnings = serial_read(monkeypatch, et_path, kineto_path)
    outcomes = kineto_done_first(monkeypatch)
    et2, kineto2, warnings2 = pipeline.read_pair(et_path, kineto_path)
    clean = case != "repaired"
    assert outcomes == [clean]
    assert kineto2 == kineto and warnings2 == warnings
    assert (et2.ids, et2.names, et2.parent, et2.tid) == (et.ids, et.names, et.parent, et.tid)
    if clean:  # the child's tree order and parent positions are on the ET, as the parent computes them
        # The positions came with the child's columns: taken as they are, no id map made here.
        assert et2._parent_index is not None and et2._index_of_id is None
        early, taken = et2.tree_order, et2.parent_index()
        et2.tree_order = None
        assert early is not None and same_tree_order(early, chakra_deps.tree_order(et2))
        assert taken == parent_positions(et2.parent, et2.index_of_id())
    else:
        assert "re-attached" in " ".join(warnings2) and et2.tree_order is None
    pipeline.link_pair(et_path, kineto_path, tmp_path / "ahead.json")
    assert len(outcomes) == 2
    monkeypatch.undo()
    pipeline.link_pair(et_path, kineto_path, tmp_path / "serial.json", read_ahead=False)
    assert (tmp_path / "ahead.json").read_bytes() == (tmp_path / "serial.json").read_bytes()


@needs_fork
def test_a_refused_et_is_named_where_a_serial_read_names_it(monkeypatch, tmp_path):
    """The child's check refuses: the parent checks again after the Kineto file is read, so the
    refusal is the serial read's, and a bad Kineto file is still the one named first."""
    bad_et, serial = refused_et_and_serial_errors(monkeypatch, tmp_path)
    outcomes = kineto_done_first(monkeypatch)
    for kineto, expected in serial:
        with pytest.raises(TraceInputError) as err:
            pipeline.read_pair(bad_et, kineto)
        assert str(err.value) == expected
    # The cut Kineto file fails its read first: the ET child is cancelled, its outcome never taken.
    assert outcomes == [False]


@needs_fork
def test_a_failing_child_leaves_the_work_to_the_parent(monkeypatch, tmp_path):
    et_path, kineto_path = fixture_pair("cpu", "threads")
    et, kineto, warnings = serial_read(monkeypatch, et_path, kineto_path)
    outcomes = kineto_done_first(monkeypatch)

    def fails(et):
        raise RuntimeError("no tree order")

    monkeypatch.setattr(et_ahead, "_check_and_order", fails)
    et2, kineto2, warnings2 = pipeline.read_pair(et_path, kineto_path)
    assert outcomes == [False] and et2.tree_order is None
    assert kineto2 == kineto and warnings2 == warnings and et2.ids == et.ids


@needs_fork
def test_a_payload_for_another_et_is_not_taken(monkeypatch):
    """Columns of the wrong length (another ET's) are refused, never put on this ET."""
    monkeypatch.setattr(et_ahead, "FORK_MIN_NODES", 0)
    small = read_execution_trace(fixture_pair("cpu", "threads")[0])
    other = read_execution_trace(fixture_pair("cpu", "autograd_threads")[0])
    assert len(small.nodes) != len(other.nodes)
    assert et_ahead.finish(et_ahead.start(other), small) is False and small.tree_order is None
    assert et_ahead.finish(et_ahead.start(other), other) is True and other.tree_order is not None


def test_small_ets_are_not_forked():
    et = read_execution_trace(fixture_pair("cpu", "threads")[0])
    assert len(et.nodes) < et_ahead.FORK_MIN_NODES and et_ahead.start(et) is None
    assert et_ahead.finish(None, et) is False


@needs_fork
def test_sending_tells_a_child_at_work_from_one_whose_bytes_wait():
    def slow():
        time.sleep(0.5)
        return b"x" * 10

    child = forked.ForkedCall(slow)
    assert child.sending() is False  # still asleep: nothing in the pipe, nothing made
    deadline = time.monotonic() + 30
    while not child.sending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.sending() and bytes(child.result()) == b"x" * 10
    assert child.sending() is True  # made, even once reaped

    def parts():
        yield b"first"
        time.sleep(0.5)
        yield b"second"

    child = forked.ForkedCall(parts)
    while not child.sending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.sending() and not child.made()  # the first part waits, the second is not made
    assert [bytes(p) for p in child.parts()] == [b"first", b"second"]

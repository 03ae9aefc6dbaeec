"""The ET's own fields of a ``.et`` encoded by a forked child while the parent links
(``schedule.fields_child``, under a schedule that starts it): the output is the same bytes as without the child, whether the child did every
node, some, or none (it failed, was stopped, or its nodes were not the parent's), and no child is
left behind."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from conftest import fixture_pair, shared_trace
from linker import pipeline
from linker.model.output import Output
from linker.schedule import Schedule
from linker.schedule import fields_child as chakra_ahead
from linker.write import chakra_encode
from linker.write import chakra as write_chakra
from linker.model.errors import TraceInputError
from linker.read.et import read_execution_trace
from linker.read.files import read_trace_bytes

FORCED = Schedule.forced()
NESTED = [("cpu", "threads"), ("cpu", "autograd_threads"), ("cpu", "dataloader_annotated"), ("gpu", "gpu_v111"),
          ("gpu", "shapes_rocm")]


def _no_child_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


class Spy:
    """Records what ``take`` gave and, per ET op written, whether the child's bytes were used."""

    def __init__(self, monkeypatch, wait_for_child: bool):
        self.taken: list = []
        self.from_child = self.from_parent = 0
        real_take, real_chunk = chakra_ahead.FieldsAhead.take, chakra_ahead.PreEncoded.chunk
        spy = self

        def take(ahead, et):
            pre = real_take(ahead, et)
            if pre is not None and wait_for_child:  # every node done before the write starts
                deadline = time.monotonic() + 60
                while pre._done < len(et.nodes) and not ahead.ended and time.monotonic() < deadline:
                    pre._refresh()
                    time.sleep(0.005)
            spy.taken.append(pre)
            return pre

        def chunk(pre, order):
            fields = real_chunk(pre, order)
            ops = [f for u, f in zip(order, fields) if u < len(pre._bounds) - 1]
            spy.from_child += sum(f is not None for f in ops)
            spy.from_parent += sum(f is None for f in ops)
            return fields

        monkeypatch.setattr(chakra_ahead.FieldsAhead, "take", take)
        monkeypatch.setattr(chakra_ahead.PreEncoded, "chunk", chunk)


def _plain_copy(path: Path, tmp_path: Path) -> Path:
    plain = tmp_path / "et.json"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    return plain


def _link_both(et_path, kineto_path, tmp_path) -> tuple[bytes, bytes]:
    ahead, alone = tmp_path / "ahead.et", tmp_path / "alone.et"
    pipeline.link_pair(et_path, kineto_path, ahead, schedule=FORCED)
    pipeline.link_pair(et_path, kineto_path, alone, schedule=Schedule.serial())
    return ahead.read_bytes(), alone.read_bytes()


@pytest.mark.parametrize("compressed", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("case", NESTED, ids=["/".join(c) for c in NESTED])
def test_fields_from_the_child_give_the_same_et(case, compressed, tmp_path, monkeypatch):
    et_path, kineto_path = fixture_pair(*case)
    if not compressed:
        et_path = _plain_copy(et_path, tmp_path)
    spy = Spy(monkeypatch, wait_for_child=True)
    ahead, alone = _link_both(et_path, kineto_path, tmp_path)
    assert ahead == alone
    nodes = len(read_execution_trace(et_path).nodes)
    assert spy.taken[0] is not None and spy.from_child == nodes and spy.from_parent == 0
    assert _no_child_left()


def test_fields_from_a_real_pair_give_the_same_et(tmp_path, monkeypatch):
    et_path = shared_trace("torch_cpu", "mlp_multistep", "et.json.gz")
    spy = Spy(monkeypatch, wait_for_child=False)  # as it comes: some nodes from each side, maybe
    ahead, alone = _link_both(et_path, et_path.with_name("kineto.json.gz"), tmp_path)
    assert ahead == alone
    assert spy.taken[0] is not None and spy.from_child + spy.from_parent == len(read_execution_trace(et_path).nodes)


def test_a_child_that_fails_midway_leaves_the_rest_to_the_parent(tmp_path, monkeypatch):
    et_path, kineto_path = fixture_pair("cpu", "threads")
    spy = Spy(monkeypatch, wait_for_child=True)
    monkeypatch.setattr(chakra_ahead, "BATCH", 100)
    real_fields = chakra_encode.EtOnlyFields

    class Failing(real_fields):
        calls = 0

        def __call__(self, node):
            Failing.calls += 1
            if Failing.calls > 250:  # in the child: two batches reported, then it dies
                raise RuntimeError("child fails")
            return super().__call__(node)

    monkeypatch.setattr(chakra_ahead, "EtOnlyFields", Failing)
    ahead, alone = _link_both(et_path, kineto_path, tmp_path)
    assert ahead == alone
    assert spy.from_child == 200 and spy.from_parent == len(read_execution_trace(et_path).nodes) - 200
    assert _no_child_left()


def test_a_flat_et_stops_the_child(tmp_path, monkeypatch):
    et_path, kineto_path = fixture_pair("gpu", "gpu_v101")
    spy = Spy(monkeypatch, wait_for_child=False)
    ahead, alone = _link_both(et_path, kineto_path, tmp_path)
    assert ahead == alone
    assert spy.taken == [None]
    assert _no_child_left()


def test_nodes_that_are_not_the_parents_are_not_used(monkeypatch):
    et_path, _ = fixture_pair("cpu", "threads")
    ahead = chakra_ahead.start(et_path, 0)
    et = read_execution_trace(et_path, ahead.inflate_into)
    ahead.go(et)
    et.ids = et.ids[:-2] + [et.ids[-1], et.ids[-2]]  # as if the parent had other nodes
    assert ahead.take(et) is None
    assert ahead._child is None and _no_child_left()


def test_an_error_while_linking_stops_the_child(tmp_path, monkeypatch):
    et_path, kineto_path = fixture_pair("cpu", "threads")
    started = []
    real_start = chakra_ahead.start
    monkeypatch.setattr(chakra_ahead, "start", lambda *args: started.append(real_start(*args)) or started[-1])

    def failing_link(*args):
        raise TraceInputError(et_path, "refused")

    monkeypatch.setattr(pipeline, "link", failing_link)
    with pytest.raises(TraceInputError, match="refused"):
        pipeline.link_pair(et_path, kineto_path, tmp_path / "out.et", schedule=FORCED)
    assert started[0] is not None and started[0]._child is None and _no_child_left()
    assert not list(tmp_path.iterdir())


def test_json_outputs_and_small_ets_start_no_child(tmp_path):
    et_path, _ = fixture_pair("cpu", "threads")
    assert FORCED.fields_encoder(et_path, Output.of(tmp_path / "out.json")) is None
    assert Schedule.serial().fields_encoder(et_path, Output.of(tmp_path / "out.et")) is None
    assert chakra_ahead.start(et_path, Schedule().child_min_bytes) is None  # under the threshold


def test_batches_asked_for_are_given_back(tmp_path, monkeypatch):
    et_path, kineto_path = fixture_pair("cpu", "autograd_threads")
    spy = Spy(monkeypatch, wait_for_child=True)
    monkeypatch.setattr(chakra_ahead, "BATCH", 16)
    monkeypatch.setattr(write_chakra, "CHUNK_NODES", 50)  # releases come between chunks
    ahead, alone = _link_both(et_path, kineto_path, tmp_path)
    assert ahead == alone
    pre = spy.taken[0]
    assert pre._released > len(pre._area) // 10 and not any(pre._left)


def test_gunzip_into_a_fixed_buffer(tmp_path):
    import mmap

    text = b'{"nodes": [' + b",".join(b'{"id": %d, "name": "op"}' % i for i in range(5000)) + b"]}"
    one = tmp_path / "one.json.gz"
    one.write_bytes(gzip.compress(text))
    buffers = []

    def into(size):
        buffers.append(mmap.mmap(-1, size))
        return buffers[-1]

    data = read_trace_bytes(one, into)
    assert isinstance(data, memoryview) and data.obj is buffers[0] and bytes(data) == text
    # Two gzip members: the trailer gives the last one's size, too short; the text goes on privately.
    two = tmp_path / "two.json.gz"
    two.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    data = read_trace_bytes(two, into)
    assert len(buffers[1]) == len(text) - 1000 and isinstance(data, bytearray) and bytes(data) == text
    assert read_trace_bytes(two, lambda size: None) == text


def test_an_et_that_does_not_fit_its_trailers_size_stops_the_child(tmp_path, monkeypatch):
    """Two gzip members: the trailer gives the last one's size, the text goes on in a private
    buffer, and the child (which would decode the shared one) is stopped."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    text = gzip.decompress(et_path.read_bytes())
    two = tmp_path / "et.json.gz"
    two.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    spy = Spy(monkeypatch, wait_for_child=False)
    ahead, alone = _link_both(two, kineto_path, tmp_path)
    assert ahead == alone
    assert spy.taken == [None] and _no_child_left()

"""The ET's own fields of a ``.et`` encoded by a forked child while the parent links
(``schedule.fields_child``, under a schedule that starts it): the output is the same bytes as without the child, whether the child did every
node, some, or none (it failed, was stopped, or its nodes were not the parent's), and no child is
left behind."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from conftest import fixture_pair, shared_trace
from linker import pipeline
from linker.model.output import Output
from linker.schedule import Schedule
from linker.schedule import fields_child as chakra_ahead
from linker.write import chakra_encode
from linker.link.etplus import build_et_plus
from linker.link.recipe import link
from linker.plan.deps import dependency_plan
from linker.read.kineto import read_kineto_trace
from linker.write.chakra_encode import AttrEncoder, EtOnlyFields
from linker.model.errors import TraceInputError
from linker.read.et import read_execution_trace
from linker.read.files import read_trace_bytes

FORCED = Schedule.forced()
# The writer takes the child's fields once it is done (or has ended): its share is then exact.
WAITING = FORCED.without(wait_for_fields=True)
NESTED = [("cpu", "threads"), ("cpu", "autograd_threads"), ("cpu", "dataloader_annotated"), ("gpu", "gpu_v111"),
          ("gpu", "shapes_rocm")]


def _no_child_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _plain_copy(path: Path, tmp_path: Path) -> Path:
    plain = tmp_path / "et.json"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    return plain


def _link_both(et_path, kineto_path, tmp_path, schedule=WAITING) -> tuple[bytes, bytes, int]:
    """The ``.et`` under ``schedule`` and under the serial one, and how many ops' ET-only fields
    the child gave under ``schedule``."""
    ahead, alone = tmp_path / "ahead.et", tmp_path / "alone.et"
    outcome = pipeline.link_pair(et_path, kineto_path, ahead, schedule=schedule)
    serial = pipeline.link_pair(et_path, kineto_path, alone, schedule=Schedule.serial())
    assert serial.written.et_fields_from_child == 0
    return ahead.read_bytes(), alone.read_bytes(), outcome.written.et_fields_from_child


@pytest.mark.parametrize("compressed", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("case", NESTED, ids=["/".join(c) for c in NESTED])
def test_fields_from_the_child_give_the_same_et(case, compressed, tmp_path):
    et_path, kineto_path = fixture_pair(*case)
    if not compressed:
        et_path = _plain_copy(et_path, tmp_path)
    ahead, alone, from_child = _link_both(et_path, kineto_path, tmp_path)
    assert ahead == alone
    assert from_child == len(read_execution_trace(et_path).nodes)  # every ET node's, none left to the writer
    assert _no_child_left()


def test_fields_from_a_real_pair_give_the_same_et(tmp_path):
    et_path = shared_trace("torch_cpu", "mlp_multistep", "et.json.gz")
    nodes = len(read_execution_trace(et_path).nodes)
    kineto_path = et_path.with_name("kineto.json.gz")
    ahead, alone, from_child = _link_both(et_path, kineto_path, tmp_path, FORCED)  # as it comes: some from each side, maybe
    assert ahead == alone and 0 <= from_child <= nodes
    ahead, alone, from_child = _link_both(et_path, kineto_path, tmp_path)
    assert ahead == alone and from_child == nodes


def test_a_child_that_fails_midway_leaves_the_rest_to_the_parent(tmp_path, monkeypatch):
    et_path, kineto_path = fixture_pair("cpu", "threads")
    real_fields = chakra_encode.EtOnlyFields

    class Failing(real_fields):
        calls = 0

        def __call__(self, node):
            Failing.calls += 1
            if Failing.calls > 250:  # in the child: two batches reported, then it dies
                raise RuntimeError("child fails")
            return super().__call__(node)

    monkeypatch.setattr(chakra_ahead, "EtOnlyFields", Failing)  # the child's encoder: it fails at node 251
    ahead, alone, from_child = _link_both(et_path, kineto_path, tmp_path, WAITING.without(fields_batch_nodes=100))
    assert ahead == alone
    assert from_child == 200 and len(read_execution_trace(et_path).nodes) > 250  # the rest: the writer's
    assert _no_child_left()


def test_a_flat_et_stops_the_child(tmp_path):
    et_path, kineto_path = fixture_pair("gpu", "gpu_v101")
    ahead, alone, from_child = _link_both(et_path, kineto_path, tmp_path)
    assert ahead == alone
    assert from_child == 0
    assert _no_child_left()


def test_nodes_that_are_not_the_parents_are_not_used():
    et_path, _ = fixture_pair("cpu", "threads")
    ahead = chakra_ahead.start(et_path, 0, Schedule().fields_batch_nodes)
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
    assert chakra_ahead.start(et_path, Schedule().child_min_bytes, Schedule().fields_batch_nodes) is None  # under the threshold


def test_batches_asked_for_are_given_back():
    """The writer's order in chunks of 50 against batches of 16: every batch ends up asked for, the
    area of those the child wrote is given back, and each op's fields are the writer's own bytes."""
    et_path, kineto_path = fixture_pair("cpu", "autograd_threads")
    ahead = chakra_ahead.start(et_path, 0, 16, wait=True)
    et = read_execution_trace(et_path, ahead.inflate_into)
    ahead.go(et)
    pre = ahead.take(et)
    assert pre is not None
    et_plus = build_et_plus(link(et, read_kineto_trace(kineto_path)))
    order = dependency_plan(et_plus).order
    writers = EtOnlyFields(AttrEncoder())
    given = 0
    for start in range(0, len(order), 50):
        chunk = order[start:start + 50]
        for u, fields in zip(chunk, pre.chunk(chunk)):
            if u < len(et.nodes):
                assert fields == writers(et.nodes[u])
                given += 1
    ahead.cancel()
    assert given == len(et.nodes) and pre.batches_open() == 0
    assert pre.released > et.text_bytes // 10
    assert _no_child_left()


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


def test_an_et_that_does_not_fit_its_trailers_size_stops_the_child(tmp_path):
    """Two gzip members: the trailer gives the last one's size, the text goes on in a private
    buffer, and the child (which would decode the shared one) is stopped."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    text = gzip.decompress(et_path.read_bytes())
    two = tmp_path / "et.json.gz"
    two.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    ahead, alone, from_child = _link_both(two, kineto_path, tmp_path)
    assert ahead == alone
    assert from_child == 0 and _no_child_left()

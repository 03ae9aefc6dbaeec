"""The speed paths of the writers give the same bytes as a plain reference.

- ``.et``: node messages are encoded a chunk at a time with caches of what repeats
  (``chakra_encode.NodeFrames``); the file and the summary must equal what protobuf makes of the
  same messages built one at a time (``chakra_oracle``), whatever the chunk size.
- ET+ JSON: written in pieces by a writer thread, each encoded into a buffer the thread hands back
  once written (``fileio.BackgroundWriter.buffer``); it must equal one ``msgspec`` encode of the
  whole document.
"""

from __future__ import annotations

import threading
import time

import msgspec
import pytest

from chakra_oracle import expected_et
from conftest import dlrm_pair, fixture_pair
from linker.write import chakra as write_chakra
from linker.write.chakra_attrs import AttrEncoder
from linker.write.chakra_fields import EtOnlyFields
from linker.write.chakra_wire import read_et
from linker.read.et import FLAT, read_execution_trace
from linker.write.sink import BackgroundWriter
from linker.link.etplus import build_et_plus
from linker.read.kineto import read_kineto_trace
from linker.link.recipe import link
from linker.write.etplus_json import NODES_PER_PIECE, write_et_plus_json


def _et_plus(et_path, kineto_path):
    return build_et_plus(link(read_execution_trace(et_path), read_kineto_trace(kineto_path)))


def _expected_et(et_plus):
    """The ``.et`` bytes protobuf makes of the messages built one at a time, its frames (metadata
    first) and its summary (``chakra_oracle``)."""
    return expected_et(et_plus)


PAIRS = [lambda: fixture_pair("cpu", "threads"), lambda: fixture_pair("gpu", "gpu_v111"), lambda: dlrm_pair(3),
         lambda: fixture_pair("gpu", "gpu_v101")]


@pytest.mark.parametrize("pair", PAIRS, ids=["cpu-threads", "gpu-v111", "dlrm-rank3", "gpu-v101-flat"])
def test_chunked_et_write_equals_protobuf_messages(pair, tmp_path):
    """The writer's chunked encoder (``NodeFrames``: columns, cached fields) gives the bytes and
    counts protobuf gives for the same messages built one at a time (``chakra_oracle``)."""
    et_plus = _et_plus(*pair())
    expected, frames, expected_summary = _expected_et(et_plus)
    assert expected_summary.counts_by_type["COMP_NODE"] > 0
    for chunk_nodes in (write_chakra.CHUNK_NODES, 61):
        summary = write_chakra.write_chakra_trace(et_plus, tmp_path / f"chunks{chunk_nodes}.et", chunk_nodes=chunk_nodes)
        assert (tmp_path / f"chunks{chunk_nodes}.et").read_bytes() == expected
        assert summary.nodes == len(frames) - 1 == len(list(read_et(tmp_path / f"chunks{chunk_nodes}.et"))) - 1
        assert summary.counts_by_type == expected_summary.counts_by_type
        assert summary.comm_unresolved == expected_summary.comm_unresolved


class _AllFields:
    """A stand-in for ``fields_child.PreEncoded``: every ET op's fields from ``EtOnlyFields``
    called op by op (as the child calls it), none for GPU ops."""

    def __init__(self, et):
        fields = EtOnlyFields(AttrEncoder(), et.layout == FLAT)
        self._fields = [fields(node) for node in et.nodes]

    def chunk(self, order):
        n = len(self._fields)
        return [self._fields[u] if u < n else None for u in order]


@pytest.mark.parametrize("pair", PAIRS, ids=["cpu-threads", "gpu-v111", "dlrm-rank3", "gpu-v101-flat"])
def test_et_only_fields_given_by_a_child_give_the_same_file(pair, tmp_path):
    """The ET's own fields of every op given ready-made (as ``fields_child`` gives them) or
    encoded by ``NodeFrames`` itself: the same file, for both layouts."""
    et_plus = _et_plus(*pair())
    write_chakra.write_chakra_trace(et_plus, tmp_path / "own.et")
    write_chakra.write_chakra_trace(et_plus, tmp_path / "given.et", pre_encoded=_AllFields(et_plus.et))
    assert (tmp_path / "given.et").read_bytes() == (tmp_path / "own.et").read_bytes() == _expected_et(et_plus)[0]


def test_json_in_pieces_equals_one_encode(tmp_path):
    et_plus = _et_plus(*dlrm_pair(0))
    for per_piece in (NODES_PER_PIECE, 7, 1):
        write_et_plus_json(et_plus, tmp_path / f"pieces{per_piece}.json", nodes_per_piece=per_piece)
        doc = et_plus.et.header
        original = doc.nodes
        doc.nodes = et_plus.all_nodes()
        try:
            whole = msgspec.json.encode(doc)
        finally:
            doc.nodes = original
        assert (tmp_path / f"pieces{per_piece}.json").read_bytes() == whole
    assert et_plus.gpu_nodes, "the pair must have GPU nodes, so the pieces cross from ET to GPU nodes"


def test_chunked_et_write_of_odd_start_times_equals_protobuf_messages(tmp_path):
    """Start times of every size and sign (varints of one to nine bytes side by side in a chunk:
    crossing 2**14 and 2**28 boundaries, going back, negative and tiny ones)."""
    et_plus = _et_plus(*fixture_pair("cpu", "threads"))
    odd = [-20000.4, -1.0, 0.2, 3.0, 16383.0, 16384.0, (1 << 28) - 1, 1 << 28, (1 << 28) + 16383, (1 << 28) + 16384,
           1_700_000_000_123_456.0, 1_700_000_000_123_456.0 + 16384, 1_700_000_000_000_000.0, (1 << 56) + 5.0]
    timed = [node for node in et_plus.et.nodes if node.ts is not msgspec.UNSET]
    for k, node in enumerate(timed):
        node.ts = odd[k % len(odd)]
    expected = _expected_et(et_plus)[0]
    for chunk_nodes in (write_chakra.CHUNK_NODES, 7):
        write_chakra.write_chakra_trace(et_plus, tmp_path / f"odd{chunk_nodes}.et", chunk_nodes=chunk_nodes)
        assert (tmp_path / f"odd{chunk_nodes}.et").read_bytes() == expected


class _SlowRecorder:
    """A stream that takes its time over each write and copies the bytes only then, so a buffer
    handed back (and filled again) before its write ended would show in what it recorded."""

    def __init__(self, pause: float, fail_at: int | None = None):
        self.pause, self.fail_at = pause, fail_at
        self.chunks: list[bytes] = []

    def write(self, data) -> int:
        if self.fail_at is not None and len(self.chunks) == self.fail_at:
            raise OSError(28, "No space left on device")
        time.sleep(self.pause)
        self.chunks.append(bytes(data))
        return len(data)


def test_background_writer_reuses_a_buffer_only_once_written():
    """``buffer()`` / ``write_buffer``: the slices are written in order, whole, from at most
    ``depth + 1`` buffers, and no buffer is given back while the thread still writes it."""
    depth, stream = 2, _SlowRecorder(pause=0.002)
    writer = BackgroundWriter(stream, depth=depth)
    expected, seen = [], set()
    for k in range(40):
        buffer = writer.buffer()
        seen.add(id(buffer))
        buffer[:] = bytes([k]) * (100 + 37 * k)  # resized each time: the thread must have let go
        writer.write_buffer(buffer, k % 3, len(buffer) - 1)
        expected.append(bytes(buffer[k % 3:len(buffer) - 1]))
        writer.write(b"|")
        expected.append(b"|")
    writer.close()
    assert stream.chunks == expected
    assert 2 <= len(seen) <= depth + 1  # 40 slices from a few buffers, filled again and again


def test_background_writer_error_reaches_a_caller_filling_buffers():
    """A write that fails is raised by a later ``write_buffer`` (or ``close``), and the caller
    waiting for a buffer is never left waiting."""
    stream = _SlowRecorder(pause=0, fail_at=3)
    writer = BackgroundWriter(stream, depth=1)
    outcome: list[BaseException] = []

    def fill() -> None:
        try:
            for _ in range(100):
                buffer = writer.buffer()
                buffer[:] = b"x" * 1000
                writer.write_buffer(buffer, 0, 1000)
            writer.close()
        except OSError as err:
            outcome.append(err)

    thread = threading.Thread(target=fill, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the caller was left waiting for a buffer"
    assert len(outcome) == 1 and outcome[0].errno == 28
    assert len(stream.chunks) == 3
    with pytest.raises(OSError):  # as the writers' ``finally`` does: the thread ends (no thread left
        writer.close()  # behind, which would keep later pairs in this process from forking)
    assert threading.active_count() == 1


def test_an_unknown_node_key_is_written_back_last(tmp_path):
    """A node key the reader does not know is kept as raw JSON and written after every key the
    linker adds (the simulation fields included), as it was before those became base classes."""
    import gzip
    import json

    et_path, kineto_path = fixture_pair("cpu", "threads")
    opener = gzip.open if str(et_path).endswith(".gz") else open
    with opener(et_path, "rt") as f:
        doc = json.load(f)
    for node in doc["nodes"]:
        node["zz_note"] = {"kept": node["id"]}
    with_extra = tmp_path / "et_extra.json"
    with_extra.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    from linker.pipeline import link_pair

    link_pair(with_extra, kineto_path, out)
    nodes = [n for n in json.loads(out.read_bytes())["nodes"] if "zz_note" in n]
    assert len(nodes) == len(doc["nodes"])
    assert all(list(n)[-1] == "zz_note" and n["zz_note"] == {"kept": n["id"]} for n in nodes)
    assert sum("data_deps" in n for n in nodes) > len(nodes) // 2  # the linker's fields came before it

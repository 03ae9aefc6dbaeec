"""The speed paths of the writers give the same bytes as the plain ones.

- ``.et``: a large trace's node messages are encoded by two processes (the tail of the write order
  in a forked child); forced here on small pairs, the file and the summary must equal the
  one-process write, also when the child fails (the parent then encodes the tail itself).
- ET+ JSON: written in pieces by a writer thread; it must equal one ``msgspec`` encode of the
  whole document.
"""

from __future__ import annotations

import msgspec
import pytest

from conftest import dlrm_pair, fixture_pair
from linker import write_chakra
from linker.chakra_io import read_et
from linker.et_reader import read_execution_trace
from linker.etplus import build_et_plus
from linker.kineto_reader import read_kineto_trace
from linker.link import link
from linker.write_json import NODES_PER_PIECE, write_et_plus_json


def _et_plus(et_path, kineto_path):
    return build_et_plus(link(read_execution_trace(et_path), read_kineto_trace(kineto_path)))


PAIRS = [lambda: fixture_pair("cpu", "threads"), lambda: fixture_pair("gpu", "gpu_v111"), lambda: dlrm_pair(3)]


@pytest.mark.parametrize("pair", PAIRS, ids=["cpu-threads", "gpu-v111", "dlrm-rank3"])
def test_two_process_et_write_equals_one_process(pair, tmp_path, monkeypatch):
    et_plus = _et_plus(*pair())
    serial = write_chakra.write_chakra_trace(et_plus, tmp_path / "serial.et")
    monkeypatch.setattr(write_chakra, "PARALLEL_MIN_NODES", 2)
    split = write_chakra.write_chakra_trace(et_plus, tmp_path / "split.et")
    assert (tmp_path / "split.et").read_bytes() == (tmp_path / "serial.et").read_bytes()
    assert split.nodes == serial.nodes == len(list(read_et(tmp_path / "split.et"))) - 1
    assert split.counts_by_type == serial.counts_by_type
    assert split.comm_unresolved == serial.comm_unresolved

    monkeypatch.setattr(write_chakra._HalfInChild, "collect", lambda self: None)  # as if the child failed
    write_chakra.write_chakra_trace(et_plus, tmp_path / "fallback.et")
    assert (tmp_path / "fallback.et").read_bytes() == (tmp_path / "serial.et").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fallback.et", "serial.et", "split.et"]


def test_json_in_pieces_equals_one_encode(tmp_path):
    et_plus = _et_plus(*dlrm_pair(0))
    import linker.write_json as write_json

    for per_piece in (NODES_PER_PIECE, 7, 1):
        write_json.NODES_PER_PIECE = per_piece
        try:
            write_et_plus_json(et_plus, tmp_path / f"pieces{per_piece}.json")
        finally:
            write_json.NODES_PER_PIECE = NODES_PER_PIECE
        doc = et_plus.et.header
        original = doc.nodes
        doc.nodes = et_plus.all_nodes()
        try:
            whole = msgspec.json.encode(doc)
        finally:
            doc.nodes = original
        assert (tmp_path / f"pieces{per_piece}.json").read_bytes() == whole
    assert et_plus.gpu_nodes, "the pair must have GPU nodes, so the pieces cross from ET to GPU nodes"

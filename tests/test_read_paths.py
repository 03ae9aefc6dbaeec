"""Reading fast paths give what the general paths give: the ET columns read by position (against the
attribute-by-name reading), gzip inflated in slices (against ``gzip.decompress``), and the Kineto
trace read in a forked child (against the serial read)."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest

from conftest import FIXTURES, SHARED_TRACES
from linker import et_reader
from linker.errors import TraceInputError
from linker.et_reader import read_execution_trace
from linker.fileio import read_trace_bytes

COLUMNS = ("ids", "names", "parent", "tid", "rf_id", "scope", "op_schema")


def real_ets() -> list[Path]:
    paths = sorted(FIXTURES.glob("*/*/et.json.gz"))
    if SHARED_TRACES.exists():
        paths += sorted(p for p in SHARED_TRACES.glob("*/*.json.gz") if "kineto" not in p.name
                        and p.parent.name != "kineto_only" and p.stat().st_size < 40 << 20)
    return paths


def columns(et) -> dict:
    return {name: getattr(et, name) for name in COLUMNS}


def general_columns(path, monkeypatch) -> dict:
    with monkeypatch.context() as m:
        m.setattr(et_reader, "_positional_decoder", lambda nodes: None)
        return columns(read_execution_trace(path))


@pytest.mark.parametrize("path", real_ets(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_et_columns_by_position_are_those_by_name(path, monkeypatch):
    try:
        expected = general_columns(path, monkeypatch)
    except TraceInputError:
        pytest.skip("not an ET")
    assert columns(read_execution_trace(path)) == expected


def odd_attrs_et(tmp_path: Path) -> Path:
    """A nested ET whose nodes mostly share one attribute layout, and some do not."""
    doc = json.loads(gzip.decompress((FIXTURES / "cpu" / "dataloader" / "et.json.gz").read_bytes()))
    nodes = doc["nodes"]
    assert len(nodes) > 40 and all(isinstance(n.get("attrs"), list) for n in nodes)
    nodes[5]["attrs"] = list(reversed(nodes[5]["attrs"]))  # another order
    nodes[9]["attrs"].append({"name": "tid", "type": "uint64", "value": 99})  # a duplicate, last
    nodes[12]["attrs"].insert(0, {"name": "tid", "type": "uint64", "value": 98})  # a duplicate, first
    del nodes[15]["attrs"]  # none at all
    tid = next(a for a in nodes[18]["attrs"] if a["name"] == "tid")
    tid["value"] = "17"  # a string where an int is expected
    rf = next(a for a in nodes[21]["attrs"] if a["name"] == "rf_id")
    del rf["value"]  # no value
    schema = next(a for a in nodes[24]["attrs"] if a["name"] == "op_schema")
    schema["value"] = None
    nodes[27]["attrs"] = nodes[27]["attrs"][:3]  # shorter
    other = next(a for a in nodes[30]["attrs"] if a["name"] not in ("tid", "rf_id", "scope", "op_schema"))
    other["name"] = "something_else"  # another name where the layout has one not in the columns
    path = tmp_path / "odd_attrs.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("block", [4, 7, 16384])
def test_et_columns_by_position_when_some_nodes_are_laid_out_otherwise(tmp_path, monkeypatch, block):
    monkeypatch.setattr(et_reader, "_NODES_PER_BLOCK", block)
    path = odd_attrs_et(tmp_path)
    expected = general_columns(path, monkeypatch)
    assert expected["tid"][18] == 17 and expected["op_schema"][24] == ""
    assert expected["tid"][9] != 99 and expected["tid"][12] != 98  # at the layout's place, else the last
    assert columns(read_execution_trace(path)) == expected


def test_et_whose_first_node_lacks_a_column_attribute_reads_by_name(tmp_path, monkeypatch):
    doc = json.loads(gzip.decompress((FIXTURES / "cpu" / "dataloader" / "et.json.gz").read_bytes()))
    doc["nodes"][0]["attrs"] = [a for a in doc["nodes"][0]["attrs"] if a["name"] != "scope"]
    path = tmp_path / "first_without_scope.json"
    path.write_text(json.dumps(doc))
    assert et_reader._positional_decoder(read_execution_trace(path).nodes) is None
    assert columns(read_execution_trace(path)) == general_columns(path, monkeypatch)


# --------------------------------------------------------------------------- gzip


def gz(data: bytes, level: int = 6) -> bytes:
    return gzip.compress(data, compresslevel=level, mtime=0)


def text(size: int) -> bytes:
    return b"".join(b'{"id": %d, "name": "aten::op_%d"},\n' % (i, i % 97) for i in range(size))


@pytest.mark.parametrize("make", [
    lambda: gz(text(200_000)),  # many slices of input, many pieces of output
    lambda: gz(b"\x00" * (40 << 20), 9),  # a high ratio: one slice inflates to many pieces
    lambda: gz(text(1000)) + gz(text(3000)),  # two members
    lambda: gz(text(50_000)) + gz(b"[]"),  # two members, the trailer's size is the last's
    lambda: gz(text(1000)) + b"\x00" * 300,  # zeros after the member (padding)
    lambda: gz(text(1000), 0),  # stored blocks
])
def test_gunzip_in_slices_gives_what_gzip_gives(tmp_path, make):
    data = make()
    path = tmp_path / "t.json.gz"
    path.write_bytes(data)
    assert bytes(read_trace_bytes(path)) == gzip.decompress(data)


def test_truncated_and_corrupt_gzip_are_named(tmp_path):
    data = gz(text(100_000))
    path = tmp_path / "t.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceInputError, match="truncated"):
        read_trace_bytes(path)
    broken = bytearray(data)
    broken[len(data) // 3: len(data) // 3 + 64] = b"\xff" * 64
    path.write_bytes(bytes(broken))
    with pytest.raises(TraceInputError, match="corrupt|truncated"):
        read_trace_bytes(path)
    assert zlib  # the error is zlib's, reported against the file

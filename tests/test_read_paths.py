"""Reading fast paths give what the general paths give: the ET columns read by position (against the
attribute-by-name reading), gzip inflated in slices (against ``gzip.decompress``), the Kineto trace
read and checked in a forked child (against the serial read and check, errors included), and
``forked`` payloads of any size."""

from __future__ import annotations

import dataclasses

import gzip
import json
import math
import mmap
import os
import zlib
from array import array
from pathlib import Path

import msgspec
import pytest

from conftest import FIXTURES, SHARED_TRACES, fixture_pair
from linker import pipeline
from linker.read import et as et_reader
from linker.read import files as fileio
from linker.schedule import fork as forked
from linker.model.output import Output
from linker.schedule import Schedule, kineto_child
from linker.link.durations import nest_cpu_events
from linker.model.errors import TraceInputError
from linker.read.et import read_execution_trace
from linker.read.files import read_trace_bytes
from linker.read.kineto import NO_ARGS, FlowEnd, KinetoArgs, KinetoEvent, KinetoTrace, read_kineto_trace
from linker.read.sanity import check_kineto_trace

COLUMNS = ("ids", "names", "parent", "tid", "rf_id", "scope", "op_schema")


def real_ets() -> list[Path]:
    paths = sorted(FIXTURES.glob("*/*/et.json.gz"))
    if SHARED_TRACES.exists():
        paths += sorted(p for p in SHARED_TRACES.glob("*/*.json.gz") if "kineto" not in p.name
                        and p.parent.name != "kineto_only" and p.stat().st_size < 40 << 20)
    return paths


def columns(et) -> dict:
    return {name: getattr(et, name) for name in COLUMNS}


def general_columns(path, nodes_per_block: int = et_reader.NODES_PER_BLOCK) -> dict:
    """The columns as the general path reads them: every node's ``attrs`` by name."""
    return columns(read_execution_trace(path, nodes_per_block=nodes_per_block, attrs_by_position=False))


@pytest.mark.parametrize("path", real_ets(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_et_columns_by_position_are_those_by_name(path):
    try:
        expected = general_columns(path)
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
def test_et_columns_by_position_when_some_nodes_are_laid_out_otherwise(tmp_path, block):
    path = odd_attrs_et(tmp_path)
    expected = general_columns(path, block)
    assert expected["tid"][18] == 17 and expected["op_schema"][24] == ""
    assert expected["tid"][9] != 99 and expected["tid"][12] != 98  # at the layout's place, else the last
    assert columns(read_execution_trace(path, nodes_per_block=block)) == expected


def plain_op_schema(doc: dict) -> list[str]:
    """Each node's ``op_schema`` as plain JSON has it: the flat key, or the attrs entry ("" if none)."""
    if doc["nodes"] and "attrs" not in doc["nodes"][0] and "parent" in doc["nodes"][0]:
        return [node.get("op_schema") or "" for node in doc["nodes"]]
    return [str(next((a.get("value") for a in node.get("attrs", []) if a["name"] == "op_schema"), "") or "")
            for node in doc["nodes"]]


@pytest.mark.parametrize("path", real_ets()[:6], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_et_op_schema_is_read_on_first_use(path):
    """The linker never reads ``op_schema``: the column is decoded when first asked for, and then
    holds what the file says."""
    try:
        et = read_execution_trace(path)
    except TraceInputError:
        pytest.skip("not an ET")
    doc = json.loads(read_trace_bytes(path))
    if et.layout == et_reader.NESTED:
        assert et._op_schema is None
    assert et.op_schema == plain_op_schema(doc) and et.op_schema is et.op_schema
    assert any(et.op_schema)


def test_et_attrs_after_the_last_column_attribute_are_not_decoded(tmp_path):
    """The positional layout stops at the last column attribute: what follows it in a node's list
    is skipped (kept raw, written back as read), even an entry the by-name path could not read."""
    doc = json.loads(gzip.decompress((FIXTURES / "cpu" / "dataloader" / "et.json.gz").read_bytes()))
    expected = columns(read_execution_trace(FIXTURES / "cpu" / "dataloader" / "et.json.gz"))
    assert len(doc["nodes"]) > et_reader._LAYOUT_SAMPLE  # a node after those the layout is learned from
    doc["nodes"][-1]["attrs"][-1] = {"not": "an attribute"}
    path = tmp_path / "odd_tail.json"
    path.write_text(json.dumps(doc))
    et = read_execution_trace(path)
    assert {name: getattr(et, name) for name in COLUMNS if name != "op_schema"} == \
        {name: value for name, value in expected.items() if name != "op_schema"}
    assert json.loads(bytes(et.nodes[-1].attrs))[-1] == {"not": "an attribute"}


def test_et_whose_first_node_lacks_a_column_attribute_reads_by_name(tmp_path):
    doc = json.loads(gzip.decompress((FIXTURES / "cpu" / "dataloader" / "et.json.gz").read_bytes()))
    doc["nodes"][0]["attrs"] = [a for a in doc["nodes"][0]["attrs"] if a["name"] != "scope"]
    path = tmp_path / "first_without_scope.json"
    path.write_text(json.dumps(doc))
    assert et_reader._positional_decoder(read_execution_trace(path).nodes) is None
    assert columns(read_execution_trace(path)) == general_columns(path)


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
@pytest.mark.parametrize("into", [False, True], ids=["own buffer", "given buffer"])
def test_gunzip_gives_what_gzip_gives(tmp_path, make, inflater, into):
    """Each inflater (ISA-L's, zlib's), into a buffer of its own or into the fixed one
    ``inflate_into`` gives (a mapping, as ``chakra_ahead``'s shared text: in slices, the text copied
    out into a private buffer when it is short)."""
    data = make()
    path = tmp_path / "t.json.gz"
    path.write_bytes(data)
    given = []
    read = read_trace_bytes(path, (lambda size: given.append(mmap.mmap(-1, size)) or given[-1]) if into else None)
    assert bytes(read) == gzip.decompress(data)
    plausible = fileio.plausible_gzip_size(len(data), int.from_bytes(data[-4:], "little"))
    assert len(given) == (into and plausible)  # asked only for a size the trailer can be right about


def test_a_large_file_is_mapped_and_reads_as_its_bytes(tmp_path):
    """A file of ``MAP_AT_LEAST`` bytes or more is mapped, not copied: the mapping holds the
    file's bytes (a gzip one inflates from it); a smaller one is read."""
    large, small = text(60_000), text(100)
    assert len(large) >= fileio.MAP_AT_LEAST > len(small)
    for data in (large, small):
        path = tmp_path / "t.json"
        path.write_bytes(data)
        read = read_trace_bytes(path)
        assert isinstance(read, mmap.mmap) == (data is large)
        assert bytes(read) == data
    noise = os.urandom(2 * fileio.MAP_AT_LEAST)  # incompressible: the gzip file is mapped too
    path = tmp_path / "t.json.gz"
    path.write_bytes(gz(noise))
    assert bytes(read_trace_bytes(path)) == noise


def test_what_cannot_be_mapped_is_read(tmp_path):
    """A pipe has no mapping: its bytes are read as they come."""
    import threading

    data = text(60_000)
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    writer = threading.Thread(target=path.write_bytes, args=(data,), daemon=True)  # blocks until read
    writer.start()
    try:
        assert bytes(read_trace_bytes(path)) == data
    finally:
        writer.join(timeout=10)


@pytest.fixture(params=["isal", "zlib"])
def inflater(request, monkeypatch):
    if request.param == "isal":
        assert fileio.inflating is pytest.importorskip("isal.isal_zlib")
    else:
        monkeypatch.setattr(fileio, "inflating", zlib)
    return request.param


def test_truncated_and_corrupt_gzip_are_named(tmp_path, inflater):
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
    path.write_bytes(data + b"not gzip")  # something after the member
    with pytest.raises(TraceInputError, match="corrupt"):
        read_trace_bytes(path)


# --------------------------------------------------------------------------- Kineto in a child


def real_pairs() -> list[tuple[Path, Path]]:
    pairs = [(d / "et.json.gz", d / "kineto.json.gz") for d in sorted(FIXTURES.glob("*/*"))
             if (d / "kineto.json.gz").exists() and (d / "et.json.gz").exists()]
    if (SHARED_TRACES / "param_dlrm").exists():
        pairs += [(SHARED_TRACES / "param_dlrm" / f"rank{r}.et.json.gz",
                   SHARED_TRACES / "param_dlrm" / f"rank{r}.kineto.json.gz") for r in (0, 1)]
    return pairs


def kineto_only_traces() -> list[Path]:
    return sorted((SHARED_TRACES / "kineto_only").glob("*.json.gz")) if SHARED_TRACES.exists() else []


needs_fork = pytest.mark.skipif(not forked.can_fork(), reason="no os.fork here")
SERIAL, FORCED = Schedule.serial(), Schedule.forced()


def read_both(et_path, kineto_path) -> tuple:
    """``read_inputs`` of the pair under the serial schedule, then under the forced one (the
    Kineto trace read, checked and nested by a child, the ET's tree order made meanwhile)."""
    return pipeline.read_inputs(et_path, kineto_path, SERIAL), pipeline.read_inputs(et_path, kineto_path, FORCED)


def child_of(fn) -> forked.ForkedCall:
    """A Kineto child running ``fn`` (as ``kineto_child.start`` makes one)."""
    return forked.ForkedCall(fn)


@needs_fork
@pytest.mark.parametrize("pair", real_pairs(), ids=lambda p: f"{p[0].parent.name}/{p[0].name}")
def test_kineto_read_under_any_schedule_is_the_serial_read(pair):
    et_path, kineto_path = pair
    serial, forced = read_both(et_path, kineto_path)
    assert forced.kineto == serial.kineto and forced.warnings == serial.warnings
    assert columns(forced.et) == columns(serial.et)
    assert [bytes(e.args.input_dims) for e in forced.kineto.cpu_events] == [
        bytes(e.args.input_dims) for e in serial.kineto.cpu_events]
    # What was made beside the read, when it was, is what the link and the plan would make.
    assert serial.nesting is None
    nesting = nest_cpu_events(serial.kineto.cpu_events)
    if forced.nesting is not None:  # made beside the read, with the durations rounded as the ET+ writes them
        assert forced.nesting.rounded == [round(x, 3) for x in nesting.exclusive]
        assert dataclasses.replace(forced.nesting, rounded=None) == nesting


@needs_fork
@pytest.mark.parametrize("pair", real_pairs()[:4], ids=lambda p: f"{p[0].parent.name}/{p[0].name}")
def test_the_kineto_child_hands_over_the_checked_trace_and_its_nesting(pair):
    _, kineto_path = pair
    serial = read_kineto_trace(kineto_path)
    warnings = check_kineto_trace(serial)
    child = kineto_child.start(kineto_path)
    checked = kineto_child.finish(child)
    assert checked is not None and checked.trace == serial and checked.warnings == warnings
    nesting = nest_cpu_events(serial.cpu_events)
    assert dataclasses.replace(checked.nesting, rounded=None) == nesting
    assert checked.nesting.rounded == [round(x, 3) for x in nesting.exclusive]
    child.cancel()


@needs_fork
@pytest.mark.parametrize("path", kineto_only_traces(), ids=lambda p: p.name)
def test_kineto_only_traces_through_the_wire_are_the_serial_read(path):
    serial = read_kineto_trace(path)
    warnings = check_kineto_trace(serial)
    child = kineto_child.start(path)
    checked = kineto_child.finish(child)
    assert checked is not None and (checked.trace, checked.warnings) == (serial, warnings)
    child.cancel()


def odd_events() -> list[KinetoEvent]:
    return [
        KinetoEvent(ph="X", cat="cpu_op", name="a", ts=float("nan"), dur=float("inf")),
        KinetoEvent(ph="X", name="b", pid="host", tid=7, args=KinetoArgs(
            external_id=3, stream_value="0x1f", input_dims=msgspec.Raw(b'[[8, 16], [], "x"]'))),
        KinetoEvent(args=KinetoArgs(input_dims=msgspec.Raw(b"null"))),  # written, as null
        KinetoEvent(args=KinetoArgs()),
    ]


def test_wire_keeps_odd_values():
    flows = {5: [FlowEnd(1, "x", 2.5)], "s": [FlowEnd("a", 2, -1.0)]}
    trace = KinetoTrace("k.json", 7, 0, 2, odd_events(), [], [], flows, odd_events()[1:])
    back, warnings, _ = kineto_child.from_wire(kineto_child.to_wire(trace, ["w"]))  # (takes dims out in place)
    assert warnings == ["w"]
    expected = odd_events()
    assert [bytes(e.args.input_dims) for e in back.cpu_events] == [bytes(e.args.input_dims) for e in expected]
    assert math.isnan(back.cpu_events[0].ts) and back.cpu_events[0].dur == float("inf")
    assert back.cpu_events[1:] == expected[1:] and back.python_events == expected[1:]
    assert back.flows == flows and list(back.flows) == [5, "s"]
    assert (back.path, back.pid, back.rank, back.world_size) == ("k.json", 7, 0, 2)


def test_nesting_through_the_wire_is_bit_for_bit():
    events = odd_events()[:1] + [KinetoEvent(ph="X", cat="cpu_op", name=n, ts=t, dur=d) for n, t, d in
                                 (("p", 10.0, 5.0), ("c", 11.0, 7.5), ("z", 12.0, 0.0), ("q", 0.1 + 0.2, -0.0))]
    nesting = nest_cpu_events(events)
    got = kineto_child.nesting_from_wire(len(events), memoryview(kineto_child.nesting_to_wire(nesting)))
    assert got.parents == nesting.parents
    for column in ("exclusive", "end"):
        assert array("d", getattr(got, column)).tobytes() == array("d", getattr(nesting, column)).tobytes()
    # The rounded column comes along, rounded as the ET+ writes a duration (3 decimals).
    assert got.rounded == [round(x, 3) for x in nesting.exclusive]
    with pytest.raises(ValueError):  # not for these events
        kineto_child.nesting_from_wire(len(events), kineto_child.nesting_to_wire(nest_cpu_events(events[:-1])))


def repaired_pair(tmp_path) -> tuple[Path, Path]:
    """The threads pair with a node whose parent is missing: the ET check re-attaches it."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    document = json.loads(gzip.decompress(et_path.read_bytes()))
    document["nodes"][5]["ctrl_deps"] = 987654321
    et_path = tmp_path / "et.json"
    et_path.write_text(json.dumps(document))
    return et_path, kineto_path


@needs_fork
@pytest.mark.parametrize("case", [("cpu", "threads"), ("gpu", "gpu_v111"), ("cpu", "repaired")],
                         ids=lambda c: "/".join(c))
def test_the_ets_own_work_beside_the_kineto_child_gives_the_serial_answers(tmp_path, case):
    """The ET's input check while a Kineto child works: the same warnings and the same ET+."""
    et_path, kineto_path = repaired_pair(tmp_path) if case[1] == "repaired" else fixture_pair(*case)
    serial, forced = read_both(et_path, kineto_path)
    assert case[1] != "repaired" or "re-attached" in " ".join(serial.warnings)
    assert forced.kineto == serial.kineto and forced.warnings == serial.warnings
    assert columns(forced.et) == columns(serial.et)
    pipeline.link_pair(et_path, kineto_path, tmp_path / "forced.et", schedule=FORCED)
    pipeline.link_pair(et_path, kineto_path, tmp_path / "serial.et", schedule=SERIAL)
    assert (tmp_path / "forced.et").read_bytes() == (tmp_path / "serial.et").read_bytes()


def refused_et_and_kineto_files(tmp_path) -> tuple[Path, list[Path]]:
    """The threads pair's ET with an id out of range, and its intact Kineto file and a cut one."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    document = json.loads(gzip.decompress(et_path.read_bytes()))
    document["nodes"][3]["id"] = -5
    bad_et = tmp_path / "et.json"
    bad_et.write_text(json.dumps(document))
    cut_kineto = tmp_path / "kineto.json.gz"
    cut_kineto.write_bytes(kineto_path.read_bytes()[:-100])
    return bad_et, [kineto_path, cut_kineto]


def read_error(et_path, kineto_path, schedule) -> str:
    with pytest.raises(TraceInputError) as err:
        pipeline.read_pair(et_path, kineto_path, schedule)
    return str(err.value)


def test_a_refused_et_is_named_after_a_bad_kineto_file_under_any_schedule(tmp_path, schedule):
    """A refused ET: its refusal comes after the Kineto file is read, so a bad Kineto file is
    still the one named (as when reading the two one after the other)."""
    bad_et, kineto_files = refused_et_and_kineto_files(tmp_path)
    intact, cut = (read_error(bad_et, kineto, schedule) for kineto in kineto_files)
    assert "out of range" in intact and str(bad_et) in intact
    assert str(kineto_files[1]) in cut and "out of range" not in cut


@needs_fork
@pytest.mark.parametrize("nested", [False, True], ids=["no nesting", "nesting"])
def test_a_child_that_fails_after_sending_the_trace_leaves_the_rest_to_the_parent(nested):
    """Without the nesting the link nests the events; without the CPU events they are read from
    the file, as the serial schedule reads them."""
    _, kineto_path = fixture_pair("gpu", "gpu_v111")
    serial = read_kineto_trace(kineto_path)

    def trace_then_fail():
        trace = read_kineto_trace(kineto_path, own_dims=False)
        yield from kineto_child.trace_to_wire(trace, check_kineto_trace(trace))
        if nested:
            yield kineto_child.nesting_to_wire(nest_cpu_events(trace.cpu_events))
        raise RuntimeError("cut short")

    child = child_of(trace_then_fail)
    checked = kineto_child.finish(child)
    assert checked.trace == serial  # the CPU events read again, from the file
    got = checked.nesting and dataclasses.replace(checked.nesting, rounded=None)  # the rounding: tested above
    assert got == (nest_cpu_events(serial.cpu_events) if nested else None)
    child.cancel()


@needs_fork
@pytest.mark.parametrize("sent", [0, 1, 3], ids=lambda k: f"{k} parts sent")
def test_a_child_that_fails_before_the_whole_trace_is_sent_leaves_the_read_to_the_parent(sent):
    _, kineto_path = fixture_pair("gpu", "gpu_v111")

    def some_parts_then_fail():
        trace = read_kineto_trace(kineto_path, own_dims=False)
        parts = kineto_child.to_wire(trace, check_kineto_trace(trace), chunk_events=100)
        for _ in range(sent):
            yield next(parts)
        raise RuntimeError("cut short")

    assert kineto_child.finish(child_of(some_parts_then_fail)) is None


@needs_fork
def test_the_trace_comes_in_many_parts():
    """Chunks of a few events: every list split, its parts in order, each chunk's dims its own."""
    _, kineto_path = fixture_pair("gpu", "gpu_v111")
    serial = read_kineto_trace(kineto_path)
    trace = read_kineto_trace(kineto_path, own_dims=False)
    parts = list(kineto_child.to_wire(trace, ["w"], chunk_events=7))
    sizes = [len(events) for events in kineto_child._lists(serial)]
    # the CPU events' columns first, their events last
    assert min(sizes[:3]) > 7 and len(parts) == 1 + -(-sizes[0] // 7) + sum(-(-size // 7) for size in sizes)
    back, warnings, _ = kineto_child.from_wire(iter(parts))
    assert back == serial and warnings == ["w"]
    assert [bytes(e.args.input_dims) for e in back.cpu_events] == [bytes(e.args.input_dims) for e in serial.cpu_events]

    def in_small_parts():
        trace = read_kineto_trace(kineto_path, own_dims=False)
        yield from kineto_child.trace_to_wire(trace, check_kineto_trace(trace), chunk_events=7)
        yield kineto_child.nesting_to_wire(nest_cpu_events(trace.cpu_events))
        yield from kineto_child.cpu_events_to_wire(trace, chunk_events=7)

    child = child_of(in_small_parts)
    checked = kineto_child.finish(child)
    assert checked.trace == serial
    assert dataclasses.replace(checked.nesting, rounded=None) == nest_cpu_events(serial.cpu_events)
    child.cancel()


def test_setting_cpu_events_sets_their_columns():
    events = [KinetoEvent(ph="X", cat="cpu_op", name="a", ts=1.0, dur=4.0),
              KinetoEvent(ph="X", cat="cpu_op", name="b", ts=2.0, dur=1.0, args=KinetoArgs(rf_id=9))]
    trace = KinetoTrace("k.json", 1, None, None, events, [], [])
    assert trace.cpu_columns().name == ["a", "b"] and trace.cpu_columns().rf_id == [None, 9]
    trace.cpu_events = events[1:]
    assert trace.cpu_columns().ts == [2.0] and trace.cpu_count() == 1 and trace.has_record_function_ids()


def test_wire_puts_each_lists_dims_back_in_its_own_events():
    def events(tag: str) -> list[KinetoEvent]:
        return [KinetoEvent(name=f"{tag}{i}", args=KinetoArgs(external_id=i, input_dims=msgspec.Raw(
            f'[[{i}], "{tag}"]'.encode()))) if i % 2 else KinetoEvent(name=f"{tag}{i}") for i in range(5)]

    lists = [events(tag) for tag in "crgp"]
    trace = KinetoTrace("k.json", 1, None, None, *lists[:3], {}, lists[3])
    back, _, _ = kineto_child.from_wire(kineto_child.to_wire(trace, []))
    for got, tag in zip((back.cpu_events, back.runtime_events, back.gpu_events, back.python_events), "crgp"):
        assert got == events(tag)
        assert [bytes(e.args.input_dims) for e in got] == [bytes(e.args.input_dims) for e in events(tag)]
        assert all(e.args.input_dims is NO_ARGS.input_dims for e in got[::2])  # no dims: the default


@pytest.mark.parametrize("content", [b"{}", b'{"traceEvents": [', b'{"nodes": []}', b"\xff\xfe"])
def test_bad_kineto_file_fails_as_in_the_serial_read(tmp_path, content):
    et_path, _ = fixture_pair("cpu", "dataloader")
    bad = tmp_path / "kineto.json"
    bad.write_bytes(content)
    assert read_error(et_path, bad, FORCED) == read_error(et_path, bad, SERIAL)


@needs_fork
def test_bad_et_fails_first_and_the_child_is_reaped(tmp_path, monkeypatch):
    _, kineto_path = fixture_pair("cpu", "dataloader")
    bad = tmp_path / "et.json"
    bad.write_bytes(b'{"nodes": 3}')
    started = []

    class Spied(Schedule):
        def kineto_reader(self, path):
            started.append(super().kineto_reader(path))
            return started[-1]

    with pytest.raises(TraceInputError, match="et.json"):
        pipeline.read_pair(bad, kineto_path, Spied(**vars(FORCED)))
    assert started and started[0] is not None and started[0]._pid == 0  # cancelled and reaped


def odd_pair(tmp_path: Path, bad_times: str, et_case: str) -> tuple[Path, Path]:
    """The dataloader pair with some Kineto times unusable and maybe an ET parent to repair."""
    et_path, kineto_path = fixture_pair("cpu", "dataloader")
    doc = json.loads(gzip.decompress(kineto_path.read_bytes()))
    complete = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    victims = complete if bad_times == "all" else complete[3:9:2] if bad_times == "some" else []
    for e in victims:
        e["ts"] = -1
    kineto = tmp_path / "kineto.json"
    kineto.write_text(json.dumps(doc))
    if et_case == "fine":
        return et_path, kineto
    et_doc = json.loads(gzip.decompress(et_path.read_bytes()))
    node = et_doc["nodes"][10]
    node["ctrl_deps"] = node["id"] if et_case == "self_parent" else -5  # -5: an id out of range
    if et_case == "bad_id":
        node["id"] = -5
    et = tmp_path / "et.json"
    et.write_text(json.dumps(et_doc))
    return et, kineto


def read_or_error(et_path, kineto_path, schedule):
    try:
        return pipeline.read_pair(et_path, kineto_path, schedule)
    except TraceInputError as err:
        return str(err)


@pytest.mark.parametrize("bad_times", ["none", "some", "all"])
@pytest.mark.parametrize("et_case", ["fine", "self_parent", "bad_id"])
def test_checks_give_the_serial_warnings_and_errors_under_any_schedule(tmp_path, bad_times, et_case):
    et_path, kineto_path = odd_pair(tmp_path, bad_times, et_case)
    expected = read_or_error(et_path, kineto_path, SERIAL)
    got = read_or_error(et_path, kineto_path, FORCED)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert got[1:] == expected[1:] and columns(got[0]) == columns(expected[0])
    if (bad_times, et_case) == ("some", "self_parent"):
        assert len(expected[2]) == 2  # one warning from each check, the ET's first


# --------------------------------------------------------------------------- forked: the payload


@needs_fork
@pytest.mark.parametrize("size", [0, 1, 1 << 20, 3 * (1 << 20) + 12345])
def test_forked_payload_of_any_size_comes_back_whole(size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    back = forked.ForkedCall(lambda: payload).result()
    assert back is not None and bytes(back) == payload


@needs_fork
def test_forked_child_that_cannot_send_its_result_gives_none():
    assert forked.ForkedCall(lambda: "not bytes").result() is None
    assert forked.ForkedCall(lambda: os._exit(0)).result() is None  # exits before sending anything


@pytest.mark.parametrize("case", ["first_longer", "first_without_attrs", "roots_shorter", "first_two_differ"])
@pytest.mark.parametrize("block", [3, 16384])
def test_et_columns_by_position_when_the_first_nodes_differ(tmp_path, case, block):
    doc = json.loads(gzip.decompress((FIXTURES / "cpu" / "dataloader" / "et.json.gz").read_bytes()))
    nodes = doc["nodes"]
    extra = {"name": "extra", "type": "string", "value": "x"}
    if case == "first_longer":
        nodes[0]["attrs"].append(extra)
    elif case == "first_without_attrs":
        del nodes[0]["attrs"]
    elif case == "roots_shorter":
        for node in nodes[:2]:
            node["attrs"] = node["attrs"][:7]
    else:  # node 0 lacks tid, node 1 holds it elsewhere
        nodes[0]["attrs"] = [a for a in nodes[0]["attrs"] if a["name"] != "tid"]
        tid = next(a for a in nodes[1]["attrs"] if a["name"] == "tid")
        nodes[1]["attrs"] = [a for a in nodes[1]["attrs"] if a is not tid] + [tid]
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(doc))
    expected = general_columns(path, block)
    et = read_execution_trace(path, nodes_per_block=block)
    assert columns(et) == expected
    if case != "first_two_differ" and block > 3:
        assert et_reader._positional_decoder(et.nodes) is not None


@pytest.mark.parametrize("block", [4, 16384])
def test_et_attrs_that_cannot_be_read_by_name_fail_as_by_name(tmp_path, block):
    doc = json.loads(gzip.decompress((FIXTURES / "cpu" / "dataloader" / "et.json.gz").read_bytes()))
    del doc["nodes"][30]["attrs"][2]["name"]  # an entry without a name, inside the layout
    path = tmp_path / "nameless.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceInputError) as by_name:
        read_execution_trace(path, nodes_per_block=block, attrs_by_position=False)
    with pytest.raises(TraceInputError) as by_position:
        read_execution_trace(path, nodes_per_block=block)
    assert str(by_position.value) == str(by_name.value)
    assert "node 51's attrs: Object missing required field `name`" in str(by_name.value)


def test_the_library_and_batch_workers_start_no_child(tmp_path):
    """The library's default schedule (a batch worker's: the ranks already fill the cores) is the
    serial one, which starts no child; a batch rank writes what a forced schedule writes."""
    from linker.batch import RankTask
    from linker.batch.link_rank import run_rank_task
    from linker.link.recipe import LinkOptions

    et_path, kineto_path = fixture_pair("cpu", "mlp_steps")
    assert Schedule.serial() == Schedule() and SERIAL.kineto_reader(kineto_path) is None
    assert SERIAL.fields_encoder(et_path, Output.of("o.et")) is None
    task = RankTask(0, et_path, kineto_path, tmp_path / "batch.json", tmp_path / "batch.report.json",
                    LinkOptions(), 0, 0)
    assert run_rank_task(task).status == "linked"
    pipeline.link_pair(et_path, kineto_path, tmp_path / "single.json", schedule=FORCED)
    assert (tmp_path / "batch.json").read_bytes() == (tmp_path / "single.json").read_bytes()


@needs_fork
def test_a_forced_schedule_starts_its_children_on_any_core_count(tmp_path):
    et_path, kineto_path = fixture_pair("cpu", "mlp_steps")
    child = FORCED.kineto_reader(kineto_path)
    fields = FORCED.fields_encoder(et_path, Output.of(tmp_path / "o.et"))
    try:
        assert child is not None and fields is not None
        assert FORCED.fields_encoder(et_path, Output.of(tmp_path / "o.json")) is None  # JSON: no .et fields
    finally:
        child.cancel()
        fields.cancel()


def test_et_parent_index_marks_missing_and_own_parents(tmp_path):
    """parent_index: the parent's index, -1 for a missing parent and for a node that is its own
    parent (the process root); the same as a plain lookup per node."""
    nodes = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1},
             {"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1},
             {"id": 5, "name": "a", "ctrl_deps": 2}, {"id": 3, "name": "b", "ctrl_deps": 5},
             {"id": 4, "name": "c", "ctrl_deps": 99}, {"id": 6, "name": "d", "ctrl_deps": 6}]
    path = tmp_path / "parents.json"
    path.write_text(json.dumps({"schema": "1.0.2", "nodes": nodes}))
    et = read_execution_trace(path)
    assert et.parent_index() == [-1, 0, 1, 2, -1, -1]
    index = {node["id"]: i for i, node in enumerate(nodes)}
    assert et.parent_index() == [-1 if index.get(n["ctrl_deps"], -1) == i else index.get(n["ctrl_deps"], -1)
                                 for i, n in enumerate(nodes)]

"""validate_file on Chakra protobuf and ET / ET+ JSON files, real and planted."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

import wire_decoder
from linker.write import chakra_wire as chakra_io
from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import EtWriter, TraceFormatError, make_attr
from linker.write.validate import format_result, validate_file
from conftest import shared_reason

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "traces"
REAL_ET = TRACES / "chakra_protobuf" / "chakra.0.et.gz"
PROCESS_ROOT = "[pytorch|profiler|execution_trace|process]"
THREAD_ROOT = "[pytorch|profiler|execution_trace|thread]"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(shared_reason(path))
    return path


def kinds(result) -> set[str]:
    return {v.kind for v in result.violations}


# =============================================================================================
# Real files
# =============================================================================================


def wire_graph_facts(path: Path) -> dict:
    """Independent facts from the wire decoder: ids, missing ctrl/data deps, self ctrl deps."""
    nodes = [wire_decoder.decode_node(f) for f in wire_decoder.read_stream(path)[1:]]
    ids = [n[1][0] for n in nodes]
    known = set(ids)
    return {
        "ids": ids,
        "missing_ctrl": sum(1 for n in nodes for d in n.get(4, []) if d not in known),
        "missing_data": sum(1 for n in nodes for d in n.get(5, []) if d not in known),
        "self_ctrl": [n[1][0] for n in nodes if n[1][0] in n.get(4, [])],
        "types": [n[3][0] for n in nodes],
        "written_later": _written_later(nodes),
    }


def _written_later(nodes: list[dict]) -> int:
    """Dependencies (ctrl and data) naming a node written after the one that has them."""
    position = {}
    for k, node in enumerate(nodes):
        position.setdefault(node[1][0], k)
    return sum(1 for k, node in enumerate(nodes) for dep in node.get(4, []) + node.get(5, [])
               if position.get(dep, -1) > k)


def test_real_chakra_file_counts_and_findings():
    path = need(REAL_ET)
    facts = wire_graph_facts(path)
    result = validate_file(path)
    assert result.file_format == "chakra" and result.schema == "1.0.1"
    assert result.node_count == 3664 == len(facts["ids"])
    assert result.counts_by_type == {"COMP_NODE": 3643, "COMM_COLL_NODE": 21}
    # Ids are unique and every data dependency resolves ...
    assert len(set(facts["ids"])) == len(facts["ids"]) and "duplicate_id" not in kinds(result)
    assert facts["missing_data"] == 0 and "dangling_data_dep" not in kinds(result)
    # ... but this file, written by an old Chakra converter, points ctrl_deps at ops it dropped
    # and at nodes themselves, which ASTRA-sim's current feeder rejects: the validator says so.
    assert result.violation("dangling_ctrl_dep").count == facts["missing_ctrl"] > 0
    assert 216 in result.violation("dangling_ctrl_dep").node_ids
    cycles = result.violation("cycle")
    assert cycles is not None and cycles.count >= len(facts["self_ctrl"]) > 0
    assert set(facts["self_ctrl"]) & set(cycles.node_ids)
    # The 14 CPU-side c10d ops are COMM_COLL_NODEs with is_cpu_op=true and no comm attributes;
    # the 7 NCCL kernels carry comm_type / comm_size and pass.
    assert result.violation("comm_on_cpu").count == 14
    assert result.violation("comm_type_missing").count == 14
    # its dependencies do not all come before their nodes, as a streaming reader would meet them
    assert result.violation("dependency_written_later").count == facts["written_later"] > 0
    assert not result.ok


@pytest.mark.parametrize(
    "relative, layout",
    [
        ("hta_simple_add/et.json.gz", "parent"),
        ("param_linear/et.json.gz", "parent"),
        ("param_dlrm/rank0.et.json.gz", "parent"),
        ("torch_cpu/mlp_1step/et.json.gz", "ctrl_deps"),
        ("torch_cpu/threads/et.json.gz", "ctrl_deps"),
    ],
)
def test_real_json_ets_are_valid(relative, layout):
    path = need(TRACES / relative)
    document = orjson.loads(gzip.decompress(path.read_bytes()))
    result = validate_file(path)
    assert result.ok, format_result(result)
    assert result.violations == []
    assert result.file_format == "et-json" and result.layout == layout
    assert result.node_count == len(document["nodes"])
    assert result.counts_by_type == {"cpu": len(document["nodes"]), "gpu": 0}
    assert result.schema == document["schema"]


# =============================================================================================
# Planted problems in small Chakra files
# =============================================================================================


def metadata() -> pb.GlobalMetadata:
    return pb.GlobalMetadata(attr=[make_attr("schema", "1.1.1-chakra.0.0.4")])


def comp(node_id: int, ctrl=(), data=(), cpu=True) -> pb.Node:
    node = pb.Node(id=node_id, name=f"op{node_id}", type=pb.COMP_NODE, ctrl_deps=list(ctrl), data_deps=list(data))
    node.attr.append(make_attr("is_cpu_op", cpu))
    return node


def coll(node_id: int, comm_type=pb.ALL_REDUCE, comm_size=1024, data=(1,), **kinds_of) -> pb.Node:
    node = pb.Node(id=node_id, name=f"nccl{node_id}", type=pb.COMM_COLL_NODE, ctrl_deps=[1], data_deps=list(data))
    node.attr.append(make_attr("is_cpu_op", False))
    if comm_type is not None:
        node.attr.append(make_attr("comm_type", comm_type, kinds_of.get("type_kind")))
    if comm_size is not None:
        node.attr.append(make_attr("comm_size", comm_size, kinds_of.get("size_kind")))
    return node


def write(tmp_path: Path, nodes: list[pb.Node], name: str = "t.et") -> Path:
    path = tmp_path / name
    with EtWriter(path) as writer:
        writer.write_metadata(metadata())
        for node in nodes:
            writer.write_node(node)
    return path


def valid_graph() -> list[pb.Node]:
    return [comp(1), comp(2, ctrl=[1], data=[1]), comp(3, ctrl=[1], data=[2]), comp(4, ctrl=[3], data=[3], cpu=False)]


@pytest.mark.parametrize("name", ["ok.et", "ok.et.gz"])
def test_valid_chakra_file(tmp_path, name):
    result = validate_file(write(tmp_path, valid_graph() + [coll(5, data=[4])], name))
    assert result.ok and result.violations == []
    assert result.counts_by_type == {"COMP_NODE": 4, "COMM_COLL_NODE": 1}
    assert result.node_count == 5 and result.schema == "1.1.1-chakra.0.0.4"
    assert "OK" in format_result(result)


def test_a_dependency_written_later_is_a_warning(tmp_path):
    """et-link writes a ``.et`` in a topological order (docs/formats.md); a node written before a
    node it depends on is named, as a warning (the file still replays)."""
    nodes = [comp(1), comp(3, ctrl=[1], data=[2]), comp(2, ctrl=[1])]
    result = validate_file(write(tmp_path, nodes))
    later = result.violation("dependency_written_later")
    assert result.ok and (later.count, later.node_ids) == (1, [3]) and "depends on 2" in later.details[0]
    assert validate_file(write(tmp_path, [comp(1), comp(2, ctrl=[1]), comp(3, ctrl=[1], data=[2])])).ok
    assert "dependency_written_later" not in kinds(validate_file(write(tmp_path, valid_graph())))


def test_dangling_dependencies(tmp_path):
    nodes = valid_graph() + [comp(5, ctrl=[1], data=[77]), comp(6, ctrl=[88], data=[5])]
    result = validate_file(write(tmp_path, nodes))
    assert not result.ok
    data = result.violation("dangling_data_dep")
    assert (data.count, data.node_ids) == (1, [5]) and "77" in data.details[0]
    ctrl = result.violation("dangling_ctrl_dep")
    assert (ctrl.count, ctrl.node_ids) == (1, [6]) and "88" in ctrl.details[0]
    assert "cycle" not in kinds(result)


def test_cycle_is_reported_with_its_nodes(tmp_path):
    # 2 -> 3 -> 4 -> 2 through data deps, 5 depends on the cycle (behind it), 6 is fine.
    nodes = [comp(1), comp(2, ctrl=[1], data=[4]), comp(3, ctrl=[1], data=[2]), comp(4, ctrl=[1], data=[3]),
             comp(5, ctrl=[1], data=[4]), comp(6, ctrl=[1], data=[1])]
    result = validate_file(write(tmp_path, nodes))
    cycle = result.violation("cycle")
    assert not result.ok and cycle.count == 1
    assert set(cycle.node_ids) == {2} or set(cycle.node_ids) <= {2, 3, 4}
    assert "cycle of 3" in cycle.details[0] and "4 nodes on or behind a cycle" in cycle.details[0]
    path_ids = [int(x) for x in cycle.details[0].split(": ")[1].split(";")[0].split(" -> ")]
    assert set(path_ids) == {2, 3, 4} and path_ids[0] == path_ids[-1]


def test_cycle_through_ctrl_and_data_and_self_loop(tmp_path):
    nodes = [comp(1), comp(2, ctrl=[3], data=[1]), comp(3, ctrl=[1], data=[2]), comp(4, ctrl=[4], data=[1])]
    result = validate_file(write(tmp_path, nodes))
    cycle = result.violation("cycle")
    assert cycle.count == 2  # {2, 3} and the self-loop on 4
    assert sorted(cycle.node_ids) in ([2, 4], [3, 4])


def test_duplicate_id(tmp_path):
    nodes = valid_graph() + [comp(3, ctrl=[1], data=[2])]
    result = validate_file(write(tmp_path, nodes))
    duplicate = result.violation("duplicate_id")
    assert not result.ok and (duplicate.count, duplicate.node_ids) == (1, [3])


def test_comm_node_checks(tmp_path):
    nodes = valid_graph() + [
        coll(10, comm_type=None),
        coll(11, comm_size=0),
        coll(12, comm_size=None),
        coll(13, comm_type=pb.REDUCE),
        coll(14, comm_type=42),
        coll(15, comm_size=64, size_kind="uint64_val"),
    ]
    cpu_comm = coll(16)
    cpu_comm.attr[0].bool_val = True
    send = pb.Node(id=17, name="send", type=pb.COMM_SEND_NODE, ctrl_deps=[1], attr=[make_attr("comm_size", 8)])
    result = validate_file(write(tmp_path, nodes + [cpu_comm, send]))
    by_kind = {v.kind: v.node_ids for v in result.violations}
    assert by_kind["comm_type_missing"] == [10]
    assert by_kind["comm_size_not_positive"] == [11]
    assert by_kind["comm_size_missing"] == [12]
    assert by_kind["comm_type_unsupported"] == [13] and result.violation("comm_type_unsupported").severity == "warning"
    assert by_kind["comm_type_unknown"] == [14]
    assert by_kind["comm_attr_kind"] == [15] and result.violation("comm_attr_kind").severity == "warning"
    assert by_kind["comm_on_cpu"] == [16]
    assert by_kind["comm_peer_missing"] == [17]
    assert result.counts_by_type["COMM_COLL_NODE"] == 7


def test_unsupported_collective_is_only_a_warning(tmp_path):
    result = validate_file(write(tmp_path, valid_graph() + [coll(9, comm_type=pb.BARRIER)]))
    assert result.ok and [v.kind for v in result.warnings] == ["comm_type_unsupported"]
    assert "BARRIER" in result.warnings[0].details[0]
    assert "WARNING" in format_result(result) and "OK" in format_result(result)


def raw_stream(path: Path, payloads: list[bytes]) -> Path:
    path.write_bytes(b"".join(chakra_io.encode_varint(len(p)) + p for p in payloads))
    return path


def test_empty_metadata_message(tmp_path):
    path = raw_stream(tmp_path / "m.et", [b"", comp(1).SerializeToString()])
    result = validate_file(path)
    assert "metadata_empty" in kinds(result) and not result.ok
    assert result.node_count == 1


def test_metadata_missing_first_message_is_a_node(tmp_path):
    path = raw_stream(tmp_path / "n.et", [n.SerializeToString() for n in valid_graph()])
    result = validate_file(path)
    assert result.violation("metadata_not_first").node_ids == [1]
    assert result.node_count == 4 and "dangling_ctrl_dep" not in kinds(result)


def test_metadata_with_unknown_fields_is_a_warning(tmp_path):
    newer_metadata = metadata().SerializeToString() + b"\x78\x01"  # + field 15 = 1
    payloads = [newer_metadata] + [n.SerializeToString() for n in valid_graph()]
    result = validate_file(raw_stream(tmp_path / "u.et", payloads))
    assert result.ok and [v.kind for v in result.violations] == ["metadata_unknown_fields"]
    assert result.schema == "1.1.1-chakra.0.0.4"


def test_empty_node_message(tmp_path):
    payloads = [metadata().SerializeToString()] + [n.SerializeToString() for n in valid_graph()] + [b""]
    result = validate_file(raw_stream(tmp_path / "e.et", payloads))
    assert "empty_message" in kinds(result) and result.counts_by_type["INVALID_NODE"] == 1


def test_unknown_node_type(tmp_path):
    odd = comp(5, ctrl=[1])
    odd.type = 99
    result = validate_file(write(tmp_path, valid_graph() + [odd]))
    assert result.violation("unknown_node_type").node_ids == [5]
    assert result.counts_by_type["UNKNOWN_99"] == 1


def test_truncated_and_garbage_chakra_files_raise(tmp_path):
    path = write(tmp_path, valid_graph())
    cut = tmp_path / "cut.et"
    cut.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(TraceFormatError) as err:
        validate_file(cut)
    assert str(cut) in str(err.value)
    garbage = tmp_path / "garbage.et"
    garbage.write_bytes(b"\x00\x13not a trace at all")
    with pytest.raises(TraceFormatError):
        validate_file(garbage)


def test_max_examples_keeps_the_count(tmp_path):
    nodes = [comp(1)] + [comp(i, ctrl=[1], data=[1000 + i]) for i in range(2, 40)]
    result = validate_file(write(tmp_path, nodes), max_examples=5)
    dangling = result.violation("dangling_data_dep")
    assert dangling.count == 38 and dangling.node_ids == [2, 3, 4, 5, 6]
    assert "33 more" in format_result(result, examples=5)


def test_long_chain_and_long_cycle(tmp_path):
    count = 10_000
    chain = [comp(1)] + [comp(i, ctrl=[i - 1], data=[i - 1]) for i in range(2, count + 1)]
    assert validate_file(write(tmp_path, chain, "chain.et")).ok
    chain[0].data_deps.append(count)  # closes a cycle through every node
    cycle = validate_file(write(tmp_path, chain, "cycle.et")).violation("cycle")
    assert cycle.count == 1 and f"cycle of {count}" in cycle.details[0]


# =============================================================================================
# ET / ET+ JSON
# =============================================================================================


def et_json(layout: str, extra: list[dict] | None = None, schema: str | None = None) -> dict:
    key = "ctrl_deps" if layout == "ctrl_deps" else "parent"
    nodes = [
        {"id": 2, "name": THREAD_ROOT, key: 1},
        {"id": 3, "name": "aten::add", key: 2},
        {"id": 5, "name": "aten::mul", key: 2},
        {"id": 1, "name": PROCESS_ROOT, key: 1},
    ] + (extra or [])
    return {"schema": schema or ("1.0.1" if key == "parent" else "1.1.1-chakra.0.0.4"), "pid": 7, "nodes": nodes}


def write_json(tmp_path: Path, document: dict, name: str = "et.json") -> Path:
    path = tmp_path / name
    data = orjson.dumps(document)
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("layout", ["parent", "ctrl_deps"])
@pytest.mark.parametrize("name", ["et.json", "et.json.gz"])
def test_valid_json_both_layouts(tmp_path, layout, name):
    result = validate_file(write_json(tmp_path, et_json(layout), name))
    assert result.ok and result.violations == [] and result.layout == layout
    assert result.counts_by_type == {"cpu": 4, "gpu": 0}


def test_et_plus_gpu_nodes_are_counted(tmp_path):
    gpu = [
        {"id": 10, "name": "void gemm()", "ctrl_deps": 3, "cat": "kernel", "ts": 1.0, "dur": 2.0},
        {"id": 11, "name": "Memcpy HtoD", "ctrl_deps": 5, "cat": "gpu_memcpy"},
        {"id": 12, "name": "Memset", "ctrl_deps": 5, "cat": "gpu_memset"},
    ]
    result = validate_file(write_json(tmp_path, et_json("ctrl_deps", gpu)))
    assert result.ok and result.counts_by_type == {"cpu": 4, "gpu": 3}


@pytest.mark.parametrize("layout, kind", [("parent", "dangling_parent"), ("ctrl_deps", "dangling_ctrl_dep")])
def test_json_dangling_parent(tmp_path, layout, kind):
    key = "ctrl_deps" if layout == "ctrl_deps" else "parent"
    result = validate_file(write_json(tmp_path, et_json(layout, [{"id": 9, "name": "x", key: 404}])))
    assert not result.ok and result.violation(kind).node_ids == [9]


def test_json_duplicate_id_and_cycle(tmp_path):
    extra = [
        {"id": 3, "name": "dup", "parent": 2},
        {"id": 20, "name": "a", "parent": 21},
        {"id": 21, "name": "b", "parent": 20},
        {"id": 30, "name": "self", "parent": 30},
    ]
    result = validate_file(write_json(tmp_path, et_json("parent", extra)))
    assert result.violation("duplicate_id").node_ids == [3]
    cycle = result.violation("cycle")
    assert cycle.count == 2 and {20, 21} & set(cycle.node_ids) and 30 in cycle.node_ids


def test_json_only_the_process_root_may_be_its_own_parent(tmp_path):
    document = et_json("ctrl_deps")
    document["nodes"][0]["ctrl_deps"] = 2  # the thread root now names itself
    result = validate_file(write_json(tmp_path, document))
    assert result.violation("cycle").node_ids == [2]


def test_json_data_deps_and_malformed_nodes(tmp_path):
    extra = [
        {"id": 40, "name": "d", "ctrl_deps": 3, "data_deps": [5, 99]},
        {"id": 41, "name": "no parent"},
        {"id": "42", "name": "string id", "ctrl_deps": 1},
        {"id": 43, "name": "bad parent", "ctrl_deps": "1"},
    ]
    result = validate_file(write_json(tmp_path, et_json("ctrl_deps", extra)))
    assert result.violation("dangling_data_dep").node_ids == [40]
    assert result.violation("missing_parent").node_ids == [41]
    assert result.violation("bad_id").count == 1
    assert result.violation("bad_dependency").node_ids == [43]


def test_format_detected_by_content(tmp_path):
    path = write_json(tmp_path, et_json("parent"), "looks_like_protobuf.et")
    assert validate_file(path).file_format == "et-json"
    proto = tmp_path / "looks_like_json.json"
    write(tmp_path, valid_graph(), "x.et").rename(proto)
    assert validate_file(proto).file_format == "chakra"


@pytest.mark.parametrize(
    "content, problem",
    [(b'{"nodes": [', "not valid JSON"), (b'{"schema": "1.0.1"}', "no top-level 'nodes'"), (b"", "empty")],
)
def test_bad_json_raises(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=problem) as err:
        validate_file(path)
    assert err.value.path == str(path)


def test_format_result_lists_violations(tmp_path):
    result = validate_file(write_json(tmp_path, et_json("parent", [{"id": 9, "name": "x", "parent": 404}])))
    text = format_result(result)
    assert text.splitlines()[0].startswith(f"{result.path}: FAILED (ET JSON, 'parent' layout, 5 nodes")
    assert "ERROR   dangling_parent x1" in text and "node 9: depends on 404" in text

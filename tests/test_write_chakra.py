"""Chakra protobuf output (``linker.write.chakra``): validity, node types, comm attributes,
dependencies (thread chains, streams, waits), JSON round trip, gzip and atomic output."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

import wire_decoder
from conftest import dlrm_pair, fixture_pair
from linker.model import et_def_pb2 as pb
from linker.plan import comm as chakra_comm
from linker.write import chakra as write_chakra
from linker.write.chakra_wire import attr_dict, message_to_dict, read_et
from linker.model.errors import TraceInputError
from linker.read.et import UNSET, read_execution_trace
from linker.link.etplus import build_et_plus
from linker.read.kineto import read_kineto_trace
from linker.link.recipe import LinkOptions, link
from linker.pipeline import link_pair
from linker.write.validate import format_result, validate_file
from linker.plan.comm import ProcessGroups, kind_from_kernel, kind_from_name, tensors_bytes
from linker.plan.busy import WAIT_CALLS
from linker.plan.dependency_plan import CAUSES
from linker.write.chakra import write_chakra_trace
from linker.write.chakra_attrs import attr_spec

DLRM_RANKS = range(8)
GPU_FIXTURES = ["gpu_v101", "gpu_v111"]
PROCESS_ROOTS = {"[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_graph|process]"}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def read_chakra(path: Path) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    messages = list(read_et(path))
    return messages[0], messages[1:]


def load_json(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.load(f)


def parent_of(node: dict) -> int:
    return node["ctrl_deps"] if "ctrl_deps" in node else node["parent"]


def is_cpu(node: pb.Node) -> bool:
    return attr_dict(node)["is_cpu_op"]


def assert_graph_invariants(nodes: list[pb.Node]) -> None:
    """Ids unique; every dependency exists and is written before its dependent (so the graph is
    acyclic); every data dependency has a cause; a CPU node's chain predecessor is on its thread and
    earlier in ET start order, and its other CPU dependencies are fork/join edges from other threads."""
    seen: dict[int, pb.Node] = {}
    for node in nodes:
        assert node.id not in seen, f"duplicate id {node.id}"
        for dep in list(node.ctrl_deps) + list(node.data_deps):
            assert dep in seen, f"node {node.id} ({node.name}) depends on {dep}, not written before it"
        seen[node.id] = node
        causes = attr_dict(node).get("data_dep_causes", [])
        assert len(causes) == len(node.data_deps) and set(causes) <= set(CAUSES)
        if is_cpu(node):
            cpu_deps = [(seen[d], c) for d, c in zip(node.data_deps, causes) if is_cpu(seen[d])]
            chain = [dep for dep, cause in cpu_deps if cause in ("thread_order", "parent")]
            assert len(chain) <= 1
            for dep in chain:
                assert attr_dict(dep)["tid"] == attr_dict(node)["tid"]
                if "continues" not in attr_dict(dep) and "continues" not in attr_dict(node):
                    assert dep.id < node.id  # ET ids are given at op start; a later piece's lie above them
                if dep.start_time_micros and node.start_time_micros:
                    assert dep.start_time_micros <= node.start_time_micros
            for dep, cause in cpu_deps:
                if cause not in ("thread_order", "parent"):
                    assert cause in ("fork", "join") and attr_dict(dep)["tid"] != attr_dict(node)["tid"]


def wire_nodes(path: Path) -> tuple[dict, list[dict]]:
    frames = wire_decoder.read_stream(path)
    return wire_decoder.decode_metadata(frames[0]), [wire_decoder.decode_node(f) for f in frames[1:]]


def wire_attrs(decoded: dict) -> dict[str, object]:
    """name -> value of a wire-decoded node's attributes (first value field present)."""
    out = {}
    for attr in decoded.get(10, []):
        value = next(v for number, v in attr.items() if number not in (1, 2))
        out[attr[1]] = value
    return out


def comm_nodes(nodes: list[pb.Node]) -> list[pb.Node]:
    return [n for n in nodes if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]


# ---------------------------------------------------------------------------------------------
# Real traces: param_dlrm, 8 ranks
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm_outputs(linked_once) -> dict[int, tuple[Path, Path, Path]]:
    """rank -> (ET path, Chakra output, ET+ JSON output: rank 0's only), linked once for the test
    session (``conftest.linked_once``: the same outputs the digest tests pin)."""
    outputs = {}
    for rank in DLRM_RANKS:
        et, kineto = dlrm_pair(rank)
        outputs[rank] = (et, linked_once(et, kineto, ".et")[0], None)
    et, kineto = dlrm_pair(0)
    outputs[0] = (outputs[0][0], outputs[0][1], linked_once(et, kineto, ".json")[0])
    return outputs


@pytest.mark.parametrize("rank", DLRM_RANKS)
def test_dlrm_rank_is_a_valid_chakra_trace(dlrm_outputs, rank):
    et_path, chakra, _ = dlrm_outputs[rank]
    result = validate_file(chakra)
    assert result.ok, format_result(result)
    assert not result.warnings, format_result(result)

    metadata, nodes = read_chakra(chakra)
    et = load_json(et_path)
    assert metadata.version
    assert {a.name: a.WhichOneof("value") for a in metadata.attr} == {
        "schema": "string_val", "pid": "uint64_val", "time": "string_val",
        "start_ts": "uint64_val", "finish_ts": "uint64_val"}
    meta = attr_dict(metadata)
    assert (meta["schema"], meta["pid"], meta["time"], meta["start_ts"], meta["finish_ts"]) == (
        et["schema"], et["pid"], et["time"], et["start_ts"], et["finish_ts"])
    assert_graph_invariants(nodes)
    # every ET node is there, plus one node per GPU op and one per later piece of an op
    assert {n["id"] for n in et["nodes"]} <= {n.id for n in nodes}
    gpu = [n for n in nodes if not is_cpu(n)]
    pieces = [n for n in nodes if "continues" in attr_dict(n)]
    assert len(nodes) == len(et["nodes"]) + len(gpu) + len(pieces) and len(gpu) > 200


@pytest.mark.parametrize("rank", DLRM_RANKS)
def test_dlrm_collectives_are_comm_nodes(dlrm_outputs, rank):
    et_path, chakra, _ = dlrm_outputs[rank]
    _, nodes = read_chakra(chakra)
    by_id = {n.id: n for n in nodes}
    et_nodes = {n["id"]: n for n in load_json(et_path)["nodes"]}
    nccl = [n for n in nodes if "nccl" in n.name.lower() and not is_cpu(n)]
    assert comm_nodes(nodes) == [n for n in nodes if n.type == pb.COMM_COLL_NODE] == nccl
    kinds = set()
    for node in nccl:
        attrs = attr_dict(node)
        parent = by_id[node.ctrl_deps[0]]
        assert parent.name.startswith("nccl:")
        expected_type = {"nccl:all_to_all": pb.ALL_TO_ALL, "nccl:all_reduce": pb.ALL_REDUCE}[parent.name]
        assert attrs["comm_type"] == expected_type
        if "SendRecv" in node.name:
            assert expected_type == pb.ALL_TO_ALL  # SendRecv kernels under all_to_all
        # size = the nccl:* op's input tensor, from its shape and dtype (an independent reading)
        source = et_nodes[parent.id]
        dtype = source["input_types"][0][len("Tensor("):-1]
        element = {"float": 4, "long int": 8, "int": 4}[dtype]
        assert attrs["comm_size"] == math.prod(source["input_shapes"][0]) * element > 0
        assert attrs["pg_name"] == "1"  # PyTorch's default group "0" as the job-wide id "1" (name + 1)
        assert not attrs["is_cpu_op"]
        assert {a.name: a.WhichOneof("value") for a in node.attr if a.name.startswith("comm_")} == {
            "comm_type": "int64_val", "comm_size": "int64_val"}
        kinds.add((node.name.split("(")[0], attrs["comm_type"]))
    assert {k for _, k in kinds} == {pb.ALL_TO_ALL, pb.ALL_REDUCE}
    assert any("SendRecv" in name for name, _ in kinds)


def test_dlrm_independent_wire_decoder_reads_every_message(dlrm_outputs):
    chakra = dlrm_outputs[3][1]
    metadata, nodes = read_chakra(chakra)
    wire_meta, decoded = wire_nodes(chakra)
    assert wire_meta[1] == [metadata.version]
    assert len(decoded) == len(nodes)
    for node, wire in zip(nodes, decoded):
        assert wire[1] == [node.id] and wire[2] == [node.name] and wire.get(3, [0]) == [node.type]
        assert wire.get(4, []) == list(node.ctrl_deps) and wire.get(5, []) == list(node.data_deps)
        assert wire.get(7, [0]) == [node.duration_micros]
        assert wire.get(6, [0]) == [node.start_time_micros]
        assert wire_attrs(wire) == attr_dict(node)
        if node.HasField("inputs"):
            assert wire[8][0].get(1, "") == node.inputs.values


def test_dlrm_json_and_chakra_agree(dlrm_outputs):
    """.json -> .et -> JSON: same ids and names; duration_micros within 1 µs of sim_dur, and the CPU
    ops' sum within 1 µs per thread of theirs (rounded as a running total); ctrl == parent."""
    _, chakra, json_path = dlrm_outputs[0]
    et_plus_nodes = {n["id"]: n for n in load_json(json_path)["nodes"]}
    chakra_nodes = {d["id"]: d for d in (message_to_dict(n) for n in read_chakra(chakra)[1])}
    assert set(chakra_nodes) == set(et_plus_nodes)
    linked = 0
    cpu_sim = cpu_written = 0.0
    for node_id, source in et_plus_nodes.items():
        node = chakra_nodes[node_id]
        assert node["name"] == source["name"]
        assert abs(node.get("duration_micros", 0) - source.get("sim_dur", 0)) < 1.001
        if "cat" not in source:
            cpu_sim += source.get("sim_dur", 0)
            cpu_written += node.get("duration_micros", 0)
        assert node.get("data_deps", []) == source["data_deps"]
        causes = {a["name"]: a for a in node.get("attr", [])}.get("data_dep_causes")
        assert (causes["string_list"]["values"] if causes else []) == source["data_dep_causes"]
        if "continues" in source:  # a later piece of an op: the op's name, the op as parent, its busy time
            assert {a["name"]: a for a in node["attr"]}["continues"]["int64_val"] == source["continues"]
            assert source["name"] == et_plus_nodes[source["continues"]]["name"]
            assert source["sim_dur"] <= source["dur"] + source.get("host_gap_dur", 0) + 0.001
        elif "dur" in source and "cat" not in source:  # a linked CPU op: busy = exclusive - blocked - deferred + gap
            assert source["sim_dur"] == pytest.approx(
                source["exclusive_dur"] - source["blocked_dur"] - source.get("deferred_dur", 0)
                + source["host_gap_dur"], abs=0.01)
        if "ts" in source:
            assert node["start_time_micros"] == round(source["ts"])
            linked += 1
        parent = parent_of(source)
        expected_ctrl = [] if source["name"] in PROCESS_ROOTS and parent == node_id else [parent]
        assert node.get("ctrl_deps", []) == expected_ctrl
        if source.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            assert parent in node["data_deps"]
            assert {a["name"]: a for a in node["attr"]}["stream"]["int64_val"] == source["stream"]
        elif "continues" not in source:
            # flat-layout inputs keep their JSON text
            assert json.loads(node["inputs"]["values"]) == source["inputs"]
            assert json.loads(node["inputs"]["types"]) == source["input_types"]
    assert linked > 1500
    threads = len({source.get("tid") for source in et_plus_nodes.values() if "cat" not in source})
    assert abs(cpu_written - cpu_sim) <= threads


def test_dlrm_waits_become_edges_without_cycles(tmp_path):
    """rank 0's synchronisations and stream waits give GPU op -> op edges; the file stays valid."""
    et_path, kineto_path = dlrm_pair(0)
    out = tmp_path / "waits.et"
    summary = write_chakra_trace(_link(et_path, kineto_path), out)
    events = load_json(kineto_path)["traceEvents"]
    expected_calls = {}
    for event in events:
        if event.get("cat") == "cuda_runtime" and event["name"] in WAIT_CALLS:
            expected_calls[event["name"]] = expected_calls.get(event["name"], 0) + 1
    assert summary.wait_calls == expected_calls
    _, nodes = read_chakra(out)
    by_id = {n.id: n for n in nodes}
    waits = [(d, n.id, cause) for n in nodes
             for d, cause in zip(n.data_deps, attr_dict(n).get("data_dep_causes", []))
             if cause in ("sync", "event_wait")]
    assert len(waits) == summary.wait_edges + summary.copy_wait_edges >= 20
    for source, target, cause in waits:
        assert not is_cpu(by_id[source])
        if cause == "event_wait":  # cudaStreamWaitEvent blocks no thread: a stream waits
            assert not is_cpu(by_id[target])
            assert attr_dict(by_id[source])["stream"] != attr_dict(by_id[target])["stream"]
        else:  # the op after a blocking call waits for the GPU op, on the caller's thread
            assert is_cpu(by_id[target])
    assert summary.dependency_causes["event_wait"] > 0 and summary.dependency_causes["sync"] > 0
    assert validate_file(out).ok


# ---------------------------------------------------------------------------------------------
# Hand-made GPU fixtures (tests/fixtures/gpu): both ET layouts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GPU_FIXTURES)
def test_gpu_fixture(tmp_path, name, schedule):
    et_path, kineto_path = fixture_pair("gpu", name)
    out = tmp_path / "x.et.gz"
    link_pair(et_path, kineto_path, out, LinkOptions(), schedule=schedule)
    result = validate_file(out)
    assert result.ok and not result.warnings, format_result(result)
    metadata, nodes = read_chakra(out)
    assert_graph_invariants(nodes)
    by_name = {}
    for node in nodes:
        by_name.setdefault(node.name, []).append(node)
    by_id = {n.id: n for n in nodes}

    init = by_name["## process_group:init ##"][0]
    assert init.type == pb.METADATA_NODE
    groups = json.loads(json.loads(init.inputs.values)[0])
    assert groups[0]["pg_name"] == "0"

    comms = {by_id[n.ctrl_deps[0]].name: attr_dict(n) for n in comm_nodes(nodes)}
    assert comms["nccl:all_to_all"]["comm_type"] == pb.ALL_TO_ALL  # a SendRecv kernel
    assert comms["nccl:all_to_all"]["comm_size"] == 32 * 64 * 4
    assert comms["nccl:all_reduce"]["comm_type"] == pb.ALL_REDUCE
    assert comms["nccl:all_reduce"]["comm_size"] == 5120 * 4
    assert {c["pg_name"] for c in comms.values()} == {"1"}  # PyTorch's "0" + 1

    # cudaStreamWaitEvent inside nccl:all_to_all: its kernel (the next GPU op the thread issued)
    # waits for the last op of the other stream; the CPU op itself does not block
    all_to_all = by_name["nccl:all_to_all"][0]
    assert not [d for d in all_to_all.data_deps if not is_cpu(by_id[d])]
    kernel = next(n for n in comm_nodes(nodes) if n.ctrl_deps[0] == all_to_all.id)
    causes = dict(zip(kernel.data_deps, attr_dict(kernel)["data_dep_causes"]))
    waited = [by_id[d] for d, cause in causes.items() if cause == "event_wait"]
    assert len(waited) == 1
    assert attr_dict(waited[0])["stream"] != attr_dict(kernel)["stream"]

    # the linked ops carry times; inputs keep the ET's JSON text in both layouts
    et_nodes = {n["id"]: n for n in load_json(et_path)["nodes"]}
    addmm = by_name["aten::addmm"][0]
    source = et_nodes[addmm.id]
    values = source["inputs"]["values"] if isinstance(source["inputs"], dict) else source["inputs"]
    assert json.loads(addmm.inputs.values) == values
    assert addmm.duration_micros > 0 and addmm.start_time_micros > 0
    if name == "gpu_v111":
        assert json.loads(addmm.inputs.strides) == source["inputs"]["strides"]
        assert attr_dict(addmm)["kernel_backend"] == ""
    assert attr_dict(addmm)["rf_id"] == (source["rf_id"] if "rf_id" in source else
                                         {a["name"]: a["value"] for a in source["attrs"]}["rf_id"])


# ---------------------------------------------------------------------------------------------
# A synthetic pair: point-to-point, process groups, synchronisations
# ---------------------------------------------------------------------------------------------

PID, TID = 4242, 4242
T0 = 1_700_000_000_000_000  # the synthetic Kineto trace's first µs
SEND_TENSOR = [100, 101, 0, 10, 4, "cuda:0"]  # 10 floats: 40 bytes
RECV_TENSOR = [102, 103, 0, 6, 8, "cuda:0"]  # 6 longs: 48 bytes
PG_CONFIG = json.dumps([
    {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
    {"pg_name": "1", "pg_desc": "pair", "ranks": [2, 3]},
])


def _io(values=(), shapes=(), types=()):
    return {"values": list(values), "shapes": list(shapes), "types": list(types), "strides": []}


def _et_node(node_id, name, parent, rf_id, tid=1, inputs=None):
    attrs = [{"name": "rf_id", "type": "uint64", "value": rf_id},
             {"name": "scope", "type": "uint64", "value": 7 if name.startswith(("#", "nccl:")) else 0},
             {"name": "tid", "type": "uint64", "value": tid},
             {"name": "op_schema", "type": "string", "value": ""}]
    return {"id": node_id, "name": name, "ctrl_deps": parent, "inputs": inputs or _io(),
            "outputs": _io(), "attrs": attrs}


def _p2p_ops(first_id, first_rf, kind, tensor, peer, tag, dtype):
    """c10d::<kind> > record_param_comms > nccl:<kind>, as PyTorch >= 2.2 records them."""
    c10d = _et_node(first_id, f"c10d::{kind}_", 2, first_rf, inputs=_io(
        [[tensor], "<Object>", peer, tag], [[[tensor[3]]], [], [], []],
        [f"GenericList[Tensor({dtype})]", "Object", "Int", "Int"]))
    param = _et_node(first_id + 1, "record_param_comms", first_id, first_rf + 1, inputs=_io(
        [[tensor], 3, ["1", "pair"], peer, kind, [], []], [[[tensor[3]]], [], [], [], [], [], []],
        [f"GenericList[Tensor({dtype})]", "Int", "Tuple[String,String]", "Int", "String",
         "GenericList[]", "GenericList[]"]))
    nccl = _et_node(first_id + 2, f"nccl:{kind}", first_id + 1, first_rf + 2,
                    inputs=_io([tensor], [[tensor[3]]], [f"Tensor({dtype})"]))
    return [c10d, param, nccl]


def synthetic_et() -> dict:
    nodes = [
        _et_node(1, "[pytorch|profiler|execution_trace|process]", 1, 0, tid=0),
        _et_node(2, "[pytorch|profiler|execution_trace|thread]", 1, 0),
        _et_node(3, "## process_group:init ##", 2, 1, inputs=_io([PG_CONFIG], [[]], ["String"])),
        *_p2p_ops(4, 2, "send", SEND_TENSOR, 1, 7, "float"),  # ids 4-6, rf 2-4
        _et_node(7, "aten::item", 2, 5),
        _et_node(8, "aten::add", 2, 6),
        *_p2p_ops(9, 7, "recv", RECV_TENSOR, 1, 9, "long int"),  # ids 9-11, rf 7-9
        _et_node(12, "aten::mul", 2, 10),
        _et_node(13, "## sync ##", 2, 11),
        _et_node(14, "aten::copy_", 2, 12),
        _et_node(15, "aten::unlinked_op", 2, 13),  # not in Kineto
    ]
    nodes.append(nodes.pop(0))  # the process root last, as PyTorch >= 2.2 writes it
    return {"schema": "1.1.1-chakra.0.0.4", "pid": PID, "time": "2025-01-01 00:00:00",
            "start_ts": 1000, "finish_ts": 2000, "nodes": nodes}


def _cpu(name, ts, dur, rf_id, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur,
            "args": {"External id": rf_id, "Record function id": rf_id}}


def _runtime(name, ts, dur, correlation):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": ts,
            "dur": dur, "args": {"correlation": correlation, "External id": correlation}}


def _gpu(name, ts, dur, stream, correlation, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": correlation, "External id": correlation}}


SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


def synthetic_kineto() -> dict:
    t0 = T0
    events = [
        _cpu("## process_group:init ##", t0 + 10, 1, 1, "user_annotation"),
        _cpu("c10d::send_", t0 + 20, 30, 2), _cpu("record_param_comms", t0 + 22, 26, 3),
        _cpu("nccl:send", t0 + 24, 20, 4, "user_annotation"),
        _runtime("cudaLaunchKernel", t0 + 26, 5, 1001),
        _cpu("aten::item", t0 + 60, 40, 5),
        _runtime("cudaMemcpyAsync", t0 + 62, 3, 1002),
        _runtime("cudaStreamSynchronize", t0 + 66, 30, 1003),  # inside the op that launched the copy
        _cpu("aten::add", t0 + 110, 10, 6), _runtime("cudaLaunchKernel", t0 + 112, 4, 1004),
        _cpu("c10d::recv_", t0 + 130, 30, 7), _cpu("record_param_comms", t0 + 132, 26, 8),
        _cpu("nccl:recv", t0 + 134, 20, 9, "user_annotation"),
        _runtime("cudaLaunchKernel", t0 + 136, 5, 1005),
        _cpu("aten::mul", t0 + 170, 10, 10), _runtime("cudaLaunchKernel", t0 + 172, 4, 1006),
        _cpu("## sync ##", t0 + 190, 50, 11, "user_annotation"),
        _runtime("cudaDeviceSynchronize", t0 + 192, 45, 1007),
        _cpu("aten::copy_", t0 + 250, 30, 12),
        _runtime("cudaMemcpyAsync", t0 + 252, 2, 1008),
        _runtime("cudaStreamSynchronize", t0 + 255, 20, 1009),  # nothing after it: no edge possible
        _gpu(SENDRECV, t0 + 30, 40, 20, 1001),
        _gpu("Memcpy DtoH (Device -> Pageable)", t0 + 64, 25, 7, 1002, "gpu_memcpy"),
        _gpu("void add_kernel<float>()", t0 + 114, 5, 7, 1004),
        _gpu(SENDRECV, t0 + 140, 30, 20, 1005),
        _gpu("void mul_kernel<float>()", t0 + 175, 3, 7, 1006),
        _gpu("Memcpy DtoH (Device -> Pageable)", t0 + 254, 15, 7, 1008, "gpu_memcpy"),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 2, "world_size": 4},
            "traceEvents": events}


@pytest.fixture
def synthetic_pair(tmp_path) -> tuple[Path, Path]:
    et_path, kineto_path = tmp_path / "et.json", tmp_path / "kineto.json"
    et_path.write_text(json.dumps(synthetic_et()))
    kineto_path.write_text(json.dumps(synthetic_kineto()))
    return et_path, kineto_path


def _link(et_path, kineto_path):
    return build_et_plus(link(read_execution_trace(et_path), read_kineto_trace(kineto_path)))


def test_point_to_point_and_process_groups(tmp_path, synthetic_pair):
    out = tmp_path / "p2p.et"
    summary = write_chakra_trace(_link(*synthetic_pair), out)
    result = validate_file(out)
    assert result.ok and not result.warnings, format_result(result)
    _, nodes = read_chakra(out)
    assert_graph_invariants(nodes)
    by_id = {n.id: n for n in nodes}
    assert by_id[3].type == pb.METADATA_NODE
    sends = [n for n in nodes if n.type == pb.COMM_SEND_NODE]
    recvs = [n for n in nodes if n.type == pb.COMM_RECV_NODE]
    assert len(sends) == len(recvs) == 1
    assert by_id[sends[0].ctrl_deps[0]].name == "nccl:send"
    # PyTorch group "1" (job id "2") has global ranks [2, 3]; the peer (group rank 1) is global rank 3; this rank is 2
    send, recv = attr_dict(sends[0]), attr_dict(recvs[0])
    assert (send["comm_src"], send["comm_dst"], send["comm_tag"], send["comm_size"], send["pg_name"]) == (2, 3, 7, 40, "2")
    assert (recv["comm_src"], recv["comm_dst"], recv["comm_tag"], recv["comm_size"], recv["pg_name"]) == (3, 2, 9, 48, "2")
    assert "comm_type" not in send
    # later pieces: of ops that have children (a launched kernel too), and "## sync ##"'s time
    # after its cudaDeviceSynchronize returned
    pieces = [n for n in nodes if "continues" in attr_dict(n)]
    assert pieces and all(any(m.ctrl_deps and m.ctrl_deps[0] == attr_dict(p)["continues"] and "continues" not in
                              attr_dict(m) for m in nodes) or by_id[attr_dict(p)["continues"]].name == "## sync ##"
                          for p in pieces)
    assert summary.counts_by_type == {"COMP_NODE": 18 + len(pieces), "METADATA_NODE": 1, "COMM_SEND_NODE": 1,
                                      "COMM_RECV_NODE": 1}
    assert not summary.comm_unresolved


def test_point_to_point_kernels_read_back_alike_from_json_and_et(tmp_path, synthetic_pair):
    """Rank 2 of group "1" (global ranks [2, 3]) sends to and receives from rank 3. The trace names
    this rank, so both peers are written, and only ``comm_role`` tells a JSON reader which side each
    kernel is: the JSON replay must see the send and the receive the ``.et`` replay sees (before,
    it took both for collectives)."""
    from linker.sim.graph import RECV, SEND
    from linker.sim.load import load_graph

    et_path, kineto_path = synthetic_pair
    link_pair(et_path, kineto_path, tmp_path / "p2p.json")
    link_pair(et_path, kineto_path, tmp_path / "p2p.et")
    written = [n for n in json.loads((tmp_path / "p2p.json").read_text())["nodes"] if n["name"] == SENDRECV]
    assert [(n["comm_role"], n["comm_src"], n["comm_dst"], n["comm_tag"]) for n in written] == [
        ("send", 2, 3, 7), ("recv", 3, 2, 9)]  # the tags: the c10d calls' int arguments
    for name in ("p2p.json", "p2p.et"):
        graph = load_graph(tmp_path / name, rank=2)
        sides = sorted((graph.names[u], info.role, info.peer) for u, info in graph.comm.items())
        assert sides == [(SENDRECV, SEND, 3), (SENDRECV, RECV, 3)], name


def test_synchronisations_become_data_dependencies(tmp_path, synthetic_pair):
    out = tmp_path / "sync.et"
    summary = write_chakra_trace(_link(*synthetic_pair), out)
    _, nodes = read_chakra(out)
    by_id = {n.id: n for n in nodes}
    gpu = {n.id: n for n in nodes if not is_cpu(n)}
    first_copy = next(n for n in gpu.values() if by_id[n.ctrl_deps[0]].name == "aten::item")
    last_copy = next(n for n in gpu.values() if by_id[n.ctrl_deps[0]].name == "aten::copy_")
    recv_kernel = next(n for n in gpu.values() if by_id[n.ctrl_deps[0]].name == "nccl:recv")
    mul_kernel = next(n for n in gpu.values() if by_id[n.ctrl_deps[0]].name == "aten::mul")
    # aten::item (60-100 µs) launched the copy (call 62-65) and synchronised inside itself (66-96):
    # it is cut where the call began and where the synchronize returned; the part after the call
    # (its 4 µs and the 10 µs of host time before aten::add) waits for the copy, as aten::add follows it
    assert first_copy.id not in by_id[7].data_deps
    item_parts = sorted((n for n in nodes if attr_dict(n).get("continues") == 7), key=lambda n: n.start_time_micros)
    assert [(n.start_time_micros - T0, n.duration_micros) for n in item_parts] == [(62, 4), (96, 4 + 10)]
    assert first_copy.id in item_parts[1].data_deps and list(by_id[8].data_deps) == [item_parts[1].id]
    # aten::mul (170-180 µs) launched mul_kernel (call 172-176), which began at 175, before the
    # op ended: the op is cut where the call began, its last 8 µs and the 10 µs of host time
    # after it a piece of its own that "## sync ##" follows on the thread; the kernel waits for
    # the 2 µs of aten::mul that ran before the call, not for the rest
    (mul_rest,) = [n for n in nodes if attr_dict(n).get("continues") == 12]
    assert (by_id[12].duration_micros, mul_rest.duration_micros) == (2, 8 + 10)
    assert list(by_id[13].data_deps) == [mul_rest.id]
    # cudaDeviceSynchronize (192-237) in "## sync ##" (190-240): the part of it after the call (3
    # µs, and the 10 µs of host time before aten::copy_ that no op covers) waits for the last op
    # issued on each stream; the call itself is blocked, not busy time
    (sync_rest,) = [n for n in nodes if attr_dict(n).get("continues") == 13]
    assert (sync_rest.start_time_micros - T0, sync_rest.duration_micros) == (237, 3 + 10)
    assert set(sync_rest.data_deps) == {13, recv_kernel.id, mul_kernel.id}
    assert attr_dict(sync_rest)["data_dep_causes"] == ["parent", "sync", "sync"]
    assert attr_dict(by_id[13])["blocked_micros"] == 45 and attr_dict(sync_rest)["host_gap_micros"] == 10
    assert by_id[13].duration_micros == 50 - 45 - 3 and attr_dict(by_id[13])["inclusive_dur_micros"] == 50
    assert list(by_id[14].data_deps) == [sync_rest.id]
    # aten::copy_ (250-280 µs) is cut where its copy's call began (call 252-254, copy at 254) and
    # where its synchronize on that copy returned (255-275): 3 µs between them (23 less the 20
    # blocked), 5 after, which wait for the copy; the unlinked op follows the last part
    copy_parts = sorted((n for n in nodes if attr_dict(n).get("continues") == 14), key=lambda n: n.start_time_micros)
    assert [(n.start_time_micros - T0, n.duration_micros) for n in copy_parts] == [(252, 3), (275, 5)]
    assert last_copy.id in copy_parts[1].data_deps
    assert list(by_id[15].data_deps) == [copy_parts[1].id] and by_id[15].duration_micros == 0
    assert summary.wait_edges == 4 and summary.wait_edges_redirected == 4 and not summary.waits_skipped
    assert summary.wait_calls == {"cudaStreamSynchronize": 2, "cudaDeviceSynchronize": 1}
    # GPU ops: after their launching op and after the previous op on the same stream
    assert list(mul_kernel.data_deps) == [12, next(n.id for n in gpu.values() if by_id[n.ctrl_deps[0]].name == "aten::add")]
    assert validate_file(out).ok


def test_unresolvable_comm_kernel_stays_a_timed_comp_node(tmp_path, synthetic_pair):
    """A SendRecv kernel whose launching ops name no collective and no peer: COMP_NODE, counted."""
    et = synthetic_et()
    for node in et["nodes"]:
        if node["name"] in ("c10d::send_", "record_param_comms", "nccl:send") and node["id"] < 7:
            node["name"] = {"c10d::send_": "my::outer", "record_param_comms": "my::middle",
                            "nccl:send": "my::launcher"}[node["name"]]
    kineto = synthetic_kineto()
    renames = {2: "my::outer", 3: "my::middle", 4: "my::launcher"}
    for event in kineto["traceEvents"]:
        if event["cat"] in ("cpu_op", "user_annotation") and event["args"]["Record function id"] in renames:
            event["name"] = renames[event["args"]["Record function id"]]
    et_path, kineto_path = synthetic_pair
    et_path.write_text(json.dumps(et))
    kineto_path.write_text(json.dumps(kineto))
    out = tmp_path / "x.et"
    summary = write_chakra_trace(_link(et_path, kineto_path), out)
    assert summary.comm_unresolved == {"comm kind unknown": 1}
    _, nodes = read_chakra(out)
    kernel = next(n for n in nodes if n.name == SENDRECV and n.ctrl_deps[0] == 6)
    assert kernel.type == pb.COMP_NODE and kernel.duration_micros == 40
    assert validate_file(out).ok


# ---------------------------------------------------------------------------------------------
# Output files: gzip, atomicity, protected inputs
# ---------------------------------------------------------------------------------------------


def test_gzip_output_holds_the_same_messages(tmp_path, synthetic_pair):
    et_plus = _link(*synthetic_pair)
    write_chakra_trace(et_plus, tmp_path / "a.et")
    write_chakra_trace(et_plus, tmp_path / "a.et.gz")
    assert (tmp_path / "a.et.gz").read_bytes()[:2] == b"\x1f\x8b"
    plain = [m.SerializeToString() for m in read_et(tmp_path / "a.et")]
    zipped = [m.SerializeToString() for m in read_et(tmp_path / "a.et.gz")]
    pieces = sum(1 for m in list(read_et(tmp_path / "a.et"))[1:] if "continues" in attr_dict(m))
    assert plain == zipped and len(plain) == 1 + 15 + 6 + pieces
    assert gzip.decompress((tmp_path / "a.et.gz").read_bytes()) == (tmp_path / "a.et").read_bytes()


def test_failure_leaves_no_file_and_keeps_an_existing_one(tmp_path, synthetic_pair, monkeypatch):
    et_plus = _link(*synthetic_pair)
    original = write_chakra.NodeFrames.chunk
    calls = []

    def failing(self, order):
        calls.append(order)
        if len(calls) >= 3:
            raise RuntimeError("disk full")
        return original(self, order)

    monkeypatch.setattr(write_chakra.NodeFrames, "chunk", failing)  # a failure on the third chunk
    with pytest.raises(RuntimeError, match="disk full"):
        write_chakra_trace(et_plus, tmp_path / "new.et", chunk_nodes=2)
    existing = tmp_path / "old.et.gz"
    existing.write_bytes(b"previous content")
    with pytest.raises(RuntimeError):
        write_chakra_trace(et_plus, existing, chunk_nodes=2)
    assert existing.read_bytes() == b"previous content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["et.json", "kineto.json", "old.et.gz"]


def test_never_overwrites_an_input(tmp_path, synthetic_pair, schedule):
    et_path, kineto_path = synthetic_pair
    before = et_path.read_bytes()
    with pytest.raises(TraceInputError, match="input"):
        link_pair(et_path, kineto_path, et_path, schedule=schedule)
    assert et_path.read_bytes() == before
    outcome = link_pair(et_path, kineto_path, tmp_path / "out.et", schedule=schedule)
    assert outcome.output.exists() and validate_file(outcome.output).ok


# ---------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("nccl:all_to_all", (chakra_comm.COLL, pb.ALL_TO_ALL)),
    ("all_to_allv", (chakra_comm.COLL, pb.ALL_TO_ALL)),
    ("nccl:all_reduce", (chakra_comm.COLL, pb.ALL_REDUCE)),
    ("allreduce_coalesced", (chakra_comm.COLL, pb.ALL_REDUCE)),
    ("_allgather_base", (chakra_comm.COLL, pb.ALL_GATHER)),
    ("nccl:all_gather_into_tensor_coalesced", (chakra_comm.COLL, pb.ALL_GATHER)),
    ("nccl:_reduce_scatter_base", (chakra_comm.COLL, pb.REDUCE_SCATTER)),
    ("nccl:broadcast", (chakra_comm.COLL, pb.BROADCAST)),
    ("nccl:reduce", (chakra_comm.COLL, pb.REDUCE)),
    ("gather", (chakra_comm.COLL, pb.GATHER)),
    ("scatter", (chakra_comm.COLL, pb.SCATTER)),
    ("barrier", (chakra_comm.COLL, pb.BARRIER)),
    ("nccl:send", (chakra_comm.SEND, None)),
    ("c10d::recv_any_source_", (chakra_comm.RECV, None)),
    ("batch_isend_irecv", None),
    ("aten::add", None),
])
def test_kind_from_name(name, expected):
    kind = kind_from_name(name)
    assert (kind.role, kind.comm_type) == expected if expected else kind is None


@pytest.mark.parametrize("name, expected", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", pb.ALL_REDUCE),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", pb.ALL_GATHER),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", pb.REDUCE_SCATTER),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", pb.BROADCAST),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", None),
    ("ncclDevKernel_Generic(ncclDevComm*, unsigned long, ncclWork*)", None),
])
def test_kind_from_kernel(name, expected):
    kind = kind_from_kernel(name)
    assert (kind.comm_type if kind else None) == expected


def test_tensor_bytes_from_values_or_shapes():
    io = chakra_comm.OpIO(
        values=[[1, 2, 0, 12, 2, "cuda:0"], [[3, 4, 0, 5, 8, "cuda:0"], [5, 6, 0, 7, 8, "cuda:0"]], 3, "x"],
        shapes=[[3, 4], [[5], [7]], [], []],
        types=["Tensor(c10::Half)", "GenericList[Tensor(long int),Tensor(long int)]", "Int", "String"])
    assert tensors_bytes(io) == 12 * 2 + (5 + 7) * 8
    # without the value tuples, shape x dtype size
    io.values = [None, [None, None], 3, "x"]
    assert tensors_bytes(io) == 12 * 2 + (5 + 7) * 8
    assert tensors_bytes(chakra_comm.OpIO([3], [[]], ["Int"])) is None
    assert tensors_bytes(chakra_comm.OpIO([None], [[2, 2]], ["Tensor(unknown_t)"])) is None


def test_process_group_names():
    groups = ProcessGroups({"default_pg": "0", "pair": "1"}, {"1": [2, 3]})
    assert groups.numeric_name("3") == "3"
    assert groups.numeric_name("pair") == "1"
    assert groups.numeric_name("nobody") is None
    assert groups.numeric_name(None) is None


def test_attr_specs():
    assert attr_spec("rf_id", 5) == ("rf_id", "int64_val", 5)
    assert attr_spec("big", 1 << 63) == ("big", "uint64_val", 1 << 63)
    assert attr_spec("flag", True) == ("flag", "bool_val", True)
    assert attr_spec("x", 0.5) == ("x", "double_val", 0.5)
    assert attr_spec("dims", [1, 2]) == ("dims", "int64_list", (1, 2))
    assert attr_spec("names", ["a"]) == ("names", "string_list", ("a",))
    assert attr_spec("mixed", [1, "a", {"k": None}]) == ("mixed", "string_val", '[1,"a",{"k":null}]')
    assert attr_spec("none", None) is None


# ---------------------------------------------------------------------------------------------
# The chunked encoder's caches against the plain path
# ---------------------------------------------------------------------------------------------

_RF = '{"name": "rf_id", "type": "uint64", "value": %s}'
_SEQ = '{"name": "seq_id", "type": "int64", "value": %s}'
_FW = '{"name": "fw_parent", "type": "uint64", "value": 0}'
_REST = ('{"name": "scope", "type": "uint64", "value": 7},{"name": "tid", "type": "uint64", "value": 1},'
         '{"name": "op_schema", "type": "string", "value": "aten::x(Tensor self) -> Tensor"}')
ATTRS_TEXTS = [
    "[" + ",".join((_RF % 5, _FW, _SEQ % -1, _REST)) + "]",  # as PyTorch writes it
    "[" + ",".join((_RF % 6, _FW, _SEQ % 12, _REST)) + "]",
    "[" + ",".join((_RF % 0, _FW, _SEQ % 0, _REST)) + "]",
    "[" + ",".join((_RF % (1 << 63), _FW, _SEQ % 1, _REST)) + "]",  # rf_id past int64: uint64_val
    "[" + ",".join((_RF % 7, _FW, _SEQ % (1 << 63), _REST)) + "]",  # seq_id past int64
    "[" + ",".join((_RF % 7, _FW, _SEQ % "null", _REST)) + "]",
    "[" + ",".join((_RF % 7, _FW, _SEQ % '"s"', _REST)) + "]",
    "[" + ",".join((_RF % 7, _FW, _SEQ % "1.5", _REST)) + "]",
    "[" + ",".join((_RF % 7, _FW, _SEQ % "true", _REST)) + "]",
    "[" + ",".join((_RF % "1.0", _FW, _SEQ % 1, _REST)) + "]",
    "[" + ",".join((_RF % "null", _FW, _SEQ % 1, _REST)) + "]",
    "[" + ",".join((_RF % 8, '{"name": "s", "value": "a},{b"}', _SEQ % 1, _REST)) + "]",  # separator in a string
    "[" + ",".join((_RF % 8, '{"name": "s", "value": "},{\\"name\\": 1},{"}', _SEQ % 1, _REST)) + "]",
    "[" + ",".join((_RF % 9, '{"name": "seq_id", "value": 3}', _SEQ % 1, _REST)) + "]",  # a per-op id twice
    "[" + ",".join((_RF % 9, _FW, _SEQ % 1, _REST, _RF % 10)) + "]",
    "[" + ",".join((_RF % 9, '{"name": "is_cpu_op", "value": false}', _SEQ % 1, _REST)) + "]",
    "[" + ",".join((_RF % 9, '{"name": "n", "value": null}', _SEQ % 1, '{"name": "l", "value": [1, 2]}')) + "]",
    "[" + ",".join((_RF % 9, _FW, _SEQ % 1, '{"name": "m", "value": [1, "a"]}', '{"name": "f", "value": -0.0}')) + "]",
    "[" + ",".join((_RF % 9, _FW, _SEQ % 1, '{"name": "u", "value": "h\\u00e9 \u00e9"}')) + "]",
    "[" + ",".join((_RF % 9, _FW, _SEQ % 1, '{"name": "b", "value": true}', '{"name": "i", "value": 1}')) + "]",
    "[" + ",".join((_RF % 9, _FW, _SEQ % 1, '{"name": "b", "value": 1}', '{"name": "i", "value": true}')) + "]",
    "[" + ",".join((_RF % 9, _FW, _SEQ % 1)) + "]",  # nothing after seq_id
    "[" + ",".join((_RF % 9, _FW)) + "]",
    "[" + ", ".join((_RF % 9, _FW, _SEQ % 1, _REST)) + "]",  # other spacing
    "[" + ",".join((_SEQ % 1, _FW, _RF % 9, _REST)) + "]",  # other order
    "[" + ",".join((_RF % "09", _FW, _SEQ % 1, _REST)) + "]",  # not JSON: plain path decides
    "[" + ",".join((_RF % 9, _FW.replace("0}", "-0}"), _SEQ % "-0", _REST)) + "]",
    "[" + ",".join((_RF % 9, _FW.replace("0}", "12345678}"), _SEQ % -123456789012, _REST)) + "]",
    "[" + ",".join((_RF % 9, _FW.replace("0}", "%d}" % (1 << 63)), _SEQ % (-1 << 63), _REST)) + "]",
    "[" + ",".join((_RF % 9, _FW.replace("0}", "1.5}"), _SEQ % "-1.5", _REST)) + "]",
    "[" + ",".join((_RF % 9, _FW.replace("0}", "-}"), _SEQ % "--1", _REST)) + "]",
    "[" + ",".join((_RF % 9, _FW.replace("0}", "007}"), _SEQ % "-007", _REST)) + "]",
    "[" + ",".join((_RF % 9, _FW.replace("0}", "1e3}"), _SEQ % "1E3", _REST)) + "]",
    "[]",
]


@pytest.mark.parametrize("text", ATTRS_TEXTS)
def test_cached_attrs_equal_plain_attrs(text):
    from linker.write.chakra_attrs import AttrEncoder
    from linker.write.chakra_fields import CpuAttrs
    from linker.read.et import EtNode, Raw

    node = EtNode(id=1, name="x", attrs=Raw(text.encode()))
    try:
        plain = AttrEncoder().cpu_attr_bytes(node, False)
    except Exception as error:  # the plain path's error: the fast path must decline the text
        plain = error
    encoder = AttrEncoder()
    fast = CpuAttrs(encoder)
    for _ in range(2):  # cache misses, then hits
        got = fast(node.attrs)
        if isinstance(plain, Exception):
            assert got is None
        else:
            assert got is None or got == plain
            wire = wire_decoder.decode_node(got or plain)  # the bytes are valid wire format
            assert len(wire.get(10, [])) == len(pb.Node.FromString(got or plain).attr)
    if text == ATTRS_TEXTS[0]:
        assert got is not None, "the usual text takes the fast path"
        other = Raw(ATTRS_TEXTS[1].encode())  # the same op name, another rest
        assert fast(other) == AttrEncoder().cpu_attr_bytes(EtNode(id=1, name="x", attrs=other), False)
        assert fast(node.attrs) == plain


IO_TEXTS = [
    b'{"values": [[1,2,0,4,4,"cpu"],3], "shapes": [[2,2],[]], "types": ["Tensor(float)","Int"], "strides": [[2,1],[]]}',
    b'{"values": [[5,6,0,4,4,"cpu"],3], "shapes": [[2,2],[]], "types": ["Tensor(float)","Int"], "strides": [[2,1],[]]}',
    b'{"values": [], "shapes": [], "types": []}',
    b'{"values": ["h\\u00e9", "\xc3\xa9"], "shapes": [[]], "types": ["String"]}',
    b'{"values": ["\xff\xfe"], "shapes": [[]], "types": ["Str\xe9"]}',  # not UTF-8: replaced
    b'{"shapes": [[1]], "types": ["Int"]}',
    b'{"values": [1]}',
    b'{"values": [' + b"7," * 3000 + b'7], "shapes": [[]], "types": ["' + b"x" * 20000 + b'"]}',
    b'[1, 2]',
    b'{"values": [1], "shapes": [1] "types"}',
]


@pytest.mark.parametrize("text", IO_TEXTS)
def test_cached_io_fields_equal_plain_ones(text):
    from linker.write.chakra_fields import INPUTS, IoFields, io_fields
    from linker.read.et import EtNode, Raw

    node = EtNode(id=1, name="x", inputs=Raw(text))
    plain = io_fields(node, False)
    fields = IoFields(INPUTS)
    other = Raw(b'{"values": [1], "shapes": [[9]], "types": ["Int"]}')
    other_plain = io_fields(EtNode(id=1, name="x", inputs=other), False)
    for _ in range(2):  # encoded, then with the shapes/types from the cache
        assert fields(node.inputs) == plain
        assert fields(other) == other_plain
    message = pb.Node.FromString(plain)
    assert message.HasField("inputs")
    assert wire_decoder.decode_node(plain)[8]


def test_cached_attrs_stay_equal_when_their_caches_fill():
    """The per-op value caches are emptied when full: texts seen before, after and across an
    emptying give the plain path's bytes."""
    from linker.write.chakra_attrs import AttrEncoder
    from linker.write.chakra_fields import CpuAttrs
    from linker.read.et import EtNode, Raw

    fast = CpuAttrs(AttrEncoder(), max_cached_values=3)
    texts = ["[" + ",".join((_RF % (100 + k), _FW.replace("0}", "%d}" % (k % 5)), _SEQ % (k % 7), _REST)) + "]"
             for k in range(40)]
    for text in texts + texts[::-1]:
        node = EtNode(id=1, name="x", attrs=Raw(text.encode()))
        got = fast(node.attrs)
        assert got is not None and got == AttrEncoder().cpu_attr_bytes(node, False)


def test_time_split_attribute_of_a_negative_value_is_zero(tmp_path):
    """A negative time-split value (a blocked time below 0 from rounding noise) is written as 0."""
    from linker.plan.deps import dependency_plan

    et_plus = _link(*fixture_pair("cpu", "threads"))
    plan = dependency_plan(et_plus)
    timed = [i for i, node in enumerate(et_plus.et.nodes) if node.ts is not UNSET and node.ts is not None]
    first, second = timed[1], timed[2]
    plan.busy.blocked[first], plan.busy.blocked[second] = -2.4, 5.2
    out = tmp_path / "negative.et"
    write_chakra_trace(et_plus, out)
    _, nodes = read_chakra(out)
    by_id = {node.id: node for node in nodes}
    assert attr_dict(by_id[et_plus.et.ids[first]])["blocked_micros"] == 0
    assert attr_dict(by_id[et_plus.et.ids[second]])["blocked_micros"] == 5

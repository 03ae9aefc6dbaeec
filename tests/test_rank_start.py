"""Rank start offsets (docs/rank-start.md): the rule, the delay node in .et and ET+ JSON outputs,
batch and simulate agreeing on it, and the ASTRA-sim setup written beside a job."""

from __future__ import annotations

import io
import json
import math
import os
import stat
from pathlib import Path

import msgspec
import orjson
import pytest
from typer.testing import CliRunner

from linker.batch import BatchConfig, run_batch
from linker.batch.astra_setup import copy_without_metadata
from linker.batch.rank_start import apply_rank_starts, set_rank_start
from linker.cli import app
from linker.pipeline import link_pair
from linker.plan.rank_start import DELAY_NODE_NAME, RANK_START, et_plus_span, measured_offsets
from linker.sim.load import load_graph
from linker.sim.cli_run import SimulateOptions, run_simulate
from linker.model import et_def_pb2 as pb
from linker.model.errors import TraceInputError
from linker.schedule import Schedule
from linker.write.chakra_wire import EtWriter, iter_frames, make_attr, read_et
from linker.write.validate import validate_file

from conftest import FIXTURES, dlrm_pair

SHARED = Path(__file__).resolve().parents[2] / "shared"
DLRM = SHARED / "traces" / "param_dlrm"
LINEAR = SHARED / "traces" / "param_linear"


def test_measured_offsets_rule():
    assert measured_offsets([(105.0, 300.0), (100.0, 250.0), (130.0, 400.0)]) == [5.0, 0.0, 30.0]
    assert measured_offsets([(0.0, 10.0)]) is None  # a single rank has nothing to be relative to
    assert measured_offsets([(0.0, 10.0), (math.nan, math.nan)]) is None  # an untimed rank
    assert measured_offsets([(0.0, 10.0), (1e6, 1e6 + 10)]) is None  # starts further apart than a step: two clocks


SPAN_PAIRS = [d.relative_to(FIXTURES).as_posix() for d in sorted(FIXTURES.glob("*/*")) if (d / "et.json.gz").is_file()]


@pytest.mark.parametrize("pair", SPAN_PAIRS + ["dlrm/0", "dlrm/3"])
def test_a_workers_span_is_the_one_simulate_reads_back(tmp_path, pair):
    """A batch worker hands over its rank's measured span from the ET+ in memory; it must be the
    span ``simulate`` reads from the written output (start ``ts``, end ``ts + inclusive_dur``, or
    ``ts + dur`` for a later piece, which has no ``inclusive_dur``)."""
    et, kineto = dlrm_pair(int(pair[-1])) if pair.startswith("dlrm") else (FIXTURES / pair / "et.json.gz",
                                                                             FIXTURES / pair / "kineto.json.gz")
    out = tmp_path / "plus.json"
    outcome = link_pair(et, kineto, out)
    nodes = orjson.loads(out.read_bytes())["nodes"]
    timed = [(float(n["ts"]), float(n["ts"]) + float(n.get("inclusive_dur", n["dur"]))) for n in nodes if "ts" in n]
    expected = (min(s for s, _ in timed), max(e for _, e in timed))  # read off the file, by hand
    assert et_plus_span(outcome.et_plus) == expected == load_graph(out).measured_span()


def _tiny_et(path: Path) -> None:
    """A root, a child and a GPU op: only the root has no dependency."""
    with EtWriter(path) as writer:
        writer.write_metadata(pb.GlobalMetadata(version="0.0.4"))
        root = pb.Node(id=1, name="[pytorch|profiler|execution_trace|process]", type=pb.COMP_NODE)
        root.attr.append(make_attr("is_cpu_op", True, "bool_val"))
        child = pb.Node(id=2, name="aten::mm", type=pb.COMP_NODE, ctrl_deps=[1], data_deps=[1],
                        start_time_micros=1000, duration_micros=40)
        child.attr.extend([make_attr("is_cpu_op", True, "bool_val"), make_attr("data_dep_causes", ["parent"])])
        kernel = pb.Node(id=7, name="gemm", type=pb.COMP_NODE, ctrl_deps=[2], data_deps=[2],
                         start_time_micros=1010, duration_micros=30)
        kernel.attr.extend([make_attr("is_cpu_op", False, "bool_val"), make_attr("data_dep_causes", ["launch"])])
        for node in (root, child, kernel):
            writer.write_node(node)


def test_delay_node_in_et_is_leading_gates_the_root_and_validates(tmp_path):
    path = tmp_path / "rank.1.et"
    _tiny_et(path)
    original = path.read_bytes()
    assert set_rank_start(path, 0) is False and path.read_bytes() == original  # offset 0: nothing written
    assert set_rank_start(path, 1234) is True
    messages = list(read_et(path))
    nodes = messages[1:]
    delay = nodes[0]
    assert (delay.id, delay.name, delay.type, delay.duration_micros) == (8, DELAY_NODE_NAME, pb.COMP_NODE, 1234)
    assert not delay.ctrl_deps and not delay.data_deps and not delay.start_time_micros
    root = nodes[1]
    assert list(root.data_deps) == [8]
    assert [a.string_list.values for a in root.attr if a.name == "data_dep_causes"] == [[RANK_START]]
    (tmp_path / "orig.et").write_bytes(original)
    assert [f.payload for f in iter_frames(path)][3:] == [f.payload for f in iter_frames(tmp_path / "orig.et")][2:]
    result = validate_file(path)
    assert result.ok, result
    assert set_rank_start(path, 1234) is False  # already there
    assert set_rank_start(path, 99) is True and list(read_et(path))[1].duration_micros == 99  # replaced, same id
    assert len(list(read_et(path))) == 5
    assert set_rank_start(path, 0) is True
    assert path.read_bytes() == original  # removed: the file is the original again


@pytest.mark.parametrize("indent", [False, True], ids=["as et-link writes it", "pretty-printed"])
def test_delay_node_in_json(tmp_path, indent):
    """The same edit whether the file is spliced in its bytes (compact, as written) or decoded
    whole (any other layout)."""
    doc = {"schema": "1.0.1", "nodes": [
        {"id": 1, "name": "[pytorch|profiler|execution_graph|process]", "parent": 1, "tid": 0, "data_deps": [],
         "data_dep_causes": []},
        {"id": 2, "name": "aten::mm", "parent": 1, "tid": 1, "ts": 100, "dur": 5, "sim_dur": 5, "data_deps": [1],
         "data_dep_causes": ["parent"]}]}
    path = tmp_path / "rank2_plus.json"
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0))
    assert set_rank_start(path, 70) is True
    out = orjson.loads(path.read_bytes())
    assert out["nodes"][0] == {"id": 3, "name": DELAY_NODE_NAME, "parent": 3, "tid": 0, "sim_dur": 70,
                               "rank_start_micros": 70, "data_deps": [], "data_dep_causes": []}
    assert out["nodes"][1]["data_deps"] == [3] and out["nodes"][1]["data_dep_causes"] == [RANK_START]
    assert out["nodes"][2] == doc["nodes"][1]
    assert validate_file(path).ok
    assert set_rank_start(path, 0) is True and orjson.loads(path.read_bytes()) == doc


def _node(i, parent, deps, key="parent", **more):
    return {"id": i, "name": more.pop("name", f"op{i}"), key: parent, "data_deps": deps,
            "data_dep_causes": ["parent"] * len(deps), **more}


_PROCESS, _THREAD = "[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]"
_LAYOUTS = {  # node lists in the orders files may hold them
    "root last": [_node(2, 9, [9]), _node(3, 9, [2]), _node(9, 9, [], tid=5, name=_PROCESS)],
    "root in the middle": [_node(2, 9, [9]), _node(9, 9, [], tid=5, name=_PROCESS), _node(3, 9, [2])],
    "two roots": [_node(1, 1, [], tid=1, name=_PROCESS), _node(2, 1, [1]), _node(7, 99, [], tid=2, name=_THREAD),
                  _node(8, 7, [7])],  # the thread root's parent is not in the file
    "nested layout": [_node(1, 1, [], "ctrl_deps", tid=3, name=_PROCESS), _node(2, 1, [1], "ctrl_deps")],
    "one node": [_node(4, 4, [], name=_PROCESS)],
    # over ``files.MAP_AT_LEAST`` bytes: read as a mapping of the file, not a copy
    "large file": [_node(1, 1, [], tid=1, name=_PROCESS)] + [_node(i, 1, [i - 1]) for i in range(2, 20_002)],
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_json_splice_and_whole_document_agree(tmp_path, layout):
    """The spliced file (compact, as written) and the decoded one (pretty-printed) hold the same
    document after every edit: add, change, remove; each root gated by the delay node."""
    doc = {"schema": "1.0.1", "nodes": _LAYOUTS[layout], "finish_ts": 5}
    compact, pretty = tmp_path / "a.json", tmp_path / "b.json"
    compact.write_bytes(orjson.dumps(doc))
    pretty.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    roots = [n["id"] for n in doc["nodes"] if not n["data_deps"]]
    for offset in (70, 70, 12, 0):
        assert set_rank_start(compact, offset) == set_rank_start(pretty, offset)
        got = orjson.loads(compact.read_bytes())
        assert got == orjson.loads(pretty.read_bytes())
        if offset:
            delay = got["nodes"][0]
            assert delay["sim_dur"] == offset and delay["id"] == max(n["id"] for n in doc["nodes"]) + 1
            assert [n["id"] for n in got["nodes"] if delay["id"] in n["data_deps"]] == roots
            assert validate_file(compact).ok or layout == "two roots"  # (a parent missing from the file)
    assert orjson.loads(compact.read_bytes()) == doc


class _NodeTexts(msgspec.Struct):
    nodes: list[msgspec.Raw]


@pytest.mark.parametrize("pair", ["cpu/threads", "gpu/gpu_v101"], ids=["nested layout", "flat layout"])
def test_json_delay_node_spliced_into_a_real_output(tmp_path, pair):
    """A real ET+ JSON: the delay node first, its edge on the process root, every other node's
    text kept byte for byte; changed and removed again."""
    out = tmp_path / "plus.json"
    link_pair(FIXTURES / pair / "et.json.gz", FIXTURES / pair / "kineto.json.gz", out)
    original = out.read_bytes()
    doc = json.loads(original)
    key = "ctrl_deps" if "ctrl_deps" in doc["nodes"][0] else "parent"
    ids = {n["id"] for n in doc["nodes"]}
    roots = [n["id"] for n in doc["nodes"] if not n.get("data_deps") and n.get(key) in (None, -1, n["id"])
             or n.get(key) not in ids]
    assert roots  # the process root at least
    assert set_rank_start(out, 1234) is True
    spliced = out.read_bytes()
    got = json.loads(spliced)
    delay = got["nodes"][0]
    assert delay["name"] == DELAY_NODE_NAME and delay["sim_dur"] == 1234 and delay["id"] == max(ids) + 1
    texts = msgspec.json.decode(original, type=_NodeTexts).nodes  # each node's text, as written
    for node, before, text in zip(got["nodes"][1:], doc["nodes"], texts):
        if node["id"] in roots and not before.get("data_deps"):
            assert node["data_deps"] == [delay["id"]] and node["data_dep_causes"] == [RANK_START]
        else:
            assert node == before and bytes(text) in spliced
    assert len(spliced) < len(original) + 1000  # the other nodes' texts as they were
    assert validate_file(out).ok
    assert set_rank_start(out, 99) is True and json.loads(out.read_bytes())["nodes"][0]["sim_dur"] == 99
    assert set_rank_start(out, 0) is True and json.loads(out.read_bytes()) == doc


def test_metadata_nodes_become_cpu_ops_in_the_astra_copy(tmp_path):
    source = tmp_path / "rank.0.et"
    with EtWriter(source) as writer:
        writer.write_metadata(pb.GlobalMetadata(version="0.0.4"))
        writer.write_node(pb.Node(id=1, name="root", type=pb.COMP_NODE))
        writer.write_node(pb.Node(id=2, name="## process_group:init ##", type=pb.METADATA_NODE, ctrl_deps=[1],
                                  duration_micros=3))
    copy_without_metadata(source, tmp_path / "w.0.et")
    nodes = list(read_et(tmp_path / "w.0.et"))[1:]
    assert [n.type for n in nodes] == [pb.COMP_NODE, pb.COMP_NODE]
    assert nodes[1].duration_micros == 0 and list(nodes[1].ctrl_deps) == [1]
    assert [a.bool_val for a in nodes[1].attr if a.name == "is_cpu_op"] == [True]
    assert nodes[0].SerializeToString() == list(read_et(source))[1].SerializeToString()


def _point_to_point_rank(path: Path, sends: list[tuple[int, int, int]], rank: int | None = None) -> None:
    """A hand-made rank file: a root, then per (node id, type, peer) a send or recv of 64 bytes on group 1.
    ``rank``: the file's own rank, written on the other side (``comm_src`` of a send, ``comm_dst`` of
    a recv) as et-link's writer does; None: the peer alone."""
    with EtWriter(path) as writer:
        writer.write_metadata(pb.GlobalMetadata(version="0.0.4"))
        writer.write_node(pb.Node(id=1, name="root", type=pb.COMP_NODE, duration_micros=5,
                                  attr=[make_attr("is_cpu_op", True, "bool_val")]))
        for node_id, kind, peer in sends:
            send = kind == pb.COMM_SEND_NODE
            src, dst = (rank, peer) if send else (peer, rank)
            ends = [make_attr(name, value, "int64_val") for name, value in (("comm_src", src), ("comm_dst", dst))
                    if value is not None]
            writer.write_node(pb.Node(id=node_id, name="nccl:send" if send else "nccl:recv",
                                      type=kind, ctrl_deps=[1], duration_micros=7,
                                      attr=[make_attr("is_cpu_op", False, "bool_val"),
                                            make_attr("comm_size", 64, "int64_val"), *ends,
                                            make_attr("pg_name", "1", "string_val")]))


def test_a_setup_of_some_ranks_numbers_send_recv_peers_by_npu(tmp_path):
    """Ranks 2 and 5 of an 8-rank job as NPUs 0 and 1: the workload copies' send/recv peers are
    NPU ids (2 -> 0, 5 -> 1), the comm groups too; a send to rank 7, not linked, is left as it is
    and said."""
    job = tmp_path / "job"
    job.mkdir()
    _point_to_point_rank(job / "rank.2.et", [(2, pb.COMM_SEND_NODE, 5), (3, pb.COMM_SEND_NODE, 7)], rank=2)
    _point_to_point_rank(job / "rank.5.et", [(2, pb.COMM_RECV_NODE, 2)], rank=5)
    (job / "comm_groups.json").write_text(json.dumps({"1": list(range(8)), "2": [2, 3], "3": [6, 7]}))
    result = CliRunner().invoke(app, ["astra-setup", str(job), "--astra-bandwidth", "100", "--astra-latency", "500"])
    assert result.exit_code == 0, result.output
    astra = job / "astra"
    assert json.loads((astra / "npu_ranks.json").read_text()) == [2, 5]
    assert json.loads((astra / "comm_groups.json").read_text()) == {"1": [0, 1], "2": [0]}
    assert "npus_count: [ 2 ]" in (astra / "network.yml").read_text()

    def peers(path):
        return [(n.id, [(a.name, a.int64_val) for a in n.attr if a.name in ("comm_src", "comm_dst")])
                for n in list(read_et(path))[1:] if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]

    # both ends of each as NPU ids: the rank's own (2 -> 0, 5 -> 1) and its peer's
    assert peers(astra / "workload.0.et") == [(2, [("comm_src", 0), ("comm_dst", 1)])]
    assert peers(astra / "workload.1.et") == [(2, [("comm_src", 0), ("comm_dst", 1)])]
    # the send to rank 7, whose NPU does not exist: a GPU compute node of its time, its deps kept
    unpaired = next(n for n in list(read_et(astra / "workload.0.et"))[1:] if n.id == 3)
    assert unpaired.type == pb.COMP_NODE and unpaired.duration_micros == 7 and list(unpaired.ctrl_deps) == [1]
    assert [(a.name, a.bool_val or a.int64_val) for a in unpaired.attr if a.name in ("is_cpu_op", "unpaired_peer",
                                                                               "comm_dst")] == [
        ("is_cpu_op", False), ("unpaired_peer", 7)]
    assert "rank 2: send/recv with rank(s) 7 that are not linked here" in result.output
    assert "workload [0]: copies whose send/recv nodes with a peer not linked here are GPU COMP_NODEs" in result.output
    assert "NPUs 0-1 are the 2 ranks linked (2,5)" in result.output
    assert "workload [0, 1]: copies whose send/recv peers are NPU ids" in result.output
    assert "METADATA_NODE" not in result.output  # the files hold none: copied for their peers only


def _simulate(paths, rank_start="measured") -> dict:
    text, finished = run_simulate(SimulateOptions(list(paths), json_output=True, rank_start=rank_start))
    assert finished
    return orjson.loads(text)


def test_dlrm_batch_et_delay_nodes_simulate_and_astra_setup(tmp_path):
    if not DLRM.is_dir():
        pytest.skip("shared traces not available")
    et, kineto = str(DLRM / "rank*.et.json.gz"), str(DLRM / "rank*.kineto.json.gz")
    measured = run_batch(BatchConfig(et, kineto, tmp_path / "m", fmt="et"), progress_stream=io.StringIO(),
                         interactive=False)
    zero = run_batch(BatchConfig(et, kineto, tmp_path / "z", fmt="et", rank_start="zero"),
                     progress_stream=io.StringIO(), interactive=False)
    assert all(r.status == "linked" for r in measured.ranks + zero.ranks)
    # offsets computed here from the zero-start files: each rank's earliest start_time_micros
    firsts = {}
    for rank in range(8):
        starts = [n.start_time_micros for n in list(read_et(tmp_path / "z" / f"rank.{rank}.et"))[1:] if n.start_time_micros]
        firsts[rank] = min(starts)
    offsets = {rank: first - min(firsts.values()) for rank, first in firsts.items()}
    assert measured.simulator["rank_start"]["offsets_us"] == {str(r): v for r, v in offsets.items()}
    for rank in range(8):
        m_frames = [f.payload for f in iter_frames(tmp_path / "m" / f"rank.{rank}.et")]
        z_frames = [f.payload for f in iter_frames(tmp_path / "z" / f"rank.{rank}.et")]
        assert validate_file(tmp_path / "m" / f"rank.{rank}.et").ok
        if offsets[rank] == 0:
            assert m_frames == z_frames
            continue
        delay = pb.Node.FromString(m_frames[1])
        assert delay.name == DELAY_NODE_NAME and delay.duration_micros == offsets[rank]
        root = pb.Node.FromString(m_frames[2])
        assert list(root.data_deps) == [delay.id]
        del root.data_deps[:]
        del root.attr[-1]
        # only the delay node and the root's edge differ
        assert [m_frames[0]] + [root.SerializeToString()] + m_frames[3:] == z_frames
    # simulate: the delay nodes give the same replay as the offsets computed from measured times
    with_nodes, without = _simulate([tmp_path / "m"]), _simulate([tmp_path / "z"])
    assert [dict(r, file=None) for r in with_nodes["ranks"]] == [
        dict(r, nodes=r["nodes"] + (offsets[r["rank"]] > 0), file=None) for r in without["ranks"]]
    assert with_nodes["rank_start_us"] == [float(offsets[r]) for r in range(8)] == without["rank_start_us"]
    zero_a, zero_b = _simulate([tmp_path / "m"], "zero"), _simulate([tmp_path / "z"], "zero")
    assert [r["simulated_us"] for r in zero_a["ranks"]] == [r["simulated_us"] for r in zero_b["ranks"]]
    assert zero_a["rank_start_us"] == [0.0] * 8
    # the ASTRA-sim setup
    astra = tmp_path / "m" / "astra"
    run = astra / "run"
    assert run.stat().st_mode & stat.S_IXUSR
    script = run.read_text()
    for part in ('--workload-configuration="$here/workload"', '--comm-group-configuration="$here/comm_groups.json"',
                 '--system-configuration="$here/system.json"', '--network-configuration="$here/network.yml"',
                 '--remote-memory-configuration="$here/memory.json"', "ASTRA_SIM_BIN"):
        assert part in script
    for rank in range(8):
        assert os.readlink(astra / f"workload.{rank}.et") == f"../rank.{rank}.et"
    network = (astra / "network.yml").read_text()
    fit = measured.simulator["astra_sim"]["network"]
    assert "npus_count: [ 8 ]" in network and f"bandwidth: [ {fit['bandwidth_gbps']} ]" in network
    assert fit["collectives"] == 8 and abs(fit["aggregate_error"]) < 0.10
    assert json.loads((astra / "comm_groups.json").read_text()) == {"1": list(range(8))}
    system = json.loads((astra / "system.json").read_text())
    assert system["preferred-dataset-splits"] == 1 and system["all-to-all-implementation"] == ["ring"]
    # a rerun skips every rank (the sidecars follow the rewritten outputs) and writes nothing new
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").glob("rank.*.et")}
    again = run_batch(BatchConfig(et, kineto, tmp_path / "m", fmt="et"), progress_stream=io.StringIO(),
                      interactive=False)
    assert all(r.status == "skipped" for r in again.ranks)
    assert again.simulator["rank_start"]["rewritten_ranks"] == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").glob("rank.*.et")} == before
    # --rank-start zero over the same folder removes the delay nodes: the zero-start bytes again
    run_batch(BatchConfig(et, kineto, tmp_path / "m", fmt="et", rank_start="zero"), progress_stream=io.StringIO(),
              interactive=False)
    for rank in range(8):
        assert (tmp_path / "m" / f"rank.{rank}.et").read_bytes() == (tmp_path / "z" / f"rank.{rank}.et").read_bytes()


def test_a_single_rank_with_send_recv_runs_them_as_compute_on_its_two_npus(tmp_path):
    """One rank of a pipeline job (a send to rank 5, a receive from it) set up alone: ASTRA-sim runs
    it as two NPUs, where rank 5 does not exist and would never answer (the real ASTRA-sim ends with
    the nodes unreleased). Both workload copies carry the two as GPU compute nodes of their time."""
    _point_to_point_rank(tmp_path / "rank.2.et", [(2, pb.COMM_SEND_NODE, 5), (3, pb.COMM_RECV_NODE, 5)])
    result = CliRunner().invoke(app, ["astra-setup", str(tmp_path / "rank.2.et"), "--astra-bandwidth", "100"])
    assert result.exit_code == 0, result.output
    assert "workload [0, 1]: copies whose send/recv nodes with a peer not linked here are GPU COMP_NODEs" in result.output
    for npu in (0, 1):
        path = tmp_path / "astra" / f"workload.{npu}.et"
        assert not path.is_symlink()
        nodes = list(read_et(path))[1:]
        assert [(n.id, n.type, n.duration_micros) for n in nodes] == [
            (1, pb.COMP_NODE, 5), (2, pb.COMP_NODE, 7), (3, pb.COMP_NODE, 7)]
        assert [[a.int64_val for a in n.attr if a.name == "unpaired_peer"] for n in nodes] == [[], [5], [5]]


def test_single_pair_astra_setup_runs_as_two_npus(tmp_path):
    if not LINEAR.is_dir():
        pytest.skip("shared traces not available")
    runner = CliRunner()
    target = tmp_path / "linear.et"
    result = runner.invoke(app, ["--et-file", str(LINEAR / "et.json.gz"), "--kineto-file",
                                 str(LINEAR / "kineto.json.gz"), "-o", str(target), "-q"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["astra-setup", str(target), "--astra-bandwidth", "100"])
    assert result.exit_code == 0, result.output
    assert "ASTRA-sim network: FullyConnected, 2 NPUs, 100 GB/s, 500 ns" in result.output
    astra = tmp_path / "astra"
    assert [os.readlink(astra / f"workload.{k}.et") for k in (0, 1)] == ["../linear.et", "../linear.et"]
    assert "npus_count: [ 2 ]" in (astra / "network.yml").read_text()
    assert "--comm-group-configuration" not in (astra / "run").read_text()  # no collective, no group
    bad = runner.invoke(app, ["astra-setup", str(target), "--astra-topology", "Torus"])
    assert bad.exit_code == 2 and "unknown --astra-topology 'Torus'" in bad.output


def test_batch_refuses_bad_rank_start_and_network_values_before_any_work(tmp_path):
    runner = CliRunner()
    base = ["batch", "--kineto", str(tmp_path / "none*.json"), "--output-dir", str(tmp_path / "out")]
    for extra, message in ((["--rank-start", "late"], "unknown --rank-start 'late'; choose one of measured, zero"),
                           (["--astra-npus", "1"], "--astra-npus 1: ASTRA-sim needs at least 2 NPUs"),
                           (["--astra-bandwidth", "0"], "--astra-bandwidth 0: must be a positive number of GB/s")):
        result = runner.invoke(app, base + extra)
        assert result.exit_code == 2 and result.output.strip() == f"et-link: error: {message}"
        assert not (tmp_path / "out").exists()


DDP = Path(__file__).resolve().parent / "fixtures" / "ddp_gloo"  # a real 4-rank gloo job (committed)


def _ddp_batch(out: Path, schedule, **options):
    config = BatchConfig(str(DDP / "host.*.json.gz"), str(DDP / "device.*.json.gz"), out, workers=2, **options)
    return run_batch(config, progress_stream=io.StringIO(), interactive=False, schedule=schedule)


@pytest.mark.parametrize("fmt", ["json", "et"])
def test_rank_start_rewrites_come_out_alike_under_both_schedules(tmp_path, fmt):
    """The DDP job's outputs, rewritten for their rank starts (and, as ``.et``, read back for the
    ASTRA-sim setup) in the batch process (serial) or in forked children (forced, two at once): the
    same bytes, offsets, rewritten ranks and setup, and sidecars that describe the rewritten files
    (a rerun skips every rank)."""
    serial = _ddp_batch(tmp_path / "serial", Schedule.serial(), fmt=fmt)
    forced = _ddp_batch(tmp_path / "forced", Schedule.forced(), fmt=fmt)
    assert serial.simulator["rank_start"] == forced.simulator["rank_start"]
    assert len(serial.simulator["rank_start"]["rewritten_ranks"]) >= 2  # else nothing was shared out
    outputs = [Path(r.output).name for r in serial.ranks]
    assert len(outputs) == 4 and all(name.endswith(f".{fmt}") for name in outputs)
    for name in outputs:
        assert (tmp_path / "serial" / name).read_bytes() == (tmp_path / "forced" / name).read_bytes(), name
    if fmt == "et":  # the ASTRA-sim setup, made from the graphs read back (by children when forced)
        assert dict(serial.simulator["astra_sim"], dir=None) == dict(forced.simulator["astra_sim"], dir=None)
        setup = sorted(p.name for p in (tmp_path / "serial" / "astra").iterdir() if p.is_file() and not p.is_symlink())
        assert "network.yml" in setup and "comm_groups.json" in setup
        for name in setup:
            assert (tmp_path / "serial" / "astra" / name).read_bytes() == (tmp_path / "forced" / "astra" / name).read_bytes(), name
    again = _ddp_batch(tmp_path / "forced", Schedule.forced(), fmt=fmt)
    assert all(r.status == "skipped" for r in again.ranks)
    assert again.simulator["rank_start"]["rewritten_ranks"] == []


def test_an_output_that_cannot_be_rewritten_fails_alike_under_both_schedules(tmp_path):
    """A rank whose output is not an ET+ any more: under the forced schedule its child fails there,
    and the batch process, rewriting what the child left, meets the same one-line error."""
    errors = {}
    for name, schedule in (("serial", Schedule.serial()), ("forced", Schedule.forced())):
        out = tmp_path / name
        summary = _ddp_batch(out, Schedule.serial(), rank_start="zero")
        files = [(Path(r.output), r.rank) for r in summary.ranks]
        spans = [tuple(r.measured_span) for r in summary.ranks]
        files[1][0].write_bytes(b'{"nodes": [')  # cut short
        with pytest.raises(TraceInputError) as raised:
            apply_rank_starts(files, spans, {}, "measured", schedule=schedule, processes=2)
        errors[name] = str(raised.value).replace(str(out), "OUT")
        assert str(raised.value).startswith(str(files[1][0]))  # names the file cut short
    assert errors["serial"] == errors["forced"]

"""Whole-job process groups, comm_groups.json and the cross-rank collective check of ``et-link batch``.

Real job: the 8 ``param_dlrm`` ranks (PyTorch 2.0, ET 1.0.1: no process groups recorded), as
linked and with one NCCL kernel removed from one rank's Kineto trace. Hand-made job: 4 ranks in
the ET >= 1.0.3 layout with ``## process_group:init ##``, the world group plus two pair groups,
collectives on both kinds and a send/recv inside each pair.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from conftest import shared_trace
from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import attr_dict, read_et
from linker.cli import app
from linker.model.exit_status import EXIT_COLLECTIVE_MISMATCH
from linker.batch.collectives import (CommOp, RankCollectives, check_job,
                              format_ranks)
from tracetools import load_trace, save_trace

DLRM_RANKS = range(8)


def run_batch_cli(et_glob: str, kineto_glob: str, out: Path, *extra: str):
    return CliRunner().invoke(app, ["batch", "--et", et_glob, "--kineto", kineto_glob,
                                    "--output-dir", str(out), "-q", *extra])


def comm_sequence(path: Path) -> list[tuple]:
    """(type, comm_type, size, pg_name, src, dst) of every COMM node of a .et file, by start time:
    read back from the file, independently of the batch's own record."""
    nodes = list(read_et(path))[1:]
    comms = [n for n in nodes if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]
    comms.sort(key=lambda n: (n.start_time_micros, n.id))
    out = []
    for node in comms:
        a = attr_dict(node)
        out.append((node.type, a.get("comm_type"), a["comm_size"], a["pg_name"], a.get("comm_src"), a.get("comm_dst")))
    return out


# ---------------------------------------------------------------------------------------------
# param_dlrm: 8 real ranks
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm_job(tmp_path_factory):
    directory = shared_trace("param_dlrm", "rank0.et.json.gz").parent
    out = tmp_path_factory.mktemp("dlrm_job")
    result = run_batch_cli(str(directory / "rank*.et.json.gz"), str(directory / "rank*.kineto.json.gz"),
                           out, "--format", "et")
    return out, result


def test_dlrm_job_writes_astra_sim_inputs_and_is_consistent(dlrm_job):
    out, result = dlrm_job
    assert result.exit_code == 0, result.output
    # ASTRA-sim reads <prefix>.<rank>.et: here the prefix is <out>/rank
    assert sorted(p.name for p in out.glob("*.et")) == [f"rank.{r}.et" for r in DLRM_RANKS]
    assert json.loads((out / "comm_groups.json").read_text()) == {"1": list(DLRM_RANKS)}
    summary = json.loads((out / "summary.json").read_text())
    check = summary["collectives"]
    assert check["status"] == "consistent" and check["divergences"] == []
    assert check["comm_groups_file"] == str(out / "comm_groups.json")
    assert [(g["group"], g["ranks_compared"], g["collectives"]) for g in check["groups"]] == [
        ("1", list(DLRM_RANKS), 8)]
    assert ("collectives: consistent across 8 ranks (group 1: 8 collectives on ranks 0-7, matched by sequence number)"
            in result.output)

    # read back from the written files: every rank has the same 8 collectives, all in group "1"
    sequences = {rank: comm_sequence(out / f"rank.{rank}.et") for rank in DLRM_RANKS}
    reference = sequences[0]
    assert len(reference) == 8
    assert {entry[3] for entry in reference} == {"1"}
    assert {entry[1] for entry in reference} == {pb.ALL_TO_ALL, pb.ALL_REDUCE}
    assert all(sequences[rank] == reference for rank in DLRM_RANKS)


def test_dlrm_sidecar_holds_the_rank_sequence(dlrm_job):
    out, _ = dlrm_job
    record = RankCollectives.from_record(orjson.loads((out / "rank4.report.json").read_bytes())["collectives"])
    assert record.groups == {}  # PyTorch 2.0 traces list no process groups
    written = comm_sequence(out / "rank.4.et")
    assert [(pb.CollectiveCommType.Value(op.kind), op.size) for op in record.collectives["1"]] == [
        (entry[1], entry[2]) for entry in written]
    assert all(op.dtype in ("float", "int", "long int") for op in record.collectives["1"])


def _nccl_kernels(kineto: dict) -> list[dict]:
    kernels = [e for e in kineto["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
    return sorted(kernels, key=lambda e: e["ts"])


def test_missing_nccl_kernel_names_rank_group_and_position(tmp_path):
    """Rank 5's Kineto lacks its 4th NCCL kernel: the check names rank 5, group 1, position 3."""
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in DLRM_RANKS:
        for kind in ("et", "kineto"):
            shutil.copy(shared_trace("param_dlrm", f"rank{rank}.{kind}.json.gz"), traces)
    kineto_path = traces / "rank5.kineto.json.gz"
    kineto = load_trace(kineto_path)
    kernels = _nccl_kernels(kineto)
    assert len(kernels) == 8
    dropped, following = kernels[3], kernels[4]
    kineto["traceEvents"] = [e for e in kineto["traceEvents"] if e is not dropped]
    save_trace(kineto, kineto_path)

    out = tmp_path / "out"
    result = run_batch_cli(str(traces / "rank*.et.json.gz"), str(traces / "rank*.kineto.json.gz"), out)
    assert result.exit_code == EXIT_COLLECTIVE_MISMATCH, result.output
    check = json.loads((out / "summary.json").read_text())["collectives"]
    assert check["status"] == "mismatch"
    [divergence] = check["divergences"]
    assert (divergence["group"], divergence["kind"], divergence["position"], divergence["ranks_at_fault"]) == (
        "1", "collective", 3, [5])
    majority, odd = divergence["has"]
    assert majority["ranks"] == [0, 1, 2, 3, 4, 6, 7] and odd["ranks"] == [5]
    # the traces carry sequence numbers (record_param_comms): the check names the one rank 5 lacks,
    # the 4th of the group's (the others have the dropped kernel's all-to-all there)
    assert "AllReduce" in following["name"] and "AllReduce" not in dropped["name"]
    assert majority["has"].startswith("ALL_TO_ALL") and odd["has"].startswith("nothing with sequence number")
    assert check["groups"][0]["matched_by"] == "sequence number"
    assert "group 1, collective #3 (sequence number" in result.output and "-> rank(s) 5" in result.output
    assert not (out / "comm_groups.json").exists()  # --format json: ids appear in no output

    # --allow-mismatch: same report, exit 0; the complete ranks are skipped and their records reused
    again = run_batch_cli(str(traces / "rank*.et.json.gz"), str(traces / "rank*.kineto.json.gz"), out,
                          "--allow-mismatch")
    assert again.exit_code == 0, again.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["skipped"] == 8
    assert summary["collectives"]["divergences"] == check["divergences"]


# ---------------------------------------------------------------------------------------------
# A hand-made job: ET >= 1.0.3 layout, process groups, send/recv
# ---------------------------------------------------------------------------------------------

WORLD = 4
PID, TID = 777, 777
# PyTorch names groups "0", "1", ... in creation order on every rank; a group of all ranks is
# recorded with "ranks": [] and its size. Each rank lists the groups it belongs to.
PYTORCH_GROUPS = {"0": ("default_pg", list(range(WORLD))), "1": ("even", [0, 2]), "2": ("odd", [1, 3])}
KERNEL_ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
KERNEL_SEND_RECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


def pair_group_of(rank: int) -> str:
    return "1" if rank % 2 == 0 else "2"


def _io(values=(), shapes=(), types=()):
    return {"values": list(values), "shapes": list(shapes), "types": list(types), "strides": []}


def _et_node(node_id, name, parent, rf_id, inputs=None):
    attrs = [{"name": "rf_id", "type": "uint64", "value": rf_id},
             {"name": "scope", "type": "uint64", "value": 7 if name.startswith(("#", "nccl:")) else 0},
             {"name": "tid", "type": "uint64", "value": 1 if node_id != 1 else 0},
             {"name": "op_schema", "type": "string", "value": ""}]
    return {"id": node_id, "name": name, "ctrl_deps": parent, "inputs": inputs or _io(), "outputs": _io(),
            "attrs": attrs}


def _tensor(tensor_id: int, numel: int) -> list:
    return [tensor_id, tensor_id + 1, 0, numel, 4, "cuda:0"]


def _comm_ops(first_id: int, kind: str, group: str, numel: int, peer: int = -1) -> list[dict]:
    """c10d::<op> > record_param_comms > nccl:<op>, as PyTorch >= 2.2 records them."""
    tensor = _tensor(100 + first_id, numel)
    c10d_name = {"all_reduce": "c10d::allreduce_", "send": "c10d::send", "recv": "c10d::recv_"}[kind]
    collective = {"all_reduce": "allreduce", "send": "send", "recv": "recv"}[kind]
    pg = [group, PYTORCH_GROUPS[group][0]]
    return [
        _et_node(first_id, c10d_name, 2, first_id, _io([[tensor], "<Object>", peer, 0], [[[numel]], [], [], []],
                                                        ["GenericList[Tensor(float)]", "Object", "Int", "Int"])),
        _et_node(first_id + 1, "record_param_comms", first_id, first_id + 1, _io(
            [[tensor], 1, pg, peer, collective, [], []], [[[numel]], [], [], [], [], [], []],
            ["GenericList[Tensor(float)]", "Int", "Tuple[String,String]", "Int", "String", "GenericList[]",
             "GenericList[]"])),
        _et_node(first_id + 2, f"nccl:{kind}", first_id + 1, first_id + 2,
                 _io([tensor], [[numel]], ["Tensor(float)"])),
    ]


def rank_program(rank: int, recv_numel: int = 10) -> list[tuple]:
    """(kind, PyTorch group, numel, group-local peer) in issue order."""
    group = pair_group_of(rank)
    local = PYTORCH_GROUPS[group][1].index(rank)
    p2p = ("send", group, 10, 1) if local == 0 else ("recv", group, recv_numel, 0)
    return [("all_reduce", "0", 256, -1), ("all_reduce", group, 64, -1), p2p]


def make_rank(rank: int, directory: Path, recv_numel: int = 10) -> None:
    groups = [{"pg_name": name, "pg_desc": desc, "backend_config": "cuda:nccl",
               "ranks": [] if len(ranks) == WORLD else ranks, "group_size": len(ranks), "group_count": 3}
              for name, (desc, ranks) in PYTORCH_GROUPS.items() if rank in ranks]
    nodes = [_et_node(1, "[pytorch|profiler|execution_trace|process]", 1, 0),
             _et_node(2, "[pytorch|profiler|execution_trace|thread]", 1, 0),
             _et_node(3, "## process_group:init ##", 2, 3, _io([json.dumps(groups)], [[]], ["String"]))]
    t0 = 1_700_000_000_000_000
    events = [{"ph": "X", "cat": "user_annotation", "name": "## process_group:init ##", "pid": PID, "tid": TID,
               "ts": t0 + 5, "dur": 1, "args": {"External id": 3, "Record function id": 3}}]
    for k, (kind, group, numel, peer) in enumerate(rank_program(rank, recv_numel)):
        first_id, start = 10 + 10 * k, t0 + 100 * (k + 1)
        ops = _comm_ops(first_id, kind, group, numel, peer)
        nodes += ops
        for depth, op in enumerate(ops):
            events.append({"ph": "X", "cat": "user_annotation" if op["name"].startswith("nccl:") else "cpu_op",
                           "name": op["name"], "pid": PID, "tid": TID, "ts": start + depth, "dur": 40 - 2 * depth,
                           "args": {"External id": op["id"], "Record function id": op["id"]}})
        correlation = 5000 + k
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID,
                       "ts": start + 5, "dur": 3, "args": {"correlation": correlation, "External id": correlation}})
        kernel = KERNEL_ALL_REDUCE if kind == "all_reduce" else KERNEL_SEND_RECV
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 20, "ts": start + 10, "dur": 50,
                       "args": {"device": 0, "stream": 20, "correlation": correlation, "External id": correlation}})
    nodes.append(nodes.pop(0))  # the process root last, as PyTorch >= 2.2 writes it
    et = {"schema": "1.1.1-chakra.0.0.4", "pid": PID, "time": "2025-01-01 00:00:00", "start_ts": 1, "finish_ts": 2,
          "nodes": nodes}
    kineto = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": WORLD},
              "traceEvents": events}
    save_trace(et, directory / f"rank{rank}.et.json.gz")
    save_trace(kineto, directory / f"rank{rank}.kineto.json.gz")


def make_job(directory: Path, recv_numel: int = 10) -> Path:
    for rank in range(WORLD):
        make_rank(rank, directory, recv_numel)
    return directory


def test_hand_made_job_group_ids_and_peers_are_global(tmp_path):
    traces = make_job(tmp_path / "traces")
    out = tmp_path / "out"
    result = run_batch_cli(str(traces / "rank*.et.json.gz"), str(traces / "rank*.kineto.json.gz"), out,
                           "--format", "et")
    assert result.exit_code == 0, result.output
    # job ids = PyTorch names + 1; the world group (recorded as ranks []) is all 4 ranks
    assert json.loads((out / "comm_groups.json").read_text()) == {"1": [0, 1, 2, 3], "2": [0, 2], "3": [1, 3]}
    pair_id = {0: "2", 2: "2", 1: "3", 3: "3"}
    expected_p2p = {0: (pb.COMM_SEND_NODE, 0, 2), 2: (pb.COMM_RECV_NODE, 0, 2),
                    1: (pb.COMM_SEND_NODE, 1, 3), 3: (pb.COMM_RECV_NODE, 1, 3)}
    for rank in range(WORLD):
        sequence = comm_sequence(out / f"rank.{rank}.et")
        assert [(entry[0], entry[1], entry[2], entry[3]) for entry in sequence[:2]] == [
            (pb.COMM_COLL_NODE, pb.ALL_REDUCE, 1024, "1"), (pb.COMM_COLL_NODE, pb.ALL_REDUCE, 256, pair_id[rank])]
        # send/recv: in the pair group, peers written as global ranks (group-local 1 of "odd" is 3)
        node_type, size, pg, src, dst = (sequence[2][0], sequence[2][2], sequence[2][3], sequence[2][4], sequence[2][5])
        assert (node_type, src, dst) == expected_p2p[rank] and (size, pg) == (40, pair_id[rank])
    check = json.loads((out / "summary.json").read_text())["collectives"]
    assert check["status"] == "consistent" and check["divergences"] == []
    assert [(g["group"], g["ranks"], g["collectives"], g["point_to_point"]) for g in check["groups"]] == [
        ("1", [0, 1, 2, 3], 1, 0), ("2", [0, 2], 1, 2), ("3", [1, 3], 1, 2)]


def test_hand_made_job_receive_of_the_wrong_size_is_named(tmp_path):
    traces = make_job(tmp_path / "traces", recv_numel=12)  # ranks 2 and 3 receive 48 B, senders send 40 B
    out = tmp_path / "out"
    result = run_batch_cli(str(traces / "rank*.et.json.gz"), str(traces / "rank*.kineto.json.gz"), out)
    assert result.exit_code == EXIT_COLLECTIVE_MISMATCH, result.output
    check = json.loads((out / "summary.json").read_text())["collectives"]
    assert [(d["group"], d["kind"], d["position"], d["ranks_at_fault"]) for d in check["divergences"]] == [
        ("2", "point-to-point", 0, [0, 2]), ("3", "point-to-point", 0, [1, 3])]
    assert check["divergences"][1]["has"] == [{"ranks": [1], "has": "SEND 40 B float to rank 3"},
                                              {"ranks": [3], "has": "RECV 48 B float from rank 1"}]
    assert [g["status"] for g in check["groups"]] == ["consistent", "mismatch", "mismatch"]


# ---------------------------------------------------------------------------------------------
# The comparison on records (membership problems the traces above cannot show)
# ---------------------------------------------------------------------------------------------


def _sidecars(tmp_path: Path, records: dict[int, RankCollectives]) -> dict[int, str]:
    paths = {}
    for rank, record in records.items():
        path = tmp_path / f"rank{rank}.report.json"
        path.write_bytes(orjson.dumps({"collectives": record.to_record()}))
        paths[rank] = str(path)
    return paths


def test_member_lists_that_disagree_and_ops_on_a_foreign_group(tmp_path):
    op = CommOp("ALL_REDUCE", 64, "float")
    records = {0: RankCollectives({"2": [0, 1]}, {"2": [op]}),
               1: RankCollectives({"2": [0, 1, 2]}, {"2": [op]}),
               2: RankCollectives({}, {}, {"2": [CommOp("SEND", 8, None, 0)]})}
    check = check_job(_sidecars(tmp_path, records), [0, 1, 2], 3)
    kinds = [(d.group, d.kind, d.ranks_at_fault) for d in check.divergences]
    assert ("2", "membership", [1]) in kinds  # rank 1 lists other members than rank 0
    assert ("2", "membership", [2]) in kinds  # rank 2 uses group 2 but rank 0's list excludes it
    assert check.mismatch


def test_failed_rank_is_not_compared_and_a_short_sequence_is_found(tmp_path):
    a, b = CommOp("ALL_REDUCE", 64, "float"), CommOp("ALL_GATHER", 32, None)
    records = {0: RankCollectives({}, {"1": [a, b]}), 1: RankCollectives({}, {"1": [a, b]}),
               2: RankCollectives({}, {"1": [a]})}
    paths = _sidecars(tmp_path, records) | {3: str(tmp_path / "missing.json")}
    check = check_job(paths, [0, 1, 2, 3], 4, tmp_path / "comm_groups.json")
    assert check.ranks_without_record == [3]
    [divergence] = check.divergences
    assert (divergence.position, divergence.ranks_at_fault) == (1, [2])
    assert divergence.has[1].has == "nothing: its collectives end after 1"
    assert json.loads((tmp_path / "comm_groups.json").read_text()) == {"1": [0, 1, 2, 3]}
    # a dtype one rank does not know is not a difference
    records[2] = RankCollectives({}, {"1": [a, CommOp("ALL_GATHER", 32, "float")]})
    assert check_job(_sidecars(tmp_path, records), [0, 1, 2], 3).status == "consistent"


def test_format_ranks():
    assert format_ranks([7, 0, 1, 2, 5, 3, 9, 8]) == "0-3,5,7-9"


def test_partial_job_and_unwritable_comm_groups_file_are_notes(tmp_path):
    op = CommOp("ALL_REDUCE", 64, "float")
    records = {0: RankCollectives({}, {"1": [op]}), 1: RankCollectives({}, {"1": [op]})}
    target = tmp_path / "no_such_dir" / "comm_groups.json"
    check = check_job(_sidecars(tmp_path, records), [0, 1], 4, target)  # world size 4, ranks 0-1 given
    assert check.status == "consistent" and check.comm_groups_file is None and not target.exists()
    assert any(note.startswith(f"{target} not written") for note in check.notes)
    assert "group 1: member rank(s) 2-3 have no record here, not compared" in check.notes
    assert check.groups[0].ranks == [0, 1, 2, 3] and check.groups[0].ranks_compared == [0, 1]


def test_printed_check_stays_short_for_many_groups(tmp_path):
    from linker.batch.collectives import format_check

    op = CommOp("ALL_GATHER", 16, "half")
    records = {r: RankCollectives({str(g): [0, 1] for g in range(2, 8)}, {str(g): [op] for g in range(1, 8)})
               for r in (0, 1)}
    check = check_job(_sidecars(tmp_path, records), [0, 1], 2)
    assert check.status == "consistent" and len(check.groups) == 7
    [line] = format_check(check)
    assert line == ("collectives: consistent across 2 ranks (group 1: 1 collectives on ranks 0-1, group 2: 1 "
                    "collectives on ranks 0-1, group 3: 1 collectives on ranks 0-1, group 4: 1 collectives on "
                    "ranks 0-1, 3 more groups)")

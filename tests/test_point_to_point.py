"""A CPU backend's sends and receives (a pipeline's stages over gloo): communication nodes busy for
their record, the issuing thread's wait for each a blocked stretch of the op it sat in, and the
op after it joined to the transfer (docs/durations.md, "Sends and receives").

Fixture (a real capture, ``tests/fixtures/README.md``): ``pipeline_gloo``, two stages of an MLP
on two ranks, blocking ``dist.send`` / ``dist.recv`` each step. gloo records ``gloo:send`` /
``gloo:recv`` on the issuing thread from the call until the ``work.wait()`` that saw the transfer
done (no record function of its own). Expected values are read from the Kineto files with plain
code."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import FIXTURES, assert_no_contradicted_edge_nor_moved_time, job_reports, linked_rank
from linker.pipeline import link_pair
from linker.sim.cli_run import SimulateOptions, run_simulate

PIPELINE = FIXTURES / "pipeline_gloo"
RANKS = (0, 1)
BATCH, WIDTH = 32, 256  # the capture's --batch and --width: one float32 activation per message
TRANSFERS = ("gloo:send", "gloo:recv")


def _kineto_ops(rank: int) -> list[dict]:
    events = json.loads(gzip.decompress((PIPELINE / f"device.{rank}.json.gz").read_bytes()))["traceEvents"]
    return sorted((e for e in events if e.get("ph") == "X" and "Record function id" in e.get("args", {})),
                  key=lambda e: e["ts"])


def _linked(tmp_path, rank: int, suffix: str = ".json"):
    return linked_rank(tmp_path, PIPELINE, rank, suffix)


def _nodes(path) -> list[dict]:
    return json.loads(path.read_bytes())["nodes"]


def _rf_id(node: dict) -> int | None:
    for attr in node.get("attrs", []):
        if attr["name"] == "rf_id":
            return attr["value"]
    return None


def _expected_waits(ops: list[dict]) -> list[tuple[dict, float, float]]:
    """(record, wait µs, start of the thread's next op) per transfer record seen done while its
    thread sat idle: from the thread's last activity (the latest end among its other ops, at the
    earliest the record's start) to the record's end; the next op starts at or after that end."""
    others = [e for e in ops if e["name"] not in TRANSFERS]
    found = []
    for record in (e for e in ops if e["name"] in TRANSFERS):
        end = record["ts"] + record["dur"]
        running = [e for e in others if e["ts"] < end < e["ts"] + e["dur"] and e["tid"] == record["tid"]
                   and not e["name"].startswith("ProfilerStep")]
        if running:  # the thread was busy when the transfer was seen done: no wait
            continue
        last = max([e["ts"] + e["dur"] for e in others if e["tid"] == record["tid"] and e["ts"] + e["dur"] <= end
                    and not e["name"].startswith("ProfilerStep")] + [record["ts"]])
        following = min(e["ts"] for e in others if e["tid"] == record["tid"] and e["ts"] >= end)
        found.append((record, end - last, following))
    return found


@pytest.mark.parametrize("rank", RANKS)
def test_sends_and_receives_are_communication_nodes_busy_for_their_record(tmp_path, rank):
    """Each ``gloo:send`` / ``gloo:recv`` is a send or receive of the activation's bytes to or from
    the other stage, busy for its whole measured record, a send from the start of its
    ``c10d::send`` call (gloo writes the bytes before it makes the record; nothing else ran in the
    call first), whose time before the record is then blocked (before: a CPU op of the ~20 µs of
    its record inside the call, the call's time its busy time)."""
    ops = _kineto_ops(rank)
    records = {e["args"]["Record function id"]: e for e in ops if e["name"] in TRANSFERS}
    nodes = [n for n in _nodes(_linked(tmp_path, rank)) if n["name"] in TRANSFERS and "continues" not in n]
    assert len(nodes) == len(records) == 8  # a send and a receive a step, 4 steps
    by_rf = {_rf_id(n): n for n in _nodes(_linked(tmp_path, rank)) if "continues" not in n}
    peer = 1 - rank
    for node in nodes:
        record = records[_rf_id(node)]
        start = record["ts"]
        if node["name"] == "gloo:send":
            call = max((e for e in ops if e["name"] == "c10d::send" and e["ts"] <= record["ts"]), key=lambda e: e["ts"])
            assert not [e for e in ops if call["ts"] < e["ts"] < record["ts"]]
            start = call["ts"]
            assert by_rf[call["args"]["Record function id"]]["blocked_dur"] == pytest.approx(record["ts"] - call["ts"],
                                                                                            abs=1e-3)
        assert node["sim_dur"] == pytest.approx(record["ts"] + record["dur"] - start, abs=1e-3)
        assert node["comm_size"] == BATCH * WIDTH * 4
        src, dst = (rank, peer) if node["name"] == "gloo:send" else (peer, rank)
        assert (node["comm_src"], node["comm_dst"], node["comm_tag"]) == (src, dst, 0)


@pytest.mark.parametrize("rank", RANKS)
def test_the_wait_for_a_transfer_is_blocked_time_and_the_next_op_joins_it(tmp_path, rank):
    """The thread's idle time until each record ended is blocked time of the step it sat in (the
    ``ProfilerStep``: before, its busy time, ~5 ms a step), and the transfer has one ``join`` edge,
    to where the thread went on: the step's part after the wait (a node continuing it, starting at
    the record's end) or the thread's next op."""
    ops = _kineto_ops(rank)
    waits = _expected_waits(ops)
    assert sum(w for _, w, _ in waits) > 10_000  # the stages wait for each other for milliseconds
    nodes = _nodes(_linked(tmp_path, rank))
    by_rf = {_rf_id(n): n for n in nodes if "continues" not in n}
    steps = [e for e in ops if e["name"].startswith("ProfilerStep")]
    for step in steps:
        inside = [w for record, w, _ in waits if step["ts"] <= record["ts"] < step["ts"] + step["dur"]]
        node = by_rf[step["args"]["Record function id"]]
        assert node.get("blocked_dur", 0) == pytest.approx(sum(inside), abs=1.0)
    joined = {}
    for node in nodes:
        for source, cause in zip(node.get("data_deps", []), node.get("data_dep_causes", [])):
            if cause == "join":
                joined.setdefault(source, []).append(node)
    for record, _, following in waits:
        node = by_rf[record["args"]["Record function id"]]
        targets = joined.get(node["id"], [])
        end = record["ts"] + record["dur"]
        assert len(targets) == 1, targets
        target = targets[0]
        if "continues" in target:
            assert target["ts"] == pytest.approx(end, abs=1.0)
        else:
            assert target["ts"] == pytest.approx(following, abs=1e-3)


@pytest.mark.parametrize("model", ("astra-sim", "lanes"))
def test_the_job_replays_its_span_and_its_path_names_the_stages_work(tmp_path, model):
    """The two stages replayed together, from JSON and from ``.et``: the span as measured (±1%),
    each receive waiting for the other stage's send, and the critical path through both stages'
    compute and transfers, not a step's wait (before: the steps' waits were their busy time, and
    the path's top op a ``ProfilerStep``)."""
    reports = job_reports(tmp_path, PIPELINE, RANKS, model)
    ratios = [report["ratio"] for report in reports]
    for report in reports:
        assert report["peer_wait_us"] > 10_000
        path = report["critical_path"]
        assert not any(op["name"].startswith("ProfilerStep") for op in path[:3]), path[:3]
        assert {"aten::mm", "aten::addmm"} <= {op["name"] for op in path[:5]}, path[:5]
    assert ratios[0] == pytest.approx(1.0, abs=0.01) and ratios[1] == pytest.approx(ratios[0], rel=0.005)


def test_no_dependency_contradicts_the_measured_timeline_and_no_time_moves(tmp_path):
    """``scripts/order_check.py`` finds no contradicted edge and ``scripts/attribution.py`` no CPU
    time on another op, on both ranks (JSON)."""
    assert_no_contradicted_edge_nor_moved_time([_linked(tmp_path, rank) for rank in RANKS])


def test_astra_copies_write_each_transfer_as_a_meeting_then_the_ranks_own_time(tmp_path):
    """In the ASTRA-sim workload copies each send and receive is a 1-byte send or receive of the
    same peers (the receiving stage cannot go on before the other issued its send), then, under the
    transfer's id, timed work off the CPU; the new nodes' ids are taken by no other node, the rank
    start delay node's included (a job whose only CPU communication is sends and receives was not
    read again with its delay nodes, and the new nodes took the delay node's id: ASTRA-sim then
    stopped with "No dependancy free nodes found"). Replayed again, the copies give what the job's
    files give."""
    import io

    import linker
    from linker.batch import BatchConfig, run_batch
    from linker.model import et_def_pb2 as pb
    from linker.write.chakra_wire import get_attr, iter_frames

    out = tmp_path / "job"
    run_batch(BatchConfig(str(PIPELINE / "host.*.json.gz"), str(PIPELINE / "device.*.json.gz"), out, fmt="et"),
              progress_stream=io.StringIO(), interactive=False)
    for rank in RANKS:
        transfers = {n["id"]: n["name"] for n in _nodes(_linked(tmp_path, rank)) if n["name"] in TRANSFERS}
        nodes = [pb.Node.FromString(f.payload) for f in iter_frames(out / "astra" / f"workload.{rank}.et") if f.index]
        by_id = {node.id: node for node in nodes}
        assert len(by_id) == len(nodes)  # no id written twice
        for node_id, name in transfers.items():
            timed = by_id[node_id]
            assert timed.type == pb.COMP_NODE and get_attr(timed, "is_cpu_op") is False
            meeting = by_id[timed.data_deps[0]]
            kind, peer_field = ((pb.COMM_SEND_NODE, "comm_dst") if name == "gloo:send"
                                else (pb.COMM_RECV_NODE, "comm_src"))
            assert meeting.type == kind and meeting.id not in transfers
            assert get_attr(meeting, peer_field) == 1 - rank and get_attr(meeting, "comm_size") == 1
    job = linker.simulate([out / f"rank.{rank}.et" for rank in RANKS], rank_start="measured").report
    copies = linker.simulate([out / "astra" / f"workload.{rank}.et" for rank in RANKS],
                             comm_groups=out / "astra" / "comm_groups.json").report
    assert [r.simulated_us for r in copies.ranks] == pytest.approx([r.simulated_us for r in job.ranks], abs=2.0)


def test_a_send_in_a_job_with_other_groups_stays_a_cpu_op(tmp_path):
    """gloo names no process group on a send's record, and the peer argument is a rank of the
    group it was sent in: in a job that had a group besides the world (``group_count`` 2 in
    ``## process_group:init ##``, here written into the fixture's ET) the peer's global rank is
    unknown, so the send or receive stays a CPU op, on every rank alike (each rank's trace counts
    every group), rather than name a peer that may be wrong."""
    host = _with_groups(PIPELINE / "host.0.json.gz", tmp_path, 2)
    out, report = tmp_path / "out.json", tmp_path / "report.json"
    link_pair(host, PIPELINE / "device.0.json.gz", out, report_path=report)
    nodes = [n for n in _nodes(out) if n["name"] in TRANSFERS and "continues" not in n]
    assert len(nodes) == 8 and not any("comm_size" in n or "comm_src" in n for n in nodes)
    warnings = json.loads(report.read_text())["warnings"]
    assert any(w.startswith("8 CPU sends and receives name no process group and the job had 2") for w in warnings)


def test_collectives_of_a_job_with_other_groups_are_reported_as_taken_for_the_worlds(tmp_path):
    """gloo names no group on a collective's record either: in a job with other groups each is
    taken as the world group's (as before), and the report says how many, so that a user knows the
    cross-rank matching of another group's collectives is not to be trusted (the 4-rank DDP
    fixture, its ``group_count`` written as 3)."""
    ddp = FIXTURES / "ddp_gloo"
    events = json.loads(gzip.decompress((ddp / "device.0.json.gz").read_bytes()))["traceEvents"]
    expected = sum(1 for e in events if e.get("name") == "gloo:all_reduce")
    report = tmp_path / "report.json"
    link_pair(_with_groups(ddp / "host.0.json.gz", tmp_path, 3), ddp / "device.0.json.gz", tmp_path / "out.json",
              report_path=report)
    warnings = json.loads(report.read_text())["warnings"]
    assert expected == 10 and any(w.startswith(f"{expected} CPU collectives name no process group (gloo records none) "
                                               "and the job had 3")
                                  for w in warnings), warnings
    plain = tmp_path / "plain.json"
    link_pair(ddp / "host.0.json.gz", ddp / "device.0.json.gz", tmp_path / "out2.json", report_path=plain)
    assert not any("process group" in w for w in json.loads(plain.read_text())["warnings"])


def test_a_record_outliving_its_call_is_no_sign_of_a_wrong_link(tmp_path):
    """Each send's and receive's record ends after its ``c10d`` call (in the wait); the report no
    longer counts them as linked ops outside their parent ("a sign of wrong links"): before, 8 per
    rank."""
    report = tmp_path / "report.json"
    link_pair(PIPELINE / "host.0.json.gz", PIPELINE / "device.0.json.gz", tmp_path / "out.json", report_path=report)
    ops = _kineto_ops(0)
    calls = {e["args"]["Record function id"]: e for e in ops if e["name"] in ("c10d::send", "c10d::recv_")}
    outliving = [e for e in ops if e["name"] in TRANSFERS
                 and e["ts"] + e["dur"] > max(c["ts"] + c["dur"] for c in calls.values() if c["ts"] <= e["ts"])]
    assert len(outliving) == 8
    data = json.loads(report.read_text())
    assert data["nesting_violations"] == 0 and not any("wrong links" in w for w in data["warnings"])


def _with_groups(path, tmp_path, count: int):
    """A copy of the ET at ``path`` whose ``## process_group:init ##`` says the job had ``count``
    process groups."""
    et = json.loads(gzip.decompress(path.read_bytes()))
    edited = 0
    for node in et["nodes"]:
        if node["name"] == "## process_group:init ##":
            groups = json.loads(node["inputs"]["values"][0])
            for group in groups:
                group["group_count"] = count
            node["inputs"]["values"][0] = json.dumps(groups)
            edited += 1
    assert edited
    host = tmp_path / f"groups_{count}_{path.name}".removesuffix(".gz")
    host.write_text(json.dumps(et))
    return host


def test_a_network_what_if_moves_each_transfer_by_its_bytes_over_the_rate(tmp_path):
    """``simulate --network`` re-times transfers: a transfer of S bytes takes S / rate on the given
    link (latency 0 given), held by its receive (a gloo send returns once its bytes are buffered:
    it keeps its measured time). Each stage waits for every transfer of the step, so halving the
    rate from 100 to 50 Mbit/s adds S / rate more for each of the 8 transfers of the 4 steps:
    8 x 32,768 B x (1 / 6.25e6 - 1 / 12.5e6) s/B = 20,971.52 µs to the job's span (before: no
    transfer re-timed, the span the same at every rate)."""
    size = BATCH * WIDTH * 4
    paths = [_linked(tmp_path, rank) for rank in RANKS]
    spans = []
    for rate, bytes_per_s in (("100Mbit/s", 12.5e6), ("50Mbit/s", 6.25e6)):
        text, finished = run_simulate(SimulateOptions(paths, json_output=True, network=f"bandwidth={rate},latency=0us"))
        assert finished
        report = json.loads(text)
        spans.append(report["simulated_us"])
        rows = {row["comm_type"]: row for row in report["network"]["by_collective"]}
        assert set(rows) == {"RECV"} and report["network"]["retimed_collectives"] == 8
        for row in rows.values():
            assert row["count"] == 8 and row["bytes"] == size
            assert row["what_if_network_us"] == pytest.approx(8 * size / bytes_per_s * 1e6)
    assert spans[1] - spans[0] == pytest.approx(8 * size * (1 / 6.25e6 - 1 / 12.5e6) * 1e6, rel=1e-6)

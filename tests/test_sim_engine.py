"""Replay semantics on small graphs written as real .et files; every expected time is computed by hand
in the comments."""

from __future__ import annotations

import orjson
import pytest

from linker.model import et_def_pb2 as pb
from linker.sim.engine import ASTRA_SIM, BY_READY, LANES, Scale, measured_release, replay
from linker.sim.load import load_graph
from linker.sim.report import build_report
from linker.write.chakra_wire import make_attr
from sim_graphs import coll, cpu, cpu_coll, gpu, recv, send, write_et


def simulate(tmp_path, ranks: dict, model=ASTRA_SIM, scale=Scale(), groups=None):
    graphs = [load_graph(write_et(tmp_path / f"rank{r}.et", specs), r) for r, specs in sorted(ranks.items())]
    result = replay(graphs, model, scale, groups)
    report, path, diagnosis = build_report(result)
    return result, report, path, diagnosis


def node_times(result, rank_position: int, node_id: int) -> tuple[float, float]:
    graph = result.graphs[rank_position]
    u = result.offsets[rank_position] + list(graph.ids).index(node_id)
    return result.start[u], result.end[u]


# A(10) -> B(20) -> C(5) on thread 1, D(7) alone on thread 2; A measured before D.
SERIAL = [cpu(1, 10, start=100), cpu(2, 20, [1], start=110), cpu(3, 5, [2], start=130),
          cpu(4, 7, tid=2, start=105)]


def test_serial_cpu_one_op_at_a_time_under_astra_sim(tmp_path):
    # ASTRA-sim issues the ready node with the smallest id: A 0-10 (ids 1 and 4 ready at 0);
    # B 10-30 (ready at 10, id 2 before D's 4, ready since 0); C 30-35 (id 3); D 35-42.
    result, report, path, _ = simulate(tmp_path, {0: SERIAL})
    assert report.simulated_us == 42
    assert [node_times(result, 0, i) for i in (1, 2, 3, 4)] == [(0, 10), (10, 30), (30, 35), (35, 42)]
    assert report.busy_us["cpu"] == 42 and report.finished and report.never_issued == 0
    # The path tiles the replay: A, B and C (each after its dependency), D (waited for the CPU).
    assert [result.graphs[0].ids[s.node] for s in path] == [1, 2, 3, 4]
    assert [s.via for s in path] == ["start", "dependency", "dependency", "unit"]
    assert sum(s.end - s.start for s in path) == 42


def test_serial_cpu_by_ready_time_when_asked(tmp_path):
    # Issued by ready time instead: A 0-10 (measured before D); D 10-17 (ready since 0, before B
    # ready at 10); B 17-37; C 37-42.
    graphs = [load_graph(write_et(tmp_path / "rank0.et", SERIAL), 0)]
    result = replay(graphs, ASTRA_SIM, issue_order=BY_READY)
    assert [node_times(result, 0, i) for i in (1, 4, 2, 3)] == [(0, 10), (10, 17), (17, 37), (37, 42)]


def test_serial_cpu_threads_overlap_under_lanes(tmp_path):
    # thread 1: A 0-10, B 10-30, C 30-35; thread 2: D 0-7.
    result, report, _, _ = simulate(tmp_path, {0: SERIAL}, model=LANES)
    assert report.simulated_us == 35
    assert node_times(result, 0, 4) == (0, 7)
    assert {u.unit: u.busy_us for u in report.busy_by_unit} == {"cpu thread 1": 35, "cpu thread 2": 7}


# A(10) launches K1 (stream 7) and K2 (stream 8), 30 each; B(10) follows A on the CPU;
# S(1) synchronizes: it waits for B and both kernels.
OVERLAP = [cpu(1, 10, start=0), gpu(2, 30, [1], stream=7, start=5), gpu(3, 30, [1], stream=8, start=6),
           cpu(4, 10, [1], start=10), cpu(5, 1, [4, 2, 3], start=60)]


def test_cpu_and_gpu_overlap_but_one_gpu_op_at_a_time_under_astra_sim(tmp_path):
    # A 0-10; K1 10-40 (measured before K2), K2 40-70; B 10-20 overlaps K1; S 70-71.
    result, report, _, _ = simulate(tmp_path, {0: OVERLAP})
    assert report.simulated_us == 71
    assert [node_times(result, 0, i) for i in (2, 3, 4, 5)] == [(10, 40), (40, 70), (10, 20), (70, 71)]
    assert report.busy_us == {"cpu": 21, "gpu": 60, "comm": 0}


def test_two_streams_run_together_under_lanes(tmp_path):
    # K1, K2 both 10-40 on their own streams; S 40-41.
    result, report, _, _ = simulate(tmp_path, {0: OVERLAP}, model=LANES)
    assert report.simulated_us == 41
    assert node_times(result, 0, 3) == (10, 40)


def test_ctrl_dependency_waits_for_the_parent_to_finish(tmp_path):
    # Parent P(10) with child C(4) (ctrl dep only): C starts when P ends, whatever the model.
    specs = [cpu(1, 10), cpu(2, 4, ctrl=[1])]
    for model in (ASTRA_SIM, LANES):
        result, report, _, _ = simulate(tmp_path, {0: specs}, model=model)
        assert node_times(result, 0, 2) == (10, 14)


def test_astra_sim_issues_the_smallest_ready_id_lanes_the_earlier_measured_start(tmp_path):
    # Three nodes ready at 0 on the CPU, measured starts 50, 20, 20. ASTRA-sim's workload layer walks
    # the ready ids in ascending order: 1, 2, 3. By ready time (lanes, one thread): id 2 and id 3
    # (start 20, by id), then id 1.
    specs = [cpu(1, 1, start=50), cpu(2, 1, start=20), cpu(3, 1, start=20)]
    result, _, _, _ = simulate(tmp_path, {0: specs})
    assert [node_times(result, 0, i)[0] for i in (1, 2, 3)] == [0, 1, 2]
    result, _, _, _ = simulate(tmp_path, {0: specs}, model=LANES)
    assert [node_times(result, 0, i)[0] for i in (2, 3, 1)] == [0, 1, 2]


def test_metadata_nodes_take_no_time(tmp_path):
    specs = [cpu(1, 10), cpu(3, 5, [2])]
    meta = cpu(2, 99, [1])
    meta.type = pb.METADATA_NODE
    result, report, _, _ = simulate(tmp_path, {0: [specs[0], meta, specs[1]]})
    assert node_times(result, 0, 2) == (10, 10)
    assert report.simulated_us == 15


def two_rank_collective():
    # rank 0: A(10) then a collective measured 50 us (it waited 20 for rank 1);
    # rank 1: A(30) then the same collective measured 30 us (arrived last: the transfer alone).
    return {0: [cpu(1, 10, start=1000), coll(2, 50, [1], start=1010)],
            1: [cpu(1, 30, start=5000), coll(2, 30, [1], start=5030)]}


def test_collective_starts_when_the_slowest_rank_arrives_and_lasts_the_transfer(tmp_path):
    # Transfer = min(50, 30) = 30; starts at 30 (rank 1 arrives), ends at 60 on both ranks.
    result, report, path, _ = simulate(tmp_path, two_rank_collective())
    assert node_times(result, 0, 2) == (30, 60) and node_times(result, 1, 2) == (30, 60)
    assert result.issue[result.offsets[0] + 1] == 10  # rank 0 held its comm unit from 10
    assert report.simulated_us == 60 and report.measured_us == 60 and report.ratio == 1.0
    assert [r.simulated_us for r in report.ranks] == [60, 60]
    assert report.peer_wait_us == 20
    assert report.busy_us["comm"] == 60  # 30 per rank
    # Critical path: rank 1's A (0-30), then the collective (30-60), ending on the last rank's node.
    assert [(result.rank_of(s.node), s.start, s.end, s.via) for s in path] == [
        (1, 0, 30, "start"), (1, 30, 60, "dependency")]
    # Seen from rank 0, its collective waited for rank 1 (a peer).
    u = result.offsets[0] + 1
    assert result.cause_kind[u] == 3 and result.rank_of(result.peer[u]) == 1
    assert sum(s.end - s.start for s in path) == 60


def test_cpu_collective_ends_on_each_rank_its_own_measured_time_after_the_last_arrival(tmp_path):
    # One clock: both ranks start at 1000. Rank 0: A(10), its gloo collective 1010-1060; rank 1:
    # A(30), its collective 1030-1075 (it arrived last, at 1030). Each rank's worker finished its
    # own part: rank 0 30 us after the last arrival, rank 1 45 us after it. Replayed from 0: the
    # collective starts at 30 (rank 1's arrival); rank 0's ends at 30 + 30 = 60, rank 1's at 75,
    # as measured (60 and 75 after the origin).
    ranks = {0: [cpu(1, 10, start=1000), cpu_coll(2, 50, [1], start=1010)],
             1: [cpu(1, 30, start=1000), cpu_coll(2, 45, [1], start=1030)]}
    graphs = [load_graph(write_et(tmp_path / f"rank{r}.et", specs), r) for r, specs in ranks.items()]
    result = replay(graphs, ASTRA_SIM, release=measured_release(graphs))
    assert node_times(result, 0, 2) == (30, 60) and node_times(result, 1, 2) == (30, 75)
    report = build_report(result)[0]
    assert [r.end_ratio for r in report.ranks] == [1.0, 1.0]
    # Halving the communication halves each rank's own part: 30 + 15, 30 + 22.5.
    result = replay(graphs, ASTRA_SIM, Scale(comm=0.5), release=measured_release(graphs))
    assert node_times(result, 0, 2) == (30, 45) and node_times(result, 1, 2) == (30, 52.5)
    # GPU collectives keep one transfer for all members (the shortest: the last arrival's).
    ranks = {0: [cpu(1, 10, start=1000), coll(2, 50, [1], start=1010)],
             1: [cpu(1, 30, start=1000), coll(2, 45, [1], start=1030)]}
    graphs = [load_graph(write_et(tmp_path / f"gpu{r}.et", specs), r) for r, specs in ranks.items()]
    result = replay(graphs, ASTRA_SIM, release=measured_release(graphs))
    assert node_times(result, 0, 2) == (30, 75) and node_times(result, 1, 2) == (30, 75)


def test_cpu_collective_starts_as_late_after_its_dependencies_as_its_worker_picked_it_up(tmp_path):
    # One rank: A(10) measured 1000-1010, its gloo collective (30 us) measured from 1025: the
    # worker took it 15 us after A ended. Replayed: A 0-10, the collective 25-55.
    result, report, _, _ = simulate(tmp_path, {0: [cpu(1, 10, start=1000), cpu_coll(2, 30, [1], start=1025)]})
    assert node_times(result, 0, 2) == (25, 55) and report.simulated_us == 55
    # A job on one clock: rank 1 issues at 30 but its worker took it 40 us later (measured 1070):
    # it arrives at 70, last; rank 0 (issued and arrived at 10, measured 1010) waited 60 of its 80.
    ranks = {0: [cpu(1, 10, start=1000), cpu_coll(2, 80, [1], start=1010)],
             1: [cpu(1, 30, start=1000), cpu_coll(2, 20, [1], start=1070)]}
    graphs = [load_graph(write_et(tmp_path / f"job{r}.et", specs), r) for r, specs in ranks.items()]
    result = replay(graphs, ASTRA_SIM, Scale(comm=0), release=measured_release(graphs))
    # the pickup is the host's time, not communication: it stays under --scale comm=0
    assert node_times(result, 0, 2) == (70, 70) and node_times(result, 1, 2) == (70, 70)
    result = replay(graphs, ASTRA_SIM, release=measured_release(graphs))
    assert node_times(result, 0, 2) == (70, 90) and node_times(result, 1, 2) == (70, 90)
    assert result.issue[result.offsets[1] + 1] == 30  # it held its rank's communication unit from its issue


def _ran_under(node_id, measured, deps, start, tid):
    """A gloo collective that ended while the group's earlier one still ran: busy 0 in the file
    (``plan.cpu_comm``: its part after the earlier one ended is empty), ``measured`` us long."""
    spec = cpu_coll(node_id, 0, deps, start=start, tid=tid)
    spec.attrs.append(make_attr("inclusive_dur_micros", measured))
    return spec


def test_a_cpu_collective_that_ran_under_the_previous_one_ends_where_it_ended(tmp_path):
    # A(10) measured 1000-1010 issues C1 (40 us, worker 2, 1010-1050) and C2 (worker 3, measured
    # 1015-1035: it ended under C1, so no edge from C1 and no busy time). C2's busy part, empty,
    # lies at its measured end: it is picked up 1035 - 1010 = 25 us after A ended.
    graph = [cpu(1, 10, start=1000), cpu_coll(2, 40, [1], start=1010, tid=2), _ran_under(3, 20, [1], 1015, 3)]
    result, _, _, _ = simulate(tmp_path, {0: graph}, model=LANES)
    # lanes: C1 10-50 on worker 2, C2 ends at 35 on worker 3 (before: at 15, its measured start)
    assert node_times(result, 0, 2) == (10, 50) and node_times(result, 0, 3) == (35, 35)
    # astra-sim: one communication unit; C2 is ready at 10, waits for C1 until 50, and its pickup
    # (ready + 25 = 35) has passed by then: it runs at 50, not 25 us after the unit freed (75).
    result, _, _, _ = simulate(tmp_path, {0: graph})
    assert node_times(result, 0, 2) == (10, 50) and node_times(result, 0, 3) == (50, 50)
    # Its reader R began at 1030, before the worker closed C2's record at 1035: the result was
    # there at 1030, so C2 ends at 30 under lanes (picked up 20 us after A) and R runs 30-35.
    graph += [cpu(4, 5, [1, 3], start=1030)]
    graph[3].attrs.append(make_attr("data_dep_causes", ["thread_order", "join"]))
    result, _, _, _ = simulate(tmp_path, {0: graph}, model=LANES)
    assert node_times(result, 0, 3) == (30, 30) and node_times(result, 0, 4) == (30, 35)


def test_ranks_start_at_their_measured_offsets_when_clocks_agree(tmp_path):
    # Same job, but rank 1 began 25 us after rank 0 (starts 1000 and 1025 on one clock): rank 1 is
    # released at 25, A 25-55, the collective 55-85 (transfer min(50, 30) = 30).
    ranks = {0: [cpu(1, 10, start=1000), coll(2, 50, [1], start=1010)],
             1: [cpu(1, 30, start=1025), coll(2, 30, [1], start=1055)]}
    graphs = [load_graph(write_et(tmp_path / f"rank{r}.et", specs), r) for r, specs in ranks.items()]
    release = measured_release(graphs)
    assert release == [0, 25]
    result = replay(graphs, release=release)
    report = build_report(result)[0]
    assert node_times(result, 1, 1) == (25, 55) and node_times(result, 0, 2) == (55, 85)
    assert report.simulated_us == 85 and [r.simulated_us for r in report.ranks] == [85, 60]
    assert report.measured_job_span_us == 85  # 1000 .. 1085
    # Clocks that disagree (rank 1 a day later): no offsets.
    ranks[1] = [cpu(1, 30, start=86_400_000_000), coll(2, 30, [1], start=86_400_000_030)]
    graphs[1] = load_graph(write_et(tmp_path / "rank1.et", ranks[1]), 1)
    assert measured_release(graphs) is None


def test_single_rank_replays_its_collective_for_its_own_duration(tmp_path):
    result, report, _, _ = simulate(tmp_path, {0: two_rank_collective()[0]})
    assert report.simulated_us == 60  # 10 + 50: no peer to wait for


def test_scale_factors_answer_what_if(tmp_path):
    # cpu=0.5: A 5 and 15; the collective starts at 15, lasts 30 -> 45.
    _, report, _, _ = simulate(tmp_path, two_rank_collective(), scale=Scale(cpu=0.5))
    assert report.simulated_us == 45
    # comm=2: transfer 60 -> 30 + 60 = 90.
    _, report, _, _ = simulate(tmp_path, two_rank_collective(), scale=Scale(comm=2))
    assert report.simulated_us == 90
    # gpu=0 on the overlap graph: kernels free, A 0-10, B 10-20, S 20-21.
    _, report, _, _ = simulate(tmp_path, {0: OVERLAP}, scale=Scale(gpu=0))
    assert report.simulated_us == 21


def test_scale_parsing():
    assert Scale.parse("cpu=0.5, comm=2") == Scale(cpu=0.5, gpu=1.0, comm=2.0)
    assert Scale.parse("") == Scale()
    for bad in ("cpu", "disk=2", "gpu=x", "gpu=-1", "cpu=inf"):
        with pytest.raises(ValueError):
            Scale.parse(bad)


def test_send_matches_recv_by_source_destination_and_order(tmp_path):
    # rank 0 sends after A(10); rank 1 receives after B(5); transfer = min(40, 25): 10-35.
    ranks = {0: [cpu(1, 10), send(2, 40, dst=1, deps=[1])], 1: [cpu(1, 5), recv(2, 25, src=0, deps=[1])]}
    result, report, _, _ = simulate(tmp_path, ranks)
    assert node_times(result, 0, 2) == (10, 35) and node_times(result, 1, 2) == (10, 35)
    assert report.simulated_us == 35


def test_cycle_and_missing_dependency_are_reported_as_never_issued(tmp_path):
    # 1 <-> 2 form a cycle; 4 depends on absent id 999 and 5 on 4; 3 runs alone (5 us).
    specs = [cpu(1, 1, [2]), cpu(2, 1, [1]), cpu(3, 5), cpu(4, 1, [999]), cpu(5, 1, [4])]
    result, report, _, diagnosis = simulate(tmp_path, {0: specs})
    assert report.simulated_us == 5 and not report.finished
    assert report.never_issued == 4
    reasons = {ex["id"]: ex["reason"] for ex in report.never_issued_examples}
    assert reasons == {1: "in or after a dependency cycle", 2: "in or after a dependency cycle",
                       4: "missing dependency", 5: "waits for a node that never ran"}
    assert sorted(c["id"] for c in report.cycle_example) == [1, 2]
    detail = next(ex for ex in report.never_issued_examples if ex["id"] == 4)["detail"]
    assert "999" in detail


def test_stalled_job_names_the_rank_and_the_collective_and_returns(tmp_path):
    # rank 0 holds two all-reduces on pg 0, rank 1 only the first: #1 can never start.
    ranks = {0: [cpu(1, 10), coll(2, 5, [1]), coll(3, 5, [2], comm_type=pb.ALL_TO_ALL), cpu(4, 1, [3])],
             1: [cpu(1, 10), coll(2, 5, [1])]}
    result, report, _, diagnosis = simulate(tmp_path, ranks)
    assert not report.finished
    (stall,) = report.stalls
    assert stall["process_group"] == "0" and stall["index"] == 1 and stall["comm_type"] == "ALL_TO_ALL"
    assert stall["arrived_ranks"] == [0]
    assert [m["rank"] for m in stall["missing_ranks"]] == [1]
    assert "only 1" in stall["missing_ranks"][0]["why"]
    assert report.never_issued == 1  # node 4 of rank 0, after the stalled collective
    assert report.simulated_us == 15  # the first collective: 10-15
    assert any("different numbers of collectives" in note for note in report.notes)


def test_crossed_collectives_deadlock_is_reported_not_hung_on(tmp_path):
    # rank 0 issues pg 1 then pg 2; rank 1 issues pg 2 then pg 1 (one comm unit each): deadlock.
    ranks = {0: [coll(1, 5, pg="1"), coll(2, 5, [1], pg="2")], 1: [coll(1, 5, pg="2"), coll(2, 5, [1], pg="1")]}
    result, report, _, _ = simulate(tmp_path, ranks)
    assert not report.finished
    assert sorted((s["process_group"], s["arrived_ranks"][0]) for s in report.stalls) == [("1", 0), ("2", 1)]
    for stall in report.stalls:
        assert "never issued" in stall["missing_ranks"][0]["why"]


def test_comm_groups_restrict_the_members(tmp_path):
    # pg 1 = ranks {0, 1}; rank 2 has no collective there and must not be waited for.
    ranks = {0: [cpu(1, 10), coll(2, 8, [1], pg="1")], 1: [cpu(1, 20), coll(2, 4, [1], pg="1")], 2: [cpu(1, 3)]}
    _, report, _, _ = simulate(tmp_path, ranks, groups={"1": [0, 1]})
    assert report.finished and report.simulated_us == 24  # starts at 20, lasts min(8, 4)
    _, report, _, _ = simulate(tmp_path, ranks)  # no group file: all ranks, rank 2 never arrives
    assert not report.finished and report.stalls[0]["missing_ranks"][0]["rank"] == 2


def test_lanes_model_runs_a_collective_on_its_stream(tmp_path):
    # Under lanes a kernel on stream 7 runs beside the collective on stream 20.
    specs = [cpu(1, 10), coll(2, 30, [1]), gpu(3, 30, [1], stream=7)]
    _, report, _, _ = simulate(tmp_path, {0: specs}, model=LANES)
    assert report.simulated_us == 40
    _, report, _, _ = simulate(tmp_path, {0: specs})  # astra-sim: comm and GPU are separate units too
    assert report.simulated_us == 40


def test_et_plus_json_with_sim_dur_and_data_deps(tmp_path):
    """The ET+ JSON contract: ``sim_dur`` is simulated, ``inclusive_dur`` measured, ``data_deps`` (ids)
    with the parent; GPU nodes by ``cat``, collectives by ``comm_type`` name. Nested layout."""
    def attrs(tid):
        return [{"name": "tid", "type": "uint64", "value": tid}]
    nodes = [
        {"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1, "attrs": attrs(0)},
        {"id": 2, "name": "step", "ctrl_deps": 1, "attrs": attrs(1), "ts": 100, "dur": 60, "inclusive_dur": 60,
         "exclusive_dur": 20, "sim_dur": 12},
        {"id": 3, "name": "op", "ctrl_deps": 2, "attrs": attrs(1), "ts": 110, "dur": 30, "inclusive_dur": 30,
         "exclusive_dur": 30, "sim_dur": 25, "data_deps": [2]},
        {"id": 9, "name": "ncclKernel_AllReduce", "ctrl_deps": 3, "attrs": attrs(1), "cat": "kernel", "ts": 130,
         "dur": 40, "stream": 20, "device": 0, "sim_dur": 40, "comm_type": "ALL_REDUCE", "pg_name": "0",
         "data_deps": [3]},
        {"id": 4, "name": "wait", "ctrl_deps": 2, "attrs": attrs(1), "ts": 150, "dur": 10, "sim_dur": 1,
         "data_deps": [9]},
    ]
    path = tmp_path / "rank0_plus.json"
    path.write_bytes(orjson.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}))
    graph = load_graph(path)
    assert graph.notes == []
    (info,) = graph.comm.values()
    assert info.comm_type == pb.ALL_REDUCE and info.pg_name == "0"
    result = replay([graph])
    report = build_report(result)[0]
    # step 0-12, op 12-37 (after its parent), the all-reduce 37-77, wait 77-78.
    assert node_times(result, 0, 9) == (37, 77) and report.simulated_us == 78
    assert report.measured_us == 70  # 100 .. 170 (the kernel ends at 170)


def test_critical_path_names_the_dependency_causes_the_file_gives(tmp_path):
    # A(10) launches K(30) (data dep, cause "launch", and ctrl parent A); S(1) waits for K ("sync").
    from linker.write.chakra_wire import make_attr
    kernel = gpu(2, 30, [1])
    kernel.ctrl = (1,)
    kernel.attrs.append(make_attr("data_dep_causes", ["launch"]))
    sync = cpu(3, 1, [2])
    sync.attrs.append(make_attr("data_dep_causes", ["sync"]))
    result, report, path, _ = simulate(tmp_path, {0: [cpu(1, 10), kernel, sync]})
    assert report.simulated_us == 41
    assert [(s.via, s.link) for s in path] == [("start", ""), ("dependency", "launch"), ("dependency", "sync")]
    assert {(link.link, link.count, link.us) for link in report.critical_path_links} == {
        ("start", 1, 10), ("launch", 1, 30), ("sync", 1, 1)}
    graph = result.graphs[0]
    assert graph.edge_cause(1, 0) == "launch"  # the data cause wins over the repeated ctrl edge

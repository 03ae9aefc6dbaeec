"""A process group's CPU collectives are serialised in the order they were issued, the order the
ranks pair them by (docs/durations.md, "What a CPU collective carries").

Fixture (a real capture, ``tests/fixtures/README.md``): ``ddp_gloo_swapped``, the 4-rank DDP job of
``ddp_gloo`` at a loopback of 1 Gbit/s. Each step issues two all-reduces (789,504 then 263,168
bytes), which gloo's two workers start within µs of each other. On rank 2, in the fourth step, the
worker of the second took its ET id before the worker of the first: ET ids run against the issue
order there, while record-function ids (made when the call enqueues the work) do not. Expected
values are read from the ET and Kineto files with plain code."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from conftest import FIXTURES, checked_by_script, job_reports, linked_rank

JOB = FIXTURES / "ddp_gloo_swapped"
RANKS = (0, 1, 2, 3)
RECORD = "gloo:all_reduce"


def _rf_id(node: dict):
    return next((a["value"] for a in node.get("attrs", []) if a["name"] == "rf_id"), None)


def _records(nodes: list[dict]) -> list[dict]:
    return [n for n in nodes if n["name"] == RECORD and "continues" not in n]


def _et_records(rank: int) -> list[dict]:
    return _records(json.loads(gzip.decompress((JOB / f"host.{rank}.json.gz").read_bytes()))["nodes"])


def test_rank_2_holds_two_collectives_whose_et_ids_run_against_their_issue():
    """The shape the fixture is kept for: on rank 2 only, ordering the records by ET id puts the
    263,168-byte all-reduce of a step (the second issued) before its 789,504-byte one; by
    record-function id every rank's records alternate the two buckets."""
    for rank in RANKS:
        records = _et_records(rank)
        by_et_id = [_rf_id(n) for n in sorted(records, key=lambda n: n["id"])]
        assert (by_et_id != sorted(by_et_id)) == (rank == 2), (rank, by_et_id)
    kineto = json.loads(gzip.decompress((JOB / "device.2.json.gz").read_bytes()))["traceEvents"]
    dims = {e["args"]["Record function id"]: e for e in kineto if e.get("name") == RECORD}
    assert len(dims) == 10


@pytest.mark.parametrize("rank", RANKS)
def test_each_collective_follows_one_issued_before_it(tmp_path, rank):
    """Every edge between two of a rank's collectives goes from the one issued first (smaller
    record-function id) to the later one; on rank 2 the step's second all-reduce follows its first
    (before, the first followed nothing and the second, replayed first, ran the whole pair's time)."""
    nodes = json.loads(linked_rank(tmp_path, JOB, rank).read_text())["nodes"]
    records = {n["id"]: n for n in _records(nodes)}
    edges = [(records[d], n, cause) for n in records.values()
             for d, cause in zip(n["data_deps"], n["data_dep_causes"]) if d in records]
    assert len(edges) >= len(records) - 1
    for source, target, _ in edges:
        assert _rf_id(source) < _rf_id(target), (source["id"], target["id"])
    if rank == 2:
        by_rf = {_rf_id(n): n for n in records.values()}
        assert (by_rf[1136], by_rf[1180], "collective_order") in edges


@pytest.mark.parametrize("model", ("astra-sim", "lanes"))
def test_the_job_replays_its_span(tmp_path, model):
    """The four ranks replayed together, from JSON and from ``.et``: the job span as measured
    (±0.5%; before, 1.145 under astra-sim: rank 2 replayed a step's second all-reduce first, for
    the pair's whole time, after the other ranks had run their first)."""
    for report in job_reports(tmp_path, JOB, RANKS, model):
        assert report["ratio"] == pytest.approx(1.0, abs=0.005)


def test_no_dependency_contradicts_the_measured_timeline(tmp_path):
    """``scripts/order_check.py`` finds no contradicted edge on any rank (JSON)."""
    checked_by_script("order_check.py", [linked_rank(tmp_path, JOB, rank) for rank in RANKS])


def _two_workers(tmp_path) -> list:
    """Two ranks on one clock, each: A (100-110) forks collective Y (worker 3) and, after B
    (110-112), collective X (worker 2, 112-142), issued first (issue number 0, Y's 1). Y ran
    wholly beside X (110-138): no busy part of its own, so its worker's pickup is 28 µs. The job's
    span: 42 µs."""
    from linker.sim.load import load_graph
    from linker.write.chakra_wire import make_attr
    from sim_graphs import cpu, cpu_coll, write_et

    graphs = []
    for rank in (0, 1):
        x, y = cpu_coll(2, 30, [4], start=112, tid=2), cpu_coll(3, 0, [1], start=110, tid=3)
        x.attrs.append(make_attr("comm_seq", 0))
        y.attrs += [make_attr("comm_seq", 1), make_attr("inclusive_dur_micros", 28)]
        specs = [cpu(1, 10, start=100), cpu(4, 2, [1], start=110), x, y]
        graphs.append(load_graph(write_et(tmp_path / f"rank{rank}.et", specs), rank))
    return graphs


def test_a_collective_run_beside_the_earlier_one_is_issued_after_it(tmp_path):
    """Under astra-sim's one collective in flight, Y (ready when A ends, 2 µs before X) does not
    take the unit before X, issued before it, has ended; it then ends at once (its 28 µs beside X
    are over): the job replays its 42 µs. Before, Y held the unit through its pickup (10-38) and X
    ran after it: 68 µs (1.62). The ASTRA-sim workload copies give Y's timed node an edge from X."""
    from linker.batch.astra_collectives import cpu_collective_edits
    from linker.sim.engine import ASTRA_SIM, measured_release, replay

    graphs = _two_workers(tmp_path)
    result = replay(graphs, ASTRA_SIM, release=measured_release(graphs))
    assert max(e for e in result.end if not math.isnan(e)) == pytest.approx(42.0)
    edits = cpu_collective_edits(graphs, None).edits
    for mine in edits:
        assert mine[3].sync_id is None and mine[3].after_id == 2 and mine[2].after_id is None
    from linker.batch.astra_setup import copy_for_astra
    from linker.model import et_def_pb2 as pb
    from linker.write.chakra_wire import iter_frames

    copy_for_astra(tmp_path / "rank0.et", tmp_path / "workload.0.et", edits[0])
    nodes = {n.id: n for n in (pb.Node.FromString(f.payload) for f in iter_frames(tmp_path / "workload.0.et")
                               if f.index > 0)}
    assert list(nodes[3].data_deps) == [1, 2] and nodes[3].duration_micros == 0

"""PyTorch's functional collectives over gloo: tensor parallelism (DTensor) waits for each
collective in an op of its own, ``_c10d_functional::wait_tensor`` (docs/durations.md, "What a CPU
collective carries").

Fixture (a real capture, ``tests/fixtures/README.md``): ``tp_gloo``, 2 ranks, 3 steps of two MLP
blocks split over the ranks (``ColwiseParallel`` / ``RowwiseParallel``): 3 ``gloo:all_reduce`` a
step, each issued by ``_c10d_functional::all_reduce`` and waited for in a ``wait_tensor`` that
began before gloo's worker took the work; ``funcol_gloo``, 2 ranks, 3 steps of an ``all_reduce`` and
an ``all_gather_into_tensor`` called directly, run at once on gloo's two workers. Expected values
are read from the Kineto files with plain code."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import FIXTURES, assert_no_contradicted_edge_nor_moved_time, checked_by_script, job_reports, linked_rank

TP = FIXTURES / "tp_gloo"
RANKS = (0, 1)
WAIT = "_c10d_functional::wait_tensor"


def _linked(tmp_path, rank: int, suffix: str = ".json"):
    return linked_rank(tmp_path, TP, rank, suffix)


def _kineto_ops(rank: int) -> list[dict]:
    events = json.loads(gzip.decompress((TP / f"device.{rank}.json.gz").read_bytes()))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]


def _expected_waits(ops: list[dict]) -> list[tuple[dict, dict, float]]:
    """(wait_tensor, record, µs waited in it): the ``gloo:all_reduce`` records and the waits, paired
    in start order (one group: one collective at a time), and the time from the later of their starts
    to the record's end when that end falls in the wait (else the wait began after the collective
    ended: 0)."""
    waits = sorted((e for e in ops if e["name"] == WAIT), key=lambda e: e["ts"])
    records = sorted((e for e in ops if e["name"] == "gloo:all_reduce"), key=lambda e: e["ts"])
    assert len(waits) == len(records)
    found = []
    for wait, record in zip(waits, records):
        end = record["ts"] + record["dur"]
        waited = end - max(wait["ts"], record["ts"]) if wait["ts"] <= end <= wait["ts"] + wait["dur"] else 0.0
        found.append((wait, record, waited))
    return found


def _nodes(path) -> list[dict]:
    return json.loads(path.read_text())["nodes"]


def _rf_id(node: dict):
    return next((a["value"] for a in node.get("attrs", []) if a["name"] == "rf_id"), None)


@pytest.mark.parametrize("rank", RANKS)
def test_the_wait_in_wait_tensor_is_blocked_time_and_its_end_joins_the_collective(tmp_path, rank):
    """Each ``wait_tensor`` keeps as busy time only what it ran outside the wait (a few tens of µs;
    before, its whole duration: 45 ms of the job's critical path), and its part after the record's
    end follows the collective (a ``join`` edge to the node continuing it, starting at that end). A
    wait that began after its collective ended (rank 0, once) waited for nothing: it follows the
    collective from its start, its time all busy."""
    waits = _expected_waits(_kineto_ops(rank))
    assert len(waits) == 9 and sum(w for _, _, w in waits) > 5_000
    nodes = _nodes(_linked(tmp_path, rank))
    by_rf = {_rf_id(n): n for n in nodes if "continues" not in n}
    pieces = {}
    for node in nodes:
        if "continues" in node:
            pieces.setdefault(node["continues"], []).append(node)
    for wait, record, waited in waits:
        node = by_rf[wait["args"]["Record function id"]]
        assert node["blocked_dur"] == pytest.approx(waited, abs=1.0)
        kept = node["sim_dur"] + sum(p["sim_dur"] for p in pieces.get(node["id"], []))
        assert kept == pytest.approx(wait["dur"] - waited, abs=1.0)
        collective = by_rf[record["args"]["Record function id"]]
        joined = [n for n in [node] + pieces.get(node["id"], [])
                  if collective["id"] in n.get("data_deps", [])
                  and n["data_dep_causes"][n["data_deps"].index(collective["id"])] == "join"]
        assert len(joined) == 1
        if waited:
            assert "continues" in joined[0] and joined[0]["ts"] == pytest.approx(record["ts"] + record["dur"], abs=1.0)
        else:
            assert joined[0] is node


@pytest.mark.parametrize("model", ("astra-sim", "lanes"))
def test_the_job_replays_its_span_and_its_path_holds_no_wait(tmp_path, model):
    """Both ranks replayed together, from JSON and from ``.et``: the span as measured (±1%;
    before, 1.066: each wait ran as busy time after the collective it waited for), and no
    ``wait_tensor`` among the critical path's top ops (before, the first, at 34% of the path)."""
    reports = job_reports(tmp_path, TP, RANKS, model)
    for report in reports:
        assert WAIT not in {op["name"] for op in report["critical_path"][:5]}, report["critical_path"][:5]
    ratios = [report["ratio"] for report in reports]
    assert ratios[0] == pytest.approx(1.0, abs=0.01) and ratios[1] == pytest.approx(ratios[0], rel=0.005)


def test_no_dependency_contradicts_the_measured_timeline_and_no_time_moves(tmp_path):
    """``scripts/order_check.py`` finds no contradicted edge and ``scripts/attribution.py`` no CPU
    time on another op, on both ranks (JSON)."""
    assert_no_contradicted_edge_nor_moved_time([_linked(tmp_path, rank) for rank in RANKS])


FUNCOL = FIXTURES / "funcol_gloo"


def _funcol_linked(tmp_path, rank: int, suffix: str = ".json"):
    return linked_rank(tmp_path, FUNCOL, rank, suffix)


def test_an_all_gather_is_waited_for_by_who_reads_its_output_not_its_input(tmp_path):
    """``funcol_gloo``: gloo's ``all_gather`` record holds the tensor it sends, not the one it
    fills (the issuing ``c10d::allgather_into_tensor_coalesced_``'s first argument). The op that
    reads the sent tensor after the call (``reduced + c``) needs nothing of the collective; the
    ``wait_tensor`` given the output does. Before, that op was taken for the consumer: joins the
    measured timeline contradicts (3 on rank 0, by up to 2 ms), the job at 1.249 under lanes (on
    another capture of the job, a dependency cycle: an internal error). Now no contradicted edge
    and the job within 1% under lanes, from JSON and ``.et``."""
    checked_by_script("order_check.py", [_funcol_linked(tmp_path, rank) for rank in RANKS])
    for report in job_reports(tmp_path, FUNCOL, RANKS, "lanes"):
        assert report["ratio"] == pytest.approx(1.0, abs=0.01)


def test_a_worker_thread_is_forked_by_what_ran_before_its_first_op(tmp_path):
    """Every ``fork`` edge comes from a main-thread node that began before the forked work did (a
    worker's thread root, which has no start of its own: before the worker's first op). A root's
    fork used to come from its spawning op's last piece, after everything that op ran (the worker
    then began milliseconds late in the replay)."""
    root_forks = 0
    for rank in RANKS:
        nodes = _nodes(_funcol_linked(tmp_path, rank))
        by_id = {n["id"]: n for n in nodes}
        roots = {n["id"] for n in nodes if n["name"] == "[pytorch|profiler|execution_trace|thread]"}
        for node in nodes:
            for source, cause in zip(node.get("data_deps", []), node.get("data_dep_causes", [])):
                if cause != "fork":
                    continue
                if node["id"] in roots:
                    root_forks += 1
                    began = min(n["ts"] for n in nodes if n.get("ctrl_deps") == node["id"] and "ts" in n)
                else:
                    began = node["ts"]
                assert by_id[source]["ts"] <= began, (rank, by_id[source]["name"], node["name"], began)
    assert root_forks == 2  # rank 0's two gloo workers began while the ops that spawned them ran

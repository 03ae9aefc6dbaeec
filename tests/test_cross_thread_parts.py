"""Edges between threads come from the part of an op that ran by then, and go to the part that ran
after: a fork from the stretch of the main thread running when the worker's burst began (cut
there), a join into the op the main thread waited in goes to its part after the wait (cut where
it resumed), as does a synchronize's edge into the op that called it, and a child of no duration
ending where it starts is not the op the thread ran next.
Checked on a hand-made trace with times worked by hand, and on real traces with plain code over
the ET+ JSON (an edge m -> n is contradicted when m's measured start plus the busy time the ET+
gives m passes n's measured start)."""

from __future__ import annotations

import json

import pytest

import linker
from conftest import FIXTURES, shared_trace
from linker.pipeline import link_pair


def _contradicted(nodes: list[dict], slack: float = 50.0) -> list[tuple]:
    by_id = {n["id"]: n for n in nodes}
    found = []
    for node in nodes:
        if "ts" not in node:
            continue
        for source_id, cause in zip(node.get("data_deps", []), node.get("data_dep_causes", [])):
            source = by_id[source_id]
            if "ts" in source and source["ts"] + source["sim_dur"] - node["ts"] > slack:
                found.append((cause, source_id, node["id"]))
    return found


def _linked_alone(tmp_path, events: list[dict]) -> list[dict]:
    """The ET+ nodes of a Kineto trace made of ``events``, linked without an ET."""
    trace = tmp_path / "kineto.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "out.json"
    link_pair(None, trace, out)
    return json.loads(out.read_text())["nodes"]


def test_fork_from_the_part_before_the_burst_and_join_into_the_part_after_the_wait(tmp_path):
    """ProfilerStep#1 (0-400 µs) runs aten::a (10-100) on the main thread, then idles while a
    worker runs aten::b (150-300). Its 310 µs of own time lie in three stretches: 0-10 before a,
    100-150 up to the burst, 300-400 after it; 150-300 it waited. The burst follows the 100-150
    piece, the piece from 300 follows the burst; before, this trace made a dependency cycle (the
    join went into the op whose later piece the fork came from)."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 400,
         "args": {"Record function id": 1, "External id": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::a", "pid": 1, "tid": 1, "ts": 10, "dur": 90,
         "args": {"Record function id": 2, "External id": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::b", "pid": 1, "tid": 2, "ts": 150, "dur": 150,
         "args": {"Record function id": 3, "External id": 3}},
    ]
    nodes = _linked_alone(tmp_path, events)
    step = next(n for n in nodes if n["name"] == "ProfilerStep#1" and "continues" not in n)
    pieces = sorted((n for n in nodes if n.get("continues") == step["id"]), key=lambda n: n["ts"])
    assert [(p["ts"], p["sim_dur"]) for p in pieces] == [(100, 50), (300, 100)]
    assert step["sim_dur"] == 10
    b = next(n for n in nodes if n["name"] == "aten::b")
    causes = dict(zip(b["data_deps"], b["data_dep_causes"]))
    assert causes[pieces[0]["id"]] == "fork"
    causes = dict(zip(pieces[1]["data_deps"], pieces[1]["data_dep_causes"]))
    assert causes[b["id"]] == "join"
    assert not _contradicted(nodes, slack=0.0)


def test_an_op_that_waited_for_a_burst_it_issued_runs_its_own_time_after_the_burst(tmp_path):
    """``c10d::broadcast_`` (60-460 µs, no children) issues a burst on a worker (``aten::b``,
    80-200), waits for it, then runs 260 µs of its own before returning (a DDP buffer broadcast
    on a loaded host). Its own time lies before the burst (60-80) and after it (200-460): the
    part after is a piece that the burst's end releases (``join``), not time run before the wait
    (the replay then ran it at 60 and the wait not at all: the step 120 µs short, 380 of 500,
    with the graph alone)."""
    ops = [("ProfilerStep#1", 1, 0, 500), ("aten::a", 1, 10, 40), ("c10d::broadcast_", 1, 60, 400),
           ("aten::b", 2, 80, 120), ("aten::c", 1, 470, 20)]  # name, thread, start, duration
    events = [{"ph": "X", "cat": "user_annotation" if name.startswith("ProfilerStep") else "cpu_op", "name": name,
               "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {"Record function id": k, "External id": k}}
              for k, (name, tid, ts, dur) in enumerate(ops, start=1)]
    nodes = _linked_alone(tmp_path, events)
    op = next(n for n in nodes if n["name"] == "c10d::broadcast_" and "continues" not in n)
    b = next(n for n in nodes if n["name"] == "aten::b")
    pieces = [n for n in nodes if n.get("continues") == op["id"]]
    assert (op["sim_dur"], op["blocked_dur"]) == (20, 120)
    assert [(p["ts"], p["sim_dur"]) for p in pieces] == [(200, 260)]
    assert dict(zip(pieces[0]["data_deps"], pieces[0]["data_dep_causes"]))[b["id"]] == "join"
    assert not _contradicted(nodes, slack=0.0)
    assert linker.simulate(tmp_path / "out.json", waits="explained").report.simulated_us == pytest.approx(500)


def test_an_op_that_synchronized_runs_its_own_time_after_the_synchronize(tmp_path):
    """``aten::_local_scalar_dense`` (40-150 µs) waits in a ``cudaStreamSynchronize`` (50-110) for
    a kernel (25-105, launched at 15 by ``aten::mul``), then runs 40 µs of its own: that time is a
    piece beginning where the call returned, released by the kernel (``sync``). Replayed with the
    graph alone, by hand: ``ProfilerStep#1`` 10, ``aten::mul`` up to its launch 5 (0-15), the
    kernel from the launch at 15 for 80 (to 95), the op's 40 after it (95-135), then the step's
    10, ``aten::add``'s 20 and the step's last 20: 185 (the measured 200 less the kernel's 10 µs
    of launch latency and the 5 µs the call took to return after the kernel: waits the graph does
    not hold). Before, the op's 40 µs ran before the wait and the replay gave 140."""
    def cpu(name, ts, dur, k, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"Record function id": k, "External id": k}}

    def runtime(name, ts, dur, correlation):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"correlation": correlation, "External id": correlation}}

    events = [cpu("ProfilerStep#1", 0, 200, 1, "user_annotation"), cpu("aten::mul", 10, 20, 2),
              runtime("cudaLaunchKernel", 15, 5, 101), cpu("aten::_local_scalar_dense", 40, 110, 3),
              runtime("cudaStreamSynchronize", 50, 60, 102), cpu("aten::add", 160, 20, 4),
              {"ph": "X", "cat": "kernel", "name": "mul_kernel", "pid": 0, "tid": 7, "ts": 25, "dur": 80,
               "args": {"device": 0, "stream": 7, "correlation": 101, "External id": 101}}]
    nodes = _linked_alone(tmp_path, events)
    op = next(n for n in nodes if n["name"] == "aten::_local_scalar_dense" and "continues" not in n)
    kernel = next(n for n in nodes if n["name"] == "mul_kernel")
    (after,) = [n for n in nodes if n.get("continues") == op["id"]]
    assert (op["sim_dur"], op["blocked_dur"]) == (10, 60)
    assert (after["ts"], after["sim_dur"]) == (110, 40)
    assert dict(zip(after["data_deps"], after["data_dep_causes"]))[kernel["id"]] == "sync"
    assert not _contradicted(nodes, slack=0.0)
    assert linker.simulate(tmp_path / "out.json", waits="explained").report.simulated_us == pytest.approx(185)


def test_join_threads_waits_for_each_worker_in_its_part_after_the_wait(tmp_path):
    """The autograd fixture's ``## main:join_threads ##`` waits 18 ms for three worker threads that
    end at different times: every join edge into it comes to a part that began after that
    worker's op ended, and no join or parent edge of the fixture is contradicted."""
    folder = FIXTURES / "cpu" / "autograd_threads"
    et, kineto = folder / "et.json.gz", folder / "kineto.json.gz"
    out = tmp_path / "out.json"
    link_pair(et, kineto, out)
    nodes = json.loads(out.read_text())["nodes"]
    by_id = {n["id"]: n for n in nodes}
    join_threads = [n for n in nodes if n["name"] == "## main:join_threads ##"]
    joins = [(by_id[d], n) for n in join_threads for d, c in zip(n["data_deps"], n["data_dep_causes"]) if c == "join"]
    assert len(joins) >= 3
    for source, target in joins:
        assert source["ts"] + source["dur"] <= target["ts"] + 1e-6, (source["id"], target["id"])
    assert not [edge for edge in _contradicted(nodes) if edge[0] in ("join", "parent")]


def test_a_child_of_no_duration_leaves_the_gap_after_it_to_its_parent(tmp_path):
    """A public HTA trace whose ``aten::zeros`` end with an ``aten::zero_`` of no duration at their
    end, and whose ``aten::empty`` children last 0 µs: ``ProfilerStep#1009``'s gaps after them
    (402 µs after an ``aten::detach`` among them) are pieces of its own, so it keeps 2 µs before
    its first child and no parent edge is contradicted."""
    trace = shared_trace("sweep", "hta__distributed_info_unavailable__distributed_info_not_found.json.gz")
    out = tmp_path / "out.json"
    link_pair(None, trace, out)
    nodes = json.loads(out.read_text())["nodes"]
    step = next(n for n in nodes if n["name"] == "ProfilerStep#1009" and "continues" not in n)
    first_child = min(n["ts"] for n in nodes if n.get("ctrl_deps") == step["id"] and "continues" not in n and "ts" in n)
    assert step["sim_dur"] == pytest.approx(first_child - step["ts"])
    assert not _contradicted(nodes)


def test_forks_in_a_host_gap_split_it_where_each_burst_began(tmp_path):
    """aten::a (0-100 µs) then Python until aten::c (300-350): 200 µs of gap, in which worker
    threads start aten::w1 at 150 (to 190) and aten::w2 at 200 (to 260). The main thread ran
    Python 100-150, waited for the workers 150-260 (the join wait: the bursts' union), and ran
    Python again 260-300. So a's node holds its 100 µs and the 50 µs before w1 began; the gap's
    rest goes to nodes of no busy time of a at each later fork: 0 µs at 150 (w2 forked inside the
    wait), 40 µs at 200 (260-300). Each fork comes from the node that ran before its burst."""
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
               "args": {"Record function id": k, "External id": k}}
              for k, (name, tid, ts, dur) in enumerate([("aten::a", 1, 0, 100), ("aten::w1", 2, 150, 40),
                                                        ("aten::w2", 3, 200, 60), ("aten::c", 1, 300, 50)], 1)]
    nodes = _linked_alone(tmp_path, events)
    by_name = {n["name"]: n for n in nodes if "continues" not in n}
    a = by_name["aten::a"]
    assert (a["sim_dur"], a["host_gap_dur"]) == (150, 50)
    rest = sorted((n for n in nodes if n.get("continues") == a["id"]), key=lambda n: n["ts"])
    assert [(n["ts"], n["dur"], n["sim_dur"]) for n in rest] == [(150, 0, 0), (200, 0, 40)]
    forks = {n["name"]: [d for d, c in zip(n["data_deps"], n["data_dep_causes"]) if c == "fork"]
             for n in nodes if n["name"] in ("aten::w1", "aten::w2")}
    assert forks == {"aten::w1": [a["id"]], "aten::w2": [rest[0]["id"]]}
    assert rest[1]["id"] in by_name["aten::c"]["data_deps"]
    assert not _contradicted(nodes, slack=0.0)


def test_a_kernel_that_began_in_the_gap_after_its_launcher_waits_for_the_gap_up_to_its_start(tmp_path):
    """aten::div (1000-1050 µs) launches kernel k at 1010; k runs 1055-1059, while the thread is
    in Python until aten::mul at 1300. div's node holds its 50 µs and the 5 µs of the gap before
    k began; the other 245 µs go to a node of no busy time of div at 1055, before mul. k's launch
    edge comes from div's node, which the measured timeline agrees with."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::div", "pid": 1, "tid": 1, "ts": 1000, "dur": 50,
         "args": {"Record function id": 1, "External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1010, "dur": 5,
         "args": {"correlation": 7, "External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1055, "dur": 4,
         "args": {"correlation": 7, "External id": 1, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 1300, "dur": 20,
         "args": {"Record function id": 2, "External id": 2}},
    ]
    nodes = _linked_alone(tmp_path, events)
    div = next(n for n in nodes if n["name"] == "aten::div" and "continues" not in n)
    assert (div["sim_dur"], div["host_gap_dur"]) == (55, 5)
    (rest,) = [n for n in nodes if n.get("continues") == div["id"]]
    assert (rest["ts"], rest["dur"], rest["sim_dur"]) == (1055, 0, 245)
    kernel = next(n for n in nodes if n["name"] == "k")
    assert list(zip(kernel["data_deps"], kernel["data_dep_causes"])) == [(div["id"], "launch")]
    mul = next(n for n in nodes if n["name"] == "aten::mul")
    assert rest["id"] in mul["data_deps"]
    assert not _contradicted(nodes, slack=0.0)

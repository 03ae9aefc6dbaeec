"""A parent's exclusive time after its first child runs where it was measured, as nodes of their
own that stay the parent's (``plan.later_pieces``; docs/durations.md). A small hand-written pair,
one thread:

    ## step ##        100 ─────────────────────────────── 200
      aten::a             110 ─────────── 130
        aten::a_inner         115 ─── 125
      aten::b                                 150 ─── 170
    aten::after                                                205 ── 215

Exclusive times: step 100 − 20 − 20 = 60 (10 before its first child, 20 between its children,
30 after the last), a 20 − 10 = 10 (5 before a_inner, 5 after), a_inner 10, b 20, after 10.
Each op's node keeps the piece before its first child; each later piece is a node of its own,
named as its op, ``continues`` = the op's id, run right after the op the thread ran before it:

    a's 125–130 (5) and step's 130–150 (20) after a_inner; step's 170–200 (30) after b,
    and the 5 µs host gap 200–205 after that piece, folded into it (``host_gap_dur`` 5).

So, worked out here by hand, the nodes' busy times are step 10, a 5, a_inner 10, b 20, after 10
and the pieces 5, 20, 30 + 5 (sum 115 = 215 − 100); per op, step 10 + 20 + 30 = 60 and a 5 + 5 =
10: every op holds its own exclusive time. A replay starts every node at its measured time. The
second case adds a 8 µs ``cudaDeviceSynchronize`` at 135–143 inside step's piece 130–150:
blocked time, which stays out of the piece, and the piece is cut where the call returned (what
the thread ran after a synchronize waits for it): 130–143 holds 13 − 8 = 5, 143–150 holds 7.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

import wire_decoder
import linker
from linker.link.recipe import LinkOptions
from linker.plan.busy import Timeline
from linker.plan.later_pieces import later_pieces
from linker.pipeline import link_pair

PID = TID = 77
T0 = 1_700_000_000_000_000
OPS = [  # id, name, parent id, rf_id, start, duration
    (3, "## step ##", 2, 1, 100, 100),
    (4, "aten::a", 3, 2, 110, 20),
    (5, "aten::a_inner", 4, 3, 115, 10),
    (6, "aten::b", 3, 4, 150, 20),
    (7, "aten::after", 2, 5, 205, 10),
]


def _et_node(node_id: int, name: str, parent: int, rf_id: int, tid: int = 1) -> dict:
    attrs = [{"name": "rf_id", "type": "uint64", "value": rf_id},
             {"name": "scope", "type": "uint64", "value": 0},
             {"name": "tid", "type": "uint64", "value": tid},
             {"name": "op_schema", "type": "string", "value": ""}]
    io = {"values": [], "shapes": [], "types": [], "strides": []}
    return {"id": node_id, "name": name, "ctrl_deps": parent, "inputs": io, "outputs": io, "attrs": attrs}


def _pair(directory: Path, sync: tuple[int, int] | None = None) -> tuple[Path, Path]:
    nodes = [_et_node(2, "[pytorch|profiler|execution_trace|thread]", 1, 0)]
    nodes += [_et_node(i, name, parent, rf) for i, name, parent, rf, _, _ in OPS]
    nodes.append(_et_node(1, "[pytorch|profiler|execution_trace|process]", 1, 0, tid=0))
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": TID, "ts": T0 + ts, "dur": dur,
               "args": {"External id": rf, "Record function id": rf}} for _, name, _, rf, ts, dur in OPS]
    if sync is not None:
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": PID, "tid": TID,
                       "ts": T0 + sync[0], "dur": sync[1], "args": {"correlation": 9001, "External id": 9001}})
    et, kineto = directory / "et.json", directory / "kineto.json"
    et.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": PID, "time": "2025-01-01 00:00:00",
                              "start_ts": 1000, "finish_ts": 2000, "nodes": nodes}))
    kineto.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return et, kineto


def _json_nodes(path: Path) -> dict[int, dict]:
    return {node["id"]: node for node in json.loads(path.read_text())["nodes"]}


def _et_durations(path: Path) -> dict[int, tuple[int, dict]]:
    """id -> (duration_micros, {attribute name: int value}) read with the tests' own decoder."""
    out = {}
    for frame in wire_decoder.read_stream(path)[1:]:
        node = wire_decoder.decode_node(frame)
        attrs = {a[1]: a.get(9, a.get(10)) for a in node.get(10, [])}
        out[node[1][0]] = (node.get(7, [0])[0], attrs)
    return out


# id -> (busy µs of its node, deferred µs), and the pieces as (op id, start, busy µs, host gap µs), by hand
EXPECTED = ({3: (10, 50), 4: (5, 5), 5: (10, 0), 6: (20, 0), 7: (10, 0)},
            [(4, 125, 5, 0), (3, 130, 20, 0), (3, 170, 35, 5)])
EXPECTED_WITH_WAIT = ({3: (10, 42), 4: (5, 5), 5: (10, 0), 6: (20, 0), 7: (10, 0)},
                      [(4, 125, 5, 0), (3, 130, 5, 0), (3, 143, 7, 0), (3, 170, 35, 5)])
# the thread chain a replay follows, by hand: each piece right after the op the thread ran before it
CHAIN = [3, 4, 5, (4, 125), (3, 130), 6, (3, 170), 7]
CHAIN_WITH_WAIT = [3, 4, 5, (4, 125), (3, 130), (3, 143), 6, (3, 170), 7]


def _key(node: dict):
    return (node["continues"], round(node["ts"] - T0)) if "continues" in node else node["id"]


@pytest.mark.parametrize("sync, expected, chain", [(None, EXPECTED, CHAIN), ((135, 8), EXPECTED_WITH_WAIT, CHAIN_WITH_WAIT)],
                         ids=["plain", "wait_in_a_piece"])
def test_each_later_piece_is_a_node_of_its_op(tmp_path, sync, expected, chain):
    ops, pieces = expected
    et, kineto = _pair(tmp_path, sync)
    link_pair(et, kineto, tmp_path / "out.json", LinkOptions(), None)
    link_pair(et, kineto, tmp_path / "out.et", LinkOptions(), None)
    nodes, frames = _json_nodes(tmp_path / "out.json"), _et_durations(tmp_path / "out.et")
    for node_id, (busy, deferred) in ops.items():
        node = nodes[node_id]
        assert node["sim_dur"] == busy and node.get("deferred_dur", 0) == deferred, node["name"]
        assert node["sim_dur"] == pytest.approx(node["exclusive_dur"] - node["blocked_dur"] - node.get("deferred_dur", 0)
                                                + node["host_gap_dur"])
        duration, attrs = frames[node_id]
        assert duration == busy and attrs.get("deferred_micros", 0) == deferred, node["name"]
    written = [n for n in nodes.values() if "continues" in n]
    assert sorted((n["continues"], n["ts"] - T0, n["sim_dur"], n.get("host_gap_dur", 0)) for n in written) == sorted(pieces)
    for piece in written:
        op = nodes[piece["continues"]]
        assert piece["name"] == op["name"] and piece["ctrl_deps"] == op["id"] and piece["id"] > max(OP_IDS)
        duration, attrs = frames[piece["id"]]  # the same node in the .et
        assert (duration, attrs["continues"], attrs.get("host_gap_micros", 0)) == (
            piece["sim_dur"], op["id"], piece.get("host_gap_dur", 0))
    # every op holds its exclusive time less its blocked time: its node and its pieces
    for node_id in ops:
        node = nodes[node_id]
        held = node["sim_dur"] - node["host_gap_dur"] + sum(p["sim_dur"] - p.get("host_gap_dur", 0) for p in written
                                                            if p["continues"] == node_id)
        assert held == pytest.approx(node["exclusive_dur"] - node["blocked_dur"])
    # the chain: each node's thread predecessor, as worked out above
    by_key = {_key(n): n for n in nodes.values() if "ts" in n}
    for before, after in zip(chain, chain[1:]):
        deps = dict(zip(by_key[after]["data_deps"], by_key[after]["data_dep_causes"]))
        assert by_key[before]["id"] in deps, (before, after)
    assert nodes[3]["blocked_dur"] == (8 if sync else 0)  # the wait stays the step's, and a wait
    assert sum(n["sim_dur"] for n in nodes.values() if "ts" in n) == (115 - 8 if sync else 115)


OP_IDS = [op[0] for op in OPS]


def test_the_replay_starts_every_node_at_its_measured_time(tmp_path):
    """Without the pieces the step would hold the CPU 60 µs first and aten::a would start 50 µs
    late (at 60 instead of 10); with them every op and every piece starts at its measured offset
    from the step, and the replay lasts the measured 115 µs."""
    et, kineto = _pair(tmp_path)
    link_pair(et, kineto, tmp_path / "out.et", LinkOptions(), None)
    measured = {(name, ts - 100) for _, name, _, _, ts, _ in OPS}
    measured |= {("aten::a", 25), ("## step ##", 30), ("## step ##", 70)}  # the pieces
    for model in ("astra-sim", "lanes"):
        simulation = linker.simulate(tmp_path / "out.et", model=model)
        assert (simulation.report.measured_us, simulation.report.simulated_us) == (115, 115)
        simulation.write_trace(tmp_path / f"{model}.json")
        events = json.loads((tmp_path / f"{model}.json").read_text())["traceEvents"]
        names = {name for name, _ in measured}
        replayed = {(e["name"], e["ts"]) for e in events if e.get("ph") == "X" and e["name"] in names}
        assert replayed == measured, model  # measured and simulated sides alike: one (name, start) each


def _random_thread(rng, n_roots: int = 4):
    """One thread's ops as nested intervals on a µs grid (ties, zero-length ops and children that
    touch their parent's ends included), in start order with parents before their children: (ops,
    starts, ends, parent_op)."""
    ops, starts, ends, parent_op = [], [], [], []

    def place(parent: int, lo: int, hi: int, depth: int) -> None:
        t = lo
        while t <= hi and rng.random() < 0.7:
            start = t + rng.choice((0, 0, 1, 3))
            if start > hi:
                break
            end = min(hi, start + rng.choice((0, 1, 2, 5, 9, 20)))
            op = len(ops)
            ops.append(op), starts.append(float(start)), ends.append(float(end)), parent_op.append(parent)
            if depth < 3 and end > start:
                place(op, start, end, depth + 1)
            t = end

    t = 0
    for _ in range(n_roots):
        root = len(ops)
        ops.append(root), starts.append(float(t)), ends.append(float(t + 40)), parent_op.append(-1)
        place(root, t, t + 40, 1)
        t += 40 + rng.choice((0, 2))
    return ops, starts, ends, parent_op


def _later_pieces_by_scanning(starts, ends, parent_op):
    """The rule read literally, one piece at a time: each op with a parent op ends a piece of that
    parent, from its end to the next op starting then or later that is neither the child nor
    inside it (or the parent's end, if sooner); the piece follows the op the thread ran last
    before that next op. (op, after, begin, length) of each, in time order. O(n²)."""
    n = len(starts)

    def inside(p, ancestor):
        while p >= 0:
            if p == ancestor:
                return True
            p = parent_op[p]
        return False

    pieces = []
    for child in range(n):
        owner = parent_op[child]
        if owner < 0:
            continue
        begin = ends[child]
        later = [p for p in range(n) if starts[p] >= begin and not inside(p, child)]
        finish = min(starts[later[0]] if later else math.inf, ends[owner])
        if finish > begin:
            pieces.append((owner, (later[0] if later else n) - 1, begin, finish - begin))
    return sorted(pieces, key=lambda piece: (piece[2], piece[0]))


def test_later_pieces_agree_with_the_rule_read_literally():
    """``later_pieces`` on 300 random nested timelines gives the pieces found one by one by a scan
    (no blocked time, exclusive times large enough that nothing is capped), and each op's deferred
    time is the sum of its pieces."""
    rng = random.Random(31)
    for _ in range(300):
        ops, starts, ends, parent_op = _random_thread(rng)
        n = len(ops)
        deferred, pieces = later_pieces([Timeline(ops, starts, ends)], parent_op, ends, [1e9] * n, [0.0] * n, [], n)
        expected = _later_pieces_by_scanning(starts, ends, parent_op)
        assert list(zip(pieces.owner, pieces.after, pieces.begin, pieces.length)) == expected
        sums = [0.0] * n
        for owner, _, _, length in expected:
            sums[owner] += length
        assert deferred.tolist() == sums


def test_launch_cuts_by_hand():
    """``cut_at_handoffs`` on hand-worked stretches: op 0's own part runs 0-100 µs, op 1 has a
    piece 200-300 (following op 5). A launch (given by its call's start) cuts the stretch it lies
    in where the call began when its GPU op began before the part it would wait for ended;
    launches are taken latest first, so an earlier one is checked against the part a later cut
    left."""
    from linker.plan.later_pieces import Handoff, cut_at_handoffs

    import numpy as np

    owners, targets, begins, finishes = np.array([1]), np.array([5]), np.array([200.0]), np.array([300.0])
    launches = [
        Handoff(0, 40.0, 42.0),   # began at 42 < 100: cut at 40, [40, 100) follows op 0 itself
        Handoff(0, 20.0, 45.0),   # began at 45, after its part (now 0-40) ended: no cut
        Handoff(0, 60.0, 101.0),  # began at 101, after op 0's own part ended (100): no cut
        Handoff(1, 250.0, 260.0),  # began at 260 < 300: the piece ends at 250, [250, 300) follows op 5 too
        Handoff(1, 299.5, 300.0),  # began within 1 µs of the part's end: no cut
        Handoff(2, 10.0, 11.0),   # an op with no stretches known: nothing
    ]
    owners, targets, begins, finishes = (column.tolist() for column in cut_at_handoffs(
        owners, targets, begins, finishes, launches, {0: (0.0, 100.0)}))
    added = sorted(zip(owners[1:], targets[1:], begins[1:], finishes[1:]))
    # op 0: the call at 60 is taken first (its kernel began at 101, after 100: no cut), then the
    # call at 40 (kernel at 42 < 100: cut), then the call at 20 (45 > 40: no cut)
    assert added == [(0, 0, 40.0, 100.0), (1, 5, 250.0, 300.0)]
    assert (begins[0], finishes[0]) == (200.0, 250.0)  # the piece keeps its part up to the call

"""Ops a CPU backend's worker runs inside a collective's record, and waits for a collective inside
an op around the call that issued it (docs/durations.md, "CPU collectives").

Fixtures (real captures, ``tests/fixtures/README.md``): FSDP2 over gloo (``fsdp_gloo``: an
``all_gather`` per layer whose worker flattens the input before communicating and copies each
rank's part out after; a reduce-scatter, which gloo runs as an ``all_reduce`` that divides and
copies its result inside its record) and DDP with ``ZeroRedundancyOptimizer`` (``zero_gloo``: its
broadcasts waited for at the end of the step). Expected values are read from the Kineto files
and the ET+ JSON with plain code."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT, linked_rank
from linker.pipeline import link_pair
import orjson

from linker.sim.cli_run import SimulateOptions, run_simulate

FSDP, ZERO = FIXTURES / "fsdp_gloo", FIXTURES / "zero_gloo"
RANKS = (0, 1)


def _kineto_ops(directory, rank) -> list[dict]:
    """The Kineto file's CPU ops and annotations that carry a record-function id."""
    events = json.loads(gzip.decompress((directory / f"device.{rank}.json.gz").read_bytes()))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "Record function id" in e.get("args", {})]


def _children(ops: list[dict], parent: dict) -> list[dict]:
    """The direct children of ``parent`` on its thread (inside it, inside no other op inside it),
    in start order."""
    end = parent["ts"] + parent["dur"]
    inside = sorted((e for e in ops if e is not parent and e["tid"] == parent["tid"]
                     and parent["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end + 1), key=lambda e: e["ts"])
    direct, reached = [], float("-inf")
    for e in inside:
        if e["ts"] >= reached:
            direct.append(e)
            reached = e["ts"] + e["dur"]
    return direct


def _longest_gap(parent: dict, children: list[dict]) -> tuple[int, float]:
    """(how many children lie before the longest stretch of ``parent`` none of them covers, its length)."""
    cut, longest, reached = 0, children[0]["ts"] - parent["ts"], parent["ts"]
    for k, e in enumerate(children):
        if e["ts"] - reached > longest:
            cut, longest = k, e["ts"] - reached
        reached = max(reached, e["ts"] + e["dur"])
    if parent["ts"] + parent["dur"] - reached > longest:
        cut, longest = len(children), parent["ts"] + parent["dur"] - reached
    return cut, longest


def _linked(tmp_path, directory, rank, suffix=".json"):
    return linked_rank(tmp_path, directory, rank, suffix)


def _by_rf_id(nodes: list[dict]) -> dict[int, dict]:
    found = {}
    for node in nodes:
        for attr in node.get("attrs", []):
            if attr["name"] == "rf_id" and "continues" not in node:
                found[attr["value"]] = node
    return found


def _collectives_with_children(directory, rank):
    ops = _kineto_ops(directory, rank)
    for event in ops:
        if event["name"].startswith("gloo:"):
            children = _children(ops, event)
            if children:
                yield event, children


@pytest.mark.parametrize("rank", RANKS)
def test_ops_before_the_communication_run_before_the_collective_and_those_after_under_it(tmp_path, rank):
    """A gloo collective's worker ops that lie before the longest stretch of its record none of
    them covers (the flattening ``aten::view`` / ``aten::empty`` of an ``all_gather``) are placed
    under the collective's parent, the collective after the last of them on the thread; those
    after it (the copies out) stay its children. Before, every one was its child, so the
    flattening waited for the communication it preceded."""
    nodes = json.loads(_linked(tmp_path, FSDP, rank).read_text())["nodes"]
    node_of = _by_rf_id(nodes)
    before_count = after_count = 0
    for event, children in _collectives_with_children(FSDP, rank):
        collective = node_of[event["args"]["Record function id"]]
        cut, _ = _longest_gap(event, children)
        before = [node_of[e["args"]["Record function id"]] for e in children[:cut]]
        after = [node_of[e["args"]["Record function id"]] for e in children[cut:]]
        assert all(n["ctrl_deps"] == collective["ctrl_deps"] for n in before)
        assert all(n["ctrl_deps"] == collective["id"] for n in after)
        if before:
            causes = dict(zip(collective["data_deps"], collective["data_dep_causes"]))
            assert causes.get(before[-1]["id"]) == "thread_order"
        before_count, after_count = before_count + len(before), after_count + len(after)
    assert before_count >= 16 and after_count >= 24  # 8 all_gathers: 2 flattening ops, 4 copies out each


@pytest.mark.parametrize("rank", RANKS)
def test_a_collective_is_busy_only_where_it_communicated(tmp_path, rank):
    """A gloo collective with worker ops in its record is busy (``sim_dur``) within the longest
    stretch none of them covers, never over its ops' own time (before, the whole record less the
    time under the group's earlier collective: the ops counted twice)."""
    nodes = json.loads(_linked(tmp_path, FSDP, rank).read_text())["nodes"]
    node_of = _by_rf_id(nodes)
    checked = 0
    for event, children in _collectives_with_children(FSDP, rank):
        _, longest = _longest_gap(event, children)
        assert 0 < node_of[event["args"]["Record function id"]]["sim_dur"] <= longest + 0.002
        checked += 1
    assert checked == 12  # 8 all_gathers, 4 reduce-scatters


@pytest.mark.parametrize("directory", [FSDP, ZERO], ids=["fsdp", "zero"])
def test_no_dependency_contradicts_the_measured_timeline(tmp_path, directory):
    """``scripts/order_check.py`` finds no contradicted edge on either rank (FSDP before: 14 a
    rank, ``parent`` edges from a collective to the ops that flattened its input, up to 7 ms)."""
    outs = [str(_linked(tmp_path, directory, rank)) for rank in RANKS]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "order_check.py"), "--json", *outs],
                          capture_output=True, text=True, check=False)
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["contradicted"] for r in reports] == [0, 0] and proc.returncode == 0


def _waits_inside(ops: list[dict], name_prefix: str, call_prefix: str, collective_prefix: str):
    """Per op named ``name_prefix…`` on the main thread whose last child is a ``call_prefix…`` call:
    its stretch after that call (start, end) and the collectives (``collective_prefix…`` events on
    other threads) that ended inside that stretch."""
    for op in ops:
        if not op["name"].startswith(name_prefix):
            continue
        children = _children(ops, op)
        if not children or not children[-1]["name"].startswith(call_prefix):
            continue
        start, end = children[-1]["ts"] + children[-1]["dur"], op["ts"] + op["dur"]
        ended = [e for e in ops if e["name"].startswith(collective_prefix) and e["tid"] != op["tid"]
                 and start < e["ts"] + e["dur"] <= end]
        yield op, (start, end), ended


@pytest.mark.parametrize("rank", RANKS)
def test_the_main_thread_waits_for_an_all_gather_inside_fsdp_all_gather(tmp_path, rank):
    """FSDP waits for its ``all_gather`` in ``work.wait()``, which has no record function: inside
    ``FSDP::all_gather``, after the ``c10d::_allgather_base_`` that issued it returned, or in that
    call itself when it returned only after the worker was done. Where the main thread sat when
    the worker's last copy out ended, its time from the later of where it sat down and the
    worker's first op to that end is blocked time (before, ``FSDP::all_gather`` kept it as busy
    time, so a replay that runs one CPU op at a time ran it beside the worker's ops); the rest of
    that op runs after a ``join`` from the worker's last copy out."""
    nodes = json.loads(_linked(tmp_path, FSDP, rank).read_text())["nodes"]
    node_of, by_id = _by_rf_id(nodes), {n["id"]: n for n in nodes}
    ops = _kineto_ops(FSDP, rank)
    calls = sorted((e for e in ops if e["name"] == "c10d::_allgather_base_"), key=lambda e: e["args"]["Record function id"])
    expected: dict[int, float] = {}
    for gather in (e for e in ops if e["name"] == "gloo:all_gather"):
        rf = gather["args"]["Record function id"]
        call = max((c for c in calls if c["args"]["Record function id"] < rf), key=lambda c: c["args"]["Record function id"])
        around = [e for e in ops if e["name"].startswith("FSDP::all_gather (") and e["ts"] <= call["ts"]
                  and call["ts"] + call["dur"] <= e["ts"] + e["dur"]]
        children = _children(ops, gather)
        cut, _ = _longest_gap(gather, children)
        began = children[0]["ts"] if cut else gather["ts"]  # the worker's first op for it
        done = max(e["ts"] + e["dur"] for e in children)  # its last copy out
        if call["ts"] + call["dur"] > done:  # still in the call: it waited there
            holder, sat_from = call, max(e["ts"] + e["dur"] for e in _children(ops, call))
        else:
            (holder,) = around
            sat_from = call["ts"] + call["dur"]
        key = holder["args"]["Record function id"]
        expected[key] = expected.get(key, 0.0) + done - max(sat_from, began)
        released = [n for n in nodes if n.get("continues") == node_of[key]["id"] and n["ts"] >= done - 1.0
                    and "join" in n["data_dep_causes"]]
        sources = {by_id[d]["name"] for n in released[:1] for d, c in zip(n["data_deps"], n["data_dep_causes"])
                   if c == "join"}
        assert sources == {"aten::copy_"}, (key, sources)
    assert len(expected) == 8
    for key, blocked in expected.items():
        assert abs(node_of[key]["blocked_dur"] - blocked) <= 1.0, (key, node_of[key]["blocked_dur"], blocked)


@pytest.mark.parametrize("rank", RANKS)
def test_zero_waits_for_its_broadcasts_at_the_end_of_its_step(tmp_path, rank):
    """ZeroRedundancyOptimizer waits for its ``async_op`` broadcasts after issuing the last one,
    inside ``Optimizer.step#ZeroRedundancyOptimizer.step``: time there up to the last broadcast
    that ended in it is blocked (before: busy), never more than the stretch itself, and the
    step's part after it follows that broadcast (``join``)."""
    nodes = json.loads(_linked(tmp_path, ZERO, rank).read_text())["nodes"]
    node_of, by_id = _by_rf_id(nodes), {n["id"]: n for n in nodes}
    ops = _kineto_ops(ZERO, rank)
    checked = 0
    for op, (start, end), ended in _waits_inside(ops, "Optimizer.step#ZeroRedundancyOptimizer.step",
                                                 "c10d::broadcast_", "gloo:broadcast"):
        node = node_of[op["args"]["Record function id"]]
        last = max(e["ts"] + e["dur"] for e in ended)
        assert 0 < node["blocked_dur"] <= end - start + 1.0
        joined = {by_id[d]["name"] for n in nodes if n.get("continues") == node["id"] and n["ts"] >= last - 1.0
                  for d, c in zip(n["data_deps"], n["data_dep_causes"]) if c == "join"}
        assert joined == {"gloo:broadcast"}
        checked += 1
    assert checked == 2


@pytest.mark.parametrize("directory,models", [(FSDP, ("astra-sim", "lanes")), (ZERO, ("astra-sim", "lanes"))],
                         ids=["fsdp", "zero"])
def test_the_jobs_replay_as_measured_from_json_and_et(tmp_path, directory, models):
    """Job span within 2% of the measured one under both models, for jobs whose worker threads run
    CPU ops beside the main thread (FSDP; under astra-sim, one CPU op at a time per rank, it read
    1.05 while the replay issued the node ready first rather than the smallest id as ASTRA-sim
    does, docs/fidelity.md), and the ``.et`` replays as the JSON does."""
    for model in models:
        ratios = []
        for suffix in (".json", ".et"):
            paths = [_linked(tmp_path, directory, rank, suffix) for rank in RANKS]
            text, finished = run_simulate(SimulateOptions(paths, model=model, json_output=True))
            assert finished
            ratios.append(orjson.loads(text)["ratio"])
        assert 0.98 <= ratios[0] <= 1.02 and abs(ratios[1] / ratios[0] - 1) <= 0.005, (model, ratios)


def test_the_report_counts_the_ops_placed_before_their_collective(tmp_path):
    """The link report's ``et_tree_disagrees`` counts the ops placed before their collective apart
    from those outside their ET parent: 2 flattening ops for each of the rank's 8 ``all_gather``s
    (read from the Kineto file as the first test reads them)."""
    report = tmp_path / "report.json"
    link_pair(FSDP / "host.0.json.gz", FSDP / "device.0.json.gz", tmp_path / "out.json", report_path=report)
    counts = json.loads(report.read_text())["et_tree_disagrees"]
    expected = sum(_longest_gap(event, children)[0] for event, children in _collectives_with_children(FSDP, 0))
    assert counts["placed_before_their_collective"] == expected == 16

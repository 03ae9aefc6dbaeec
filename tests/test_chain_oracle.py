"""The dependency plan's thread chain against a second statement of the rule, written here and
read off the ET+ JSON alone (no call into ``linker.plan``): on a one-thread CPU trace, a replay
runs the thread's nodes (ops and later pieces) in their measured start order, so each timed node
depends on the one before it in (start, id) order, with the cause ``parent`` when that node is
its parent and ``thread_order`` otherwise; and the link report's dependency counts are those
causes counted. Ops start at distinct times or nest (a parent and its first child may share a
start: the parent has the smaller id), and a piece never shares its start with an op (it would
last no time), so the order is well defined."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import fixture_pair
from linker.pipeline import link_pair

ONE_THREAD = ["main_thread_only", "mlp_steps"]


def _parent(node: dict):
    return node.get("ctrl_deps", node.get("parent"))


@pytest.mark.parametrize("name", ONE_THREAD)
def test_the_thread_chain_is_the_measured_start_order(tmp_path, name):
    et, kineto = fixture_pair("cpu", name)
    out, report = tmp_path / "out.json", tmp_path / "report.json"
    link_pair(et, kineto, out, report_path=report)
    nodes = json.loads(out.read_text())["nodes"]
    timed = sorted((n for n in nodes if "ts" in n), key=lambda n: (n["ts"], n["id"]))
    assert len({n.get("tid") for n in timed if "continues" in n}) <= 1
    expected = Counter()
    for before, node in zip(timed, timed[1:]):
        cause = "parent" if _parent(node) == before["id"] else "thread_order"
        chain = [(d, c) for d, c in zip(node["data_deps"], node["data_dep_causes"]) if c in ("parent", "thread_order")]
        assert chain == [(before["id"], cause)], (node["id"], node["name"], chain, before["id"])
        expected[cause] += 1
    untimed = [n for n in nodes if "ts" not in n]  # the thread and process roots: the chain's head
    for node in untimed:
        for d, c in zip(node.get("data_deps", []), node.get("data_dep_causes", [])):
            expected[c] += 1
    first = timed[0]
    expected.update(c for c in first.get("data_dep_causes", []))
    counted = json.loads(report.read_text())
    assert counted["dependency_causes"] == dict(expected) and counted["dependencies"] == sum(expected.values())

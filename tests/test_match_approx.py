"""Approximate (structural) matching on real traces, against record-function-id ground truth."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from conftest import fixture_pair, shared_trace
from linker.read.et import read_execution_trace
from linker.read.kineto import read_kineto_trace
from linker.link.recipe import LinkOptions, link
from test_link_real import GPU_PAIRS, _cpu_pairs, _resolve, _rf_of_event, _score


def _mutated_kineto(k_path: Path, tmp_path: Path, drop: float, seed: int) -> tuple[Path, set, dict]:
    doc = json.loads(gzip.decompress(k_path.read_bytes()))
    truth = _rf_of_event(doc)
    rng = random.Random(seed)
    kept, absent = [], set()
    for e in doc["traceEvents"]:
        if drop and e.get("cat") == "cpu_op" and rng.random() < drop:
            absent.add(e["args"]["Record function id"])
            continue
        kept.append(e)
    for e in kept:
        e.get("args", {}).pop("Record function id", None)
    path = tmp_path / f"kineto_{seed}.json"
    path.write_text(json.dumps(dict(doc, traceEvents=kept)))
    return path, absent, truth


@pytest.mark.parametrize("spec", _cpu_pairs())
def test_structure_links_all_ops_without_rf_ids(spec, tmp_path):
    et_path, k_path = _resolve(spec)
    mutated, absent, truth = _mutated_kineto(k_path, tmp_path, 0.0, 0)
    et, kineto = read_execution_trace(et_path), read_kineto_trace(mutated)
    result = link(et, kineto, LinkOptions(method="approximate"))
    present, good, bad = _score(et, kineto, result.match.event_of_op, truth, absent)
    assert result.match.method == "approximate"
    assert good >= 0.999 * present and bad == 0
    stats = result.report.match_stats
    assert stats["tree_nodes"]["et"] == len(et.op_indices())
    assert stats["edit_cost"] == 0


@pytest.mark.parametrize("spec", _cpu_pairs())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_structure_survives_five_percent_deleted_events(spec, seed, tmp_path):
    et_path, k_path = _resolve(spec)
    mutated, absent, truth = _mutated_kineto(k_path, tmp_path, 0.05, seed)
    et, kineto = read_execution_trace(et_path), read_kineto_trace(mutated)
    result = link(et, kineto, LinkOptions(method="approximate"))
    present, good, bad = _score(et, kineto, result.match.event_of_op, truth, absent)
    assert good >= 0.97 * present, (good, present)
    assert bad <= 0.005 * present, (bad, present)
    assert result.report.match_stats["edit_cost"] > 0
    assert result.report.nesting_violations == 0


def test_main_thread_only_kineto(tmp_path):
    et_path, k_path = fixture_pair("cpu", "main_thread_only")
    mutated, absent, truth = _mutated_kineto(k_path, tmp_path, 0.0, 0)
    et, kineto = read_execution_trace(et_path), read_kineto_trace(mutated)
    result = link(et, kineto, LinkOptions(method="approximate"))
    threads = et.threads()
    assert len(threads) == 4
    [pair] = result.match.threads
    assert all(result.match.event_of_op[i] >= 0 for i in threads[pair.et_tid])
    assert sorted(result.match.unpaired_et_threads) == sorted(set(threads) - {pair.et_tid})
    _, good, bad = _score(et, kineto, result.match.event_of_op, truth, absent)
    assert bad == 0 and good == len(threads[pair.et_tid])


@pytest.mark.parametrize("pair", GPU_PAIRS)
def test_gpu_traces_structure(pair):
    directory, et_name, k_name = pair
    et = read_execution_trace(shared_trace(directory, et_name))
    kineto = read_kineto_trace(shared_trace(directory, k_name))
    result = link(et, kineto, LinkOptions(method="approximate"))
    exact = link(et, kineto, LinkOptions(method="exact"))
    report = result.report
    assert report.linked_ops >= 0.99 * report.et_ops
    assert report.nesting_violations == 0
    # where both methods link an op they agree (exact is 100% on these pairs)
    disagree = sum(1 for a, b in zip(result.match.event_of_op, exact.match.event_of_op) if a >= 0 and b >= 0 and a != b)
    assert disagree == 0


def test_auto_tries_structure_when_order_leaves_ops_unmatched(tmp_path):
    et_path, k_path = fixture_pair("cpu", "dataloader")
    mutated, absent, truth = _mutated_kineto(k_path, tmp_path, 0.10, 5)
    et, kineto = read_execution_trace(et_path), read_kineto_trace(mutated)
    exact = link(et, kineto, LinkOptions(method="exact")).match
    structural = link(et, kineto, LinkOptions(method="approximate")).match
    auto = link(et, kineto)
    # 10% of events gone: order alignment leaves more than the 2% threshold unmatched
    assert sum(1 for i in et.op_indices() if exact.event_of_op[i] < 0) > 0.02 * len(et.op_indices())
    reasons = " ".join(auto.report.method_reason)
    assert "structural matching" in reasons
    assert auto.match.linked == max(exact.linked, structural.linked)
    expected = "approximate" if structural.linked > exact.linked else "exact"
    assert auto.match.method == expected
    _, _, bad = _score(et, kineto, auto.match.event_of_op, truth, absent)
    assert bad <= 0.005 * len(et.op_indices())

"""Linking real trace pairs: rf_id ground truth, order alignment, GPU attribution, windows."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from conftest import dlrm_pair, fixture_pair, shared_trace
from linker.read.et import read_execution_trace
from linker.read.kineto import read_kineto_trace
from linker.link.recipe import LinkOptions, link

CPU_SHARED = ["mlp_1step", "mlp_multistep", "threads"]
CPU_OWN = ["mlp_steps", "threads", "dataloader"]


def _cpu_pairs():
    pairs = [pytest.param(("shared", name), id=f"shared-{name}") for name in CPU_SHARED]
    pairs += [pytest.param(("own", name), id=f"own-{name}") for name in CPU_OWN]
    return pairs


def _resolve(spec) -> tuple[Path, Path]:
    where, name = spec
    if where == "shared":
        return shared_trace("torch_cpu", name, "et.json.gz"), shared_trace("torch_cpu", name, "kineto.json.gz")
    return fixture_pair("cpu", name)


def _load_json(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return json.load(f)


def _write_kineto(tmp_path: Path, doc: dict, name: str) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _rf_of_event(kineto_doc: dict) -> dict:
    """(tid, ts, name) of each Kineto CPU event -> its record-function id (the ground truth)."""
    return {(e["tid"], float(e["ts"]), e["name"]): e["args"].get("Record function id")
            for e in kineto_doc["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")}


def _score(et, kineto, event_of_op, truth: dict, absent_rf: set) -> tuple[int, int, int]:
    """(present ops, correctly linked, wrongly linked) against rf_id ground truth."""
    present = [i for i in et.op_indices() if et.rf_id[i] not in absent_rf]
    good = bad = 0
    for i in present:
        e = event_of_op[i]
        if e < 0:
            continue
        ev = kineto.cpu_events[e]
        if truth[(ev.tid, ev.ts, ev.name)] == et.rf_id[i]:
            good += 1
        else:
            bad += 1
    return len(present), good, bad


@pytest.mark.parametrize("spec", _cpu_pairs())
def test_rf_id_links_every_op_to_its_record_function_event(spec):
    et_path, k_path = _resolve(spec)
    et, kineto = read_execution_trace(et_path), read_kineto_trace(k_path)
    result = link(et, kineto)
    assert result.match.method == "rf_id"
    ops = et.op_indices()
    assert result.report.linked_ops == len(ops)
    for i in ops:
        assert kineto.cpu_events[result.match.event_of_op[i]].args.rf_id == et.rf_id[i]
        assert kineto.cpu_events[result.match.event_of_op[i]].name == et.names[i]


@pytest.mark.parametrize("spec", _cpu_pairs())
def test_exact_match_without_rf_ids_equals_rf_join(spec, tmp_path):
    et_path, k_path = _resolve(spec)
    doc = _load_json(k_path)
    for e in doc["traceEvents"]:
        e.get("args", {}).pop("Record function id", None)
    stripped = _write_kineto(tmp_path, doc, "kineto_no_rf.json")
    et = read_execution_trace(et_path)
    by_rf = link(et, read_kineto_trace(k_path), LinkOptions(method="rf_id")).match.event_of_op
    kineto = read_kineto_trace(stripped)
    assert not kineto.has_record_function_ids()
    exact = link(et, kineto, LinkOptions(method="exact"))
    assert exact.match.event_of_op == by_rf
    auto = link(et, kineto)  # auto falls back to order alignment and says why
    assert auto.match.method == "exact"
    assert any("Record function id" in reason for reason in auto.report.method_reason)


@pytest.mark.parametrize("spec", _cpu_pairs())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_match_survives_five_percent_deleted_events(spec, seed, tmp_path):
    et_path, k_path = _resolve(spec)
    original = _load_json(k_path)
    truth = _rf_of_event(original)
    rng = random.Random(seed)
    kept, absent = [], set()
    for e in original["traceEvents"]:
        if e.get("cat") == "cpu_op" and rng.random() < 0.05:
            absent.add(e["args"]["Record function id"])
            continue
        kept.append(e)
    assert absent
    for e in kept:
        e.get("args", {}).pop("Record function id", None)
    mutated = _write_kineto(tmp_path, dict(original, traceEvents=kept), "kineto_cut.json")
    et, kineto = read_execution_trace(et_path), read_kineto_trace(mutated)
    result = link(et, kineto, LinkOptions(method="exact"))
    present, good, bad = _score(et, kineto, result.match.event_of_op, truth, absent)
    assert good >= 0.98 * present, (good, present)
    assert bad <= 0.002 * present, (bad, present)
    assert result.report.nesting_violations == 0


def _gpu_innermost_linked_ok(result) -> tuple[int, int]:
    """Brute force, independent of the linker's sweep: for each GPU op with a correlated launch
    inside some linked op, the innermost linked op covering the launch must be its parent."""
    kineto, match = result.kineto, result.match
    linked_events = {e: i for i, e in enumerate(match.event_of_op) if e >= 0}
    launches = {r.args.correlation: r for r in kineto.runtime_events if r.args.correlation is not None}
    parent_of_gpu = {id(l.event): l.et_index for l in result.gpu.links}
    checked = ok = 0
    for g in kineto.gpu_events:
        launch = launches.get(g.args.correlation)
        if launch is None or id(g) not in parent_of_gpu:
            continue
        covering = [e for e in linked_events
                    if kineto.cpu_events[e].tid == launch.tid and kineto.cpu_events[e].pid == launch.pid
                    and kineto.cpu_events[e].ts <= launch.ts <= kineto.cpu_events[e].end]
        if not covering:
            continue
        innermost = max(covering, key=lambda e: (kineto.cpu_events[e].ts, -kineto.cpu_events[e].dur))
        checked += 1
        ok += parent_of_gpu[id(g)] == linked_events[innermost]
    return checked, ok


GPU_PAIRS = [pytest.param(("param_dlrm", f"rank{r}.et.json.gz", f"rank{r}.kineto.json.gz"), id=f"dlrm{r}")
             for r in range(8)]
GPU_PAIRS += [pytest.param(("param_linear", "et.json.gz", "kineto.json.gz"), id="linear"),
              pytest.param(("hta_simple_add", "et.json.gz", "kineto.json.gz"), id="hta")]


@pytest.mark.parametrize("pair", GPU_PAIRS)
def test_gpu_traces_exact_match(pair):
    directory, et_name, k_name = pair
    et = read_execution_trace(shared_trace(directory, et_name))
    kineto = read_kineto_trace(shared_trace(directory, k_name))
    result = link(et, kineto, LinkOptions(method="exact"))
    report = result.report
    assert report.linked_ops >= 0.995 * report.et_ops
    assert report.nesting_violations == 0
    for i, e in enumerate(result.match.event_of_op):
        if e >= 0:
            assert kineto.cpu_events[e].name == et.names[i]
    checked, ok = _gpu_innermost_linked_ok(result)
    assert checked > 0 and ok == checked
    # every GPU op is either attached or counted with a reason
    assert report.gpu_events == report.gpu_events_linked + sum(report.gpu_attribution["problems"].values())


def test_param_linear_links_one_consistent_iteration():
    et = read_execution_trace(shared_trace("param_linear", "et.json.gz"))
    kineto = read_kineto_trace(shared_trace("param_linear", "kineto.json.gz"))
    result = link(et, kineto, LinkOptions(method="exact"))
    window = result.window
    assert window is not None and window.candidates == 40
    assert result.report.window["label"]
    linked = [kineto.cpu_events[e] for e in result.match.event_of_op if e >= 0]
    assert all(window.contains(e.ts) for e in linked)
    assert result.report.linked_ops == result.report.et_ops
    # GPU ops of other iterations are left out, not reported as failures
    assert result.gpu.outside_window > 0
    assert result.report.gpu_events == result.report.gpu_events_linked


def test_param_linear_window_can_be_picked_by_user():
    et = read_execution_trace(shared_trace("param_linear", "et.json.gz"))
    kineto = read_kineto_trace(shared_trace("param_linear", "kineto.json.gz"))
    chosen = link(et, kineto, LinkOptions(method="exact", window=7))
    assert chosen.window.index == 7 and chosen.window.source == "user"
    assert chosen.report.linked_ops == chosen.report.et_ops


def test_dlrm_nccl_kernels_sit_under_their_collective_op():
    et_path, k_path = dlrm_pair(0)
    et, kineto = read_execution_trace(et_path), read_kineto_trace(k_path)
    result = link(et, kineto)
    nccl = [l for l in result.gpu.links if l.event.name.startswith("ncclKernel")]
    assert nccl
    for l in nccl:
        assert et.names[l.et_index].startswith("nccl:")


def test_own_main_thread_only_fixture_reports_other_threads_unmatched():
    et_path, k_path = fixture_pair("cpu", "main_thread_only")
    et, kineto = read_execution_trace(et_path), read_kineto_trace(k_path)
    result = link(et, kineto, LinkOptions(method="exact"))
    threads = et.threads()
    assert len(threads) >= 2 and len(result.match.threads) == 1
    main = result.match.threads[0].et_tid
    assert all(result.match.event_of_op[i] >= 0 for i in threads[main])
    assert set(result.match.unpaired_et_threads) == set(threads) - {main}
    by_rf = link(et, kineto, LinkOptions(method="rf_id")).match.event_of_op
    assert [e for e in result.match.event_of_op] == by_rf

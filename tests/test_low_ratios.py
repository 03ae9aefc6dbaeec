"""The Kineto-only traces that replayed short: pre-trace GPU work in the graph, and the rest named.

On the real traces of ../shared/traces/kineto_only (skipped when absent). Expected values come from
the raw JSON events, computed here without et-link: a GPU event with no runtime call of its
correlation, whose correlation is below every runtime call's, was launched before the trace started.
"""

from __future__ import annotations

from collections import defaultdict

import orjson
import pytest

import linker
from conftest import dlrm_pair, shared_trace
from linker.pipeline import link_pair
from linker.sim.engine import LANES, replay
from linker.sim.load import load_graph
from linker.sim.report import build_report, format_text
from linker.sim.unheld import WAIT_CAUSES
from tracetools import load_trace

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
PROCESS_ROOT = "[pytorch|profiler|execution_trace|process]"
SHORT = ["amd_tracelens_mi300_resnet_ddp_rccl", "cudagraph_tracelens_mi300_vllm_graph_exec",
         "cudagraph_hta_a100_compile_cudagraphs"]


def _raw(name: str):
    trace = load_trace(shared_trace("kineto_only", name + ".json.gz"))
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    runtime = {e["args"]["correlation"] for e in events
               if e.get("cat") in RUNTIME_CATS and "correlation" in e.get("args", {})}
    first = min(c for c in runtime if isinstance(c, int))
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    pre = [e for e in gpu if e["args"].get("correlation") not in runtime and e["args"]["correlation"] < first]
    return events, gpu, pre


@pytest.fixture(scope="module")
def resnet(linked_once):
    name = "amd_tracelens_mi300_resnet_ddp_rccl"
    events, gpu, pre = _raw(name)
    out, _, _ = linked_once(None, shared_trace("kineto_only", name + ".json.gz"))
    return events, gpu, pre, orjson.loads(out.read_bytes())["nodes"]


def _key(e: dict) -> tuple:
    return (e["args"]["correlation"], e["ts"], e["name"])


def test_pre_trace_gpu_work_is_under_the_process_root_in_stream_order(resnet):
    _, gpu, pre, nodes = resnet
    assert len(pre) == 968  # the finding of issue 12's follow-up, from the raw events above
    by_id = {n["id"]: n for n in nodes}
    node_of = {(n["correlation"], n["ts"], n["name"]): n for n in nodes if n.get("cat") in GPU_CATS}
    for e in pre:
        node = node_of[_key(e)]
        assert by_id[node["ctrl_deps"]]["name"] == PROCESS_ROOT
        assert "launch" not in node.get("data_dep_causes", [])  # no launch edge from the root
    # The first traced op of each stream waits (stream_order) for the last pre-trace op before it.
    pre_keys = {_key(e) for e in pre}
    by_stream = defaultdict(list)
    for e in gpu:
        by_stream[e["tid"]].append(e)
    checked = 0
    for members in by_stream.values():
        members.sort(key=lambda e: e["ts"])
        traced = [e for e in members if _key(e) not in pre_keys]
        before = [e for e in members if _key(e) in pre_keys and e["ts"] < traced[0]["ts"]] if traced else []
        if not before:
            continue
        node = node_of[_key(traced[0])]
        source = node_of[_key(before[-1])]["id"]
        assert node["data_dep_causes"][node["data_deps"].index(source)] == "stream_order"
        checked += 1
    assert checked == 2  # both streams of the trace had pre-trace work


def test_pre_trace_ops_get_no_edge_from_timestamps_alone(resnet):
    """A GPU op launched before the trace has no launch and no recorded wait call: its only
    dependencies are its parent (the process root) and its stream predecessor. An edge to another
    stream's op that merely ended just before it would rest on timestamp adjacency alone."""
    _, gpu, pre, nodes = resnet
    node_of = {(n["correlation"], n["ts"], n["name"]): n for n in nodes if n.get("cat") in GPU_CATS}
    checked = 0
    for e in pre:
        node = node_of[_key(e)]
        causes = node.get("data_dep_causes", [])
        assert set(causes) <= {"parent", "stream_order"}, (_key(e), causes)
        checked += 1
    assert checked == len(pre)


@pytest.fixture(scope="module", params=SHORT)
def replayed(request, linked_once):
    name = request.param
    events, gpu, pre = _raw(name)
    out, _, _ = linked_once(None, shared_trace("kineto_only", name + ".json.gz"))
    report = build_report(replay([load_graph(out)], LANES))[0]
    return name, events, gpu, pre, report


def test_simulate_names_the_gpu_wait_the_graph_cannot_reproduce(replayed):
    name, events, gpu, pre, report = replayed
    wait = report.unheld_gpu_wait[0]
    text = format_text(report)
    assert "the graph cannot reproduce" in text and wait.streams[0].lane in text
    for largest in wait.largest:  # each of the largest waits with its cause, one of the named ones
        assert largest["cause"] in WAIT_CAUSES and f"(id {largest['id']}) " in text
        assert f"({largest['cause']})" in text
    # What the replay misses is within what the note names.
    assert report.measured_us - report.simulated_us <= wait.us
    host_end = max(e["ts"] + e["dur"] for e in events if e.get("cat") in HOST_CATS)
    traced = [e for e in gpu if e not in pre]
    first = min(traced, key=lambda e: e["ts"])
    if first["ts"] > host_end:  # vllm: the GPU began after the host had finished everything
        assert wait.us >= first["ts"] - host_end


def test_pre_trace_work_raises_the_resnet_ratio(linked_once):
    name = "amd_tracelens_mi300_resnet_ddp_rccl"
    _, _, pre = _raw(name)
    out, _, _ = linked_once(None, shared_trace("kineto_only", name + ".json.gz"))
    report = build_report(replay([load_graph(out)], LANES))[0]
    # Without the pre-trace GPU work the replay was 0.717 of the measured step; its pre-trace
    # GPU busy time alone must now be in the replay.
    assert report.ratio > 0.85
    assert report.busy_us["gpu"] + report.busy_us["comm"] >= sum(e["dur"] for e in pre)


def test_no_note_when_the_replay_is_not_short(tmp_path):
    # param_dlrm rank 1: GPU ops wait after their dependencies (8% of the step), but other time
    # makes up for it and the replay is within 1%: nothing to explain, no note.
    et, kineto = dlrm_pair(1)
    out = tmp_path / "rank1.et"
    link_pair(et, kineto, out, None, None)
    report = build_report(replay([load_graph(out)], LANES))[0]
    assert report.unheld_gpu_wait[0].us >= 0.01 * report.measured_us
    assert 0.97 <= report.ratio <= 1.03
    assert "cannot reproduce" not in format_text(report)


def test_a_synchronize_waits_for_the_work_launched_before_the_trace(linked_once):
    """A public MI300 trace (TraceLens test data) begins with a ``hipDeviceSynchronize`` that lasts
    13 ms: the GPU is still running the previous step's kernels, launched before the trace began.
    What the thread ran after the call waits (``sync``) for the last of them, not for a traced op
    or an earlier one: the op around the call (``ProfilerStep#6``) goes on after it returns, so
    that part of it; with the graph alone the step then replays within 5% (it replayed at 0.915
    when the wait was tied to the last op started before the call began). Expected nodes from the
    raw events."""
    path = shared_trace("sweep", "tl__mi300__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    events = [e for e in load_trace(path)["traceEvents"] if e.get("ph") == "X"]
    runtime = [e for e in events if e.get("cat") in RUNTIME_CATS]
    first_call = min(e["args"]["correlation"] for e in runtime)
    sync = min((e for e in runtime if e["name"].endswith("DeviceSynchronize")), key=lambda e: e["ts"])
    pre = [e for e in events if e.get("cat") in GPU_CATS and e["args"]["correlation"] < first_call]
    last_pre = max(pre, key=lambda e: e["ts"])
    assert last_pre["ts"] + last_pre["dur"] > sync["ts"] + 10_000  # it ran 10 ms and more past the call's start
    returned = sync["ts"] + sync["dur"]
    host = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation") and e["tid"] == sync["tid"]]
    around = min((e for e in host if e["ts"] <= sync["ts"] and returned <= e["ts"] + e["dur"]), key=lambda e: e["dur"])
    after = min((e for e in host if e["ts"] >= returned), key=lambda e: e["ts"])
    assert around["name"].startswith("ProfilerStep") and after["ts"] > returned + 1  # its own time goes on
    out, _, _ = linked_once(None, path)
    nodes = orjson.loads(out.read_bytes())["nodes"]
    node_of = {(n.get("correlation"), n.get("ts"), n["name"]): n for n in nodes if n.get("cat") in GPU_CATS}
    op = next(n for n in nodes if n.get("ts") == around["ts"] and n["name"] == around["name"] and "continues" not in n)
    target = next(n for n in nodes if n.get("continues") == op["id"] and n["ts"] == returned)
    waited = [d for d, c in zip(target["data_deps"], target["data_dep_causes"]) if c == "sync"]
    assert waited == [node_of[_key(last_pre)]["id"]]
    explained = linker.simulate(out, waits="explained").report
    assert 0.95 <= explained.ratio <= 1.05

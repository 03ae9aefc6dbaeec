"""Every GPU launch shape of issue 12, on the hand-made pairs of scripts/make_gpu_shape_fixtures.py.

Both paths are checked against the generator's ground truth (truth.json): linked with the ET, and
from the Kineto trace alone. The shapes: work launched before the trace started, graph launches
carrying several GPU ops on one correlation (CUDA inside an op, ROCm inside an annotation only and
without External id), every launch call name, an Inductor op named after its Triton kernel,
launches inside a Python function only or outside everything, lone ac2g ``f`` flows, 2023-style
runtime External ids, ROCm placement (pid = device, tid = stream, hex stream strings), and
Record function ids that are all 0 (unknown).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import FIXTURES
from linker.pipeline import link_pair
from linker.write.validate import validate_file
from tracetools import load_trace

PAIRS = ["shapes_cuda", "shapes_rocm"]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
ISSUE_LAUNCH_NAMES = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
    "cudaMemcpyAsync", "cudaMemsetAsync", "hipLaunchKernel", "hipExtLaunchKernel", "hipExtModuleLaunchKernel",
    "hipModuleLaunchKernel", "hipGraphLaunch", "hipMemcpyAsync", "hipMemcpyWithStream", "hipMemsetAsync"}


def _run(name: str, tmp_path, with_et: bool, suffix: str = ".json"):
    directory = FIXTURES / "gpu" / name
    out, rep = tmp_path / f"plus{suffix}", tmp_path / "report.json"
    link_pair(directory / "et.json.gz" if with_et else None, directory / "kineto.json.gz", out, None, rep)
    truth = json.loads((directory / "truth.json").read_text())
    report = json.loads(rep.read_text())
    return truth, report, out


# An op launched before the trace (the truth's reason) is written under the process root, so its
# stream's traced work waits behind it in a replay; the report counts it under that reason.
BEFORE_TRACE = "before_trace"
PROCESS_ROOTS = ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_graph|process]")


def _adopted(reason: str) -> str:
    return "before_trace_under_process_root" if reason == BEFORE_TRACE else reason


def _gpu_nodes(out) -> tuple[dict, dict]:
    nodes = json.loads(out.read_bytes())["nodes"]
    return ({(n["correlation"], n["name"], n["ts"]): n for n in nodes if n.get("cat") in GPU_CATS},
            {n["id"]: n for n in nodes})


@pytest.mark.parametrize("name", PAIRS)
def test_linked_with_et_every_gpu_op_as_truth_says(name, tmp_path):
    truth, report, out = _run(name, tmp_path, with_et=True)
    gpu, by_id = _gpu_nodes(out)
    for op in truth["gpu_ops"]:
        key = (op["correlation"], op["name"], op["ts"])
        if op["et_reason"] == BEFORE_TRACE:  # no launch: written under the process root
            assert by_id[gpu[key]["ctrl_deps"]]["name"] in PROCESS_ROOTS, op
        elif op["et_id"] is None:
            assert key not in gpu, op
        else:
            assert gpu[key]["ctrl_deps"] == op["et_id"], op
    assert len(gpu) == sum(1 for op in truth["gpu_ops"] if op["et_id"] is not None or op["et_reason"] == BEFORE_TRACE)
    rows = {row["reason"]: row["count"] for row in report["gpu_accounting"]}
    assert rows == dict(Counter(_adopted(op["et_reason"]) for op in truth["gpu_ops"]))
    assert sum(rows.values()) == len(truth["gpu_ops"]) == report["gpu_events_in_trace"]
    # Record function ids are all 0 here: unknown, so the ids are not joined on.
    assert report["method"] == "exact" and "is 0" in report["method_reason"][0]
    assert report["linked_pct"] == 100.0


@pytest.mark.parametrize("name", PAIRS)
def test_kineto_only_every_gpu_op_as_truth_says(name, tmp_path):
    truth, report, out = _run(name, tmp_path, with_et=False)
    gpu, by_id = _gpu_nodes(out)
    for op in truth["gpu_ops"]:
        key = (op["correlation"], op["name"], op["ts"])
        if op["kineto_reason"] == BEFORE_TRACE:
            assert by_id[gpu[key]["ctrl_deps"]]["name"] in PROCESS_ROOTS, op
        elif op["kineto_parent"] is None:
            assert key not in gpu, op
        else:
            parent = by_id[gpu[key]["ctrl_deps"]]
            assert [parent["name"], parent["ts"]] == op["kineto_parent"], op
    rows = {row["reason"]: row["count"] for row in report["gpu_accounting"]}
    assert rows == dict(Counter(_adopted(op["kineto_reason"]) for op in truth["gpu_ops"]))
    assert report["host_graph"] == "kineto"


@pytest.mark.parametrize("name", PAIRS)
def test_gpu_nodes_keep_device_and_stream_and_graph_stream_order(name, tmp_path):
    _, _, out = _run(name, tmp_path, with_et=True)
    gpu, _ = _gpu_nodes(out)
    raw = [e for e in load_trace(FIXTURES / "gpu" / name / "kineto.json.gz")["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    for e in raw:
        node = gpu.get((e["args"]["correlation"], e["name"], e["ts"]))
        if node is not None:
            assert (node["device"], node["stream"]) == (e["pid"], e["tid"])
    by_corr: dict = {}
    for node in gpu.values():
        by_corr.setdefault(node["correlation"], []).append(node)
    graphs = [members for members in by_corr.values() if len(members) > 1]
    assert graphs  # both pairs have a graph launch carrying several GPU ops
    for members in graphs:
        members.sort(key=lambda n: n["id"])
        for stream in {n["stream"] for n in members}:
            ts = [n["ts"] for n in members if n["stream"] == stream]
            assert ts == sorted(ts)


def test_every_issue_launch_name_is_known_and_attached(tmp_path):
    seen = Counter()
    for name in PAIRS:
        (tmp_path / name).mkdir()
        _, report, _ = _run(name, tmp_path / name, with_et=False)
        assert report["gpu_attribution"]["launch_names_not_in_known_list"] == {}
        seen.update(report["gpu_attribution"]["launch_names"])
    assert set(seen) == ISSUE_LAUNCH_NAMES


@pytest.mark.parametrize("name", PAIRS)
@pytest.mark.parametrize("with_et", [True, False])
def test_chakra_output_of_every_shape_validates(name, with_et, tmp_path):
    _, report, out = _run(name, tmp_path, with_et=with_et, suffix=".et")
    result = validate_file(out)
    assert result.ok


def test_reader_keeps_python_functions_only_around_uncovered_launches():
    from linker.read.kineto import read_kineto_trace

    for name in PAIRS:
        path = FIXTURES / "gpu" / name / "kineto.json.gz"
        raw = [e for e in load_trace(path)["traceEvents"] if e.get("cat") == "python_function"]
        kept = read_kineto_trace(path).python_events
        # the one around the Python-only launch; not the ones around covered launches
        assert len(raw) > len(kept) == 1 or (len(raw) == len(kept) == 1)
        assert kept[0].name.startswith(("torch/cuda/graphs.py", "torch/_ops.py"))

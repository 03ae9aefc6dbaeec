"""Kineto-only input on the ten real GPU traces of ../shared/traces/kineto_only (skipped when absent).

The expected answer for every GPU event is computed here from the raw JSON events, without et-link:
its launch is the runtime/driver event with the same correlation; the CPU event it belongs under
is the innermost cpu_op/user_annotation on the launch's thread covering the launch time (a heap
sweep, written independently of ``linker.link.intervals``), else the innermost python_function; an
event without a launch whose correlation is below every runtime correlation was launched before
the trace started. The test then checks et-link's ET+ JSON and report against that.
"""

from __future__ import annotations

import heapq
import json
import subprocess
import sys
from collections import Counter, defaultdict

import orjson
import pytest

from conftest import FIXTURES, shared_trace
from tracetools import load_trace

TRACES = [
    "amd_hta_mi250_minitoy_rocm62",
    "amd_tracelens_mi300_resnet_ddp_rccl",
    "cudagraph_hta_a100_compile_cudagraphs",
    "cudagraph_tracelens_mi300_vllm_graph_exec",
    "multistream_hta_a100_event_sync",
    "multistream_hta_a100_nccl_rank0",
    "recent_tracelens_b200_eager",
    "recent_tracelens_h100_bert_small",
    "triton_hta_a100_triton_example",
    "triton_tracelens_mi300_torch_compile",
]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch")
ROOT = ("process root", None)  # expected parent of a GPU event launched before the trace


def _innermost(events: list[dict], queries: list[tuple]) -> dict:
    """query (pid, tid, t) -> the covering events with the latest start and, among those, the
    shortest duration (several only when intervals are identical). Heap sweep per thread."""
    by_thread = defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
    answer = {}
    wanted = defaultdict(set)
    for pid, tid, t in queries:
        wanted[(pid, tid)].add(t)
    same_interval = defaultdict(list)  # events with identical intervals are equally innermost
    for e in events:
        same_interval[((e["pid"], e["tid"]), e["ts"], e["dur"])].append(e)
    for key, times in wanted.items():
        thread = sorted(by_thread.get(key, []), key=lambda e: e["ts"])
        heap, k = [], 0
        for t in sorted(times):
            while k < len(thread) and thread[k]["ts"] <= t:
                e = thread[k]
                heapq.heappush(heap, (-e["ts"], e["dur"], k, e))
                k += 1
            while heap and heap[0][3]["ts"] + heap[0][3]["dur"] < t:
                heapq.heappop(heap)  # ended before t: ended before every later query too
            top = heap[0][3] if heap else None
            answer[(key[0], key[1], t)] = same_interval[(key, top["ts"], top["dur"])] if top else []
    return answer


def _expected(doc: dict) -> dict:
    x = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    host = [e for e in x if e.get("cat") in HOST_CATS]
    python = [e for e in x if e.get("cat") == "python_function"]
    runtime = {e["args"]["correlation"]: e for e in x
               if e.get("cat") in RUNTIME_CATS and "correlation" in e.get("args", {})}
    gpu = [e for e in x if e.get("cat") in GPU_CATS]
    first = min(runtime)
    launches = {(runtime[g["args"]["correlation"]]["pid"], runtime[g["args"]["correlation"]]["tid"],
                 runtime[g["args"]["correlation"]]["ts"])
                for g in gpu if g["args"].get("correlation") in runtime}
    in_host = _innermost(host, sorted(launches))
    in_python = _innermost(python, sorted(q for q in launches if not in_host[q]))
    parents, reasons = [], Counter()
    for g in gpu:
        launch = runtime.get(g["args"].get("correlation"))
        if launch is None:
            before = g["args"]["correlation"] < first
            parents.append(ROOT if before else None)  # before the trace: under the process root
            reasons["before_trace_under_process_root" if before else "no_launch"] += 1
            continue
        q = (launch["pid"], launch["tid"], launch["ts"])
        candidates = in_host[q] or in_python.get(q, [])
        parents.append((candidates, launch["name"]))
        if not candidates:
            reasons["launch_outside_cpu_ops"] += 1
        elif candidates[0]["cat"] == "user_annotation":
            reasons["under_annotation"] += 1
        elif candidates[0]["cat"] == "python_function":
            reasons["under_python_function"] += 1
        elif launch["name"] in GRAPH_LAUNCHES:
            reasons["under_graph_launch_op"] += 1
        else:
            reasons["under_op"] += 1
    return {"gpu": gpu, "parents": parents, "reasons": reasons, "host": host,
            "python_parents": {id(e) for q in in_python for e in in_python[q][:1]}}


@pytest.fixture(scope="module", params=TRACES)
def linked(request, linked_once):
    path = shared_trace("kineto_only", request.param + ".json.gz")
    output, report, outcome = linked_once(None, path)
    return (request.param, _expected(load_trace(path)), orjson.loads(output.read_bytes()),
            json.loads(report.read_bytes()), outcome)


def test_every_gpu_event_hangs_under_the_innermost_event_covering_its_launch(linked):
    name, expected, plus, report, _ = linked
    nodes = {n["id"]: n for n in plus["nodes"]}
    have = {}
    for n in plus["nodes"]:
        if n.get("cat") in GPU_CATS:
            parent = nodes[n["ctrl_deps"]]
            have.setdefault((n["correlation"], n["ts"], n["name"]), []).append(
                (parent.get("ts"), parent.get("dur"), parent["name"]))
    attached = 0
    for g, parent in zip(expected["gpu"], expected["parents"]):
        if parent is ROOT:
            found = have[(g["args"]["correlation"], g["ts"], g["name"])].pop()
            assert found[2] == "[pytorch|profiler|execution_trace|process]", (name, g["name"])
            continue
        if parent is None or not parent[0]:
            continue
        # Identical intervals (integer-µs traces) make several events equally innermost: any of
        # them is right; they share ts and dur.
        allowed = {c["name"] for c in parent[0]}
        best = parent[0][0]
        found = have[(g["args"]["correlation"], g["ts"], g["name"])].pop()
        assert found[:2] == (best["ts"], best["dur"]) and found[2] in allowed, (name, g["name"])
        attached += 1
    assert attached > 0
    assert all(not left for left in have.values())  # no GPU node the raw events do not explain


def test_graph_kernels_hang_under_the_graph_launch_in_stream_order(linked):
    name, expected, plus, _, _ = linked
    graph_corrs = {g["args"]["correlation"] for g, p in zip(expected["gpu"], expected["parents"])
                   if p is not None and p[1] in GRAPH_LAUNCHES}
    by_corr = defaultdict(list)
    for n in plus["nodes"]:
        if n.get("cat") in GPU_CATS and n["correlation"] in graph_corrs:
            by_corr[n["correlation"]].append(n)
    for corr, members in by_corr.items():
        assert len({m["ctrl_deps"] for m in members}) == 1, (name, corr)
        members.sort(key=lambda m: m["id"])
        streams = defaultdict(list)
        for m in members:
            streams[(m["device"], m["stream"])].append(m["ts"])
        assert all(ts == sorted(ts) for ts in streams.values()), (name, corr)
    if name.startswith("cudagraph"):
        assert graph_corrs and len(by_corr) == len(graph_corrs)


def test_report_accounts_for_every_gpu_event_in_words(linked):
    name, expected, _, report, _ = linked
    rows = {row["reason"]: row["count"] for row in report["gpu_accounting"]}
    assert sum(rows.values()) == len(expected["gpu"]) == report["gpu_events_in_trace"]
    assert rows == {reason: n for reason, n in expected["reasons"].items() if n}
    assert all(row["meaning"] and " " in row["meaning"] for row in report["gpu_accounting"])
    assert report["host_graph"] == "kineto" and report["et_file"] is None
    assert "Kineto trace alone" in report["method_reason"][0]


def test_host_graph_has_one_node_per_cpu_event_nested_by_interval(linked):
    name, expected, plus, report, _ = linked
    ops = [n for n in plus["nodes"] if "ts" in n and n.get("cat") not in GPU_CATS and "continues" not in n]
    want = Counter((e["name"], e["ts"], e["dur"]) for e in expected["host"])
    have = Counter((n["name"], n["ts"], n["dur"]) for n in ops)
    extra = have - want  # python functions added around launches outside every op
    assert have - extra == want
    assert sum(extra.values()) == len(expected["python_parents"])
    nodes = {n["id"]: n for n in plus["nodes"]}
    for n in ops:
        parent = nodes[n["ctrl_deps"]]
        if "ts" in parent:
            assert parent["ts"] <= n["ts"] and n["ts"] <= parent["ts"] + parent["dur"]
    assert report["nesting_violations"] == sum(
        1 for n in ops if "ts" in nodes[n["ctrl_deps"]]
        and n["ts"] + n["dur"] > nodes[n["ctrl_deps"]]["ts"] + nodes[n["ctrl_deps"]]["dur"] + 0.001)


# --- the command line, on the hand-written GPU fixtures (always present) ------------------------

def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linker.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_cli_links_a_kineto_trace_without_an_et(tmp_path):
    kineto = FIXTURES / "gpu" / "gpu_v111" / "kineto.json.gz"
    out, rep = tmp_path / "plus.et", tmp_path / "report.json"
    proc = _cli("--kineto-file", kineto, "-o", out, "--report", rep)
    assert proc.returncode == 0, proc.stderr
    assert "built from the Kineto trace alone" in proc.stderr
    report = json.loads(rep.read_text())
    raw = load_trace(kineto)["traceEvents"]
    assert report["host_graph"] == "kineto"
    assert report["et_ops"] == sum(1 for e in raw if e.get("ph") == "X" and e.get("cat") in HOST_CATS)
    assert report["gpu_events_in_trace"] == sum(1 for e in raw if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    assert _cli("validate", out).returncode == 0
    # default output name beside the Kineto file, on a copy
    copy = tmp_path / "trace.json.gz"
    copy.write_bytes(kineto.read_bytes())
    assert _cli("--kineto-file", copy, "-q").returncode == 0
    assert (tmp_path / "trace_plus.json").exists()
    ignored = _cli("--kineto-file", copy, "-o", tmp_path / "x.json", "--exact-match", "-q")
    assert ignored.returncode == 0 and "ignored" in ignored.stderr


def test_cli_kineto_only_bad_input_is_one_line(tmp_path):
    et = FIXTURES / "gpu" / "gpu_v111" / "et.json.gz"
    out = tmp_path / "o.json"
    proc = _cli("--kineto-file", et, "-o", out)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and str(et) in lines[0] and not out.exists()


def test_batch_links_kineto_only_ranks(tmp_path):
    # Two dialects of one workload: v101's Kineto records no collective sizes, so the cross-rank
    # collective check sees different collectives (exit 8); --allow-mismatch links them anyway.
    for rank, name in enumerate(("gpu_v111", "gpu_v101")):
        (tmp_path / f"rank{rank}.kineto.json.gz").write_bytes(
            (FIXTURES / "gpu" / name / "kineto.json.gz").read_bytes())
    out = tmp_path / "out"
    proc = _cli("batch", "--kineto", tmp_path / "rank*.kineto.json.gz", "--output-dir", out,
                "--rank-pattern", r"rank(\d+)", "--format", "et", "--workers", "1", "-q", "--allow-mismatch")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["collectives"]["status"] == "mismatch"
    assert [r["status"] for r in summary["ranks"]] == ["linked", "linked"]
    assert all(r["method"] == "kineto_only" and r["et"] is None for r in summary["ranks"])
    assert _cli("validate", *(r["output"] for r in summary["ranks"])).returncode == 0


def test_host_graph_keeps_record_function_ids_with_zero_as_unknown(linked):
    name, expected, plus, _, _ = linked
    def rf(node):
        return next(a["value"] for a in node["attrs"] if a["name"] == "rf_id")
    have = Counter((n["name"], n["ts"], rf(n)) for n in plus["nodes"]
                   if "ts" in n and n.get("cat") not in GPU_CATS and "continues" not in n)
    want = Counter((e["name"], e["ts"], e["args"].get("Record function id") or 0) for e in expected["host"])
    assert want - have == Counter()
    if name in ("multistream_hta_a100_nccl_rank0", "amd_hta_mi250_minitoy_rocm62"):
        assert sum(1 for key in want if key[2]) > 0  # the two traces with real ids keep them


def test_reader_drops_python_functions_when_every_launch_is_covered():
    from linker.read.kineto import read_kineto_trace

    path = shared_trace("kineto_only", "cudagraph_tracelens_mi300_vllm_graph_exec.json.gz")
    raw = [e for e in load_trace(path)["traceEvents"] if e.get("cat") == "python_function"]
    assert len(raw) > 0 and read_kineto_trace(path).python_events == []


@pytest.mark.parametrize("rf_id, thread", [(0, 0), (1, 1), (123456789, 3), (2**64 - 1, 7)])
def test_host_graph_attrs_are_the_json_of_the_attr_list(rf_id, thread):
    import msgspec

    from linker.link.kineto_only import _attrs

    expected = msgspec.json.encode([
        {"name": "rf_id", "type": "uint64", "value": rf_id},
        {"name": "fw_parent", "type": "uint64", "value": 0},
        {"name": "seq_id", "type": "int64", "value": -1},
        {"name": "scope", "type": "uint64", "value": 0},
        {"name": "tid", "type": "uint64", "value": thread},
        {"name": "fw_tid", "type": "uint64", "value": 0},
        {"name": "op_schema", "type": "string", "value": ""},
    ])
    assert bytes(_attrs(rf_id, thread)) == expected
    assert msgspec.json.decode(bytes(_attrs(rf_id, thread)))[0]["value"] == rf_id


@pytest.mark.parametrize("dims, shapes", [
    (None, None), (b"[]", b"[]"), (b"[[1,2],[]]", b"[[1,2],[]]"), (b" \n[[3]]", b" \n[[3]]"),
    (b"null", None), (b"", None), (b'"x"', None), (b"[ ]", b"[ ]"),
])
def test_host_graph_inputs_carry_the_input_dims_as_shapes(dims, shapes):
    import msgspec

    from linker.link.kineto_only import _inputs
    from linker.read.kineto import KinetoArgs, KinetoEvent

    args = KinetoArgs() if dims is None else KinetoArgs(input_dims=msgspec.Raw(dims))
    got = bytes(_inputs(KinetoEvent(args=args)))
    shapes = b"[]" if shapes is None else shapes
    assert got == b'{"values":[],"shapes":' + shapes + b',"types":[],"strides":[]}'

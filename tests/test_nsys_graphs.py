"""CUDA graphs in an Nsight Systems capture hang under the op that launched the graph.

The fixture is ``tests/fixtures/gpu/cuda_graphs`` (``scripts/make_gpu_graph_fixture.py``: a
made-up Kineto trace shaped like a compiled, graph-replaying training step), converted by
``scripts/kineto_to_sqlite.py`` into both forms nsys writes: per kernel (``--cuda-graph-trace=node``:
kernel rows with ``graphId`` / ``graphNodeId``, the launch's correlation) and per launch
(``--cuda-graph-trace=graph``: one ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row, the kernels absent).

Expected values are computed here from the raw Kineto JSON, without et-link: a graph launch's
op is the innermost ``cpu_op`` / ``user_annotation`` on the launch's thread covering the launch
(latest start, then shortest); a graph is the sequence (category, name, stream) of a launch's GPU
ops, numbered in order of first launch; a whole-graph row spans the launch's first op's start to
its last op's end, on the first op's device and stream.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sqlite3
from collections import defaultdict

import orjson
import pytest

from conftest import FIXTURES, ROOT
from linker.pipeline import link_pair
from linker.read.timing import read_timing_trace

KINETO = FIXTURES / "gpu" / "cuda_graphs" / "kineto.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


converter = _script("kineto_to_sqlite")


def _expected() -> dict:
    """correlation of each graph launch -> {ops: its GPU ops in start order, parent: (name, ts,
    dur) of the innermost host event covering the launch or None, graph: its number}."""
    events = [e for e in json.loads(gzip.decompress(KINETO.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    host = [e for e in events if e["cat"] in HOST_CATS]
    graphs = {}
    numbers: dict[tuple, int] = {}
    launches = sorted((e for e in events if e["cat"] == "cuda_runtime" and e["name"] == "cudaGraphLaunch"),
                      key=lambda e: e["ts"])
    for launch in launches:
        corr = launch["args"]["correlation"]
        ops = sorted((e for e in events if e["cat"] in GPU_CATS and e["args"]["correlation"] == corr),
                     key=lambda e: e["ts"])
        covering = [h for h in host if (h["pid"], h["tid"]) == (launch["pid"], launch["tid"])
                    and h["ts"] <= launch["ts"] and h["ts"] + h["dur"] >= launch["ts"] + launch["dur"]]
        inner = min(covering, key=lambda h: (-h["ts"], h["dur"])) if covering else None
        signature = tuple((e["cat"], e["name"], e["args"]["stream"]) for e in ops)
        graphs[corr] = {"ops": ops, "graph": numbers.setdefault(signature, len(numbers) + 1),
                        "parent": (inner["name"], inner["ts"], inner["dur"]) if inner else None}
    return graphs


EXPECTED = _expected()


def _gpu_nodes(output) -> dict:
    """correlation -> [(GPU node, its parent node)] of an ET+ JSON."""
    doc = orjson.loads(output.read_bytes())
    nodes = {n["id"]: n for n in doc["nodes"]}
    found = defaultdict(list)
    for n in doc["nodes"]:
        if n.get("cat") in GPU_CATS:
            found[n["correlation"]].append((n, nodes.get(n.get("ctrl_deps"))))
    return found


def _parent(node) -> tuple | None:
    return (node["name"], node["ts"], node["dur"]) if node is not None and "ts" in node else None


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    """Kineto, nsys per kernel and nsys per graph launch, each linked alone: (output, report)."""
    folder = tmp_path_factory.mktemp("graphs")
    node, graph = folder / "node.sqlite", folder / "graph.sqlite"
    converter.write_nsys(KINETO, node)
    converter.write_nsys(KINETO, graph, graph_trace=True)
    out = {}
    for name, source in (("kineto", KINETO), ("node", node), ("graph", graph)):
        output, report = folder / f"{name}.json", folder / f"{name}.report.json"
        link_pair(None, source, output, None, report)
        out[name] = (output, json.loads(report.read_bytes()), source)
    return out


def test_fixture_script_writes_the_committed_bytes(tmp_path):
    written = _script("make_gpu_graph_fixture").write(tmp_path)
    assert written.read_bytes() == KINETO.read_bytes()
    assert len(EXPECTED) == 7 and sorted({g["graph"] for g in EXPECTED.values()}) == [1, 2, 3]
    assert sum(g["parent"] is None for g in EXPECTED.values()) == 1  # one launch outside every op


def test_converter_writes_graph_ids_on_graph_rows_only(linked):
    with sqlite3.connect(linked["node"][2]) as db:
        kernels = db.execute("SELECT correlationId, graphId, graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL "
                             "ORDER BY start").fetchall()
        memsets = db.execute("SELECT graphNodeId FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
        mode = db.execute("SELECT value FROM META_DATA_CAPTURE").fetchone()[0]
    assert mode == "Node"
    got = defaultdict(list)
    for corr, graph, node in kernels:
        if corr in EXPECTED:
            got[corr].append((graph, node))
        else:
            assert graph is None and node is None
    for corr, expected in EXPECTED.items():
        graph = expected["graph"]  # node id: graph * 1000 + the op's place among the launch's ops
        assert got[corr] == [(graph, graph * 1000 + place) for place, e in enumerate(expected["ops"], start=1)
                             if e["cat"] == "kernel"]
    assert memsets == [(1002,), (1002,)]  # graph A's second op, in both steps


def test_graph_kernels_hang_under_the_innermost_op_around_the_launch(linked):
    """Per kernel (node mode): every GPU op of a graph under the op covering its launch, as in
    the Kineto reading of the same trace; the launch outside every op attaches nowhere in both."""
    kineto, nsys = _gpu_nodes(linked["kineto"][0]), _gpu_nodes(linked["node"][0])
    for corr, expected in EXPECTED.items():
        mine = sorted(nsys[corr], key=lambda pair: pair[0]["ts"])
        theirs = sorted(kineto[corr], key=lambda pair: pair[0]["ts"])
        if expected["parent"] is None:
            assert all(_parent(p) is None for _, p in mine + theirs)
            continue
        assert [n["name"] for n, _ in mine] == [e["name"] for e in expected["ops"]]
        assert {_parent(p) for _, p in mine} == {expected["parent"]} == {_parent(p) for _, p in theirs}
        assert [(n["ts"], n["dur"], n["stream"]) for n, _ in mine] == [(n["ts"], n["dur"], n["stream"])
                                                                       for n, _ in theirs]
    # NVTX does not tell a user annotation from an op: Kineto's "under_annotation" (graph B's ops
    # under "## replay ##") is an op's in the capture.
    rows = {r["reason"]: r["count"] for r in linked["node"][1]["gpu_accounting"]}
    theirs = {r["reason"]: r["count"] for r in linked["kineto"][1]["gpu_accounting"]}
    theirs["under_graph_launch_op"] += theirs.pop("under_annotation")
    assert rows == theirs
    assert rows["under_graph_launch_op"] == sum(len(g["ops"]) for g in EXPECTED.values() if g["parent"])


def test_graph_trace_rows_read_as_one_gpu_op_per_launch(linked):
    """Per launch (graph mode): one kernel ``CUDA graph <id>`` spanning the launch's GPU ops,
    under the op that launched it, and no kernel of any graph."""
    output, report, _ = linked["graph"]
    nsys = _gpu_nodes(output)
    for corr, expected in EXPECTED.items():
        if expected["parent"] is None:
            assert all(_parent(p) is None for _, p in nsys.get(corr, []))
            continue
        [(node, parent)] = nsys[corr]
        first, ops = expected["ops"][0], expected["ops"]
        assert node["name"] == f"CUDA graph {expected['graph']}" and node["cat"] == "kernel"
        assert node["ts"] == pytest.approx(first["ts"], abs=1e-6)
        assert node["dur"] == pytest.approx(max(e["ts"] + e["dur"] for e in ops) - first["ts"], abs=1e-6)
        assert (node["stream"], node["device"]) == (first["args"]["stream"], first["args"]["device"])
        assert _parent(parent) == expected["parent"]
    rows = {r["reason"]: r["count"] for r in report["gpu_accounting"]}
    assert rows["under_graph_launch_op"] == sum(1 for g in EXPECTED.values() if g["parent"])
    assert any(line.startswith(f"{len(EXPECTED)} CUDA graph launches read as one GPU op each")
               for line in report["method_reason"])


def _add_graph_rows(path, rows) -> None:
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start, end, deviceId, streamId, correlationId, "
                       "globalPid, graphId) VALUES (?, ?, 0, 7, ?, ?, ?)", rows)


def test_graph_trace_rows_of_launches_with_kernels_or_without_times_are_left_out(tmp_path):
    node = tmp_path / "node.sqlite"
    converter.write_nsys(KINETO, node)
    before = read_timing_trace(node)
    with sqlite3.connect(node) as db:
        gpid = db.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
    launched = sorted(EXPECTED)[:2]
    _add_graph_rows(node, [(1_000_000, 1_050_000, corr, gpid, 1) for corr in launched] +
                    [(0, 0, 99_999, gpid, 9)])
    after = read_timing_trace(node)
    assert [(e.name, e.ts, e.dur, e.args.correlation) for e in after.gpu_events] == \
        [(e.name, e.ts, e.dur, e.args.correlation) for e in before.gpu_events]
    assert "2 graph-trace rows left out: their launch's kernels are in the file" in after.notes
    assert any(w.startswith("1 CUDA graph launches have no times") for w in after.warnings)


def test_graph_trace_rows_read_alike_from_a_json_lines_export(linked, tmp_path):
    from nsys_json_export import write_jsonlines

    sqlite_path = linked["graph"][2]
    lines = write_jsonlines(sqlite_path, tmp_path / "graph.jsonl")
    expected, got = read_timing_trace(sqlite_path), read_timing_trace(lines)
    assert [(e.name, e.ts, e.dur, e.pid, e.tid, e.args.correlation) for e in got.gpu_events] == \
        [(e.name, e.ts, e.dur, e.pid, e.tid, e.args.correlation) for e in expected.gpu_events]
    assert sum(e.name.startswith("CUDA graph ") for e in got.gpu_events) == len(EXPECTED)
    assert got.notes[1:] == expected.notes[1:]

"""``et-link simulate`` end to end on real traces linked by et-link (skipped without ../shared),
and on the project's own CPU fixtures. No assertion here depends on ratio values, which depend on
how the .et writer sets durations."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
from typer.testing import CliRunner

from conftest import dlrm_pair, fixture_pair, shared_trace
from linker.plan.comm import WORLD_GROUP_ID
from linker.cli import app
from linker.link.recipe import LinkOptions
from linker.pipeline import link_pair
from linker.sim.cli_run import SimulateOptions, run_simulate
from linker.sim.engine import replay
from linker.sim.graph import COMM, CPU, GPU
from linker.sim.load import load_graph
from linker.sim.report import build_report
from tracetools import load_trace, save_trace
from wire_decoder import decode_node, read_stream

RANKS = range(8)


def simulate_cli(*args):
    """``et-link simulate`` run in this process: returncode, stdout, stderr."""
    result = CliRunner().invoke(app, ["simulate", *map(str, args)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


@pytest.fixture(scope="module")
def dlrm_job(tmp_path_factory):
    """The 8 param_dlrm ranks linked to .et files rank<N>.et in one directory."""
    directory = tmp_path_factory.mktemp("dlrm_job")
    for rank in RANKS:
        et, kineto = dlrm_pair(rank)
        link_pair(et, kineto, directory / f"rank{rank}.et", LinkOptions(), None)
    return directory


def measured_span_by_wire(path) -> float:
    """Latest start + measured duration minus earliest start over nodes with a start, read by the
    test's own wire decoder (field 6 start_time_micros, field 7 duration_micros; a CPU op's measured
    duration is its ``inclusive_dur_micros`` attribute, since duration_micros is its busy time)."""
    first, last = None, None
    for frame in read_stream(path)[1:]:
        fields = decode_node(frame)
        if fields.get(6, [0])[0]:
            inclusive = _inclusive_attr(fields)
            start = fields[6][0]
            dur = inclusive if inclusive is not None else fields.get(7, [0])[0]
            first = start if first is None else min(first, start)
            last = start + dur if last is None else max(last, start + dur)
    return last - first


def _inclusive_attr(fields) -> int | None:
    """The int64 value of the node's ``inclusive_dur_micros`` attribute (field 10 AttributeProto:
    name field 1, int64_val field 9), or None."""
    for attr in fields.get(10, []):
        if attr.get(1) == "inclusive_dur_micros":
            return attr[9]
    return None


def test_dlrm_job_replays_to_the_end_with_matched_collectives(dlrm_job):
    proc = simulate_cli(dlrm_job, "--json")
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert report["finished"] and report["never_issued"] == 0 and report["stalls"] == []
    assert [r["rank"] for r in report["ranks"]] == list(RANKS)
    spans = {rank: measured_span_by_wire(dlrm_job / f"rank{rank}.et") for rank in RANKS}
    assert {r["rank"]: r["measured_us"] for r in report["ranks"]} == spans
    assert report["slowest_rank"] == max(spans, key=spans.get)
    # one job metric: the measured job span (earliest start to latest end) vs the replay's end from
    # the same origin (the earliest start is the replay's 0)
    assert report["job_origin"] == "earliest measured start"
    assert report["measured_us"] == report["measured_job_span_us"] >= max(spans.values())
    # ranks start at their measured offsets (one host clock): rank r's simulated step ends at its offset + step
    assert min(report["rank_start_us"]) == 0 and max(report["rank_start_us"]) > 0
    assert report["simulated_us"] == max(r["simulated_us"] + start
                                         for r, start in zip(report["ranks"], report["rank_start_us"]))
    for r, start in zip(report["ranks"], report["rank_start_us"]):
        assert r["simulated_end_us"] == r["simulated_us"] + start and r["measured_end_us"] <= report["measured_us"]
    assert report["ratio"] == round(report["simulated_us"] / report["measured_us"], 4)
    assert report["busy_us"]["comm"] > 0 and report["busy_us"]["gpu"] > 0
    assert report["critical_path"] and all(op["us"] > 0 for op in report["critical_path"])


def test_dlrm_job_collectives_end_together_on_every_rank(dlrm_job):
    graphs = [load_graph(dlrm_job / f"rank{rank}.et", rank) for rank in RANKS]
    result = replay(graphs)
    groups = result.groups
    assert groups.members and all(len(m) == 8 for m in groups.members)
    for members in groups.members:
        assert len({result.end[u] for u in members}) == 1
        assert len({result.start[u] for u in members}) == 1
        # started when the last member was issued
        assert result.start[members[0]] == max(result.issue[u] for u in members)


def test_single_rank_reads_what_the_wire_says(dlrm_job):
    path = dlrm_job / "rank0.et"
    graph = load_graph(path)
    frames = [decode_node(frame) for frame in read_stream(path)[1:]]
    assert list(graph.ids) == [f[1][0] for f in frames]
    assert list(graph.duration) == [float(f.get(7, [0])[0]) for f in frames]
    edges = sum(len(set(f.get(4, [])) | set(f.get(5, []))) for f in frames)
    assert len(graph.dep_nodes) == edges and not graph.missing_deps
    assert sum(1 for f in frames if f[3][0] in (5, 6, 7)) == len(graph.comm)
    # resource kind, lane and communication attributes, from the attributes as the wire decoder reads
    # them (AttributeProto: name 1, int64_val 9, bool_val 27, string_val 29)
    for u, f in enumerate(frames):
        attrs = {a[1]: next(v for k, v in a.items() if k != 1) for a in f.get(10, [])}
        node_type = f.get(3, [0])[0]
        if node_type in (5, 6, 7):
            kind, lane = COMM, ("gpu", attrs.get("device", 0), attrs.get("stream", -1))
            assert graph.comm[u].comm_type == attrs["comm_type"] and graph.comm[u].pg_name == attrs["pg_name"]
        elif attrs.get("is_cpu_op", True) is False:
            kind, lane = GPU, ("gpu", attrs.get("device", 0), attrs.get("stream", -1))
        else:
            kind, lane = CPU, ("cpu", attrs.get("tid", 0))
        assert (graph.kind[u], graph.lane_keys[graph.lane[u]]) == (kind, lane), f"node {graph.ids[u]}"


def drop_one_nccl_kernel(kineto: dict) -> tuple[dict, str]:
    """A copy without the 4th NCCL kernel (by start time) and its flow events."""
    kernels = sorted((e for e in kineto["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e.get("name", "")),
                     key=lambda e: e["ts"])
    victim = kernels[3]
    correlation = victim["args"]["correlation"]
    events = [e for e in kineto["traceEvents"] if e is not victim
              and not (e.get("cat") == "ac2g" and e.get("id") == correlation and e.get("ph") == "f")]
    return {**kineto, "traceEvents": events}, victim["name"]


def test_job_where_one_rank_lacks_an_nccl_kernel_stalls_naming_rank_and_collective(dlrm_job, tmp_path):
    for rank in RANKS:
        if rank != 3:
            (tmp_path / f"rank{rank}.et").write_bytes((dlrm_job / f"rank{rank}.et").read_bytes())
    et, kineto = dlrm_pair(3)
    broken, _ = drop_one_nccl_kernel(load_trace(kineto))
    save_trace(broken, tmp_path / "rank3.kineto.json.gz")
    link_pair(et, tmp_path / "rank3.kineto.json.gz", tmp_path / "rank3.et", LinkOptions(), None)
    (tmp_path / "rank3.kineto.json.gz").unlink()
    proc = simulate_cli(tmp_path, "--json")
    assert proc.returncode == 9, proc.stderr
    report = orjson.loads(proc.stdout)
    assert not report["finished"] and report["stalls"]
    stall = report["stalls"][0]
    assert stall["process_group"] == WORLD_GROUP_ID  # job-wide group id of PyTorch's default group
    assert [m["rank"] for m in stall["missing_ranks"]] == [3]
    assert sorted(stall["arrived_ranks"]) == [r for r in RANKS if r != 3]
    assert any("different numbers of collectives" in note and "3: 7" in note for note in report["notes"])
    assert "rank 3" in stall["hint"]
    text = simulate_cli(tmp_path)
    assert text.returncode == 9
    assert f"stall: {stall['comm_type']} #{stall['index']} on process group {WORLD_GROUP_ID}" in text.stdout
    assert "rank 3 never reaches it" in text.stdout


def test_trace_out_shows_one_process_per_rank_with_paired_lanes(dlrm_job, tmp_path):
    out = tmp_path / "job_trace.json"
    proc = simulate_cli(dlrm_job / "rank0.et", dlrm_job / "rank1.et", "--trace-out", out, "--model", "lanes")
    assert proc.returncode == 0, proc.stderr
    events = orjson.loads(out.read_bytes())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes.values()) == ["rank 0", "rank 1"]
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 1]
    measured = sorted(t[:-len(" (measured)")] for t in threads if t.endswith(" (measured)"))
    simulated = sorted(t[:-len(" (simulated)")] for t in threads if t.endswith(" (simulated)"))
    assert measured == simulated and "cpu thread 1" in measured
    complete = [e for e in events if e["ph"] == "X"]
    nodes = sum(len(load_graph(dlrm_job / f"rank{r}.et")) for r in (0, 1))
    simulated_events = [e for e in complete if "waited_us" in e["args"]]
    assert len(simulated_events) == nodes  # every node ran once on the simulated side
    assert min(e["ts"] for e in complete) == 0


def test_single_rank_trace_out_has_measured_and_simulated_processes_with_the_same_lanes(tmp_path):
    et, kineto = fixture_pair("gpu", "gpu_v111")
    linked = tmp_path / "gpu.et"
    link_pair(et, kineto, linked, LinkOptions(), None)
    out = tmp_path / "t.json"
    proc = simulate_cli(linked, "--trace-out", out)
    assert proc.returncode == 0, proc.stderr
    events = orjson.loads(out.read_bytes())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {1: "measured", 2: "simulated"}
    lanes = {pid: sorted(e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == pid)
             for pid in (1, 2)}
    assert lanes[1] == lanes[2] and any(name.startswith("gpu ") for name in lanes[1])
    # measured side: the GPU kernels at their measured offsets, same count as simulated kernels
    gpu_tids = {e["tid"] for e in events if e["name"] == "thread_name" and e["args"]["name"].startswith("gpu ")}
    measured_gpu = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["tid"] in gpu_tids]
    simulated_gpu = [e for e in events if e["ph"] == "X" and e["pid"] == 2 and e["tid"] in gpu_tids]
    assert measured_gpu and len(measured_gpu) == len(simulated_gpu)


def test_et_plus_json_and_et_of_the_same_link_replay_alike(tmp_path):
    """The CPU fixture linked to ET+ JSON and to .et: same nodes, same measured step, and (the JSON
    carries sim_dur and data_deps with causes) the same simulated step up to the .et's whole µs."""
    et, kineto = fixture_pair("cpu", "mlp_steps")
    link_pair(et, kineto, tmp_path / "mlp_plus.json", LinkOptions(), None)
    link_pair(et, kineto, tmp_path / "mlp.et", LinkOptions(), None)
    from_json = build_report(replay([load_graph(tmp_path / "mlp_plus.json")]))[0]
    from_et = build_report(replay([load_graph(tmp_path / "mlp.et")]))[0]
    assert from_json.finished and from_et.finished
    assert from_json.ranks[0].nodes == from_et.ranks[0].nodes
    assert from_et.measured_us > 0
    assert from_json.measured_us == pytest.approx(from_et.measured_us, abs=2)  # .et times are whole µs
    doc = load_trace(tmp_path / "mlp_plus.json")
    timed = [n for n in doc["nodes"] if "ts" in n]
    assert from_json.measured_us == pytest.approx(max(n["ts"] + n["dur"] for n in timed) - min(n["ts"] for n in timed))
    assert not any("no sim_dur" in note or "no data_deps" in note for note in from_json.notes)
    assert from_json.simulated_us == pytest.approx(from_et.simulated_us, rel=0.01)


def test_hta_and_linear_single_rank_replays_finish(tmp_path):
    for name, (et, kineto) in {
            "hta": (shared_trace("hta_simple_add", "et.json.gz"), shared_trace("hta_simple_add", "kineto.json.gz")),
            "linear": (shared_trace("param_linear", "et.json.gz"), shared_trace("param_linear", "kineto.json.gz"))}.items():
        out = tmp_path / f"{name}.et.gz"
        link_pair(et, kineto, out, LinkOptions(), None)
        for model in ("astra-sim", "lanes"):
            text, finished = run_simulate(SimulateOptions([out], model=model, json_output=True))
            report = orjson.loads(text)
            assert finished and report["finished"] and report["measured_us"] > 0 and report["simulated_us"] > 0
            assert report["model"] == model
        # the same link as ET+ JSON (hta: the flat 1.0.1 layout; linear: nested) replays the same nodes
        as_json = tmp_path / f"{name}_plus.json"
        link_pair(et, kineto, as_json, LinkOptions(), None)
        from_json = build_report(replay([load_graph(as_json)]))[0]
        assert from_json.finished and from_json.ranks[0].nodes == report["ranks"][0]["nodes"]

"""Measured waits written into the outputs as wait nodes (``sim.file_waits``, ``write.wait_nodes``):
which waits, how long, how the file carries them, and how a replay of the file alone (as ASTRA-sim
runs it) reproduces the measured step. Times in the hand-made graphs are worked out in the comments."""

from __future__ import annotations

import json

import msgspec
import pytest
from typer.testing import CliRunner

import linker
from conftest import FIXTURES, fixture_pair
from linker.cli import app
from linker.model.errors import TraceInputError
from linker.pipeline import link_pair
from linker.sim.engine import ASTRA_SIM, Scale, replay
from linker.sim.file_waits import add_file_waits, waits_to_write, write_device_edges, write_wait_step
from linker.sim.load import load_graph
from linker.sim.report import build_report
from linker.write.node_edits import NodeEdit
from linker.write.output_edits import add_wait_nodes, edit_and_add_waits
from linker.write.wait_nodes import WAIT_NODE_NAME, Wait
from sim_graphs import cpu, gpu, write_et

GPU_PAIR = (FIXTURES / "gpu" / "gpu_v111" / "et.json.gz", FIXTURES / "gpu" / "gpu_v111" / "kineto.json.gz")


def idle_gpu(path, busy_stream: bool = False):
    """A host op at 100-110 µs launches a kernel that ran at 150-155: 40 µs its stream sat idle
    with its dependency met. With ``busy_stream``, a kernel of another stream ran 120-160, across
    that wait, on the GPU unit ASTRA-sim gives a rank."""
    specs = [cpu(1, 10, start=100), gpu(2, 5, deps=[1], start=150)]
    if busy_stream:
        specs.append(gpu(3, 40, deps=[1], stream=9, start=120))
    return write_et(path, specs)


def ratio(path, **options) -> float:
    graph = load_graph(path)
    return build_report(replay([graph], ASTRA_SIM, **options), 0, False)[0].ratio


def test_an_idle_stream_becomes_a_wait_node_of_its_measured_length(tmp_path):
    path = idle_gpu(tmp_path / "idle.et")
    assert waits_to_write(load_graph(path)) == [Wait(2, 40.0, "unexplained_gpu_idle", 40.0)]
    assert ratio(path) == pytest.approx(15 / 55, abs=1e-4)  # the graph alone: 10 + 5 of a 55 µs step
    assert len(write_wait_step(path, "measured")[1]) == 1
    graph = load_graph(path)
    (w,) = graph.wait_nodes
    assert graph.names[w] == WAIT_NODE_NAME and graph.duration[w] == 40 and graph.wait_nodes[w] == "unexplained_gpu_idle"
    kernel = list(graph.ids).index(2)
    assert w in graph.deps_of(kernel)  # (these hand-made nodes name no causes, so the edge names none)
    rp = replay([graph], ASTRA_SIM)
    assert (rp.start[w], rp.end[w], rp.start[kernel]) == (10, 50, 50)  # as measured: the kernel at 150 - 100
    assert ratio(path) == pytest.approx(1.0)
    assert ratio(path, wait_nodes=False) == pytest.approx(15 / 55, abs=1e-4)  # --waits explained: left out
    # a what-if scales work, never a wait: gpu=0.5 gives 10 + 40 + 2.5
    assert replay([graph], ASTRA_SIM, Scale.parse("gpu=0.5")).end[kernel] == pytest.approx(52.5)


def test_a_wait_on_a_unit_that_ran_other_work_is_not_written(tmp_path):
    """Kernel 3 (another stream) ran 120-160 through kernel 2's wait (110-150): a wait node on the one
    GPU unit would hold it up, so kernel 2's wait stays out of the file. Kernel 3's own wait
    (110-120, the unit idle) is written, sized by the file's replay: kernel 2, no longer held, runs
    at 10-15 µs, so kernel 3's wait node lasts 15-20 and kernel 3 starts at 20, as measured."""
    path = idle_gpu(tmp_path / "busy.et", busy_stream=True)
    assert waits_to_write(load_graph(path)) == [Wait(3, 5.0, "unexplained_gpu_idle", 10.0)]
    write_wait_step(path, "measured")
    graph = load_graph(path)
    rp = replay([graph], ASTRA_SIM)
    assert rp.start[list(graph.ids).index(3)] == 20


def test_a_file_is_given_its_wait_nodes_once(tmp_path):
    path = idle_gpu(tmp_path / "idle.et")
    assert len(write_wait_step(path, "measured")[1]) == 1
    before = path.read_bytes()
    with pytest.raises(TraceInputError, match="already holds measured-wait nodes"):
        add_wait_nodes(path, [Wait(2, 5.0, "unexplained_gpu_idle", 5.0)], 100)
    assert path.read_bytes() == before


@pytest.mark.parametrize("suffix", [".json", ".et"])
def test_gpu_pair_carries_its_waits_as_nodes(tmp_path, suffix):
    """The GPU fixture pair, linked as ``et-link`` links it: each wait node sits right before the op
    it holds (the same dependencies, then the op depends on it with the wait's cause); the file
    alone replays the measured step (within docs/fidelity.md's [0.98, 1.02]: the ``.et`` gives the
    kernel an NCCL kernel held an edge from it, where a wait node held it to its measured start,
    so the 4 µs the replay starts that NCCL kernel early carry on: 0.991), and without its wait
    nodes exactly what the output linked with ``--waits explained`` replays, which is the
    pipeline's output with the device's holds as edges (``write_device_edges``)."""
    out, plain = tmp_path / f"waits{suffix}", tmp_path / f"explained{suffix}"
    runner = CliRunner()
    for path, waits in ((out, "measured"), (plain, "explained")):
        result = runner.invoke(app, ["--et-file", str(GPU_PAIR[0]), "--kineto-file", str(GPU_PAIR[1]), "-o", str(path),
                                     "--waits", waits])
        assert result.exit_code == 0, result.stderr
    # the .et's times are whole µs: one kernel an NCCL kernel held becomes an edge there (a wait in the JSON)
    edges = "kernels that waited for another stream's kernel to free the device: 1,"
    assert (edges in result.stderr) == (suffix == ".et")
    graph = load_graph(out)
    assert graph.wait_nodes
    ids = list(graph.ids)
    for w, cause in graph.wait_nodes.items():
        assert graph.names[w] == WAIT_NODE_NAME and graph.duration[w] >= 1
        held = [u for u in range(len(graph)) if w in graph.deps_of(u)]
        assert len(held) == 1
        (u,) = held
        assert graph.edge_cause(u, w) == cause
        assert sorted(ids[d] for d in graph.deps_of(w)) == sorted(ids[d] for d in graph.deps_of(u) if d != w)
    assert 0.98 <= ratio(out) <= 1.02
    assert ratio(out, wait_nodes=False) == pytest.approx(ratio(plain), abs=1e-9)
    assert linker.simulate(out).report.waits.ratio_explained == pytest.approx(ratio(plain), abs=1e-3)
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0
    pipeline = link_pair(*GPU_PAIR, tmp_path / f"pipeline{suffix}").output
    write_device_edges(pipeline)
    assert plain.read_bytes() == pipeline.read_bytes()


@pytest.mark.parametrize("suffix", [".et", ".json"])
def test_the_wait_step_rewrites_the_output_once_as_its_two_steps_would(tmp_path, suffix, monkeypatch):
    """``write_wait_step`` reads the output back once and rewrites it once with the device's
    holds and the wait nodes together: byte for byte the file the two steps give one after the
    other (``write_device_edges``, then ``add_wait_nodes`` with the waits of the graph it hands on). The GPU
    pair's ``.et`` has both (one edge, 12 wait nodes); its JSON waits only."""
    from linker.write import chakra_node_edits, node_edits

    linked = link_pair(*GPU_PAIR, tmp_path / f"linked{suffix}").output
    once, twice = tmp_path / f"once{suffix}", tmp_path / f"twice{suffix}"
    once.write_bytes(linked.read_bytes())
    twice.write_bytes(linked.read_bytes())
    edges, graph = write_device_edges(twice)
    waits = waits_to_write(graph)
    add_wait_nodes(twice, waits, max(graph.ids) + 1)
    assert len(waits) >= 10 and edges == (1 if suffix == ".et" else 0)
    rewrites = []
    for module, name in ((chakra_node_edits, "rewrite_et_nodes"), (node_edits, "write_json_document")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, original=original: rewrites.append(1) or original(*args))
    assert write_wait_step(once, "measured") == (edges, waits)
    assert once.read_bytes() == twice.read_bytes() != linked.read_bytes()
    assert len(rewrites) == 1


def test_the_link_state_can_go_before_the_output_is_read_back(tmp_path):
    """``add_file_waits(..., keep_link=False)`` (the command line's and a batch worker's way) lets
    the link's state go before the read-back, and writes the same file as when it is kept."""
    kept, let_go = (link_pair(*GPU_PAIR, tmp_path / name) for name in ("kept.et", "let_go.et"))
    assert add_file_waits(kept, "measured") == add_file_waits(let_go, "measured", keep_link=False) > 0
    assert kept.et_plus is not None and let_go.et_plus is None
    assert kept.output.read_bytes() == let_go.output.read_bytes()


def test_a_wait_step_that_fails_leaves_the_output_as_it_was(tmp_path):
    """An output that holds wait nodes already is refused by the rewrite before any of it is
    written: an edit given with the waits is not written either."""
    out = link_pair(*GPU_PAIR, tmp_path / "linked.et").output
    write_wait_step(out, "measured")
    graph = load_graph(out)
    held = [u for u in range(len(graph)) if graph.names[u] != WAIT_NODE_NAME and graph.kind[u] == 1][0]
    again = [Wait(graph.ids[held], 5.0, "unexplained_gpu_idle", 5.0)]
    before = out.read_bytes()
    with pytest.raises(TraceInputError, match="already holds measured-wait nodes"):
        edit_and_add_waits(out, {graph.ids[held]: NodeEdit(busy=1.0)}, [], again, max(graph.ids) + 1)
    assert out.read_bytes() == before


def test_a_wait_step_that_cannot_write_is_one_line_and_leaves_the_linked_output(tmp_path, monkeypatch):
    """When the wait step fails (here: the rewrite cannot write its file), the command says so in
    one line naming the file, exits non-zero, and the output is the link's, without edges or wait
    nodes (the rewrite is atomic and the only one)."""
    from linker.model.exit_status import EXIT_INPUT
    from linker.write import chakra_node_edits

    linked = link_pair(*GPU_PAIR, tmp_path / "linked.et").output
    out = tmp_path / "out.et"

    def full_disk(path, *args):
        raise TraceInputError(path, "cannot write: No space left on device")

    monkeypatch.setattr(chakra_node_edits, "rewrite_et_nodes", full_disk)
    result = CliRunner().invoke(app, ["--et-file", str(GPU_PAIR[0]), "--kineto-file", str(GPU_PAIR[1]), "-o", str(out)])
    assert result.exit_code == EXIT_INPUT
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and str(out) in lines[0] and "without the wait step's edges and wait nodes" in lines[0]
    assert "Traceback" not in result.stderr
    assert out.read_bytes() == linked.read_bytes()


def test_json_wait_nodes_name_their_op_and_wait(tmp_path):
    out = tmp_path / "waits.json"
    outcome = link_pair(*GPU_PAIR, out)
    assert add_file_waits(outcome, "measured") > 0
    nodes = json.loads(out.read_text())["nodes"]
    by_id = {node["id"]: node for node in nodes}
    waits = [node for node in nodes if node["name"] == WAIT_NODE_NAME]
    assert waits and min(node["id"] for node in waits) > max(n["id"] for n in nodes if n["name"] != WAIT_NODE_NAME)
    for node in waits:
        held = by_id[node["holds"]]
        assert held["data_deps"][-1] == node["id"] and held["data_dep_causes"][-1] == node["wait_cause"]
        assert node["data_deps"] == held["data_deps"][:-1] and node["ctrl_deps"] == held["ctrl_deps"]
        assert node["measured_wait"] >= 2 and "ts" not in node  # a wait of the measurement, not timed itself
        assert node["stream"] == held["stream"]  # on the held kernel's stream


def test_json_wait_nodes_leave_every_other_node_as_written(tmp_path):
    """The rewrite keeps the document's other keys and every node it does not hold as the bytes the
    link wrote (the ET's own ``inputs`` / ``attrs`` text, spaces and all: before, the whole
    document was decoded and encoded again, compacting them); the held nodes differ only by the
    wait node appended to their ``data_deps`` and ``data_dep_causes``."""
    out = tmp_path / "waits.json"
    outcome = link_pair(*GPU_PAIR, out)
    before = out.read_bytes()
    raws_before = msgspec.json.decode(msgspec.json.decode(before, type=dict[str, msgspec.Raw])["nodes"],
                                      type=list[msgspec.Raw])
    assert add_file_waits(outcome, "measured") > 0
    after = msgspec.json.decode(out.read_bytes(), type=dict[str, msgspec.Raw])
    raws_after = msgspec.json.decode(after["nodes"], type=list[msgspec.Raw])
    held = {node["holds"]: node["id"] for node in map(json.loads, map(bytes, raws_after[len(raws_before):]))}
    assert held and len(raws_after) == len(raws_before) + len(held)
    assert b'"values": [' in before  # the ET's text as the ET had it
    for raw_before, raw_after in zip(raws_before, raws_after):
        node_before, node_after = json.loads(bytes(raw_before)), json.loads(bytes(raw_after))
        if node_before["id"] not in held:
            assert bytes(raw_after) == bytes(raw_before)
            continue
        wait = held[node_before["id"]]
        assert node_after["data_deps"] == node_before["data_deps"] + [wait]
        assert {k: v for k, v in node_after.items() if k not in ("data_deps", "data_dep_causes")} == \
            {k: v for k, v in node_before.items() if k not in ("data_deps", "data_dep_causes")}
    assert list(after) == list(msgspec.json.decode(before, type=dict[str, msgspec.Raw]))


def test_cpu_only_outputs_carry_no_wait_nodes(tmp_path):
    out = tmp_path / "cpu.json"
    outcome = link_pair(*fixture_pair("cpu", "mlp_steps"), out)
    before = out.read_bytes()
    assert add_file_waits(outcome, "measured") == 0 and out.read_bytes() == before


def test_an_unknown_waits_rule_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["--et-file", str(GPU_PAIR[0]), "--kineto-file", str(GPU_PAIR[1]),
                                      "-o", str(tmp_path / "x.json"), "--waits", "some"])
    assert result.exit_code == 2 and "unknown --waits 'some'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()


def test_the_summary_gives_the_wait_nodes_by_cause(tmp_path):
    """The link's summary names the wait nodes it wrote by cause, with how many and their time,
    the longest cause first; counted here from the output's wait nodes (``wait_cause``,
    ``sim_dur``) on the ``gpu_v111`` fixture."""
    from linker.model.units import format_us

    out = tmp_path / "v111.json"
    result = CliRunner().invoke(app, ["--et-file", str(GPU_PAIR[0]), "--kineto-file", str(GPU_PAIR[1]), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    by_cause: dict[str, list] = {}
    for node in json.loads(out.read_text())["nodes"]:
        if node["name"] == WAIT_NODE_NAME:
            total = by_cause.setdefault(node["wait_cause"], [0, 0.0])
            total[0] += 1
            total[1] += node["sim_dur"]
    assert len(by_cause) >= 2  # other_stream_kernel and unexplained_gpu_idle on this fixture
    words = ", ".join(f"{cause} {count} ({format_us(us)})"
                      for cause, (count, us) in sorted(by_cause.items(), key=lambda item: -item[1][1]))
    count = sum(count for count, _ in by_cause.values())
    assert (f"measured waits no dependency explains: {count} wait node(s) written (--waits explained leaves them "
            f"out); by cause, how many and their time: {words}") in result.stderr


def test_lanes_give_wait_nodes_no_time_and_hold_every_wait(tmp_path):
    """Under ``--model lanes`` (a unit per stream) the file's wait nodes, sized for ASTRA-sim's one GPU
    unit, get no time and every measured wait is held instead, the one the file left out too:
    kernel 2 at 150 - 100 = 50, kernel 3 at 20, the step 60 µs as measured."""
    path = idle_gpu(tmp_path / "busy.et", busy_stream=True)
    write_wait_step(path, "measured")
    simulation = linker.simulate(path, model="lanes")
    rp, graph = simulation.replay, simulation.replay.graphs[0]
    (w,) = graph.wait_nodes
    ids = list(graph.ids)
    assert rp.duration[w] == 0
    assert (rp.start[ids.index(2)], rp.start[ids.index(3)]) == (50, 20)
    assert simulation.report.ratio == pytest.approx(1.0)
    # without the waits: kernel 2 at 10-15, kernel 3 at 10-50 on its own stream: 50 of 60 µs
    assert linker.simulate(path, model="lanes", waits="explained").report.ratio == pytest.approx(50 / 60, abs=1e-4)


def test_waits_explained_replays_the_file_as_if_it_had_no_wait_nodes(tmp_path):
    """ASTRA-sim issues a unit's ready nodes by smallest id, and a wait node's id is above every
    other: left in the queue with no time, it would still hold its op behind every other op ready on
    the unit. ``--waits explained`` takes it out, unit and all. Kernel 2 (held) and kernel 3 (another
    stream, 40 µs) are both ready at 10: without the wait node kernel 2 runs 10-15 and kernel 3 15-55;
    a wait node of no time kept in the queue would have put kernel 3 first and kernel 2 at 50-55."""
    plain = idle_gpu(tmp_path / "plain.et", busy_stream=True)
    waited = idle_gpu(tmp_path / "waited.et", busy_stream=True)
    add_wait_nodes(waited, [Wait(2, 40.0, "unexplained_gpu_idle", 40.0)], first_id=4)
    without, explained = replay([load_graph(plain)], ASTRA_SIM), replay([load_graph(waited)], ASTRA_SIM, wait_nodes=False)
    ids = list(explained.graphs[0].ids)
    assert [(explained.start[ids.index(k)], explained.end[ids.index(k)]) for k in (2, 3)] == [(10, 15), (15, 55)]
    assert [without.start[list(without.graphs[0].ids).index(k)] for k in (1, 2, 3)] == \
        [explained.start[ids.index(k)] for k in (1, 2, 3)]
    # with the wait node's 40 µs (the file as written): kernel 2 waits behind kernel 3, then the wait
    full = replay([load_graph(waited)], ASTRA_SIM)
    assert full.start[ids.index(3)] == 10 and full.start[ids.index(2)] == 90


def test_tables_show_wait_nodes_as_waits(tmp_path):
    """In ``linker.load``'s tables a wait node is of kind ``wait``, with no busy time and in no op's
    row; on the critical path table it is named for its cause."""
    pytest.importorskip("pandas", reason="needs pandas")
    path = idle_gpu(tmp_path / "idle.et")
    write_wait_step(path, "measured")
    nodes = linker.load(path).nodes_table(as_rows=True)
    (wait,) = [row for row in nodes if row["name"] == WAIT_NODE_NAME]
    assert (wait["kind"], wait["busy_us"], wait["sim_us"]) == ("wait", 0.0, 40.0)
    assert WAIT_NODE_NAME not in {row["name"] for row in linker.load(path).ops_table(as_rows=True)}
    path_rows = linker.simulate(path).critical_path_table(as_rows=True)
    assert [(row["name"], row["kind"], row["us"]) for row in path_rows] == [
        ("cpu1", "cpu", 10.0), ("(measured wait: unexplained_gpu_idle)", "wait", 40.0), ("kernel2", "gpu", 5.0)]

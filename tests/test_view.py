"""``et-link simulate --html``: the timeline data (``linker.sim.timeline``), the page (``linker.sim.view``),
and the page drawn by a real headless browser (Chromium from the system, driven by Playwright).

The browser tests skip when Playwright or a system Chromium is missing; the page tests skip
without plotly (``pip install 'et-link[view]'``). Expected times below are worked out by hand from
the graphs written here.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

import linker
from conftest import FIXTURES, dlrm_pair, shared_trace
from linker.link.recipe import LinkOptions
from linker.pipeline import link_pair
from linker.sim.engine import replay
from linker.sim.graph import CPU, META, lane_label
from linker.sim.load import load_graph
from linker.sim.report import build_report
from linker.sim.timeline import BUSY, MEASURED, SIMULATED, WAIT, exclusive_pieces, rank_timelines
from linker.write.chakra_wire import make_attr
from sim_graphs import coll, cpu, gpu, write_et


def timelines_of(*paths, **kwargs):
    graphs = [load_graph(p, rank) for rank, p in enumerate(paths)]
    rp = replay(graphs, **kwargs)
    report, path, _ = build_report(rp)
    return rp, report, path, rank_timelines(rp, path)


def bars_of(tl, side, lane=None, state=None):
    b = tl.bars
    return [(b.node[i], b.start[i], b.end[i], b.state[i]) for i in range(len(b))
            if b.side[i] == side and (lane is None or b.lane[i] == lane) and (state is None or b.state[i] == state)]


# --- exclusive pieces ----------------------------------------------------------------------------


def test_exclusive_pieces_cut_children_out_of_their_parents():
    # 0: [0, 10] holds 1: [2, 4] and 2: [5, 9], which holds 3: [6, 7]; 4: [12, 13] alone.
    pieces, parents = exclusive_pieces([(0, 10, 0), (2, 4, 1), (5, 9, 2), (6, 7, 3), (12, 13, 4)])
    assert pieces == [(0, 0, 2), (1, 2, 4), (0, 4, 5), (2, 5, 6), (3, 6, 7), (2, 7, 9), (0, 9, 10), (4, 12, 13)]
    assert parents == {0, 2}


def test_exclusive_pieces_cut_a_child_that_outlasts_its_parent():
    pieces, _ = exclusive_pieces([(0, 10, 0), (8, 14, 1)])
    assert pieces == [(0, 0, 8), (1, 8, 10)]


# --- one rank: nested CPU ops, a blocked op, a kernel ----------------------------------------------


def nested_rank(path: Path) -> Path:
    """Parent 1 measured [0, 10] (busy 4) holding child 2 [2, 8] (busy 6); op 3 measured [10, 15] of
    which 1 µs busy (a blocked synchronize); kernel 4 launched by 2, measured [9, 12]. (Measured
    times are written from 100: a start of 0 means "not timed".)"""
    parent = cpu(1, 4, start=100)
    parent.attrs.append(make_attr("inclusive_dur_micros", 10))
    sync = cpu(3, 1, ctrl=[1], deps=[2], start=110)
    sync.attrs.append(make_attr("inclusive_dur_micros", 5))
    return write_et(path, [parent, cpu(2, 6, ctrl=[1], start=102), sync, gpu(4, 3, deps=[2], start=109)])


def test_measured_cpu_lane_shows_exclusive_busy_pieces_and_the_blocked_time_as_wait(tmp_path):
    rp, _, _, (tl,) = timelines_of(nested_rank(tmp_path / "r.et"))
    cpu_lane = lane_label(("cpu", 1))
    assert bars_of(tl, MEASURED, cpu_lane) == [(0, 0, 2, BUSY), (1, 2, 8, BUSY), (0, 8, 10, BUSY),
                                               (2, 10, 11, BUSY), (2, 11, 15, WAIT)]
    # Simulated (astra-sim): 1 runs [0, 4], 2 [4, 10], 3 [10, 11]; the kernel after 2: [10, 13].
    assert bars_of(tl, SIMULATED, cpu_lane) == [(0, 0, 4, BUSY), (1, 4, 10, BUSY), (2, 10, 11, BUSY)]
    assert bars_of(tl, SIMULATED, lane_label(("gpu", 0, 7))) == [(3, 10, 13, BUSY)]
    assert tl.lanes == [cpu_lane, lane_label(("gpu", 0, 7))]


def test_the_critical_path_is_flagged_on_its_nodes_only(tmp_path):
    rp, _, path, (tl,) = timelines_of(nested_rank(tmp_path / "r.et"))
    on_path = {step.local for step in path if step.graph.kind[step.local] != META}
    b = tl.bars
    flagged = {b.node[i] for i in range(len(b)) if b.critical[i]}
    assert flagged == on_path and on_path == {0, 1, 3}  # 1 -> 2 -> kernel 4 ends last (13)


def test_divergence_point_where_the_replay_skips_a_measured_gap(tmp_path):
    # Op 2 follows op 1 (10 µs) but was measured 40 µs later than op 1's end: the replay starts it
    # 40 µs early; op 3 keeps that lead (no jump of its own).
    path = write_et(tmp_path / "r.et", [cpu(1, 10, start=100), cpu(2, 10, [1], start=150), cpu(3, 10, [2], start=160)])
    _, _, _, (tl,) = timelines_of(path)
    (point,) = tl.divergences
    assert (point.node_id, point.measured_start, point.simulated_start, point.jump_us) == (2, 50, 10, -40)


def test_simulated_busy_bars_add_up_to_the_reports_busy_time(tmp_path):
    _, report, _, (tl,) = timelines_of(nested_rank(tmp_path / "r.et"))
    simulated = sum(e - s for _, s, e, state in bars_of(tl, SIMULATED) if state == BUSY)
    assert simulated == pytest.approx(sum(report.busy_us.values()))


# --- a job: a collective waiting for its peer ------------------------------------------------------


def test_collective_wait_for_the_peer_is_shaded_on_both_sides(tmp_path):
    r0 = write_et(tmp_path / "rank0.et", [cpu(1, 10, start=100), coll(2, 8, [1], pg="1", start=110)])
    r1 = write_et(tmp_path / "rank1.et", [cpu(1, 20, start=200), coll(2, 4, [1], pg="1", start=220)])
    _, _, _, (t0, t1) = timelines_of(r0, r1)
    lane = lane_label(("gpu", 0, 20))
    # rank 0's kernel measured [10, 18]: 4 µs of transfer (rank 1's shorter kernel) at its end.
    assert bars_of(t0, MEASURED, lane) == [(1, 10, 14, WAIT), (1, 14, 18, BUSY)]
    # simulated: issued at 10, rank 1 arrives at 20, transfer 4.
    assert bars_of(t0, SIMULATED, lane) == [(1, 10, 20, WAIT), (1, 20, 24, BUSY)]
    assert bars_of(t1, SIMULATED, lane) == [(1, 20, 24, BUSY)]
    # Both ranks reach the collective in the replay when they reached it measured: no divergence.
    assert t0.divergences == [] and t1.divergences == []


# --- real traces: the measured CPU lanes cover what was measured ----------------------------------


def union_length(intervals) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def test_measured_cpu_bars_tile_the_measured_busy_time_of_each_lane(tmp_path):
    et, kineto = dlrm_pair(0)
    out = tmp_path / "rank0.et"
    link_pair(et, kineto, out, LinkOptions(), None)
    rp, _, _, (tl,) = timelines_of(out)
    graph = rp.graphs[0]
    for lane, key in enumerate(graph.lane_keys):
        if key[0] != "cpu":
            continue
        measured = [(graph.start[u], graph.start[u] + graph.measured_dur[u]) for u in range(len(graph))
                    if graph.lane[u] == lane and graph.kind[u] == CPU and not math.isnan(graph.start[u])]
        drawn = sorted((s, e) for _, s, e, _ in bars_of(tl, MEASURED, lane_label(key)))
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(drawn, drawn[1:])), "measured bars overlap"
        assert sum(e - s for s, e in drawn) == pytest.approx(union_length(measured))


# --- the page -----------------------------------------------------------------------------------


def html_page(tmp_path: Path, *inputs: Path, name: str = "view.html") -> Path:
    pytest.importorskip("plotly", reason="needs plotly (pip install 'et-link[view]')")
    from typer.testing import CliRunner

    from linker.cli import app

    page = tmp_path / name
    result = CliRunner().invoke(app, ["simulate", *map(str, inputs), "--html", str(page)])
    assert result.exit_code == 0, result.output
    return page


def test_page_is_self_contained(tmp_path):
    page = html_page(tmp_path, nested_rank(tmp_path / "r.et")).read_text()
    assert "<script src" not in page and "cdn.plot.ly" not in page.split("</script>", 1)[1]
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js inlined
    assert page.count("<section id='rank-") == 1


def test_page_carries_the_reports_notes(tmp_path):
    et, kineto = FIXTURES / "cpu" / "threads" / "et.json.gz", FIXTURES / "cpu" / "threads" / "kineto.json.gz"
    out = tmp_path / "threads.et"
    link_pair(et, kineto, out, LinkOptions(), None)
    page = html_page(tmp_path, out).read_text()
    assert "<li>on the critical path CPU ops waited" in page and "--model lanes" in page


def test_a_wait_node_of_the_file_shows_its_cause(tmp_path):
    """A host op (100-110) launches a kernel that ran at 150-155; the file carries the 40 µs its
    stream sat idle as a wait node of cause ``unexplained_gpu_idle`` (``write.wait_nodes``). The
    page's bar for that wait names the cause in its hover text, as the critical path's row does."""
    from linker.write.output_edits import add_wait_nodes
    from linker.write.wait_nodes import Wait

    path = write_et(tmp_path / "waited.et", [cpu(1, 10, start=100), gpu(2, 5, deps=[1], start=150)])
    add_wait_nodes(path, [Wait(2, 40.0, "unexplained_gpu_idle", 40.0)], first_id=4)
    page = html_page(tmp_path, path).read_text()
    assert page.count("cause: unexplained_gpu_idle") == 1


def test_html_without_plotly_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_plotly(name, *args, **kwargs):
        if name.startswith("plotly"):
            raise ImportError("no plotly")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plotly)
    from typer.testing import CliRunner

    from linker.cli import app

    page = tmp_path / "view.html"
    result = CliRunner().invoke(app, ["simulate", str(nested_rank(tmp_path / "r.et")), "--html", str(page)])
    assert result.exit_code == 2 and "pip install 'et-link[view]'" in result.stderr
    assert not page.exists()


# --- in a real browser ----------------------------------------------------------------------------

CHROMIUM_PATHS = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")


def system_chromium() -> str | None:
    for candidate in CHROMIUM_PATHS:
        found = candidate if Path(candidate).is_file() else shutil.which(candidate)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")
    executable = system_chromium()
    if executable is None:
        pytest.skip("needs a system Chromium (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def drawn(browser, page_path: Path, screenshot: Path | None = None) -> dict:
    """What the browser drew: per rank section, its title, y tick labels and bar count."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(page_path.as_uri())
        page.wait_for_function("document.querySelectorAll('section.rank .barlayer').length =="
                               " document.querySelectorAll('section.rank').length", timeout=120_000)
        result = page.evaluate("""() => Array.from(document.querySelectorAll('section.rank')).map(s => ({
            id: s.id,
            title: (s.querySelector('.gtitle') || {}).textContent || '',
            lanes: Array.from(s.querySelectorAll('.ytick text')).map(t => t.textContent),
            bars: s.querySelectorAll('.barlayer .point').length,
            diamonds: s.querySelectorAll('.scatterlayer .point').length}))""")
        if screenshot is not None:
            page.locator("section.rank").first.screenshot(path=str(screenshot))
        return {r["id"]: r for r in result}
    finally:
        page.close()


def expected_lanes(rp, r) -> set[str]:
    graph = rp.graphs[r]
    used = {graph.lane[u] for u in range(len(graph))
            if graph.kind[u] != META and (graph.duration[u] > 0 or graph.measured_dur[u] > 0)}
    return {f"{lane_label(graph.lane_keys[lane])} ({side})" for lane in used for side in (MEASURED, SIMULATED)}


def assert_ranks_drawn(browser, page: Path, inputs: list[Path], screenshot: Path | None = None) -> None:
    simulation = linker.simulate(inputs)  # replayed as the command replays them (measured waits held)
    rp = simulation.replay
    timelines = rank_timelines(rp, simulation.path)
    seen = drawn(browser, page, screenshot)
    assert sorted(seen) == sorted(f"rank-{tl.rank}" for tl in timelines)
    for r, tl in enumerate(timelines):
        shown = seen[f"rank-{tl.rank}"]
        assert shown["title"].startswith(f"rank {tl.rank}")
        assert set(shown["lanes"]) == expected_lanes(rp, r)
        assert shown["bars"] == min(len(tl.bars), 20_000)
        assert shown["diamonds"] == len(tl.divergences)


def test_browser_draws_a_dlrm_rank(browser, tmp_path, linked_once):
    out, _, _ = linked_once(*dlrm_pair(0), ".et")
    assert_ranks_drawn(browser, html_page(tmp_path, out), [out])


def test_browser_draws_a_job(browser, tmp_path):
    """A job's page: one section per rank (the two GPU fixtures as ranks 0 and 1, each with its
    streams: each fixture pair drawn as a rank; a real job's rank is drawn by the dlrm test above)."""
    outs = []
    for rank, name in enumerate(("gpu_v101", "gpu_v111")):  # named as a job's files are named
        outs.append(tmp_path / f"rank{rank}.et")
        link_pair(FIXTURES / "gpu" / name / "et.json.gz", FIXTURES / "gpu" / name / "kineto.json.gz", outs[-1],
                  LinkOptions(), None)
    assert_ranks_drawn(browser, html_page(tmp_path, *outs), outs)


def test_browser_draws_a_cpu_pair(browser, tmp_path):
    et, kineto = shared_trace("torch_cpu", "threads", "et.json.gz"), shared_trace("torch_cpu", "threads", "kineto.json.gz")
    out = tmp_path / "threads.et"
    link_pair(et, kineto, out, LinkOptions(), None)
    assert_ranks_drawn(browser, html_page(tmp_path, out), [out])


def test_trace_out_shows_the_wait_for_peers_and_the_replayed_busy_time(tmp_path):
    import orjson

    from linker.sim.perfetto import trace_events

    r0 = write_et(tmp_path / "rank0.et", [cpu(1, 10, start=100), coll(2, 8, [1], pg="1", start=110)])
    r1 = write_et(tmp_path / "rank1.et", [cpu(1, 20, start=200), coll(2, 4, [1], pg="1", start=220)])
    rp, _, _, _ = timelines_of(r0, r1)
    events = [e for e in trace_events(rp) if e["ph"] == "X"]
    waits = [(e["pid"], e["ts"], e["dur"]) for e in events if e["name"].startswith("waiting for peers: ")]
    assert waits == [(1, 10, 10)]  # rank 0 issued at 10, rank 1 arrived at 20
    busy = {(e["pid"], e["args"]["id"]): e["args"]["replayed_busy_us"] for e in events if "replayed_busy_us" in e["args"]}
    assert busy == {(1, 1): 10, (1, 2): 8, (2, 1): 20, (2, 2): 4}
    assert orjson.dumps(events)  # still plain JSON


def test_trace_out_names_each_measured_waits_cause(tmp_path):
    """Kernel 2 (launched by cpu 1, 100-110) ran at 140: the replay holds it back 30 µs as a
    measured wait (``unexplained_gpu_idle``); the same wait carried by the file as a wait node. The
    simulated event of the held kernel, and that of the wait node, give the cause (and the held
    one its µs)."""
    from linker.sim.engine import measured_holds
    from linker.sim.perfetto import trace_events
    from linker.write.output_edits import add_wait_nodes
    from linker.write.wait_nodes import Wait

    held = write_et(tmp_path / "held.et", [cpu(1, 10, start=100), gpu(2, 5, deps=[1], start=140)])
    graphs = [load_graph(held)]
    events = [e for e in trace_events(replay(graphs, holds=measured_holds(graphs))) if e["ph"] == "X"]
    (kernel,) = [e for e in events if e["name"] == "kernel2" and e["pid"] == 2]
    assert (kernel["args"]["wait_cause"], kernel["args"]["measured_wait_us"]) == ("unexplained_gpu_idle", 30.0)
    carried = write_et(tmp_path / "carried.et", [cpu(1, 10, start=100), gpu(2, 5, deps=[1], start=140)])
    add_wait_nodes(carried, [Wait(2, 30.0, "unexplained_gpu_idle", 30.0)], first_id=4)
    graph = load_graph(carried)
    events = [e for e in trace_events(replay([graph])) if e["ph"] == "X" and e["pid"] == 2]
    causes = {e["args"]["id"]: e["args"].get("wait_cause") for e in events}
    assert causes == {1: None, 2: None, 4: "unexplained_gpu_idle"}

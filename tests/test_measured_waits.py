"""Measured waits no dependency explains, replayed as such (``simulate --waits measured``, the
default) or left out (``--waits explained``): both ratios, the explained share, the waits' causes,
and the critical path's wait rows; on a graph whose times are worked out by hand and on a real
trace."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

import linker
from conftest import SHARED_TRACES
from linker.sim.engine import LANES, replay
from linker.sim.load import load_graph
from sim_graphs import cpu, gpu, write_et

# Measured, from the rank's start at 100 µs: cpu 1 runs 0-10 and launches kernel 2, which ran 40-45
# (its stream idle 30 µs after its launcher ended: an unexplained wait); kernel 3 follows it on its
# stream, 45-50. Kernel 5 has no launcher (queued before the trace began) and ran 20-22 on another
# stream: 20 µs after the rank's start.
HAND = [cpu(1, 10, start=100), gpu(2, 5, deps=[1], start=140), gpu(3, 5, deps=[2], start=145),
        gpu(5, 2, stream=9, start=120)]


@pytest.fixture
def hand(tmp_path):
    return write_et(tmp_path / "hand.et", HAND)


@pytest.mark.parametrize("model", ["astra-sim", "lanes"])
def test_hand_graph_both_ratios_and_causes(hand, model):
    measured = 50.0  # 0 to 50
    with_waits = linker.simulate(hand, model=model)
    report = with_waits.report
    # held: kernel 2 by 30 (ready at 10, ran at 40), kernel 5 by 20 (ready at 0, ran at 20)
    assert report.waits.mode == "measured"
    assert report.waits.by_cause == {"launched_before_trace": 20.0, "unexplained_gpu_idle": 30.0}
    assert report.waits.ops == 2 and report.waits.us == 50.0
    assert report.simulated_us == measured and report.ratio == 1.0
    # without them: cpu 0-10, kernel 2 10-15, kernel 3 15-20; kernel 5 0-2 (astra-sim: one GPU
    # unit, so kernel 5 first, then 2 at 10): the step ends at 20
    assert report.waits.ratio_explained == 20.0 / measured
    assert report.waits.explained_share == 20.0 / 50.0
    start = {with_waits.replay.graphs[0].ids[u]: s for u, s in enumerate(with_waits.replay.start)}
    assert start[2] == 40.0 and start[5] == 20.0 and start[3] == 45.0
    # the critical path: cpu 1, the 30 µs wait, kernel 2, kernel 3
    assert report.critical_path_us_by_kind["wait"] == 30.0
    waits = [op for op in report.critical_path if op.kind == "wait"]
    assert [(op.name, op.us, op.count) for op in waits] == [("(measured wait: unexplained_gpu_idle)", 30.0, 1)]
    explained = linker.simulate(hand, model=model, waits="explained").report
    assert explained.ratio == 20.0 / measured and explained.waits.ratio_with_measured_waits == 1.0
    assert "wait" not in explained.critical_path_us_by_kind


def test_the_nodes_table_gives_each_held_nodes_wait_cause(hand):
    """``Simulation.nodes_table``: kernel 2 held 30 µs (``unexplained_gpu_idle``), kernel 5 20 µs
    (``launched_before_trace``: no launcher), the others none."""
    rows = linker.simulate(hand).nodes_table(as_rows=True)
    assert {row["id"]: row["wait_cause"] for row in rows} == {
        1: "", 2: "unexplained_gpu_idle", 3: "", 5: "launched_before_trace"}


def test_a_stream_held_past_the_event_it_was_told_to_wait_for_names_the_untraced_event(tmp_path):
    """Kernel 4's stream was told to wait for an event (its ``event_wait`` edge ties the event to
    kernel 2, which ended at 15); kernel 4 was launched by cpu 3, ended at 20, yet ran at 60: the
    event was recorded by work the trace does not show. Its 40 µs wait is ``untraced_event``;
    kernel 6, launched by cpu 5 (ended 30) and run at 50 on a stream of its own, waited for
    nothing the graph names: ``unexplained_gpu_idle``."""
    from linker.write.chakra_wire import make_attr

    kernel4 = gpu(4, 5, deps=[3, 2], stream=9, start=160)
    kernel4.attrs.append(make_attr("data_dep_causes", ["launch", "event_wait"]))
    path = write_et(tmp_path / "event.et", [cpu(1, 10, start=100), gpu(2, 5, deps=[1], start=110),
                                            cpu(3, 10, deps=[1], start=110), kernel4,
                                            cpu(5, 10, deps=[3], start=120), gpu(6, 5, deps=[5], stream=11, start=150)])
    report = linker.simulate(path, model="lanes").report
    assert report.waits.by_cause == {"untraced_event": 40.0, "unexplained_gpu_idle": 20.0}
    assert report.ratio == 1.0


def test_a_kernel_that_started_as_another_streams_kernel_ended_names_that_kernel(tmp_path):
    """cpu 1 (100-110) launches kernel 2 on stream 7 (110-1110) and kernel 3 on stream 8: ready at
    110, while kernel 2 ran, kernel 3 ran from 1090, in the last twentieth of kernel 2's time
    (1060-1110): its 980 µs wait is ``other_stream_kernel`` (the device was busy with kernel 2, or
    kernel 3 depended on it through something the trace lost). cpu 4 (110-120) launches kernel 5
    on stream 9, run from 1200, 90 µs after kernel 2 ended: ``unexplained_gpu_idle`` (1,080 µs);
    and a copy on stream 10, run from 1100 inside kernel 2's last stretch: a copy engine's work, not
    held by a kernel, ``unexplained_gpu_idle`` (980 µs). Before, all three were
    ``unexplained_gpu_idle``."""
    path = write_et(tmp_path / "busy.et", [
        cpu(1, 10, start=100), gpu(2, 1000, deps=[1], stream=7, start=110), gpu(3, 10, deps=[1], stream=8, start=1090),
        cpu(4, 10, deps=[1], start=110), gpu(5, 10, deps=[4], stream=9, start=1200),
        gpu(6, 10, deps=[4], stream=10, start=1100, name="Memcpy HtoD (Pinned -> Device)")])
    report = linker.simulate(path, model="lanes").report
    assert report.waits.by_cause == {"other_stream_kernel": 980.0, "unexplained_gpu_idle": 1080.0 + 980.0}
    assert report.ratio == 1.0


def test_scaling_leaves_the_measured_waits_as_they_are(hand):
    report = linker.simulate(hand, model="lanes", scale="gpu=0.5").report
    # cpu 0-10; kernel 2 ready 10, held 30: 40-42.5; kernel 3 42.5-45; kernel 5 20-21
    assert report.simulated_us == 45.0


def test_the_text_names_both_ratios(hand):
    text = linker.simulate(hand).text()
    line = next(line for line in text.splitlines() if "waits the graph does not explain" in line)
    assert "2 ops" in line and "ratio with them 1.000" in line and "the graph alone 0.400" in line
    assert "it explains 40.0% of the replayed step" in line


def test_an_unknown_waits_choice_is_one_line(hand):
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "simulate", str(hand), "--waits", "some"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--waits" in proc.stderr


def test_a_real_trace_replays_its_measured_step_with_its_waits(linked_once):
    """A ROCm DDP trace whose GPU waited for work queued before the trace: the graph alone replays
    it short; with its measured waits it replays the measured step on its lanes."""
    trace = SHARED_TRACES / "kineto_only" / "amd_tracelens_mi300_resnet_ddp_rccl.json.gz"
    if not trace.exists():
        pytest.skip("needs ../shared/traces (see README: Real test traces)")
    out, _, _ = linked_once(None, trace)
    report = linker.simulate(out, model=LANES).report
    assert 0.99 <= report.ratio <= 1.01
    assert report.waits.by_cause["launched_before_trace"] > 0
    graph_alone = replay([load_graph(out)], LANES)
    end = max(e for e in graph_alone.end if not math.isnan(e))
    assert report.waits.ratio_explained == round(end / report.measured_us, 4) < 0.95


def test_a_host_op_held_by_a_wait_the_graph_does_not_hold(tmp_path):
    """A host op that began 40 µs after the op before it on its thread ended, 35 µs after the
    last GPU op ended (a blocking call that waited for work outside the trace): held 35 µs,
    ``unexplained_host_wait`` (the 5 µs of the kernel are the graph's: a sync could be waiting
    for it)."""
    path = write_et(tmp_path / "host.et", [cpu(1, 10, start=100), gpu(2, 5, deps=[1], start=110),
                                           cpu(3, 5, deps=[1], start=150)])
    report = linker.simulate(path, model="lanes").report
    assert report.waits.by_cause == {"unexplained_host_wait": 35.0}
    assert report.measured_us == 55.0 and report.simulated_us == 55.0
    assert report.waits.ratio_explained == round(15.0 / 55.0, 4)  # cpu 3 and kernel 2 both end at 15


def test_explain_names_the_measured_wait_a_place_was_held_by(hand):
    from linker.sim.explain import drift_report, format_drift

    # CPU ops twice as fast: cpu 1 runs 0-5, kernel 2 is held its measured 30 µs after it, 35-40:
    # 5 µs earlier than measured (own replay: where measured, no jump to list).
    simulation = linker.simulate(hand, model="lanes", scale="cpu=0.5")
    drift = drift_report(simulation.replay, 10, simulation.path)
    (kernel,) = [place for place in drift["largest"] if place["id"] == 2]
    assert kernel["measured_wait_us"] == 30.0 and kernel["wait_cause"] == "unexplained_gpu_idle"
    assert kernel["drift_us"] == -5.0 and kernel["jump_us"] == -5.0
    text = "\n".join(format_drift(drift))
    assert "then a measured wait of 30 µs (unexplained_gpu_idle)" in text


def test_lateness_the_replay_already_has_takes_the_waits_place():
    """Under astra-sim's one GPU unit, kernel 7 runs 24 µs late (after kernel 6, the smaller id,
    which ran beside it when measured); kernel 2 waited 30 µs after kernel 7 when measured. Replaying
    the trace as measured, kernel 2 starts at its measured start (51 µs from the rank's start), not
    30 µs after the late kernel 7: the step is the measured 56 µs, not 80."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = write_et(Path(folder) / "late.et", [
            cpu(1, 10, start=100), gpu(6, 25, deps=[1], stream=9, start=110), gpu(7, 10, deps=[1], start=111),
            gpu(2, 5, deps=[1, 7], start=151)])
        report = linker.simulate(path).report
        assert report.waits.by_cause == {"unexplained_gpu_idle": 30.0}
        assert report.measured_us == 56.0 and report.simulated_us == 56.0
        # a what-if keeps each wait as that replay held it (kernel 2: 6 µs after kernel 7, at 45-51),
        # so a factor of 1 changes nothing, and halving the GPU: 6 at 10-22.5, 7 at 22.5-27.5, 2 at 33.5-36
        assert linker.simulate(path, scale="cpu=1.0000001").report.simulated_us == pytest.approx(56.0)
        assert linker.simulate(path, scale="gpu=0.5").report.simulated_us == pytest.approx(36.0)

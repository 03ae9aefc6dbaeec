"""Simulation fidelity: the linked ``.et`` replays as the measured step (issue 9's acceptance lines).

Each pair is linked to ``.et`` by et-link and replayed by ``linker.sim`` (ASTRA-sim's resource
model: one CPU op, one GPU compute op and one collective at a time per rank; and ``lanes``: every
CPU thread and GPU stream its own unit). Real traces come from ../shared (skipped when absent);
the CPU fixtures are our own captures. What-if tests scale durations and check the step moves by
the critical-path share.
"""

from __future__ import annotations

import pytest

import linker
from conftest import dlrm_pair, fixture_pair, shared_trace
from linker.plan.dependency_plan import CAUSES
from linker.write.chakra_wire import attr_dict, read_et
from linker.link.recipe import LinkOptions
from linker.pipeline import link_pair
from linker.sim.engine import ASTRA_SIM, LANES, Scale, replay
from linker.sim.load import load_graph
from linker.sim.report import build_report

BOUNDS = {ASTRA_SIM: (0.95, 1.05), LANES: (0.97, 1.03)}
CPU_BOUNDS = (0.95, 1.05)  # multi-thread CPU fixtures, lanes model


GPU_PAIRS = [f"dlrm_rank{rank}" for rank in range(8)] + ["param_linear", "hta_simple_add"]


def _pair(name: str):
    if name.startswith("dlrm_rank"):
        return dlrm_pair(int(name[len("dlrm_rank"):]))
    return shared_trace(name, "et.json.gz"), shared_trace(name, "kineto.json.gz")


def _linked(tmp_path_factory, cache: dict, name: str, pair):
    """The pair linked to .et once per session: (path, link report)."""
    if name not in cache:
        directory = tmp_path_factory.mktemp(name)
        out, report = directory / "out.et", directory / "report.json"
        outcome = link_pair(*pair, out, LinkOptions(), report)
        cache[name] = (out, outcome.report)
    return cache[name]


_CACHE: dict = {}


def simulate(path, model: str, scale: Scale = Scale()):
    report = build_report(replay([load_graph(path)], model, scale))[0]
    assert report.finished and report.never_issued == 0, report.stalls
    return report


@pytest.mark.parametrize("model", [ASTRA_SIM, LANES])
@pytest.mark.parametrize("name", GPU_PAIRS)
def test_gpu_pair_replays_as_measured(tmp_path_factory, name, model):
    out, _ = _linked(tmp_path_factory, _CACHE, name, _pair(name))
    report = simulate(out, model)
    low, high = BOUNDS[model]
    assert low <= report.simulated_us / report.measured_us <= high, (name, model, report.ratio)


@pytest.mark.parametrize("name,alone", [("threads", CPU_BOUNDS), ("autograd_threads", (0.90, 1.05))])
def test_multi_thread_cpu_fixture_replays_as_measured(tmp_path_factory, name, alone):
    """With the measured waits (``simulate``'s default) within ``CPU_BOUNDS``; the graph alone
    within ``alone``: the autograd engine's thread starts its bursts when the main thread handed
    them off, as measured, and the replay lets both threads run at once, where the two contended
    for the interpreter (the measured waits hold that)."""
    out, link_report = _linked(tmp_path_factory, _CACHE, f"cpu_{name}", fixture_pair("cpu", name))
    report = simulate(out, LANES)
    assert alone[0] <= report.simulated_us / report.measured_us <= alone[1], (name, report.ratio)
    measured = linker.simulate([out], model=LANES).report.ranks[0]
    low, high = CPU_BOUNDS
    assert low <= measured.simulated_us / measured.measured_us <= high, (name, measured.ratio)
    # the threads meet through fork/join edges, not timestamps: each worker thread is entered
    assert link_report.dependency_causes.get("join", 0) >= 1
    assert link_report.dependency_causes.get("fork", 0) + link_report.simulation["host_gap_us"] > 0


def test_single_thread_cpu_fixtures_replay_as_measured(tmp_path_factory):
    for name in ("mlp_steps", "dataloader"):
        out, _ = _linked(tmp_path_factory, _CACHE, f"cpu_{name}", fixture_pair("cpu", name))
        for model in (ASTRA_SIM, LANES):
            report = simulate(out, model)
            assert 0.97 <= report.simulated_us / report.measured_us <= 1.03, (name, model, report.ratio)


def _causes_in_file(out):
    """(total data dependencies, count per cause) as the written .et holds them."""
    counted = {cause: 0 for cause in CAUSES}
    total = 0
    for message in list(read_et(out))[1:]:
        causes = attr_dict(message).get("data_dep_causes", [])
        assert len(causes) == len(message.data_deps)
        total += len(causes)
        for cause in causes:
            counted[cause] += 1
    return total, counted


def test_cause_counts_hold_with_gpu_work_launched_before_the_trace(tmp_path_factory):
    # rank 1: 64 kernels launched before the trace sit under the process root with no launch edge
    out, link_report = _linked(tmp_path_factory, _CACHE, "dlrm_rank1", _pair("dlrm_rank1"))
    total, counted = _causes_in_file(out)
    assert link_report.dependencies == total
    assert link_report.dependency_causes == {c: n for c, n in counted.items() if n}


def test_every_dependency_has_a_cause_counted_in_the_report(tmp_path_factory):
    out, link_report = _linked(tmp_path_factory, _CACHE, "dlrm_rank0", _pair("dlrm_rank0"))
    total, counted = _causes_in_file(out)
    assert link_report.dependencies == total
    assert link_report.dependency_causes == {c: n for c, n in counted.items() if n}
    # rank 0 has every kind of evidence but collectives on two streams of one group
    for cause in ("thread_order", "parent", "launch", "stream_order", "event_wait", "sync", "fork", "join"):
        assert counted[cause] > 0, cause
    # busy time: blocked time (synchronisations, the main thread waiting for autograd) is removed
    assert link_report.simulation["blocked_us"] > 3000


def test_halving_cpu_time_on_a_cpu_bound_step_halves_it(tmp_path_factory):
    out, _ = _linked(tmp_path_factory, _CACHE, "cpu_mlp_steps", fixture_pair("cpu", "mlp_steps"))
    base = simulate(out, LANES)
    on_cpu = base.critical_path_us_by_kind["cpu"] + base.critical_path_us_by_kind.get("host", 0.0)  # ops + host time
    assert on_cpu == pytest.approx(base.simulated_us)
    half = simulate(out, LANES, Scale.parse("cpu=0.5"))
    saved = base.simulated_us - half.simulated_us
    assert saved == pytest.approx(0.5 * on_cpu, rel=0.02)
    assert simulate(out, LANES, Scale.parse("gpu=0.5")).simulated_us == base.simulated_us


@pytest.mark.parametrize("fixture", ["gpu_v101", "gpu_v111"])
def test_halving_gpu_time_on_a_gpu_bound_step_shortens_it_by_its_critical_share(tmp_path_factory, fixture):
    out, _ = _linked(tmp_path_factory, _CACHE, fixture, fixture_pair("gpu", fixture))
    base = simulate(out, LANES)
    gpu_share = base.critical_path_us_by_kind["gpu"]
    assert gpu_share > 0.5 * base.simulated_us  # GPU-bound
    half = simulate(out, LANES, Scale.parse("gpu=0.5"))
    saved = base.simulated_us - half.simulated_us
    # at most half the GPU time on the critical path; at least a fair part of it (the CPU path
    # becomes critical once the GPU is faster)
    assert 0.2 * gpu_share <= saved <= 0.5 * gpu_share + 1
    cpu_only = simulate(out, LANES, Scale.parse("cpu=0.5"))
    assert base.simulated_us - cpu_only.simulated_us <= 0.5 * base.critical_path_us_by_kind["cpu"] + 1


def test_dlrm_main_thread_waits_for_the_autograd_thread_by_fork_and_join():
    """rank 0: the main thread sits in ``## backward ##`` while the autograd engine thread runs the
    backward ops; that wait is blocked time, and the threads meet by fork/join edges."""
    from linker.plan.deps import dependency_plan
    from linker.read.et import read_execution_trace
    from linker.link.etplus import build_et_plus
    from linker.read.kineto import read_kineto_trace
    from linker.link.recipe import link

    et_path, kineto_path = dlrm_pair(0)
    et_plus = build_et_plus(link(read_execution_trace(et_path), read_kineto_trace(kineto_path)))
    plan = dependency_plan(et_plus)
    et, busy = et_plus.et, plan.busy
    backward = et.names.index("## backward ##")
    main = et.tid[backward]
    assert busy.main_tid == main
    engine_ops = [i for i in range(len(et.nodes)) if et.tid[i] != main and isinstance(et.nodes[i].ts, (int, float))
                  and et.names[i].startswith("autograd::engine::evaluate_function")]
    assert engine_ops
    engine_tid = et.tid[engine_ops[0]]
    engine_ops = [i for i in range(len(et.nodes)) if et.tid[i] == engine_tid and isinstance(et.nodes[i].ts, (int, float))]
    span = max(et.nodes[i].ts + et.nodes[i].dur for i in engine_ops) - min(et.nodes[i].ts for i in engine_ops)
    # almost all of the op's exclusive time was the wait, and the wait is about the engine's span
    assert busy.blocked[backward] > 0.9 * et.nodes[backward].exclusive_dur
    assert 0.8 * span <= busy.blocked[backward] <= span
    forks = [(s, t) for s, t, cause in busy.cross if cause == "fork"]
    joins = [(s, t) for s, t, cause in busy.cross if cause == "join"]
    assert forks and joins
    assert all(et.tid[s] == main and et.tid[t] != main for s, t in forks)
    assert all(et.tid[s] != main and et.tid[t] == main for s, t in joins)
    # the main thread resumes when the backward pass ends: its engine's last op releases the part
    # of ``## backward ##`` after the wait (what the op ran after it; ``## optimizer ##`` follows)
    last = max(engine_ops, key=lambda i: et.nodes[i].ts + et.nodes[i].dur)
    assert (last, backward) in joins
    assert busy.resumed_at[(last, backward)] == et.nodes[last].ts + et.nodes[last].dur


def test_ratios_are_simulated_over_measured_as_read_from_the_file(tmp_path):
    """On a one-thread CPU pair the replay is one chain, so its length is the sum of the nodes'
    ``sim_dur`` (scaled), and the measured step is the file's latest end less its earliest start:
    both computed here from the ET+ JSON, not by the simulator. ``--scale cpu=0.5`` makes the two
    differ, so a ratio taken the other way round (measured ÷ simulated) cannot pass."""
    import json

    et, kineto = fixture_pair("cpu", "main_thread_only")
    out = tmp_path / "out.json"
    link_pair(et, kineto, out)
    nodes = json.loads(out.read_text())["nodes"]
    timed = [n for n in nodes if "ts" in n]
    measured = max(n["ts"] + n.get("inclusive_dur", n["dur"]) for n in timed) - min(n["ts"] for n in timed)
    busy = sum(n.get("sim_dur", 0) for n in nodes)
    for factor in (1.0, 0.5):
        report = simulate(out, LANES, Scale.parse(f"cpu={factor}"))
        assert report.measured_us == pytest.approx(measured, abs=0.01)
        assert report.simulated_us == pytest.approx(factor * busy, rel=1e-6, abs=0.01)
        assert report.ratio == pytest.approx(factor * busy / measured, rel=1e-6)
        (rank,) = report.ranks  # the rank's own row, the one the ranks table prints
        assert (rank.measured_us, rank.simulated_us) == pytest.approx((measured, factor * busy), abs=0.01)
        assert rank.ratio == pytest.approx(factor * busy / measured, rel=1e-6)
    assert simulate(out, LANES, Scale.parse("cpu=0.5")).ratio < 0.6

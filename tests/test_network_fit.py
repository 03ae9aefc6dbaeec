"""The ASTRA-sim network cost model and its fit (linker/sim/network_fit.py)."""

from __future__ import annotations

import random

import pytest

from linker.sim.network_fit import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, DEFAULT_BANDWIDTH, DEFAULT_LATENCY,
                                    DEFAULT_TOPOLOGY, REDUCE_SCATTER, Collective, check_overrides, collective_ns,
                                    fit_network)

# Cycles printed by the real ASTRA-sim (0ba29a2, AstraSim_Analytical_Congestion_Unaware, built by
# ../shared/tools/astra-sim/build.sh) for one collective alone, with the system file et-link
# writes: (topology, NPUs, type, bytes, GB/s, ns latency) -> "sys[i] finished, N cycles" (max over i).
# The congestion-aware binary printed the same cycles for every FullyConnected and 8-NPU Ring row.
REAL_CYCLES = [
    ("FullyConnected", 8, ALL_REDUCE, 1 << 20, 10, 0, 172749),
    ("FullyConnected", 8, ALL_REDUCE, 1 << 20, 50, 500, 43025),
    ("Ring", 8, ALL_REDUCE, 1024, 50, 1000, 14178),
    ("Switch", 8, ALL_REDUCE, 8, 50, 1000, 28150),
    ("Ring", 4, ALL_GATHER, 1 << 20, 10, 0, 293008),
    ("Ring", 8, ALL_GATHER, 1 << 20, 50, 500, 140297),
    ("Switch", 8, ALL_GATHER, 8, 50, 1000, 14080),
    ("Ring", 8, ALL_TO_ALL, 1 << 20, 10, 0, 342086),
    ("Switch", 8, ALL_TO_ALL, 8, 50, 1000, 56290),
    ("FullyConnected", 2, ALL_TO_ALL, 1 << 20, 50, 500, 10285),
    ("Switch", 2, REDUCE_SCATTER, 1 << 20, 10, 0, 49829),
    ("FullyConnected", 8, REDUCE_SCATTER, 1 << 20, 50, 500, 22368),
    ("Ring", 4, REDUCE_SCATTER, 1 << 20, 10, 0, 74749),
    ("Switch", 2, ALL_REDUCE, 1 << 20, 10, 0, 98667),
]


@pytest.mark.parametrize("topology,npus,kind,size,bandwidth,latency,cycles", REAL_CYCLES)
def test_cost_model_matches_real_astra_sim_cycles(topology, npus, kind, size, bandwidth, latency, cycles):
    assert collective_ns(kind, size, npus, topology, bandwidth, latency) == cycles


def _synthetic(bandwidth: float, latency: float, topology: str, noise: float = 0.0, seed: int = 1) -> list[Collective]:
    rng = random.Random(seed)
    out = []
    for kind in (ALL_REDUCE, ALL_TO_ALL, ALL_GATHER, REDUCE_SCATTER):
        for size in (256, 4096, 65536, 1 << 20, 8 << 20, 3_000_000):
            for npus in (4, 8):
                ns = collective_ns(kind, size, npus, topology, bandwidth, latency)
                out.append(Collective(kind, size, npus, ns / 1000 * (1 + rng.uniform(-noise, noise))))
    return out


@pytest.mark.parametrize("bandwidth,latency", [(25.0, 700.0), (300.0, 2500.0), (8.0, 50.0)])
def test_fit_recovers_known_bandwidth_and_latency(bandwidth, latency):
    fit = fit_network(_synthetic(bandwidth, latency, DEFAULT_TOPOLOGY), 8)
    assert fit.topology == DEFAULT_TOPOLOGY and fit.npus == 8 and fit.fitted
    assert fit.bandwidth_gbps == pytest.approx(bandwidth, rel=0.01)
    assert fit.latency_ns == pytest.approx(latency, rel=0.01, abs=1.0)  # the model floors each step to whole ns
    assert abs(fit.aggregate_error) < 0.005 and fit.mean_abs_error < 0.01


def test_fit_with_noise_stays_within_tolerance():
    fit = fit_network(_synthetic(40.0, 1200.0, "Switch", noise=0.05, seed=7), 8, {"topology": "Switch"})
    assert fit.bandwidth_gbps == pytest.approx(40.0, rel=0.05)
    assert fit.latency_ns == pytest.approx(1200.0, rel=0.05)
    assert abs(fit.aggregate_error) < 0.01  # the constraint keeps the total


def test_topology_scales_latency_only():
    """Hops and latency appear only as their product: a FullyConnected fit of Switch data has twice
    the latency and the same bandwidth."""
    data = _synthetic(60.0, 400.0, "Switch")
    fit = fit_network(data, 8, {"topology": "FullyConnected"})
    assert fit.bandwidth_gbps == pytest.approx(60.0, rel=0.01)
    assert fit.latency_ns == pytest.approx(800.0, rel=0.01)


def test_user_values_override_the_fit():
    data = _synthetic(60.0, 400.0, "Switch")
    given = fit_network(data, 8, {"bandwidth_gbps": 60.0, "topology": "Switch"})
    assert given.bandwidth_gbps == 60.0 and given.latency_ns == pytest.approx(400.0, rel=0.01)
    both = fit_network(data, 8, {"bandwidth_gbps": 10.0, "latency_ns": 5.0, "npus": 16, "topology": "Ring"})
    assert (both.bandwidth_gbps, both.latency_ns, both.npus, both.topology, both.fitted) == (10.0, 5.0, 16, "Ring", False)
    assert both.aggregate_error > 1  # a 10 GB/s network is far slower than the measured one, and says so


def test_nothing_to_fit_gives_defaults_and_says_so():
    fit = fit_network([Collective(5, 1024, 8, 12.0)], 1)  # a BROADCAST: replayed for its duration
    assert (fit.bandwidth_gbps, fit.latency_ns, fit.npus, fit.fitted) == (DEFAULT_BANDWIDTH, DEFAULT_LATENCY, 2, False)
    assert any("no collective to fit" in note for note in fit.notes)
    assert any("own duration" in note for note in fit.notes)


def test_latency_bound_only_data_keeps_bandwidth_finite():
    """Collectives whose time does not grow with size: latency carries them, bandwidth hits its cap."""
    data = [Collective(ALL_TO_ALL, size, 8, 8.0) for size in (192, 1536, 13568, 24576)]
    fit = fit_network(data, 8)
    assert fit.latency_ns > 0 and fit.bandwidth_gbps > 0
    assert abs(fit.aggregate_error) < 0.05


def test_check_overrides():
    assert check_overrides("switch", 4, 12.5, 0) == {"topology": "Switch", "npus": 4, "bandwidth_gbps": 12.5,
                                                   "latency_ns": 0}
    assert check_overrides(None, None, None, None) == {}
    for bad in (("Torus", None, None, None), (None, 1, None, None), (None, None, 0, None), (None, None, None, -1)):
        with pytest.raises(ValueError):
            check_overrides(*bad)


def test_a_fit_that_cannot_be_trusted_says_so():
    """A fit at its bandwidth bound, or missing the collectives by far, warns and points a rank of
    a job to batch; a fit like the dlrm job's (-0.1% in aggregate, 20% per collective) does not."""
    from linker.sim.network_fit import MAX_BANDWIDTH, NetworkFit

    good = NetworkFit("FullyConnected", 8, 25.5, 241.5, True, collectives=8, measured_us=217.0, modelled_us=216.9,
                      mean_abs_error=0.199)
    assert good.warnings() == [] and not any("warning" in line for line in good.lines())
    bound = NetworkFit("FullyConnected", 2, MAX_BANDWIDTH, 526_900.0, True, collectives=8, measured_us=5798.0,
                       modelled_us=5798.4, mean_abs_error=1.305)
    warnings = bound.warnings()
    assert "ran into a bound" in warnings[0] and "130.5% on average" in warnings[1] and "et-link batch" in warnings[2]
    off = NetworkFit("Ring", 4, 10.0, 500.0, True, collectives=3, measured_us=100.0, modelled_us=110.0,
                     mean_abs_error=0.1)
    assert len(off.warnings()) == 2 and "+10.0% in aggregate" in off.warnings()[0]
    given = NetworkFit("Ring", 4, MAX_BANDWIDTH, 0.0, False, collectives=3, measured_us=100.0, modelled_us=300.0)
    assert given.warnings() == []  # the user's own values: nothing fitted to distrust


def test_astra_setup_on_one_rank_of_a_job_warns(tmp_path):
    import subprocess
    import sys

    from conftest import dlrm_pair
    from linker.pipeline import link_pair

    et, kineto = dlrm_pair(0)
    link_pair(et, kineto, tmp_path / "rank.0.et")
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "astra-setup", str(tmp_path / "rank.0.et")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warning: the fit ran into a bound" in proc.stdout and "et-link batch --format et" in proc.stdout

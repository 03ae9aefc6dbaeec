"""The ASTRA-sim network that reproduces a job's measured collectives: cost model and fit.

Cost model: ASTRA-sim's analytical congestion-unaware backend with the system configuration
et-link writes (``system_config``: one dimension, ``ring`` for every collective,
``preferred-dataset-splits`` 1, ``endpoint-delay`` 10, ``local-mem-bw`` 1600). From its source
(``Ring.cc``: steps and message size per collective; ``BasicTopology::send``: a message of m bytes
over h hops takes ``floor(h * latency + m / bandwidth)`` ns, bandwidth in GB/s of 2^30 bytes;
``PacketBundle``: a reducing step adds three passes over the message at ``local-mem-bw``) a
collective of S bytes among N NPUs takes, in ns::

    10 + steps * (10 + floor(h * L + m / B)) + reducing_steps * 3 * floor(m / local_mem_bw)

============== ============= ========= ==============
collective     steps         m         reducing steps
============== ============= ========= ==============
ALL_REDUCE     2 (N - 1)     S / N     N - 1
REDUCE_SCATTER N - 1         S / N     N - 1
ALL_GATHER     N - 1         S         0
ALL_TO_ALL     N (N - 1) / 2 S / N     0
============== ============= ========= ==============

h is 1 for ``Ring`` (neighbours) and ``FullyConnected``, 2 for ``Switch``; the 10 ns terms are the
endpoint delay. tests/test_network_fit.py checks the formula against cycles printed by a real
build (0ba29a2). Other collective types (e.g. BROADCAST) are replayed by ASTRA-sim for their own
duration and are not fitted.

Fit: the measured transfer time of each collective (what ``et-link simulate`` holds it for: the
shortest member's kernel) against the model, unknowns L (ns) and 1/B. The model is linear in them
(floors aside), so the fit is a weighted least squares on relative errors under the constraint
that the fitted times add up to the measured ones (the job's total communication time is kept),
with L >= 0 and B within (0, ``MAX_BANDWIDTH``]. Latency and hop count only appear as h * L, so the
topology is not told apart by the data: it is ``DEFAULT_TOPOLOGY``, ``FullyConnected``, unless the
user names one: on it the congestion-aware backend gives the same cycles as the congestion-unaware
one (ring steps use distinct links), measured at 2 and 8 NPUs; a congestion-aware ``Switch``
stores and forwards each message over two links (twice the m / B term), and a congestion-aware
2-NPU ``Ring`` aborts while building the network. Cost: O(collectives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from linker.model.errors import OptionError

ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER = 0, 2, 6, 7  # Chakra CollectiveCommType
FITTED_TYPES = {ALL_REDUCE: "ALL_REDUCE", ALL_GATHER: "ALL_GATHER", ALL_TO_ALL: "ALL_TO_ALL",
                REDUCE_SCATTER: "REDUCE_SCATTER"}
TOPOLOGIES = {"Ring": 1, "FullyConnected": 1, "Switch": 2}  # hops per ring step
DEFAULT_TOPOLOGY = "FullyConnected"
ENDPOINT_DELAY_NS = 10
LOCAL_MEM_BW_GBPS = 1600
MAX_BANDWIDTH = 100_000.0  # GB/s: "as good as free"; the fit never goes beyond
FIT_AGGREGATE_WARN = 0.05  # a fit whose modelled total misses the measured one by more: warned of
FIT_MEAN_WARN = 0.5  # ... or whose collectives it misses by more on average (a good job fit: ~0.2)
DEFAULT_BANDWIDTH, DEFAULT_LATENCY = 50.0, 500.0  # GB/s, ns: when there is nothing to fit
_GB = float(1 << 30)


def bytes_per_ns(gbps: float) -> float:
    """ASTRA-sim's bandwidth unit: GB/s of 2^30 bytes -> bytes per ns."""
    return gbps * _GB / 1e9


@dataclass(frozen=True)
class Collective:
    """One measured collective: Chakra type, bytes (``comm_size``), members, transfer time (µs)."""

    comm_type: int
    size: int
    npus: int
    measured_us: float


@dataclass(frozen=True)
class Terms:
    """A collective's time as ``constant + hops_steps * L + bytes_steps / B`` (ns; L in ns, B in
    bytes per ns), before the floors."""

    constant: float
    hop_steps: float
    byte_steps: float


def _shape(comm_type: int, size: int, npus: int) -> tuple[int, int, int]:
    """(steps, message bytes, reducing steps) of a ring collective (``Ring.cc``)."""
    n = max(npus, 2)
    if comm_type != ALL_GATHER:
        size = max(size, n)  # Sys::determine_chunk_size: at least one byte per NPU
    if comm_type == ALL_REDUCE:
        return 2 * (n - 1), size // n, n - 1
    if comm_type == REDUCE_SCATTER:
        return n - 1, size // n, n - 1
    if comm_type == ALL_GATHER:
        return n - 1, size, 0
    if comm_type == ALL_TO_ALL:
        return n * (n - 1) // 2, size // n, 0
    raise ValueError(f"collective type {comm_type} is not modelled")


def _reduce_ns(message: int) -> int:
    return 3 * int(message / (LOCAL_MEM_BW_GBPS * 1e9) * 1e9)


def terms(comm_type: int, size: int, npus: int, hops: int) -> Terms:
    steps, message, reducing = _shape(comm_type, size, npus)
    return Terms(ENDPOINT_DELAY_NS * (1 + steps) + reducing * _reduce_ns(message), steps * hops, steps * message)


def collective_ns(comm_type: int, size: int, npus: int, topology: str, bandwidth_gbps: float,
                  latency_ns: float) -> int:
    """What ASTRA-sim's congestion-unaware backend takes for one collective alone (ns), floors
    included."""
    steps, message, reducing = _shape(comm_type, size, npus)
    per_step = int(TOPOLOGIES[topology] * latency_ns + message / bytes_per_ns(bandwidth_gbps))
    return ENDPOINT_DELAY_NS + steps * (ENDPOINT_DELAY_NS + per_step) + reducing * _reduce_ns(message)


@dataclass
class NetworkFit:
    """The network to write and how well it reproduces the measured collectives."""

    topology: str
    npus: int
    bandwidth_gbps: float
    latency_ns: float
    fitted: bool  # False: nothing to fit (defaults), or every value given by the user
    collectives: int = 0
    measured_us: float = 0.0
    modelled_us: float = 0.0
    mean_abs_error: float = 0.0  # mean |model / measured - 1| over the collectives
    by_type: dict[str, dict] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The CPU collectives' bus this network stands for (``--astra-cpu-collectives network``:
    # ``sim.network.FittedNetwork.to_json``), None for a network fitted to GPU collectives.
    cpu_bus: dict | None = None

    @property
    def aggregate_error(self) -> float:
        return self.modelled_us / self.measured_us - 1.0 if self.measured_us else 0.0

    def to_json(self) -> dict:
        return {"topology": self.topology, "npus": self.npus, "bandwidth_gbps": self.bandwidth_gbps,
                "latency_ns": self.latency_ns, "fitted": self.fitted, "collectives": self.collectives,
                "measured_us": round(self.measured_us, 3), "modelled_us": round(self.modelled_us, 3),
                "aggregate_error": round(self.aggregate_error, 6), "mean_abs_error": round(self.mean_abs_error, 6),
                "by_type": self.by_type, "notes": self.notes, **({"cpu_bus": self.cpu_bus} if self.cpu_bus else {})}

    def lines(self) -> list[str]:
        head = (f"ASTRA-sim network: {self.topology}, {self.npus} NPUs, {self.bandwidth_gbps:.4g} GB/s, "
                f"{self.latency_ns:.4g} ns" + (" (fitted)" if self.fitted else ""))
        out = [head]
        if self.collectives:
            out.append(f"  fit over {self.collectives} collectives: modelled {self.modelled_us:,.1f} us vs measured "
                       f"{self.measured_us:,.1f} us ({100 * self.aggregate_error:+.1f}% in aggregate, "
                       f"{100 * self.mean_abs_error:.1f}% mean per collective)")
            for name, row in sorted(self.by_type.items()):
                out.append(f"    {name}: {row['count']} collectives, modelled {row['modelled_us']:,.1f} us vs measured "
                           f"{row['measured_us']:,.1f} us ({100 * row['error']:+.1f}%)")
        out += [f"  note: {note}" for note in self.notes]
        out += [f"  warning: {warning}" for warning in self.warnings()]
        return out

    def warnings(self) -> list[str]:
        """What makes a fitted network untrustworthy, in words: the fit ran into a bound of its
        range, or it misses the measured collectives by more than ``FIT_AGGREGATE_WARN`` in
        aggregate or ``FIT_MEAN_WARN`` on average (their times then hold more than transfers: waits
        for ranks the files do not hold, as on one rank of a job). None for a CPU collectives'
        bus (``cpu_bus``): its latency 0 is "not told apart", and each episode's miss is kept in its
        timed nodes, so the replay stays the measured one."""
        if not self.fitted or not self.collectives or self.cpu_bus is not None:
            return []
        found = []
        if self.bandwidth_gbps >= MAX_BANDWIDTH or self.latency_ns <= 0:
            found.append(f"the fit ran into a bound ({self.bandwidth_gbps:.4g} GB/s, {self.latency_ns:.4g} ns): the "
                         "measured collectives do not look like transfers over one network")
        if abs(self.aggregate_error) > FIT_AGGREGATE_WARN or self.mean_abs_error > FIT_MEAN_WARN:
            found.append(f"the fitted network misses the measured collectives by {100 * self.aggregate_error:+.1f}% "
                         f"in aggregate, {100 * self.mean_abs_error:.1f}% on average")
        if found:
            found.append("where the files hold one or some of a job's ranks, link every rank with et-link batch "
                         "--format et (the fit then sees the whole job); or give --astra-bandwidth / --astra-latency")
        return found


def check_overrides(topology: str | None, npus: int | None, bandwidth: float | None,
                    latency: float | None) -> dict:
    """The user's network values as a dict (only those given); raises OptionError on a bad one."""
    given = {}
    if topology is not None:
        names = {name.lower(): name for name in TOPOLOGIES}
        if topology.lower() not in names:
            raise OptionError(f"unknown --astra-topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
        given["topology"] = names[topology.lower()]
    if npus is not None:
        if npus < 2:
            raise OptionError(f"--astra-npus {npus}: ASTRA-sim needs at least 2 NPUs")
        given["npus"] = npus
    if bandwidth is not None:
        if not (bandwidth > 0 and math.isfinite(bandwidth)):
            raise OptionError(f"--astra-bandwidth {bandwidth:g}: must be a positive number of GB/s")
        given["bandwidth_gbps"] = bandwidth
    if latency is not None:
        if not (latency >= 0 and math.isfinite(latency)):
            raise OptionError(f"--astra-latency {latency:g}: must be 0 or more ns")
        given["latency_ns"] = latency
    return given


def _solve(rows: list[tuple[Terms, float]], fix_latency: float | None, fix_inverse: float | None
           ) -> tuple[float, float]:
    """(L, 1/B) minimising sum(((model - t) / t)^2) with sum(model) = sum(t), bounds applied."""
    min_inverse = 1.0 / bytes_per_ns(MAX_BANDWIDTH)
    total = sum(t for _, t in rows)
    fixed = sum(r.constant for r, _ in rows)
    sum_a = sum(r.hop_steps for r, _ in rows)
    sum_b = sum(r.byte_steps for r, _ in rows)
    if fix_latency is not None and fix_inverse is not None:
        return fix_latency, fix_inverse
    if fix_latency is not None:  # one unknown: the constraint gives it
        x2 = (total - fixed - sum_a * fix_latency) / sum_b if sum_b else min_inverse
        return fix_latency, max(x2, min_inverse)
    if fix_inverse is not None:
        x1 = (total - fixed - sum_b * fix_inverse) / sum_a if sum_a else 0.0
        return max(x1, 0.0), fix_inverse
    # weighted least squares with one equality: the KKT system [[2A, c], [c^T, 0]]
    saa = sab = sbb = sar = sbr = 0.0
    for r, t in rows:
        w = 1.0 / (t * t)
        residual = t - r.constant
        saa += w * r.hop_steps * r.hop_steps
        sab += w * r.hop_steps * r.byte_steps
        sbb += w * r.byte_steps * r.byte_steps
        sar += w * r.hop_steps * residual
        sbr += w * r.byte_steps * residual
    rhs = total - fixed
    matrix = [[saa, sab, sum_a], [sab, sbb, sum_b], [sum_a, sum_b, 0.0]]
    vector = [sar, sbr, rhs]
    solution = _gauss(matrix, vector)
    if solution is not None:
        x1, x2 = solution[0], solution[1]
        if x1 >= 0 and x2 >= min_inverse:
            return x1, x2
    # a bound is active: try each face, keep the better
    candidates = []
    if sum_b:
        candidates.append((0.0, max((rhs) / sum_b, min_inverse)))
    if sum_a:
        candidates.append((max((rhs - sum_b * min_inverse) / sum_a, 0.0), min_inverse))
    if not candidates:
        return 0.0, min_inverse
    return min(candidates, key=lambda x: _loss(rows, *x))


def _loss(rows, x1: float, x2: float) -> float:
    return sum(((r.constant + r.hop_steps * x1 + r.byte_steps * x2 - t) / t) ** 2 for r, t in rows)


def _gauss(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Solve a small dense system by Gaussian elimination with partial pivoting; None if singular."""
    n = len(vector)
    a = [row[:] + [v] for row, v in zip(matrix, vector)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                for c in range(col, n + 1):
                    a[r][c] -= f * a[col][c]
    return [a[r][n] / a[r][r] for r in range(n)]


def fit_network(collectives: list[Collective], npus: int, overrides: dict | None = None) -> NetworkFit:
    """Fit bandwidth and latency to ``collectives`` (those of a modelled type with a positive
    time) on ``npus`` NPUs; ``overrides`` (``check_overrides``) fix any of topology, npus,
    bandwidth_gbps, latency_ns. Without collectives to fit: the defaults, said in a note."""
    overrides = overrides or {}
    topology = overrides.get("topology", DEFAULT_TOPOLOGY)
    npus = overrides.get("npus", max(npus, 2))
    hops = TOPOLOGIES[topology]
    usable = [c for c in collectives if c.comm_type in FITTED_TYPES and c.measured_us > 0]
    notes = []
    skipped = len(collectives) - len(usable)
    if skipped:
        notes.append(f"{skipped} collective(s) of a type ASTRA-sim replays for their own duration (not fitted)")
    rows = [(terms(c.comm_type, c.size, c.npus, hops), c.measured_us * 1000.0) for c in usable]
    given_bw, given_lat = overrides.get("bandwidth_gbps"), overrides.get("latency_ns")
    if not rows:
        notes.append("no collective to fit: default bandwidth and latency")
        return NetworkFit(topology, npus, given_bw or DEFAULT_BANDWIDTH,
                          DEFAULT_LATENCY if given_lat is None else given_lat, False, notes=notes)
    x1, x2 = _solve(rows, given_lat, 1.0 / bytes_per_ns(given_bw) if given_bw else None)
    bandwidth = min(1.0 / (x2 * _GB / 1e9), MAX_BANDWIDTH)
    fit = NetworkFit(topology, npus, stated(bandwidth), stated(x1), given_bw is None or given_lat is None,
                     notes=notes)
    _score(fit, usable)
    return fit


def stated(value: float) -> float:
    """Four significant digits: what the network file states."""
    return float(f"{value:.4g}")


def _score(fit: NetworkFit, usable: list[Collective]) -> None:
    errors = []
    for c in usable:
        modelled = collective_ns(c.comm_type, c.size, c.npus, fit.topology, fit.bandwidth_gbps, fit.latency_ns) / 1000
        row = fit.by_type.setdefault(FITTED_TYPES[c.comm_type], {"count": 0, "measured_us": 0.0, "modelled_us": 0.0})
        row["count"] += 1
        row["measured_us"] += c.measured_us
        row["modelled_us"] += modelled
        fit.measured_us += c.measured_us
        fit.modelled_us += modelled
        errors.append(abs(modelled / c.measured_us - 1))
    for row in fit.by_type.values():
        row["error"] = round(row["modelled_us"] / row["measured_us"] - 1, 6)
        row["measured_us"] = round(row["measured_us"], 3)
        row["modelled_us"] = round(row["modelled_us"], 3)
    fit.collectives = len(usable)
    fit.mean_abs_error = sum(errors) / len(errors)

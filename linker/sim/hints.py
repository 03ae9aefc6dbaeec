"""Hints for ``et-link simulate``: when the other replay model fits the trace better.

Model ``astra-sim`` runs one CPU op at a time per rank. A rank whose CPU threads ran in parallel
(a data loader, autograd threads, a pool of workers) is then replayed with their work in series,
so the simulated step grows; model ``lanes`` gives each thread its own unit. The measured
*parallel CPU time* of a rank is the sum over its CPU threads of the time each thread was busy
(the union of its ops' intervals) minus the time any thread was busy: 0 when the threads took
turns. Cost: O(n log n) per rank (one sort of the CPU intervals).
"""

from __future__ import annotations

from linker.model.units import format_us
from linker.sim.engine import ASTRA_SIM
from linker.sim.graph import CPU, SimGraph

PARALLEL_SHARE = 0.05  # of the measured step, before the hint is given ...
SLOW_RATIO = 1.05  # ... to a rank replayed at least this much slower than measured


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by intervals (sorted here). O(k log k)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def parallel_cpu_time(graph: SimGraph) -> float:
    """µs of the measured timeline during which a second CPU thread was busy as well (counted
    once per extra thread). O(n log n)."""
    by_thread: dict[int, list[tuple[float, float]]] = {}
    for u, kind in enumerate(graph.kind):
        s = graph.start[u]
        if kind == CPU and s == s and graph.measured_dur[u] > 0:
            by_thread.setdefault(graph.lane[u], []).append((s, s + graph.measured_dur[u]))
    if len(by_thread) < 2:
        return 0.0
    every = [interval for intervals in by_thread.values() for interval in intervals]
    return sum(_union(intervals) for intervals in by_thread.values()) - _union(every)


def lanes_hints(graphs: list[SimGraph], model: str, ratios: list[float | None]) -> list[str]:
    """A note per rank replayed ``SLOW_RATIO`` or more slower than measured (``ratios``: simulated
    / measured step per rank) whose CPU threads ran in parallel for at least ``PARALLEL_SHARE`` of
    its measured step, when the model runs one CPU op at a time."""
    if model != ASTRA_SIM:
        return []
    notes = []
    for graph, ratio in zip(graphs, ratios):
        if ratio is None or ratio < SLOW_RATIO:
            continue
        step = graph.measured_step()
        parallel = parallel_cpu_time(graph)
        if step > 0 and parallel >= PARALLEL_SHARE * step:
            who = f"rank {graph.rank}: its" if len(graphs) > 1 else "the"
            notes.append(f"{who} CPU threads ran in parallel for {format_us(parallel)} of the {format_us(step)} "
                         "measured step, but model astra-sim runs one CPU op at a time per rank; --model lanes "
                         "replays each thread on its own")
    return notes

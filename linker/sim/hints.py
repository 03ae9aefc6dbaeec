"""Hints for ``et-link simulate``: when the other replay model fits the trace better.

Model ``astra-sim`` (as ASTRA-sim itself) runs one CPU op, one GPU compute op and one collective
at a time per rank. A rank whose CPU threads ran in parallel (a data loader, autograd threads, a
pool of workers), whose GPU streams ran compute kernels at once (a side stream, communication
kernels the trace names no collective of), or whose CPU backend ran collectives at once on its
workers (gloo's two) is then replayed with that work in series, so the simulated step grows;
model ``lanes`` gives each thread and each stream its own unit. What that costs is
read from the replay itself: the time the critical path's ops waited for their unit while an op of
another thread or stream held it (O(path)). Overlap as measured would mislead: a kernel of a few
µs that waits behind a 9 ms one of another stream costs the replay 9 ms though it overlapped it by
µs, and threads that overlapped but never met on the path cost nothing. The note also gives the
measured *parallel CPU time* (the sum over the threads of the time each was busy, the union of its
ops' intervals, minus the time any of them was busy: 0 when they took turns; O(n log n) per rank).
"""

from __future__ import annotations

import math

from linker.model.units import format_us
from linker.sim.critical import PathStep
from linker.sim.engine import ASTRA_SIM, Replay
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
        if kind == CPU and not math.isnan(s) and graph.measured_dur[u] > 0:
            by_thread.setdefault(graph.lane[u], []).append((s, s + graph.measured_dur[u]))
    if len(by_thread) < 2:
        return 0.0
    every = [interval for intervals in by_thread.values() for interval in intervals]
    return sum(_union(intervals) for intervals in by_thread.values()) - _union(every)


def unit_waits_across_lanes(rp: Replay, path: list[PathStep]) -> dict[tuple[int, str], float]:
    """Per (rank position, unit name: "cpu", "gpu", "comm"), the µs of the critical path an op of
    one lane (thread, stream) spent holding the unit that the next op on the path, of another lane,
    waited for (held from its issue: a collective holds its unit while its worker's pickup and its
    peers keep it from starting): what running those lanes one op at a time added to the step. The
    path's steps tile it, so the total is at most the simulated end. O(path)."""
    waits: dict[tuple[int, str], float] = {}
    for before, step in zip(path, path[1:]):
        if step.via != "unit" or step.graph is None or before.graph is None:
            continue
        if before.graph.lane_keys[before.graph.lane[before.local]] == step.graph.lane_keys[step.graph.lane[step.local]]:
            continue
        key = rp.unit_names[rp.unit_of[step.node]]
        held = min(before.end - rp.issue[before.node], rp.issue[step.node] - rp.ready[step.node])
        waits[key] = waits.get(key, 0.0) + max(0.0, held)
    return waits


# Per unit of model astra-sim: what waited, the unit, what held it, how the model runs (as
# ASTRA-sim), and what lanes gives a unit of its own.
_UNIT_WORDS = {
    "cpu": ("CPU ops", "the one CPU unit", "another thread's op", " runs one CPU op at a time per rank", "each thread"),
    "gpu": ("GPU ops", "the one GPU unit", "another stream's op", ", as ASTRA-sim, runs one GPU compute op at a time "
            "per rank where the streams ran at once", "each stream"),
    "comm": ("collectives", "the one collective in flight", "another worker's collective", ", as ASTRA-sim, runs "
             "one collective at a time per rank, where a CPU backend ran them at once on its workers", "each worker"),
}


def lanes_hints(graphs: list[SimGraph], model: str, ratios: list[float | None], rp: Replay,
                path: list[PathStep]) -> list[str]:
    """A note per rank replayed ``SLOW_RATIO`` or more slower than measured (``ratios``: simulated
    / measured step per rank) whose critical path (of the replay ``rp``) waited at least
    ``PARALLEL_SHARE`` of its measured step for the one CPU unit (GPU unit, collective in flight)
    while another thread's op (stream's op, worker's collective) held it, when the model runs one
    of each at a time."""
    if model != ASTRA_SIM:
        return []
    waits = unit_waits_across_lanes(rp, path)
    notes = []
    for position, (graph, ratio) in enumerate(zip(graphs, ratios)):
        if ratio is None or ratio < SLOW_RATIO:
            continue
        step = graph.measured_step()
        if step <= 0:
            continue
        whose = f"rank {graph.rank}'s" if len(graphs) > 1 else "the"
        for unit, (ops, one, holder, model_runs, each) in _UNIT_WORDS.items():
            waited = waits.get((position, unit), 0.0)
            if waited < PARALLEL_SHARE * step:
                continue
            measured = (f"its CPU threads ran in parallel for {format_us(parallel_cpu_time(graph))} of the "
                        f"{format_us(step)} measured step" if unit == "cpu" else f"of a {format_us(step)} measured step")
            notes.append(f"on {whose} critical path {ops} waited {format_us(waited)} for {one} while {holder} held it "
                         f"({measured}): model astra-sim{model_runs}; --model lanes replays {each} on its own")
    return notes

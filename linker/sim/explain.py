"""Where the simulated timeline drifts from the measured one (``et-link simulate --explain``).

A node's *drift* is its simulated start minus its measured start, both from one origin (for a
collective, its simulated *arrival*, when its unit took it, as a measured collective starts when its
rank arrives and then waits for the peers): the job's
earliest measured start when the ranks' clocks agree and the replay released each rank at its
measured offset (time 0 of the replay), else each rank's own first measured start and its release.
Drift is read along the critical path (``critical``): the chain of nodes whose ends set each
other's starts up to the simulated end. Between consecutive timed nodes of the path the drift
changes by a *jump*; the jumps, plus the drift of the first timed node and the end's own change,
add up to the end's drift (simulated end − measured end), so the largest jumps are where the
ratio is made. Each place names the node (rank, id, name, kind, lane), its drift and jump, and
what held it: the dependency (its cause from the file: ``launch``, ``sync``, ``thread_order``,
...) and the node it waited for, its resource (``unit``: the node before it on its unit), or a
peer rank at a collective. A later piece of an op (docs/durations.md) is named with the op it
continues.

``first``: the first node of the path whose drift exceeds ``THRESHOLD`` of the measured span (at
least 1 µs). ``largest``: the ``top`` largest jumps by size. ``end_drift_us``: simulated end −
measured end. Cost: O(n) to find the path's end, O(path) after.
"""

from __future__ import annotations

from linker.sim.critical import PathStep, critical_path
from linker.sim.engine import Replay, measured_release
from linker.sim.graph import KIND_NAMES, lane_label

THRESHOLD = 0.005  # share of the measured span a drift must exceed to be "the first place"


def _origins(rp: Replay) -> tuple[list[float], list[float], bool]:
    """Per rank: the measured time that is replay time 0 for it and the replay time it is
    compared from; and whether that is one origin for the whole job."""
    spans = [graph.measured_span() for graph in rp.graphs]
    if len(rp.graphs) > 1 and any(rp.release) and measured_release(rp.graphs) is not None:
        origin = min(first for first, _ in spans)
        return [origin] * len(spans), [0.0] * len(spans), True
    return [first for first, _ in spans], list(rp.release), False


def _place(rp: Replay, step: PathStep, drift: float, jump: float) -> dict:
    graph, i = step.graph, step.local
    place = {"rank": graph.rank, "id": graph.ids[i], "name": graph.names[i], "kind": KIND_NAMES[graph.kind[i]],
             "lane": lane_label(graph.lane_keys[graph.lane[i]]), "simulated_start_us": round(rp.issue[step.node], 3),
             "drift_us": round(drift, 3), "jump_us": round(jump, 3), "held_by": step.link or step.via}
    if i in graph.continues:  # a later piece of an op: named by the op it continues
        place["continues"] = graph.continues[i]
    cause = rp.cause[step.node]
    if step.via == "peer":
        place["peer_rank"] = step.peer_rank
    elif cause >= 0:
        cause_graph, local = rp.local(cause)
        place["after"] = {"rank": cause_graph.rank, "id": cause_graph.ids[local], "name": cause_graph.names[local]}
    return place


def drift_report(rp: Replay, top: int = 5, path: list[PathStep] | None = None) -> dict:
    """The drift places of a replay (module docstring) as a JSON-able dict."""
    path = path if path is not None else critical_path(rp)
    origins, offsets, joint = _origins(rp)
    spans = [graph.measured_span() for graph in rp.graphs]
    measured_end = max(last - origin + offset for (_, last), origin, offset in zip(spans, origins, offsets)) \
        if spans else 0.0
    simulated_end = path[-1].end if path else 0.0
    threshold = max(1.0, THRESHOLD * measured_end)
    places, previous, first = [], 0.0, None
    for step in path:
        measured = step.graph.start[step.local]
        if measured != measured:  # not timed: its drift is not known; the next timed node carries it
            continue
        r = rp.rank_of(step.node)
        drift = (rp.issue[step.node] - offsets[r]) - (measured - origins[r])
        place = _place(rp, step, drift, drift - previous)
        places.append(place)
        if first is None and abs(drift) > threshold:
            first = place
        previous = drift
    largest = sorted(places, key=lambda p: (-abs(p["jump_us"]), p["simulated_start_us"]))[:top]
    return {"origin": "earliest measured start" if joint else "each rank's own start",
            "end_drift_us": round(simulated_end - measured_end, 3), "threshold_us": round(threshold, 3),
            "first": first, "largest": largest, "path_nodes_timed": len(places)}


def format_drift(drift: dict) -> list[str]:
    """The text lines of ``drift_report``."""
    lines = [f"drift (simulated start - measured start, from the {drift['origin']}, along the critical path): "
             f"the end drifts {drift['end_drift_us']:+,.1f} us"]

    def line(place: dict) -> str:
        held = place["held_by"]
        if "after" in place:
            held += f" after node {place['after']['id']} {place['after']['name']!r}"
            if place["after"]["rank"] != place["rank"]:
                held += f" of rank {place['after']['rank']}"
        elif "peer_rank" in place:
            held += f" rank {place['peer_rank']}"
        piece = f"a later piece of node {place['continues']}, " if "continues" in place else ""
        return (f"rank {place['rank']} node {place['id']} {place['name']!r} ({piece}{place['kind']}, {place['lane']}): "
                f"drift {place['drift_us']:+,.1f} us (jump {place['jump_us']:+,.1f}), held by {held}")

    if drift["first"] is None:
        lines.append(f"  no node of the path drifts by more than {drift['threshold_us']:,.1f} us")
    else:
        lines.append(f"  first beyond {drift['threshold_us']:,.1f} us: " + line(drift["first"]))
    if drift["largest"]:
        lines.append("  largest jumps:")
        lines += [f"    {line(place)}" for place in drift["largest"]]
    return lines

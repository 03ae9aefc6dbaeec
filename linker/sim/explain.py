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
peer rank at a collective, and the measured wait the replay held it back by after that, if any
(``simulate --waits measured``). A later piece of an op (docs/durations.md) is named with the op it
continues.

``first``: the first node of the path whose drift exceeds ``THRESHOLD`` of the measured span (at
least 1 µs). ``largest``: the ``top`` largest jumps by size, of ``JUMP_FLOOR_US`` or more: a
smaller jump is the rounding of the times the file holds (a ``.et`` holds whole µs, so an op and
the one it waited for can disagree by up to 1.5 µs where nothing moved), not a place where the
replay gains or loses time. ``end_drift_us``: simulated end − measured end. Cost: O(n) to find the
path's end, O(path) after.
"""

from __future__ import annotations

import math

from linker.sim.critical import PathStep, critical_path
from linker.sim.engine import Replay, measured_release
from linker.sim.graph import KIND_NAMES, lane_label
from linker.sim.unheld import HOLD_MIN_US
from linker.model.units import format_us

THRESHOLD = 0.005  # share of the measured span a drift must exceed to be "the first place"
JUMP_FLOOR_US = HOLD_MIN_US  # the least jump listed among the largest: below it, the rounding of the times
SHORT_NAME = 80  # characters of an op's name in the text (a C++ kernel's full name runs to 900)

# How a node was reached, in words (the JSON keeps the names: "unit", "peer", "launch"...).
LINK_WORDS = {"start": "the start", "unit": "waiting for its resource", "peer": "waiting for a peer rank",
              "dependency": "a dependency", "parent": "its parent op", "thread_order": "the previous op on its thread",
              "launch": "its launching op", "stream_order": "the previous op on its stream",
              "sync": "a synchronize", "event_wait": "an event wait", "fork": "a thread fork", "join": "a thread join",
              "collective_order": "the previous collective", "rank_start": "its rank's start",
              "other_stream_kernel": "another stream's kernel freeing the device"}


def short_name(name: str, limit: int = SHORT_NAME) -> str:
    """An op's name for a line of text: a C++ template's arguments and a signature's parameters
    left out ("void at::native::elementwise_kernel<...>(...)" -> "void at::native::elementwise_kernel<…>"),
    then cut at ``limit`` characters."""
    for opening, elided in (("<", "<…>"), ("(", "(…)")):
        at = name.find(opening)
        if 0 < at < len(name) - 1 and len(name) > limit:
            name = name[:at] + elided
    return name if len(name) <= limit else name[:limit - 1] + "…"


def measured_origins(rp: Replay) -> tuple[list[float], list[float], bool]:
    """Per rank: the measured time that is replay time 0 for it and the replay time it is
    compared from; and whether that is one origin for the whole job (also the origin of
    ``Simulation.nodes_table``)."""
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
    if step.held > 0:  # held back by a measured wait the graph does not explain (``Replay.holds``)
        place["measured_wait_us"], place["wait_cause"] = round(step.held, 3), step.held_cause
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
    origins, offsets, joint = measured_origins(rp)
    spans = [graph.measured_span() for graph in rp.graphs]
    measured_end = max(last - origin + offset for (_, last), origin, offset in zip(spans, origins, offsets)) \
        if spans else 0.0
    simulated_end = path[-1].end if path else 0.0
    threshold = max(1.0, THRESHOLD * measured_end)
    places, previous, first = [], 0.0, None
    for step in path:
        measured = step.graph.start[step.local]
        if math.isnan(measured):  # not timed: its drift is not known; the next timed node carries it
            continue
        r = rp.rank_of(step.node)
        drift = (rp.issue[step.node] - offsets[r]) - (measured - origins[r])
        place = _place(rp, step, drift, drift - previous)
        places.append(place)
        if first is None and abs(drift) > threshold:
            first = place
        previous = drift
    jumps = [place for place in places if abs(place["jump_us"]) >= JUMP_FLOOR_US]
    largest = sorted(jumps, key=lambda p: (-abs(p["jump_us"]), p["simulated_start_us"]))[:top]
    return {"origin": "earliest measured start" if joint else "each rank's own start",
            "end_drift_us": round(simulated_end - measured_end, 3), "threshold_us": round(threshold, 3),
            "first": first, "largest": largest, "jump_floor_us": JUMP_FLOOR_US, "path_nodes_timed": len(places)}


def format_drift(drift: dict, measured_us: float | None = None) -> list[str]:
    """The text lines of ``drift_report``; ``measured_us``: the step, to say what share of it the
    threshold is. Names in their short form (``short_name``; the JSON keeps them whole), causes in
    words (``LINK_WORDS``)."""
    origin = "each rank's own start" if drift["origin"] == "each rank's own start" else "the earliest measured start"
    lines = [f"drift (simulated start - measured start, from {origin}, along the critical path): "
             f"the end drifts {_signed_us(drift['end_drift_us'])}"]

    def line(place: dict) -> str:
        held = LINK_WORDS.get(place["held_by"], place["held_by"])
        if "after" in place:
            held += f", node {place['after']['id']} {short_name(place['after']['name'])!r}"
            if place["after"]["rank"] != place["rank"]:
                held += f" of rank {place['after']['rank']}"
        elif "peer_rank" in place:
            held += f" {place['peer_rank']}"
        if "measured_wait_us" in place:
            held += f", then a measured wait of {format_us(place['measured_wait_us'])} ({place['wait_cause']})"
        piece = f"a later piece of node {place['continues']}, " if "continues" in place else ""
        return (f"rank {place['rank']} node {place['id']} {short_name(place['name'])!r} ({piece}{place['kind']}, "
                f"{place['lane']}): drift {_signed_us(place['drift_us'])} (jump {_signed_us(place['jump_us'])}), "
                f"held by {held}")

    share = f" ({drift['threshold_us'] / measured_us:.1%} of the step)" if measured_us else ""
    if drift["first"] is None:
        lines.append(f"  no node of the path drifts by more than {format_us(drift['threshold_us'])}{share}")
    else:
        lines.append(f"  first beyond {format_us(drift['threshold_us'])}{share}: " + line(drift["first"]))
    floor = format_us(drift["jump_floor_us"])
    if drift["largest"]:
        lines.append(f"  largest jumps ({floor} or more):")
        lines += [f"    {line(place)}" for place in drift["largest"]]
    else:
        lines.append(f"  no jump of {floor} or more: along the path the replay keeps the measured timing "
                     "(smaller jumps are the rounding of the times in the file)")
    return lines


def _signed_us(us: float) -> str:
    return ("+" if us >= 0 else "−") + format_us(abs(us))

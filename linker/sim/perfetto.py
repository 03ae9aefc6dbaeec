"""``--trace-out``: the measured and the simulated timeline side by side as a Chrome/Perfetto trace.

One rank: two processes, "measured" and "simulated", with the same lane (thread) names —
"cpu thread 1", "gpu 0 stream 7"… — so the same lane can be compared one above the other. A job:
one process per rank ("rank 3"), whose lanes come in pairs: "cpu thread 1 (measured)" directly above
"cpu thread 1 (simulated)". Each node is one complete event ("ph": "X") on the lane of the thread or
stream it ran on, whatever the model (under ``astra-sim`` all CPU lanes of a rank share one unit, so
simulated events of different CPU lanes never overlap). Measured times are shifted so each rank's
first measured op starts at its replay start (0, or its measured offset in a job whose clocks agree),
so both sides share one time axis; simulated times start at 0. Event args: node id, kind; for the
measured events ``replayed_busy_us``, the part of the measured time the simulator replays as busy
(a nested CPU op's exclusive time; a collective's transfer without its wait for peers); for the
simulated events the time the node waited after it was ready (its unit was busy, or peers had not
arrived) and, for a measured wait (a wait node of the file, or a node the replay held back by one:
``Replay.holds``), ``wait_cause`` (``sim.unheld.WAIT_CAUSES``; a held node's ``measured_wait_us``
too). A collective that held its unit waiting for peer ranks also gets a slice "waiting for
peers: <name>" before it on its simulated lane. Nodes never issued are absent from the simulated
side. ``et-link simulate --html`` draws the same comparison with the nesting and waits resolved.
Written atomically (no file on failure); the inputs are refused as output. Cost: O(n) events.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import orjson

from linker.write.sink import atomic_output
from linker.sim.engine import Replay
from linker.sim.graph import KIND_NAMES, lane_label

MEASURED, SIMULATED = "measured", "simulated"


def _metadata(pid: int, tid: int | None, name: str, value, sort: int | None = None) -> list[dict]:
    event = {"ph": "M", "pid": pid, "name": name, "args": {"name": value}}
    if tid is not None:
        event["tid"] = tid
    events = [event]
    if sort is not None:
        sort_name = "thread_sort_index" if tid is not None else "process_sort_index"
        sort_event = {"ph": "M", "pid": pid, "name": sort_name, "args": {"sort_index": sort}}
        if tid is not None:
            sort_event["tid"] = tid
        events.append(sort_event)
    return events


def trace_events(rp: Replay) -> list[dict]:
    """The Chrome trace events of a replay (metadata first)."""
    job = len(rp.graphs) > 1
    events: list[dict] = []
    for r, (graph, base) in enumerate(zip(rp.graphs, rp.offsets)):
        first, _ = graph.measured_span()
        first -= rp.release[r]  # a rank released late keeps its measured offset on the measured side too
        lanes = [lane_label(key) for key in graph.lane_keys]
        order = sorted(range(len(lanes)), key=lambda lane: graph.lane_keys[lane])
        if job:
            pids = {MEASURED: r + 1, SIMULATED: r + 1}
            events += _metadata(r + 1, None, "process_name", f"rank {graph.rank}", r)
            tids = {MEASURED: [0] * len(lanes), SIMULATED: [0] * len(lanes)}
            for position, lane in enumerate(order):
                for offset, side in enumerate((MEASURED, SIMULATED)):
                    tid = 2 * position + offset + 1
                    tids[side][lane] = tid
                    events += _metadata(r + 1, tid, "thread_name", f"{lanes[lane]} ({side})", tid)
        else:
            pids = {MEASURED: 1, SIMULATED: 2}
            tids = {MEASURED: [0] * len(lanes), SIMULATED: [0] * len(lanes)}
            for side, pid in pids.items():
                events += _metadata(pid, None, "process_name", side, pid)
                for position, lane in enumerate(order):
                    tids[side][lane] = position + 1
                    events += _metadata(pid, position + 1, "thread_name", lanes[lane], position + 1)
        causes = rp.wait_causes(r)
        for local in range(len(graph)):
            name, lane, kind = graph.names[local], graph.lane[local], KIND_NAMES[graph.kind[local]]
            node_id = graph.ids[local]
            s = graph.start[local]
            if not math.isnan(s) and not math.isnan(first):
                events.append({"ph": "X", "name": name, "pid": pids[MEASURED], "tid": tids[MEASURED][lane],
                               "ts": s - first, "dur": graph.measured_dur[local],
                               "args": {"id": node_id, "kind": kind, "replayed_busy_us": graph.duration[local]}})
            u = base + local
            if not math.isnan(rp.end[u]) and rp.groups.group_of[u] >= 0 and rp.start[u] > rp.issue[u]:
                events.append({"ph": "X", "name": f"waiting for peers: {name}", "pid": pids[SIMULATED],
                               "tid": tids[SIMULATED][lane], "ts": rp.issue[u], "dur": rp.start[u] - rp.issue[u],
                               "args": {"id": node_id, "kind": "wait for peer ranks"}})
            if not math.isnan(rp.end[u]):
                args = {"id": node_id, "kind": kind, "waited_us": rp.start[u] - rp.ready[u]}
                if causes[local]:
                    args["wait_cause"] = causes[local]
                if u in rp.holds:  # a measured wait the replay held it back by
                    args["measured_wait_us"] = rp.holds[u][0]
                events.append({"ph": "X", "name": name, "pid": pids[SIMULATED], "tid": tids[SIMULATED][lane],
                               "ts": rp.start[u], "dur": rp.end[u] - rp.start[u], "args": args})
    return events


def write_trace(rp: Replay, path: str | os.PathLike, inputs: tuple = ()) -> None:
    """Write the trace JSON ({"traceEvents": [...], "displayTimeUnit": "ms"}) to ``path``."""
    document = {"traceEvents": trace_events(rp), "displayTimeUnit": "ms",
                "otherData": {"model": rp.model, "files": [g.path for g in rp.graphs]}}
    with atomic_output(Path(path), inputs) as out:
        out.write(orjson.dumps(document))

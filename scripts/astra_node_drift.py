"""Where the real ASTRA-sim departs from `et-link simulate`, node by node, on one linked job.

    ASTRA_SIM_BIN=/path/to/bin/AstraSim_Analytical_Congestion_Unaware python scripts/astra_node_drift.py \
        LINKED_JOB [--form network|measured] [--network bandwidth=RATE] [--rank R] [--step-us 1000]

LINKED_JOB: a folder of ``rank.<N>.et`` files with ``comm_groups.json`` (``et-link batch --format
et``). The job's ASTRA-sim setup is written into a temporary folder (``astra-setup`` with the
CPU-collective form asked; with ``--network``, the bus written as that rate, as docs/whatif.md
says: links of rate / N), its ``system.json`` with ``"trace-enabled": 1`` so that ASTRA-sim logs
each node's issue and end (``log/log.log``), and run. `et-link simulate` replays the same files
with the same ``--network``. For each rank (or the one asked) the script prints the nodes, in
`simulate`'s end order, where ASTRA-sim's end minus `simulate`'s changes by ``--step-us`` or more
since the last node printed, with the node's name, thread and duration, and each collective's
meeting, carried collective and timed part: the places where the two replays part. Both count
from the job's start (ASTRA-sim's tick 0 is `simulate`'s earliest issue).

How docs/whatif.md ("The reverse excess taken apart") found its causes. A developer's tool: needs
ASTRA-sim (never built or run in CI); prints, writes nothing outside its temporary folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ASTRA-sim's Workload::issue and Workload::call log lines (its system.json "trace-enabled": 1).
TRACE_LINE = re.compile(r"\] (issue|callback),sys->id=(\d+), tick=(\d+), node->id=(\d+),")


def astra_trace(setup: Path, binary: str) -> dict[tuple[str, int, int], float]:
    """Run ``setup`` with tracing on: (``issue`` or ``callback``, NPU, node id) -> µs."""
    system = setup / "system.json"
    config = json.loads(system.read_text())
    config["trace-enabled"] = 1
    system.write_text(json.dumps(config, indent=4) + "\n")
    run = subprocess.run(["sh", str(setup / "run")], env={**os.environ, "ASTRA_SIM_BIN": binary},
                         capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"{setup / 'run'}: ASTRA-sim failed ({run.returncode}): {run.stderr.strip()[-400:]}")
    events = {}
    with open(setup / "log" / "log.log") as log:
        for line in log:
            match = TRACE_LINE.search(line)
            if match:
                kind, npu, tick, node = match.groups()
                events[(kind, int(npu), int(node))] = int(tick) / 1000
    return events


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", type=Path)
    parser.add_argument("--form", choices=("network", "measured"), default="network")
    parser.add_argument("--network", default="", help="simulate's --network, e.g. bandwidth=2.5Gbit/s")
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--step-us", type=float, default=1000.0)
    args = parser.parse_args(argv)
    binary = os.environ.get("ASTRA_SIM_BIN", "").split(os.pathsep)[0]
    if not binary:
        print("ASTRA_SIM_BIN is not set: nothing to compare")
        return 0

    from linker import simulate
    from linker.batch.astra_collectives import cpu_collective_edits
    from linker.batch.astra_setup import setup_for_files
    from linker.sim.load import load_graph
    from linker.sim.network import NetworkSpec

    files = sorted(args.job.glob("rank.*.et"), key=lambda p: int(p.name.split(".")[1]))
    overrides = {"cpu_collectives": args.form} if args.form != "measured" else {}
    if args.network:
        overrides["bandwidth_gbps"] = NetworkSpec.parse(args.network).bandwidth / len(files) / 2 ** 30
    replayed = simulate(args.job, network=args.network).replay
    origin = min(t for t in replayed.issue if not math.isnan(t))
    groups_path = args.job / "comm_groups.json"
    groups = json.loads(groups_path.read_text()) if groups_path.exists() else None
    graphs = [load_graph(path, rank) for rank, path in enumerate(files)]
    edits = cpu_collective_edits(graphs, groups, args.form, given=overrides).edits  # as the setup writes them
    with tempfile.TemporaryDirectory() as work:
        setup = Path(work) / "astra"
        setup_for_files([args.job], setup, overrides)
        events = astra_trace(setup, binary)
    for r, graph in enumerate(replayed.graphs):
        if args.rank is not None and graph.rank != args.rank:
            continue
        base = replayed.offsets[r]
        ended = sorted((replayed.end[base + u] - origin, u) for u in range(len(graph))
                       if not math.isnan(replayed.end[base + u]) and ("callback", r, graph.ids[u]) in events)
        print(f"rank {graph.rank}: simulate ends {ended[-1][0] / 1000:.3f} ms, ASTRA-sim "
              f"{max(events[('callback', r, graph.ids[u])] for _, u in ended) / 1000:.3f} ms")
        shown = None
        for end, u in ended:
            node_id = graph.ids[u]
            drift = events[("callback", r, node_id)] - end
            edit = edits[r].get(node_id)
            if shown is not None and abs(drift - shown) < args.step_us and u not in graph.comm:
                continue
            shown = drift
            line = (f"  {node_id:>8} {graph.names[u][:36]:36} {str(graph.lane_keys[graph.lane[u]]):14} "
                    f"dur {graph.duration[u]:>9.0f}  simulate {end:>11.0f}  ASTRA-sim {end + drift:>11.0f}  "
                    f"drift {drift:>+9.0f} us")
            if edit is not None and edit.sync_id is not None:
                meeting = events.get(("callback", r, edit.sync_id))
                carried = events.get(("callback", r, edit.carried[0])) if edit.carried else None
                line += f"  [met {meeting:.0f}" + (f", carried to {carried:.0f}" if carried is not None else "")
                line += f", timed {edit.timed_us}]"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

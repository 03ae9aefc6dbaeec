#!/usr/bin/env python3
"""Dependencies of an ET+ that the measured timeline contradicts, from the ET+ JSON alone.

An edge m -> n (``data_deps`` of n holds m) says n starts after m has run for the busy time the
ET+ gives it. It is *contradicted* when m's measured busy start plus that busy time (``sim_dur``)
passes n's measured busy start by more than ``--slack`` µs (50 by default: more than the clock
skew of the traces at hand). A node's measured busy start is its ``ts``, except for a collective on
a CPU thread (a ``comm_type`` or ``comm_size`` and no ``stream``: gloo, MPI, UCC; a send or receive
there is busy for its whole record, which this rule gives too), whose record runs from its issue
and whose busy time is the part after the group's previous collective ended, up to the earlier of
its recorded end, the start of its ``join`` target (the op that reads its result, or the node
of host time before that op) and the start of its first child (an op its worker ran after
communicating, such as gloo's copy of each rank's part out of an ``all_gather``)
(docs/fidelity.md, "CPU collectives"): that end less ``sim_dur``. Only edges between timed nodes
count; the ``rank_start`` delay node is not timed.

Prints, per file and per cause, the edges checked, the contradicted ones and the worst overshoot;
``--examples N`` names the worst edges. Exit status 1 when any edge is contradicted, 2 (after a
one-line message) when a file cannot be read as an ET+ JSON.

Usage: python scripts/order_check.py OUT.json [...] [--slack 50] [--examples 3] [--json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path


def busy_start(node: dict, read_at: dict[int, float]) -> float:
    """Where the node's busy time begins on the measured timeline (the module's rule);
    ``read_at``: node id -> the earliest start of a ``join`` target of it."""
    if ("comm_type" in node or "comm_size" in node) and "stream" not in node and "sim_dur" in node and "dur" in node:
        return min(node["ts"] + node["dur"], read_at.get(node["id"], float("inf"))) - node["sim_dur"]
    return node["ts"]


def joins_read_at(nodes: list[dict], by_id: dict[int, dict]) -> dict[int, float]:
    """Per node that is a ``join`` or ``parent`` source: the earliest measured start among its join
    targets and children."""
    read_at: dict[int, float] = {}
    for node in nodes:
        if "ts" not in node:
            continue
        for source_id, cause in zip(node.get("data_deps") or [], node.get("data_dep_causes") or []):
            if cause in ("join", "parent") and source_id in by_id:
                read_at[source_id] = min(read_at.get(source_id, float("inf")), node["ts"])
    return read_at


def check(path: Path, slack: float, examples: int) -> dict:
    data = path.read_bytes()
    nodes = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)["nodes"]
    by_id = {node["id"]: node for node in nodes}
    checked: dict[str, int] = defaultdict(int)
    broken: dict[str, list] = defaultdict(list)
    read_at = joins_read_at(nodes, by_id)
    for node in nodes:
        if "ts" not in node:
            continue
        causes = node.get("data_dep_causes") or [""] * len(node.get("data_deps") or [])
        for source_id, cause in zip(node.get("data_deps") or [], causes):
            source = by_id.get(source_id)
            if source is None or "ts" not in source:
                continue
            checked[cause] += 1
            over = busy_start(source, read_at) + source.get("sim_dur", source.get("dur", 0)) - busy_start(node, read_at)
            if over > slack:
                broken[cause].append((over, source_id, node["id"]))
    rows = {}
    for cause in sorted(checked):
        worst = sorted(broken[cause], reverse=True)
        rows[cause] = {"edges": checked[cause], "contradicted": len(worst),
                       "worst_us": round(worst[0][0], 1) if worst else 0.0,
                       "examples": [{"from": s, "to": t, "over_us": round(o, 1)} for o, s, t in worst[:examples]]}
    return {"file": str(path), "edges": sum(checked.values()),
            "contradicted": sum(len(v) for v in broken.values()), "by_cause": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--slack", type=float, default=50.0)
    parser.add_argument("--examples", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    any_broken, unreadable = False, False
    for path in args.files:
        try:
            result = check(path, args.slack, args.examples)
        except (OSError, ValueError, KeyError) as err:  # not there, not an ET+ JSON: one line
            print(f"order_check.py: {path}: cannot read it as an ET+ JSON ({type(err).__name__}: {err})",
                  file=sys.stderr)
            unreadable = True
            continue
        any_broken = any_broken or result["contradicted"] > 0
        if args.json:
            print(json.dumps(result))
            continue
        print(f"{result['file']}: {result['contradicted']:,} of {result['edges']:,} edges contradicted")
        for cause, row in result["by_cause"].items():
            if row["contradicted"]:
                print(f"  {cause or '(no cause)'}: {row['contradicted']:,} of {row['edges']:,}, worst +{row['worst_us']:,.1f} us")
                for example in row["examples"]:
                    print(f"    node {example['from']} -> node {example['to']}: +{example['over_us']:,.1f} us")
    return 2 if unreadable else 1 if any_broken else 0


if __name__ == "__main__":
    sys.exit(main())

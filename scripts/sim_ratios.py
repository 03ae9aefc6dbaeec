#!/usr/bin/env python3
"""Print simulated ÷ measured step for every ET + Kineto pair, under both replay models.

Usage: PYTHONPATH=. python scripts/sim_ratios.py [--shared ../shared/traces] [--json]

Each pair (the param_dlrm ranks, param_linear, hta_simple_add from the shared traces when present,
then every pair under tests/fixtures) is linked to a Chakra ``.et`` in a temporary directory and
replayed by ``linker.sim`` with ``--model astra-sim`` and ``--model lanes``. Columns: measured step
(µs), simulated step per model, ratio per model, data dependencies written, link+write seconds
(wall clock, one run: the machine may be shared).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from linker.link.recipe import LinkOptions  # noqa: E402
from linker.pipeline import link_pair  # noqa: E402
from linker.sim.engine import ASTRA_SIM, LANES, replay  # noqa: E402
from linker.sim.load import load_graph  # noqa: E402
from linker.sim.report import build_report  # noqa: E402


def pairs(shared: Path) -> list[tuple[str, Path, Path]]:
    """(name, ET, Kineto) of every pair found."""
    found = []
    for rank in range(8):
        et, kineto = shared / "param_dlrm" / f"rank{rank}.et.json.gz", shared / "param_dlrm" / f"rank{rank}.kineto.json.gz"
        if et.exists() and kineto.exists():
            found.append((f"param_dlrm/rank{rank}", et, kineto))
    for name in ("param_linear", "hta_simple_add"):
        et, kineto = shared / name / "et.json.gz", shared / name / "kineto.json.gz"
        if et.exists() and kineto.exists():
            found.append((name, et, kineto))
    for directory in sorted((ROOT / "tests" / "fixtures").glob("*/*")):
        et, kineto = directory / "et.json.gz", directory / "kineto.json.gz"
        if et.exists() and kineto.exists():
            found.append((f"fixtures/{directory.parent.name}/{directory.name}", et, kineto))
    return found


def measure(name: str, et: Path, kineto: Path, directory: Path) -> dict:
    out = directory / (name.replace("/", "_") + ".et")
    started = time.perf_counter()
    outcome = link_pair(et, kineto, out, LinkOptions(), None)
    seconds = time.perf_counter() - started
    row = {"pair": name, "dependencies": outcome.report.dependencies, "link_seconds": round(seconds, 2)}
    graph = load_graph(out)
    for model in (ASTRA_SIM, LANES):
        report = build_report(replay([graph], model))[0]
        row["measured_us"] = report.measured_us
        row[f"{model}_us"] = report.simulated_us
        row[f"{model}_ratio"] = report.ratio
        row[f"{model}_never_issued"] = report.never_issued
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--json", action="store_true", help="one JSON object per pair instead of the table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(name, et, kineto, Path(tmp)) for name, et, kineto in pairs(args.shared)]
    if args.json:
        for row in rows:
            print(orjson.dumps(row).decode())
        return 0
    header = f"{'pair':34} {'measured us':>12} {'astra-sim us':>13} {'ratio':>7} {'lanes us':>11} {'ratio':>7} {'deps':>7} {'link s':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['pair']:34} {r['measured_us']:12.0f} {r['astra-sim_us']:13.0f} {r['astra-sim_ratio']:7.4f} "
              f"{r['lanes_us']:11.0f} {r['lanes_ratio']:7.4f} {r['dependencies']:7d} {r['link_seconds']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark ``et-link simulate``: wall time and peak memory of the whole command, per model.

Usage:
    python scripts/bench_sim.py FILE [FILE ...] [--runs 3] [--models astra-sim,lanes]
    python scripts/bench_sim.py --et ET --kineto K [--runs 3]   # link to a .et first, then time simulate

Every run is a fresh process (``python -m linker.cli simulate ... --json``); wall time is measured
around it and peak RSS comes from the child's own resource usage (``os.wait4``). Prints, per model,
the median / min / max wall seconds, the peak RSS and the replay's simulated/measured figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS MiB, exit status, stdout) of one fresh process, reaped here."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 6):
            sys.exit(f"bench_sim: {' '.join(cmd)} failed: {err.read().decode().strip()}")
        return wall, usage.ru_maxrss / 1024.0, proc.returncode, out.read().decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--et", type=Path)
    parser.add_argument("--kineto", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="astra-sim,lanes")
    args = parser.parse_args()
    files = list(args.files)
    workdir = None
    if args.et and args.kineto:
        workdir = tempfile.TemporaryDirectory(prefix="bench_sim_")
        linked = Path(workdir.name) / "linked.et"
        wall, peak, _, _ = measure([sys.executable, "-m", "linker.cli", "--et-file", str(args.et),
                                          "--kineto-file", str(args.kineto), "-o", str(linked), "-q"])
        print(f"link to .et: {wall:.2f} s, peak {peak:.0f} MiB")
        files.append(linked)
    if not files:
        parser.error("give .et / ET+ files, or --et and --kineto")
    size = sum(f.stat().st_size for f in files) / 2**20
    print(f"inputs: {len(files)} file(s), {size:.1f} MiB")
    for model in args.models.split(","):
        cmd = [sys.executable, "-m", "linker.cli", "simulate", *map(str, files), "--json", "--model", model]
        walls, peaks, report = [], [], {}
        for _ in range(args.runs):
            wall, peak, _, output = measure(cmd)
            walls.append(wall)
            peaks.append(peak)
            report = json.loads(output)
        print(f"simulate --model {model}: wall median {statistics.median(walls):.2f} s "
              f"(min {min(walls):.2f}, max {max(walls):.2f}, {args.runs} runs), peak {max(peaks):.0f} MiB; "
              f"measured {report['measured_us']:.0f} us, simulated {report['simulated_us']:.0f} us, "
              f"ratio {report['ratio']}, nodes {sum(r['nodes'] for r in report['ranks'])}")
    if workdir is not None:
        workdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Time and memory of the cross-rank collective check of ``et-link batch`` at job scale.

Writes synthetic report sidecars (``collectives`` records only) for ``--ranks`` ranks, each with
``--collectives`` collectives on the world group, the same number on its data-parallel group of
``--dp`` ranks, and one send/recv pair per 10 collectives along a pipeline of ranks; then runs
``linker.batch.collectives.check_job`` once in a fresh process and prints its wall time, the peak RSS
growth, and the sidecars' size. One rank can be made to diverge (``--diverge``).

    python scripts/bench_job_check.py --ranks 1024 --collectives 2000
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linker.batch.collectives import CommOp, RankCollectives  # noqa: E402

SIZES = [192, 1536, 13568, 24576, 448, 907840, 1576964]


def rank_record(rank: int, ranks: int, collectives: int, dp: int, diverge: int | None) -> RankCollectives:
    dp_group = str(2 + rank // dp)
    world = [CommOp("ALL_REDUCE" if k % 3 else "ALL_TO_ALL", SIZES[k % len(SIZES)], "float") for k in range(collectives)]
    local = [CommOp("ALL_GATHER", SIZES[(k + 1) % len(SIZES)], "bfloat16") for k in range(collectives)]
    if rank == diverge:
        world[collectives // 2] = CommOp("ALL_REDUCE", 7, "float")
    p2p = []
    for k in range(collectives // 10):
        if rank + 1 < ranks:
            p2p.append(CommOp("SEND", 4096, "float", rank + 1))
        if rank > 0:
            p2p.append(CommOp("RECV", 4096, "float", rank - 1))
    first = (rank // dp) * dp
    groups = {"1": list(range(ranks)), dp_group: list(range(first, min(first + dp, ranks)))}
    return RankCollectives(groups, {"1": world, dp_group: local}, {"1": p2p})


CHECK_CODE = r"""
import json, resource, sys, time
from linker.batch.collectives import check_job
paths = json.loads(sys.argv[1]); base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
check = check_job({int(r): p for r, p in paths.items()}, [int(r) for r in paths], len(paths))
wall = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall": wall, "rss_growth_kib": peak - base, "status": check.status,
                  "divergences": [d.message for d in check.divergences][:3]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--collectives", type=int, default=2000, help="per group per rank")
    parser.add_argument("--dp", type=int, default=8, help="ranks per data-parallel group")
    parser.add_argument("--diverge", type=int, default=None, help="rank whose world sequence differs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths, total_bytes = {}, 0
        for rank in range(args.ranks):
            path = Path(tmp) / f"rank{rank}.report.json"
            data = orjson.dumps({"collectives": rank_record(rank, args.ranks, args.collectives, args.dp,
                                                            args.diverge).to_record()})
            path.write_bytes(data)
            total_bytes += len(data)
            paths[str(rank)] = str(path)
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHECK_CODE, orjson.dumps(paths).decode()], check=True,
                             capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)}).stdout
        elapsed = time.perf_counter() - started
    result = orjson.loads(out)
    ops = args.ranks * (2 * args.collectives)
    print(f"{args.ranks} ranks x {2 * args.collectives} collectives (+ send/recv): {ops:,} ops, "
          f"sidecar records {total_bytes / 2**20:.1f} MB")
    print(f"check_job: {result['wall']:.2f} s, peak RSS growth {result['rss_growth_kib'] / 1024:.0f} MB "
          f"(process incl. start-up {elapsed:.2f} s); status {result['status']}")
    for message in result["divergences"]:
        print("  " + message)


if __name__ == "__main__":
    main()

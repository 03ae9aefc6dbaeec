#!/usr/bin/env python3
"""Time the cross-rank collective check's pairing by sequence number (``_by_sequence_number``).

Builds a synthetic job per size: ``--ranks`` ranks (default 8) on one process group, each issuing
the same N collectives (a few distinct sizes, numbered 0..N-1) in a locally shuffled order, as
ranks that launch gradient buckets in a slightly different order do. Every rank holds every
number, so the check walks all N numbers (its worst case) and finds no divergence. Prints the
best of ``--repeat`` timings per size.

    python scripts/bench_collectives.py
    python scripts/bench_collectives.py --sizes 500 1000 2000 --repeat 5
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linker.batch.collectives import CommOp, RankCollectives, _by_sequence_number  # noqa: E402

GROUP = "1"
DEFAULT_SIZES = [500, 1_000, 2_000, 10_000, 100_000]


def synthetic_job(collectives: int, ranks: int, seed: int = 0) -> dict[int, RankCollectives]:
    """``ranks`` ranks issuing the same ``collectives`` numbered collectives, each rank's order
    shuffled within windows of 8 (so pairing by position would fail and by number succeeds)."""
    rng = random.Random(seed)
    kinds = [CommOp("ALL_REDUCE", 1 << (10 + k % 12), "float") for k in range(collectives)]
    records = {}
    for rank in range(ranks):
        order = list(range(collectives))
        for start in range(0, collectives, 8):
            window = order[start:start + 8]
            rng.shuffle(window)
            order[start:start + 8] = window
        record = RankCollectives()
        for seq in order:
            record.add(GROUP, kinds[seq], seq)
        records[rank] = record
    return records


def time_check(records: dict[int, RankCollectives], repeat: int) -> tuple[float, str]:
    compared = sorted(records)
    best, matched_by = float("inf"), ""
    for _ in range(repeat):
        sequences = {rank: records[rank].collectives[GROUP] for rank in compared}
        started = time.perf_counter()
        _, matched_by, divergence = _by_sequence_number(GROUP, records, compared, sequences, [])
        best = min(best, time.perf_counter() - started)
        assert divergence is None, divergence
    return best, matched_by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="collectives per rank")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs per size")
    args = parser.parse_args()
    print(f"{'collectives':>12} {'ranks':>6} {'seconds':>10}  matched by")
    for size in args.sizes:
        seconds, matched_by = time_check(synthetic_job(size, args.ranks), args.repeat)
        print(f"{size:>12,} {args.ranks:>6} {seconds:>10.4f}  {matched_by}", flush=True)


if __name__ == "__main__":
    main()

"""Wrong-link rate of order (exact) and structural (approximate) matching when Kineto CPU events
are missing, scored against record-function-id ground truth.

For each pair and seed: drop ``--fraction`` of the Kineto ``cpu_op`` events (tests/tracetools.py
``drop_cpu_events``), strip the record-function ids, link with ``--exact-match`` and with
``--approximate``, and count, over the ET ops whose Kineto event is still present, how many are
linked to their own event (correct), to another one (wrong) or not at all (missing).

    PYTHONPATH=$PWD python scripts/wrong_links.py tests/fixtures/cpu/dataloader_workers \
        --seeds 0-9

Prints one line per (pair, method, seed) and a total per method. Cost: one link per line.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tracetools import RF_ID_KEY, drop_cpu_events, is_cpu_event, load_trace, save_trace, strip_record_function_ids  # noqa: E402

from linker.read.et import read_execution_trace  # noqa: E402
from linker.read.kineto import read_kineto_trace  # noqa: E402
from linker.link.recipe import LinkOptions, link  # noqa: E402


@dataclass
class Score:
    present: int = 0
    correct: int = 0
    wrong: int = 0

    @property
    def missing(self) -> int:
        return self.present - self.correct - self.wrong

    def add(self, other: "Score") -> None:
        self.present += other.present
        self.correct += other.correct
        self.wrong += other.wrong

    def line(self) -> str:
        share = 100.0 * self.wrong / self.present if self.present else 0.0
        return (f"present {self.present:6d}  correct {self.correct:6d}  wrong {self.wrong:4d} ({share:.2f}%)  "
                f"missing {self.missing:4d}")


def score_link(et_path: Path, original: dict, mutated_path: Path, dropped: set, method: str) -> Score:
    """Link the mutated pair with ``method``; score against the original's record-function ids."""
    truth = {(e["tid"], float(e["ts"]), e["name"]): e["args"].get(RF_ID_KEY)
             for e in original["traceEvents"] if is_cpu_event(e)}
    et, kineto = read_execution_trace(et_path), read_kineto_trace(mutated_path)
    result = link(et, kineto, LinkOptions(method=method, force=True))
    score = Score()
    for i in et.op_indices():
        if et.rf_id[i] in dropped:
            continue
        score.present += 1
        e = result.match.event_of_op[i]
        if e < 0:
            continue
        event = kineto.cpu_events[e]
        if truth.get((event.tid, event.ts, event.name)) == et.rf_id[i]:
            score.correct += 1
        else:
            score.wrong += 1
    return score


def drop_any_cpu_events(kineto: dict, fraction: float, seed: int) -> tuple[dict, set]:
    """Like ``drop_cpu_events`` but over cpu_op and user_annotation events alike."""
    events = kineto["traceEvents"]
    positions = [i for i, e in enumerate(events) if is_cpu_event(e)]
    gone = set(random.Random(seed).sample(positions, round(fraction * len(positions))))
    dropped = {events[i]["args"][RF_ID_KEY] for i in gone if RF_ID_KEY in events[i].get("args", {})}
    return dict(kineto, traceEvents=[e for i, e in enumerate(events) if i not in gone]), dropped


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs="+", type=Path, help="directories holding et.json.gz + kineto.json.gz")
    parser.add_argument("--seeds", default="0-4", help="e.g. 0-9 or 1,5,7")
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--methods", default="exact,approximate")
    parser.add_argument("--annotations-too", action="store_true",
                        help="drop user_annotation events as well as cpu_op events")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    totals = {m: Score() for m in methods}
    with tempfile.TemporaryDirectory() as scratch:
        for pair in args.pairs:
            et_path, k_path = pair / "et.json.gz", pair / "kineto.json.gz"
            original = load_trace(k_path)
            for seed in parse_seeds(args.seeds):
                cut, dropped = (drop_any_cpu_events(original, args.fraction, seed) if args.annotations_too
                                else drop_cpu_events(original, args.fraction, seed))
                mutated = Path(scratch) / f"kineto_{seed}.json"
                save_trace(strip_record_function_ids(cut), mutated)
                for method in methods:
                    score = score_link(et_path, original, mutated, dropped, method)
                    totals[method].add(score)
                    print(f"{pair.name:20s} {method:11s} seed {seed:3d}  {score.line()}", flush=True)
    for method, total in totals.items():
        print(f"TOTAL {method:11s} {total.line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

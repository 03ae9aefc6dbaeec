"""Benchmark linker.link.tree_match.match_forests on large synthetic op forests.

Usage: python scripts/bench_tree_match.py [--nodes 300000] [--seed 1] [--max-depth 10] [--case NAME]...

Each case builds an ET forest and a Kineto forest of about --nodes nodes with the seeded generator of
tests/test_tree_match.py (repeated layers, backward and optimizer subtrees; ground-truth id per node),
writes them to a temporary file, and runs match_forests in a fresh Python process, so that the peak
RSS reported (resource.getrusage ru_maxrss) is the one of loading the two forests plus matching, not of
generating them.  Printed per case: wall time of match_forests, RSS after loading the input, peak RSS,
correct / wrong pairs against the ground truth (percent of the Kineto nodes whose ET node exists with
the same label), "consistent" pairs (those sharing the most common id shift: for identical repeated
iterations any whole copy is a right answer) and the matcher's counters.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CASES = ("identical", "deleted5", "steps_deleted5", "extra_iterations", "extra_iterations_unlabelled",
         "inserted_relabelled")


COUNTERS = ("paired_identical", "paired_aligned", "paired_by_order", "item_cells", "ted_cells",
            "dp_cells", "chunked_fallbacks", "ambiguous_unpaired", "gaps_unresolved",
            "inconsistent_dropped", "edit_cost", "kineto_span")


def _generator():
    """The synthetic forest generator kept in tests/test_tree_match.py (one copy, shared)."""
    path = REPO / "tests" / "test_tree_match.py"
    spec = importlib.util.spec_from_file_location("_tree_match_tests", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def _build_case(case: str, nodes: int, seed: int) -> dict:
    """ET/Kineto forests (labels, parent, ground-truth ids) for one case."""
    gen = _generator()
    layers = 48
    per_iteration = len(gen.serialize(gen.synthetic_tree(seed, 1, layers)).ids)
    iterations = max(1, nodes // per_iteration)
    if case == "identical":
        tree = gen.synthetic_tree(seed, iterations, layers)
        et, kineto = gen.serialize(tree), gen.serialize(tree)
    elif case == "deleted5":
        tree = gen.synthetic_tree(seed, iterations, layers)
        et = gen.serialize(tree)
        kineto = gen.serialize(tree, deleted=gen.delete_random(tree, 0.05, seed))
    elif case == "steps_deleted5":
        tree = gen.synthetic_tree(seed, iterations, layers, profiler_steps=True)
        et = gen.serialize(tree)
        kineto = gen.serialize(tree, deleted=gen.delete_random(tree, 0.05, seed))
    elif case in ("extra_iterations", "extra_iterations_unlabelled"):
        # Kineto: 3x the iterations, 5% deleted; the ET holds the middle third.  With ProfilerStep#N
        # roots the right third is identifiable; without, any third is as good (see "consistent").
        labelled = case == "extra_iterations"
        tree = gen.synthetic_tree(seed, 3 * iterations, layers, profiler_steps=labelled)
        third = len(tree.roots) // 3
        et_tree = gen.SynthTree(tree.labels, tree.kids, tree.roots[third:2 * third])
        et = gen.serialize(et_tree)
        kineto = gen.serialize(tree, deleted=gen.delete_random(tree, 0.05, seed))
    elif case == "inserted_relabelled":
        import random
        tree = gen.synthetic_tree(seed, iterations, layers)
        et = gen.serialize(tree)
        rng = random.Random(seed)
        n = len(tree.labels)
        internal = [k for k in range(n) if tree.kids[k]]
        relabel = {k: "aten::renamed_op" for k in rng.sample(internal, n // 200)}
        kineto_tree = gen.SynthTree(list(tree.labels), [list(k) for k in tree.kids], list(tree.roots))
        for _ in range(n // 200):
            host = rng.choice(internal)
            extra = kineto_tree.instantiate(("Inserted::annotation", (("aten::empty", ()),)), -1)
            kineto_tree.roots.pop()
            kineto_tree.kids[host].insert(rng.randrange(len(kineto_tree.kids[host]) + 1), extra)
        deleted = gen.delete_random(tree, 0.05, seed + 1)
        kineto = gen.serialize(kineto_tree, deleted=deleted, relabel=relabel, extra_ids=n)
    else:
        raise SystemExit(f"unknown case {case}")
    return {
        "et": {"labels": et.forest.labels, "parent": et.forest.parent, "ids": et.ids},
        "kineto": {"labels": kineto.forest.labels, "parent": kineto.forest.parent, "ids": kineto.ids},
    }


def _rss_mb() -> float:
    """Current resident set size of this process, MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _worker(path: str, max_depth: int) -> None:
    """Load one case and match it; print one JSON line of measurements."""
    from linker.link.tree_match import OrderedForest, match_forests

    with open(path) as f:
        data = json.load(f)
    et = OrderedForest(data["et"]["labels"], data["et"]["parent"])
    kineto = OrderedForest(data["kineto"]["labels"], data["kineto"]["parent"])
    et_ids, kineto_ids = data["et"]["ids"], data["kineto"]["ids"]
    et_label = dict(zip(et_ids, et.labels))
    present = sum(1 for i, name in zip(kineto_ids, kineto.labels)
                  if i >= 0 and et_label.get(i) == name)
    del data, et_label
    rss_input = _rss_mb()
    start = time.perf_counter()
    match = match_forests(et, kineto, max_depth=max_depth)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    correct = sum(1 for x, y in match.pairs if et_ids[x] == kineto_ids[y])
    # "consistent": pairs whose id shift (Kineto id - ET id) is the most common one, i.e. the ET landed
    # on one stretch of identical iterations and paired corresponding nodes within it.
    shifts: dict[int, int] = {}
    for x, y in match.pairs:
        if kineto_ids[y] >= 0:
            shift = kineto_ids[y] - et_ids[x]
            shifts[shift] = shifts.get(shift, 0) + 1
    consistent = max(shifts.values(), default=0)
    print(json.dumps({
        "et_nodes": len(et.labels), "kineto_nodes": len(kineto.labels), "present": present,
        "seconds": round(wall, 2), "rss_input_mb": round(rss_input), "peak_rss_mb": round(peak),
        "pairs": len(match.pairs), "correct": correct, "wrong": len(match.pairs) - correct,
        "consistent": consistent, "counters": {name: getattr(match, name) for name in COUNTERS},
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-depth", type=int, default=10)
    parser.add_argument("--case", action="append", choices=CASES)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.max_depth)
        return
    for case in args.case or CASES:
        data = _build_case(case, args.nodes, args.seed)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(data, f)
            path = f.name
        del data
        try:
            command = [sys.executable, __file__, "--worker", path, "--max-depth", str(args.max_depth)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        finally:
            os.unlink(path)
        r = json.loads(out)
        present = max(1, r["present"])
        print(f"{case:27s} ET {r['et_nodes']:>7} K {r['kineto_nodes']:>7}  "
              f"match {r['seconds']:6.2f} s  "
              f"RSS input {r['rss_input_mb']:4d} MB peak {r['peak_rss_mb']:4d} MB  "
              f"correct {100 * r['correct'] / present:6.2f}%  wrong {r['wrong']} "
              f"({100 * r['wrong'] / present:.3f}%)  consistent {100 * r['consistent'] / present:6.2f}%")
        print(f"{'':27s} " + " ".join(f"{k} {v}" for k, v in r["counters"].items()), flush=True)


if __name__ == "__main__":
    main()

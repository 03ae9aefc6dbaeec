#!/usr/bin/env python3
"""Benchmark ``et-link batch`` against single-pair runs, and measure the per-rank memory model.

Speed (default): link every rank pair of a job (a) with one ``et-link`` process per pair, one after
the other, as a user's shell loop does, and (b) with one ``et-link batch`` run; print both wall
times, the speed-up, and whether the outputs are byte-identical. Best of ``--repeat`` runs each.
Then the same for a ``--copies``-rank job (default 64) made of links to the given ranks' files in
turn, so batch's per-rank overhead (process start, imports, scheduling) shows at scale.

    python scripts/bench_batch.py \\
        --et '../shared/traces/param_dlrm/rank*.et.json.gz' \\
        --kineto '../shared/traces/param_dlrm/rank*.kineto.json.gz'

Memory (``--memory ET KINETO [ET KINETO ...]``): link each pair in a fresh Python process and print
its peak RSS (``ru_maxrss``), the RSS after imports, the uncompressed input bytes and the ratio
(peak - base) / input bytes that ``linker.batch.PEAK_BYTES_PER_INPUT_BYTE`` is based on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linker.batch import expand_glob, pair_rank_files, uncompressed_size  # noqa: E402
sys.path.insert(0, str(ROOT / "scripts"))
from bench import compile_package  # noqa: E402

SHARED = ROOT.parent / "shared"

MEASURE_CODE = r"""
import json, os, resource, sys, time
from linker.pipeline import link_pair
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
base = rss()
t = time.perf_counter()
outcome = link_pair(sys.argv[1], sys.argv[2], sys.argv[3])
print(json.dumps({"seconds": time.perf_counter() - t, "base_rss": base,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "et_ops": outcome.report.et_ops, "method": outcome.report.method}))
"""


def et_link_command() -> list[str]:
    """The installed ``et-link`` script beside this interpreter, else ``python -m linker.cli``."""
    script = Path(sys.executable).with_name("et-link")
    return [str(script)] if script.exists() else [sys.executable, "-m", "linker.cli"]


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(run) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the processes it started and waited for)."""
    cpu, started = children_cpu_seconds(), time.perf_counter()
    run()
    return time.perf_counter() - started, children_cpu_seconds() - cpu


def run_sequential(pairs, out_dir: Path) -> tuple[float, float]:
    """One ``et-link`` process per pair, one after the other."""
    def run():
        for pair in pairs:
            subprocess.run(et_link_command() + ["-q", "--et-file", str(pair.et), "--kineto-file", str(pair.kineto),
                                                "-o", str(out_dir / f"rank{pair.rank}_plus.json")], check=True)
    return timed(run)


def run_batch(et_glob: str, kineto_glob: str, out_dir: Path, workers: int | None,
              rank_pattern: str | None = None) -> tuple[float, float]:
    """One ``et-link batch --redo`` process (exit status 0 required)."""
    command = et_link_command() + ["batch", "--et", et_glob, "--kineto", kineto_glob, "--output-dir", str(out_dir),
                                   "--redo", "-q"]
    if rank_pattern:
        command += ["--rank-pattern", rank_pattern]
    if workers:
        command += ["--workers", str(workers)]
    return timed(lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL))


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


COPY_RANK_PATTERN = r"copy(\d+)\."


def make_copies_job(args: argparse.Namespace, directory: Path) -> argparse.Namespace:
    """A job of ``args.copies`` ranks made of links to the real ranks' files, in turn
    (``copy<N>.et.json.gz`` / ``copy<N>.kineto.json.gz``; ranks taken from those names)."""
    pairing = pair_rank_files(expand_glob(args.et), expand_glob(args.kineto))
    pairs = sorted(pairing.pairs, key=lambda p: p.rank)
    for n in range(args.copies):
        source = pairs[n % len(pairs)]
        (directory / f"copy{n}.et.json.gz").symlink_to(source.et)
        (directory / f"copy{n}.kineto.json.gz").symlink_to(source.kineto)
    return argparse.Namespace(**{**vars(args), "et": str(directory / "copy*.et.json.gz"),
                                 "kineto": str(directory / "copy*.kineto.json.gz"),
                                 "rank_pattern": COPY_RANK_PATTERN})


def speed(args: argparse.Namespace) -> int:
    status = speed_of_job(argparse.Namespace(**{**vars(args), "rank_pattern": None}))
    if args.copies:
        with tempfile.TemporaryDirectory(prefix="bench_batch_copies.") as tmp:
            print(f"\n{args.copies}-rank job made of copies of those ranks (per-rank overhead of batch):")
            status = max(status, speed_of_job(make_copies_job(args, Path(tmp))))
    return status


def speed_of_job(args: argparse.Namespace) -> int:
    pairing = pair_rank_files(expand_glob(args.et), expand_glob(args.kineto), args.rank_pattern)
    if pairing.problems or not pairing.pairs:
        print("cannot pair the files:\n  " + "\n  ".join(pairing.problems or ["no files"]), file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench_batch."))
    try:
        single_dir, batch_dir = work / "single", work / "batch"
        single_dir.mkdir()
        load_before = load_average()
        sequential_runs, batch_runs = [], []
        for _ in range(args.repeat):  # interleaved, so both kinds see the same machine load
            sequential_runs.append(run_sequential(pairing.pairs, single_dir))
            batch_runs.append(run_batch(args.et, args.kineto, batch_dir, args.workers, args.rank_pattern))
        sequential, sequential_cpu = min(sequential_runs)
        batch, batch_cpu = min(batch_runs)
        ratios = sorted(s[0] / b[0] for s, b in zip(sequential_runs, batch_runs))
        identical = all((single_dir / f"rank{p.rank}_plus.json").read_bytes()
                        == (batch_dir / f"rank{p.rank}_plus.json").read_bytes() for p in pairing.pairs)
        summary = json.loads((batch_dir / "summary.json").read_bytes())
        rank_seconds = [r["wall_seconds"] for r in summary["ranks"]]
        print(f"ranks: {len(pairing.pairs)}, CPUs: {os.cpu_count()}, best of {args.repeat} interleaved runs, "
              f"load average before {load_before}, after {load_average()}")
        print(f"single-pair et-link runs, one after the other: {sequential:.2f}s wall, {sequential_cpu:.2f}s CPU "
              f"({sequential / len(pairing.pairs):.2f}s per rank)")
        print(f"et-link batch: {batch:.2f}s wall, {batch_cpu:.2f}s CPU (rank link times "
              f"{min(rank_seconds):.2f}-{max(rank_seconds):.2f}s, sum {sum(rank_seconds):.2f}s)")
        print(f"speed-up (best wall / best wall): {sequential / batch:.2f}x; per interleaved pair of runs: "
              f"min {ratios[0]:.2f}x, median {ratios[len(ratios) // 2]:.2f}x; outputs byte-identical: {identical}")
        return 0 if identical else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def memory(paths: list[str]) -> int:
    if len(paths) % 2:
        print("--memory takes ET KINETO pairs", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="bench_batch_mem.") as work:
        print(f"{'pair':<48} {'input MB':>9} {'base MB':>8} {'peak MB':>8} {'link s':>7} {'(peak-base)/input':>18}")
        for i in range(0, len(paths), 2):
            et, kineto = Path(paths[i]), Path(paths[i + 1])
            input_bytes = uncompressed_size(et) + uncompressed_size(kineto)
            proc = subprocess.run([sys.executable, "-c", MEASURE_CODE, str(et), str(kineto),
                                   str(Path(work) / "out.json")], capture_output=True, text=True, env=env)
            if proc.returncode:
                print(f"{et}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            m = json.loads(proc.stdout)
            ratio = (m["peak_rss"] - m["base_rss"]) / input_bytes
            label = f"{et.parent.name}/{et.name}"[-48:]
            print(f"{label:<48} {input_bytes / 1e6:9.1f} {m['base_rss'] / 2**20:8.0f} {m['peak_rss'] / 2**20:8.0f} "
                  f"{m['seconds']:7.2f} {ratio:18.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--et", default=str(SHARED / "traces/param_dlrm/rank*.et.json.gz"))
    parser.add_argument("--kineto", default=str(SHARED / "traces/param_dlrm/rank*.kineto.json.gz"))
    parser.add_argument("--workers", type=int, default=None, help="et-link batch --workers (default: CPU count)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind; the best is reported")
    parser.add_argument("--copies", type=int, default=64, help="then a job of this many ranks made of copies "
                        "of the given ranks (0: skip)")
    parser.add_argument("--memory", nargs="+", metavar="PATH", help="measure peak memory of these ET KINETO pairs")
    args = parser.parse_args()
    if args.memory:
        return memory(args.memory)
    compile_package()  # as installed: single runs do not compile every module again (bench.py)
    return speed(args)


if __name__ == "__main__":
    sys.exit(main())

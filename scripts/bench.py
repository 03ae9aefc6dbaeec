#!/usr/bin/env python3
"""Benchmark et-link on a large ET + Kineto pair: wall time and peak memory, next to decode-only.

Usage:
    python scripts/bench.py --et ET --kineto K [--methods rf_id,exact,approximate] [--workdir DIR]
    python scripts/bench.py --capture DIR --torch-python /path/to/python-with-torch [--layers 48 --steps 8]

``--capture`` first records a large pair (an ``nn.TransformerEncoder`` training loop) with
``scripts/capture_traces.py`` using a Python that has torch (``pip install torch==2.13.0``).

Every measurement runs in a fresh process; wall time is measured around it and peak RSS comes
from the child's own resource usage (``os.wait4``), so the figures are those a user sees:

- ``decode``: reading both files into et-link's model (``read_execution_trace`` + ``read_kineto_trace``);
- ``et-link <method>``: the whole command, writing the ET+ JSON. For ``exact`` and ``approximate`` the
  Kineto file is a copy with every ``Record function id`` removed, so those methods cannot cheat, and
  their ET+ is compared op by op with the ``rf_id`` run's (the ground truth): ``correct`` is the share
  of ET ops with the same ``ts``/``dur``, ``wrong`` the share linked to a different event.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECODE_ONLY = (
    "import sys\n"
    "from linker.et_reader import read_execution_trace\n"
    "from linker.kineto_reader import read_kineto_trace\n"
    "et = read_execution_trace(sys.argv[1]); k = read_kineto_trace(sys.argv[2])\n"
    "print(len(et), len(k.cpu_events))\n"
)


def measure(cmd: list[str]) -> tuple[float, float, str]:
    """Run ``cmd``; return (wall seconds, peak RSS in MB, stdout+stderr)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    output = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{output}")
    return wall, usage.ru_maxrss / 1024.0, output


def strip_rf_ids(src: Path, dst: Path) -> None:
    """Copy a Kineto trace without its "Record function id" args (textual, streaming-free but fast)."""
    data = gzip.decompress(src.read_bytes()) if src.read_bytes()[:2] == b"\x1f\x8b" else src.read_bytes()
    data = re.sub(rb'"Record function id":\s*-?\d+\s*,\s*', b"", data)
    data = re.sub(rb',\s*"Record function id":\s*-?\d+', b"", data)
    dst.write_bytes(data)


def load_plus(path: Path):
    import orjson

    return orjson.loads(path.read_bytes())["nodes"]


def compare(truth_path: Path, candidate_path: Path) -> tuple[int, int, int]:
    """(ops timed in the truth, same ts/dur in the candidate, different ts/dur in the candidate)."""
    truth = {n["id"]: (n.get("ts"), n.get("dur")) for n in load_plus(truth_path) if "cat" not in n}
    cand = {n["id"]: (n.get("ts"), n.get("dur")) for n in load_plus(candidate_path) if "cat" not in n}
    timed = [i for i, t in truth.items() if t[0] is not None]
    same = sum(1 for i in timed if cand.get(i) == truth[i])
    wrong = sum(1 for i in timed if cand.get(i, (None,))[0] is not None and cand[i] != truth[i])
    return len(timed), same, wrong


def capture(directory: Path, python: str, layers: int, steps: int) -> tuple[Path, Path]:
    cmd = [python, str(ROOT / "scripts" / "capture_traces.py"), "transformer", "--out", str(directory),
           "--layers", str(layers), "--steps", str(steps), "--no-check"]
    print("capturing:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return directory / "et.json.gz", directory / "kineto.json.gz"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--et", type=Path)
    parser.add_argument("--kineto", type=Path)
    parser.add_argument("--capture", type=Path, help="capture a large pair into this directory first")
    parser.add_argument("--torch-python", default=sys.executable, help="a Python with torch, for --capture")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--methods", default="rf_id,exact,approximate")
    parser.add_argument("--workdir", type=Path, help="where outputs go (default: a temporary directory)")
    parser.add_argument("--strip-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.strip_into:
        strip_rf_ids(args.kineto, args.strip_into)
        return 0
    if args.capture:
        args.et, args.kineto = capture(args.capture, args.torch_python, args.layers, args.steps)
    if not (args.et and args.kineto):
        parser.error("give --et and --kineto, or --capture DIR")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="et-link-bench."))
    work.mkdir(parents=True, exist_ok=True)
    et_link = [sys.executable, "-m", "linker.cli"]

    print(f"pair: {args.et} ({args.et.stat().st_size / 1e6:.1f} MB) + {args.kineto} "
          f"({args.kineto.stat().st_size / 1e6:.1f} MB)")
    wall, rss, out = measure([sys.executable, "-c", DECODE_ONLY, str(args.et), str(args.kineto)])
    nodes, events = out.split()[-2:]
    print(f"{'decode only':<24} {wall:8.2f} s {rss:9.0f} MB   ({nodes} ET nodes, {events} Kineto CPU events)")

    stripped = work / "kineto_no_rf_ids.json"
    methods = [m for m in args.methods.split(",") if m]
    if any(m != "rf_id" for m in methods):  # in a child: this process stays small (see below)
        subprocess.run([sys.executable, __file__, "--strip-into", str(stripped), "--kineto", str(args.kineto)],
                       check=True)
    outputs, lines = {}, {}
    for method in methods:
        kineto = args.kineto if method == "rf_id" else stripped
        out_path = work / f"plus_{method}.json"
        wall, rss, text = measure(et_link + ["--et-file", str(args.et), "--kineto-file", str(kineto),
                                             "--match", method, "-o", str(out_path),
                                             "--report", str(work / f"report_{method}.json"), "-q"])
        outputs[method] = out_path
        lines[method] = f"{'et-link ' + method:<24} {wall:8.2f} s {rss:9.0f} MB"
        print(lines[method], flush=True)
    # Compared only after every measurement: a child's peak RSS counts the parent's memory at
    # fork time, so the parent must not hold the parsed outputs while it starts one.
    for method in methods:
        if method != "rf_id" and "rf_id" in outputs:
            timed, same, wrong = compare(outputs["rf_id"], outputs[method])
            print(f"{method:<10} vs rf_id ground truth: correct {100 * same / timed:.3f}%  "
                  f"wrong {100 * wrong / timed:.3f}% of {timed} ops")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

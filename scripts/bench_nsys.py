"""Benchmark reading and linking a large Nsight Systems-schema file (issue 32, point 7).

    python scripts/bench_nsys.py [--kineto K.json.gz] [--rows 10000000] [--file big.sqlite] [--keep]

Builds an nsys-schema SQLite file of about ``--rows`` rows with ``scripts/kineto_to_sqlite.py
--repeat`` from a real Kineto capture (default: ../shared/traces/kineto_only/
recent_tracelens_b200_eager.json.gz when present, else tests/fixtures/gpu/gpu_v111), then runs, each
in a fresh process so that peak memory is its own:

- floor: a bare ``SELECT`` of the same columns the reader needs, every row fetched into Python;
  like the reader and the pipeline, with Python's cyclic collector paused;
- read: ``read_timing_trace`` (SQL joins and filters; rows come in file order, checked per thread
  and sorted only where out of order; one struct per row kept, two per range with op_id or seq);
- read + link: the same plus ``link_kineto_only`` (host graph from the ranges, GPU attribution).

Prints wall seconds, the ratio to the floor and peak RSS (``ru_maxrss``) of each. The default
capture has no record-function ids (ranges ``name, sizes = …``); ``--kineto ../shared/traces/
kineto_only/multistream_hta_a100_nccl_rank0.json.gz`` gives ranges with ``op_id`` (and ``seq``) as
PyTorch >= 2022 writes them, whose text takes more to cut.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KINETO = [ROOT.parent / "shared" / "traces" / "kineto_only" / "recent_tracelens_b200_eager.json.gz",
                  ROOT / "tests" / "fixtures" / "gpu" / "gpu_v111" / "kineto.json.gz"]

FLOOR_QUERIES = [
    'SELECT start, "end", text, textId, globalTid, domainId FROM NVTX_EVENTS WHERE eventType = 59',
    'SELECT start, "end", eventClass, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME',
    'SELECT start, "end", deviceId, streamId, correlationId, globalPid, demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL',
    'SELECT start, "end", deviceId, streamId, correlationId, globalPid, copyKind, srcKind, dstKind '
    'FROM CUPTI_ACTIVITY_KIND_MEMCPY',
    'SELECT start, "end", deviceId, streamId, correlationId, globalPid, memKind FROM CUPTI_ACTIVITY_KIND_MEMSET',
]


def _converter():
    spec = importlib.util.spec_from_file_location("kineto_to_sqlite", ROOT / "scripts" / "kineto_to_sqlite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(kineto: Path, out: Path, rows: int) -> int:
    converter = _converter()
    cpu, runtime, gpu, *_ = converter._events(kineto)
    per_copy = len(cpu) + len(runtime) + len(gpu)
    repeat = max(1, math.ceil(rows / per_copy))
    converter.write_nsys(kineto, out, repeat=repeat)
    return repeat * per_copy


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_floor(path: str) -> dict:
    gc.disable()  # as et-link reads (``collector_paused``): tuples are tracked objects too
    started = time.perf_counter()
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    count = 0
    for query in FLOOR_QUERIES:
        rows = conn.execute(query).fetchall()
        count += len(rows)
        del rows
    return {"seconds": time.perf_counter() - started, "rows": count, "peak_mb": _peak_mb()}


def run_read(path: str, link: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    from linker.read.timing import read_timing_trace

    gc.disable()  # the pipeline links with the collector paused (``link_pair``)
    started = time.perf_counter()
    trace = read_timing_trace(path)
    read = time.perf_counter() - started
    result = {"read_seconds": read, "cpu": len(trace.cpu_events), "runtime": len(trace.runtime_events),
              "gpu": len(trace.gpu_events)}
    if link:
        from linker.link.kineto_only import link_kineto_only

        linked = link_kineto_only(trace)
        result["gpu_attached"] = linked.gpu.attributed
    result["seconds"] = time.perf_counter() - started
    result["peak_mb"] = _peak_mb()
    return result


def _child(mode: str, path: Path) -> dict:
    run = subprocess.run([sys.executable, __file__, "--child", mode, "--file", str(path)], capture_output=True,
                         text=True, check=True)
    return json.loads(run.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kineto", type=Path)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--file", type=Path, default=Path(tempfile.gettempdir()) / "et_link_bench_nsys.sqlite")
    parser.add_argument("--keep", action="store_true", help="reuse --file if it exists; keep it afterwards")
    parser.add_argument("--child", choices=["floor", "read", "link"])
    args = parser.parse_args(argv)
    if args.child:
        result = run_floor(str(args.file)) if args.child == "floor" else run_read(str(args.file), args.child == "link")
        print(json.dumps(result))
        return 0
    kineto = args.kineto or next(p for p in DEFAULT_KINETO if p.exists())
    if not (args.keep and args.file.exists()):
        started = time.perf_counter()
        rows = build(kineto, args.file, args.rows)
        print(f"built {args.file} from {kineto.name}: {rows:,} rows, {args.file.stat().st_size / 2**20:,.0f} MiB "
              f"in {time.perf_counter() - started:.1f}s")
    floor = _child("floor", args.file)
    print(f"floor  bare SELECT of the read columns: {floor['rows']:,} rows in {floor['seconds']:.2f}s, "
          f"peak {floor['peak_mb']:,.0f} MB")
    for mode in ("read", "link"):
        got = _child(mode, args.file)
        label = "read       " if mode == "read" else "read + link"
        print(f"{label}: {got['seconds']:.2f}s = {got['seconds'] / floor['seconds']:.2f}x the floor "
              f"(read {got['read_seconds']:.2f}s; {got['cpu']:,} CPU ops, {got['runtime']:,} runtime calls, "
              f"{got['gpu']:,} GPU ops), peak {got['peak_mb']:,.0f} MB")
    if not args.keep:
        args.file.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Capture real ET + Kineto pairs of the GPU shapes et-link must get right, with the PyTorch of a
CUDA machine (torch is never a dependency of et-link).

Usage:

    python scripts/capture_gpu.py --out DIR [--shapes all|NAME,...] [--device auto|cuda|cpu]
                                  [--steps 3] [--tar FILE]

Each shape is one small training loop, profiled as Chakra's recipe does it: an
``ExecutionTraceObserver`` handed to ``torch.profiler.profile`` (CPU and CUDA activities) with
``schedule(wait=1, warmup=1, active=STEPS)``, so both files cover the same steps. It writes
``DIR/<shape>/et.json.gz`` and ``kineto.json.gz`` (the job: ``DIR/gloo/host.<rank>.json.gz`` and
``device.<rank>.json.gz``, as ``tests/fixtures/ddp_gloo``), then prints one JSON line a shape:
what it holds (ET nodes, Kineto CPU ops, kernels, copies, syncs, streams) or why it was skipped.

The shapes (issue "Right in detail", item 4):

- ``pageable``: each step copies its batch from pageable host memory (``x.to("cuda")``) right after
  launching the previous work: the copy waits for the stream, then runs its DMA;
- ``pinned``: the same batch from pinned memory, ``non_blocking=True`` (no wait on the host);
- ``streams``: a side stream computes and records an event, the default stream waits for it
  (``wait_event``) and goes on; the step ends with an event synchronize;
- ``graphs``: the whole training step captured once as a CUDA graph (``torch.cuda.graph``) and
  replayed each step;
- ``compile``: the model through ``torch.compile`` (Triton kernels on CUDA, C++ on the CPU);
- ``gloo``: two processes training with ``DistributedDataParallel`` over gloo on CUDA tensors.

``--device cpu`` (or ``auto`` without CUDA) runs every shape that has a CPU form with CPU tensors,
so the script itself is tested on any machine: ``graphs`` needs CUDA and is skipped, ``pinned``
copies without pinning, ``streams`` runs on the one CPU stream. ``--tar FILE`` also packs the
whole output into one uncompressed tar (the files are gzip already): one file to bring back from
a machine that returns few files. A shape that fails is reported and the others still run; the
exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import sys
import tarfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

WAIT_STEPS, WARMUP_STEPS = 1, 1
SHAPES = ("pageable", "pinned", "streams", "graphs", "compile", "gloo")
GLOO_RANKS = 2


@dataclass
class Options:
    out: Path
    device: str  # "cuda" or "cpu", resolved
    steps: int
    width: int
    batch: int
    seed: int


class Skipped(Exception):
    """A shape that has no form on this device (the reason is printed)."""


def _torch() -> Any:
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

    return torch


def _mlp(torch: Any, options: Options) -> Any:
    nn = torch.nn
    layers = []
    for _ in range(4):
        layers += [nn.Linear(options.width, options.width), nn.ReLU()]
    return nn.Sequential(*layers).to(options.device)


def _profiler(torch: Any, options: Options, et_path: Path, kineto_path: Path) -> Any:
    """Chakra's recipe: the ET observer inside the profiler, the Kineto trace written when the
    active steps end. The caller runs ``_total_steps`` steps, ``prof.step()`` after each."""
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if options.device == "cuda" else [])
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    return profile(activities=activities, record_shapes=True,
                   schedule=schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=options.steps, repeat=1),
                   on_trace_ready=lambda prof: prof.export_chrome_trace(str(kineto_path)),
                   execution_trace_observer=observer)


def _total_steps(options: Options) -> int:
    return WAIT_STEPS + WARMUP_STEPS + options.steps


def _train_step(torch: Any, model: Any, optimizer: Any, inputs: Any, targets: Any) -> Any:
    from torch.profiler import record_function

    with record_function("## forward ##"):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
    with record_function("## backward ##"):
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
    with record_function("## optimizer ##"):
        optimizer.step()
    return loss


def _copy_loop(torch: Any, options: Options, et_path: Path, kineto_path: Path, pinned: bool) -> None:
    """Each step: train on the batch already on the device, then copy the next one from the host
    while that work may still run (``pinned``: from pinned memory, ``non_blocking``)."""
    from torch.profiler import record_function

    model = _mlp(torch, options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    host = [torch.randn(options.batch * 16, options.width) for _ in range(2)]  # 16 batches: a long DMA
    if pinned and options.device == "cuda":
        host = [tensor.pin_memory() for tensor in host]
    targets = torch.randn(options.batch * 16, options.width, device=options.device)
    inputs = host[0].to(options.device)
    with _profiler(torch, options, et_path, kineto_path) as prof:
        for step in range(_total_steps(options)):
            _train_step(torch, model, optimizer, inputs, targets)
            with record_function("## copy batch ##"):
                inputs = host[(step + 1) % 2].to(options.device, non_blocking=pinned)
            prof.step()
    _synchronize(torch, options)


def run_pageable(torch: Any, options: Options, et_path: Path, kineto_path: Path) -> None:
    _copy_loop(torch, options, et_path, kineto_path, pinned=False)


def run_pinned(torch: Any, options: Options, et_path: Path, kineto_path: Path) -> None:
    _copy_loop(torch, options, et_path, kineto_path, pinned=True)


def _synchronize(torch: Any, options: Options) -> None:
    if options.device == "cuda":
        torch.cuda.synchronize()


def run_streams(torch: Any, options: Options, et_path: Path, kineto_path: Path) -> None:
    """A side stream computes a feature and records an event; the default stream waits for the
    event, trains on the feature, and the step ends by synchronizing on an event of its own."""
    from torch.profiler import record_function

    cuda = options.device == "cuda"
    model = _mlp(torch, options)
    side_model = _mlp(torch, options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(options.batch, options.width, device=options.device)
    targets = torch.randn(options.batch, options.width, device=options.device)
    side = torch.cuda.Stream() if cuda else None
    with _profiler(torch, options, et_path, kineto_path) as prof:
        for _ in range(_total_steps(options)):
            with record_function("## side stream ##"):
                with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                    with torch.no_grad():
                        feature = side_model(inputs)
                    ready = torch.cuda.Event() if cuda else None
                    if cuda:
                        ready.record(side)
            if cuda:
                torch.cuda.current_stream().wait_event(ready)
            _train_step(torch, model, optimizer, feature, targets)
            if cuda:
                done = torch.cuda.Event()
                done.record()
                done.synchronize()
            prof.step()


def run_graphs(torch: Any, options: Options, et_path: Path, kineto_path: Path) -> None:
    """The training step captured once as a CUDA graph on a side stream, replayed each step."""
    if options.device != "cuda":
        raise Skipped("CUDA graphs need a CUDA device")
    model = _mlp(torch, options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(options.batch, options.width, device="cuda")
    targets = torch.randn(options.batch, options.width, device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # warm-up iterations on a side stream, as the CUDA-graph recipe asks
        for _ in range(3):
            _train_step(torch, model, optimizer, inputs, targets)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        _train_step(torch, model, optimizer, inputs, targets)
    with _profiler(torch, options, et_path, kineto_path) as prof:
        for _ in range(_total_steps(options)):
            inputs.copy_(torch.randn_like(inputs))
            graph.replay()
            prof.step()
    torch.cuda.synchronize()


def run_compile(torch: Any, options: Options, et_path: Path, kineto_path: Path) -> None:
    """The model through ``torch.compile`` (compiled before the profile: its steps are the
    compiled kernels, not the compiler)."""
    model = torch.compile(_mlp(torch, options))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(options.batch, options.width, device=options.device)
    targets = torch.randn(options.batch, options.width, device=options.device)
    try:
        for _ in range(2):
            _train_step(torch, model, optimizer, inputs, targets)
    except Exception as err:  # on the CPU: no C++ toolchain here; on CUDA a failure is a failure
        if options.device == "cuda":
            raise
        raise Skipped(f"torch.compile failed here: {type(err).__name__}: {str(err).splitlines()[0][:200]}") from None
    with _profiler(torch, options, et_path, kineto_path) as prof:
        for _ in range(_total_steps(options)):
            _train_step(torch, model, optimizer, inputs, targets)
            prof.step()
    _synchronize(torch, options)


def _gloo_rank(rank: int, options: Options, job: Path, port: int) -> None:
    """One rank of the gloo job (``torch.multiprocessing.spawn``)."""
    torch = _torch()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=GLOO_RANKS)
    torch.manual_seed(options.seed)
    if options.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    model = DistributedDataParallel(_mlp(torch, options), bucket_cap_mb=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(options.seed + rank)
    inputs = torch.randn(options.batch, options.width, generator=generator).to(options.device)
    targets = torch.randn(options.batch, options.width, generator=generator).to(options.device)
    with _profiler(torch, options, job / f"host.{rank}.json", job / f"device.{rank}.json") as prof:
        for _ in range(_total_steps(options)):
            _train_step(torch, model, optimizer, inputs, targets)
            prof.step()
    _synchronize(torch, options)
    dist.destroy_process_group()


def run_gloo(torch: Any, options: Options, job: Path) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_gloo_rank, args=(options, job, port), nprocs=GLOO_RANKS, join=True)


SINGLE: dict[str, Callable[[Any, Options, Path, Path], None]] = {
    "pageable": run_pageable, "pinned": run_pinned, "streams": run_streams, "graphs": run_graphs,
    "compile": run_compile,
}


def _gzip_in_place(path: Path) -> Path:
    target = path.with_name(path.name + ".gz")
    with open(path, "rb") as source, gzip.open(target, "wb", compresslevel=9) as sink:
        shutil.copyfileobj(source, sink)
    path.unlink()
    return target


def _what_it_holds(et_path: Path, kineto_path: Path) -> dict:
    """Counts a reader checks at a glance: ET nodes, Kineto CPU ops, GPU work by kind, streams."""
    with gzip.open(et_path, "rb") as handle:
        nodes = len(json.load(handle)["nodes"])
    with gzip.open(kineto_path, "rb") as handle:
        events = json.load(handle)["traceEvents"]
    by_cat: dict[str, int] = {}
    streams = set()
    for event in events:
        if event.get("ph") != "X":
            continue
        cat = event.get("cat", "")
        by_cat[cat] = by_cat.get(cat, 0) + 1
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            streams.add((event.get("args", {}).get("device"), event.get("args", {}).get("stream")))
    syncs = sum(1 for event in events if event.get("cat") in ("cuda_runtime", "cuda_driver")
                and "ynchronize" in event.get("name", ""))
    return {"et_nodes": nodes, "cpu_ops": by_cat.get("cpu_op", 0), "kernels": by_cat.get("kernel", 0),
            "copies": by_cat.get("gpu_memcpy", 0), "memsets": by_cat.get("gpu_memset", 0), "syncs": syncs,
            "streams": len(streams), "bytes": et_path.stat().st_size + kineto_path.stat().st_size}


def capture(shape: str, options: Options) -> dict:
    """Run one shape into ``out/<shape>/`` (written beside it, moved into place when whole)."""
    torch = _torch()
    torch.manual_seed(options.seed)
    final = options.out / shape
    staging = options.out / f".{shape}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            if shape == "gloo":
                run_gloo(torch, options, staging)
            else:
                SINGLE[shape](torch, options, staging / "et.json", staging / "kineto.json")
    except Skipped as why:
        shutil.rmtree(staging, ignore_errors=True)
        return {"shape": shape, "skipped": str(why)}
    except Exception as err:  # reported, the other shapes still run
        shutil.rmtree(staging, ignore_errors=True)
        traceback.print_exc(file=sys.stderr)
        return {"shape": shape, "failed": f"{type(err).__name__}: {err}"}
    for path in sorted(staging.iterdir()):
        _gzip_in_place(path)
    if shape == "gloo":
        holds = {f"rank{rank}": _what_it_holds(staging / f"host.{rank}.json.gz", staging / f"device.{rank}.json.gz")
                 for rank in range(GLOO_RANKS)}
    else:
        holds = _what_it_holds(staging / "et.json.gz", staging / "kineto.json.gz")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return {"shape": shape, "dir": str(final), "seconds": round(time.perf_counter() - started, 1),
            "device": options.device, "torch": torch.__version__, **({"ranks": holds} if shape == "gloo" else holds)}


def _device(asked: str) -> str:
    torch = _torch()
    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda" and not torch.cuda.is_available():
        raise SystemExit("capture_gpu: --device cuda, but this torch sees no CUDA device")
    return asked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory (a folder a shape)")
    parser.add_argument("--shapes", default="all", help=f"'all' or a comma-separated list of {', '.join(SHAPES)}")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    parser.add_argument("--width", type=int, default=None,
                        help="the MLP's width (default 4096 on CUDA: a step keeps the stream busy for tens of ms "
                             "and a batch copy moves 64 MB; 256 on the CPU)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tar", type=Path, help="also pack the whole output into this one tar file")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    shapes = SHAPES if args.shapes == "all" else tuple(args.shapes.split(","))
    unknown = [shape for shape in shapes if shape not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s): {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    device = _device(args.device)
    width = args.width or (4096 if device == "cuda" else 256)
    options = Options(out=args.out, device=device, steps=args.steps, width=width, batch=args.batch, seed=args.seed)
    options.out.mkdir(parents=True, exist_ok=True)
    results = []
    for shape in shapes:
        results.append(capture(shape, options))
        print(json.dumps(results[-1]), flush=True)
    if args.tar is not None:
        with tarfile.open(args.tar, "w") as tar:
            for shape in shapes:
                if (options.out / shape).is_dir():
                    tar.add(options.out / shape, arcname=shape)
    return 1 if any("failed" in result for result in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

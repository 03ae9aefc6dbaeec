#!/usr/bin/env python3
"""Capture a DDP-over-gloo job with Chakra's collection recipe: one ET + Kineto pair per rank.

Usage (with a venv holding the CPU torch wheel; torch is never a dependency of et-link):

    python scripts/capture_ddp.py --out DIR [--ranks 4] [--layers 4] [--width 256] [--bucket-mb 0.6]
                                  [--model mlp|conv|fsdp|pipeline|collectives|tp|funcol] [--intra-op-threads 1]
                                  [--warmup 5] [--active 5]
                                  [--checkpoint] [--zero]

Runs ``torchrun --nproc_per_node=RANKS`` on this file; every rank trains a small MLP wrapped in
``DistributedDataParallel`` over gloo, profiled with Chakra's recipe: an ``ExecutionTraceObserver``
handed to ``torch.profiler.profile(..., execution_trace_observer=...)`` with
``schedule(wait=0, warmup=5, active=5)`` (``--warmup``, ``--active``), so both files cover the
same 5 active steps. Each rank writes ``host.<rank>.json`` (the ET) and ``device.<rank>.json``
(the Kineto trace), plain JSON. ``bucket_cap_mb`` is chosen so that the gradients fall into two
all-reduce buckets per step (the summary line counts them per rank from the Kineto trace).

``--model conv`` trains a small convolutional net with BatchNorm instead (two Conv2d+BatchNorm2d+ReLU
blocks, a pooled two-layer head, cross-entropy, AdamW, ``bucket_cap_mb=0.25``): DDP then also
broadcasts the BatchNorm buffers from rank 0 before every forward (``gloo:broadcast``).
``--model fsdp`` shards the MLP with FSDP2 instead of DDP (``fully_shard`` on every ``Linear``, then
on the whole): gloo then runs an ``all_gather`` of each layer's parameters before its forward and
backward, and a reduce-scatter (an ``all_reduce`` in gloo) of its gradients; the ``all_gather``'s
worker flattens the input and copies each rank's part out inside the collective's record.
``--zero`` wraps the MLP's SGD in ``ZeroRedundancyOptimizer``: each rank steps its shard of the
parameters and broadcasts it to the others (``async_op`` broadcasts, waited for at the end of the
step, inside ``Optimizer.step#ZeroRedundancyOptimizer.step``).
``--model pipeline`` splits the MLP's layers into one stage per rank, no DDP: each step the
activations go down the stages and the gradients back up with blocking ``dist.send`` /
``dist.recv`` (gloo records ``gloo:send`` / ``gloo:recv`` from the call to the end of its wait).
``--model collectives`` trains nothing: each step calls ``all_gather_object``, ``reduce``, ``gather``,
``scatter`` and an ``async_op`` ``all_reduce`` (waited for after a matmul) on ``--batch`` x
``--width`` tensors.
``--model tp`` splits each of ``--layers`` MLP blocks (Linear(width, 4 width), ReLU, Linear(4 width,
width)) over the ranks with tensor parallelism (DTensor: ``ColwiseParallel`` up, ``RowwiseParallel``
down, on a CPU device mesh), no DDP: PyTorch's functional collectives then issue an ``all_reduce``
of each block's output in forward and, in backward, of each block's input gradient but the first's
(the input needs none), and the main thread waits for each in ``_c10d_functional::wait_tensor``.
``--model funcol`` trains nothing: each step calls PyTorch's functional collectives directly, an
``all_reduce`` of a matmul and, after more matmuls, an ``all_gather_into_tensor`` of their result,
each waited for (``wait_tensor``) where its result is first used: gloo runs the two at once on its
two worker threads, and the all-gather's worker copies each rank's part out inside its record.
``--intra-op-threads`` above 1 lets the ops run OpenMP threads beside the gloo workers.
``--checkpoint`` recomputes the MLP's layers but the last in backward (``torch.utils.checkpoint``,
non-reentrant): the ET then lacks some of the recomputed ops that Kineto holds (``aten::relu``, or
``aten::linear`` and ``aten::addmm``), and hangs their children under the backward op.

The job is written into a temporary directory beside DIR and moved into place only when every
rank's files exist, so a reader never sees half a job. Prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path


def _rank_main(args: argparse.Namespace) -> None:
    """One rank's body (run by torchrun): DDP over gloo under Chakra's profiler recipe."""
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.intra_op_threads)
    generator = torch.Generator().manual_seed(args.seed + rank)
    if args.model == "conv":
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(512, 256), torch.nn.GELU(),
            torch.nn.Linear(256, 10))
        model = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        inputs = torch.randn(args.batch, 3, 24, 24, generator=generator)
        targets = torch.randint(0, 10, (args.batch,), generator=generator)
        loss_of = torch.nn.functional.cross_entropy
    elif args.model in ("pipeline", "collectives", "tp", "funcol"):
        body = {"pipeline": _pipeline, "collectives": _collectives, "tp": _tensor_parallel,
                "funcol": _functional_collectives}[args.model]
        body(args, rank, dist.get_world_size(), generator)
        dist.destroy_process_group()
        return
    else:
        layers = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers)
        if args.checkpoint:
            net = _checkpointed(net)
        model = _sharded(net) if args.model == "fsdp" else DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
        optimizer = _optimizer(model, args.zero)
        inputs = torch.randn(args.batch, args.width, generator=generator)
        targets = torch.randn(args.batch, args.width, generator=generator)
        loss_of = torch.nn.functional.mse_loss

    def step() -> None:
        optimizer.zero_grad()
        loss = loss_of(model(inputs), targets)
        loss.backward()
        optimizer.step()

    _profiled(args, rank, step)
    dist.destroy_process_group()


def _profiled(args: argparse.Namespace, rank: int, step) -> None:
    """Run ``step`` ``--warmup`` + ``--active`` times under Chakra's recipe (an
    ``ExecutionTraceObserver`` handed to ``torch.profiler.profile``, ``schedule(wait=0, warmup,
    active)``), writing ``host.<rank>.json`` and ``device.<rank>.json`` into ``--out``."""
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    out = Path(args.out)
    observer = ExecutionTraceObserver()
    observer.register_callback(str(out / f"host.{rank}.json"))

    def trace_ready(prof) -> None:
        prof.export_chrome_trace(str(out / f"device.{rank}.json"))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=args.warmup, active=args.active),
                 on_trace_ready=trace_ready, execution_trace_observer=observer) as prof:
        for _ in range(args.warmup + args.active):
            step()
            prof.step()
    observer.unregister_callback()


def _pipeline(args: argparse.Namespace, rank: int, ranks: int, generator) -> None:
    """``--model pipeline``: the MLP's layers split into one stage per rank; each step the first
    stage's activations go down the stages and the gradients back up with blocking
    ``dist.send`` / ``dist.recv`` (gloo: ``c10d::send`` / ``c10d::recv_``, then ``work.wait()``),
    each stage stepping its own SGD; profiled with the same recipe."""
    import torch
    import torch.distributed as dist

    layers = []
    for _ in range(max(1, args.layers // ranks)):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    stage = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    inputs = torch.randn(args.batch, args.width, generator=generator)

    def step() -> None:
        optimizer.zero_grad()
        if rank == 0:
            x = inputs
        else:
            x = torch.empty(args.batch, args.width)
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
        y = stage(x)
        if rank == ranks - 1:
            y.pow(2).mean().backward()
        else:
            dist.send(y.detach(), rank + 1)
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
            y.backward(grad)
        if rank > 0:
            dist.send(x.grad, rank - 1)
        optimizer.step()

    _profiled(args, rank, step)


def _collectives(args: argparse.Namespace, rank: int, ranks: int, generator) -> None:
    """``--model collectives``: no model, a step of the collectives a training script calls
    besides DDP's, each on a ``--batch`` x ``--width`` float32 tensor after a matmul: an
    ``all_gather_object`` (gloo: an ``all_gather`` of the sizes, then one of the pickled bytes), a
    ``reduce`` and a ``gather`` to rank 0, a ``scatter`` from it, and an ``all_reduce`` issued with
    ``async_op`` and waited for after another matmul; profiled with the same recipe."""
    import torch
    import torch.distributed as dist

    a = torch.randn(args.batch, args.width, generator=generator)
    w = torch.randn(args.width, args.width, generator=generator)

    def step() -> None:
        b = a.mm(w)
        gathered = [None] * ranks
        dist.all_gather_object(gathered, {"rank": rank, "loss": float(b.sum())})
        dist.reduce(b, dst=0)
        dist.gather(b, [torch.empty_like(b) for _ in range(ranks)] if rank == 0 else None, dst=0)
        part = torch.empty_like(b)
        dist.scatter(part, [b.clone() for _ in range(ranks)] if rank == 0 else None, src=0)
        c = part.mm(w)
        work = dist.all_reduce(c, async_op=True)
        d = a.mm(w)
        work.wait()
        (c + d).sum()

    _profiled(args, rank, step)


def _tensor_parallel(args: argparse.Namespace, rank: int, ranks: int, generator) -> None:
    """``--model tp``: ``--layers`` MLP blocks, each split over the ranks (DTensor's
    ``ColwiseParallel`` for the up projection, ``RowwiseParallel`` for the down one), SGD, the same
    input on every rank (seeded by ``--seed`` alone); profiled with the same recipe."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (ranks,))
    blocks = []
    for _ in range(args.layers):
        block = torch.nn.ModuleDict({"up": torch.nn.Linear(args.width, 4 * args.width),
                                     "down": torch.nn.Linear(4 * args.width, args.width)})
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        blocks.append(block)
    optimizer = torch.optim.SGD([p for block in blocks for p in block.parameters()], lr=0.01)
    inputs = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(args.seed))

    def step() -> None:
        optimizer.zero_grad()
        x = inputs
        for block in blocks:
            x = block["down"](torch.relu(block["up"](x)))
        x.pow(2).mean().backward()
        optimizer.step()

    _profiled(args, rank, step)


def _functional_collectives(args: argparse.Namespace, rank: int, ranks: int, generator) -> None:
    """``--model funcol``: no model; a step of functional collectives on ``--batch`` x ``--width``
    float32 tensors: ``all_reduce`` of a matmul, two more matmuls, ``all_gather_into_tensor`` of
    their result, then a sum that uses both results (each waited for there); profiled with the
    same recipe."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    a = torch.randn(args.batch, args.width, generator=generator)
    w = torch.randn(args.width, args.width, generator=generator)

    def step() -> None:
        reduced = funcol.all_reduce(a.mm(w), "sum", dist.group.WORLD)
        c = a.mm(w).relu().mm(w)
        gathered = funcol.all_gather_tensor(c, 0, dist.group.WORLD)
        float((reduced + c).sum() + gathered.sum())

    _profiled(args, rank, step)


def _optimizer(model, zero: bool):
    """SGD over ``model``'s parameters, sharded over the ranks by ``ZeroRedundancyOptimizer`` with
    ``zero``."""
    import torch

    if not zero:
        return torch.optim.SGD(model.parameters(), lr=0.01)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)


def _sharded(net):
    """``net`` sharded over the ranks with FSDP2: ``fully_shard`` on each ``Linear``, then on the
    whole (the parameters are gathered layer by layer)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(net)


def _checkpointed(net):
    """``net`` with every layer but the last recomputed in backward (``torch.utils.checkpoint``,
    ``use_reentrant=False``): the forward runs again inside the backward of the last layer."""
    import torch
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.body, self.head = inner[:-2], inner[-2:]

        def forward(self, x):
            return self.head(checkpoint(self.body, x, use_reentrant=False))

    return Checkpointed(net)


def _collectives_per_rank(job: Path, ranks: int) -> dict[str, int]:
    """Kineto ``gloo:all_reduce`` events per rank (two buckets x five steps expected with the
    defaults; with ``--model fsdp``, one reduce-scatter per layer and step)."""
    counts = {}
    for rank in range(ranks):
        events = json.loads((job / f"device.{rank}.json").read_bytes())["traceEvents"]
        counts[str(rank)] = sum(1 for e in events if e.get("name") == "gloo:all_reduce")
    return counts


def _launch(args: argparse.Namespace) -> dict:
    """Run torchrun into a temporary directory beside ``--out``, then move it into place."""
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
               __file__, "--rank-body", "--out", str(staging), "--layers", str(args.layers),
               "--width", str(args.width), "--batch", str(args.batch), "--bucket-mb", str(args.bucket_mb),
               "--seed", str(args.seed), "--model", args.model, "--intra-op-threads", str(args.intra_op_threads),
               "--warmup", str(args.warmup), "--active", str(args.active)]
    command += ["--checkpoint"] if args.checkpoint else []
    command += ["--zero"] if args.zero else []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.intra_op_threads))
    completed = subprocess.run(command, env=env, stdout=sys.stderr)
    expected = [staging / f"{kind}.{rank}.json" for rank in range(args.ranks) for kind in ("host", "device")]
    if completed.returncode != 0 or not all(path.exists() for path in expected):
        shutil.rmtree(staging, ignore_errors=True)
        raise SystemExit(f"capture_ddp: torchrun failed (exit {completed.returncode})")
    if out.exists():
        shutil.rmtree(out)
    staging.chmod(0o755)
    staging.rename(out)
    return {"out": str(out), "ranks": args.ranks, "files": sorted(p.name for p in out.iterdir()),
            "bytes": sum(p.stat().st_size for p in out.iterdir()),
            "gloo_all_reduce_per_rank": _collectives_per_rank(out, args.ranks)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="job directory (host.<rank>.json / device.<rank>.json)")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4, help="Linear+ReLU pairs")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="DDP bucket_cap_mb (default: 0.6 for mlp, 0.25 for conv)")
    parser.add_argument("--model", choices=("mlp", "conv", "fsdp", "pipeline", "collectives", "tp", "funcol"),
                        default="mlp")
    parser.add_argument("--intra-op-threads", type=int, default=1, help="torch.set_num_threads and OMP_NUM_THREADS")
    parser.add_argument("--warmup", type=int, default=5, help="profiler warm-up steps")
    parser.add_argument("--active", type=int, default=5, help="profiled steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true",
                        help="mlp: recompute all but the last layer in backward (torch.utils.checkpoint)")
    parser.add_argument("--zero", action="store_true",
                        help="shard the SGD optimizer with ZeroRedundancyOptimizer (broadcasts after each step)")
    parser.add_argument("--rank-body", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.bucket_mb is None:
        args.bucket_mb = 0.25 if args.model == "conv" else 0.6
    if args.rank_body:
        _rank_main(args)
        return 0
    print(json.dumps(_launch(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

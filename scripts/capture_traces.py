#!/usr/bin/env python3
"""Capture a real PyTorch Execution Trace + Kineto trace pair of one small CPU workload.

Usage (run with a Python that has torch installed; torch is never a dependency of et-link itself):

    python scripts/capture_traces.py WORKLOAD --out DIR [--steps N] [options]

Writes ``DIR/et.json.gz`` (``torch.profiler.ExecutionTraceObserver``) and ``DIR/kineto.json.gz``
(``torch.profiler.profile(...).export_chrome_trace``) of the same run, then prints one JSON line
summarising the pair (node/event counts, sizes, seconds, whether the two windows agree).

Window alignment: the ET observer is handed to the profiler (``execution_trace_observer=``), so the
profiler starts and stops it in ``start_trace`` / ``stop_trace``: the ET covers exactly the profiler's
active window (for scheduled workloads, the ``active`` steps; ``ProfilerStep#N`` appears in both files).
The summary's ``window`` block checks this after the fact by comparing record-function ids.

Workloads: mlp_steps, threads, main_thread_only, dataloader, transformer, autograd_threads,
et_beyond_trace (the ET observer run by hand over more steps than the profiler; see ``WORKLOADS``).
A multi-rank DDP-over-gloo job with Chakra's recipe (``torchrun``, ``host.<rank>.json`` /
``device.<rank>.json``): ``scripts/capture_ddp.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

WAIT_STEPS = 1
WARMUP_STEPS = 1
ET_ROOT_NAMES = ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]")


@dataclass
class CaptureOptions:
    """Command-line options shared by all workloads."""

    workload: str
    out_dir: Path
    steps: int = 3
    layers: int = 2
    d_model: int = 64
    batch: int = 8
    seq_len: int = 16
    workers: int = 3
    seed: int = 0
    check: bool = True


@dataclass
class WindowCheck:
    """How well the ET and Kineto windows agree, by record-function id.

    ``et_ops``: ET nodes other than the process/thread roots; ``kineto_ops``: Kineto cpu_op +
    user_annotation events; ``*_matched``: how many of them have a partner with the same rf_id.
    ``et_tids`` / ``kineto_tids``: thread counts on each side.
    """

    et_ops: int
    et_matched: int
    kineto_ops: int
    kineto_matched: int
    et_tids: int
    kineto_tids: int
    same_pid: bool
    notes: list[str] = field(default_factory=list)


@dataclass
class CaptureSummary:
    """What one capture produced (printed as JSON)."""

    workload: str
    et_path: str
    kineto_path: str
    et_nodes: int
    kineto_events: int
    et_bytes: int
    kineto_bytes: int
    capture_seconds: float
    torch_version: str
    window: WindowCheck | None


# --------------------------------------------------------------------------- workloads


def _import_torch() -> Any:
    """Import torch lazily (the script must be importable without torch), silencing numpy noise."""
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")
    import torch

    return torch


def _mlp(torch: Any, d_in: int = 32, hidden: int = 64, d_out: int = 8) -> Any:
    """Small 3-layer MLP used by several workloads."""
    nn = torch.nn
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


def _train_step(torch: Any, model: Any, optimizer: Any, inputs: Any, targets: Any) -> None:
    """One training step with record_function annotations around the three phases."""
    from torch.profiler import record_function

    with record_function("## forward ##"):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
    with record_function("## backward ##"):
        optimizer.zero_grad()
        loss.backward()
    with record_function("## optimizer ##"):
        optimizer.step()


def _scheduled_profiler(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> Any:
    """Profiler with schedule wait=1, warmup=1, active=steps, repeat=1; the ET observer follows it.

    The caller must run ``WAIT_STEPS + WARMUP_STEPS + options.steps`` iterations, calling
    ``prof.step()`` after each; the Kineto file is exported when the active window closes.
    """
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    observer = ExecutionTraceObserver().register_callback(str(et_path))
    return profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=options.steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(kineto_path)),
        record_shapes=True,
        execution_trace_observer=observer,
    )


def run_mlp_steps(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """MLP training, ``steps`` profiled iterations (ProfilerStep#N in both files)."""
    model = _mlp(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(options.batch, 32), torch.randn(options.batch, 8)
    with _scheduled_profiler(torch, options, et_path, kineto_path) as prof:
        for _ in range(WAIT_STEPS + WARMUP_STEPS + options.steps):
            _train_step(torch, model, optimizer, inputs, targets)
            prof.step()


def run_dataloader(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """DataLoader (num_workers=0, seeded shuffle) feeding an MLP; one batch per profiled step."""
    from torch.utils.data import DataLoader, TensorDataset

    total_steps = WAIT_STEPS + WARMUP_STEPS + options.steps
    dataset = TensorDataset(torch.randn(total_steps * options.batch, 32), torch.randn(total_steps * options.batch, 8))
    loader = DataLoader(dataset, batch_size=options.batch, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(options.seed))
    model = _mlp(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with _scheduled_profiler(torch, options, et_path, kineto_path) as prof:
        for inputs, targets in loader:
            _train_step(torch, model, optimizer, inputs, targets)
            prof.step()


class AnnotatedSamples:
    """Map-style dataset whose ``__getitem__`` does a little tensor work inside a ``record_function``
    (in the main process when ``num_workers=0``: many small same-name blocks per step)."""

    def __init__(self, count: int, seed: int):
        self.count = count
        self.seed = seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        import torch
        from torch.profiler import record_function

        with record_function("## load_sample ##"):
            generator = torch.Generator().manual_seed(self.seed * 100003 + index)
            features = torch.randn(32, generator=generator)
            if index % 3 == 0:
                features = features.flip(0)
            features = features * 0.5 + 0.1
            target = torch.randn(8, generator=generator).tanh()
        return features, target


def run_dataloader_workers(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """DataLoader over ``AnnotatedSamples`` with ``workers`` loader processes (0: samples are loaded
    in the main process, inside the profile), main loop annotated with ``record_function`` (data
    fetch, host preprocessing, the three training phases).

    The many small same-name blocks (``## load_sample ##``, ``aten::randn``, ...) are the hard case
    for order alignment when Kineto events are missing.
    """
    from torch.profiler import record_function
    from torch.utils.data import DataLoader

    total_steps = WAIT_STEPS + WARMUP_STEPS + options.steps
    dataset = AnnotatedSamples(total_steps * options.batch, options.seed)
    loader = DataLoader(dataset, batch_size=options.batch, shuffle=True, num_workers=options.workers,
                        generator=torch.Generator().manual_seed(options.seed))
    model = _mlp(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with _scheduled_profiler(torch, options, et_path, kineto_path) as prof:
        batches = iter(loader)
        for _ in range(total_steps):
            with record_function("## data ##"):
                inputs, targets = next(batches)
            with record_function("## preprocess ##"):
                inputs = (inputs - inputs.mean(dim=0)) / (inputs.std(dim=0) + 1e-5)
                for column in range(4):
                    inputs[:, column].clamp_(-3.0, 3.0)
                targets = targets.clone()
            _train_step(torch, model, optimizer, inputs, targets)
            prof.step()


def _thread_worker(torch: Any, index: int, iterations: int) -> None:
    """Worker body: a few MLP forward/backward passes (index 0..1) or plain tensor math (others)."""
    from torch.profiler import record_function

    with record_function(f"## worker{index} ##"):
        if index < 2:
            model = _mlp(torch)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            inputs, targets = torch.randn(4, 32), torch.randn(4, 8)
            for _ in range(iterations):
                _train_step(torch, model, optimizer, inputs, targets)
        else:
            values = torch.randn(16, 16)
            for _ in range(iterations * 2):
                values = torch.tanh(values @ values.t()) + 1.0


def _run_threads(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path, all_threads: bool) -> None:
    """Main thread + ``workers`` worker threads inside one profiler window (no schedule).

    ``all_threads`` selects ``_ExperimentalConfig(profile_all_threads=True)``; without it Kineto
    records only the main thread while the ET still records every thread.
    """
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, _ExperimentalConfig, profile, record_function

    observer = ExecutionTraceObserver().register_callback(str(et_path))
    config = _ExperimentalConfig(profile_all_threads=all_threads)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, experimental_config=config,
                 execution_trace_observer=observer) as prof:
        workers = [threading.Thread(target=_thread_worker, args=(torch, i, options.steps))
                   for i in range(options.workers)]
        with record_function("## main:start_workers ##"):
            for worker in workers:
                worker.start()
        accumulator = torch.zeros(8, 8)
        for _ in range(options.steps):
            accumulator.add_(torch.ones(8, 8)).mul_(0.5)
        with record_function("## main:join_workers ##"):
            for worker in workers:
                worker.join()
    prof.export_chrome_trace(str(kineto_path))


def run_threads(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """Threads workload, Kineto records all threads."""
    _run_threads(torch, options, et_path, kineto_path, all_threads=True)


def run_main_thread_only(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """Threads workload, Kineto records only the main thread (the ET has all of them)."""
    _run_threads(torch, options, et_path, kineto_path, all_threads=False)


def run_autograd_threads(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """Main thread + a DataLoader producer thread + ``workers`` trainer threads (autograd runs on
    each trainer thread), all recorded (profile_all_threads). The main thread starts the threads,
    does its own tensor work while batches flow through a queue, then joins them.

    The DataLoader (num_workers=0) runs on the producer thread: each batch is collated there and
    put on a queue; trainer threads take batches and run forward + backward + SGD steps.
    """
    import queue

    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, _ExperimentalConfig, profile, record_function
    from torch.utils.data import DataLoader, TensorDataset

    trainers = max(1, options.workers - 1)
    batches = options.steps * trainers
    dataset = TensorDataset(torch.randn(batches * options.batch, 32), torch.randn(batches * options.batch, 8))
    loader = DataLoader(dataset, batch_size=options.batch, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(options.seed))
    work: queue.Queue = queue.Queue(maxsize=2)

    def produce() -> None:
        with record_function("## loader ##"):
            for batch in loader:
                work.put(batch)
        for _ in range(trainers):
            work.put(None)

    def train(index: int) -> None:
        model = _mlp(torch)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        with record_function(f"## trainer{index} ##"):
            while (batch := work.get()) is not None:
                _train_step(torch, model, optimizer, *batch)

    observer = ExecutionTraceObserver().register_callback(str(et_path))
    config = _ExperimentalConfig(profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, experimental_config=config,
                 execution_trace_observer=observer) as prof:
        threads = [threading.Thread(target=produce)] + [threading.Thread(target=train, args=(i,))
                                                        for i in range(trainers)]
        with record_function("## main:start_threads ##"):
            for thread in threads:
                thread.start()
        accumulator = torch.zeros(8, 8)
        for _ in range(options.steps):
            accumulator.add_(torch.ones(8, 8)).mul_(0.5)
        with record_function("## main:join_threads ##"):
            for thread in threads:
                thread.join()
    prof.export_chrome_trace(str(kineto_path))


def run_transformer(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """``nn.TransformerEncoder`` (``layers`` layers, Adam) training loop, ``steps`` profiled iterations.

    Roughly 800 ET nodes per layer and step (48 layers x 8 steps: see the report for the figure).
    """
    nn = torch.nn
    layer = nn.TransformerEncoderLayer(d_model=options.d_model, nhead=4, dim_feedforward=2 * options.d_model,
                                       dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=options.layers, enable_nested_tensor=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, foreach=False)
    inputs = torch.randn(options.batch, options.seq_len, options.d_model)
    targets = torch.randn(options.batch, options.seq_len, options.d_model)
    with _scheduled_profiler(torch, options, et_path, kineto_path) as prof:
        for _ in range(WAIT_STEPS + WARMUP_STEPS + options.steps):
            _train_step(torch, model, optimizer, inputs, targets)
            prof.step()


def run_et_beyond_trace(torch: Any, options: CaptureOptions, et_path: Path, kineto_path: Path) -> None:
    """MLP training where the ET observer runs by hand over more steps than the profiler (the
    recipe of older tools: ``observer.start()`` before the loop, the profiler around some steps):
    each step a ``record_function("ProfilerStep#N")``; the ET covers steps 1 to ``steps`` + 2,
    the profiler steps 2 to ``steps`` + 1, so both files hold the middle ones and the ET one step
    more on each side."""
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

    model = _mlp(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(options.batch, 32), torch.randn(options.batch, 8)
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    last = options.steps + 2
    for step in range(last + 2):
        if step == 1:
            observer.start()
        if step == 2:
            prof.start()
        with record_function(f"ProfilerStep#{step}"):
            _train_step(torch, model, optimizer, inputs, targets)
        if step == last - 1:
            prof.stop()
        if step == last:
            observer.stop()
    observer.unregister_callback()
    prof.export_chrome_trace(str(kineto_path))


WORKLOADS: dict[str, Callable[[Any, CaptureOptions, Path, Path], None]] = {
    "mlp_steps": run_mlp_steps,
    "threads": run_threads,
    "main_thread_only": run_main_thread_only,
    "dataloader": run_dataloader,
    "dataloader_workers": run_dataloader_workers,
    "transformer": run_transformer,
    "autograd_threads": run_autograd_threads,
    "et_beyond_trace": run_et_beyond_trace,
}


# --------------------------------------------------------------------------- checking


def _load_gz_json(path: Path) -> dict:
    with gzip.open(path, "rb") as handle:
        return json.load(handle)


def _et_attr(node: dict, name: str) -> Any:
    """One metadata value of an ET node in either layout (flat key or ``attrs`` list). O(attrs)."""
    if name in node:
        return node[name]
    for attr in node.get("attrs", ()):
        if attr["name"] == name:
            return attr["value"]
    return None


def check_window(et: dict, kineto: dict) -> WindowCheck:
    """Compare ET rf_ids with Kineto "Record function id"s. O(nodes + events)."""
    et_ops = [n for n in et["nodes"] if n["name"] not in ET_ROOT_NAMES]
    et_rf_ids = {_et_attr(n, "rf_id") for n in et_ops}
    cpu_events = [e for e in kineto["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]
    kineto_rf_ids = {e["args"].get("Record function id") for e in cpu_events}
    cpu_pids = {e["pid"] for e in cpu_events}
    check = WindowCheck(
        et_ops=len(et_ops),
        et_matched=sum(1 for n in et_ops if _et_attr(n, "rf_id") in kineto_rf_ids),
        kineto_ops=len(cpu_events),
        kineto_matched=sum(1 for e in cpu_events if e["args"].get("Record function id") in et_rf_ids),
        et_tids=len({_et_attr(n, "tid") for n in et_ops}),
        kineto_tids=len({e["tid"] for e in cpu_events}),
        same_pid=cpu_pids == {et["pid"]},
    )
    if check.et_matched != check.et_ops:
        check.notes.append(f"{check.et_ops - check.et_matched} ET ops have no Kineto event (other threads or window)")
    if check.kineto_matched != check.kineto_ops:
        check.notes.append(f"{check.kineto_ops - check.kineto_matched} Kineto ops have no ET node (window differs)")
    return check


# --------------------------------------------------------------------------- main


def capture(options: CaptureOptions) -> CaptureSummary:
    """Run one workload under the profiler + ET observer and summarise the written pair."""
    torch = _import_torch()
    torch.manual_seed(options.seed)
    torch.set_num_threads(1)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    et_path, kineto_path = options.out_dir / "et.json.gz", options.out_dir / "kineto.json.gz"
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # torch prints progress; stdout is the JSON summary
        WORKLOADS[options.workload](torch, options, et_path, kineto_path)
    seconds = time.perf_counter() - started
    et, kineto = _load_gz_json(et_path), _load_gz_json(kineto_path)
    return CaptureSummary(
        workload=options.workload,
        et_path=str(et_path),
        kineto_path=str(kineto_path),
        et_nodes=len(et["nodes"]),
        kineto_events=len(kineto["traceEvents"]),
        et_bytes=os.path.getsize(et_path),
        kineto_bytes=os.path.getsize(kineto_path),
        capture_seconds=round(seconds, 2),
        torch_version=torch.__version__,
        window=check_window(et, kineto) if options.check else None,
    )


def parse_args(argv: list[str]) -> CaptureOptions:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (thread workloads: iterations per worker)")
    parser.add_argument("--layers", type=int, default=2, help="transformer: encoder layers")
    parser.add_argument("--d-model", type=int, default=64, help="transformer: model width")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16, help="transformer: sequence length")
    parser.add_argument("--workers", type=int, default=3, help="thread workloads: worker threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-check", action="store_true",
                        help="skip the rf_id window check (it re-reads both files; slow for large traces)")
    args = parser.parse_args(argv)
    return CaptureOptions(workload=args.workload, out_dir=args.out, steps=args.steps, layers=args.layers,
                          d_model=args.d_model, batch=args.batch, seq_len=args.seq_len, workers=args.workers,
                          seed=args.seed, check=not args.no_check)


def main(argv: list[str] | None = None) -> int:
    summary = capture(parse_args(sys.argv[1:] if argv is None else argv))
    print(json.dumps(asdict(summary)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

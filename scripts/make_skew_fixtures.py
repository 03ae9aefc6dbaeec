#!/usr/bin/env python3
"""Write GPU pairs with blocking pageable copies and skewed CPU/GPU clocks (issue 33, shape 1).

Usage:  python scripts/make_skew_fixtures.py [--out tests/fixtures/gpu]

Each pair is one ET iteration inside a 30-iteration Kineto trace, in PyTorch 2.0's dialect (integer
µs, no ``Record function id``, a runtime call's and its GPU op's ``External id`` equal to the
correlation; ET schema 1.0.3 nested layout), so linking cuts the Kineto trace to the ET's
``ProfilerStep#N`` and aligns by order. Every iteration, on one host thread and one stream:

- forward / backward / optimizer ops, each launching a kernel (``cudaLaunchKernel``, a few µs);
  the kernels keep the GPU busy 70–120 ms while the host enqueues them in a few ms;
- then the next batch is copied from pageable host memory: ``aten::to`` > ``aten::_to_copy`` >
  ``aten::copy_`` calls ``cudaMemcpyAsync`` (``Memcpy HtoD (Pageable -> Device)``), which returns
  only after the stream has drained the iteration's kernels and the ~20 ms staging copy is done,
  then ``cudaStreamSynchronize`` (returns at once). A second, smaller pageable copy follows (the
  targets: nothing left to drain, ~8 ms of staging), and a small pinned copy (asynchronous).

The GPU clock runs ahead of the host clock by a skew drifting from ``skew_from`` to ``skew_to``
µs over the trace: GPU times are written as host time + skew, so each blocking copy *ends* 20–40
µs after its call returns on the trace's timeline, and every launch gap (GPU start − launch) is
the launch latency plus the skew. ``truth.json`` holds, per pair, the measured step of the ET's
iteration (its ProfilerStep), the skew range, and the ET ids of the ``aten::copy_`` ops whose
copies blocked. Deterministic (seeded): the same bytes on every run.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

# The ET node parts and the gzip writer of the other hand-written GPU fixtures (same directory).
from make_gpu_shape_fixtures import ROOT_NAMES, _attrs, _io, write_fixture

PID, TID, STREAM, DEVICE = 2284, 2284, 7, 0
LAUNCH_LATENCY = 4  # µs from a launch call's start to its kernel's start on an idle GPU (true time)

VARIANTS = {
    # name: (seed, steps, ET step, layers, skew_from, skew_to, second copy)
    "pageable_skew_a": (11, 30, 17, 6, 20, 40, True),
    "pageable_skew_b": (23, 30, 9, 4, 38, 21, False),
}


class Run:
    """The host thread's events (host clock), the GPU's (host clock + skew), the ET of one step."""

    def __init__(self, seed: int, steps: int, et_step: int, skew_from: float, skew_to: float):
        self.rng = random.Random(seed)
        self.t = 1_000_000  # host µs
        self.t0, self.span = self.t, 0
        self.skew_from, self.skew_to = skew_from, skew_to
        self.steps, self.et_step = steps, et_step
        self.gpu_free = self.t  # true (host) time the stream is free
        self.events: list[dict] = []
        self.stack: list[dict] = []
        self.next_corr = 100
        self.next_ext = 1
        self.recording = False
        self.nodes = [{"id": 2, "name": ROOT_NAMES[1], "ctrl_deps": 1, "inputs": _io(), "outputs": _io(),
                       "attrs": _attrs(0)}]
        self.next_id = 3
        self.blocking_copy_ops: list[int] = []
        self.step_span: tuple[int, int] | None = None

    def skew(self, t: int) -> int:
        """GPU clock − host clock at host time t (drifts linearly over the planned trace)."""
        fraction = min(1.0, max(0.0, (t - self.t0) / max(1, self.span)))
        return round(self.skew_from + (self.skew_to - self.skew_from) * fraction)

    def tick(self, us: int) -> None:
        self.t += us

    def open(self, name: str, cat: str = "cpu_op") -> dict:
        event = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": self.t,
                 "args": {"External id": self.next_ext}}
        self.next_ext += 1
        if self.recording:
            parent = self.stack[-1]["et_id"] if self.stack else 2
            event["et_id"] = self.next_id
            self.nodes.append({"id": self.next_id, "name": name, "ctrl_deps": parent, "inputs": _io(),
                               "outputs": _io(), "attrs": _attrs(self.next_id)})
            self.next_id += 1
        self.events.append(event)
        self.stack.append(event)
        self.tick(self.rng.randint(3, 9))
        return event

    def close(self) -> None:
        self.tick(self.rng.randint(2, 6))
        event = self.stack.pop()
        event["dur"] = self.t - event["ts"]
        self.tick(self.rng.randint(1, 4))

    def op(self, name: str, cpu_us: int = 0, children=()) -> None:
        self.open(name)
        self.tick(cpu_us)
        for child in children:
            child()
        self.close()

    def _runtime(self, name: str, ts: int, dur: int, corr: int) -> None:
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": ts,
                            "dur": dur, "args": {"External id": corr, "correlation": corr}})

    def _gpu(self, name: str, cat: str, start_true: int, dur: int, corr: int) -> None:
        ts = start_true + self.skew(start_true)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": DEVICE, "tid": STREAM, "ts": ts,
                            "dur": dur, "args": {"External id": corr, "correlation": corr, "device": DEVICE,
                                                 "stream": STREAM}})
        self.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": PID, "tid": TID,
                            "ts": self.t})
        self.events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": DEVICE, "tid": STREAM,
                            "ts": ts, "bp": "e"})

    def launch(self, kernel: str, gpu_us: int) -> None:
        """cudaLaunchKernel: returns after a few µs; the kernel runs when the stream is free."""
        corr = self.next_corr
        self.next_corr += 1
        call_dur = self.rng.randint(3, 7)
        start = max(self.t + LAUNCH_LATENCY + self.rng.randint(0, 2), self.gpu_free)
        self._gpu(kernel, "kernel", start, gpu_us, corr)
        self._runtime("cudaLaunchKernel", self.t, call_dur, corr)
        self.gpu_free = start + gpu_us
        self.tick(call_dur)

    def pageable_copy(self, staging_us: int) -> None:
        """cudaMemcpyAsync from pageable memory: returns after the stream drained and the copy is
        done (0–3 µs after the copy's true end); then cudaStreamSynchronize returns at once."""
        corr = self.next_corr
        self.next_corr += 1
        call_ts = self.t
        start = max(call_ts + LAUNCH_LATENCY, self.gpu_free)
        self._gpu("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", start, staging_us, corr)
        self.gpu_free = start + staging_us
        returns = self.gpu_free + self.rng.randint(0, 3)
        self._runtime("cudaMemcpyAsync", call_ts, returns - call_ts, corr)
        self.t = returns + 2
        if self.recording:
            self.blocking_copy_ops.append(self.stack[-1]["et_id"])
        sync_corr = self.next_corr
        self.next_corr += 1
        self._runtime("cudaStreamSynchronize", self.t, 3, sync_corr)
        self.tick(4)

    def pinned_copy(self) -> None:
        """A small copy from pinned memory: asynchronous (the call returns before the copy ends)."""
        corr = self.next_corr
        self.next_corr += 1
        call_dur = self.rng.randint(4, 8)
        start = max(self.t + LAUNCH_LATENCY, self.gpu_free)
        self._gpu("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", start, 2, corr)
        self._runtime("cudaMemcpyAsync", self.t, call_dur, corr)
        self.gpu_free = start + 2
        self.tick(call_dur)


def _copy(run: Run, staging_us: int, pageable: bool = True) -> None:
    def inner() -> None:
        run.op("aten::empty_strided", 4)
        run.open("aten::copy_")
        run.tick(6)
        if pageable:
            run.pageable_copy(staging_us)
        else:
            run.pinned_copy()
        run.close()

    run.open("aten::to")
    run.open("aten::_to_copy")
    inner()
    run.close()
    run.close()


def step(run: Run, index: int, layers: int, second_copy: bool) -> None:
    rng = run.rng
    run.recording = index == run.et_step
    step_event = run.open(f"ProfilerStep#{index}", "user_annotation")
    budget = rng.randint(70_000, 120_000)  # GPU µs of kernels this step
    per_kernel = budget // (layers * 5 + 2)
    for _ in range(layers):  # forward
        run.op("aten::linear", 5, [lambda: run.op("aten::t", 2),
                                   lambda: run.op("aten::addmm", 10, [lambda: run.launch("volta_sgemm_128x64_nn", per_kernel * 2)])])
        run.op("aten::relu", 6, [lambda: run.launch("elementwise_kernel<relu>", per_kernel // 2)])
    run.op("aten::mse_loss", 8, [lambda: run.launch("reduce_kernel<mse>", per_kernel // 2)])
    for _ in range(layers):  # backward
        run.op("autograd::engine::evaluate_function: AddmmBackward0", 6,
               [lambda: run.op("aten::mm", 9, [lambda: run.launch("volta_sgemm_64x64_nt", per_kernel * 2)])])
    run.op("Optimizer.step#SGD.step", 15, [lambda: run.op("aten::_foreach_add_", 20,
                                                          [lambda: run.launch("multi_tensor_apply_kernel", per_kernel)])])
    _copy(run, rng.randint(18_000, 22_000))  # the next batch: waits for the drain, then stages
    if second_copy:
        _copy(run, rng.randint(6_000, 10_000))  # its targets: nothing left to drain
    _copy(run, 0, pageable=False)  # a small pinned copy: asynchronous
    run.close()
    if run.recording:
        run.step_span = (step_event["ts"], step_event["ts"] + step_event["dur"])
    run.recording = False
    run.tick(rng.randint(200, 900))  # Python between steps


def build(name: str) -> tuple[dict, dict, dict]:
    seed, steps, et_step, layers, skew_from, skew_to, second_copy = VARIANTS[name]
    run = Run(seed, steps, et_step, skew_from, skew_to)
    run.span = steps * 140_000
    for index in range(steps):
        step(run, index, layers, second_copy)
    for event in run.events:
        event.pop("et_id", None)
    nodes = run.nodes + [{"id": 1, "name": ROOT_NAMES[0], "ctrl_deps": 1, "inputs": _io(), "outputs": _io(),
                          "attrs": _attrs(0)}]
    et = {"schema": "1.0.3-chakra.0.0.4", "pid": PID, "time": "2026-11-27 08:00:00", "nodes": nodes}
    kineto = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA GeForce RTX 2080 Ti"}],
              "traceEvents": sorted(run.events, key=lambda e: (e["ts"], e["ph"] != "X")), "traceName": name}
    first, last = run.step_span
    gpu_end = max(e["ts"] + e["dur"] for e in run.events if e.get("cat") in ("kernel", "gpu_memcpy")
                  and first <= e["ts"] - run.skew(e["ts"]) <= last)
    truth = {"pair": name, "et_step": f"ProfilerStep#{et_step}", "step_start": first, "step_end": last,
             "last_gpu_end_in_step": gpu_end, "skew_us": [skew_from, skew_to],
             "blocking_copy_ops": run.blocking_copy_ops}
    return et, kineto, truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gpu")
    args = parser.parse_args()
    for name in VARIANTS:
        et, kineto, truth = build(name)
        directory = args.out / name
        write_fixture(directory, et, kineto, truth)
        print(f"wrote {directory}: {len(et['nodes'])} ET nodes, {len(kineto['traceEvents'])} Kineto events")


if __name__ == "__main__":
    main()

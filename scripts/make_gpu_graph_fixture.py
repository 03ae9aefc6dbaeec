#!/usr/bin/env python3
"""Write a small hand-made Kineto trace of a CUDA-graph workload (no ET): the graph fixture.

Usage:  python scripts/make_gpu_graph_fixture.py [--out tests/fixtures/gpu/cuda_graphs]

Modelled on the shape of a ``torch.compile(mode="reduce-overhead")`` training step (the HTA
``compile_cudagraphs`` trace's structure: compiled regions replayed as CUDA graphs, eager ops
between them, the backward graphs on the autograd thread); every name, time and id here is
made up. One process, a main thread and an autograd thread, device 0, streams 7 and 20; two
steps, each:

- main thread: ``ProfilerStep#N`` (user annotation) ⊃ ``aten::copy_`` (a host-to-device copy),
  ``Torch-Compiled Region`` ⊃ ``CompiledFunction`` ⊃ ``cudaGraphLaunch`` of graph A (three
  Triton kernels and a memset on stream 7), ``aten::mm`` (an eager kernel), a ``## replay ##``
  user annotation ⊃ ``cudaGraphLaunch`` of graph B (one kernel on stream 7, one on stream 20);
- autograd thread: ``autograd::engine::evaluate_function: CompiledFunctionBackward`` ⊃
  ``CompiledFunctionBackward`` ⊃ ``cudaGraphLaunch`` of graph C (four kernels on stream 7);
  in step 2 also a ``cudaGraphLaunch`` of graph B outside every op;
- main thread again: ``Optimizer.step#SGD.step`` (an eager kernel) once the backward is done.

Kineto of PyTorch 2.2+ style: float µs, non-zero distinct ``Record function id``, GPU ops
carrying their launch's ``correlation``, ``ac2g`` flows. A graph's GPU ops start after its
launch returns and run in stream order. Deterministic: the same bytes on every run (gzip mtime 0).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

PID, MAIN_TID, AUTOGRAD_TID = 3100, 3100, 3117
DEVICE, STREAM, SIDE_STREAM = 0, 7, 20
FIRST_CORRELATION = 20000
GRAPHS = {  # graph -> its GPU ops: (category, name, stream, duration µs)
    "A": [("kernel", "triton_poi_fused_add_0", STREAM, 12.5), ("gpu_memset", "Memset (Device)", STREAM, 1.5),
          ("kernel", "triton_red_fused_sum_1", STREAM, 30.25), ("kernel", "triton_poi_fused_mul_2", STREAM, 8.0)],
    "B": [("kernel", "triton_poi_fused_relu_3", STREAM, 9.75), ("kernel", "triton_poi_fused_neg_4", SIDE_STREAM, 6.5)],
    "C": [("kernel", "triton_red_fused_sum_5", STREAM, 21.0), ("kernel", "triton_poi_fused_mul_6", STREAM, 7.25),
          ("kernel", "triton_poi_fused_add_7", STREAM, 11.0), ("kernel", "triton_poi_fused_clone_8", STREAM, 4.5)],
}
GPU_LAG = 4.0  # µs from a launch's end to its first GPU op's start (when the stream is idle)


class Trace:
    """The events, a clock per host thread and per stream, and the next ids."""

    def __init__(self):
        self.events: list[dict] = []
        self.correlation = FIRST_CORRELATION
        self.rf_id = 1
        self.external = 1
        self.stream_free = {STREAM: 0.0, SIDE_STREAM: 0.0}

    def host(self, cat: str, name: str, tid: int, ts: float, dur: float) -> dict:
        args = {"External id": self.external}
        self.external += 1
        args["Record function id"] = self.rf_id  # annotations are RecordFunctions too
        self.rf_id += 1
        event = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}
        self.events.append(event)
        return event

    def launch(self, name: str, tid: int, ts: float, dur: float, ops: list[tuple]) -> None:
        """A runtime call at ``ts`` and the GPU ops it puts on the streams (stream order)."""
        corr = self.correlation
        self.correlation += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"External id": corr, "correlation": corr}})
        self.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": PID, "tid": tid, "ts": ts})
        ready = ts + dur + GPU_LAG
        for cat, op_name, stream, op_dur in ops:
            start = max(ready, self.stream_free[stream])
            args = {"device": DEVICE, "context": 1, "stream": stream, "correlation": corr}
            if cat == "gpu_memcpy":
                args["bytes"] = 4096
            self.events.append({"ph": "X", "cat": cat, "name": op_name, "pid": DEVICE, "tid": stream, "ts": start,
                                "dur": op_dur, "args": args})
            self.events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": DEVICE, "tid": stream,
                                "ts": start, "bp": "e"})
            self.stream_free[stream] = start + op_dur
            ready = start + 0.75  # a graph's next op is issued right behind the previous one


def _step(trace: Trace, step: int, t0: float) -> float:
    """One training step from ``t0``; returns its end."""
    trace.host("user_annotation", f"ProfilerStep#{step}", MAIN_TID, t0, 400.0)
    trace.host("cpu_op", "aten::copy_", MAIN_TID, t0 + 5.0, 30.0)
    trace.launch("cudaMemcpyAsync", MAIN_TID, t0 + 12.0, 15.0,
                 [("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", STREAM, 3.0)])
    trace.host("cpu_op", "Torch-Compiled Region", MAIN_TID, t0 + 40.0, 90.0)
    trace.host("cpu_op", "CompiledFunction", MAIN_TID, t0 + 45.0, 80.0)
    trace.launch("cudaGraphLaunch", MAIN_TID, t0 + 60.0, 40.0, GRAPHS["A"])
    trace.host("cpu_op", "aten::mm", MAIN_TID, t0 + 140.0, 25.0)
    trace.launch("cudaLaunchKernel", MAIN_TID, t0 + 148.0, 9.0,
                 [("kernel", "ampere_sgemm_64x32_sliced1x4_nn", STREAM, 40.0)])
    trace.host("user_annotation", "## replay ##", MAIN_TID, t0 + 180.0, 60.0)
    trace.launch("cudaGraphLaunch", MAIN_TID, t0 + 190.0, 35.0, GRAPHS["B"])
    trace.host("cpu_op", "autograd::engine::evaluate_function: CompiledFunctionBackward", AUTOGRAD_TID,
               t0 + 250.0, 120.0)
    trace.host("cpu_op", "CompiledFunctionBackward", AUTOGRAD_TID, t0 + 255.0, 110.0)
    trace.launch("cudaGraphLaunch", AUTOGRAD_TID, t0 + 270.0, 45.0, GRAPHS["C"])
    if step == 2:
        trace.launch("cudaGraphLaunch", AUTOGRAD_TID, t0 + 372.0, 10.0, GRAPHS["B"])
    trace.host("cpu_op", "Optimizer.step#SGD.step", MAIN_TID, t0 + 385.0, 12.0)
    trace.launch("cudaLaunchKernel", MAIN_TID, t0 + 388.0, 6.0,
                 [("kernel", "multi_tensor_apply_kernel", STREAM, 5.0)])
    return t0 + 400.0


def build() -> dict:
    """The Kineto document."""
    trace = Trace()
    t = 1000.0
    for step in (1, 2):
        t = _step(trace, step, t) + 100.0
    meta = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": PID, "tid": AUTOGRAD_TID, "args": {"name": "autograd"}}]
    return {"schemaVersion": 1, "deviceProperties": [{"id": DEVICE, "name": "made-up GPU"}],
            "traceEvents": meta + trace.events, "traceName": "cuda_graphs (scripts/make_gpu_graph_fixture.py)"}


def write(out: Path) -> Path:
    """Write ``kineto.json.gz`` into ``out``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "kineto.json.gz"
    data = json.dumps(build(), indent=None, separators=(",", ":")).encode()
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
        handle.write(data)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures"
                        / "gpu" / "cuda_graphs")
    print(write(parser.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

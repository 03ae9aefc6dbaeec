#!/usr/bin/env python3
"""Write small hand-made ET + Kineto pairs with every GPU launch shape, and their ground truth.

Usage:  python scripts/make_gpu_shape_fixtures.py [--out tests/fixtures/gpu]

Two pairs, ``shapes_cuda`` and ``shapes_rocm`` (ET schema 1.1.1 nested layout; Kineto with every
``Record function id`` 0, as recent profilers write when no ET observer ran, so linking falls back
to order alignment). Between them they hold, on one host thread:

- work launched before the trace started: GPU ops whose correlation is below the first runtime
  call's, with no launch event;
- every launch name of issue 12: cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel,
  cuLaunchKernelEx (``cuda_driver``), cudaGraphLaunch, cudaMemcpyAsync, cudaMemsetAsync,
  hipLaunchKernel, hipExtLaunchKernel, hipExtModuleLaunchKernel, hipModuleLaunchKernel,
  hipGraphLaunch, hipMemcpyAsync, hipMemcpyWithStream, hipMemsetAsync;
- a graph launch carrying several GPU ops on one correlation on two streams (CUDA, inside a
  cpu_op) and one on ROCm with no ``External id`` lying only inside a user annotation;
- an Inductor-style cpu_op named after the Triton kernel it launches;
- a launch inside a ``python_function`` only, and a launch outside every event;
- lone ``ac2g`` ``f`` flows on non-launch calls (cudaEventQuery), memset/graph flows without ``s``;
- CUDA in the 2023 style (a runtime call's ``External id`` equals its correlation), ROCm with GPU
  pid = device, tid = stream, ``kind``, and runtime ``stream`` written as a hex string.

``truth.json`` lists every GPU op (correlation, name, ts) with, for the ET-linked path, the ET id
it belongs under (null when none) and the reason the report must give, and for the Kineto-only
path the name and start of the Kineto event it belongs under and that reason. Deterministic.
"""

from __future__ import annotations

import argparse
import gzip
import json
from contextlib import contextmanager
from pathlib import Path

PID = 41003
ROOT_NAMES = ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]")
DRIVER_CALLS = ("cuLaunchKernel", "cuLaunchKernelEx")
GRAPH_CALLS = ("cudaGraphLaunch", "hipGraphLaunch")
FIRST_CORRELATION = 5000


def _io() -> dict:
    return {"values": [], "shapes": [], "types": [], "strides": []}


def _attrs(rf_id: int) -> list:
    return [{"name": "rf_id", "type": "uint64", "value": rf_id},
            {"name": "fw_parent", "type": "uint64", "value": 0},
            {"name": "seq_id", "type": "int64", "value": -1},
            {"name": "scope", "type": "uint64", "value": 0},
            {"name": "tid", "type": "uint64", "value": 1},
            {"name": "fw_tid", "type": "uint64", "value": 0},
            {"name": "op_schema", "type": "string", "value": ""}]


class Timeline:
    """One host thread, its ET nodes and Kineto events, and the GPU work it launches."""

    def __init__(self, dialect: str, start: float):
        self.rocm = dialect == "rocm"
        self.device = 2 if self.rocm else 0
        self.t = start
        self.next_id = 3
        self.next_ext = 1
        self.next_corr = FIRST_CORRELATION
        self.stack: list[dict] = []  # open cpu_op / user_annotation events (with their ET id)
        self.python: list[dict] = []  # open python_function events
        self.nodes = [{"id": 2, "name": ROOT_NAMES[1], "ctrl_deps": 1, "inputs": _io(), "outputs": _io(),
                       "attrs": _attrs(0)}]
        self.events: list[dict] = []
        self.gpu_free: dict[int, float] = {}
        self.truth: list[dict] = []

    def tick(self, us: float) -> None:
        self.t = round(self.t + us, 3)

    @contextmanager
    def op(self, name: str, cat: str = "cpu_op"):
        node_id, ext = self.next_id, self.next_ext
        self.next_id += 1
        self.next_ext += 1
        parent = self.stack[-1]["et_id"] if self.stack else 2
        self.nodes.append({"id": node_id, "name": name, "ctrl_deps": parent, "inputs": _io(),
                           "outputs": _io(), "attrs": _attrs(node_id * 3)})
        event = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": PID, "ts": self.t,
                 "args": {"External id": ext, "Record function id": 0}, "et_id": node_id}
        self.events.append(event)
        self.stack.append(event)
        self.tick(2.5)
        yield event
        self.tick(2.5)
        self.stack.pop()
        event["dur"] = round(self.t - event["ts"], 3)
        self.tick(0.5)  # a gap: a launch right after an op is not at the op's end

    @contextmanager
    def python_function(self, name: str):
        event = {"ph": "X", "cat": "python_function", "name": name, "pid": PID, "tid": PID, "ts": self.t,
                 "args": {"Python id": len(self.events)}}
        self.events.append(event)
        self.python.append(event)
        self.tick(1.5)
        yield event
        self.tick(1.5)
        self.python.pop()
        event["dur"] = round(self.t - event["ts"], 3)
        self.tick(0.5)

    def _gpu_event(self, name, cat, stream, corr, ext, after):
        start = max(after, self.gpu_free.get(stream, 0.0)) + 1.0
        dur = 4.0 + len(name) % 7
        self.gpu_free[stream] = start + dur
        args = {"correlation": corr, "device": self.device, "stream": stream}
        if ext is not None:
            args["External id"] = ext
        if self.rocm:
            args["kind"] = {"kernel": "Dispatch Kernel", "gpu_memcpy": "DtoD", "gpu_memset": "Memset"}[cat]
        return {"ph": "X", "cat": cat, "name": name, "pid": self.device,
                "tid": stream, "ts": round(start, 3), "dur": dur, "args": args}

    def _expect(self, gpu: dict, call: str | None) -> None:
        row = {"correlation": gpu["args"]["correlation"], "name": gpu["name"], "ts": gpu["ts"]}
        if call is None:
            row.update(et_id=None, et_reason="before_trace", kineto_parent=None, kineto_reason="before_trace")
        elif self.stack:
            inner = self.stack[-1]
            reason = ("under_annotation" if inner["cat"] == "user_annotation" else
                      "under_graph_launch_op" if call in GRAPH_CALLS else "under_op")
            row.update(et_id=inner["et_id"], et_reason=reason,
                       kineto_parent=[inner["name"], inner["ts"]], kineto_reason=reason)
        elif self.python:
            inner = self.python[-1]
            row.update(et_id=None, et_reason="launch_in_python_function_only",
                       kineto_parent=[inner["name"], inner["ts"]], kineto_reason="under_python_function")
        else:
            row.update(et_id=None, et_reason="launch_outside_cpu_ops", kineto_parent=None,
                       kineto_reason="launch_outside_cpu_ops")
        self.truth.append(row)

    def launch(self, call: str, work: list[tuple], graph_ext: bool = True) -> None:
        """A runtime/driver call carrying ``work`` = [(name, cat, stream)] on one correlation."""
        corr = self.next_corr
        self.next_corr += 1
        op_ext = self.stack[-1]["args"]["External id"] if self.stack else None
        graph_without_ext = call == "hipGraphLaunch"
        if self.rocm:
            runtime_ext = None if graph_without_ext else op_ext
        else:
            runtime_ext = corr  # 2023 style: a runtime call's External id is its correlation
        args = {"correlation": corr}
        if runtime_ext is not None:
            args["External id"] = runtime_ext
        if self.rocm:
            args["stream"] = hex(work[0][2])
        cat = "cuda_driver" if call in DRIVER_CALLS else "cuda_runtime"
        dur = 3.0
        self.events.append({"ph": "X", "cat": cat, "name": call, "pid": PID, "tid": PID, "ts": self.t,
                            "dur": dur, "args": args})
        memset_like = call.endswith("MemsetAsync") or call in GRAPH_CALLS
        self.events.append({"ph": "f" if memset_like else "s", "cat": "ac2g", "name": "ac2g", "id": corr,
                            "pid": PID, "tid": PID, "ts": self.t, **({"bp": "e"} if memset_like else {})})
        gpu_ext = None if graph_without_ext else runtime_ext
        for name, gpu_cat, stream in work:
            gpu = self._gpu_event(name, gpu_cat, stream, corr, gpu_ext, self.t + dur)
            self.events.append(gpu)
            self.events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": gpu["pid"],
                                "tid": gpu["tid"], "ts": gpu["ts"], "bp": "e"})
            self._expect(gpu, call)
        self.tick(dur + 1.0)

    def pre_trace(self, work: list[tuple]) -> None:
        """GPU ops launched before profiling started: correlations below the first launch's."""
        for k, (name, cat, stream) in enumerate(work):
            gpu = self._gpu_event(name, cat, stream, FIRST_CORRELATION - len(work) + k, None, self.t - 50)
            self.events.append(gpu)
            self._expect(gpu, None)

    def event_query(self) -> None:
        """A non-launch runtime call with a lone ``f`` flow (Kineto does this)."""
        corr = self.next_corr
        self.next_corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "hipEventQuery" if self.rocm else "cudaEventQuery",
                            "pid": PID, "tid": PID, "ts": self.t, "dur": 1.0, "args": {"correlation": corr}})
        self.events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": PID, "tid": PID,
                            "ts": self.t, "bp": "e"})
        self.tick(2.0)


def cuda_workload(tl: Timeline) -> None:
    tl.pre_trace([("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>", "kernel", 7),
                  ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 7)])
    with tl.op("## forward ##", "user_annotation"):
        tl.launch("cudaLaunchKernel", [("void at::native::elementwise_kernel<128, 2>", "kernel", 7)])
        with tl.op("aten::addmm"):
            tl.launch("cudaLaunchKernelExC", [("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", "kernel", 7)])
        with tl.op("triton_poi_fused_add_relu_0"):
            tl.launch("cuLaunchKernel", [("triton_poi_fused_add_relu_0", "kernel", 7)])
        with tl.op("aten::mm"):
            tl.launch("cuLaunchKernelEx", [("nvjet_tst_128x64_64x8_1x2_h_bz_TNT", "kernel", 7)])
        with tl.op("aten::copy_"):
            tl.launch("cudaMemcpyAsync", [("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 7)])
        with tl.op("aten::zero_"):
            with tl.op("aten::fill_"):
                tl.launch("cudaMemsetAsync", [("Memset (Device)", "gpu_memset", 7)])
        tl.event_query()
    with tl.op("CompiledFunction"):
        tl.launch("cudaGraphLaunch", [("triton_red_fused_mean_0", "kernel", 7),
                                      ("triton_poi_fused_mul_1", "kernel", 7),
                                      ("Memset (Device)", "gpu_memset", 25),
                                      ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 25)])
    with tl.python_function("torch/cuda/graphs.py(88): replay"):
        tl.launch("cudaLaunchKernel", [("void at::native::reduce_kernel<512, 1>", "kernel", 7)])
    tl.tick(5.0)
    tl.launch("cudaLaunchKernel", [("void at::native::unrolled_elementwise_kernel", "kernel", 7)])


def rocm_workload(tl: Timeline) -> None:
    tl.pre_trace([("Cijk_Ailk_Bljk_SB_MT64x64x16", "kernel", 0), ("CopyDeviceToDevice", "gpu_memcpy", 0),
                  ("FillBuffer", "gpu_memset", 0)])
    with tl.op("aten::linear"):
        with tl.op("aten::addmm"):
            tl.launch("hipExtModuleLaunchKernel", [("Cijk_Alik_Bljk_SB_MT128x128x16_MI32x32x2x1", "kernel", 0)])
        tl.launch("hipLaunchKernel", [("void at::native::elementwise_kernel<512, 1>", "kernel", 0)])
    with tl.op("aten::_efficient_attention_forward"):
        tl.launch("hipExtLaunchKernel", [("attn_fwd", "kernel", 0)])
    with tl.op("triton_red_fused_add_mean_mul_pow_rsqrt_0"):
        tl.launch("hipModuleLaunchKernel", [("triton_red_fused_add_mean_mul_pow_rsqrt_0", "kernel", 0)])
    with tl.op("aten::copy_"):
        tl.launch("hipMemcpyAsync", [("CopyDeviceToDevice", "gpu_memcpy", 0)])
    with tl.op("aten::to"):
        tl.launch("hipMemcpyWithStream", [("CopyHostToDevice", "gpu_memcpy", 0)])
    with tl.op("aten::zero_"):
        tl.launch("hipMemsetAsync", [("FillBuffer", "gpu_memset", 0)])
    tl.event_query()
    with tl.python_function("vllm/v1/worker/gpu_model_runner.py(1602): execute_model"):
        with tl.op("vllm::decode_graph", "user_annotation"):
            with tl.python_function("torch/cuda/graphs.py(88): replay"):
                tl.launch("hipGraphLaunch", [(f"triton_poi_fused_{k}", "kernel", 0) for k in range(4)]
                          + [("ck_tile::FmhaFwdKernel", "kernel", 0)])
    with tl.python_function("torch/_ops.py(1158): __call__"):
        tl.launch("hipLaunchKernel", [("void at::native::reduce_kernel<512, 1>", "kernel", 0)])
    tl.tick(5.0)
    tl.launch("hipLaunchKernel", [("void at::native::vectorized_elementwise_kernel<4>", "kernel", 0)])


def build(dialect: str) -> tuple[dict, dict, dict]:
    start = 1_700_000_000_000.0 if dialect == "cuda" else 6_520_618_853_502.0
    tl = Timeline(dialect, start)
    (cuda_workload if dialect == "cuda" else rocm_workload)(tl)
    for event in tl.events:
        event.pop("et_id", None)
    tl.nodes.append({"id": 1, "name": ROOT_NAMES[0], "ctrl_deps": 1, "inputs": _io(), "outputs": _io(),
                     "attrs": _attrs(0)})
    et = {"schema": "1.1.1-chakra.0.0.4", "pid": PID, "time": "2026-11-23 10:00:00", "nodes": tl.nodes}
    kineto = {"schemaVersion": 1, "traceEvents": sorted(tl.events, key=lambda e: (e["ts"], e["ph"] != "X")),
              "traceName": f"shapes_{dialect}"}
    truth = {"pair": f"shapes_{dialect}", "gpu_ops": tl.truth}
    return et, kineto, truth


def _write_gz(obj: dict, path: Path) -> None:
    path.write_bytes(gzip.compress(json.dumps(obj, indent=None).encode(), mtime=0))


def write_fixture(directory: Path, et: dict, kineto: dict, truth: dict) -> None:
    """One fixture pair and its truth file: ``et.json.gz``, ``kineto.json.gz``, ``truth.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    _write_gz(et, directory / "et.json.gz")
    _write_gz(kineto, directory / "kineto.json.gz")
    (directory / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gpu")
    args = parser.parse_args()
    for dialect in ("cuda", "rocm"):
        et, kineto, truth = build(dialect)
        directory = args.out / f"shapes_{dialect}"
        write_fixture(directory, et, kineto, truth)
        print(f"wrote {directory}: {len(truth['gpu_ops'])} GPU ops")


if __name__ == "__main__":
    main()

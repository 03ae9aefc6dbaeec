#!/usr/bin/env python3
"""Write the hand-written GPU trace fixtures (ET + Kineto + ground truth), deterministically.

Usage:  python scripts/make_gpu_fixtures.py [--out tests/fixtures/gpu] [--seed 7] [--steps 1]

One synthetic training step of a small two-rank data-parallel model on one GPU is laid out on a
timeline (``build_workload``), then emitted in two dialects that follow docs/FORMATS.md:

* ``gpu_v101``: ET schema ``1.0.1`` (flat keys, ``parent``, ``execution_graph`` root names) with a
  PyTorch-2.0 style Kineto trace (integer µs, no ``Record function id``, a GPU op's and its launch's
  ``External id`` equal their ``correlation``).
* ``gpu_v111``: ET schema ``1.1.1-chakra.0.0.4`` (``ctrl_deps``, ``inputs``/``outputs`` objects,
  ``attrs`` list, process root written last) with a PyTorch-2.2+ style Kineto trace (float µs with ns
  fractions, ``Record function id`` == ET ``rf_id``, a GPU op's ``External id`` = its enclosing
  cpu_op's ``External id``).

Each pair has ``truth.json``: every Kineto cpu_op/user_annotation event, keyed by (tid, ts, name),
with its ET node id (null for the Kineto-only ``ProfilerStep#N``), and every GPU op, keyed by
``correlation``, with the ET node id of the CPU op that launched it and how it can be linked:
``correlation`` (normal), ``external_id`` (its correlation matches no launch, its External id does),
``ac2g`` (only the ac2g flow with its correlation leads to the launch) or ``none`` (no launch at all;
must be reported unattributed, ``et_id`` null).

The workload (main thread 1 + autograd thread 2, compute stream 7 + NCCL stream 13): zero_grad
(fill kernels), host-to-device memcpy and memset, forward (sgemm via cudaLaunchKernelExC, an
elementwise kernel via cuLaunchKernel, an all_to_all running ``ncclKernel_SendRecv_*`` after a
cudaStreamWaitEvent), backward on the autograd thread ending in an NCCL all_reduce, an optimizer
step, an ET-only ``## process_group:init ##`` node and a Kineto-only ``ProfilerStep#3``.
Everything is computed from a seeded ``random.Random``; output bytes are identical across runs.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import random
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

PID = 52817
MAIN_TID = 52817
AUTOGRAD_TID = 52931
OS_TID = {1: MAIN_TID, 2: AUTOGRAD_TID}
DEVICE = 0
COMPUTE_STREAM = 7
NCCL_STREAM = 13
FIRST_CORRELATION = 31400
PG_CONFIG = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2,
              "ranks": [0, 1], "group_count": 1}]

CBID = {"cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cuLaunchKernel": 307, "cudaMemcpyAsync": 41,
        "cudaMemsetAsync": 51, "cudaStreamWaitEvent": 147, "cudaEventQuery": 138, "cudaEventRecord": 135}

KERNEL_FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
               "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")
KERNEL_SGEMM = "ampere_sgemm_32x32_sliced1x4_tn"
KERNEL_SGEMM_NN = "ampere_sgemm_64x32_sliced1x4_nn"
KERNEL_CLAMP = ("void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min_scalar_kernel_impl"
                "(at::TensorIteratorBase&, c10::Scalar)::{lambda(float)#1}, at::detail::Array<char*, 2> >"
                "(int, at::native::clamp_min_scalar_kernel_impl(at::TensorIteratorBase&, c10::Scalar)"
                "::{lambda(float)#1}, at::detail::Array<char*, 2>)")
KERNEL_MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
              "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, "
              "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
              "at::detail::Array<char*, 3>)")
KERNEL_SUB = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::SubFunctor> >"
KERNEL_POW = "void at::native::vectorized_elementwise_kernel<4, at::native::pow_tensor_scalar_kernel<float> >"
KERNEL_MEAN = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >"
KERNEL_MSE_BWD = "void at::native::elementwise_kernel<128, 4, at::native::mse_backward_cuda_kernel<float> >"
KERNEL_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
              "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
KERNEL_STRAGGLER = "void at::native::vectorized_elementwise_kernel<4, at::native::AbsFunctor<float> >"
KERNEL_ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
KERNEL_SEND_RECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
MEMCPY_H2D = "Memcpy HtoD (Pinned -> Device)"
MEMSET = "Memset (Device)"


# --------------------------------------------------------------------------- plain data


@dataclass
class Tensor:
    """A tensor as the ET sees it; ids are assigned on first appearance (``assign_ids``)."""

    shape: tuple[int, ...]
    dtype: str = "float"
    itemsize: int = 4
    device: str = "cuda:0"
    view_of: Tensor | None = None
    tensor_id: int | None = None
    storage_id: int | None = None

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass
class Arg:
    """One op input/output: a Tensor, a list of Tensors, or a plain value with its ET type name."""

    type_name: str
    value: Any
    kineto_type: str = ""


@dataclass
class CommInfo:
    """Collective metadata carried by ``record_param_comms`` (attrs in 1.1.1, Kineto args in 2.2+)."""

    collective: str
    nelems: int
    in_splits: list[int] = field(default_factory=list)
    out_splits: list[int] = field(default_factory=list)


@dataclass
class GpuOp:
    """A kernel / gpu_memcpy / gpu_memset on one stream. ``link`` says how it reaches its launch."""

    cat: str
    name: str
    stream: int
    ts_ns: int
    dur_ns: int
    correlation: int
    link: str
    launch: RuntimeCall | None = None
    args: dict = field(default_factory=dict)


@dataclass
class RuntimeCall:
    """A cuda_runtime / cuda_driver event on a CPU thread, inside ``enclosing``."""

    name: str
    cat: str
    thread: int
    ts_ns: int
    dur_ns: int
    correlation: int
    enclosing: CpuOp
    gpu_op: GpuOp | None = None


@dataclass
class CpuOp:
    """One record-function range: an ET node and/or a Kineto cpu_op / user_annotation event."""

    name: str
    thread: int
    ts_ns: int
    cat: str = "cpu_op"
    scope: int = 0
    parent: CpuOp | None = None
    inputs: list[Arg] = field(default_factory=list)
    outputs: list[Arg] = field(default_factory=list)
    op_schema: str = ""
    seq_id: int = -1
    in_et: bool = True
    in_kineto: bool = True
    comm: CommInfo | None = None
    forward_of: CpuOp | None = None
    fw_parent_op: CpuOp | None = None
    dur_ns: int = 0
    children: list[CpuOp] = field(default_factory=list)
    et_id: int | None = None
    rf_id: int | None = None
    external_id: int | None = None
    fw_parent: int = 0
    fw_tid: int = 0


@dataclass
class Workload:
    """Everything laid out on the timeline, in creation order."""

    ops: list[CpuOp]
    calls: list[RuntimeCall]
    gpu_ops: list[GpuOp]
    start_ns: int
    end_ns: int
    thread_roots: dict[int, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- argument helpers


def tensor(t: Tensor) -> Arg:
    return Arg(f"Tensor({t.dtype})", t, t.dtype)


def tensor_list(ts: list[Tensor]) -> Arg:
    return Arg(f"GenericList[Tensor({ts[0].dtype})]", ts, "TensorList")


def scalar(type_name: str, value: Any) -> Arg:
    kineto_type = "Scalar" if type_name in ("Int", "Double", "Bool") else ""
    return Arg(type_name, value, kineto_type)


def int_list(values: list[int]) -> Arg:
    return Arg("GenericList[" + ",".join("Int" for _ in values) + "]", list(values), "ScalarList")


# --------------------------------------------------------------------------- timeline


class Timeline:
    """Lays ops out in time: one cursor and one open-op stack per CPU thread, one cursor per stream.

    Every gap is >= 1 µs, so flooring times to whole µs (PyTorch 2.0 style) keeps the nesting strict.
    """

    def __init__(self, rng: random.Random, start_ns: int):
        self.rng = rng
        self.start_ns = start_ns
        self.now = {1: start_ns, 2: start_ns}
        self.open_ops: dict[int, list[CpuOp]] = {1: [], 2: []}
        self.stream_free: dict[int, int] = {}
        self.correlations = itertools.count(FIRST_CORRELATION)
        self.ops: list[CpuOp] = []
        self.calls: list[RuntimeCall] = []
        self.gpu_ops: list[GpuOp] = []

    def advance(self, thread: int, low: int = 1100, high: int = 4200) -> None:
        self.now[thread] += self.rng.randint(low, high)

    @contextmanager
    def op(self, thread: int, name: str, **fields: Any) -> Iterator[CpuOp]:
        """Open an op at the thread's cursor; on exit it ends after its children (or a leaf's work)."""
        self.advance(thread)
        stack = self.open_ops[thread]
        op = CpuOp(name=name, thread=thread, ts_ns=self.now[thread], parent=stack[-1] if stack else None, **fields)
        if op.parent is not None:
            op.parent.children.append(op)
        self.ops.append(op)
        stack.append(op)
        yield op
        if not op.children:
            self.advance(thread, 1500, 9000)
        self.advance(thread)
        op.dur_ns = self.now[thread] - op.ts_ns
        stack.pop()

    def leaf(self, thread: int, name: str, **fields: Any) -> CpuOp:
        with self.op(thread, name, **fields) as op:
            pass
        return op

    def runtime_call(self, thread: int, name: str) -> RuntimeCall:
        """A host API call (launch or not) inside the thread's innermost open op."""
        self.advance(thread, 1000, 2500)
        call = RuntimeCall(name=name, cat="cuda_driver" if name.startswith("cu") and not name.startswith("cuda")
                           else "cuda_runtime", thread=thread, ts_ns=self.now[thread],
                           dur_ns=self.rng.randint(2100, 9800), correlation=next(self.correlations),
                           enclosing=self.open_ops[thread][-1])
        self.now[thread] += call.dur_ns
        self.calls.append(call)
        return call

    def launch(self, thread: int, api: str, cat: str, name: str, stream: int = COMPUTE_STREAM,
               link: str = "correlation", args: dict | None = None) -> GpuOp:
        """A launch and the GPU op it starts; ``link`` != correlation gives the GPU op a fresh correlation."""
        call = self.runtime_call(thread, api)
        correlation = call.correlation if link == "correlation" else next(self.correlations)
        gpu_op = self.gpu_op(cat, name, stream, call.ts_ns + self.rng.randint(4000, 15000), correlation, link, args)
        gpu_op.launch, call.gpu_op = call, gpu_op
        return gpu_op

    def gpu_op(self, cat: str, name: str, stream: int, earliest_ns: int, correlation: int, link: str,
               args: dict | None = None) -> GpuOp:
        ts = max(earliest_ns, self.stream_free.get(stream, 0) + self.rng.randint(1000, 3000))
        duration = self.rng.randint(1200, 6000) if cat != "kernel" else self.rng.randint(2500, 60000)
        gpu_op = GpuOp(cat=cat, name=name, stream=stream, ts_ns=ts, dur_ns=duration, correlation=correlation,
                       link=link, args=dict(args or {}))
        self.stream_free[stream] = ts + duration
        self.gpu_ops.append(gpu_op)
        return gpu_op

    def join(self, waiting: int, worker: int) -> None:
        """``waiting`` blocks until ``worker`` is done."""
        self.now[waiting] = max(self.now[waiting], self.now[worker])

    def fork(self, worker: int, starter: int) -> None:
        """``worker`` starts working shortly after ``starter``'s cursor."""
        self.now[worker] = max(self.now[worker], self.now[starter]) + self.rng.randint(3000, 8000)


# --------------------------------------------------------------------------- the workload


SCHEMA_ADDMM = ("aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) "
                "-> Tensor")
SCHEMA_MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
SCHEMA_FILL = "aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)"
SCHEMA_ZERO = "aten::zero_(Tensor(a!) self) -> Tensor(a!)"
SCHEMA_ADD_ = "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"
SCHEMA_T = "aten::t(Tensor(a) self) -> Tensor(a)"
SCHEMA_TRANSPOSE = "aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)"
SCHEMA_AS_STRIDED = ("aten::as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, "
                     "SymInt? storage_offset=None) -> Tensor(a)")


def _linear(tl: Timeline, x: Tensor, weight: Tensor, bias: Tensor, api: str, kernel: str,
            seq_id: int) -> tuple[Tensor, CpuOp]:
    """aten::linear -> aten::t -> aten::transpose -> aten::as_strided, then aten::addmm with one launch.

    Returns the output tensor and the addmm op."""
    out = Tensor((x.shape[0], weight.shape[0]))
    weight_t = Tensor((weight.shape[1], weight.shape[0]), view_of=weight)
    with tl.op(1, "aten::linear", inputs=[tensor(x), tensor(weight), tensor(bias)], outputs=[tensor(out)],
               op_schema="aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", seq_id=-1):
        with tl.op(1, "aten::t", inputs=[tensor(weight)], outputs=[tensor(weight_t)], op_schema=SCHEMA_T,
                   seq_id=seq_id):
            with tl.op(1, "aten::transpose", inputs=[tensor(weight), scalar("Int", 0), scalar("Int", 1)],
                       outputs=[tensor(weight_t)], op_schema=SCHEMA_TRANSPOSE, seq_id=seq_id):
                tl.leaf(1, "aten::as_strided", inputs=[tensor(weight), int_list(list(weight_t.shape)),
                                                      int_list([1, weight.shape[1]]), scalar("None", "<None>")],
                        outputs=[tensor(weight_t)], op_schema=SCHEMA_AS_STRIDED)
        with tl.op(1, "aten::addmm", inputs=[tensor(bias), tensor(x), tensor(weight_t), scalar("Int", 1),
                                              scalar("Int", 1)],
                   outputs=[tensor(out)], op_schema=SCHEMA_ADDMM, seq_id=seq_id + 1) as addmm:
            tl.launch(1, api, "kernel", kernel, args=_kernel_args(tl.rng, [4, 4, 1], [128, 1, 1]))
    return out, addmm


def _kernel_args(rng: random.Random, grid: list[int], block: list[int]) -> dict:
    """Kineto's per-kernel launch details (values drawn from ``rng``)."""
    return {"queued": 0, "registers per thread": rng.choice([32, 64, 72, 96]),
            "shared memory": rng.choice([0, 4096, 8704]), "blocks per SM": round(grid[0] * grid[1] / 108, 6),
            "warps per SM": round(grid[0] * block[0] / 32 / 108, 6), "grid": grid, "block": block,
            "est. achieved occupancy %": rng.randint(1, 30)}


def _kernel(tl: Timeline, thread: int, name: str, blocks: int, link: str = "correlation") -> GpuOp:
    """cudaLaunchKernel of a 1-D kernel with 128-thread blocks on the compute stream."""
    return tl.launch(thread, "cudaLaunchKernel", "kernel", name, link=link,
                     args=_kernel_args(tl.rng, [blocks, 1, 1], [128, 1, 1]))


def _collective(tl: Timeline, thread: int, wrapper: str, annotation: str, comm: CommInfo, data: Tensor,
                kernel: str, wait_event: bool) -> GpuOp:
    """c10d wrapper -> record_param_comms -> nccl:* (user annotation) launching one NCCL kernel on NCCL_STREAM."""
    payload = tensor_list([data]) if comm.collective == "allreduce" else tensor(data)
    comm_inputs = [payload, scalar("Int", 17 + len(tl.gpu_ops)), scalar("Int", 94211683418112), scalar("Int", 0),
                   scalar("String", comm.collective), int_list(comm.in_splits), int_list(comm.out_splits)]
    with tl.op(thread, wrapper, inputs=[payload], outputs=[payload]):
        with tl.op(thread, "record_param_comms", inputs=comm_inputs, outputs=[payload], comm=comm):
            with tl.op(thread, annotation, cat="user_annotation", scope=7, inputs=[tensor(data)]):
                if wait_event:
                    tl.runtime_call(thread, "cudaStreamWaitEvent")
                return tl.launch(thread, "cudaLaunchKernel", "kernel", kernel, stream=NCCL_STREAM,
                                 args=_kernel_args(tl.rng, [2, 1, 1], [640, 1, 1]))


def build_workload(seed: int, start_ns: int, steps: int = 1) -> Workload:
    """Lay out ``steps`` training steps (see module docstring). Deterministic in ``seed``."""
    rng = random.Random(seed)
    tl = Timeline(rng, start_ns)
    batch, width, classes = 32, 64, 16
    w1, b1, w2, b2 = Tensor((width, width)), Tensor((width,)), Tensor((classes, width)), Tensor((classes,))
    g1, g2 = Tensor((width, width)), Tensor((classes, width))
    host_x = Tensor((batch, width), device="cpu")
    x, target = Tensor((batch, width)), Tensor((batch, classes))

    with tl.op(1, "## process_group:init ##", cat="user_annotation", scope=7, in_kineto=False,
               inputs=[scalar("String", json.dumps(PG_CONFIG))]):
        pass
    # Kernel launched before the window opened: no launch in the trace (must stay unattributed).
    tl.gpu_op("kernel", KERNEL_STRAGGLER, COMPUTE_STREAM, tl.now[1] + 2000, next(tl.correlations), "none",
              _kernel_args(rng, [1, 1, 1], [128, 1, 1]))

    for step in range(steps):
        with tl.op(1, f"ProfilerStep#{3 + step}", cat="user_annotation", scope=7, in_et=False):
            with tl.op(1, "## zero_grad ##", cat="user_annotation", scope=7):
                for grad in (g1, g2):
                    with tl.op(1, "aten::zero_", inputs=[tensor(grad)], outputs=[tensor(grad)], op_schema=SCHEMA_ZERO):
                        with tl.op(1, "aten::fill_", inputs=[tensor(grad), scalar("Int", 0)], outputs=[tensor(grad)],
                                   op_schema=SCHEMA_FILL):
                            _kernel(tl, 1, KERNEL_FILL, 8)
            with tl.op(1, "## copy_batch_to_gpu ##", cat="user_annotation", scope=7):
                with tl.op(1, "aten::to", inputs=[tensor(host_x), scalar("Device", "cuda:0"), scalar("Bool", True)],
                           outputs=[tensor(x)]):
                    with tl.op(1, "aten::_to_copy", inputs=[tensor(host_x)], outputs=[tensor(x)]):
                        tl.leaf(1, "aten::empty_strided", inputs=[int_list(list(x.shape)), int_list([width, 1])],
                                outputs=[tensor(x)])
                        with tl.op(1, "aten::copy_", inputs=[tensor(x), tensor(host_x), scalar("Bool", True)],
                                   outputs=[tensor(x)]):
                            tl.launch(1, "cudaMemcpyAsync", "gpu_memcpy", MEMCPY_H2D,
                                      args={"bytes": x.numel * 4, "memory bandwidth (GB/s)": 3.7})
                with tl.op(1, "aten::zeros", inputs=[int_list(list(target.shape))], outputs=[tensor(target)]):
                    tl.leaf(1, "aten::empty", inputs=[int_list(list(target.shape))], outputs=[tensor(target)])
                    with tl.op(1, "aten::zero_", inputs=[tensor(target)], outputs=[tensor(target)], op_schema=SCHEMA_ZERO):
                        tl.launch(1, "cudaMemsetAsync", "gpu_memset", MEMSET,
                                  args={"bytes": target.numel * 4, "memory bandwidth (GB/s)": 1.9})
            with tl.op(1, "## forward ##", cat="user_annotation", scope=7):
                hidden, _ = _linear(tl, x, w1, b1, "cudaLaunchKernelExC", KERNEL_SGEMM, seq_id=40)
                activated = Tensor(hidden.shape)
                with tl.op(1, "aten::relu", inputs=[tensor(hidden)], outputs=[tensor(activated)], seq_id=42):
                    with tl.op(1, "aten::clamp_min", inputs=[tensor(hidden), scalar("Int", 0)],
                               outputs=[tensor(activated)]):
                        tl.launch(1, "cuLaunchKernel", "kernel", KERNEL_CLAMP,
                                  args=_kernel_args(rng, [16, 1, 1], [128, 1, 1]))
                exchanged = Tensor(activated.shape)
                with tl.op(1, "## alltoall_fwd ##", cat="user_annotation", scope=7):
                    _collective(tl, 1, "c10d::alltoall_base_", "nccl:all_to_all",
                                CommInfo("all_to_allv", activated.numel, [batch // 2] * 2, [batch // 2] * 2),
                                activated, KERNEL_SEND_RECV, wait_event=True)
                logits, addmm = _linear(tl, exchanged, w2, b2, "cudaLaunchKernel", KERNEL_SGEMM_NN, seq_id=43)
                scaled = Tensor(logits.shape)
                with tl.op(1, "aten::mul", inputs=[tensor(logits), scalar("Double", 0.5)], outputs=[tensor(scaled)],
                           seq_id=45) as mul:
                    _kernel(tl, 1, KERNEL_MUL, 4, link="external_id")
                loss, diff = Tensor(()), Tensor(scaled.shape)
                with tl.op(1, "aten::mse_loss", inputs=[tensor(scaled), tensor(target), scalar("Int", 1)],
                           outputs=[tensor(loss)], seq_id=46) as mse:
                    with tl.op(1, "aten::sub", inputs=[tensor(scaled), tensor(target)], outputs=[tensor(diff)]):
                        _kernel(tl, 1, KERNEL_SUB, 4)
                    with tl.op(1, "aten::pow", inputs=[tensor(diff), scalar("Int", 2)], outputs=[tensor(diff)]):
                        _kernel(tl, 1, KERNEL_POW, 4)
                    with tl.op(1, "aten::mean", inputs=[tensor(diff)], outputs=[tensor(loss)]):
                        tl.launch(1, "cudaLaunchKernel", "kernel", KERNEL_MEAN, link="ac2g",
                                  args=_kernel_args(rng, [1, 1, 1], [512, 1, 1]))
            with tl.op(1, "## backward ##", cat="user_annotation", scope=7) as backward:
                grad_loss = Tensor(())
                with tl.op(1, "aten::ones_like", inputs=[tensor(loss)], outputs=[tensor(grad_loss)]):
                    tl.leaf(1, "aten::empty_like", inputs=[tensor(loss)], outputs=[tensor(grad_loss)])
                    with tl.op(1, "aten::fill_", inputs=[tensor(grad_loss), scalar("Int", 1)], outputs=[tensor(grad_loss)],
                               op_schema=SCHEMA_FILL):
                        _kernel(tl, 1, KERNEL_FILL, 1)
                tl.fork(2, 1)
                _backward_thread(tl, backward, (mse, mul, addmm), grads=(g1, g2), diff=diff)
                tl.join(1, 2)
                tl.runtime_call(1, "cudaEventQuery")
            with tl.op(1, "## optimizer ##", cat="user_annotation", scope=7):
                with tl.op(1, "Optimizer.step#SGD.step", cat="user_annotation", scope=7):
                    for weight, grad in ((w1, g1), (w2, g2)):
                        with tl.op(1, "aten::add_", inputs=[tensor(weight), tensor(grad), scalar("Double", -0.01)],
                                   outputs=[tensor(weight)], op_schema=SCHEMA_ADD_):
                            _kernel(tl, 1, KERNEL_ADD, 8)
    end_ns = max(max(op.ts_ns + op.dur_ns for op in tl.ops), max(g.ts_ns + g.dur_ns for g in tl.gpu_ops))
    return Workload(ops=tl.ops, calls=tl.calls, gpu_ops=tl.gpu_ops, start_ns=start_ns, end_ns=end_ns)


def _backward_thread(tl: Timeline, backward: CpuOp, forward_ops: tuple[CpuOp, CpuOp, CpuOp],
                     grads: tuple[Tensor, Tensor], diff: Tensor) -> None:
    """Autograd thread 2: backward functions, gradient accumulation, then the gradient all_reduce.

    Every op it opens gets fw_tid 1 and fw_parent = the main thread's ``## backward ##`` node."""
    mse, mul, addmm = forward_ops
    grad_out = Tensor(diff.shape)
    first_op = len(tl.ops)

    def backward_function(name: str, forward_op: CpuOp, kernels: list[tuple[str, str]]) -> None:
        with tl.op(2, f"autograd::engine::evaluate_function: {name}", seq_id=forward_op.seq_id,
                   forward_of=forward_op):
            with tl.op(2, name, seq_id=forward_op.seq_id, inputs=[tensor(grad_out)], outputs=[tensor(grad_out)]):
                for op_name, kernel in kernels:
                    with tl.op(2, op_name, inputs=[tensor(grad_out), tensor(diff)], outputs=[tensor(grad_out)]):
                        _kernel(tl, 2, kernel, 4)

    backward_function("MseLossBackward0", mse, [("aten::mse_loss_backward", KERNEL_MSE_BWD)])
    backward_function("MulBackward0", mul, [("aten::mul", KERNEL_MUL)])
    backward_function("AddmmBackward0", addmm, [("aten::mm", KERNEL_SGEMM_NN), ("aten::mm", KERNEL_SGEMM)])
    for grad in grads:
        with tl.op(2, "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"):
            with tl.op(2, "torch::autograd::AccumulateGrad", inputs=[tensor(grad)]):
                with tl.op(2, "aten::add_", inputs=[tensor(grad), tensor(grad_out), scalar("Int", 1)],
                           outputs=[tensor(grad)], op_schema=SCHEMA_ADD_):
                    _kernel(tl, 2, KERNEL_ADD, 8)
    flat = Tensor((grads[0].numel + grads[1].numel,))
    _collective(tl, 2, "c10d::allreduce_", "nccl:all_reduce", CommInfo("allreduce", flat.numel), flat,
                KERNEL_ALL_REDUCE, wait_event=False)
    for op in tl.ops[first_op:]:
        op.fw_parent_op, op.fw_tid = backward, 1


# --------------------------------------------------------------------------- ids


def assign_ids(workload: Workload) -> None:
    """Give ET node/tensor ids (one shared counter, start order), rf_ids and Kineto External ids.

    Thread roots get their id when the thread's first ET op starts. O(ops log ops).
    """
    counter = itertools.count(2)  # 1 is the process root
    rf_ids, external_ids = itertools.count(1), itertools.count(1)
    for op in sorted(workload.ops, key=lambda o: o.ts_ns):
        op.rf_id = next(rf_ids)
        if op.in_kineto:
            op.external_id = next(external_ids)
        if not op.in_et:
            continue
        if op.thread not in workload.thread_roots:
            workload.thread_roots[op.thread] = next(counter)
        op.et_id = next(counter)
        for arg in op.inputs + op.outputs:
            for t in _tensors_of(arg):
                _assign_tensor_ids(t, counter)
    for op in workload.ops:
        op.fw_parent = op.fw_parent_op.et_id if op.fw_parent_op is not None else 0


def _tensors_of(arg: Arg) -> list[Tensor]:
    if isinstance(arg.value, Tensor):
        return [arg.value]
    if isinstance(arg.value, list) and arg.value and isinstance(arg.value[0], Tensor):
        return list(arg.value)
    return []


def _assign_tensor_ids(t: Tensor, counter: Iterator[int]) -> None:
    if t.tensor_id is not None:
        return
    t.tensor_id = next(counter)
    if t.view_of is not None:
        _assign_tensor_ids(t.view_of, counter)
        t.storage_id = t.view_of.storage_id
    else:
        t.storage_id = next(counter)


def et_parent_id(op: CpuOp, thread_roots: dict[int, int]) -> int:
    """Nearest ancestor that is in the ET, else the thread root."""
    ancestor = op.parent
    while ancestor is not None and not ancestor.in_et:
        ancestor = ancestor.parent
    return ancestor.et_id if ancestor is not None else thread_roots[op.thread]


# --------------------------------------------------------------------------- ET emission


def _encode_value(arg: Arg) -> Any:
    def enc(t: Tensor) -> list:
        return [t.tensor_id, t.storage_id, 0, t.numel, t.itemsize, t.device]

    if isinstance(arg.value, Tensor):
        return enc(arg.value)
    if _tensors_of(arg):
        return [enc(t) for t in arg.value]
    return arg.value


def _encode_shape(arg: Arg) -> Any:
    if isinstance(arg.value, Tensor):
        return list(arg.value.shape)
    if _tensors_of(arg):
        return [list(t.shape) for t in arg.value]
    if isinstance(arg.value, list):
        return [[] for _ in arg.value]
    return []


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return list(reversed(strides))


def _encode_strides(arg: Arg) -> Any:
    if isinstance(arg.value, Tensor):
        return _strides(arg.value.shape)
    if _tensors_of(arg):
        return [_strides(t.shape) for t in arg.value]
    return _encode_shape(arg)


def _root_names(layout: str) -> tuple[str, str]:
    word = "execution_graph" if layout == "flat" else "execution_trace"
    return f"[pytorch|profiler|{word}|process]", f"[pytorch|profiler|{word}|thread]"


@dataclass
class EtRecord:
    """Layout-neutral content of one ET node."""

    node_id: int
    name: str
    parent: int
    rf_id: int
    scope: int
    tid: int
    fw_parent: int = 0
    seq_id: int = -1
    fw_tid: int = 0
    op_schema: str = ""
    inputs: list[Arg] = field(default_factory=list)
    outputs: list[Arg] = field(default_factory=list)
    comm: CommInfo | None = None


def _flat_node(r: EtRecord) -> dict:
    return {"name": r.name, "id": r.node_id, "rf_id": r.rf_id, "parent": r.parent, "fw_parent": r.fw_parent,
            "seq_id": r.seq_id, "scope": r.scope, "tid": r.tid, "fw_tid": r.fw_tid, "op_schema": r.op_schema,
            "inputs": [_encode_value(a) for a in r.inputs], "input_shapes": [_encode_shape(a) for a in r.inputs],
            "input_types": [a.type_name for a in r.inputs], "outputs": [_encode_value(a) for a in r.outputs],
            "output_shapes": [_encode_shape(a) for a in r.outputs], "output_types": [a.type_name for a in r.outputs]}


def _comm_attrs(comm: CommInfo) -> list[dict]:
    pg = PG_CONFIG[0]
    values = [("rank", "int64", 0), ("pg_name", "string", pg["pg_name"]), ("pg_desc", "string", pg["pg_desc"]),
              ("collective_name", "string", comm.collective), ("dtype", "string", "Float"),
              ("in_msg_nelems", "int64", comm.nelems), ("out_msg_nelems", "int64", comm.nelems),
              ("in_split_size", "string", json.dumps(comm.in_splits)),
              ("out_split_size", "string", json.dumps(comm.out_splits)),
              ("global_rank_start", "int64", 0), ("global_rank_stride", "int64", 1),
              ("pg_size", "int64", pg["pg_size"])]
    return [{"name": n, "type": t, "value": v} for n, t, v in values]


def _nested_node(r: EtRecord) -> dict:
    def io(args: list[Arg]) -> dict:
        return {"values": [_encode_value(a) for a in args], "shapes": [_encode_shape(a) for a in args],
                "types": [a.type_name for a in args], "strides": [_encode_strides(a) for a in args]}

    attrs = [("rf_id", "uint64", r.rf_id), ("fw_parent", "uint64", r.fw_parent), ("seq_id", "int64", r.seq_id),
             ("scope", "uint64", r.scope), ("tid", "uint64", r.tid), ("fw_tid", "uint64", r.fw_tid),
             ("op_schema", "string", r.op_schema), ("kernel_backend", "string", ""), ("kernel_file", "string", ""),
             ("tensor_range", "string", "")]
    attr_list = [{"name": n, "type": t, "value": v} for n, t, v in attrs]
    if r.comm is not None:
        attr_list += _comm_attrs(r.comm)
    return {"id": r.node_id, "name": r.name, "ctrl_deps": r.parent, "inputs": io(r.inputs), "outputs": io(r.outputs),
            "attrs": attr_list}


def et_records(workload: Workload, layout: str) -> list[EtRecord]:
    """ET nodes in file order: completion order, each thread root just before its thread's first
    completed op, the process root last. O(ops log ops)."""
    process_name, thread_name = _root_names(layout)
    records: list[EtRecord] = []
    written_roots: set[int] = set()
    for op in sorted((o for o in workload.ops if o.in_et), key=lambda o: o.ts_ns + o.dur_ns):
        if op.thread not in written_roots:
            written_roots.add(op.thread)
            records.append(EtRecord(workload.thread_roots[op.thread], thread_name, 1, 0, 7, op.thread))
        records.append(EtRecord(op.et_id, op.name, et_parent_id(op, workload.thread_roots), op.rf_id, op.scope,
                                op.thread, op.fw_parent, op.seq_id, op.fw_tid, op.op_schema, op.inputs, op.outputs,
                                op.comm))
    records.append(EtRecord(1, process_name, 1, 0, 7, 0))
    return records


def make_et(workload: Workload, dialect: Dialect) -> dict:
    """The ET document; ``start_ts``/``finish_ts`` are monotonic ms like the real files'."""
    to_node = _flat_node if dialect.et_layout == "flat" else _nested_node
    start_ms = workload.start_ns // 1_000_000 % 10_000_000
    return {"schema": dialect.et_schema, "pid": PID, "time": dialect.time_text, "start_ts": start_ms,
            "nodes": [to_node(r) for r in et_records(workload, dialect.et_layout)],
            "finish_ts": start_ms + (workload.end_ns - workload.start_ns) // 1_000_000 + 1}


# --------------------------------------------------------------------------- Kineto emission


@dataclass
class Dialect:
    """What differs between the two generated pairs."""

    name: str
    et_schema: str
    et_layout: str  # "flat" or "nested"
    float_times: bool  # PyTorch 2.2+: float µs with ns fractions; 2.0: int µs
    record_function_ids: bool
    gpu_external_id_from_cpu_op: bool
    start_ns: int
    time_text: str


DIALECTS = [
    Dialect("gpu_v101", "1.0.1", "flat", False, False, False, 1_694_200_123_456_789_012, "2023-09-08 19:06:40"),
    Dialect("gpu_v111", "1.1.1-chakra.0.0.4", "nested", True, True, True, 3_141_592_653_589_793, "2026-03-14 15:09:26"),
]


class KinetoTimes:
    """Converts ns to the dialect's µs values: floats with 3 decimals, or floor to int (nesting-safe)."""

    def __init__(self, float_times: bool):
        self.float_times = float_times

    def ts(self, ns: int) -> float | int:
        return round(ns / 1000, 3) if self.float_times else ns // 1000

    def dur(self, ts_ns: int, dur_ns: int) -> float | int:
        if self.float_times:
            return round(dur_ns / 1000, 3)
        return (ts_ns + dur_ns) // 1000 - ts_ns // 1000


def _cpu_event_args(op: CpuOp, dialect: Dialect, ev_idx: int) -> dict:
    args: dict[str, Any] = {"External id": op.external_id}
    if dialect.record_function_ids:
        args["Record function id"] = op.rf_id
    args["Ev Idx"] = ev_idx
    if op.seq_id >= 0:
        args["Sequence number"] = op.seq_id
        args["Fwd thread id"] = 1 if op.thread == 2 else 0
    if op.inputs:
        if dialect.record_function_ids:
            args["Concrete Inputs"] = ["" if _tensors_of(a) else str(a.value) for a in op.inputs]
        args["Input type"] = [a.kineto_type for a in op.inputs]
        args["Input Dims"] = [list(a.value.shape) if isinstance(a.value, Tensor) else [] for a in op.inputs]
    if op.comm is not None and dialect.record_function_ids:
        args.update(_comm_kineto_args(op.comm))
    return args


def _comm_kineto_args(comm: CommInfo) -> dict:
    pg = PG_CONFIG[0]
    return {"Collective name": comm.collective, "dtype": "Float", "In msg nelems": comm.nelems,
            "Out msg nelems": comm.nelems, "Group size": pg["pg_size"], "In split size": json.dumps(comm.in_splits),
            "Out split size": json.dumps(comm.out_splits), "Process Group Name": pg["pg_name"],
            "Process Group Description": pg["pg_desc"], "Process Group Ranks": json.dumps(pg["ranks"])}


def _cpu_events(workload: Workload, dialect: Dialect, times: KinetoTimes) -> list[dict]:
    """cpu_op + user_annotation events. 2.0 style lists the autograd thread first; 2.2+ by start time."""
    ops = [o for o in workload.ops if o.in_kineto]
    ordered = sorted(ops, key=lambda o: (o.ts_ns,) if dialect.float_times else (o.thread != 2, o.ts_ns))
    return [{"ph": "X", "cat": op.cat, "name": op.name, "pid": PID, "tid": OS_TID[op.thread],
             "ts": times.ts(op.ts_ns), "dur": times.dur(op.ts_ns, op.dur_ns),
             "args": _cpu_event_args(op, dialect, index)} for index, op in enumerate(ordered)]


def _gpu_external_id(gpu: GpuOp, dialect: Dialect) -> int:
    """External id written on a GPU op (see module docstring for the per-dialect rule)."""
    launch = gpu.launch
    if dialect.gpu_external_id_from_cpu_op:
        if gpu.link in ("correlation", "external_id") and launch is not None:
            return launch.enclosing.external_id
        return 0
    if gpu.link == "external_id" and launch is not None:
        return launch.correlation
    return gpu.correlation


def _runtime_events(workload: Workload, dialect: Dialect, times: KinetoTimes) -> list[dict]:
    """Runtime/driver calls with their ac2g flow starts (and the 2.0 quirk: an 'f' on non-launch calls)."""
    events = []
    for call in workload.calls:
        external_id = call.enclosing.external_id if dialect.gpu_external_id_from_cpu_op else call.correlation
        events.append({"ph": "X", "cat": call.cat, "name": call.name, "pid": PID, "tid": OS_TID[call.thread],
                       "ts": times.ts(call.ts_ns), "dur": times.dur(call.ts_ns, call.dur_ns),
                       "args": {"External id": external_id, "cbid": CBID[call.name], "correlation": call.correlation}})
        flow = {"id": call.correlation, "pid": PID, "tid": OS_TID[call.thread], "ts": times.ts(call.ts_ns),
                "cat": "ac2g", "name": "ac2g"}
        if call.gpu_op is None and not dialect.float_times:
            events.append({"ph": "f", **flow, "bp": "e"})
        elif call.gpu_op is not None and call.gpu_op.link in ("correlation", "ac2g"):
            flow["id"] = call.gpu_op.correlation
            events.append({"ph": "s", **flow})
    return events


def _gpu_events(workload: Workload, dialect: Dialect, times: KinetoTimes) -> list[dict]:
    events = []
    for gpu in sorted(workload.gpu_ops, key=lambda g: (g.stream, g.ts_ns)):
        args = {"External id": _gpu_external_id(gpu, dialect), "device": DEVICE, "context": 1, "stream": gpu.stream,
                "correlation": gpu.correlation}
        args.update(gpu.args)
        if dialect.record_function_ids and gpu.name.startswith("nccl") and gpu.launch is not None:
            comm_op = gpu.launch.enclosing.parent
            if comm_op is not None and comm_op.comm is not None:
                args.update(_comm_kineto_args(comm_op.comm))
        events.append({"ph": "X", "cat": gpu.cat, "name": gpu.name, "pid": DEVICE, "tid": gpu.stream,
                       "ts": times.ts(gpu.ts_ns), "dur": times.dur(gpu.ts_ns, gpu.dur_ns), "args": args})
        if gpu.link in ("correlation", "ac2g"):
            events.append({"ph": "f", "id": gpu.correlation, "pid": DEVICE, "tid": gpu.stream,
                           "ts": times.ts(gpu.ts_ns), "cat": "ac2g", "name": "ac2g", "bp": "e"})
    return events


def _fwdbwd_events(workload: Workload, times: KinetoTimes) -> list[dict]:
    """fwdbwd flows (2.2+ style only): forward op -> its backward evaluate_function."""
    events, flow_ids = [], itertools.count(1)
    for op in workload.ops:
        if op.forward_of is not None:
            flow_id, fwd = next(flow_ids), op.forward_of
            events.append({"ph": "s", "id": flow_id, "pid": PID, "tid": OS_TID[fwd.thread], "ts": times.ts(fwd.ts_ns),
                           "cat": "fwdbwd", "name": "fwdbwd"})
            events.append({"ph": "f", "id": flow_id, "pid": PID, "tid": OS_TID[op.thread], "ts": times.ts(op.ts_ns),
                           "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"})
    return events


def _metadata_events(workload: Workload, times: KinetoTimes) -> list[dict]:
    ts = times.ts(workload.start_ns - 50_000)
    events = [{"name": "process_name", "ph": "M", "ts": ts, "pid": PID, "tid": 0, "args": {"name": "python3"}},
              {"name": "process_labels", "ph": "M", "ts": ts, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
              {"name": "process_sort_index", "ph": "M", "ts": ts, "pid": PID, "tid": 0, "args": {"sort_index": PID}},
              {"name": "process_name", "ph": "M", "ts": ts, "pid": DEVICE, "tid": 0, "args": {"name": "python3"}},
              {"name": "process_labels", "ph": "M", "ts": ts, "pid": DEVICE, "tid": 0, "args": {"labels": "GPU 0"}},
              {"name": "process_sort_index", "ph": "M", "ts": ts, "pid": DEVICE, "tid": 0,
               "args": {"sort_index": 16777216}}]
    for os_tid in OS_TID.values():
        events.append({"name": "thread_name", "ph": "M", "ts": ts, "pid": PID, "tid": os_tid,
                       "args": {"name": f"thread {os_tid} (python3)"}})
        events.append({"name": "thread_sort_index", "ph": "M", "ts": ts, "pid": PID, "tid": os_tid,
                       "args": {"sort_index": os_tid}})
    for stream in (COMPUTE_STREAM, NCCL_STREAM):
        events.append({"name": "thread_name", "ph": "M", "ts": ts, "pid": DEVICE, "tid": stream,
                       "args": {"name": f"stream {stream} "}})
        events.append({"name": "thread_sort_index", "ph": "M", "ts": ts, "pid": DEVICE, "tid": stream,
                       "args": {"sort_index": stream}})
    return events


def _span_events(workload: Workload, times: KinetoTimes) -> list[dict]:
    start, end = workload.start_ns - 40_000, workload.end_ns + 40_000
    return [{"ph": "X", "cat": "Trace", "ts": times.ts(start), "dur": times.dur(start, end - start), "pid": "Spans",
             "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
            {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
             "tid": "Trace PyTorch Profiler", "ts": times.ts(start)},
            {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": times.ts(end + 9000)}]


DEVICE_PROPERTIES = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912, "computeMajor": 9,
                      "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                      "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
                      "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472, "numSms": 132,
                      "sharedMemPerBlockOptin": 232448}]


def make_kineto(workload: Workload, dialect: Dialect) -> dict:
    times = KinetoTimes(dialect.float_times)
    cpu = _cpu_events(workload, dialect, times)
    runtime, gpu = _runtime_events(workload, dialect, times), _gpu_events(workload, dialect, times)
    meta, spans = _metadata_events(workload, times), _span_events(workload, times)
    trace = {"schemaVersion": 1, "deviceProperties": DEVICE_PROPERTIES,
             "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, "record_shapes": 1}
    if dialect.float_times:
        trace.update({"trace_id": "5EB1A6F3C0DE4A21B7D9E8F6A5C4B3D2", "displayTimeUnit": "ms",
                      "baseTimeNanoseconds": 1_773_500_000_000_000_000})
        host = sorted(cpu + runtime, key=lambda e: e["ts"])
        trace["traceEvents"] = meta + host + gpu + _fwdbwd_events(workload, times) + spans
    else:
        trace["traceEvents"] = cpu + runtime + gpu + meta + spans
    trace["traceName"] = f"./traces/{dialect.name}/rank0.pt.trace.json"
    return trace


# --------------------------------------------------------------------------- truth


def make_truth(workload: Workload, dialect: Dialect, et: dict, kineto: dict) -> dict:
    """Ground truth for one pair (see module docstring). O(ops + gpu ops)."""
    times = KinetoTimes(dialect.float_times)
    cpu = [{"tid": OS_TID[op.thread], "ts": times.ts(op.ts_ns), "name": op.name, "et_id": op.et_id}
           for op in sorted((o for o in workload.ops if o.in_kineto), key=lambda o: (o.thread, o.ts_ns))]
    gpu = []
    for g in sorted(workload.gpu_ops, key=lambda g: g.correlation):
        launcher = g.launch.enclosing if g.launch is not None and g.link != "none" else None
        gpu.append({"correlation": g.correlation, "cat": g.cat, "name": g.name, "stream": g.stream,
                    "ts": times.ts(g.ts_ns), "link": g.link, "et_id": launcher.et_id if launcher else None,
                    "launch": g.launch.name if g.launch is not None else None})
    by_link: dict[str, int] = {}
    for entry in gpu:
        by_link[entry["link"]] = by_link.get(entry["link"], 0) + 1
    events = kineto["traceEvents"]
    counts = {"et_nodes": len(et["nodes"]), "et_ops": sum(1 for o in workload.ops if o.in_et),
              "kineto_events": len(events), "kineto_cpu_events": len(cpu),
              "kineto_cpu_events_in_et": sum(1 for c in cpu if c["et_id"] is not None),
              "gpu_ops": len(gpu), "kernels": sum(1 for g in gpu if g["cat"] == "kernel"),
              "gpu_memcpy": sum(1 for g in gpu if g["cat"] == "gpu_memcpy"),
              "gpu_memset": sum(1 for g in gpu if g["cat"] == "gpu_memset"),
              "gpu_ops_attributed": sum(1 for g in gpu if g["et_id"] is not None),
              "gpu_ops_unattributed": sum(1 for g in gpu if g["et_id"] is None),
              "gpu_ops_by_link": dict(sorted(by_link.items())),
              "runtime_calls": len(workload.calls), "cpu_threads": len(OS_TID), "streams": 2}
    return {"pair": dialect.name, "et_schema": dialect.et_schema, "pid": PID, "cpu_events": cpu, "gpu_ops": gpu,
            "counts": counts}


# --------------------------------------------------------------------------- main


def write_json_gz(obj: dict, path: Path) -> None:
    """gzip with mtime 0 so the bytes depend only on the content."""
    data = json.dumps(obj).encode()
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
        handle.write(data)


def make_pair(dialect: Dialect, seed: int, steps: int = 1) -> tuple[dict, dict, dict]:
    """Build the workload for one dialect and return (et, kineto, truth)."""
    workload = build_workload(seed, dialect.start_ns, steps)
    assign_ids(workload)
    et, kineto = make_et(workload, dialect), make_kineto(workload, dialect)
    return et, kineto, make_truth(workload, dialect, et, kineto)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gpu")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1,
                        help="training steps (the fixtures have 1; many make a large GPU pair for benchmarks)")
    args = parser.parse_args(argv)
    for dialect in DIALECTS:
        et, kineto, truth = make_pair(dialect, args.seed, args.steps)
        out = args.out / dialect.name
        out.mkdir(parents=True, exist_ok=True)
        write_json_gz(et, out / "et.json.gz")
        write_json_gz(kineto, out / "kineto.json.gz")
        (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
        print(dialect.name, json.dumps(truth["counts"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

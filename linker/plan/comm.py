"""Communication attributes of NCCL/RCCL kernels, for both outputs (``.et`` and ET+ JSON) and
the cross-rank check.

What a communication kernel is (collective type from the kernel name or the launching
``nccl:*`` / ``record_param_comms`` / ``c10d::*`` ops, send / recv), how many bytes it moves
(the collective op's input tensors, else Kineto "In msg nelems" × dtype size), its element type
when known, its process group and, for point-to-point, its peer as a global rank:
- NCCL/RCCL collective kernels: ``COMM_COLL_NODE`` with ``comm_type`` (from the kernel name, e.g.
  ``ncclKernel_AllReduce_…``; for ``SendRecv`` / generic kernels from the launching ``nccl:*`` op,
  its ``record_param_comms`` collective name, its ``c10d::*`` op, or Kineto's "Collective name"),
  ``comm_size`` (bytes of the collective op's input tensors, else Kineto "In msg nelems" × dtype
  size) and ``pg_name``: the job-wide group id, PyTorch's numeric group name + 1 (Kineto "Process
  Group Name", record_param_comms' pg name, mapped through ``## process_group:init ##`` when it is a
  description; the world group "0" -> "1" when the trace does not say; see below);
- ``SendRecv`` kernels under a send / recv op: ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with the peer
  (``comm_dst`` / ``comm_src``: the rank argument of record_param_comms, mapped to a global rank
  through the process group's ranks when known), this rank on the other side when Kineto names it,
  ``comm_tag`` when the ``c10d::send``/``recv`` op carries one, and ``comm_size``.
A kernel whose kind, size or peer cannot be determined resolves to ``COMP_NODE`` with a
``problem`` (the writers keep its duration and count it), never an invented value.

Process-group numbering (the ``pg_name`` written to ``.et`` files and the ids of a job's
``comm_groups.json``): **job id = PyTorch's numeric pg_name + 1**, so the default (world) group
"0" is "1". PyTorch names groups "0", "1", … in creation order, and group creation is collective,
so the numbering is the same on every rank without looking at the other ranks; ids start at 1 as
ASTRA-sim's communicator groups require. A group named by its description is mapped to its
numeric name through ``## process_group:init ##`` first; a kernel whose trace names no group
(PyTorch 2.0 traces) is in the world group.
Cost: per kernel O(depth of the launching ops) plus one parse of their inputs.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from linker.model import chakra_kinds as kinds
from linker.read.et import FLAT, EtNode
from linker.link.etplus import EtPlus, GpuNode

PROCESS_GROUP_INIT = "## process_group:init ##"
PARAM_COMMS_NAME = "record_param_comms"
# How far above the launching op the collective's nccl:* / record_param_comms / c10d:: ops are looked for.
MAX_COMM_ANCESTORS = 4
NO_NODE = -1
# PyTorch's default process group and its job-wide id (see the module docstring).
PYTORCH_WORLD_GROUP = "0"
WORLD_GROUP_ID = "1"

# ---------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------

COLL, SEND, RECV = "coll", "send", "recv"

# Normalised name fragment -> collective; longer/more specific fragments first.
_COLLECTIVE_FRAGMENTS = (
    ("alltoall", kinds.ALL_TO_ALL),
    ("allreduce", kinds.ALL_REDUCE),
    ("allgather", kinds.ALL_GATHER),
    ("reducescatter", kinds.REDUCE_SCATTER),
    ("broadcast", kinds.BROADCAST),
    ("bcast", kinds.BROADCAST),
    ("barrier", kinds.BARRIER),
    ("gather", kinds.GATHER),
    ("scatter", kinds.SCATTER),
    ("reduce", kinds.REDUCE),
)
_KERNEL_TOKEN = re.compile(r"kernel_([A-Za-z]+)", re.IGNORECASE)

# Bytes per element of the dtype names ET types ("Tensor(float)") and Kineto ("Float") use.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "c10::half": 2, "float16": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long int": 8, "long": 8, "int64": 8, "int": 4, "int32": 4,
    "short int": 2, "short": 2, "int16": 2, "signed char": 1, "char": 1, "int8": 1,
    "unsigned char": 1, "byte": 1, "uint8": 1, "bool": 1, "c10::complex<float>": 8,
    "complexfloat": 8, "c10::complex<double>": 16, "complexdouble": 16, "c10::complex<c10::half>": 4,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
_TENSOR_DTYPE = re.compile(r"Tensor\(([^)]*)\)")


@dataclass(frozen=True)
class CommKind:
    """What a communication kernel is: ``role`` COLL (with ``comm_type``), SEND or RECV."""

    role: str
    comm_type: int | None = None


_NAMES_CACHED = 4096  # distinct op / kernel names whose kind is remembered


def is_comm_kernel(node: GpuNode) -> bool:
    """True for NCCL / RCCL kernels (by name). O(len(name))."""
    if node.cat != "kernel":
        return False
    name = node.name.lower()
    return "nccl" in name or "rccl" in name


@functools.lru_cache(maxsize=_NAMES_CACHED)
def kind_from_name(name: str) -> CommKind | None:
    """The collective an op or collective name denotes ("nccl:all_to_all", "all_to_allv",
    "_allgather_base", "send", "c10d::recv_"...), or None. Send+recv together is ambiguous: None.
    Remembered per name (a trace repeats a few names thousands of times)."""
    base = name.split(":")[-1] if name.startswith(("nccl:", "rccl:", "gloo:")) else name
    letters = re.sub(r"[^a-z]", "", base.lower())
    has_send, has_recv = "send" in letters, "recv" in letters
    if has_send != has_recv:
        return CommKind(SEND if has_send else RECV)
    if has_send:
        return None
    for fragment, comm_type in _COLLECTIVE_FRAGMENTS:
        if fragment in letters:
            return CommKind(COLL, comm_type)
    return None


@functools.lru_cache(maxsize=_NAMES_CACHED)
def kind_from_kernel(name: str) -> CommKind | None:
    """The collective named by an NCCL kernel ("ncclKernel_AllReduce_RING_LL_Sum_float" ->
    ALL_REDUCE); None for SendRecv / generic kernels, whose meaning is the launching op's.
    Remembered per name."""
    match = _KERNEL_TOKEN.search(name)
    if match is None:
        return None
    kind = kind_from_name(match.group(1))
    return kind if kind is not None and kind.role == COLL else None


# ---------------------------------------------------------------------------------------------
# Tensor sizes
# ---------------------------------------------------------------------------------------------


@dataclass
class OpIO:
    """The decoded inputs (or outputs) of one ET op: parallel lists of values, shapes, types."""

    values: list
    shapes: list
    types: list


class IOParts(msgspec.Struct):
    """The nested-layout ``inputs``/``outputs`` object, its parts kept as raw JSON text."""

    values: msgspec.Raw = msgspec.Raw(b"[]")
    shapes: msgspec.Raw = msgspec.Raw(b"[]")
    types: msgspec.Raw = msgspec.Raw(b"[]")
    strides: msgspec.Raw = msgspec.Raw(b"")  # empty: absent


def _loads_list(raw: Any) -> list:
    if raw is None or raw is msgspec.UNSET:
        return []
    try:
        value = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def op_inputs(node: EtNode, layout: str) -> OpIO:
    """Decode an ET op's inputs (either layout). Cost: one JSON parse of the inputs."""
    if layout == FLAT:
        return OpIO(_loads_list(node.inputs), _loads_list(node.input_shapes), _loads_list(node.input_types))
    if node.inputs is msgspec.UNSET:
        return OpIO([], [], [])
    try:
        parsed = orjson.loads(bytes(node.inputs))
    except orjson.JSONDecodeError:
        return OpIO([], [], [])
    if not isinstance(parsed, dict):
        return OpIO([], [], [])
    return OpIO(*(parsed.get(key) if isinstance(parsed.get(key), list) else [] for key in ("values", "shapes", "types")))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tensor_bytes(value: Any, shape: Any, dtype: str | None) -> int | None:
    """Bytes of one ET tensor: numel × element size from its value tuple
    ``[tensor_id, storage_id, offset, numel, elem_bytes, device]``, else shape × dtype size."""
    if isinstance(value, list) and len(value) >= 5 and is_int(value[3]) and is_int(value[4]):
        return value[3] * value[4]
    size = DTYPE_BYTES.get((dtype or "").strip().lower())
    if size is None or not isinstance(shape, list) or not all(is_int(d) for d in shape):
        return None
    return math.prod(shape) * size


def tensors_bytes(io: OpIO) -> int | None:
    """Total bytes of the tensor (and tensor-list) entries of ``io``; None when it has none."""
    total, found = 0, False
    for position, type_name in enumerate(io.types):
        if not isinstance(type_name, str) or "Tensor" not in type_name:
            continue
        value = io.values[position] if position < len(io.values) else None
        shape = io.shapes[position] if position < len(io.shapes) else None
        dtypes = _TENSOR_DTYPE.findall(type_name) or [None]
        if type_name.startswith("Tensor"):
            items = [(value, shape, dtypes[0])]
        elif isinstance(value, list):
            shapes = shape if isinstance(shape, list) else []
            items = [(v, shapes[k] if k < len(shapes) else None, dtypes[min(k, len(dtypes) - 1)])
                     for k, v in enumerate(value)]
        else:
            continue
        for item_value, item_shape, dtype in items:
            size = tensor_bytes(item_value, item_shape, dtype)
            if size is not None:
                total += size
                found = True
    return total if found else None


# ---------------------------------------------------------------------------------------------
# Process groups
# ---------------------------------------------------------------------------------------------


def job_group_id(pytorch_name: str) -> str:
    """The job-wide id of a numeric PyTorch process-group name: the name + 1 ("0" -> "1")."""
    return str(int(pytorch_name) + 1)


def dtype_name(text: str | None) -> str | None:
    """An element type as one spelling for ET and Kineto ("Float", "float" -> "float")."""
    if not text:
        return None
    name = text.strip().lower()
    return name.removeprefix("c10::") or None


@dataclass
class ProcessGroups:
    """From ``## process_group:init ##``: description -> numeric name, name -> global ranks."""

    name_of_desc: dict[str, str] = field(default_factory=dict)
    ranks_of_name: dict[str, list[int]] = field(default_factory=dict)
    count: int = 0  # the most groups the job had, as ``group_count`` (or the entries listed) says

    def world_only(self) -> bool:
        """True when the job had one process group, the world (a trace that names no group then
        names it)."""
        return self.count <= 1

    def numeric_name(self, candidate: Any) -> str | None:
        """``candidate`` as a numeric pg name (itself, or mapped from a description), or None."""
        if candidate is None:
            return None
        text = str(candidate)
        if text.isdigit():
            return text
        return self.name_of_desc.get(text)

    def job_groups(self) -> dict[str, list[int]]:
        """Job id -> global ranks of every numeric group this trace lists."""
        return {job_group_id(name): ranks for name, ranks in self.ranks_of_name.items() if name.isdigit()}


def _group_ranks(entry: dict) -> list[int] | None:
    """A ``process_group:init`` entry's global ranks. PyTorch writes ``ranks: []`` for a group
    of all ranks, with its size in ``group_size`` (``pg_size`` in some versions)."""
    ranks = entry.get("ranks")
    if not isinstance(ranks, list) or not all(is_int(r) for r in ranks):
        return None
    if ranks:
        return ranks
    size = entry.get("group_size", entry.get("pg_size"))
    return list(range(size)) if is_int(size) and size > 0 else None


def read_process_groups(et_plus: EtPlus) -> ProcessGroups:
    """Parse every ``## process_group:init ##`` node (first input: a JSON list of group dicts with
    ``pg_name``, ``pg_desc``, ``ranks``, ``group_count``: a rank lists the groups it is in, and
    counts them all). Cost: O(n) name checks + the init nodes' parse."""
    et = et_plus.et
    groups = ProcessGroups()
    for i, name in enumerate(et.names):
        if name != PROCESS_GROUP_INIT:
            continue
        values = op_inputs(et.nodes[i], et.layout).values
        if not values or not isinstance(values[0], str):
            continue
        try:
            config = orjson.loads(values[0])
        except orjson.JSONDecodeError:
            continue
        entries = list(config.values()) if isinstance(config, dict) else config
        entries = [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []
        groups.count = max([groups.count, len(entries)] + [entry["group_count"] for entry in entries
                                                           if is_int(entry.get("group_count"))])
        for entry in entries:
            if entry.get("pg_name") is None:
                continue
            pg_name = str(entry["pg_name"])
            if entry.get("pg_desc") is not None and pg_name.isdigit():
                groups.name_of_desc.setdefault(str(entry["pg_desc"]), pg_name)
            ranks = _group_ranks(entry)
            if ranks is not None:
                groups.ranks_of_name[pg_name] = ranks
    return groups


# ---------------------------------------------------------------------------------------------
# Communication attributes of a GPU op
# ---------------------------------------------------------------------------------------------


@dataclass
class CommOps:
    """The ET ops around a communication kernel (ET indices, -1 when absent)."""

    launcher: int
    collective: int = NO_NODE  # nccl:* / rccl:* user annotation
    param: int = NO_NODE  # record_param_comms
    c10d: int = NO_NODE  # c10d::* op


@dataclass
class CommAttrs:
    """What a comm node carries. ``node_type`` COMP_NODE means it could not be resolved."""

    node_type: int
    comm_type: int | None = None
    comm_size: int | None = None
    pg_name: str | None = None  # the job-wide group id (PyTorch's name + 1)
    dtype: str | None = None  # element type, when the trace says (not written to .et)
    comm_src: int | None = None
    comm_dst: int | None = None
    comm_tag: int | None = None
    problem: str | None = None
    seq: int | None = None  # the collective's sequence number in its group, when the trace says (not written)


class CommResolver:
    """Resolves the Chakra communication attributes of NCCL/RCCL kernels. Per kernel O(depth).

    One method per attribute (kind, size, dtype, group, sequence number), each trying the ET's
    ops, Kineto's args and the kernel's name in the order its docstring states, over one shared
    cache of decoded inputs: about 150 lines kept together so that every attribute's sources read
    side by side."""

    def __init__(self, et_plus: EtPlus, index_of_id: dict[int, int]):
        self.et_plus = et_plus
        self.et = et_plus.et
        self.index_of_id = index_of_id
        self.groups = read_process_groups(et_plus)
        self.rank = et_plus.result.kineto.rank
        self._event_of_op = et_plus.result.match.event_of_op
        self._cpu_events = et_plus.result.kineto.cpu_events
        self._inputs: dict[int, OpIO] = {}  # ET index -> its decoded inputs (ops asked for twice)

    def inputs(self, i: int) -> OpIO:
        """``op_inputs`` of ET node ``i``, decoded once per resolver (do not modify)."""
        io = self._inputs.get(i)
        if io is None:
            io = self._inputs[i] = op_inputs(self.et.nodes[i], self.et.layout)
        return io

    def comm_ops(self, launcher: int) -> CommOps:
        """Find the nccl:* / record_param_comms / c10d:: ops at or above the launching op."""
        ops = CommOps(launcher)
        i, depth = launcher, 0
        while i >= 0 and depth <= MAX_COMM_ANCESTORS:
            name = self.et.names[i]
            if ops.collective < 0 and name.startswith(("nccl:", "rccl:")):
                ops.collective = i
            elif ops.param < 0 and name == PARAM_COMMS_NAME:
                ops.param = i
            elif ops.c10d < 0 and name.startswith("c10d::"):
                ops.c10d = i
            parent = self.index_of_id.get(self.et.parent[i], NO_NODE)
            if parent == i:
                break
            i, depth = parent, depth + 1
        return ops

    def _kineto_args(self, et_index: int):
        if et_index < 0:
            return None
        event = self._event_of_op[et_index]
        return self._cpu_events[event].args if event >= 0 else None

    def _param_inputs(self, ops: CommOps) -> OpIO | None:
        return self.inputs(ops.param) if ops.param >= 0 else None

    def kind(self, gpu: GpuNode, gpu_args, ops: CommOps, param_io: OpIO | None) -> CommKind | None:
        """Kernel name first (explicit collectives), then the launching ops' names, then Kineto."""
        kind = kind_from_kernel(gpu.name)
        if kind is not None:
            return kind
        names = []
        if ops.collective >= 0:
            names.append(self.et.names[ops.collective])
        if param_io is not None:
            names.append(_collective_name(param_io))
        if ops.c10d >= 0:
            names.append(self.et.names[ops.c10d])
        if gpu_args is not None:
            names.append(gpu_args.collective_name)
        for name in names:
            if name:
                kind = kind_from_name(name)
                if kind is not None:
                    return kind
        return None

    def size(self, ops: CommOps, param_io: OpIO | None, gpu_args) -> int | None:
        """Bytes moved: the collective op's input tensors, else record_param_comms' tensor
        inputs, else Kineto "In msg nelems" × dtype size (kernel's args, then the ops')."""
        if ops.collective >= 0:
            size = tensors_bytes(self.inputs(ops.collective))
            if size:
                return size
        if param_io is not None:
            size = tensors_bytes(param_io)
            if size:
                return size
        for args in (gpu_args, self._kineto_args(ops.param), self._kineto_args(ops.collective)):
            if args is not None and args.in_msg_nelems and args.dtype:
                element = DTYPE_BYTES.get(args.dtype.lower())
                if element:
                    return args.in_msg_nelems * element
        return None

    def dtype(self, ops: CommOps, param_io: OpIO | None, gpu_args) -> str | None:
        """Element type: the collective op's (else record_param_comms') first tensor type, else
        Kineto's "dtype" (kernel's args, then the ops'); None when nobody says."""
        for io in (self.inputs(ops.collective) if ops.collective >= 0 else None,
                   param_io):
            for type_name in io.types if io is not None else ():
                found = _TENSOR_DTYPE.findall(type_name) if isinstance(type_name, str) else []
                if found and dtype_name(found[0]):
                    return dtype_name(found[0])
        for args in (gpu_args, self._kineto_args(ops.param), self._kineto_args(ops.collective)):
            if args is not None and args.dtype:
                return dtype_name(args.dtype)
        return None

    def pg_name(self, gpu: GpuNode, ops: CommOps, param_io: OpIO | None) -> str:
        """PyTorch's numeric process-group name; "0" (the default group) when the trace does not say."""
        candidates: list[Any] = []
        if gpu.pg_name is not msgspec.UNSET:
            candidates.append(gpu.pg_name)
        for et_index in (ops.param, ops.collective):
            args = self._kineto_args(et_index)
            if args is not None:
                candidates.append(args.pg_name)
        if param_io is not None:
            candidates += _pg_candidates(param_io)
        for candidate in candidates:
            name = self.groups.numeric_name(candidate)
            if name is not None:
                return name
        return PYTORCH_WORLD_GROUP

    def seq(self, ops: CommOps, param_io: OpIO | None, gpu_args) -> int | None:
        """The collective's sequence number in its process group: Kineto's "Seq" (the kernel's
        args, then the ops'), else record_param_comms' first input (``seq`` or ``[seq, isP2P]``)."""
        for args in (gpu_args, self._kineto_args(ops.param), self._kineto_args(ops.collective)):
            if args is not None and is_int(args.comm_seq):
                return args.comm_seq
        return seq_of_param_inputs(param_io)

    def resolve(self, gpu: GpuNode, gpu_args, launcher: int) -> CommAttrs:
        """The node type and comm attributes of one communication kernel."""
        ops = self.comm_ops(launcher)
        param_io = self._param_inputs(ops)
        kind = self.kind(gpu, gpu_args, ops, param_io)
        if kind is None:
            return CommAttrs(kinds.COMP_NODE, problem="comm kind unknown")
        size = self.size(ops, param_io, gpu_args)
        if not size or size <= 0:
            return CommAttrs(kinds.COMP_NODE, problem="comm size unknown")
        pytorch_name = self.pg_name(gpu, ops, param_io)
        group_id, dtype = job_group_id(pytorch_name), self.dtype(ops, param_io, gpu_args)
        if kind.role == COLL:
            return CommAttrs(kinds.COMM_COLL_NODE, comm_type=kind.comm_type, comm_size=size, pg_name=group_id,
                             dtype=dtype, seq=self.seq(ops, param_io, gpu_args))
        peer = _peer_rank(param_io, self.groups.ranks_of_name.get(pytorch_name))
        if peer is None:
            return CommAttrs(kinds.COMP_NODE, problem="point-to-point peer unknown")
        attrs = CommAttrs(kinds.COMM_SEND_NODE if kind.role == SEND else kinds.COMM_RECV_NODE,
                          comm_size=size, pg_name=group_id, dtype=dtype)
        if kind.role == SEND:
            attrs.comm_src, attrs.comm_dst = self.rank, peer
        else:
            attrs.comm_src, attrs.comm_dst = peer, self.rank
        if ops.c10d >= 0:
            attrs.comm_tag = _last_int(self.inputs(ops.c10d))
        return attrs


def seq_of_param_inputs(io: OpIO | None) -> int | None:
    """record_param_comms' sequence number: its first input that is not a tensor (PyTorch 2.0: the
    int after the tensors; later: ``[seq, isP2P]``), before the collective's name; None when there
    is none, or for a point-to-point sequence (its own numbering)."""
    if io is None:
        return None
    for position, value in enumerate(io.values):
        type_name = io.types[position] if position < len(io.types) else ""
        if isinstance(type_name, str) and "Tensor" in type_name:
            continue
        if is_int(value):
            return value
        if isinstance(value, list) and len(value) == 2 and is_int(value[0]) and isinstance(value[1], bool):
            return None if value[1] else value[0]
        return None
    return None


def _collective_name_position(io: OpIO) -> int:
    """Position of record_param_comms' collective-name argument (its first non-numeric string)."""
    for position, value in enumerate(io.values):
        if isinstance(value, str) and value and not value.isdigit():
            return position
    return NO_NODE


def _collective_name(io: OpIO) -> str | None:
    position = _collective_name_position(io)
    return io.values[position] if position >= 0 else None


def _pg_candidates(io: OpIO) -> list[Any]:
    """record_param_comms' process-group arguments: a (pg_name, pg_desc) pair of strings
    (PyTorch >= 2.2) or a numeric string. (PyTorch 2.0 records a pointer: not a name.)"""
    out: list[Any] = []
    for value in io.values:
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            out += value
        elif isinstance(value, str) and value.isdigit():
            out.append(value)
    return out


def _peer_rank(io: OpIO | None, group_ranks: list[int] | None) -> int | None:
    """Peer of a send/recv: record_param_comms' rank argument (just before the collective name),
    mapped from group-local to global rank when the group's ranks are known."""
    if io is None:
        return None
    position = _collective_name_position(io)
    if position < 1 or not is_int(io.values[position - 1]):
        return None
    peer = io.values[position - 1]
    if group_ranks and 0 <= peer < len(group_ranks):
        return group_ranks[peer]
    return peer


def _last_int(io: OpIO) -> int | None:
    for value in reversed(io.values):
        if is_int(value):
            return value
    return None

"""Kineto-only input: build the host graph from the Kineto trace itself, then link as with an ET.

No Execution Trace was recorded (or published) for many GPU traces. This module turns the Kineto
trace's own CPU events into an ``ExecutionTrace`` in the nested layout (schema 1.1.1), so the rest
of the pipeline (GPU attribution, durations, ``EtPlus``, both writers) runs unchanged:

- one node per ``cpu_op`` / ``user_annotation`` event, plus each ``python_function`` event that is
  the innermost one around a launch that no op or annotation covers (so graph launches issued from
  plain Python still land under something);
- a process root and one thread root per Kineto (pid, tid), numbered 1, 2, ... in (pid, tid)
  order (the ``tid`` attr is that number, as in an ET);
- ids in start order per thread (ET ids are given at op start), parents from interval nesting on
  the thread (``durations.nest_cpu_events``, which gives the exclusive durations in the same sweep), a top-level event under its thread root;
- inputs' shapes from ``Input Dims`` where the trace recorded them (values and types are not
  written);
- attrs ``rf_id`` (the Kineto ``Record function id``; 0 = unknown), ``tid``, and the usual
  ``fw_parent``/``seq_id``/``scope``/``fw_tid``/``op_schema`` left at their "unknown" values.

Every op node is linked to the event it was built from (an identity match, method
``kineto_only``), so all times come straight from Kineto. Cost: O(n log n) for n CPU events plus
the GPU attribution's O((n + g) log(n + g)).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from operator import attrgetter

import msgspec

from linker.link.durations import CpuNesting, nest_cpu_events
from linker.read.et import NESTED, PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, EtNode, ExecutionTrace
from linker.link.gpu import adopt_before_trace, attribute_gpu_ops, innermost_python_functions, uncovered_launch_points
from linker.read.kineto import KinetoEvent, KinetoTrace, cpu_event_order
from linker.link.recipe import LinkResult, op_of_event
from linker.link.threads import OpMatch
from linker.link.report import build_report

SCHEMA = "1.1.1-chakra.0.0.4"
HOST_GRAPH_SOURCE = "kineto"
METHOD = "kineto_only"
PROCESS_ROOT_ID = 1

_ID, _NAME, _CTRL_DEPS = attrgetter("id"), attrgetter("name"), attrgetter("ctrl_deps")
_EMPTY_IO = msgspec.Raw(b'{"values":[],"shapes":[],"types":[],"strides":[]}')


class KinetoOnlyDocument(msgspec.Struct, omit_defaults=True):
    """The header of a host graph built from Kineto: what the writers read (``nodes`` last)."""

    schema: str
    pid: int | msgspec.UnsetType = msgspec.UNSET
    et_link_host_graph: str = HOST_GRAPH_SOURCE
    nodes: list = msgspec.field(default_factory=list)


@dataclass
class KinetoGraph:
    """The host graph and the Kineto trace it was built from.

    ``kineto`` is the input trace with the chosen ``python_function`` events added to its CPU events
    (re-sorted); ``event_of_op[i]`` is the CPU event node ``i`` stands for (-1 for the roots);
    ``nesting`` the nesting parents, exclusive durations and ends of those CPU events (one sweep).
    """

    et: ExecutionTrace
    kineto: KinetoTrace
    event_of_op: list[int]
    nesting: CpuNesting
    python_nodes: int


# ``msgspec.json.encode`` of the attrs list below, with the two numbers left as ``%d`` (bytes
# formatting: one C call per node instead of seven dicts and an encode; tests check both agree).
_ATTRS = (b'[{"name":"rf_id","type":"uint64","value":%d},'
          b'{"name":"fw_parent","type":"uint64","value":0},'
          b'{"name":"seq_id","type":"int64","value":-1},'
          b'{"name":"scope","type":"uint64","value":0},'
          b'{"name":"tid","type":"uint64","value":%d},'
          b'{"name":"fw_tid","type":"uint64","value":0},'
          b'{"name":"op_schema","type":"string","value":""}]')


def _attrs(rf_id: int, thread: int) -> msgspec.Raw:
    """The attrs ``[rf_id, fw_parent, seq_id, scope, tid, fw_tid, op_schema]`` of one node (the
    unknown values but ``rf_id`` and ``tid``), as JSON."""
    return msgspec.Raw(_ATTRS % (rf_id, thread))


_SHAPES_HEAD = b'{"values":[],"shapes":'
_SHAPES_TAIL = b',"types":[],"strides":[]}'
_LIST_START = ord("[")


def _inputs(event: KinetoEvent) -> msgspec.Raw:
    """``{"values", "shapes", "types", "strides"}`` with the recorded ``Input Dims`` as shapes.

    Types are not read: a decoded ``Input type`` would be one more raw view (or string list) per
    event kept alive on large traces, and nothing downstream needs it."""
    dims = event.args.input_dims
    view = memoryview(dims)
    if not view or view[0] != _LIST_START:  # a decoded value starts at its first byte
        if not bytes(dims).lstrip()[:1] == b"[":  # a JSON list (the decoder validated the value)
            return _EMPTY_IO
    return msgspec.Raw(b"".join((_SHAPES_HEAD, view, _SHAPES_TAIL)))


class _SharedInputs:
    """``_inputs`` of an event, one ``Raw`` per distinct ``Input Dims`` text: nodes with the same
    shapes share it (an op repeats its shapes every step). The cache is keyed by the dims' bytes
    (O(len) to copy and hash, far less than building the ``Raw``); the dims object of the previous
    event is recognised by identity (readers that share one between events: ``timing_model``)."""

    def __init__(self):
        self.by_text: dict[bytes, msgspec.Raw] = {}
        self.last = self.last_raw = None

    def __call__(self, event: KinetoEvent) -> msgspec.Raw:
        dims = event.args.input_dims
        if dims is self.last:
            return self.last_raw
        key = bytes(dims)
        raw = self.by_text.get(key)
        if raw is None:
            raw = self.by_text[key] = _inputs(event)
        self.last, self.last_raw = dims, raw
        return raw


def _with_python_events(kineto: KinetoTrace) -> tuple[KinetoTrace, int]:
    """The trace with the innermost python function around each uncovered launch as a CPU event
    (the trace itself when it has no python function events: nothing to look up)."""
    if not kineto.python_events:
        return kineto, 0
    points = uncovered_launch_points(kineto)
    chosen = {id(e): e for e in innermost_python_functions(kineto, points) if e is not None}
    if not chosen:
        return kineto, 0
    events = kineto.cpu_events + list(chosen.values())
    events.sort(key=cpu_event_order)
    return dataclasses.replace(kineto, cpu_events=events), len(chosen)


def build_host_graph(kineto: KinetoTrace) -> KinetoGraph:
    """The host graph of ``kineto`` as an ``ExecutionTrace`` (nested layout). O(n log n)."""
    kineto, python_nodes = _with_python_events(kineto)
    events = kineto.cpu_events
    nesting = nest_cpu_events(events)
    parents = nesting.parents
    thread_number: dict[tuple, int] = {}
    thread_of = [thread_number.setdefault((e.pid, e.tid), len(thread_number) + 1) for e in events]
    rf_ids = [e.args.rf_id or 0 for e in events]
    nodes = [EtNode(id=PROCESS_ROOT_ID, name=PROCESS_ROOT_NAMES[0], ctrl_deps=PROCESS_ROOT_ID,
                    inputs=_EMPTY_IO, outputs=_EMPTY_IO, attrs=_attrs(0, 0))]
    for number in thread_number.values():  # thread roots: ids PROCESS_ROOT_ID + number
        nodes.append(EtNode(id=PROCESS_ROOT_ID + number, name=THREAD_ROOT_NAMES[0],
                            ctrl_deps=PROCESS_ROOT_ID, inputs=_EMPTY_IO, outputs=_EMPTY_IO,
                            attrs=_attrs(0, number)))
    roots = len(nodes)
    first_op_id = PROCESS_ROOT_ID + roots
    add = nodes.append
    inputs_of = _SharedInputs()
    unknown_rf_id = [_attrs(0, number) for number in range(len(thread_number) + 1)]
    for i, (e, p, thread, rf_id) in enumerate(zip(events, parents, thread_of, rf_ids)):
        parent = first_op_id + p if p >= 0 else PROCESS_ROOT_ID + thread
        add(EtNode(id=first_op_id + i, name=e.name, ctrl_deps=parent, inputs=inputs_of(e),
                   outputs=_EMPTY_IO, attrs=msgspec.Raw(_ATTRS % (rf_id, thread)) if rf_id else unknown_rf_id[thread]))
    event_of_op = [-1] * roots + list(range(len(events)))
    doc = KinetoOnlyDocument(schema=SCHEMA, nodes=nodes,
                             pid=kineto.pid if kineto.pid is not None else msgspec.UNSET)
    et = ExecutionTrace(path="", layout=NESTED, schema=SCHEMA, pid=kineto.pid, header=doc, nodes=nodes)
    et.ids = list(map(_ID, nodes))
    et.names = list(map(_NAME, nodes))
    et.parent = list(map(_CTRL_DEPS, nodes))
    et.scope = [0] * len(nodes)
    et.op_schema = [""] * len(nodes)
    et.tid = [0, *thread_number.values(), *thread_of]
    et.rf_id = [0] * roots + rf_ids
    return KinetoGraph(et, kineto, event_of_op, nesting, python_nodes)


def link_kineto_only(kineto: KinetoTrace) -> LinkResult:
    """Build the host graph from ``kineto`` and attach its GPU ops: a ``LinkResult`` like ``link``'s."""
    started = time.perf_counter()
    graph = build_host_graph(kineto)
    events = graph.kineto.cpu_events
    nesting = graph.nesting
    ops = op_of_event(graph.event_of_op, len(events))
    gpu = attribute_gpu_ops(graph.kineto, ops, nesting)
    adopt_before_trace(gpu, 0)  # node 0 is the process root
    threads = len(set(graph.et.tid)) - 1
    note = (f"no Execution Trace: the host graph was built from the Kineto trace alone "
            f"({len(events) - graph.python_nodes} CPU ops and annotations on {threads} "
            f"thread{'s' if threads != 1 else ''}, nesting from their intervals")
    note += (f", plus {graph.python_nodes} Python function event(s) around launches outside any op)"
             if graph.python_nodes else ")")
    match = OpMatch(METHOD, graph.event_of_op, notes=[note])
    report = build_report(graph.et, graph.kineto, match, None, gpu, [], [],
                          seconds=time.perf_counter() - started,
                          nesting=(nesting.parents, nesting.end), op_of_event=ops)
    report.et_file = None
    report.host_graph = HOST_GRAPH_SOURCE
    return LinkResult(graph.et, graph.kineto, match, None, gpu, nesting.parents, nesting.exclusive, report,
                      op_of_event=ops)

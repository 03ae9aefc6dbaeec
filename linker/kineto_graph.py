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

import msgspec

from .durations import CpuNesting, nest_cpu_events
from .et_reader import NESTED, PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, EtNode, ExecutionTrace
from .gpu import adopt_before_trace, attribute_gpu_ops, innermost_python_functions, uncovered_launch_points
from .kineto_reader import KinetoEvent, KinetoTrace, cpu_event_order
from .link import LinkResult, op_of_event
from .match import OpMatch
from .report import build_report

SCHEMA = "1.1.1-chakra.0.0.4"
HOST_GRAPH_SOURCE = "kineto"
METHOD = "kineto_only"
PROCESS_ROOT_ID = 1

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


def _attrs(rf_id: int, thread: int) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode([
        {"name": "rf_id", "type": "uint64", "value": rf_id},
        {"name": "fw_parent", "type": "uint64", "value": 0},
        {"name": "seq_id", "type": "int64", "value": -1},
        {"name": "scope", "type": "uint64", "value": 0},
        {"name": "tid", "type": "uint64", "value": thread},
        {"name": "fw_tid", "type": "uint64", "value": 0},
        {"name": "op_schema", "type": "string", "value": ""},
    ]))


def _inputs(event: KinetoEvent) -> msgspec.Raw:
    """``{"values", "shapes", "types", "strides"}`` with the recorded ``Input Dims`` as shapes.

    Types are not read: a decoded ``Input type`` would be one more raw view (or string list) per
    event kept alive on large traces, and nothing downstream needs it."""
    dims = bytes(event.args.input_dims)
    if not dims.lstrip()[:1] == b"[":  # a JSON list (the decoder validated the value): no decode
        return _EMPTY_IO
    return msgspec.Raw(b'{"values":[],"shapes":' + dims + b',"types":[],"strides":[]}')


def _with_python_events(kineto: KinetoTrace) -> tuple[KinetoTrace, int]:
    """The trace with the innermost python function around each uncovered launch as a CPU event."""
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
    for e in events:
        thread_number.setdefault((e.pid, e.tid), len(thread_number) + 1)
    nodes = [EtNode(id=PROCESS_ROOT_ID, name=PROCESS_ROOT_NAMES[0], ctrl_deps=PROCESS_ROOT_ID,
                    inputs=_EMPTY_IO, outputs=_EMPTY_IO, attrs=_attrs(0, 0))]
    root_of_thread = {}
    for key, number in thread_number.items():
        root_of_thread[key] = PROCESS_ROOT_ID + number
        nodes.append(EtNode(id=PROCESS_ROOT_ID + number, name=THREAD_ROOT_NAMES[0],
                            ctrl_deps=PROCESS_ROOT_ID, inputs=_EMPTY_IO, outputs=_EMPTY_IO,
                            attrs=_attrs(0, number)))
    first_op_id = PROCESS_ROOT_ID + len(thread_number) + 1
    event_of_op = [-1] * len(nodes)
    for i, e in enumerate(events):
        key = (e.pid, e.tid)
        parent = first_op_id + parents[i] if parents[i] >= 0 else root_of_thread[key]
        nodes.append(EtNode(id=first_op_id + i, name=e.name, ctrl_deps=parent, inputs=_inputs(e),
                            outputs=_EMPTY_IO, attrs=_attrs(e.args.rf_id or 0, thread_number[key])))
        event_of_op.append(i)
    doc = KinetoOnlyDocument(schema=SCHEMA, nodes=nodes,
                             pid=kineto.pid if kineto.pid is not None else msgspec.UNSET)
    et = ExecutionTrace(path="", layout=NESTED, schema=SCHEMA, pid=kineto.pid, header=doc, nodes=nodes)
    for node in nodes:
        et.ids.append(node.id)
        et.names.append(node.name)
        et.parent.append(node.ctrl_deps)
        et.scope.append(0)
        et.op_schema.append("")
    et.tid = [0] + list(thread_number.values()) + [thread_number[(e.pid, e.tid)] for e in events]
    et.rf_id = [0] * (len(thread_number) + 1) + [e.args.rf_id or 0 for e in events]
    return KinetoGraph(et, kineto, event_of_op, nesting, python_nodes)


def link_kineto_only(kineto: KinetoTrace) -> LinkResult:
    """Build the host graph from ``kineto`` and attach its GPU ops: a ``LinkResult`` like ``link``'s."""
    started = time.perf_counter()
    graph = build_host_graph(kineto)
    events = graph.kineto.cpu_events
    nesting = graph.nesting
    ops = op_of_event(graph.event_of_op, len(events))
    gpu = attribute_gpu_ops(graph.kineto, ops, nesting.parents)
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
    return LinkResult(graph.et, graph.kineto, match, None, gpu, nesting.parents, nesting.exclusive, report)

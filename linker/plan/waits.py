"""Wait edges: a blocking runtime call (a device or stream synchronize, a synchronous or
blocking copy, ``cudaStreamWaitEvent``) becomes a dependency of the op after it on the GPU op(s)
it waited for, with the cause ``sync`` or ``event_wait`` (rules in ``docs/durations.md``).

``add_wait_edges`` adds them to a ``DependencyPlan`` once its write order is made, and counts them
in the ``WriteSummary``. Cost: O(calls · log g) with the lookup structures of ``WaitContext``,
built once in O(g log g + linked ops).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from operator import attrgetter

import msgspec

from linker.link.etplus import EtPlus
from linker.plan.busy import DEVICE_SYNC, STREAM_SYNC, STREAM_WAIT_EVENT, WAIT_CALLS, ops_covering
from linker.plan.dependency_plan import (EVENT_WAIT, NO_NODE, SYNC, DependencyPlan, GpuPlacement, IssueIndex,
                                         WriteSummary)

# WAIT_CALLS and its kinds live in ``busy`` (one list for blocked time and for wait edges).


@dataclass
class WaitContext:
    """Lookup structures for wait resolution, built once. Memory O(g + linked ops)."""

    placement: GpuPlacement
    by_stream: IssueIndex
    by_thread: IssueIndex
    by_thread_stream: IssueIndex
    thread_streams: dict[tuple, list[tuple]]
    issue_ts: list[float]  # per GPU node: its issue time for the lookups (``_issued_in_trace_order``)
    linked_starts: dict[int, list[float]]  # ET tid -> linked op start times, sorted
    linked_ops: dict[int, list[int]]  # ET tid -> linked ET indices in that order


def _wait_context(et_plus: EtPlus, placement: GpuPlacement, first_call: float) -> WaitContext:
    et = et_plus.et
    threads = placement.issue_thread
    pairs = [(t, s) if t is not None else None for t, s in zip(threads, placement.stream_key)]
    thread_streams: dict[tuple, list[tuple]] = {}
    for pair in set(p for p in pairs if p is not None):
        thread_streams.setdefault(pair[0], []).append(pair[1])
    linked: dict[int, list[int]] = {}
    ts = list(map(attrgetter("ts"), et.nodes))
    tids, unset = et.tid, msgspec.UNSET
    for i in et.op_indices():
        if ts[i] is not unset:
            linked.setdefault(tids[i], []).append(i)
    starts = {}
    for tid, ops in linked.items():
        ops.sort(key=et.ids.__getitem__)
        ops.sort(key=ts.__getitem__)  # stable: by (start, id), as ops came by index
        starts[tid] = [ts[i] for i in ops]
    issue_ts = _issued_in_trace_order(placement, first_call)
    return WaitContext(
        placement,
        IssueIndex.build(placement.stream_key, issue_ts),
        IssueIndex.build(list(threads), issue_ts),
        IssueIndex.build(pairs, issue_ts),
        thread_streams, issue_ts, starts, linked,
    )


def _issued_in_trace_order(placement: GpuPlacement, first_call: float) -> list[float]:
    """Issue times for the wait lookups: an op launched before the trace was issued before every
    call in it, so a synchronize waits for it too (its placement time, its own start, can lie long
    after the call began: a device synchronize at the start of a step waits for the previous
    step's kernels still running). Such ops move back together, in their order, to before both
    ``first_call`` (the earliest wait call) and the first op launched in the trace. O(g)."""
    issue_ts = list(placement.issue_ts)
    early = placement.before_trace
    if not early:
        return issue_ts
    first = min([first_call] + [t for k, t in enumerate(issue_ts) if k not in early])
    shift = max(issue_ts[k] for k in early) - first + 1.0
    if shift > 0:
        for k in early:
            issue_ts[k] -= shift
    return issue_ts


def _waited_on(call, kind: str, ctx: WaitContext) -> list[int]:
    """GPU node numbers the call waited for (rules in the module docstring)."""
    t = call.ts
    thread = (call.pid, call.tid)
    if kind == DEVICE_SYNC:
        found = (ctx.by_stream.last_before(key, t) for key in ctx.by_stream.nodes)
        return [k for k in found if k >= 0]
    if kind == STREAM_SYNC:
        stream = _named_stream(call, ctx)
        if stream is None:
            last = ctx.by_thread.last_before(thread, t)
            stream = ctx.placement.stream_key[last] if last >= 0 else None
        k = ctx.by_stream.last_before(stream, t) if stream is not None else NO_NODE
        return [k] if k >= 0 else []
    following = ctx.by_thread.first_after(thread, t)
    waiting = ctx.placement.stream_key[following] if following >= 0 else None
    latest, source_stream = -math.inf, None
    for stream in ctx.thread_streams.get(thread, ()):
        if stream == waiting:
            continue
        k = ctx.by_thread_stream.last_before((thread, stream), t)
        if k >= 0 and ctx.issue_ts[k] > latest:
            latest, source_stream = ctx.issue_ts[k], stream
    k = ctx.by_stream.last_before(source_stream, t) if source_stream is not None else NO_NODE
    return [k] if k >= 0 else []


def _named_stream(call, ctx: WaitContext) -> tuple | None:
    """The (device, stream) a runtime call names in its args, when Kineto records one."""
    stream = call.args.stream
    if stream is None:
        return None
    for key in ctx.by_stream.nodes:
        if key[1] == stream and (call.args.device is None or key[0] == call.args.device):
            return key
    return None


def _op_after(thread_tid: int, t: float, ctx: WaitContext) -> int:
    """The first linked op of ET thread ``thread_tid`` starting at or after ``t`` (-1 if none)."""
    starts = ctx.linked_starts.get(thread_tid)
    if not starts:
        return NO_NODE
    position = bisect_left(starts, t)
    return ctx.linked_ops[thread_tid][position] if position < len(starts) else NO_NODE


def _wait_target(call, kind: str, waiter: int, ctx: WaitContext, et, plan: DependencyPlan) -> int:
    """Where a wait edge goes. A blocking synchronize: what the thread ran once the call returned
    (``_resumed_after``); failing that, the waiter. cudaStreamWaitEvent (the CPU does not block):
    the next GPU op the calling thread issued, on the stream that waited."""
    if kind == STREAM_WAIT_EVENT:
        k = ctx.by_thread.first_after((call.pid, call.tid), call.ts)
        return plan.cpu_count + k if k >= 0 else NO_NODE
    after = _resumed_after(waiter, call.ts + call.dur, ctx, et, plan)
    return after if after >= 0 else waiter


def _resumed_after(waiter: int, t: float, ctx: WaitContext, et, plan: DependencyPlan) -> int:
    """What the thread of ``waiter`` ran once a blocking call inside it returned at ``t``: the part
    of ``waiter`` that began then, when its own time went on after the call (``busy._handoffs``
    cut it there), else the first linked op of its thread starting at or after ``t`` (-1 if
    none). O(log p + log n)."""
    j = plan.busy.pieces.at(waiter, t) if plan.busy is not None else -1
    return plan.piece_start + j if j >= 0 else _op_after(et.tid[waiter], t, ctx)


def _wait_calls(et_plus: EtPlus) -> list:
    """The Kineto runtime events that are waits, inside the linked window if there is one."""
    window = et_plus.result.window
    calls = []
    for event in et_plus.result.kineto.runtime_events:
        if event.name in WAIT_CALLS and (window is None or window.contains(event.ts)):
            calls.append(event)
    return calls


ADDED, ALREADY_THERE, NO_PLACE = "added", "already there", "no place"


def _add_wait(plan: DependencyPlan, source: int, target: int, cause: str) -> str:
    """Record source -> target unless it would go backward in the write order (NO_PLACE) or the
    dependency exists already (ALREADY_THERE)."""
    if target < 0 or target == source or plan.position[target] <= plan.position[source]:
        return NO_PLACE
    targets = plan.waits.setdefault(target, [])
    if any(d == source for d, _ in targets) or plan.prev[target] == source or plan.ctrl[target] == source:
        return ALREADY_THERE
    targets.append((source, cause))
    return ADDED


def _ended_after_start(et_plus: EtPlus, k: int, j: int) -> bool:
    """True when GPU node k ended (1 µs tolerance) after GPU node j started: j cannot have waited
    for k (the event waited on was recorded before k; the trace does not record which)."""
    if j < 0:
        return False
    source, target = et_plus.gpu_nodes[k], et_plus.gpu_nodes[j]
    return source.ts + source.dur > target.ts + 1.0


def _recorded_before(et_plus: EtPlus, ctx: WaitContext, k: int, j: int) -> int:
    """The GPU op an event wait of op j waited for, given k, the last op issued on the event's
    stream before the call: k itself when it ended (1 µs tolerance) before j started; else the
    event was recorded before k (the trace does not say when), and the latest op issued on that
    stream before k that ended before j started is taken (-1: none, the event was recorded before
    any of them). O(ops passed over)."""
    if j < 0 or not _ended_after_start(et_plus, k, j):
        return k
    key = ctx.placement.stream_key[k]
    members = ctx.by_stream.nodes[key]
    position = bisect_right(ctx.by_stream.times[key], ctx.issue_ts[k]) - 1
    while position >= 0 and members[position] != k:
        position -= 1
    position -= 1
    while position >= 0 and _ended_after_start(et_plus, members[position], j):
        position -= 1
    return members[position] if position >= 0 else NO_NODE


def add_wait_edges(et_plus: EtPlus, plan: DependencyPlan, placement: GpuPlacement, summary: WriteSummary) -> None:
    """Add the wait edges to ``plan.waits``; only edges that go forward in ``plan.order`` are
    kept, so the order stays topological and the graph acyclic. An event wait needs no covering CPU
    op (it is GPU to GPU); it waits for the latest op of the event's stream that had ended when the
    waiting op started (``_recorded_before``: a wait on an op that ended later would contradict
    the measured timeline; an NCCL kernel still running when the copy after the wait began was
    not what the event marked), and none when every such op ended later. O(w log g) for w wait
    calls, plus the ops passed over."""
    calls = _wait_calls(et_plus)
    if not et_plus.gpu_nodes:
        summary.wait_calls.update(call.name for call in calls)
        if calls:
            summary.waits_skipped["no GPU op to wait on"] += len(calls)
        return
    ctx = _wait_context(et_plus, placement, min((call.ts for call in calls), default=math.inf))
    n, et = plan.cpu_count, et_plus.et
    for call, waiter in zip(calls, ops_covering(et_plus, calls)):
        summary.wait_calls[call.name] += 1
        kind = WAIT_CALLS[call.name]
        if waiter < 0 and kind != STREAM_WAIT_EVENT:  # an event wait needs no CPU op: GPU to GPU
            summary.waits_skipped["call outside linked ops"] += 1
            continue
        sources = _waited_on(call, kind, ctx)
        if not sources:
            summary.waits_skipped["no GPU op to wait on"] += 1
            continue
        cause = EVENT_WAIT if kind == STREAM_WAIT_EVENT else SYNC
        target = _wait_target(call, kind, waiter, ctx, et, plan)  # the same for every source
        for k in sources:
            if kind == STREAM_WAIT_EVENT:
                k = _recorded_before(et_plus, ctx, k, target - n)
                if k < 0:
                    summary.waits_skipped["waited-on op ended after the waiting op started"] += 1
                    continue
            source = n + k
            outcome = _add_wait(plan, source, target, cause)
            if outcome == NO_PLACE:
                summary.waits_skipped["no later op to carry the wait"] += 1
            elif outcome == ADDED:
                summary.wait_edges += 1
                summary.wait_edges_redirected += target != waiter
    copies = plan.busy.blocking_copies if plan.busy is not None else []
    launches = [et_plus.gpu_links[k].launch for k in copies]
    for k, launch, waiter in zip(copies, launches, ops_covering(et_plus, launches)):
        if waiter < 0:
            continue
        target = _resumed_after(waiter, launch.ts + launch.dur, ctx, et, plan)
        if _add_wait(plan, n + k, target, SYNC) == ADDED:
            summary.copy_wait_edges += 1

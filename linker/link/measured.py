"""Where the ET's tree contradicts the measured trace for joined ops: the measurement wins.

An rf_id join pairs each ET op with the Kineto event of the same record function, so the pair is
certain; what can still be wrong is the ET's *placement* of the op. PyTorch's ET observer records
some ops on the thread that was current when the observer saw them, not where they ran: a gloo
collective (``gloo:all_reduce``) runs on a gloo worker thread (Kineto shows it there) while the ET
puts it on the main thread, as a child of whatever op was open (the backward op, the step, even
the previous collective); and backward ops are listed under an ``evaluate_function`` op that had
ended before they started. A replay that trusts such a tree serialises the collective with the
main thread's work and makes ops wait for parents that were long done.

``measured_placement`` finds, for every joined op (rf_id joins only; the other methods pair
threads first, so a link across threads there is a wrong link, not a wrong tree):
- its *measured thread*: each Kineto thread is given the ET thread number whose ops it holds most
  (each ET thread to the Kineto thread holding most of its ops); a Kineto thread that is nobody's
  home (a worker the ET never named) gets a new number after the ET's largest. An op whose ET
  thread differs from its event's measured thread is *moved*;
- its *measured parent*: the innermost joined op whose Kineto event encloses the op's event on the
  same thread, else the root of its measured thread (the process root for a new thread). It
  replaces the ET's parent for moved ops, for ops whose ET parent is joined but does not enclose
  them in time (by more than ``SLACK_US``), and for ops the ET puts at the top of their thread
  (a root: the reader re-attaches there an op whose parent has a later id, such as one begun
  while an asynchronous gloo record function was still open) that Kineto shows inside a joined op.

A CPU backend's collective record (``gloo:all_gather``, ``mpi:…``, ``ucc:…``) can hold ops its
worker ran for it: gloo's ``all_gather`` flattens its input (``aten::view``, ``aten::empty``)
before it communicates and copies each rank's part out (``aten::select``, ``aten::copy_``) after.
The communication itself lies in the longest stretch of the record that none of those ops covers
(``_before_communication``; the others are a few tens of µs of tensor bookkeeping). The ops before
that stretch did not wait for the communication, and a child waits for its parent in a replay: they
are placed before the collective, under its parent, and the collective after them
(``Placement.prepared_by``: the plan's tree order puts it after the last of them, and a fork
into the worker goes to the first). The ops after it stay
its children: they read its result.

``apply_placement`` writes the answer into the ET's columns (``tid``, ``parent``) and the nodes'
parent and ``tid`` fields, so the plan (thread chains, busy times, ctrl edges) and the writers follow
the measurement (a ``.et`` node keeps the ET's ``tid`` attribute, except a CPU collective's, which
``plan.cpu_comm`` writes on its worker thread); the report counts these ops as "ET tree disagrees with the measurement".
Cost: O(n) for n ET nodes (one walk up the Kineto nesting per disagreeing op, bounded by depth).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

SLACK_US = 1.0  # timestamps are rounded to the µs or ns: a child may seem to overhang its parent by that
NO_NODE = -1


@dataclass
class Placement:
    """Measured thread and parent of the joined ops the ET places elsewhere (ET indices).

    ``tid``: op -> measured ET thread number (moved ops only). ``parent``: op -> measured parent
    (ET index; moved ops and ops whose ET parent does not enclose them). ``new_threads``: Kineto
    thread -> the new ET thread number it was given."""

    tid: dict[int, int] = field(default_factory=dict)
    parent: dict[int, int] = field(default_factory=dict)
    new_threads: dict = field(default_factory=dict)
    prepared_by: dict[int, list[int]] = field(default_factory=dict)  # CPU collective -> ops placed before it

    @property
    def follows(self) -> dict[int, int]:
        """CPU collective -> the last of the ops placed before it (``prepared_by``)."""
        return {collective: ops[-1] for collective, ops in self.prepared_by.items()}

    @property
    def disagreements(self) -> int:
        """Joined ops whose ET thread or parent the measurement contradicts."""
        return len(self.tid.keys() | self.parent.keys())

    def as_dict(self) -> dict:
        prepared = sum(map(len, self.prepared_by.values()))
        counts = {"ops": self.disagreements, "moved_thread": len(self.tid), "parent_replaced": len(self.parent) - prepared,
                  "new_threads": len(self.new_threads)}
        if prepared:  # of the replaced parents, those of ops a collective's worker ran before communicating
            counts["placed_before_their_collective"] = prepared
        return counts


def _homes(counts: Counter) -> dict:
    """Kineto thread -> ET thread number it is the home of (see the module docstring), from the
    count of joined ops per (ET thread, Kineto thread)."""
    best_of_et: dict[int, tuple[int, str]] = {}
    for (t, k), n in sorted(counts.items(), key=lambda item: (-item[1], item[0][0], str(item[0][1]))):
        best_of_et.setdefault(t, (n, k))
    home = {}
    for t, (_, k) in sorted(best_of_et.items()):
        home.setdefault(k, t)
    return home


def _one_thread_each(et, kineto_tid: list) -> bool:
    """True when the ET's ops are on one thread and the Kineto CPU events on one. O(n)."""
    ops = et.op_indices()
    if not ops or not kineto_tid:
        return True
    op_tids = [et.tid[i] for i in ops]
    return op_tids.count(op_tids[0]) == len(op_tids) and kineto_tid.count(kineto_tid[0]) == len(kineto_tid)


def measured_placement(result, nesting_violations: int | None = None) -> Placement:
    """The ``Placement`` of a ``LinkResult`` (empty unless joined by rf_id). ``nesting_violations``:
    the link report's count of joined ops outside their joined parent's interval, when known: with
    none, on one thread each side (most traces), nothing disagrees and nothing is looked at. Else
    O(n) passes over the columns; only the ops whose ET parent's event is not their
    Kineto nesting parent, and the ops on another thread than the ET says, one by one."""
    placement = Placement()
    if result.match.method != "rf_id":
        return placement
    _place_by_measurement(result, placement, nesting_violations)
    _before_communication(result, placement)
    return placement


def _place_by_measurement(result, placement: Placement, nesting_violations: int | None) -> None:
    """Fill ``placement``'s measured threads and parents (the module docstring's first rules)."""
    et, event_of_op = result.et, result.match.event_of_op
    columns = result.kineto.cpu_columns()
    kineto_tid, ts, dur = columns.tid, columns.ts, columns.dur
    if nesting_violations == 0 and _one_thread_each(et, kineto_tid):
        return
    ops = [i for i in et.op_indices() if event_of_op[i] >= 0]  # the linked ops
    events = [event_of_op[i] for i in ops]
    threads = [kineto_tid[e] for e in events]
    op_tids = [et.tid[i] for i in ops]
    counts, home = _thread_homes(et, placement, op_tids, threads)
    parents, root = result.parents, et.process_root()
    parent_index = et.parent_index()
    events_of = event_of_op + [NO_NODE]  # position -1 (no parent): no event
    parent_events = [events_of[parent_index[i]] for i in ops]
    # An op whose ET parent's event is not its event's Kineto nesting parent
    suspects = {k for k, (pe, e) in enumerate(zip(parent_events, events)) if pe != parents[e]}
    if any(home[k] != t for t, k in counts):  # some ops ran on another thread than the ET says
        suspects.update(k for k, (thread, tid) in enumerate(zip(threads, op_tids)) if home[thread] != tid)
    if not suspects:
        return
    op_of = [NO_NODE] * len(ts)
    for i, e in zip(ops, events):
        op_of[e] = i
    thread_root = {et.tid[r]: r for r in et.root_positions() if r != root}
    tops = set(thread_root.values()) | {root, NO_NODE}  # a parent that puts an op at its thread's top
    index_of_id = et.index_of_id()
    for position in sorted(suspects):
        i, e, k = ops[position], events[position], threads[position]
        measured_tid = home[k]
        moved = measured_tid != et.tid[i]
        if moved:
            placement.tid[i] = measured_tid
        p, pe = parent_index[i], parent_events[position]
        encloses = pe >= 0 and kineto_tid[pe] == k and ts[pe] - SLACK_US <= ts[e] and \
            ts[e] + dur[e] <= ts[pe] + dur[pe] + SLACK_US
        top = p in tops  # never timed: an unlinked op's place is the ET's, a root's the measurement's
        if moved or (not encloses and (pe >= 0 or top)):
            q = parents[e]
            while q >= 0 and op_of[q] < 0:
                q = parents[q]
            if top and q < 0 and not moved:  # a top-level op, top-level as measured too
                continue
            measured_parent = op_of[q] if q >= 0 else thread_root.get(measured_tid, root)
            if measured_parent != p and measured_parent >= 0 and index_of_id.get(et.ids[measured_parent]) == measured_parent:
                placement.parent[i] = measured_parent


CPU_BACKEND_PREFIXES = ("gloo:", "mpi:", "ucc:")  # record functions of a CPU backend's worker


def outlives_its_call(name: str) -> bool:
    """True for a CPU backend's send or receive record (``gloo:send``, ``gloo:recv``): made in the
    call that enqueues the transfer and ended by the wait that saw it done, it may end long after
    that call, its parent, without a wrong link."""
    return name.startswith(CPU_BACKEND_PREFIXES) and name.partition(":")[2].lower().startswith(("send", "recv"))


def _before_communication(result, placement: Placement) -> None:
    """Place the ops a CPU backend's worker ran inside a collective's record before it
    communicated under the collective's parent, the collective after them (the module docstring).
    The parents are the measured ones (``placement`` as filled so far). O(n) name checks over the
    distinct names; when some CPU backend record has joined ops, one pass over the linked ops and
    O(k log k) for its k children."""
    et, event_of_op = result.et, result.match.event_of_op
    backend_names = {name for name in set(et.names) if name.startswith(CPU_BACKEND_PREFIXES)}
    if not backend_names:
        return
    records = {i for i, name in enumerate(et.names) if name in backend_names and event_of_op[i] >= 0}
    if not records:
        return
    parent_index = et.parent_index()
    measured_parent = placement.parent.get
    children: dict[int, list[int]] = {}
    for i, e in enumerate(event_of_op):
        if e >= 0:
            p = measured_parent(i, parent_index[i])
            if p in records:
                children.setdefault(p, []).append(i)
    columns = result.kineto.cpu_columns()
    ts, dur = columns.ts, columns.dur
    for record, members in children.items():
        grandparent = measured_parent(record, parent_index[record])
        if grandparent < 0:
            continue
        spans = sorted((ts[event_of_op[i]], ts[event_of_op[i]] + dur[event_of_op[i]], i) for i in members)
        e = event_of_op[record]
        before = _ops_before_longest_gap(ts[e], ts[e] + dur[e], spans)
        for i in before:
            placement.parent[i] = grandparent
        if before:
            placement.prepared_by[record] = before


def _ops_before_longest_gap(start: float, end: float, spans: list[tuple[float, float, int]]) -> list[int]:
    """Of ``spans`` ((start, end, op) in start order, inside [start, end]), the ops that lie before
    the longest stretch of [start, end] that none of them covers (the first of equal ones). O(k)."""
    longest, cut, reached = spans[0][0] - start, 0, start
    for k, (begin, finish, _) in enumerate(spans):
        if begin - reached > longest:
            longest, cut = begin - reached, k
        reached = max(reached, finish)
    if end - reached > longest:
        cut = len(spans)
    return [op for _, _, op in spans[:cut]]


def _thread_homes(et, placement: Placement, op_tids: list[int], threads: list) -> tuple[Counter, dict]:
    """(ET thread, Kineto thread) -> linked ops, and each Kineto thread's ET thread (``_homes``);
    a Kineto thread no ET thread holds most of gets a new number (``placement.new_threads``).
    O(ops)."""
    if len(set(threads)) == 1 and len(set(op_tids)) == 1:  # one thread each (most traces): nothing moved
        counts = Counter({(op_tids[0], threads[0]): len(op_tids)})
    else:
        counts = Counter(zip(op_tids, threads))
    home = _homes(counts)
    next_tid = max(et.tid, default=0) + 1
    for k in sorted({k for _, k in counts if k not in home}, key=str):
        home[k] = placement.new_threads[k] = next_tid
        next_tid += 1
    return counts, home


def apply_placement(et, placement: Placement) -> None:
    """Write ``placement`` into ``et``: its ``tid`` / ``parent`` columns and the nodes' parent
    field (``ctrl_deps`` or ``parent``, as the layout has it); drops what was derived from the old
    columns (the parent positions the ET keeps). O(changed ops)."""
    if not placement.tid and not placement.parent:
        return
    for i, t in placement.tid.items():
        et.tid[i] = t
        et.nodes[i].tid = t  # the ET+ JSON says where it ran (a nested node gets a flat ``tid``)
    for i, p in placement.parent.items():
        et.set_parent(i, et.ids[p])

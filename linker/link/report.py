"""The link report: what was done and how good it is (``--report`` JSON, stderr summary)."""

from __future__ import annotations

import re
from array import array
from dataclasses import asdict, dataclass, field

from linker.read.et import ROOT_NAMES, ExecutionTrace
from linker.link.gpu import (BEFORE_TRACE, OUTSIDE_WINDOW, REASON_WORDS, UNDER_ANNOTATION, UNDER_GRAPH_OP, UNDER_OP,
                             UNDER_PROCESS_ROOT, UNDER_PYTHON_FUNCTION, GpuAttribution)
from linker.link.intervals import NESTING_SLACK_US
from linker.link.measured import outlives_its_call
from linker.read.kineto import KinetoTrace
from linker.link.threads import OpMatch
from linker.link.windows import Window

EXAMPLES = 10

# Plain words for the report's internal problem names (the JSON keeps the names as keys).
@dataclass
class Unmatched:
    count: int
    examples: list[dict]


# The linking methods in the summary's words (the report's ``method`` keeps the option's names):
# "exact" is order alignment, not a claim that every link is exact.
METHOD_WORDS = {"rf_id": "rf_id", "exact": "order alignment", "approximate": "structure matching"}


@dataclass
class LinkReport:
    et_file: str
    kineto_file: str
    et_schema: str
    et_layout: str
    method: str
    method_reason: list[str]
    et_ops: int
    linked_ops: int
    linked_pct: float
    kineto_cpu_events: int  # in the window used
    gpu_events: int
    gpu_events_linked: int
    gpu_linked_pct: float
    gpu_attribution: dict
    unmatched: dict
    threads: list[dict]
    window: dict | None
    nesting_violations: int
    warnings: list[str]
    seconds: float
    match_stats: dict = field(default_factory=dict)
    # Where the host graph came from: "execution trace" or "kineto" (built from the Kineto trace alone).
    host_graph: str = "execution trace"
    gpu_events_in_trace: int = 0  # every kernel/memcpy/memset of the file, window or not
    # Every GPU event of the file under one reason, in words: [{"reason", "count", "meaning"}].
    gpu_accounting: list = field(default_factory=list)
    # Filled once a writer computed the dependency plan (pipeline.add_simulation_counts):
    dependencies: int = 0  # data dependencies written
    dependency_causes: dict = field(default_factory=dict)  # cause -> data dependencies
    simulation: dict = field(default_factory=dict)  # blocked / host-gap / busy totals, waits
    # Joined ops whose ET thread or parent the measured trace contradicts (rf_id joins; ``measured``):
    # {"ops", "moved_thread", "parent_replaced", "new_threads"}; the measurement is used for them.
    et_tree_disagrees: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self, total_seconds: float | None = None) -> str:
        """The stderr summary, in plain words; its WARNING lines are exactly the report's ``warnings``.

        The headline counts every GPU event of the file: attached, outside the linked iteration,
        launched before the trace, not attached (the JSON keys keep the internal reason names)."""
        timing = (f"in {total_seconds:.2f}s (matching {self.seconds:.2f}s)" if total_seconds is not None
                  else f"(matching {self.seconds:.2f}s)")
        if self.host_graph != "execution trace":
            head = f"et-link: no ET: host graph of {self.et_ops:,} ops built from the Kineto trace alone"
        else:
            head = (f"et-link: {METHOD_WORDS.get(self.method, self.method)}: linked {self.linked_ops:,}/"
                    f"{self.et_ops:,} ET ops ({self.linked_pct:.2f}%)")
        lines = [f"{head}, {self._gpu_headline()} {timing}"]
        lines += [f"  {reason}" for reason in self.method_reason]
        if self.gpu_accounting:
            lines.append(f"  GPU events in the file: {self.gpu_events_in_trace:,}")
            lines += [f"    {row['count']:,}: {row['meaning']}" for row in self.gpu_accounting]
        if self.window:
            lines.append(f"  window: {_window_words(self.window['label'])} ({self.window['source']}, "
                         f"{self.window['candidates']} candidates)")
        et_unmatched = self.unmatched["et"]["count"]
        k_unmatched = self.unmatched["kineto"]["count"]
        if self.host_graph == "execution trace":
            lines.append(f"  unmatched: {et_unmatched:,} ET ops, {k_unmatched:,} Kineto CPU events")
        if self.dependency_causes:
            lines.append(f"  dependencies: {self.dependencies:,} (" + ", ".join(
                f"{cause} {count:,}" for cause, count in self.dependency_causes.items()) + ")")
        lines += [f"  WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _gpu_headline(self) -> str:
        """"GPU events: 261 of 10,356 attached (2.52%; 10,095 outside the linked iteration)"."""
        if not self.gpu_events and not self.gpu_events_in_trace:
            return "no GPU events in the Kineto trace (CPU-only run)"
        if not self.gpu_accounting:
            return f"GPU events: {self.gpu_events_linked:,} of {self.gpu_events:,} attached"
        parts = gpu_headline_parts(self.gpu_accounting)
        total = sum(parts.values())
        share = [f"{100.0 * parts['attached'] / total:.2f}%"] if total else []
        share += [f"{parts[key]:,} {words}" for key, words in GPU_PART_WORDS.items() if parts[key]]
        return f"GPU events: {parts['attached']:,} of {total:,} attached" + (f" ({'; '.join(share)})" if share else "")


# The headline's parts other than "attached", in words and in the order printed.
GPU_PART_WORDS = {"outside": "outside the linked iteration", "before": "launched before the trace",
                  "unattached": "not attached"}

# Each GPU accounting reason in one of the headline's parts (attached unless named here).
_GPU_PART = {UNDER_OP: "attached", UNDER_GRAPH_OP: "attached", UNDER_ANNOTATION: "attached",
             UNDER_PYTHON_FUNCTION: "attached", OUTSIDE_WINDOW: "outside", UNDER_PROCESS_ROOT: "before",
             BEFORE_TRACE: "before"}

def gpu_headline_parts(accounting: list[dict]) -> dict[str, int]:
    """Every GPU event of the file in one of the headline's parts (``attached``, ``outside`` the
    linked iteration, launched ``before`` the trace, ``unattached``), from the report's
    ``gpu_accounting`` rows. O(rows)."""
    parts = dict.fromkeys(("attached", "outside", "before", "unattached"), 0)
    for row in accounting:
        parts[_GPU_PART.get(row["reason"], "unattached")] += row["count"]
    return parts


_CUT_LABEL = re.compile(r"\(cut at '(.*)', located by '(.*)'\)")


def _window_words(label: str) -> str:
    """A window label in words: "iteration 1 (cut at 'a', located by 'b')" ->
    "iteration 1 (starts at 'a'; found by 'b', which runs once per iteration)"."""
    return _CUT_LABEL.sub(lambda m: f"(starts at '{m.group(1)}'; found by '{m.group(2)}', which runs once "
                                    "per iteration)", label)


def nesting_violations(et: ExecutionTrace, kineto: KinetoTrace, event_of_op: list[int],
                       nesting: tuple[list, list] | None = None) -> int:
    """Linked ops whose Kineto interval is not inside their linked ET parent's (``lies_within``,
    written out), a CPU backend's send or receive record aside (``measured.outlives_its_call``).
    ``nesting``: the CPU events' (nesting parents, ``ts + dur``) columns (the ends a list or an
    ``array('d')``) when at hand: the usual pair, an op whose parent's event is its event's nesting
    parent, then needs only the end check (that parent starts no later: ``cpu_events`` are in start
    order per thread), read from the columns, and the pairs to check in full from
    ``KinetoTrace.cpu_columns``. O(n)."""
    slack = NESTING_SLACK_US
    outer_of = [*event_of_op, -1]  # an op without a parent (-1) reads the -1 at the end
    pairs = zip(event_of_op, [outer_of[p] for p in et.parent_index()])
    outside: list[int] = []  # ops outside their parent's interval
    if nesting is None:
        events = kineto.cpu_events
        for i, (inner, outer) in enumerate(pairs):
            if (inner | outer) >= 0:  # both linked
                a, b = events[inner], events[outer]
                if not (b.ts - slack <= a.ts and a.ts + a.dur <= b.ts + b.dur + slack):
                    outside.append(i)
    else:
        parent, end = nesting
        end = end.tolist() if isinstance(end, array) else end  # read twice per op: floats made once
        columns = kineto.cpu_columns()
        for i, (inner, outer) in enumerate(pairs):
            # (inner | outer) >= 0: both linked; a violation at the end, or a pair to check in full.
            if (inner | outer) >= 0 and (parent[inner] != outer or end[inner] > end[outer] + slack):
                if parent[inner] == outer or not _lies_within(columns, inner, outer, slack):
                    outside.append(i)
    return sum(1 for i in outside if not outlives_its_call(et.names[i]))


def _lies_within(columns, inner: int, outer: int, slack: float) -> bool:
    """``lies_within`` of two CPU events, read from their columns."""
    ts, dur = columns.ts, columns.dur
    return ts[outer] - slack <= ts[inner] and ts[inner] + dur[inner] <= ts[outer] + dur[outer] + slack


def _window_dict(window: Window | None) -> dict | None:
    if window is None:
        return None
    return {"label": window.label, "source": window.source, "start_us": window.start,
            "end_us": window.end, "index": window.index, "segments": window.segments,
            "candidates": window.candidates, "score": round(window.score, 4)}


def _unlinked_events(event_of_op: list[int], in_window, events: int, op_of_event: list[int] | None) -> list[int]:
    """The events of the window no op is linked to. O(n); none to look for when the inverse
    (``op_of_event``) has no -1 and the window is the whole trace."""
    if op_of_event is None:
        used = set(event_of_op)
        return [i for i in in_window if i not in used]
    if len(in_window) == events and op_of_event.count(-1) == 0:
        return []
    return [i for i in in_window if op_of_event[i] < 0]


def build_report(et: ExecutionTrace, kineto: KinetoTrace, match: OpMatch, window: Window | None,
                 gpu: GpuAttribution, notes: list[str], warnings: list[str], seconds: float,
                 nesting: tuple[list, list] | None = None, op_of_event: list[int] | None = None) -> LinkReport:
    """The report of one link. ``nesting``: the CPU events' (nesting parents, ``ts + dur``)
    columns, ``op_of_event`` the inverse of ``match.event_of_op``, when at hand."""
    ops = et.op_indices()
    event_of_op = match.event_of_op
    events = kineto.cpu_count()
    in_window = (range(events) if window is None
                 else [i for i, ts in enumerate(kineto.cpu_columns().ts) if window.contains(ts)])
    et_missing = [i for i in ops if event_of_op[i] < 0]
    linked = len(ops) - len(et_missing)
    k_missing = _unlinked_events(event_of_op, in_window, events, op_of_event)
    columns = kineto.cpu_columns()  # not the events: pending ones stay encoded (``schedule.kineto_child``)
    unmatched = {
        "et": asdict(Unmatched(len(et_missing), [
            {"id": et.ids[i], "name": et.names[i], "tid": et.tid[i]} for i in et_missing[:EXAMPLES]])),
        "kineto": asdict(Unmatched(len(k_missing), [
            {"name": columns.name[i], "tid": columns.tid[i], "ts": columns.ts[i]} for i in k_missing[:EXAMPLES]])),
    }
    gpu_total = len(gpu.links)
    adopted = gpu.placement_counts[UNDER_PROCESS_ROOT]  # launched before the trace: not in the share
    launched_in_trace = gpu_total - gpu.problem_counts[BEFORE_TRACE] - adopted
    gpu_linked = gpu.attributed
    violations = nesting_violations(et, kineto, match.event_of_op, nesting)
    warnings = list(warnings) + _link_warnings(et, match, gpu, violations, len(et_missing))
    return LinkReport(
        et_file=et.path, kineto_file=kineto.path, et_schema=et.schema, et_layout=et.layout,
        method=match.method, method_reason=notes + match.notes,
        et_ops=len(ops), linked_ops=linked,
        linked_pct=round(100.0 * linked / len(ops), 3) if ops else 0.0,
        kineto_cpu_events=len(in_window), gpu_events=gpu_total, gpu_events_linked=gpu_linked,
        # Work launched before the trace started cannot be attributed by anyone: not a failure.
        gpu_linked_pct=(round(100.0 * (gpu_linked - adopted) / launched_in_trace, 3) if launched_in_trace else 100.0),
        gpu_attribution=_gpu_attribution(gpu),
        unmatched=unmatched,
        threads=[asdict(p) | {"kineto_thread": list(p.kineto_thread)} for p in match.threads],
        window=_window_dict(window), nesting_violations=violations, warnings=warnings,
        seconds=round(seconds, 3), match_stats=match.stats,
        gpu_events_in_trace=len(kineto.gpu_events), gpu_accounting=gpu_accounting(gpu),
    )


def _link_warnings(et: ExecutionTrace, match: OpMatch, gpu: GpuAttribution, violations: int,
                   unlinked_ops: int) -> list[str]:
    """The report's warnings of the link itself: GPU ops not attached (work launched before the
    trace started is expected, not a failure), ET threads without a Kineto counterpart, links
    that break the nesting (``violations``), ops left untimed."""
    warnings = []
    failures = {why: n for why, n in gpu.problem_counts.items() if why != BEFORE_TRACE}
    if failures:
        warnings.append("GPU ops not attached to any op: " + "; ".join(
            f"{n} {REASON_WORDS[why]}" for why, n in sorted(failures.items())))  # keys: gpu_attribution.problems
    if match.unpaired_et_threads:
        warnings.append(f"ET threads {match.unpaired_et_threads} have no Kineto counterpart "
                        "(their ops stay unlinked)")
    if violations:
        warnings.append(wrong_links_warning(violations))
    beyond = untimed_top_level_ops(et, match.event_of_op, unlinked_ops)
    if beyond:
        warnings.append(beyond)
    return warnings


def _gpu_attribution(gpu: GpuAttribution) -> dict:
    """The report's ``gpu_attribution``: how the GPU ops were attached, which were not (a few
    examples) and why."""
    unattributed = [
        {"name": l.event.name[:120], "correlation": l.event.args.correlation, "problem": l.problem}
        for l in gpu.links if l.et_index < 0][:EXAMPLES]
    return {"via": dict(gpu.via_counts), "problems": dict(gpu.problem_counts),
            "unattributed_examples": unattributed,
            "launch_names_not_in_known_list": dict(gpu.unknown_launch_names),
            "outside_window": gpu.outside_window,
            "placements": dict(gpu.placement_counts),
            "launch_names": dict(gpu.launch_names),
            "graph_launches": gpu.graph_launches,
            "graph_gpu_ops": gpu.graph_gpu_ops}


# An ET that covers more than its timing trace: the share of its ops left unmatched, and the share
# of those under top-level ops with no event at all, from which the report says so.
BEYOND_TRACE_UNMATCHED, BEYOND_TRACE_SHARE = 0.10, 0.90


def untimed_top_level_ops(et: ExecutionTrace, event_of_op: list[int], unmatched: int) -> str | None:
    """A warning when the ET covers more than the timing trace: at least ``BEYOND_TRACE_UNMATCHED``
    of its ops unmatched, ``BEYOND_TRACE_SHARE`` of those under top-level ops (ops whose parent
    is a process or thread root) none of whose ops has an event, while other top-level ops are
    linked (an ET observer started before the profiler, or stopped after it). None otherwise.
    O(n)."""
    ops = et.op_indices()
    if not ops or unmatched < BEYOND_TRACE_UNMATCHED * len(ops):
        return None
    top = _top_level_ops(et)
    size: dict[int, int] = {}
    timed: set[int] = set()
    for i in ops:
        size[top[i]] = size.get(top[i], 0) + 1
        if event_of_op[i] >= 0:
            timed.add(top[i])
    untimed = [t for t in size if t not in timed]
    inside = sum(size[t] for t in untimed)
    if not timed or not untimed or inside < BEYOND_TRACE_SHARE * unmatched:
        return None
    untimed.sort()
    names = ", ".join(repr(et.names[t]) for t in untimed[:3]) + (", ..." if len(untimed) > 3 else "")
    elsewhere = {et.tid[t] for t in untimed} - {et.tid[t] for t in timed}
    why = (f"on {len(elsewhere):,} ET thread(s) with no op in the timing trace" if elsewhere
           else "outside the stretch the timing trace covers (an ET observer started before the profiler or stopped "
                "after it: record both over the same steps)")
    return (f"{inside:,} of the {unmatched:,} unmatched ET ops lie under {len(untimed):,} top-level ops with no event in "
            f"the timing trace ({names}), {why}; those ops keep no measured time")


def _top_level_ops(et: ExecutionTrace) -> list[int]:
    """Per node, the top-level op above it (itself for one whose parent is a root or missing), -1 for
    a root. O(n): each node's chain is walked once, then remembered."""
    parent, names = et.parent_index(), et.names
    unknown, walking = -2, -3
    top = [unknown] * len(names)
    for i in range(len(names)):
        chain = []
        j = i
        while top[j] == unknown:
            if names[j] in ROOT_NAMES:
                top[j] = -1
                break
            p = parent[j]
            if p < 0 or names[p] in ROOT_NAMES:
                top[j] = j
                break
            top[j] = walking
            chain.append(j)
            j = p
        above = top[j] if top[j] != walking else -1  # walking: a parent cycle, under no top-level op
        for k in chain:
            top[k] = above
    return top


def wrong_links_warning(violations: int) -> str:
    return f"{violations} linked ops lie outside their linked parent's time interval (a sign of wrong links)"


def note_tree_disagreements(report: LinkReport, placement) -> None:
    """An rf_id join whose ET tree the measurement contradicts (``measured``): the links are
    certain, the tree is what is wrong. The report counts the ops (``et_tree_disagrees``) and says
    the measured thread and parent are used, instead of warning about wrong links."""
    if not placement.disagreements:
        return
    report.et_tree_disagrees = counts = placement.as_dict()
    prepared = counts.get("placed_before_their_collective", 0)
    report.method_reason.append(
        f"ET tree disagrees with the measurement on {counts['ops']} joined ops ({counts['moved_thread']} ran "
        f"on another thread, {counts['parent_replaced']} outside their ET parent"
        + (f", {prepared} run by a CPU collective's worker before it communicated, placed before it" if prepared else "")
        + "): their measured thread and parent are used")
    warning = wrong_links_warning(report.nesting_violations)
    report.warnings = [w for w in report.warnings if w != warning]


def gpu_accounting(gpu: GpuAttribution) -> list[dict]:
    """Every GPU event under one reason, with the reason in words; the counts add up to the
    GPU event count of the Kineto file."""
    return [{"reason": reason, "count": n, "meaning": REASON_WORDS[reason]}
            for reason, n in gpu.accounting().items()]


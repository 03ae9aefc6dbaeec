"""The linking pipeline: (ET, Kineto) -> ``LinkResult``.

1. same-run check (pids, op names); for auto/rf_id the rf_id join runs first, and its same-name
   pairs usually settle the name check without counting names;
2. choose the method: rf_id when the ids validate, else order (exact) alignment, else structure;
3. for order/structure methods, cut the Kineto events to the iteration window the ET covers;
4. nest the Kineto CPU events and take their exclusive durations (one sweep), attach GPU ops,
   check the links' nesting, and fill the report.

Cost on the rf_id path: a few O(n) passes; each Kineto CPU event's fields are read about twice
(rf join, nesting sweep), the rest works on plain columns.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from linker.link.durations import CpuNesting, linked_ancestors, nest_cpu_events
from linker.model.errors import MismatchedPairError, OptionError
from linker.read.et import ExecutionTrace
from linker.link.gpu import GpuAttribution, adopt_before_trace, attribute_gpu_ops
from linker.read.kineto import KinetoTrace
from linker.link.threads import OpMatch
from linker.link.exact import match_by_order
from linker.link.measured import Placement, measured_placement
from linker.link.rfid import match_by_rf_id
from linker.link.report import LinkReport, build_report, note_tree_disagreements
from linker.link.windows import Window, choose_window

METHODS = ("auto", "rf_id", "exact", "approximate")
# In auto mode, fall back to structural matching when order alignment leaves more than this
# share of the ET's ops (on threads Kineto recorded) unmatched.
AUTO_APPROX_THRESHOLD = 0.02
# Below this share of shared op names, an ET and a Kineto trace are not from the same run.
MIN_NAME_OVERLAP = 0.3


@dataclass
class LinkOptions:
    method: str = "auto"
    annotation: str | None = None
    window: int | None = None  # pick a Kineto window by index instead of by content
    force: bool = False  # link even when the pair looks like two different runs
    max_depth: int = 10  # approximate matching: tree depth matched structurally
    # "measured": the output carries the measured waits no dependency explains as wait nodes
    # (``sim.file_waits``, written by the command, the batch and ``linker.write_et_plus`` once the
    # output is complete); "explained": the graph's own dependencies only.
    waits: str = "measured"


@dataclass
class LinkResult:
    et: ExecutionTrace
    kineto: KinetoTrace
    match: OpMatch
    window: Window | None
    gpu: GpuAttribution
    parents: list[int]  # Kineto CPU event nesting parents
    exclusive: list[float]  # per Kineto CPU event
    report: LinkReport
    warnings: list[str] = field(default_factory=list)
    # Joined ops whose ET thread / parent the measurement contradicts (``measured``): applied by the build.
    placement: Placement = field(default_factory=Placement)
    # ``exclusive`` rounded as the ET+ writes it, when the nesting came with it (``CpuNesting.rounded``).
    exclusive_rounded: list[float] | None = None
    # Per Kineto CPU event, its linked op or -1: ``op_of_event`` of the match, made once by the link.
    op_of_event: list[int] | None = None
    _linked_above: np.ndarray | None = field(default=None, repr=False)

    def linked_ancestors(self) -> np.ndarray:
        """Per Kineto CPU event, its nearest enclosing event an op is linked to, or -1
        (``durations.linked_ancestors``): made on first use and kept, for the build's exclusive
        times and the plan's nesting both. O(n · depth) once."""
        if self._linked_above is None:
            ops = self.op_of_event if self.op_of_event is not None else op_of_event(self.match.event_of_op,
                                                                                     len(self.parents))
            self._linked_above = linked_ancestors(self.parents, np.asarray(ops, dtype=np.int64) >= 0)
        return self._linked_above


def check_same_run(et: ExecutionTrace, kineto: KinetoTrace, same_name_pairs: int = 0) -> list[str]:
    """Problems that say the two files come from different runs (empty when they agree).
    ``same_name_pairs``: ops already paired one-to-one with same-name events (an rf_id join):
    a lower bound of the shared names, enough when it clears the bar (the name counts, O(n),
    are then skipped)."""
    problems = []
    if et.pid is not None and kineto.pid is not None and et.pid != kineto.pid:
        problems.append(f"process ids differ (ET pid {et.pid}, Kineto pid {kineto.pid})")
    smaller = max(1, min(len(et.op_indices()), kineto.cpu_count()))
    if same_name_pairs / smaller >= MIN_NAME_OVERLAP:
        return problems
    names = et.names
    et_names = Counter([names[i] for i in et.op_indices()])
    k_names = Counter(kineto.cpu_columns().name)
    shared = sum(min(n, k_names[name]) for name, n in et_names.items())
    if shared / smaller < MIN_NAME_OVERLAP:
        problems.append(f"op names disagree (only {shared} of {smaller} ops share a name)")
    return problems


def _window_mask(kineto: KinetoTrace, window: Window | None) -> list[bool] | None:
    if window is None:
        return None
    return [window.contains(e.ts) for e in kineto.cpu_events]


def _match_structure(et, kineto, keep, options) -> OpMatch:
    from linker.link.approx import match_by_structure  # imported on first use: most runs never need it

    return match_by_structure(et, kineto, keep, max_depth=options.max_depth)


def _unmatched_share(et: ExecutionTrace, match: OpMatch) -> float:
    paired = {p.et_tid for p in match.threads}
    ops = [i for i in et.op_indices() if et.tid[i] in paired]
    if not ops:
        return 1.0
    return sum(1 for i in ops if match.event_of_op[i] < 0) / len(ops)


def choose_and_match(et: ExecutionTrace, kineto: KinetoTrace, options: LinkOptions, rf_join=None):
    """Run the requested (or automatically chosen) method. Returns (match, window, notes).
    ``rf_join``: ``match_by_rf_id``'s answer when the caller already has it."""
    notes: list[str] = []
    if options.method not in METHODS:
        raise OptionError(f"unknown method {options.method!r}; choose one of {', '.join(METHODS)}")
    if options.method in ("auto", "rf_id"):
        match, check = rf_join or match_by_rf_id(et, kineto)
        if check.usable:
            notes.append("record-function ids validated: joined on them")
            return match, None, notes
        if options.method == "rf_id":  # linking nothing would silently ignore the request
            raise OptionError(f"--match rf_id: the record-function ids of {et.path} and {kineto.path} "
                              f"cannot be trusted ({check.reason}); use --match auto or exact")
        notes.append(f"record-function ids not usable: {check.reason}; using order alignment")
    window = choose_window(et, kineto, options.annotation, options.window)
    keep = _window_mask(kineto, window)
    if options.method == "approximate":
        return _match_structure(et, kineto, keep, options), window, notes
    match = match_by_order(et, kineto, keep)
    if options.method == "auto":
        share = _unmatched_share(et, match)
        if share > AUTO_APPROX_THRESHOLD:
            structural = _match_structure(et, kineto, keep, options)
            if structural.linked > match.linked:
                notes.append(f"order alignment left {share:.1%} of ops unmatched; "
                             f"structural matching linked {structural.linked} vs {match.linked}: using it")
                return structural, window, notes
            notes.append(f"order alignment left {share:.1%} of ops unmatched; structural matching "
                         f"did no better ({structural.linked} vs {match.linked})")
    return match, window, notes


def unused_option_warnings(options: LinkOptions, method: str, window: Window | None) -> list[str]:
    """Say so when an option the user gave had no effect on this link (never silently ignored)."""
    warnings = []
    chosen = [f"--window {options.window}"] if options.window is not None else []
    chosen += [f"--annotation {options.annotation!r}"] if options.annotation else []
    if chosen and window is None:
        why = ("the record-function ids join ops to events directly, whatever the window" if method == "rf_id"
               else "it cuts the Kineto trace into a single segment, so the whole trace was used")
        warnings.append(f"{' and '.join(chosen)} had no effect: {why}")
    if options.max_depth != LinkOptions.max_depth and method != "approximate":
        warnings.append(f"--max-depth {options.max_depth} had no effect: it tunes approximate matching, "
                        f"and {method} matching was used")
    return warnings


def link(et: ExecutionTrace, kineto: KinetoTrace, options: LinkOptions | None = None,
         nesting: CpuNesting | None = None) -> LinkResult:
    """Link ``et`` with ``kineto``. Raises ``MismatchedPairError`` for two different runs unless
    ``options.force``. Does not modify its inputs; ``link.etplus.build_et_plus`` makes the ET+ of
    the result.
    ``nesting``: the nesting of ``kineto``'s CPU events when already made (``nest_cpu_events``)."""
    options = options or LinkOptions()
    started = time.perf_counter()
    warnings = []
    # The rf_id join (no side effects, never raises) comes first: its same-name pairs usually
    # settle the same-run check without counting names.
    rf_join = match_by_rf_id(et, kineto) if options.method in ("auto", "rf_id") else None
    same_name_pairs = rf_join[1].same_name_pairs if rf_join else 0
    problems = check_same_run(et, kineto, same_name_pairs)
    if problems:
        message = "the ET and the Kineto trace look like different runs: " + "; ".join(problems)
        if not options.force:
            raise MismatchedPairError(message + " (use --force to link anyway)")
        warnings.append(message)
    match, window, notes = choose_and_match(et, kineto, options, rf_join)
    warnings += unused_option_warnings(options, match.method, window)
    if nesting is None:
        nesting = nest_cpu_events(kineto.cpu_events)
    ops = op_of_event(match.event_of_op, kineto.cpu_count())
    gpu = attribute_gpu_ops(kineto, ops, nesting, window)
    adopt_before_trace(gpu, et.process_root())
    report = build_report(et, kineto, match, window, gpu, notes, warnings, seconds=time.perf_counter() - started,
                          nesting=(nesting.parents, nesting.end), op_of_event=ops)
    result = LinkResult(et, kineto, match, window, gpu, nesting.parents, nesting.exclusive, report, warnings,
                        exclusive_rounded=nesting.rounded, op_of_event=ops)
    result.placement = measured_placement(result, report.nesting_violations)
    note_tree_disagreements(report, result.placement)
    return result


def op_of_event(event_of_op: list[int], events: int) -> list[int]:
    """The inverse of ``event_of_op``: per Kineto CPU event, its (last) ET op or -1. O(n)
    (a plain loop: 4x faster here than building the inverse as a dict in C)."""
    ops = [-1] * events
    for i, e in enumerate(event_of_op):
        if e >= 0:
            ops[e] = i
    return ops

"""The link report: what was done and how good it is (``--report`` JSON, stderr summary)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .et_reader import ExecutionTrace
from .gpu import GpuAttribution
from .intervals import lies_within
from .kineto_reader import KinetoTrace
from .match import OpMatch
from .windows import Window

EXAMPLES = 10


@dataclass
class Unmatched:
    count: int
    examples: list[dict]


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

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        lines = [
            f"et-link: {self.method}: linked {self.linked_ops}/{self.et_ops} ET ops "
            f"({self.linked_pct:.2f}%), {self.gpu_events_linked}/{self.gpu_events} GPU ops attached "
            f"({self.gpu_linked_pct:.2f}%) in {self.seconds:.2f}s",
        ]
        lines += [f"  {reason}" for reason in self.method_reason]
        if self.window:
            lines.append(f"  window: {self.window['label']} ({self.window['source']}, "
                         f"{self.window['candidates']} candidates)")
        et_unmatched = self.unmatched["et"]["count"]
        k_unmatched = self.unmatched["kineto"]["count"]
        lines.append(f"  unmatched: {et_unmatched} ET ops, {k_unmatched} Kineto CPU events")
        if self.nesting_violations:
            lines.append(f"  WARNING: {self.nesting_violations} linked ops lie outside their parent's interval")
        lines += [f"  WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)


def nesting_violations(et: ExecutionTrace, kineto: KinetoTrace, event_of_op: list[int]) -> int:
    """Linked ops whose Kineto interval is not inside their linked ET parent's. O(n)."""
    parent_index = et.parent_index()
    events = kineto.cpu_events
    bad = 0
    for e, p in zip(event_of_op, parent_index):
        if e < 0 or p < 0:
            continue
        pe = event_of_op[p]
        if pe >= 0 and not lies_within(events[e], events[pe]):
            bad += 1
    return bad


def _window_dict(window: Window | None) -> dict | None:
    if window is None:
        return None
    return {"label": window.label, "source": window.source, "start_us": window.start,
            "end_us": window.end, "index": window.index, "segments": window.segments,
            "candidates": window.candidates, "score": round(window.score, 4)}


def build_report(et: ExecutionTrace, kineto: KinetoTrace, match: OpMatch, window: Window | None,
                 gpu: GpuAttribution, notes: list[str], warnings: list[str], seconds: float) -> LinkReport:
    ops = et.op_indices()
    event_of_op = match.event_of_op
    events = kineto.cpu_events
    in_window = (range(len(events)) if window is None
                 else [i for i, e in enumerate(events) if window.contains(e.ts)])
    used = set(event_of_op)
    et_missing = [i for i in ops if event_of_op[i] < 0]
    linked = len(ops) - len(et_missing)
    k_missing = [i for i in in_window if i not in used]
    unmatched = {
        "et": asdict(Unmatched(len(et_missing), [
            {"id": et.ids[i], "name": et.names[i], "tid": et.tid[i]} for i in et_missing[:EXAMPLES]])),
        "kineto": asdict(Unmatched(len(k_missing), [
            {"name": events[i].name, "tid": events[i].tid, "ts": events[i].ts} for i in k_missing[:EXAMPLES]])),
    }
    gpu_total = len(gpu.links)
    gpu_linked = gpu.attributed
    unattributed = [
        {"name": l.event.name[:120], "correlation": l.event.args.correlation, "problem": l.problem}
        for l in gpu.links if l.et_index < 0][:EXAMPLES]
    warnings = list(warnings)
    if gpu.problem_counts:
        warnings.append("GPU ops not attributed: " + ", ".join(
            f"{n} {why}" for why, n in sorted(gpu.problem_counts.items())))
    if match.unpaired_et_threads:
        warnings.append(f"ET threads {match.unpaired_et_threads} have no Kineto counterpart")
    violations = nesting_violations(et, kineto, match.event_of_op)
    return LinkReport(
        et_file=et.path, kineto_file=kineto.path, et_schema=et.schema, et_layout=et.layout,
        method=match.method, method_reason=notes + match.notes,
        et_ops=len(ops), linked_ops=linked,
        linked_pct=round(100.0 * linked / len(ops), 3) if ops else 0.0,
        kineto_cpu_events=len(in_window), gpu_events=gpu_total, gpu_events_linked=gpu_linked,
        gpu_linked_pct=round(100.0 * gpu_linked / gpu_total, 3) if gpu_total else 100.0,
        gpu_attribution={"via": dict(gpu.via_counts), "problems": dict(gpu.problem_counts),
                         "unattributed_examples": unattributed,
                         "launch_names_not_in_known_list": dict(gpu.unknown_launch_names),
                         "outside_window": gpu.outside_window},
        unmatched=unmatched,
        threads=[asdict(p) | {"kineto_thread": list(p.kineto_thread)} for p in match.threads],
        window=_window_dict(window), nesting_violations=violations, warnings=warnings,
        seconds=round(seconds, 3), match_stats=match.stats,
    )

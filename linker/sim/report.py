"""What ``et-link simulate`` prints: a ``SimReport`` built from a replay, as text or as one JSON object.

The ratios (docs/fidelity.md says the same):
- one rank: ``ratio`` = ``simulated_us`` (the replay's end) ÷ ``measured_us`` (its measured step,
  earliest start to latest end of its timed nodes);
- a job: one metric, the *job span*, from one origin. When the ranks' clocks agree (one host clock:
  ``engine.measured_release``), the origin is the earliest measured start of any rank, which is
  the replay's time 0 (``--rank-start measured`` releases each rank at its offset from it;
  ``zero`` releases all at 0): ``measured_us`` = latest measured end − earliest measured start,
  ``simulated_us`` = the replay's latest end, ``ratio`` = simulated_us ÷ measured_us,
  ``job_origin`` = "earliest measured start". When the clocks disagree there is no common origin:
  each rank is measured from its own start, ``measured_us`` = the slowest rank's measured step,
  ``simulated_us`` = the replay's latest end (every rank starts at 0), ``job_origin`` = "each
  rank's own start".
- per rank (``ranks``): ``measured_us`` / ``simulated_us`` / ``ratio``: its own step (measured
  first start to last end; replayed from its release to its last end); ``measured_end_us`` /
  ``simulated_end_us`` / ``end_ratio``: its end seen from the job's origin (measured end − job
  origin; replayed end), so the job's ``ratio`` is the largest end over the largest end.

Other JSON keys: ``model``, ``scale``, ``finished``, ``never_issued`` (count of nodes never
issued), ``never_issued_examples``, ``stalls`` (communication that could not complete: ranks that
reached it, ranks that did not and why), ``busy_us`` (simulated busy time per kind: cpu, gpu,
comm, over all ranks), ``busy_by_unit`` (per rank and unit), ``rank_start_us`` (when each rank
starts in the replay), ``measured_job_span_us`` (earliest start to latest end over all ranks,
when clocks agree), ``slowest_rank`` (longest measured step), ``peer_wait_us`` (time collectives
held a unit waiting for peer ranks), ``critical_path`` (top ops on it: name, kind, us, count),
``critical_path_us_by_kind``, ``critical_path_links`` (how the path enters its nodes: a
dependency's cause from the file, "unit", "peer", "start"; count and time), ``notes`` (fallbacks
the readers used, matching remarks, and, for a rank replayed below 0.97 of its measured step, the
GPU wait the graph cannot reproduce when it is 1% of the measured step or more),
``unheld_gpu_wait`` (per rank: ``us``, the largest per-stream total of GPU ops' waits after all
their dependencies had finished on the measured timeline, ``streams``, ``largest``; see
``unheld``), ``drift`` (``--explain`` only: ``explain``), ``network`` (``--network`` only: the
fitted network per backend and the what-if, ``network.NetworkWhatIf.to_json``). Cost: O(n) over
the replay.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from linker.model.units import format_us, unit_for
from linker.sim.critical import CriticalOp, PathLink, PathStep, critical_path, path_links, time_by_kind, top_ops
from linker.sim.diagnose import Diagnosis, diagnose
from linker.sim.engine import Replay, measured_release
from linker.sim.explain import LINK_WORDS, drift_report, format_drift, short_name
from linker.sim.graph import KIND_NAMES
from linker.sim.unheld import UnheldWait, unheld_gpu_wait, unheld_note

EXAMPLES = 10


@dataclass
class RankSummary:
    rank: int
    file: str
    nodes: int
    measured_us: float
    simulated_us: float
    ratio: float | None
    measured_end_us: float | None = None  # measured end − the job's origin (None: no common origin)
    simulated_end_us: float | None = None  # the replay's end of this rank (its release included)
    end_ratio: float | None = None


@dataclass
class UnitBusy:
    rank: int
    unit: str
    busy_us: float
    nodes: int


@dataclass
class WaitsSummary:
    """How the measured waits no dependency explains (``engine.measured_holds``) were replayed, and
    the ratio either way: ``mode`` ("measured": replayed as waits; "explained": left out), the
    ratios with them and without them, ``explained_share`` (the replay without them over the replay
    with them: the part of the step the graph's own dependencies account for), and the waits held:
    ``ops``, ``us`` in all, ``by_cause`` (µs per cause)."""

    mode: str
    ratio_with_measured_waits: float | None
    ratio_explained: float | None
    explained_share: float | None
    ops: int
    us: float
    by_cause: dict[str, float]
    rank_ratios_with_measured_waits: list[float | None] = field(default_factory=list)  # per rank, its own step
    rank_ratios_explained: list[float | None] = field(default_factory=list)


def replay_end(rp: Replay) -> float:
    """The replay's latest end (a rank's release counts: a rank with nothing to run ends there). O(n)."""
    return max((e for e in rp.end if not math.isnan(e)), default=max(rp.release, default=0.0))


def waits_summary(mode: str, with_waits: Replay, without: Replay, measured_us: float) -> WaitsSummary:
    """The ``WaitsSummary`` of two replays of the same graphs, with and without the waits: the
    holds of ``engine.measured_holds`` and the wait nodes the files carry."""
    by_cause: dict[str, float] = {}
    for us, cause, _ in with_waits.holds.values():
        by_cause[cause] = by_cause.get(cause, 0.0) + us
    graphs_waits = [graph.wait_nodes for graph in with_waits.graphs] if with_waits.wait_nodes else []
    for graph, waits in zip(with_waits.graphs, graphs_waits):
        for u, cause in waits.items():
            by_cause[cause] = by_cause.get(cause, 0.0) + graph.duration[u]
    held_end, graph_end = replay_end(with_waits), replay_end(without)
    return WaitsSummary(mode, _ratio(held_end, measured_us), _ratio(graph_end, measured_us),
                        round(graph_end / held_end, 4) if held_end > 0 else None,
                        len(with_waits.holds) + sum(map(len, graphs_waits)),
                        round(sum(by_cause.values()), 3), {k: round(v, 3) for k, v in sorted(by_cause.items())},
                        [rank.ratio for rank in rank_summaries(with_waits)],
                        [rank.ratio for rank in rank_summaries(without)])


@dataclass
class SimReport:
    model: str
    scale: dict
    measured_us: float
    simulated_us: float
    ratio: float | None
    finished: bool
    never_issued: int
    never_issued_examples: list[dict]
    stalls: list[dict]
    busy_us: dict[str, float]
    busy_by_unit: list[UnitBusy]
    peer_wait_us: float
    critical_path: list[CriticalOp]
    critical_path_us_by_kind: dict[str, float]
    critical_path_links: list[PathLink]
    ranks: list[RankSummary]
    slowest_rank: int
    rank_start_us: list[float]  # when each rank was released in the replay (its measured start offset, or 0)
    measured_job_span_us: float | None  # latest measured end minus earliest start over all ranks (clocks agree)
    job_origin: str = "the rank's own start"  # what ``measured_us`` and ``simulated_us`` are measured from
    notes: list[str] = field(default_factory=list)
    cycle_example: list[dict] = field(default_factory=list)
    unheld_gpu_wait: list[UnheldWait] = field(default_factory=list)  # per rank, see ``unheld``
    drift: dict | None = None  # ``explain.drift_report`` when asked for (``--explain``)
    waits: WaitsSummary | None = None  # how the measured waits were replayed (``simulate``)
    # The iterations the capture marks (``ProfilerStep#N`` ops) of the slowest rank: their names,
    # first and last, and their measured mean (µs); none when it marks none.
    iterations: int = 0
    iteration_names: list[str] = field(default_factory=list)
    measured_iteration_us: float | None = None
    # ``network.NetworkWhatIf`` of ``--network`` (the fitted network and the what-if); the JSON key
    # ``network`` is there only when one was asked for.
    network: object | None = None

    def to_json(self) -> dict:
        if self.network is None:
            out = asdict(self)
            del out["network"]
            return out
        out = asdict(replace(self, network=None))
        del out["network"]
        out["network"] = self.network.to_json()
        return out


def _ratio(simulated: float, measured: float) -> float | None:
    return round(simulated / measured, 4) if measured > 0 else None


def _node_ref(rp: Replay, u: int) -> dict:
    graph, local = rp.local(u)
    return {"rank": graph.rank, "id": graph.ids[local], "name": graph.names[local]}


def rank_summaries(rp: Replay) -> list[RankSummary]:
    """Measured and simulated step per rank; a rank's simulated step is the end of its last node."""
    summaries = []
    for graph, base in zip(rp.graphs, rp.offsets):
        release = rp.release[len(summaries)]
        last = release
        for e in rp.end[base:base + len(graph)]:
            if not math.isnan(e) and e > last:
                last = e
        measured = graph.measured_step()
        simulated = last - release
        summaries.append(RankSummary(graph.rank, graph.path, len(graph), measured, simulated,
                                     _ratio(simulated, measured)))
    return summaries


def busy_times(rp: Replay) -> tuple[dict[str, float], list[UnitBusy], float]:
    """Busy µs per kind and per unit (start to end of each node that ran; a wait node of the file
    is a wait, not busy time), and the peer wait."""
    by_kind = {name: 0.0 for name in KIND_NAMES}
    unit_busy = [0.0] * len(rp.unit_names)
    unit_nodes = [0] * len(rp.unit_names)
    peer_wait = 0.0
    for graph, base in zip(rp.graphs, rp.offsets):
        waits = graph.wait_nodes
        for local, kind in enumerate(graph.kind):
            u = base + local
            s, e = rp.start[u], rp.end[u]
            if math.isnan(e) or local in waits:
                continue
            by_kind[KIND_NAMES[kind]] += e - s
            unit = rp.unit_of[u]
            if unit >= 0:
                unit_busy[unit] += e - s
                unit_nodes[unit] += 1
            if rp.groups.group_of[u] >= 0:
                peer_wait += s - rp.issue[u]
    del by_kind["metadata"]
    units = [UnitBusy(rp.graphs[r].rank, name, busy, count)
             for (r, name), busy, count in zip(rp.unit_names, unit_busy, unit_nodes) if count]
    return by_kind, units, peer_wait


def build_report(rp: Replay, top: int = 10, explain: bool = False) -> tuple[SimReport, list[PathStep], Diagnosis]:
    """The report of a replay, with the critical path and the diagnosis it was built from;
    ``explain``: with the drift places (``explain.drift_report``)."""
    ranks = rank_summaries(rp)
    slowest = max(ranks, key=lambda r: r.measured_us)
    simulated = max((r.simulated_us + release for r, release in zip(ranks, rp.release)), default=0.0)
    measured, origin, job_span = slowest.measured_us, ORIGIN_OWN, None
    if len(ranks) > 1:
        firsts = _job_ends(rp, ranks)
        if firsts is not None:
            job_span, origin = _job_span(rp), ORIGIN_EARLIEST
            measured = job_span
    path = critical_path(rp)
    diagnosis = diagnose(rp)
    by_kind, units, peer_wait = busy_times(rp)
    never = diagnosis.never_issued
    examples = []
    for item in never[:EXAMPLES]:
        ref = _node_ref(rp, item.node)
        ref["reason"] = item.reason
        if item.detail:
            ref["detail"] = item.detail
        if item.blocker >= 0:
            ref["blocked_by"] = _node_ref(rp, item.blocker)
        examples.append(ref)
    stalls = [{"process_group": s.process_group, "index": s.index, "comm_type": s.comm_type,
               "arrived_ranks": s.arrived_ranks,
               "missing_ranks": [{"rank": rank, "why": why} for rank, why in s.missing],
               "nodes": [_node_ref(rp, u) for u in s.nodes], "hint": s.hint} for s in diagnosis.stalls]
    notes = _rank_notes(rp)
    notes += rp.groups.notes
    unheld = [unheld_gpu_wait(graph) for graph in rp.graphs]
    for wait, rank in zip(unheld, ranks):
        note = unheld_note(wait, rank.measured_us, rank.simulated_us, len(ranks) > 1)
        if note:
            notes.append(note)
    report = SimReport(
        model=rp.model, scale={"cpu": rp.scale.cpu, "gpu": rp.scale.gpu, "comm": rp.scale.comm},
        measured_us=measured, simulated_us=simulated, ratio=_ratio(simulated, measured),
        finished=not diagnosis.never_ran, never_issued=len(never), never_issued_examples=examples,
        stalls=stalls, busy_us=by_kind, busy_by_unit=units, peer_wait_us=peer_wait,
        critical_path=top_ops(rp, path, top), critical_path_us_by_kind=time_by_kind(rp, path),
        critical_path_links=path_links(path),
        ranks=ranks, slowest_rank=slowest.rank, rank_start_us=list(rp.release),
        measured_job_span_us=job_span, job_origin=origin, notes=_dedupe(notes),
        cycle_example=[_node_ref(rp, u) for u in diagnosis.cycle_example[:EXAMPLES]], unheld_gpu_wait=unheld)
    slowest_graph = next(graph for graph in rp.graphs if graph.rank == slowest.rank)
    report.iterations, report.iteration_names, report.measured_iteration_us = marked_iterations(slowest_graph)
    if explain:
        report.drift = drift_report(rp, max(1, min(top, 10)), path)
    return report, path, diagnosis


ITERATION_PREFIX = "ProfilerStep#"  # the op torch.profiler wraps each profiled iteration in


def marked_iterations(graph) -> tuple[int, list[str], float | None]:
    """The iterations ``graph`` marks: how many ``ProfilerStep#N`` ops (timed, each counted once,
    not its later pieces), the first and last of their names in measured order, and their mean
    measured duration (µs; None when there are none). O(n)."""
    steps = sorted((graph.start[u], graph.names[u], graph.measured_dur[u]) for u in range(len(graph))
                   if graph.names[u].startswith(ITERATION_PREFIX) and u not in graph.continues
                   and not math.isnan(graph.start[u]))
    if not steps:
        return 0, [], None
    names = [steps[0][1]] + ([steps[-1][1]] if len(steps) > 1 else [])
    return len(steps), names, sum(dur for _, _, dur in steps) / len(steps)


def _rank_notes(rp: Replay) -> list[str]:
    """The readers' notes, each once, with the ranks it concerns ("all ranks" when every one)."""
    ranks_of: dict[str, list[int]] = {}
    for graph in rp.graphs:
        for note in graph.notes:
            ranks_of.setdefault(note, []).append(graph.rank)
    if len(rp.graphs) == 1:
        return list(ranks_of)
    return [f"{'all ranks' if len(ranks) == len(rp.graphs) else 'ranks ' + ', '.join(map(str, ranks))}: {note}"
            for note, ranks in ranks_of.items()]


ORIGIN_EARLIEST, ORIGIN_OWN = "earliest measured start", "each rank's own start"


def _job_ends(rp: Replay, ranks: list[RankSummary]) -> list[float] | None:
    """When the ranks' clocks agree: fill each rank's end from the job's origin (measured and
    replayed) into ``ranks`` and return the ranks' measured first starts; else None."""
    if measured_release(rp.graphs) is None:
        return None
    spans = [graph.measured_span() for graph in rp.graphs]
    origin = min(first for first, _ in spans)
    for summary, (_, last), release in zip(ranks, spans, rp.release):
        summary.measured_end_us = last - origin
        summary.simulated_end_us = summary.simulated_us + release
        summary.end_ratio = _ratio(summary.simulated_end_us, summary.measured_end_us)
    return [first for first, _ in spans]


def _job_span(rp: Replay) -> float:
    spans = [graph.measured_span() for graph in rp.graphs]
    return max(last for _, last in spans) - min(first for first, _ in spans)


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _us(value: float, unit: str = "") -> str:
    """µs in the unit that keeps it readable ("13.34 s", "14.35 ms", "850 µs"); ``unit`` forces one."""
    return format_us(value, unit)


def span_words(report: SimReport) -> str:
    """What one rank's measured span is: its step, or, where the capture marks iterations, the
    captured span with their count and measured mean."""
    if report.iterations < 2 or report.measured_iteration_us is None:
        return "step"
    return (f"captured span ({report.iterations} iterations, {' to '.join(report.iteration_names)}; "
            f"measured {_us(report.measured_iteration_us)} per iteration on average)")


def _waits_line(waits: WaitsSummary) -> str:
    """One line: how the measured waits were replayed and both ratios."""
    if not waits.ops:
        return "  waits: every op started when what it depends on had finished (nothing to hold)"
    ratio = {"with": waits.ratio_with_measured_waits, "without": waits.ratio_explained}
    shown = {k: f"{v:.3f}" if v is not None else "n/a" for k, v in ratio.items()}
    causes = ", ".join(f"{cause} {_us(us)}" for cause, us in waits.by_cause.items())
    share = f"{waits.explained_share:.1%}" if waits.explained_share is not None else "n/a"
    how = ("replayed as measured" if waits.mode == "measured" else "left out (--waits explained)")
    return (f"  waits the graph does not explain: {waits.ops} op{'s' if waits.ops != 1 else ''}, "
            f"{_us(waits.us)} in all ({causes}), {how}; ratio with them {shown['with']}, the graph alone "
            f"{shown['without']}: it explains {share} of the replayed step")


def format_text(report: SimReport) -> str:
    """The human-readable report."""
    lines = []
    job = len(report.ranks) > 1
    scale = ", ".join(f"{k}={v:g}" for k, v in report.scale.items())
    lines.append(f"simulate: {len(report.ranks)} rank{'s' if job else ''}, model {report.model}, scale {scale}")
    if job:
        unit = unit_for(max((max(r.measured_us, r.simulated_us) for r in report.ranks), default=0.0))
        lines.append(f"  {'rank':>4}  {'nodes':>8}  {'measured':>12}  {'simulated':>12}  {'ratio':>6}  file")
        for r in report.ranks:
            ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
            lines.append(f"  {r.rank:>4}  {r.nodes:>8}  {_us(r.measured_us, unit):>12}  {_us(r.simulated_us, unit):>12}  "
                         f"{ratio:>6}  {r.file}")
    ratio = f"{report.ratio:.3f}" if report.ratio is not None else "n/a (no measured time)"
    if not job:
        what = span_words(report)
    elif report.job_origin == ORIGIN_EARLIEST:
        what = "job span (earliest measured start to latest end, replay from the same origin)"
    else:
        what = f"job (clocks disagree: slowest rank {report.slowest_rank}'s own step vs the replay's end)"
    lines.append(f"{what}: measured {_us(report.measured_us)}, simulated {_us(report.simulated_us)}, "
                 f"ratio {ratio}")
    if report.waits is not None:
        lines.append(_waits_line(report.waits))
    if report.network is not None:
        lines += report.network.lines()
    if job and report.job_origin == ORIGIN_EARLIEST:
        starts = (f"ranks start at their measured offsets (up to {_us(max(report.rank_start_us))})"
                  if any(report.rank_start_us) else "every rank starts at 0 (--rank-start zero)")
        ends = ", ".join(f"{r.rank}: {r.end_ratio:.3f}" for r in report.ranks if r.end_ratio is not None)
        lines.append(f"  {starts}; each rank's end from the origin, simulated/measured: {ends}")
    lines.append("busy (simulated): " + ", ".join(f"{k} {_us(v)}" for k, v in report.busy_us.items())
                 + (f"; collectives waiting for peers {_us(report.peer_wait_us)}" if job else ""))
    for unit in sorted(report.busy_by_unit, key=lambda u: -u.busy_us)[:8]:
        share = unit.busy_us / report.simulated_us if report.simulated_us > 0 else 0.0
        lines.append(f"  {'rank ' + str(unit.rank) + ' ' if job else ''}{unit.unit}: {_us(unit.busy_us)} "
                     f"({share:.0%}), {unit.nodes} nodes")
    if report.finished:
        lines.append("never issued: none (every node ran)")
    else:
        lines.append(f"never issued: {report.never_issued} nodes; the replay cannot finish"
                     + (" (stalled communication below)" if report.stalls else ""))
        for ex in report.never_issued_examples:
            extra = f" ({ex['detail']})" if "detail" in ex else ""
            if "blocked_by" in ex:
                b = ex["blocked_by"]
                extra += f" <- node {b['id']} {b['name']!r} of rank {b['rank']}"
            lines.append(f"  rank {ex['rank']} node {ex['id']} {ex['name']!r}: {ex['reason']}{extra}")
        for ex in report.cycle_example[:1]:
            lines.append("  a cycle: " + " -> ".join(str(c["id"]) for c in report.cycle_example))
        if not report.measured_us:  # no node has a start time: not an output of et-link
            files = " ".join(str(r.file) for r in report.ranks) or "FILE"
            lines.append("  the file has no measured start times: it was not written by et-link (another "
                         f"converter's trace?); et-link validate {files} says what is wrong with its graph")
    for stall in report.stalls:
        lines.append(f"stall: {stall['comm_type']} #{stall['index']} on process group {stall['process_group']}: "
                     f"reached by ranks {stall['arrived_ranks']}")
        for missing in stall["missing_ranks"]:
            lines.append(f"  rank {missing['rank']} never reaches it: {missing['why']}")
        if stall["hint"]:
            lines.append(f"  hint: {stall['hint']}")
    if report.critical_path:
        kinds = ", ".join(f"{k} {_us(v)}" for k, v in report.critical_path_us_by_kind.items() if v > 0)
        lines.append(f"critical path: {kinds}")
        lines.append("  its ops start after: " + ", ".join(
            f"{LINK_WORDS.get(link.link, link.link)} ({link.count} op{'s' if link.count != 1 else ''}, {_us(link.us)})"
            for link in report.critical_path_links))
        unit = unit_for(max((op.us for op in report.critical_path), default=0.0))
        lines.append(f"  {'time on path':>12}  {'share':>5}  {'count':>5}  kind  op")
        for op in report.critical_path:
            share = op.us / report.simulated_us if report.simulated_us > 0 else 0.0
            lines.append(f"  {_us(op.us, unit):>12}  {share:>5.0%}  {op.count:>5}  {op.kind:<4}  {short_name(op.name)}")
    if report.drift is not None:
        lines += format_drift(report.drift, report.measured_us)
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)

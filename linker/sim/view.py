"""``et-link simulate --html``: one self-contained HTML page comparing the measured and the simulated run.

Drawn with plotly (the optional extra ``et-link[view]``), imported here only, when a page is
written; plotly.js is inlined once, so the page opens with no network. Contents:
- the headline (measured and simulated step, ratio), the report's notes and how to read the page;
- a job: measured vs simulated step per rank;
- busy time per resource (the replay's units) on each side, busy and waiting;
- the ops that take most time on the critical path;
- per rank, a timeline: each lane ("cpu thread 1", "gpu 0 stream 7") twice, measured above
  simulated, on one time axis in ms (``linker.sim.timeline``: measured nested ops as exclusive
  pieces, waits shaded); critical-path nodes in red; the ops where a lane gains or loses most time
  as diamonds, listed below; and under the critical path, where the replay drifts along it (the
  list of ``--explain``: ``explain.drift_report``).
A rank with more than ``MAX_BARS`` bars keeps its longest ones (the page says how many were left
out). Written atomically; the inputs are refused as output. Cost: O(n log n) for n nodes, plus
plotly's serialisation (about 1 s per 100k bars).
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from linker.model.errors import EtLinkError
from linker.model.units import format_us
from linker.write.sink import atomic_output
from linker.sim.engine import ASTRA_SIM, Replay
from linker.sim.graph import KIND_NAMES
from linker.sim.explain import LINK_WORDS, drift_report, short_name
from linker.sim.report import SimReport, span_words
from linker.sim.timeline import BUSY, MEASURED, SIMULATED, WAIT, RankTimeline, rank_timelines

MAX_BARS = 20_000  # per rank
NAME_CHARS = 70
KIND_COLORS = {"cpu": "#4C78A8", "gpu": "#54A24B", "comm": "#F58518", "metadata": "#9D9D9D"}
WAIT_COLOR = "rgba(140, 140, 140, 0.45)"
CRITICAL_COLOR = "#D62728"
DIVERGENCE_COLOR = "#7B2CBF"
INSTALL_HINT = "the HTML view needs plotly: pip install 'et-link[view]'"


class ViewUnavailable(EtLinkError, ImportError):
    """plotly is not installed (the user's to fix: ``pip install 'et-link[view]'``)."""


def require_plotly():
    try:
        import plotly.graph_objects as go
        import plotly.io as pio
        import plotly.offline as offline
    except ImportError:
        raise ViewUnavailable(INSTALL_HINT) from None
    return go, pio, offline


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"


def _row(lane: str, side: str) -> str:
    return f"{lane} ({side})"


def _kept(tl: RankTimeline) -> tuple[list[int], int]:
    """Indices of the bars drawn (the longest ``MAX_BARS``, in order) and how many were left out."""
    bars = tl.bars
    count = len(bars)
    if count <= MAX_BARS:
        return list(range(count)), 0
    longest = sorted(range(count), key=lambda i: bars.start[i] - bars.end[i])[:MAX_BARS]
    return sorted(longest), count - MAX_BARS


def _bar_trace(go, tl: RankTimeline, indices: list[int], name: str, color: str, legend: bool, pattern: str = ""):
    bars, graph = tl.bars, tl.graph
    text = [f"{html.escape(_short(graph.names[bars.node[i]]))}<br>node {graph.ids[bars.node[i]]}, "
            f"{KIND_NAMES[graph.kind[bars.node[i]]]}, {bars.side[i]} {bars.state[i]}<br>"
            f"{format_us(bars.start[i])} → {format_us(bars.end[i])} ({format_us(bars.end[i] - bars.start[i])})"
            + (f"<br>cause: {graph.wait_nodes[bars.node[i]]}" if bars.node[i] in graph.wait_nodes else "")
            for i in indices]
    marker = {"color": color, "line": {"width": 0}}
    if pattern:
        marker["pattern"] = {"shape": pattern, "fgcolor": "rgba(80,80,80,0.6)", "size": 5}
    return go.Bar(orientation="h", base=[bars.start[i] / 1000 for i in indices],
                  x=[(bars.end[i] - bars.start[i]) / 1000 for i in indices],
                  y=[_row(bars.lane[i], bars.side[i]) for i in indices], name=name, legendgroup=name,
                  showlegend=legend, marker=marker, hovertext=text, hoverinfo="text", width=0.8)


def timeline_figure(go, tl: RankTimeline, first: bool):
    """One rank's lanes, measured above simulated, in ms."""
    bars, graph = tl.bars, tl.graph
    kept, left_out = _kept(tl)
    groups: dict[tuple[str, str], list[int]] = {}
    for i in kept:
        if bars.state[i] == WAIT:
            key = ("wait", bars.side[i])
        elif bars.critical[i] and bars.side[i] == SIMULATED:
            key = ("critical", "")
        else:
            key = ("busy", KIND_NAMES[graph.kind[bars.node[i]]])
        groups.setdefault(key, []).append(i)
    fig = go.Figure()
    for kind in KIND_NAMES:
        if ("busy", kind) in groups:
            fig.add_trace(_bar_trace(go, tl, groups["busy", kind], f"{kind} busy", KIND_COLORS[kind], first))
    if ("wait", MEASURED) in groups:
        fig.add_trace(_bar_trace(go, tl, groups["wait", MEASURED], "measured wait (not replayed as busy)",
                                 WAIT_COLOR, first, "/"))
    if ("wait", SIMULATED) in groups:
        fig.add_trace(_bar_trace(go, tl, groups["wait", SIMULATED], "simulated wait (for peers; a measured wait the file carries)", WAIT_COLOR,
                                 first, "x"))
    if ("critical", "") in groups:
        fig.add_trace(_bar_trace(go, tl, groups["critical", ""], "critical path (simulated)", CRITICAL_COLOR,
                                 first))
    if tl.divergences:
        fig.add_trace(go.Scatter(
            x=[d.simulated_start / 1000 for d in tl.divergences],
            y=[_row(d.lane, SIMULATED) for d in tl.divergences], mode="markers", name="lane gains or loses time",
            legendgroup="divergence", showlegend=first,
            marker={"symbol": "diamond", "size": 12, "color": DIVERGENCE_COLOR, "line": {"width": 1, "color": "white"}},
            hovertext=[f"{html.escape(_short(d.name))}<br>{_signed(d.jump_us)} later than measured, against "
                       f"the op before it on this lane<br>"
                       f"measured start {format_us(d.measured_start)}, simulated {format_us(d.simulated_start)}"
                       for d in tl.divergences], hoverinfo="text"))
    drawn = set(bars.lane)
    rows = [_row(lane, side) for lane in tl.lanes if lane in drawn for side in (MEASURED, SIMULATED)]
    # Every row shown, both sides, even one with no bar (an invisible line registers the categories).
    fig.add_trace(go.Scatter(x=[0.0] * len(rows), y=rows, mode="lines", opacity=0, hoverinfo="skip",
                             showlegend=False))
    title = f"rank {tl.rank}: {Path(tl.file).name}"
    if left_out:
        title += f" ({left_out:,} shortest bars left out)"
    fig.update_layout(
        title={"text": html.escape(title), "x": 0.01}, barmode="overlay", bargap=0.15,
        height=160 + 34 * len(rows), margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis={"title": {"text": "time (ms)"}, "zeroline": False},
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(rows)), "automargin": True},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
        hoverlabel={"align": "left"}, plot_bgcolor="white")
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    return fig


def _unit_of(model: str, tl: RankTimeline, node: int, lane: str) -> str:
    return KIND_NAMES[tl.graph.kind[node]] if model == ASTRA_SIM else lane


def busy_figure(go, timelines: list[RankTimeline], model: str):
    """Busy and waiting time per resource (the replay's units), measured and simulated, in ms."""
    job = len(timelines) > 1
    totals: dict[tuple[str, str, str], float] = {}
    units: list[str] = []
    for tl in timelines:
        bars = tl.bars
        for i in range(len(bars)):
            unit = _unit_of(model, tl, bars.node[i], bars.lane[i])
            label = f"rank {tl.rank} {unit}" if job else unit
            if label not in units:
                units.append(label)
            key = (label, bars.side[i], bars.state[i])
            totals[key] = totals.get(key, 0.0) + bars.end[i] - bars.start[i]
    fig = go.Figure()
    for side, state, color, pattern in ((MEASURED, BUSY, "#4C78A8", ""), (MEASURED, WAIT, WAIT_COLOR, "/"),
                                        (SIMULATED, BUSY, "#72B7B2", ""), (SIMULATED, WAIT, WAIT_COLOR, "x")):
        values = [totals.get((unit, side, state), 0.0) / 1000 for unit in units]
        if not any(values):
            continue
        marker = {"color": color}
        if pattern:
            marker["pattern"] = {"shape": pattern, "fgcolor": "rgba(80,80,80,0.6)", "size": 5}
        fig.add_trace(go.Bar(y=units, x=values, orientation="h", name=f"{side} {state}", marker=marker,
                             hovertemplate="%{y}: %{x:.3f} ms<extra>" + f"{side} {state}</extra>"))
    fig.update_layout(title={"text": "busy time per resource (ms)", "x": 0.01}, barmode="group",
                      height=140 + 26 * len(units) * 2, margin={"l": 10, "r": 10, "t": 50, "b": 40},
                      yaxis={"autorange": "reversed", "automargin": True}, plot_bgcolor="white")
    return fig


def critical_figure(go, report: SimReport):
    """The ops that take most time on the critical path, in ms, coloured by kind."""
    ops = report.critical_path
    fig = go.Figure(go.Bar(
        y=[f"{_short(op.name)} ×{op.count}" for op in ops], x=[op.us / 1000 for op in ops], orientation="h",
        marker={"color": [KIND_COLORS.get(op.kind, "#888") for op in ops]},
        hovertext=[f"{html.escape(op.name)}<br>{op.kind}, {op.count} on the path, {format_us(op.us)}" for op in ops],
        hoverinfo="text", showlegend=False))
    fig.update_layout(title={"text": "top ops on the critical path (ms; blue cpu, green gpu, orange comm)", "x": 0.01},
                      height=140 + 26 * max(len(ops), 1), margin={"l": 10, "r": 10, "t": 50, "b": 40},
                      yaxis={"autorange": "reversed", "automargin": True}, plot_bgcolor="white")
    return fig


def ranks_figure(go, report: SimReport):
    """A job: each rank's measured and simulated step, in ms."""
    labels = [f"rank {r.rank}" for r in report.ranks]
    fig = go.Figure([go.Bar(x=labels, y=[r.measured_us / 1000 for r in report.ranks], name="measured",
                            marker={"color": "#4C78A8"}),
                     go.Bar(x=labels, y=[r.simulated_us / 1000 for r in report.ranks], name="simulated",
                            marker={"color": "#72B7B2"})])
    fig.update_layout(title={"text": "step per rank (ms)", "x": 0.01}, barmode="group", height=320,
                      margin={"l": 10, "r": 10, "t": 50, "b": 40}, plot_bgcolor="white")
    return fig


LANE_JUMPS = ("On each lane, the ops where the replay gains or loses the most time: how much later (+) or "
              "earlier (−) than measured the replay starts the op, less that of the op before it on the same "
              "lane (ops with nothing nested in them). A lane's view, so its amounts differ from the critical "
              "path's above, which follow the chain that sets the simulated end.")
PATH_DRIFT = ("Where the replay drifts, along the critical path (the list <code>et-link simulate --explain</code> "
              "prints): drift is the simulated start minus the measured start from one origin ({origin}); "
              "jump is the change of drift since the previous op of the path; held by: what the op waited for "
              "in the replay. The first row is the first op of the path that drifts by more than {threshold}; "
              "the others, the largest jumps of {floor} or more (a smaller one is the rounding of the times "
              "in the file).")


def _divergence_table(tl: RankTimeline) -> str:
    if not tl.divergences:
        return "<p class='note'>No lane's replay gains or loses time against the measurement.</p>"
    rows = "".join(
        f"<tr><td>{html.escape(d.lane)}</td><td>{html.escape(_short(d.name))}</td><td>{d.node_id}</td>"
        f"<td>{format_us(d.measured_start)}</td><td>{format_us(d.simulated_start)}</td>"
        f"<td>{_signed(d.jump_us)}</td></tr>" for d in tl.divergences)
    return (f"<p class='note'>{LANE_JUMPS}</p>"
            "<table><tr><th>lane</th><th>op</th><th>node</th><th>measured start</th><th>simulated start</th>"
            "<th>later (+) / earlier (−) than the op before it on the lane</th></tr>" + rows + "</table>")


def _signed(us: float) -> str:
    return f"{'+' if us >= 0 else '−'}{format_us(abs(us))}"


def _drift_table(drift: dict, job: bool) -> str:
    """The critical path's drift places (``explain.drift_report``), as ``--explain`` lists them."""
    places = ([("first", drift["first"])] if drift["first"] is not None else []) + \
        [("largest", place) for place in drift["largest"]]
    threshold, floor = format_us(drift["threshold_us"]), format_us(drift["jump_floor_us"])
    intro = PATH_DRIFT.format(origin=html.escape(drift["origin"]), threshold=threshold, floor=floor)
    if not places:
        return (f"<p class='note'>{intro}</p><p class='note'>No op of the path drifts by more than {threshold}, "
                f"and no jump reaches {floor}: along the path the replay keeps the measured timing.</p>")

    def held(place: dict) -> str:
        words = LINK_WORDS.get(place["held_by"], place["held_by"])
        if "after" in place:
            words += f", node {place['after']['id']} {short_name(place['after']['name'])}"
        elif "peer_rank" in place:
            words += f" {place['peer_rank']}"
        return words

    def rank_cell(place: dict) -> str:
        return f"<td>{place['rank']}</td>" if job else ""

    rows = "".join(
        f"<tr><td>{which}</td>{rank_cell(place)}<td>{place['id']}</td>"
        f"<td>{html.escape(short_name(place['name']))}</td><td>{html.escape(place['lane'])}</td>"
        f"<td>{_signed(place['drift_us'])}</td><td>{_signed(place['jump_us'])}</td>"
        f"<td>{html.escape(held(place))}</td></tr>" for which, place in places)
    rank_head = "<th>rank</th>" if job else ""
    return (f"<p class='note'>{intro}</p><table><tr><th></th>{rank_head}<th>node</th><th>op</th><th>lane</th>"
            "<th>drift</th><th>jump</th><th>held by</th></tr>" + rows + "</table>")


_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1600px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}p.note{color:#555}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
.rank{border-top:1px solid #ccc;margin-top:1em}"""

_HOW_TO_READ = (
    "Each lane appears twice, measured above simulated, on one time axis (ms). Measured nested CPU ops "
    "are drawn as the simulator sees them: each op's exclusive time (its children cut out); time the "
    "simulator does not replay as busy (a blocked synchronize, a collective's kernel waiting for its peers) "
    "is hatched grey. On the simulated side, a collective holding its unit while waiting for peer ranks is "
    "cross-hatched. Red: simulated nodes on the critical path. Diamonds: the ops where a lane's replay gains or loses "
    "the most time against the measurement (listed under each rank). Drag to zoom, double-click to reset.")


def page_html(rp: Replay, report: SimReport, path_steps, title: str = "") -> str:
    """The whole page as a string (plotly.js inlined). Raises ViewUnavailable without plotly."""
    go, pio, offline = require_plotly()
    timelines = rank_timelines(rp, path_steps)
    job = len(timelines) > 1
    ratio = f"{report.ratio:.3f}" if report.ratio is not None else "n/a"
    what = "job span (earliest measured start to latest end)" if job else span_words(report)
    heading = title or f"et-link simulate: {len(timelines)} rank{'s' if job else ''}, model {report.model}"
    parts = [f"<h1>{html.escape(heading)}</h1>",
             f"<p>{what}: measured {format_us(report.measured_us)}, simulated {format_us(report.simulated_us)}, "
             f"ratio {ratio}{'' if report.finished else f'; {report.never_issued} nodes never issued'}</p>",
             f"<p class='note'>{_HOW_TO_READ}</p>"]
    if report.notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(note)}</li>" for note in report.notes) + "</ul>")
    figures = []
    if job:
        figures.append(("ranks", ranks_figure(go, report), ""))
    figures.append(("busy", busy_figure(go, timelines, report.model), ""))
    drift = report.drift if report.drift is not None else drift_report(rp, 10, path_steps)
    if report.critical_path:
        figures.append(("critical", critical_figure(go, report),
                        "<h2>where the replay drifts along the critical path</h2>" + _drift_table(drift, job)))
    for k, tl in enumerate(timelines):
        figures.append((f"rank-{tl.rank}", timeline_figure(go, tl, k == 0),
                        f"<h2>rank {tl.rank}: where each lane gains or loses time</h2>" + _divergence_table(tl)))
    config = {"displaylogo": False, "responsive": True}
    for div_id, fig, after in figures:
        css = " class='rank'" if div_id.startswith("rank-") else ""
        parts.append(f"<section id='{div_id}'{css}>"
                     + pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"plot-{div_id}",
                                   config=config)
                     + after + "</section>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(heading)}</title><style>{_STYLE}</style>"
            f"<script type='text/javascript'>{offline.get_plotlyjs()}</script></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def write_html(rp: Replay, report: SimReport, path_steps, path: str | os.PathLike, inputs: tuple = ()) -> None:
    """Write the page to ``path`` atomically (no file on failure). Raises ViewUnavailable without plotly."""
    text = page_html(rp, report, path_steps)
    with atomic_output(Path(path), inputs) as out:
        out.write(text.encode())

"""A finished replay with its report, as the library hands it out (``linker.simulate``).

``Simulation`` keeps what ``et-link simulate`` computes: the ``Replay`` (every node's simulated
times), the ``SimReport`` (typed: ranks, busy time, critical path, notes...) and the critical path
as steps; it writes the same outputs as the command (text, JSON, ``--trace-out``, ``--html``) and,
with pandas, gives the critical path and the replayed nodes as DataFrames. Cost: the writers' and
tables' own, O(n) for n nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from linker.sim.critical import WAIT, PathStep, wait_name
from linker.sim.engine import Replay
from linker.sim.graph import KIND_NAMES
from linker.sim.report import SimReport, format_text


@dataclass
class Simulation:
    """``report``: the typed report; ``replay``: the simulated times (global node numbers);
    ``path``: the critical path, first node first; ``inputs``: the files replayed."""

    report: SimReport
    replay: Replay
    path: list[PathStep]
    inputs: tuple

    def text(self) -> str:
        """The report as ``et-link simulate`` prints it."""
        return format_text(self.report)

    def to_json(self) -> dict:
        """The report as ``et-link simulate --json`` prints it."""
        return self.report.to_json()

    def write_trace(self, path: str | os.PathLike) -> None:
        """The Chrome/Perfetto trace of ``--trace-out`` (``.json`` or ``.json.gz``)."""
        from linker.sim.perfetto import write_trace

        write_trace(self.replay, path, self.inputs)

    def write_html(self, path: str | os.PathLike) -> None:
        """The page of ``--html`` (needs plotly: ``pip install 'et-link[view]'``)."""
        from linker.sim.view import write_html

        write_html(self.replay, self.report, self.path, path, self.inputs)

    def critical_path_table(self, as_rows: bool = False):
        """The critical path, one row per node, in order: ``rank``, ``id``, ``name``, ``kind`` (a wait
        node of the file: ``(measured wait: CAUSE)``, kind ``wait``),
        ``start_us``, ``end_us``, ``us``, ``via`` (why it started then: start, dependency, unit,
        peer), ``link`` (the dependency's cause, when the file gives it), ``held_us`` and
        ``held_cause`` (a measured wait the replay held it back by after that dependency ended:
        each row starts ``held_us`` after the row before it ends). A DataFrame (needs pandas), or
        with ``as_rows`` a list of dicts (``link.tables.make_table``)."""
        from linker.link.tables import make_table

        return make_table({
            "rank": [step.graph.rank for step in self.path],
            "id": [step.graph.ids[step.local] for step in self.path],
            "name": [wait_name(step.graph.wait_nodes[step.local]) if step.local in step.graph.wait_nodes
                     else step.graph.names[step.local] for step in self.path],
            "kind": [WAIT if step.local in step.graph.wait_nodes else KIND_NAMES[step.graph.kind[step.local]]
                     for step in self.path],
            "start_us": [step.start for step in self.path],
            "end_us": [step.end for step in self.path],
            "us": [step.end - step.start for step in self.path],
            "via": [step.via for step in self.path],
            "link": [step.link for step in self.path],
            "held_us": [step.held for step in self.path],
            "held_cause": [step.held_cause for step in self.path]}, as_rows)

    def nodes_table(self, as_rows: bool = False):
        """Every replayed node, measured and simulated times from one origin, the replay's time 0:
        the measured step's start (``explain.measured_origins``: the job's earliest measured start
        when the ranks' clocks agree and the replay released each rank at its measured offset,
        else each rank's own first measured start). Columns: ``rank``, ``id``, ``name``, ``kind``,
        ``ts_us`` (measured start on the file's clock, to join with ``linker.load``'s tables),
        ``measured_start_us``, ``measured_us``, ``start_us``, ``end_us`` (NaN when never run),
        ``drift_us`` (``start_us - measured_start_us``: how late the replay ran it), ``waited_us``
        (issued after it was ready), ``wait_cause`` (the measured wait it stands for or was held
        back by, ``Replay.wait_causes``; "" for none). A DataFrame (needs pandas), or with
        ``as_rows`` a list of dicts. O(n)."""
        from linker.link.tables import make_table
        from linker.sim.explain import measured_origins

        rp = self.replay
        origins, offsets, _ = measured_origins(rp)
        columns = {"rank": [], "id": [], "name": [], "kind": [], "ts_us": [], "measured_start_us": [],
                   "measured_us": [], "start_us": [], "end_us": [], "drift_us": [], "waited_us": [], "wait_cause": []}
        for r, (graph, base, origin, offset) in enumerate(zip(rp.graphs, rp.offsets, origins, offsets)):
            n = len(graph)
            shift = offset - origin  # file clock -> replay clock
            measured_start = [s + shift for s in graph.start]
            start = rp.start[base:base + n]
            columns["rank"] += [graph.rank] * n
            columns["id"] += list(graph.ids)
            columns["name"] += graph.names
            columns["kind"] += [KIND_NAMES[k] for k in graph.kind]
            columns["ts_us"] += list(graph.start)
            columns["measured_start_us"] += measured_start
            columns["measured_us"] += list(graph.measured_dur)
            columns["start_us"] += list(start)
            columns["end_us"] += list(rp.end[base:base + n])
            columns["drift_us"] += [s - m for s, m in zip(start, measured_start)]
            columns["waited_us"] += [i - r for i, r in zip(rp.issue[base:base + n], rp.ready[base:base + n])]
            columns["wait_cause"] += rp.wait_causes(r)
        return make_table(columns, as_rows)

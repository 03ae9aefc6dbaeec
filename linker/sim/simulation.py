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

from linker.sim.critical import PathStep
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

    def critical_path_table(self):
        """The critical path as a DataFrame (needs pandas), one row per node, in order: ``rank``,
        ``id``, ``name``, ``kind``, ``start_us``, ``end_us``, ``us``, ``via`` (why it started then:
        start, dependency, unit, peer), ``link`` (the dependency's cause, when the file gives it)."""
        from linker.link.tables import require_pandas

        pd = require_pandas()
        return pd.DataFrame({
            "rank": [step.graph.rank for step in self.path],
            "id": [step.graph.ids[step.local] for step in self.path],
            "name": [step.graph.names[step.local] for step in self.path],
            "kind": [KIND_NAMES[step.graph.kind[step.local]] for step in self.path],
            "start_us": [step.start for step in self.path],
            "end_us": [step.end for step in self.path],
            "us": [step.end - step.start for step in self.path],
            "via": [step.via for step in self.path],
            "link": [step.link for step in self.path]})

    def nodes_table(self):
        """Every replayed node as a DataFrame (needs pandas): ``rank``, ``id``, ``name``, ``kind``,
        ``measured_start_us`` (file clock), ``measured_us``, ``start_us``, ``end_us`` (replay
        clock; NaN when never run), ``waited_us`` (issued after it was ready)."""
        from linker.link.tables import require_pandas

        pd = require_pandas()
        rp = self.replay
        rows = {"rank": [], "id": [], "name": [], "kind": [], "measured_start_us": [], "measured_us": [],
                "start_us": [], "end_us": [], "waited_us": []}
        for graph, base in zip(rp.graphs, rp.offsets):
            n = len(graph)
            rows["rank"] += [graph.rank] * n
            rows["id"] += list(graph.ids)
            rows["name"] += graph.names
            rows["kind"] += [KIND_NAMES[k] for k in graph.kind]
            rows["measured_start_us"] += list(graph.start)
            rows["measured_us"] += list(graph.measured_dur)
            rows["start_us"] += list(rp.start[base:base + n])
            rows["end_us"] += list(rp.end[base:base + n])
            rows["waited_us"] += [i - r for i, r in zip(rp.issue[base:base + n], rp.ready[base:base + n])]
        return pd.DataFrame(rows)

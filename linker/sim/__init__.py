"""Trace-driven replay of et-link outputs (``et-link simulate``): one rank, or a whole job.

Module map (reading order; each depends only on the ones above it):
- ``graph``    — ``SimGraph``: one rank's nodes as typed columns and CSR dependencies.
- ``load``     — read ``.et`` / ``.et.gz`` (slim protobuf parse) or ET+ JSON (msgspec) into a SimGraph.
- ``job``      — which files form the job, their ranks, the process-group (comm-group) file.
- ``network``  — ``--network`` what-ifs: ring volumes of a collective on a bus or on links, the
  network fitted to the trace's own collectives, their re-timing for another link; O(c log c).
- ``engine``   — the discrete-event replay (models ``astra-sim`` and ``lanes``, collectives matched
  across ranks, what-if ``Scale``); a heap-based loop, O((n + e) log n).
- ``critical`` — the critical path and the ops that take most time on it.
- ``diagnose`` — why nodes never ran: missing dependencies, cycles, stalled collectives.
- ``unheld``   — GPU waits on the measured timeline that no dependency explains (what a short
  replay cannot reproduce), O(n + e).
- ``report``   — text and JSON report.
- ``hints``    — when the other model fits (CPU threads that ran in parallel under ``astra-sim``).
- ``perfetto`` — ``--trace-out``: measured and simulated timelines side by side.
- ``timeline`` — measured and simulated bars per lane, made comparable (nested ops as exclusive
  pieces, waits apart), and the divergence points; plain data.
- ``view``     — ``--html``: the timelines and charts as one offline page (plotly, optional).
- ``simulation`` — ``Simulation``: a replay with its report, as the library API returns it.
- ``saved_etplus`` — ``linker.load``: a saved ET+ (JSON or ``.et``) read for its times, and its
  tables per node, per op and per op name (no replay).
- ``cli_run``  — the ``simulate`` command glued together.
"""

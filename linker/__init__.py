"""et-link: link a PyTorch Execution Trace with its Kineto trace into an enhanced ET (ET+).

Wings, in import order (the rule: a module imports only from its own wing and the ones before it):
``model`` < ``read`` < ``link`` < ``plan`` < ``write`` < ``schedule`` < ``pipeline`` < ``sim`` <
``batch`` < ``cli``. Each wing's ``__init__`` holds the map of its modules. The project's own
documentation is in ``docs/`` (formats.md, linking.md, durations.md, performance.md).

Reading order for a newcomer, one pair from files to output:

1. ``read/et.py``, ``read/kineto.py``: files -> ``ExecutionTrace`` / ``KinetoTrace`` (typed,
   columnar, the bulky parts left undecoded); ``read/sanity.py`` refuses or repairs odd input;
   ``read/files.py`` reads plain or gzip bytes and writes outputs atomically.
2. ``link/recipe.py``: ``link(et, kineto, LinkOptions) -> LinkResult``, the recipe of everything
   below: the same-run check, then the method.
3. ``link/rfid.py`` (record-function ids), ``link/windows.py`` (which Kineto iteration the ET
   covers), ``link/exact.py`` + ``link/align.py`` (order alignment per thread), ``link/approx.py`` +
   ``link/tree_match/`` (call-tree structure): ET op -> Kineto event.
4. ``link/intervals.py``, ``link/durations.py``, ``link/gpu.py``: nesting, exclusive times, GPU ops
   under their launching op; ``link/report.py``: the ``LinkReport``; ``link/etplus.py``: the ET+.
   Without an ET, ``link/kineto_only.py`` builds the host graph from the Kineto trace.
5. ``plan/busy.py``, ``plan/deps.py``, ``plan/comm.py``: busy time, dependencies with their causes,
   communication attributes, computed once for both writers.
6. ``write/etplus_json.py`` or ``write/chakra.py`` (over ``chakra_encode`` and ``chakra_wire``):
   ET+ JSON or Chakra protobuf; ``write/validate/``: ``et-link validate``.
7. ``pipeline.py``: one pair from files to files; ``cli.py``: the ``et-link`` command.
8. ``schedule/``: the speed machinery (forked read-ahead children, a one-shot process exit), kept
   apart so the stages above read as plain passes.
9. ``sim/``: ``et-link simulate``; ``batch/``: ``et-link batch`` and the cross-rank check.
"""

__version__ = "0.4.0.dev0"  # 0.3 released; this is the next one (ET+ with later-piece nodes)

# Library API (docs/library.md): link_traces, write_et_plus, simulate, link_job, the tables of a link
# (ops_table / gpu_events_table) and load (the tables of a saved ET+). Each function imports what it
# needs when called, so ``import linker`` stays light. (Not named link/write/batch: those are the
# wings linker.link, linker.write, linker.batch.)

import os
from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:  # for the signatures only; nothing is imported at run time
    from linker.batch.summary import BatchSummary
    from linker.link.recipe import LinkResult
    from linker.pipeline import PairOutcome
    from linker.sim.saved_etplus import SavedEtPlus
    from linker.sim.simulation import Simulation


def link_traces(et_file: Optional[str | os.PathLike], kineto_file: str | os.PathLike, *, method: str = "auto",
         annotation: Optional[str] = None, window: Optional[int] = None, force: bool = False,
         max_depth: int = 10) -> "LinkResult":
    """Read one ET + Kineto pair and link them in memory, as ``et-link --et-file ET --kineto-file K``
    does before writing. ``et_file`` None: the host graph is built from the Kineto trace alone.

    ``method``: "auto" (rf_id when the ids validate, else exact, else approximate), "rf_id",
    "exact" or "approximate"; ``annotation``, ``window``, ``force``, ``max_depth``: as the options
    of the same names. Returns the ``LinkResult``: ``.report`` (``LinkReport``: counts, warnings,
    ``.summary()`` as printed), ``.et``, ``.kineto``, ``.match``, ``.gpu``. Write it with ``write_et_plus``.
    Raises ``TraceInputError`` (bad file) or ``MismatchedPairError`` (different runs). Cost: that
    of reading and linking, in this process (the library's schedule is serial)."""
    from linker.link.recipe import METHODS, LinkOptions
    from linker.link.recipe import link as link_read
    from linker.pipeline import _link_kineto_alone, read_pair
    from linker.read.files import collector_paused

    if method not in METHODS:
        from linker.model.errors import OptionError
        raise OptionError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    options = LinkOptions(method=method, annotation=annotation, window=window, force=force, max_depth=max_depth)
    with collector_paused():
        if et_file is None:
            return _link_kineto_alone(kineto_file)
        et, kineto, warnings = read_pair(et_file, kineto_file)
        result = link_read(et, kineto, options)
        result.report.warnings[:0] = warnings
        return result


def write_et_plus(result: "LinkResult", output: str | os.PathLike,
          report_file: Optional[str | os.PathLike] = None, *, waits: str = "measured") -> "PairOutcome":
    """Write a ``link_traces`` result: the ET+ to ``output`` (format by suffix: ``.json``/``.json.gz`` ET+
    JSON, ``.et``/``.et.gz`` Chakra protobuf) and the report JSON to ``report_file`` if given;
    atomically (nothing is left on failure), never over an input. Fills the report's dependency
    counts. ``waits``: "measured" (the output carries the measured waits no dependency explains
    as wait nodes, as ``et-link`` writes it) or "explained" (left out); under either, a kernel
    that waited for another stream's kernel to free the device depends on it (docs/durations.md).
    Returns the ``PairOutcome`` (``.report``, ``.output``). Write a result once."""
    from linker.pipeline import write_linked
    from linker.model.waits import check_waits
    from linker.sim.file_waits import add_file_waits

    check_waits(waits)
    outcome = write_linked(result, output, report_file)
    add_file_waits(outcome, waits)
    return outcome


def simulate(files: str | os.PathLike | Iterable[str | os.PathLike], *, model: str = "astra-sim",
             scale: str = "", comm_groups: Optional[str | os.PathLike] = None, rank_start: str = "measured",
             top: int = 10, waits: str = "measured", network: str = "") -> "Simulation":
    """Replay et-link outputs as ``et-link simulate`` does: one rank's ``.et``/``.et.gz``/ET+ JSON,
    several files of one job, or a batch output directory.

    ``model``: "astra-sim" (one CPU op, one GPU compute op, one collective in flight per rank, the
    ready one with the smallest id first, as ASTRA-sim issues them) or "lanes" (each CPU thread and
    GPU stream its own unit); ``scale``: what-if factors
    ("cpu=0.5,gpu=1,comm=2"); ``comm_groups``: the process-group JSON; ``rank_start``: "measured"
    or "zero"; ``top``: critical-path ops listed; ``waits``: "measured" (the waits of ops that no
    dependency explains replayed as measured) or "explained" (left out; ``.report.waits`` has the
    ratio both ways); ``network``: a what-if link, "bandwidth=1Gbit/s[,latency=50us][,medium=bus|links]"
    (docs/whatif.md: the collectives' network part fitted to the trace and moved to this link, the
    rest kept as measured; ``.report.network`` has the fit and the change). Returns the ``Simulation``: ``.report``
    (``SimReport``), ``.text()``, ``.write_html(path)``, ``.write_trace(path)`` and the tables
    ``.critical_path_table()``, ``.nodes_table()`` (DataFrames; ``as_rows=True``: lists of dicts).
    Raises ``TraceInputError`` / ``ValueError``."""
    from pathlib import Path

    from linker.sim.cli_run import SimulateOptions
    from linker.sim.cli_run import simulate as run

    paths = [Path(files)] if isinstance(files, (str, os.PathLike)) else [Path(f) for f in files]
    return run(SimulateOptions(paths, model, scale, Path(comm_groups) if comm_groups else None, top=top,
                               rank_start=rank_start, waits=waits, network=network))


def link_job(kineto: str, output_dir: str | os.PathLike, et: Optional[str] = None, *, fmt: str = "json",
          gzip: bool = False, workers: Optional[int] = None, method: str = "auto", force: bool = False,
          redo: bool = False, skip_unpaired: bool = False, scheduler: Optional[str] = None,
          progress: bool = False, network: str = "") -> "BatchSummary":
    """Link every rank of a job as ``et-link batch`` does: ``kineto`` and ``et`` are globs of the
    ranks' files ("run/rank*.kineto.json.gz"; ``et`` None: host graphs from Kineto alone), paired
    by rank; outputs, ``rank<N>.report.json`` and ``summary.json`` go to ``output_dir``.

    ``fmt`` "json" or "et" (Chakra, with ``comm_groups.json``); ``workers``: ranks linked at once
    (default: by CPU count and memory); ``scheduler``: a Dask scheduler address instead of local
    processes; ``progress``: log each finished rank on stderr; ``network``: a what-if link as
    ``simulate``'s ("bandwidth=1Gbit/s"), answered in ``summary.json`` (``simulator.network``, with
    the job's fitted network: docs/whatif.md). Returns the ``BatchSummary`` (``.ranks``,
    ``.failed``, ``.collectives``, ``.simulator``). Raises ``BatchSetupError`` / ``PairingError`` /
    ``OptionError``."""
    import io
    from pathlib import Path

    from linker.batch import BatchConfig, run_batch
    from linker.link.recipe import LinkOptions

    config = BatchConfig(et_glob=et, kineto_glob=kineto, output_dir=Path(output_dir),
                         options=LinkOptions(method=method, force=force), fmt=fmt, gzip=gzip, workers=workers,
                         scheduler=scheduler, redo=redo, skip_unpaired=skip_unpaired, network=network)
    if progress:
        return run_batch(config, interactive=False)
    return run_batch(config, progress_stream=io.StringIO(), interactive=False)


def ops_table(result: "LinkResult", *, as_rows: bool = False):
    """The ops of a ``link_traces`` result, one row per ET op, with the blocked and busy time the
    ET+ would hold (see ``linker.link.tables``): a pandas DataFrame, or with ``as_rows`` a list of
    dicts. Cost: the dependency plan's, as when writing (the result stays writable)."""
    from linker.link.etplus import build_et_plus
    from linker.link.tables import ops_table as table
    from linker.link.tables import require_pandas
    from linker.plan.deps import dependency_plan

    if not as_rows:
        require_pandas()  # before the plan's cost
    blocked = dependency_plan(build_et_plus(result)).busy.blocked.tolist()
    return table(result, blocked, as_rows)


def gpu_events_table(result: "LinkResult", *, as_rows: bool = False):
    """Every GPU event of a ``link_traces`` result's Kineto file (see ``linker.link.tables``): a
    pandas DataFrame, or with ``as_rows`` a list of dicts."""
    from linker.link.tables import gpu_events_table as table

    return table(result, as_rows)


def load(path: str | os.PathLike) -> "SavedEtPlus":
    """Read a saved ET+ (ET+ JSON or Chakra ``.et``, plain or gzip, as et-link wrote it) for its
    times: ``.nodes_table()`` (one row per node, later pieces included), ``.ops_table()`` (one row
    per op, its later pieces counted in it) and ``.op_names_table()`` (one row per op name, ranked
    by busy time: where the time goes), each with measured, exclusive, blocked, busy and host-gap
    µs; pandas DataFrames, or with ``as_rows=True`` lists of dicts. Raises ``TraceInputError``
    naming the file (missing, not an ET+). Cost: one pass over the file (see
    ``linker.sim.saved_etplus``)."""
    from linker.sim.saved_etplus import load_saved

    return load_saved(path)


__all__ = ["link_traces", "write_et_plus", "simulate", "link_job", "ops_table", "gpu_events_table", "load",
           "__version__"]

"""A link's ops and GPU events as tables, for notebooks (``linker.ops_table``, ``linker.gpu_events_table``),
and the one way every table of the library is handed out (``make_table``).

pandas is optional (never a dependency of the command line): a table is a pandas DataFrame, imported
when the table is made, and its absence raises ``ImportError`` saying how to install it; with
``as_rows=True`` the same table is a plain list of dicts, one per row, without pandas. Columns:

- ops: one row per ET op: ``id``, ``name``, ``tid`` (ET thread), ``linked``, ``ts_us``, ``dur_us``
  (its Kineto event's start and duration; NaN when not linked), ``exclusive_us`` (duration minus
  its children's on the same thread), ``blocked_us`` (the part of the exclusive time it waited:
  blocking calls, another thread; ``plan.busy``, given by the caller), ``busy_us``
  (``max(0, exclusive_us - blocked_us)``: its working time, what a replay runs as that op; NaN
  when not linked).
- GPU events: one row per kernel / memcpy / memset of the Kineto file: ``name``, ``ts_us``,
  ``dur_us``, ``stream``, ``device``, ``correlation``, ``op_id`` / ``op_name`` (the ET op it is
  attached under; None when not attached), ``reason`` (the report's reason key: ``under_op``,
  ``outside_window``...).

Cost: O(ops) and O(GPU events); the tables hold copies of those columns.
"""

from __future__ import annotations

import math

from linker.link.gpu import OUTSIDE_WINDOW

PANDAS_HINT = "tables need pandas: pip install pandas (or pass as_rows=True for a list of dicts)"


def require_pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError(PANDAS_HINT) from None
    return pandas


def make_table(columns: dict[str, list], as_rows: bool = False, integer_columns: tuple[str, ...] = ()):
    """``columns`` (name -> one value per row, all as long) as a pandas DataFrame, or with
    ``as_rows`` as a list of dicts, one per row (no pandas needed). ``integer_columns``: columns
    of ints where None means "none" (a CPU op's stream): pandas' nullable ``Int64`` in the
    DataFrame (not floats with NaN), None in the rows. Raises ``ImportError`` (``PANDAS_HINT``)
    without pandas unless ``as_rows``. O(rows x columns)."""
    if as_rows:
        names = list(columns)
        return [dict(zip(names, row)) for row in zip(*columns.values())]
    pd = require_pandas()
    frame = pd.DataFrame(columns)
    for name in integer_columns:
        frame[name] = pd.array(columns[name], dtype="Int64")
    return frame


def ops_table(result, blocked: list[float], as_rows: bool = False):
    """The ops of a ``LinkResult`` (``linker.link_traces``), one row per ET op; ``blocked``: per ET
    node, its blocked µs (``plan.busy.BusyTimes.blocked``, as the ET+ writes it)."""
    if not as_rows:
        require_pandas()
    et, kineto = result.et, result.kineto
    columns = kineto.cpu_columns()
    event_of_op = result.match.event_of_op
    exclusive = result.exclusive
    nan = float("nan")
    rows = {"id": [], "name": [], "tid": [], "linked": [], "ts_us": [], "dur_us": [], "exclusive_us": [],
            "blocked_us": [], "busy_us": []}
    for i in et.op_indices():
        e = event_of_op[i]
        own = exclusive[e] if 0 <= e < len(exclusive) else nan
        rows["id"].append(et.ids[i])
        rows["name"].append(et.names[i])
        rows["tid"].append(et.tid[i])
        rows["linked"].append(e >= 0)
        rows["ts_us"].append(columns.ts[e] if e >= 0 else nan)
        rows["dur_us"].append(columns.dur[e] if e >= 0 else nan)
        rows["exclusive_us"].append(own)
        rows["blocked_us"].append(blocked[i])
        rows["busy_us"].append(nan if math.isnan(own) else max(0.0, own - blocked[i]))
    return make_table(rows, as_rows)


def gpu_events_table(result, as_rows: bool = False):
    """Every GPU event of the Kineto file (``result.kineto.gpu_events``), with the op it is attached
    under and why (or why not); events launched outside the linked window have reason
    ``outside_window`` and no op."""
    if not as_rows:
        require_pandas()
    et = result.et
    link_of = {id(link.event): link for link in result.gpu.links}
    rows = {"name": [], "ts_us": [], "dur_us": [], "stream": [], "device": [], "correlation": [],
            "op_id": [], "op_name": [], "reason": []}
    for event in result.kineto.gpu_events:
        link = link_of.get(id(event))
        attached = link is not None and link.et_index >= 0
        rows["name"].append(event.name)
        rows["ts_us"].append(event.ts)
        rows["dur_us"].append(event.dur)
        rows["stream"].append(event.args.stream)
        rows["device"].append(event.args.device)
        rows["correlation"].append(event.args.correlation)
        rows["op_id"].append(et.ids[link.et_index] if attached else None)
        rows["op_name"].append(et.names[link.et_index] if attached else None)
        rows["reason"].append(OUTSIDE_WINDOW if link is None else link.placement if attached else link.problem)
    return make_table(rows, as_rows)

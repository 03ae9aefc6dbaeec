"""A link's ops and GPU events as pandas DataFrames, for notebooks (``linker.ops_table``, ``linker.gpu_events_table``).

pandas is optional (never a dependency of the command line): it is imported when a table is made,
and its absence raises ``ImportError`` saying how to install it. Columns:

- ops: one row per ET op: ``id``, ``name``, ``tid`` (ET thread), ``linked``, ``ts_us``, ``dur_us``
  (its Kineto event's start and duration; NaN when not linked), ``exclusive_us`` (duration minus
  its children's on the same thread, what a simulator replays as busy).
- GPU events: one row per kernel / memcpy / memset of the Kineto file: ``name``, ``ts_us``,
  ``dur_us``, ``stream``, ``device``, ``correlation``, ``op_id`` / ``op_name`` (the ET op it is
  attached under; None when not attached), ``reason`` (the report's reason key: ``under_op``,
  ``outside_window``...).

Cost: O(ops) and O(GPU events); the frames hold copies of those columns.
"""

from __future__ import annotations

from linker.link.gpu import OUTSIDE_WINDOW

PANDAS_HINT = "tables need pandas: pip install pandas"


def require_pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError(PANDAS_HINT) from None
    return pandas


def ops_table(result):
    """The ops of a ``LinkResult`` (``linker.link_traces``), one row per ET op."""
    pd = require_pandas()
    et, kineto = result.et, result.kineto
    columns = kineto.cpu_columns()
    event_of_op = result.match.event_of_op
    exclusive = result.exclusive
    nan = float("nan")
    rows = {"id": [], "name": [], "tid": [], "linked": [], "ts_us": [], "dur_us": [], "exclusive_us": []}
    for i in et.op_indices():
        e = event_of_op[i]
        rows["id"].append(et.ids[i])
        rows["name"].append(et.names[i])
        rows["tid"].append(et.tid[i])
        rows["linked"].append(e >= 0)
        rows["ts_us"].append(columns.ts[e] if e >= 0 else nan)
        rows["dur_us"].append(columns.dur[e] if e >= 0 else nan)
        rows["exclusive_us"].append(exclusive[e] if e >= 0 and e < len(exclusive) else nan)
    return pd.DataFrame(rows)


def gpu_events_table(result):
    """Every GPU event of the Kineto file (``result.kineto.gpu_events``), with the op it is attached
    under and why (or why not); events launched outside the linked window have reason
    ``outside_window`` and no op."""
    pd = require_pandas()
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
    return pd.DataFrame(rows)

"""Rank start offsets: when each rank of a job began its captured window, relative to the job.

The rule (docs/rank-start.md), shared by ``et-link batch`` (which writes it into the outputs) and
``et-link simulate`` (which replays it):

- a rank's *measured start* is the earliest measured start among its timed nodes; its *offset* is
  that minus the job's earliest measured start (so the earliest rank has offset 0);
- the offsets are used only when the ranks' clocks look like one clock: every rank is timed and
  the measured starts lie within one measured step (the longest rank's span) of each other;
  otherwise every rank starts at 0 (``measured_offsets`` returns None);
- ``--rank-start measured`` (default) keeps the offsets, ``--rank-start zero`` starts every rank
  at 0.

In a file, a rank's offset is a *delay node*: a CPU op named ``DELAY_NODE_NAME`` that lasts the
offset (whole µs) and that every dependency-free node of the rank (the process root) data-depends
on, with cause ``RANK_START``. A rank whose offset is 0 (the earliest rank, a single pair) gets no
delay node. ASTRA-sim starts every rank at tick 0, so the delay node is how a ``.et`` tells it
that a rank began late. Plain data only (no I/O, no protobuf): the writers live in
``linker.batch.rank_start``. Cost: O(ranks).
"""

from __future__ import annotations

import math

from linker.model.errors import OptionError

RANK_START = "rank_start"  # the cause of the edge from a rank's delay node to its process root
DELAY_NODE_NAME = "[et-link|rank_start]"
OFFSET_ATTR = "rank_start_micros"  # the delay node's offset, also as an attribute (int64 µs)
MEASURED, ZERO = "measured", "zero"
RANK_STARTS = (MEASURED, ZERO)


def check_rank_start(value: str) -> str:
    """``value`` when it is a known ``--rank-start`` rule; raises OptionError otherwise."""
    if value not in RANK_STARTS:
        raise OptionError(f"unknown --rank-start {value!r}; choose one of {', '.join(RANK_STARTS)}")
    return value


def et_plus_span(et_plus) -> tuple[float, float] | None:
    """(earliest measured start, latest measured end) of an ET+ in memory: over its linked ET ops
    and its GPU ops, start ``ts`` and end ``ts + dur``, the numbers ``SimGraph.measured_span``
    reads back from the ET+ JSON written of it (``inclusive_dur`` = ``dur`` there); None when
    nothing is timed. Lets a batch worker hand its rank's span over without the output being
    read again. O(n)."""
    starts, ends = et_plus.op_times if et_plus.op_times is not None else ([], [])
    first, last = math.inf, -math.inf
    timed = [s for s in starts if not math.isnan(s)]  # linked ops (unlinked: NaN)
    if timed:
        first, last = min(timed), max(e for e in ends if not math.isnan(e))
    for node in et_plus.gpu_nodes:
        start = float(node.ts)
        first, last = min(first, start), max(last, start + float(node.inclusive_dur))
    return (first, last) if first <= last else None


def measured_offsets(spans: list[tuple[float, float]]) -> list[float] | None:
    """Each rank's offset from its (first measured start, last measured end), in rank order; None
    when fewer than two ranks, a rank is untimed (NaN), or the starts lie further apart than the
    longest span (clocks that are not one clock). O(ranks)."""
    if len(spans) < 2 or any(math.isnan(first) for first, _ in spans):
        return None
    firsts = [first for first, _ in spans]
    earliest = min(firsts)
    if max(firsts) - earliest > max(last - first for first, last in spans):
        return None
    return [first - earliest for first in firsts]


def offset_micros(offset: float) -> int:
    """An offset as the whole µs a Chakra ``duration_micros`` holds (rounded, never negative)."""
    return max(0, round(offset))


def delay_node_json(node_id: int, offset_us: int, parent_key: str, tid: int | None) -> dict:
    """The ET+ JSON form of a delay node: a root like the process root (its own parent, which
    ``et-link validate`` allows for these two names), no measured time, ``sim_dur`` the offset.
    ``parent_key``: "parent" (schema 1.0.1) or "ctrl_deps" (later schemas)."""
    node = {"id": node_id, "name": DELAY_NODE_NAME, parent_key: node_id}
    if tid is not None:
        node["tid"] = tid
    node.update({"sim_dur": offset_us, OFFSET_ATTR: offset_us, "data_deps": [], "data_dep_causes": []})
    return node


def delay_positions(names: list[str]) -> list[int]:
    """Positions of the delay nodes among a graph's node names. O(n)."""
    return [u for u, name in enumerate(names) if name == DELAY_NODE_NAME]

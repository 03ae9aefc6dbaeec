"""Method 1: join ET ops and Kineto events on the record-function id, after validating it.

ET ``rf_id`` == Kineto ``args["Record function id"]`` for every op of the same window (PyTorch ≥ 2.2).
The ids are checked before they are trusted: present, non-zero, unique on each side, and the names
of joined pairs agree. Cost O(n).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from linker.model.columns import unique_positions
from linker.read.et import ExecutionTrace
from linker.read.kineto import KinetoTrace
from linker.link.threads import OpMatch

# The join is trusted when names agree on at least this share of joined pairs ...
MIN_NAME_AGREEMENT = 0.99
# ... and it links at least this share of the smaller side.
MIN_COVERAGE = 0.1


class RfIdCheck(NamedTuple):
    """Whether the record-function ids can be trusted (``usable``), why in one sentence
    (``reason``), and the counts the verdict rests on: ``kineto_with_id``, the Kineto events that
    carry an id, and ``stats``, the join's counts as ``OpMatch.stats`` reports them (``joined``,
    ``name_mismatches``, ``kineto_duplicate_ids``, ``et_duplicate_ids``, ``kineto_zero_ids``)."""

    usable: bool
    reason: str
    kineto_with_id: int
    stats: dict[str, int]

    @property
    def same_name_pairs(self) -> int:
        """Pairs joined by id whose names agree."""
        return self.stats["joined"] - self.stats["name_mismatches"]


def _kineto_ids(ids: list) -> tuple[dict, int, int, int]:
    """(record-function id -> its event, for the ids found once, None and 0 left out; events with
    an id; events with id 0; events whose id repeats). One ``dict(zip())`` in C when every id is
    distinct (None and 0 then occur at most once: no counting), else the counts. O(n)."""
    first = dict(zip(ids, range(len(ids))))
    if len(first) == len(ids):
        with_id = len(ids) - (None in first)
        zero = 1 if 0 in first else 0
        first.pop(None, None)
        first.pop(0, None)
        return first, with_id, zero, 0
    with_id = len(ids) - ids.count(None)
    zero = ids.count(0)
    event_of_rf = unique_positions(ids, drop=(None, 0))
    k_dups = sum(c for c in Counter(r for r in ids if r).values() if c > 1) if len(event_of_rf) < with_id - zero else 0
    return event_of_rf, with_id, zero, k_dups


def _event_of_every_op(et: ExecutionTrace, events: list[int], event_names: list[str]) -> list[int]:
    """``event_of_op`` when ``events[k]`` is the event of the k-th op (``op_indices()``): the
    event where the names agree, else -1; -1 for the roots, put in at their places. One pass,
    then the few roots."""
    ops = et.op_indices()
    names = et.names
    event_of_op = [e if event_names[e] == names[i] else -1 for e, i in zip(events, ops)]
    for root in et.root_positions():  # in node order: each lands at its index
        event_of_op.insert(root, -1)
    return event_of_op


def match_by_rf_id(et: ExecutionTrace, kineto: KinetoTrace) -> tuple[OpMatch, RfIdCheck]:
    """Join on record-function ids. The match links only name-agreeing pairs with unique ids."""
    columns = kineto.cpu_columns()
    event_of_rf, with_id, zero, k_dups = _kineto_ids(columns.rf_id)

    op_indices = et.op_indices()
    rf_ids = et.rf_id
    op_rf = [rf_ids[i] for i in op_indices]
    distinct = set(op_rf)
    if len(distinct) == len(op_rf):  # the usual case: every op's id distinct, no counting
        et_dups = 0
        et_counts = len(distinct) - (None in distinct) - (0 in distinct)  # only its truthiness is used
        join_ops, join_ids = op_indices, op_rf  # None and 0 are not keys of event_of_rf: they never join
    else:
        et_unique = unique_positions(op_rf, drop=(None, 0))
        et_counts = Counter(r for r in op_rf if r) if len(et_unique) < len(op_rf) - op_rf.count(0) else None
        et_dups = sum(c for c in et_counts.values() if c > 1) if et_counts is not None else 0
        if et_counts is None:
            et_counts = et_unique  # only its truthiness is used below
        join_ops, join_ids = [op_indices[k] for k in et_unique.values()], list(et_unique)
    del distinct

    names, event_names = et.names, columns.name
    join_events = [event_of_rf.get(rf_id) for rf_id in join_ids]
    joined = len(join_events) - join_events.count(None)
    if joined == len(join_events) and join_ops is op_indices:  # every op's id found: C passes
        event_of_op = _event_of_every_op(et, join_events, event_names)
    else:
        event_of_op = [-1] * len(et)
        for i, e in zip(join_ops, join_events):  # distinct ops: the links are counted after
            if e is not None and event_names[e] == names[i]:
                event_of_op[i] = e
    mismatched = joined - (len(event_of_op) - event_of_op.count(-1))

    stats = {"joined": joined, "name_mismatches": mismatched, "kineto_duplicate_ids": k_dups,
             "et_duplicate_ids": et_dups, "kineto_zero_ids": zero}
    smaller = max(1, min(len(op_indices), kineto.cpu_count()))
    usable, reason = _verdict(with_id, bool(et_counts), stats, smaller)
    match = OpMatch("rf_id", event_of_op, notes=[reason])
    match.stats = dict(stats)  # the match's own: later stages may add to it
    return match, RfIdCheck(usable, reason, with_id, stats)


def _verdict(kineto_with_id: int, et_has_ids: bool, stats: dict[str, int], smaller: int) -> tuple[bool, str]:
    """(usable, reason) of a join with these counts; ``smaller``: the op count of the smaller side."""
    joined, mismatched, zero = stats["joined"], stats["name_mismatches"], stats["kineto_zero_ids"]
    if kineto_with_id == 0:
        return False, "the Kineto trace has no 'Record function id' (PyTorch < 2.2)"
    if zero == kineto_with_id:
        return False, "every Kineto 'Record function id' is 0"
    if not et_has_ids:
        return False, "the ET has no non-zero rf_id"
    if joined == 0:
        return False, "no ET rf_id occurs in the Kineto trace (different window or run?)"
    if (joined - mismatched) / joined < MIN_NAME_AGREEMENT:
        return False, (f"names disagree on {mismatched} of {joined} pairs joined by rf_id "
                       "(ids from another window or run?)")
    if joined / smaller < MIN_COVERAGE:
        return False, f"rf_id joins only {joined} of {smaller} ops"
    return True, (f"{joined} ops joined by rf_id, names agree on {joined - mismatched}; "
                  f"{stats['kineto_duplicate_ids']} duplicated Kineto ids and {stats['et_duplicate_ids']} "
                  "duplicated ET ids left out")

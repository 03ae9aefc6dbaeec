"""Method 1: join ET ops and Kineto events on the record-function id, after validating it.

ET ``rf_id`` == Kineto ``args["Record function id"]`` for every op of the same window (PyTorch ≥ 2.2).
The ids are checked before they are trusted: present, non-zero, unique on each side, and the names
of joined pairs agree. Cost O(n).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .et_reader import ExecutionTrace
from .kineto_reader import KinetoTrace
from .match import OpMatch

# The join is trusted when names agree on at least this share of joined pairs ...
MIN_NAME_AGREEMENT = 0.99
# ... and it links at least this share of the smaller side.
MIN_COVERAGE = 0.1


@dataclass
class RfIdCheck:
    """Why the record-function ids can or cannot be trusted."""

    usable: bool
    reason: str
    kineto_with_id: int = 0
    kineto_zero: int = 0
    kineto_duplicates: int = 0
    et_duplicates: int = 0
    joined: int = 0
    name_mismatches: int = 0


def match_by_rf_id(et: ExecutionTrace, kineto: KinetoTrace) -> tuple[OpMatch, RfIdCheck]:
    """Join on record-function ids. The match links only name-agreeing pairs with unique ids."""
    events = kineto.cpu_events
    ids = [e.args.rf_id for e in events]
    with_id = sum(1 for r in ids if r is not None)
    zero = sum(1 for r in ids if r == 0)
    counts = Counter(r for r in ids if r)
    event_of_rf = {r: i for i, r in enumerate(ids) if r and counts[r] == 1}
    k_dups = sum(c for c in counts.values() if c > 1)

    op_indices = et.op_indices()
    et_counts = Counter(et.rf_id[i] for i in op_indices if et.rf_id[i])
    et_dups = sum(c for c in et_counts.values() if c > 1)

    event_of_op = [-1] * len(et)
    joined = mismatched = 0
    for i in op_indices:
        r = et.rf_id[i]
        if not r or et_counts[r] > 1:
            continue
        e = event_of_rf.get(r)
        if e is None:
            continue
        joined += 1
        if events[e].name == et.names[i]:
            event_of_op[i] = e
        else:
            mismatched += 1

    check = RfIdCheck(False, "", with_id, zero, k_dups, et_dups, joined, mismatched)
    smaller = max(1, min(len(op_indices), len(events)))
    if with_id == 0:
        check.reason = "the Kineto trace has no 'Record function id' (PyTorch < 2.2)"
    elif zero == with_id:
        check.reason = "every Kineto 'Record function id' is 0"
    elif not et_counts:
        check.reason = "the ET has no non-zero rf_id"
    elif joined == 0:
        check.reason = "no ET rf_id occurs in the Kineto trace (different window or run?)"
    elif (joined - mismatched) / joined < MIN_NAME_AGREEMENT:
        check.reason = (f"names disagree on {mismatched} of {joined} pairs joined by rf_id "
                        "(ids from another window or run?)")
    elif joined / smaller < MIN_COVERAGE:
        check.reason = f"rf_id joins only {joined} of {smaller} ops"
    else:
        check.usable = True
        check.reason = (f"{joined} ops joined by rf_id, names agree on {joined - mismatched}; "
                        f"{k_dups} duplicated Kineto ids and {et_dups} duplicated ET ids left out")
    match = OpMatch("rf_id", event_of_op, notes=[check.reason])
    match.stats = {"joined": joined, "name_mismatches": mismatched, "kineto_duplicate_ids": k_dups,
                   "et_duplicate_ids": et_dups, "kineto_zero_ids": zero}
    return match, check

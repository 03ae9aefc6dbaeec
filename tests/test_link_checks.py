"""The link stage's shortcuts give the answers of the full computations they skip.

``check_same_run`` with the rf_id join's same-name pairs as a lower bound of the shared names
(the name counts skipped when the bound clears the bar) against the full count, on matching and
on mismatched pairs; ``ExecutionTrace.process_root`` against the first index of any process root name; ``match_by_rf_id``
(counting skipped when every id is distinct) against a plain join, ids repeated, zero or absent.
"""

from __future__ import annotations

import dataclasses

import random
from collections import Counter

import msgspec
import pytest

from conftest import fixture_pair
from linker.read.et import PROCESS_ROOT_NAMES
from linker.link.recipe import check_same_run
from linker.link.rfid import match_by_rf_id
from linker.pipeline import read_pair

CASES = ["mlp_steps", "threads", "autograd_threads", "dataloader", "main_thread_only"]


def _same_name_pairs(et, kineto) -> int:
    _, check = match_by_rf_id(et, kineto)
    return check.same_name_pairs


@pytest.mark.parametrize("et_case, kineto_case", [(c, c) for c in CASES] + [("threads", "mlp_steps"),
                                                                           ("mlp_steps", "dataloader")])
def test_same_run_check_with_the_rf_id_bound(et_case, kineto_case):
    et, _ = fixture_pair("cpu", et_case)
    _, kineto_file = fixture_pair("cpu", kineto_case)
    et, kineto, _ = read_pair(et, kineto_file)
    full = check_same_run(et, kineto)
    assert check_same_run(et, kineto, _same_name_pairs(et, kineto)) == full
    if et_case == kineto_case:
        assert full == []


def test_process_root_is_the_first_root():
    et, kineto = fixture_pair("cpu", "mlp_steps")
    et, _, _ = read_pair(et, kineto)
    names = et.names
    assert et.process_root() == min(names.index(r) for r in PROCESS_ROOT_NAMES if r in names)

    def renamed(names):  # the roots are found once per ET: a new ET for other names
        return dataclasses.replace(et, names=names, _root_positions=None, _op_indices=None)

    names = [n if n not in PROCESS_ROOT_NAMES else "x" for n in names]
    assert renamed(names).process_root() == -1
    names[3] = PROCESS_ROOT_NAMES[1]
    names[7] = PROCESS_ROOT_NAMES[0]
    assert renamed(names).process_root() == 3


def test_names_of_another_run_are_still_caught():
    et, kineto = read_pair(*fixture_pair("cpu", "mlp_steps"))[:2]
    ops = et.op_indices()
    for i in ops[: len(ops) * 3 // 4]:  # three quarters of the ops renamed: under the 30% bar
        et.names[i] = "renamed::" + et.names[i]
    full = check_same_run(et, kineto)
    assert any("op names disagree" in p for p in full)
    assert check_same_run(et, kineto, _same_name_pairs(et, kineto)) == full


def _reference_rf_join(et, kineto):
    """The rf_id join written plainly: ids counted, each side's ids found once kept."""
    events = kineto.cpu_events
    ids = [e.args.rf_id for e in events]
    k_counts = Counter(r for r in ids if r)
    ops = et.op_indices()
    et_counts = Counter(et.rf_id[i] for i in ops if et.rf_id[i])
    event_of_rf = {r: e for e, r in enumerate(ids) if r and k_counts[r] == 1}
    event_of_op = [-1] * len(et)
    joined = mismatched = 0
    for i in ops:
        r = et.rf_id[i]
        if r and et_counts[r] == 1 and r in event_of_rf:
            joined += 1
            e = event_of_rf[r]
            if events[e].name == et.names[i]:
                event_of_op[i] = e
            else:
                mismatched += 1
    stats = {"joined": joined, "name_mismatches": mismatched,
             "kineto_duplicate_ids": sum(c for c in k_counts.values() if c > 1),
             "et_duplicate_ids": sum(c for c in et_counts.values() if c > 1),
             "kineto_zero_ids": ids.count(0)}
    return event_of_op, stats, len(ids) - ids.count(None)


@pytest.mark.parametrize("seed", range(12))
def test_rf_id_join_with_repeated_zero_and_missing_ids(seed):
    et, kineto, _ = read_pair(*fixture_pair("cpu", "threads"))
    rng = random.Random(seed)
    events = kineto.cpu_events
    ops = et.op_indices()
    for _ in range(seed % 4 * 3):  # Kineto side: ids repeated, zero, absent
        e = rng.randrange(len(events))
        new = rng.choice([events[rng.randrange(len(events))].args.rf_id, 0, None])
        events[e] = msgspec.structs.replace(events[e], args=msgspec.structs.replace(events[e].args, rf_id=new))
    kineto.cpu_events = events  # set again: the columns are those of the changed events
    for _ in range(seed // 4 * 3):  # ET side: ids repeated, zero, absent
        i = rng.choice(ops)
        et.rf_id[i] = rng.choice([et.rf_id[rng.choice(ops)], 0, None])
    if seed % 5 == 4:
        et.names[rng.choice(ops)] = "renamed"
    match, check = match_by_rf_id(et, kineto)
    event_of_op, stats, with_id = _reference_rf_join(et, kineto)
    assert match.event_of_op == event_of_op
    assert match.stats == stats == check.stats and check.kineto_with_id == with_id


@pytest.mark.parametrize("renamed", [0, 1, 5])
def test_rf_id_join_of_every_op_with_names_that_disagree(renamed):
    """Every op's id found once (the usual pair, which takes C passes: the roots put back at their
    places), some ops renamed: the plain join's links and counts."""
    et, kineto, _ = read_pair(*fixture_pair("cpu", "threads"))
    ops = et.op_indices()
    assert len(et.root_positions()) >= 2 and len(ops) + len(et.root_positions()) == len(et)
    for i in random.Random(renamed).sample(ops, renamed):
        et.names[i] = "renamed"
    match, check = match_by_rf_id(et, kineto)
    event_of_op, stats, with_id = _reference_rf_join(et, kineto)
    assert match.event_of_op == event_of_op and match.stats == stats
    assert stats["joined"] == len(ops) and stats["name_mismatches"] == renamed

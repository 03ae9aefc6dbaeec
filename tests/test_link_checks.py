"""The link stage's shortcuts give the answers of the full computations they skip.

``check_same_run`` with the rf_id join's same-name pairs as a lower bound of the shared names
(the name counts skipped when the bound clears the bar) against the full count, on matching and
on mismatched pairs; ``process_root_index`` against the first index of any process root name.
"""

from __future__ import annotations

import pytest

from conftest import fixture_pair
from linker.et_reader import PROCESS_ROOT_NAMES
from linker.link import check_same_run, process_root_index
from linker.match_rfid import match_by_rf_id
from linker.pipeline import read_pair

CASES = ["mlp_steps", "threads", "autograd_threads", "dataloader", "main_thread_only"]


def _same_name_pairs(et, kineto) -> int:
    _, check = match_by_rf_id(et, kineto)
    return check.joined - check.name_mismatches


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


def test_process_root_index_is_the_first_root():
    et, kineto = fixture_pair("cpu", "mlp_steps")
    et, _, _ = read_pair(et, kineto)
    names = et.names
    assert process_root_index(et) == min(names.index(r) for r in PROCESS_ROOT_NAMES if r in names)
    names[:] = [n if n not in PROCESS_ROOT_NAMES else "x" for n in names]
    assert process_root_index(et) == -1
    names[3] = PROCESS_ROOT_NAMES[1]
    names[7] = PROCESS_ROOT_NAMES[0]
    assert process_root_index(et) == 3


def test_names_of_another_run_are_still_caught():
    et, kineto = read_pair(*fixture_pair("cpu", "mlp_steps"))[:2]
    ops = et.op_indices()
    for i in ops[: len(ops) * 3 // 4]:  # three quarters of the ops renamed: under the 30% bar
        et.names[i] = "renamed::" + et.names[i]
    full = check_same_run(et, kineto)
    assert any("op names disagree" in p for p in full)
    assert check_same_run(et, kineto, _same_name_pairs(et, kineto)) == full

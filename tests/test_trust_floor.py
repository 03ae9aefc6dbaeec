"""The record-function-id join's coverage floor and trust verdict (``linker.link.rfid``).

The rf_id join is trusted only when it links at least 10 % of the smaller side's ops (ET ops
without the process/thread roots, Kineto CPU events). Below that floor the ids are refused and
``link`` falls back to order alignment; with ``--match rf_id`` the refusal is an error.

Every expected number here is worked out in the test from the raw JSON files (op and event
counts, which rf_ids still meet a Kineto event of the same name), not from the code under test.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from conftest import FIXTURES, fixture_pair, shared_trace
from linker.link.recipe import LinkOptions, link
from linker.link.rfid import _verdict, match_by_rf_id
from linker.model.errors import OptionError
from linker.pipeline import read_pair

FLOOR = 0.1  # the documented floor: the join must link >= 10 % of the smaller side's ops
ROOT_NAMES = {
    "[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]",
    "[pytorch|profiler|execution_graph|process]", "[pytorch|profiler|execution_graph|thread]",
}
RF_KEY = "Record function id"


# --------------------------------------------------------------------------- plain helpers


def _load(path: Path) -> dict:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as handle:
        return json.load(handle)


def _save(doc: dict, path: Path) -> Path:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def _rf_attr(node: dict) -> dict | None:
    """The node's rf_id attribute entry (nested layout), or None."""
    return next((a for a in node.get("attrs", ()) if a.get("name") == "rf_id"), None)


def _rf_id(node: dict):
    if "rf_id" in node:
        return node["rf_id"]
    attr = _rf_attr(node)
    return attr["value"] if attr else None


def _ops(et_doc: dict) -> list[dict]:
    return [n for n in et_doc["nodes"] if n["name"] not in ROOT_NAMES]


def _kineto_cpu(kineto_doc: dict) -> list[dict]:
    return [e for e in kineto_doc["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]


def _smaller_side(et_doc: dict, kineto_doc: dict) -> int:
    return max(1, min(len(_ops(et_doc)), len(_kineto_cpu(kineto_doc))))


def _joined_same_name(et_doc: dict, kineto_doc: dict) -> int:
    """ET ops whose non-zero rf_id is carried by exactly one Kineto CPU event of the same name
    (ET ids unique here)."""
    by_id: dict = {}
    for e in _kineto_cpu(kineto_doc):
        rf = e.get("args", {}).get(RF_KEY)
        if rf:
            by_id.setdefault(rf, []).append(e["name"])
    return sum(1 for n in _ops(et_doc) if _rf_id(n) and by_id.get(_rf_id(n)) == [n["name"]])


def _floor_count(smaller: int) -> int:
    """The fewest joined ops that reach the floor: the least k with k / smaller >= 10 %."""
    return -(-smaller // 10)


def _keep_only(et_doc: dict, keep: int, how: str, seed: int = 0) -> dict:
    """A copy of the ET whose ops keep their rf_id on ``keep`` of them (chosen at random); on the
    others the id is scrambled to a value no Kineto event has ("scramble") or removed ("remove")."""
    doc = json.loads(json.dumps(et_doc))
    ops = [n for n in _ops(doc) if _rf_id(n)]
    kept = {id(n) for n in random.Random(seed).sample(ops, keep)}
    fresh = 10 ** 12
    for node in ops:
        if id(node) in kept:
            continue
        fresh += 1
        if "rf_id" in node:
            if how == "remove":
                del node["rf_id"]
            else:
                node["rf_id"] = fresh
            continue
        if how == "remove":
            node["attrs"] = [a for a in node["attrs"] if a.get("name") != "rf_id"]
        else:
            _rf_attr(node)["value"] = fresh
    return doc


# --------------------------------------------------------------------------- the verdict alone


def _stats(joined: int, mismatches: int = 0) -> dict:
    return {"joined": joined, "name_mismatches": mismatches, "kineto_duplicate_ids": 0,
            "et_duplicate_ids": 0, "kineto_zero_ids": 0}


@pytest.mark.parametrize("smaller, joined, trusted", [
    (100, 10, True),    # exactly at the floor: 10 %
    (100, 11, True),
    (100, 9, False),    # just below
    (519, 52, True),    # 10.02 %
    (519, 51, False),   # 9.83 %
    (1000, 100, True),
    (1000, 99, False),
    (32, 4, True),      # 12.5 %
    (32, 3, False),     # 9.4 %
])
def test_verdict_at_the_coverage_floor(smaller, joined, trusted):
    usable, reason = _verdict(kineto_with_id=max(joined, 1) * 3, et_has_ids=True, stats=_stats(joined),
                              smaller=smaller)
    assert usable is (joined / smaller >= FLOOR) is trusted
    if trusted:
        assert reason.startswith(f"{joined} ops joined by rf_id, names agree on {joined}")
    else:
        assert reason == f"rf_id joins only {joined} of {smaller} ops"


def test_verdict_full_coverage_is_trusted_and_other_refusals_keep_their_reasons():
    assert _verdict(500, True, _stats(500), 500) == (
        True, "500 ops joined by rf_id, names agree on 500; 0 duplicated Kineto ids and 0 duplicated ET ids left out")
    # names disagreeing on more than 1 % of the pairs: refused even with full coverage
    usable, reason = _verdict(500, True, _stats(500, mismatches=6), 500)
    assert not usable and reason.startswith("names disagree on 6 of 500 pairs")
    assert _verdict(0, True, _stats(0), 500)[0] is False
    assert _verdict(500, False, _stats(0), 500)[0] is False
    assert _verdict(500, True, _stats(0), 500) == (
        False, "no ET rf_id occurs in the Kineto trace (different window or run?)")


# --------------------------------------------------------------------------- real pairs

CPU_CASES = sorted(d.name for d in (FIXTURES / "cpu").iterdir() if (d / "et.json.gz").is_file())


@pytest.mark.parametrize("case", CPU_CASES)
def test_real_fixture_pairs_are_linked_by_rf_id(case):
    et_path, kineto_path = fixture_pair("cpu", case)
    et_doc, kineto_doc = _load(et_path), _load(kineto_path)
    smaller = _smaller_side(et_doc, kineto_doc)
    joined = _joined_same_name(et_doc, kineto_doc)
    assert joined / smaller >= FLOOR  # the real capture is far above the floor
    et, kineto, _ = read_pair(et_path, kineto_path)
    _, check = match_by_rf_id(et, kineto)
    assert check.usable and check.stats["joined"] == joined
    result = link(et, kineto)
    assert result.match.method == "rf_id" and result.report.method == "rf_id"
    assert result.report.linked_ops == joined
    assert "record-function ids validated: joined on them" in result.report.method_reason


@pytest.mark.parametrize("case", ["mlp_1step", "mlp_multistep", "threads"])
def test_shared_torch_cpu_pairs_are_linked_by_rf_id(case):
    et_path = shared_trace("torch_cpu", case, "et.json.gz")
    kineto_path = shared_trace("torch_cpu", case, "kineto.json.gz")
    et_doc, kineto_doc = _load(et_path), _load(kineto_path)
    assert _joined_same_name(et_doc, kineto_doc) / _smaller_side(et_doc, kineto_doc) >= FLOOR
    result = link(*read_pair(et_path, kineto_path)[:2])
    assert result.match.method == "rf_id"


def _pair_keeping(tmp_path, case: str, how: str, below_floor: int):
    """A CPU fixture pair whose ET keeps ``_floor_count - below_floor`` joinable rf_ids (the rest
    scrambled or removed, ``how``): (ET path, Kineto path, ids kept, ops on the smaller side)."""
    et_path, kineto_path = fixture_pair("cpu", case)
    et_doc, kineto_doc = _load(et_path), _load(kineto_path)
    smaller = _smaller_side(et_doc, kineto_doc)
    keep = _floor_count(smaller) - below_floor
    changed = _keep_only(et_doc, keep, how)
    assert _joined_same_name(changed, kineto_doc) == keep
    return _save(changed, tmp_path / "et.json.gz"), kineto_path, keep, smaller


@pytest.mark.parametrize("how", ["scramble", "remove"])
@pytest.mark.parametrize("case", ["mlp_steps", "threads"])
def test_coverage_just_below_the_floor_is_refused_and_falls_back(tmp_path, case, how):
    path, kineto_path, keep, smaller = _pair_keeping(tmp_path, case, how, 1)
    assert keep / smaller < FLOOR

    et, kineto, _ = read_pair(path, kineto_path)
    _, check = match_by_rf_id(et, kineto)
    assert check.stats["joined"] == keep
    assert check.usable is False
    assert check.reason == f"rf_id joins only {keep} of {smaller} ops"

    result = link(et, kineto)
    assert result.match.method != "rf_id" and result.report.method != "rf_id"
    assert (f"record-function ids not usable: rf_id joins only {keep} of {smaller} ops; "
            "using order alignment") in result.report.method_reason
    assert result.report.linked_ops > keep  # the fallback links by order, not only the kept ids

    et, kineto, _ = read_pair(path, kineto_path)
    with pytest.raises(OptionError, match=f"cannot be trusted \\(rf_id joins only {keep} of {smaller} ops\\)"):
        link(et, kineto, LinkOptions(method="rf_id"))


@pytest.mark.parametrize("how", ["scramble", "remove"])
@pytest.mark.parametrize("case", ["mlp_steps", "threads"])
def test_coverage_just_at_the_floor_is_trusted(tmp_path, case, how):
    path, kineto_path, keep, smaller = _pair_keeping(tmp_path, case, how, 0)
    assert keep / smaller >= FLOOR and (keep - 1) / smaller < FLOOR

    et, kineto, _ = read_pair(path, kineto_path)
    _, check = match_by_rf_id(et, kineto)
    assert check.usable is True and check.stats["joined"] == keep
    assert check.reason.startswith(f"{keep} ops joined by rf_id, names agree on {keep}")
    result = link(et, kineto)
    assert result.match.method == "rf_id"
    assert result.report.linked_ops == keep  # only the ids that still meet their event


def test_coverage_is_taken_on_the_smaller_side():
    """main_thread_only: 1208 ET ops, 32 Kineto CPU events; all 32 join, 32/32 (not 32/1208 < 10 %)."""
    et_path, kineto_path = fixture_pair("cpu", "main_thread_only")
    et_doc, kineto_doc = _load(et_path), _load(kineto_path)
    smaller = _smaller_side(et_doc, kineto_doc)
    joined = _joined_same_name(et_doc, kineto_doc)
    assert smaller == len(_kineto_cpu(kineto_doc)) < len(_ops(et_doc))
    assert joined / len(_ops(et_doc)) < FLOOR <= joined / smaller
    et, kineto, _ = read_pair(et_path, kineto_path)
    _, check = match_by_rf_id(et, kineto)
    assert check.usable and check.stats["joined"] == joined
    assert link(et, kineto).match.method == "rf_id"

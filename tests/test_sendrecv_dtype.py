"""The cross-rank check of ``et-link batch`` (``linker.batch.collectives.check_job``): the k-th
send of a rank to a peer must meet the peer's k-th receive with the same bytes AND the same
dtype (an unknown dtype on either side is not a mismatch). The ranks' records are hand-made
report sidecars, as a rank's worker leaves them (``{"collectives": {...}}``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from linker.batch.collectives import CONSISTENT, MISMATCH, check_job, format_check


def _sidecar(path: Path, point_to_point: list, collectives: list | None = None, ranks=(0, 1)) -> str:
    record = {"groups": {"1": list(ranks)}, "unresolved": 0,
              "collectives": {"1": collectives} if collectives else {},
              "point_to_point": {"1": point_to_point} if point_to_point else {}}
    path.write_text(json.dumps({"collectives": record}))
    return str(path)


def _job(tmp_path: Path, send_dtype, recv_dtype, size_send: int = 4096, size_recv: int = 4096):
    """Rank 0 sends twice to rank 1; rank 1 receives twice. Only the second pair varies."""
    rank0 = _sidecar(tmp_path / "rank0.report.json",
                     [["SEND", 128, "float32", 1], ["SEND", size_send, send_dtype, 1]])
    rank1 = _sidecar(tmp_path / "rank1.report.json",
                     [["RECV", 128, "float32", 0], ["RECV", size_recv, recv_dtype, 0]])
    return check_job({0: rank0, 1: rank1}, [0, 1], 2)


def test_send_and_receive_with_different_dtypes_are_a_mismatch(tmp_path):
    check = _job(tmp_path, "float32", "bfloat16")
    assert check.status == MISMATCH and check.mismatch
    assert len(check.divergences) == 1
    d = check.divergences[0]
    assert (d.group, d.kind, d.position) == ("1", "point-to-point", 1)  # the second send, not the first
    assert d.ranks_at_fault == [0, 1]
    assert [(h.ranks, h.has) for h in d.has] == [([0], "SEND 4096 B float32 to rank 1"),
                                                 ([1], "RECV 4096 B bfloat16 from rank 0")]
    assert "float32" in d.message and "bfloat16" in d.message
    assert d.message.startswith("group 1, send #1 from rank 0 to rank 1")
    assert [g.status for g in check.groups] == [MISMATCH]
    text = "\n".join(format_check(check))
    assert "MISMATCH" in text and "float32" in text and "bfloat16" in text


def test_the_same_send_and_receive_with_equal_dtypes_are_consistent(tmp_path):
    check = _job(tmp_path, "bfloat16", "bfloat16")
    assert check.status == CONSISTENT and not check.mismatch
    assert check.divergences == []
    assert [(g.group, g.status, g.point_to_point) for g in check.groups] == [("1", CONSISTENT, 4)]


@pytest.mark.parametrize("send_dtype, recv_dtype", [(None, "bfloat16"), ("float32", None), (None, None)])
def test_an_unknown_dtype_on_either_side_is_not_a_mismatch(tmp_path, send_dtype, recv_dtype):
    assert _job(tmp_path, send_dtype, recv_dtype).status == CONSISTENT


def test_bytes_still_compared(tmp_path):
    check = _job(tmp_path, "float32", "float32", size_send=4096, size_recv=2048)
    assert check.status == MISMATCH and check.divergences[0].position == 1


def test_collectives_with_different_dtypes_are_a_mismatch(tmp_path):
    """The same rule for collectives: rank 1's second all-reduce has another dtype."""
    rank0 = _sidecar(tmp_path / "r0.json", [], [["ALL_REDUCE", 1024, "float32"], ["ALL_REDUCE", 1024, "float32"]])
    rank1 = _sidecar(tmp_path / "r1.json", [], [["ALL_REDUCE", 1024, "float32"], ["ALL_REDUCE", 1024, "float16"]])
    check = check_job({0: rank0, 1: rank1}, [0, 1], 2)
    assert check.status == MISMATCH
    d = check.divergences[0]
    assert (d.kind, d.position) == ("collective", 1) and "float16" in d.message and "float32" in d.message
    same = _sidecar(tmp_path / "r1b.json", [], [["ALL_REDUCE", 1024, "float32"], ["ALL_REDUCE", 1024, "float32"]])
    assert check_job({0: rank0, 1: same}, [0, 1], 2).status == CONSISTENT

"""Rank start offsets by value (docs/rank-start.md): a rank's offset is its earliest measured
start minus the job's earliest measured start, so the earliest rank has offset 0 and the later
ones positive offsets; the batch writes each non-zero offset as the ``sim_dur`` of a leading
delay node named ``[et-link|rank_start]``.

The expected offsets are computed here: from hand-made spans with a plain second implementation
of the rule, and for real batches from the written ET+ files themselves (each rank's earliest
``ts`` over its timed nodes: the CPU ops and GPU ops that carry a measured ``ts``; the delay node
and the roots have none)."""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, SHARED_TRACES
from linker.batch import BatchConfig, run_batch
from linker.plan.rank_start import measured_offsets

DELAY = "[et-link|rank_start]"


# --------------------------------------------------------------------------- the rule on spans


def plain_offsets(spans):
    """The rule, written again: None for < 2 ranks, an untimed rank or starts further apart than
    the longest span; else each start minus the earliest start."""
    if len(spans) < 2:
        return None
    for first, _ in spans:
        if math.isnan(first):
            return None
    earliest = spans[0][0]
    for first, _ in spans:
        if first < earliest:
            earliest = first
    latest_first = spans[0][0]
    longest = 0.0
    for first, last in spans:
        if first > latest_first:
            latest_first = first
        if last - first > longest:
            longest = last - first
    if latest_first - earliest > longest:
        return None
    return [first - earliest for first, _ in spans]


@pytest.mark.parametrize("spans, expected", [
    # worked by hand: rank 1 starts first (offset 0); the others start later (positive)
    ([(2000.5, 9000.0), (1000.25, 8000.0), (1500.0, 7000.0)], [1000.25, 0.0, 499.75]),
    ([(10.0, 20.0), (10.0, 30.0)], [0.0, 0.0]),
    ([(0.0, 100.0), (40.0, 90.0), (100.0, 150.0)], [0.0, 40.0, 100.0]),  # 100 apart, longest span 100: one clock
    ([(7519.0, 20000.0), (0.0, 12000.0), (697.0, 13000.0)], [7519.0, 0.0, 697.0]),
])
def test_offsets_of_hand_made_spans(spans, expected):
    offsets = measured_offsets(spans)
    assert offsets == expected
    earliest_rank = min(range(len(spans)), key=lambda r: spans[r][0])
    assert offsets[earliest_rank] == 0.0 and all(o >= 0 for o in offsets)


def test_offsets_of_random_spans_agree_with_a_plain_implementation():
    rng = random.Random(20240611)
    checked = 0
    for _ in range(300):
        ranks = rng.randint(2, 9)
        step = rng.uniform(10.0, 1e6)
        base = rng.uniform(0.0, 1.7e15)
        spread = step * rng.choice([0.0, 0.3, 0.9, 1.5])  # 1.5 steps apart: not one clock
        spans = []
        for _ in range(ranks):
            first = base + rng.uniform(0.0, spread)
            spans.append((first, first + rng.uniform(0.5, 1.0) * step))
        expected = plain_offsets(spans)
        assert measured_offsets(spans) == expected
        if expected is not None:
            checked += 1
            assert min(expected) == 0.0 and all(o >= 0.0 for o in expected)
            assert expected[min(range(ranks), key=lambda r: spans[r][0])] == 0.0
    assert checked > 100


# --------------------------------------------------------------------------- batches, by value


def _nodes(path: Path) -> list[dict]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)["nodes"]


def _span(nodes: list[dict]) -> tuple[float, float]:
    """(earliest measured start, latest measured end) over the nodes that carry a measured ts."""
    timed = [n for n in nodes if n.get("ts") is not None]
    assert timed and not any(n["name"] == DELAY for n in timed)
    return (min(float(n["ts"]) for n in timed),
            max(float(n["ts"]) + float(n.get("inclusive_dur", n.get("dur", 0))) for n in timed))


def _check_delay_nodes(summary) -> dict[int, int]:
    """Every rank's delay node against the offsets computed from its own output; returns them."""
    assert summary.ranks and all(r.status == "linked" for r in summary.ranks)
    nodes = {r.rank: _nodes(Path(r.output)) for r in summary.ranks}
    spans = {rank: _span(ns) for rank, ns in nodes.items()}
    job_first = min(first for first, _ in spans.values())
    # the rule's precondition, checked by hand: one clock (starts within the longest span)
    assert max(f for f, _ in spans.values()) - job_first <= max(last - first for first, last in spans.values())
    expected = {rank: round(first - job_first) for rank, (first, _) in spans.items()}
    assert min(expected.values()) == 0 and sum(1 for v in expected.values() if v > 0) >= 1
    for rank, ns in nodes.items():
        delays = [n for n in ns if n["name"] == DELAY]
        if expected[rank] == 0:
            assert delays == [], f"rank {rank} starts first: no delay node"
            continue
        assert len(delays) == 1, f"rank {rank}"
        delay = delays[0]
        assert ns[0] is delay  # written first
        assert delay["sim_dur"] == expected[rank] == delay["rank_start_micros"], f"rank {rank}"
        assert "ts" not in delay
    assert summary.simulator["rank_start"]["offsets_us"] == {str(r): v for r, v in expected.items()}
    assert sorted(summary.simulator["rank_start"]["rewritten_ranks"]) == sorted(r for r, v in expected.items() if v)
    return expected


def test_ddp_gloo_batch_delay_nodes_by_value(tmp_path):
    """A real 4-rank gloo job (committed fixture), ET+ JSON outputs."""
    source = FIXTURES / "ddp_gloo"
    traces = tmp_path / "in"
    shutil.copytree(source, traces)
    summary = run_batch(BatchConfig(str(traces / "host.*.json.gz"), str(traces / "device.*.json.gz"),
                                    tmp_path / "out", workers=2, fmt="json"),
                        progress_stream=io.StringIO(), interactive=False)
    expected = _check_delay_nodes(summary)
    assert sorted(expected) == [0, 1, 2, 3]


def test_param_dlrm_batch_delay_nodes_by_value(dlrm_batch):
    summary, out = dlrm_batch()
    expected = _check_delay_nodes(summary)
    assert sorted(expected) == list(range(8))
    # the ranks start up to ~7.5 ms apart (docs/rank-start.md): the latest rank's offset is that
    assert 7000 <= max(expected.values()) <= 8000
    # each rank's earliest ET+ ts is a measured time of its own Kineto file
    source = SHARED_TRACES / "param_dlrm"
    for rank in range(8):
        kineto = json.loads(gzip.decompress((source / f"rank{rank}.kineto.json.gz").read_bytes()))
        starts = {float(e["ts"]) for e in kineto["traceEvents"] if e.get("ph") == "X" and "ts" in e}
        first = _span(_nodes(out / f"rank{rank}_plus.json"))[0]
        assert first in starts, f"rank {rank}"


def test_rule_zero_writes_no_delay_node(tmp_path):
    """``--rank-start zero``: no rank gets a delay node, whatever its start."""
    traces = tmp_path / "in"
    shutil.copytree(FIXTURES / "ddp_gloo", traces)
    summary = run_batch(BatchConfig(str(traces / "host.*.json.gz"), str(traces / "device.*.json.gz"),
                                    tmp_path / "out", workers=2, fmt="json", rank_start="zero"),
                        progress_stream=io.StringIO(), interactive=False)
    for r in summary.ranks:
        assert not any(n["name"] == DELAY for n in _nodes(Path(r.output)))

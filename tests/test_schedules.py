"""The schedule is the one door for speed decisions, and no output depends on it: the pinned
outputs (``tests/output_digests.json``: the fixture pairs and two of the 8 dlrm ranks, JSON and
``.et``, two methods) come out byte for byte under the forced schedule too (every child and thread started,
whatever the sizes and cores), as it does under the serial one (``test_output_digests``)."""

from __future__ import annotations

import hashlib
import json

import pytest

from test_output_digests import CASES, DIGESTS, key, pair_paths
from linker.link.recipe import LinkOptions
from linker.pipeline import link_pair
from linker.schedule import Schedule, spare_core


# Every fixture pair and two dlrm ranks (the ranks share one shape: the other six add time, not cases).
FORCED_CASES = [case for case in CASES if not case[0].startswith("dlrm/") or case[0] in ("dlrm/rank0", "dlrm/rank3")]


@pytest.mark.parametrize("name,method,fmt", FORCED_CASES, ids=[key(*c).replace(" ", "-") for c in FORCED_CASES])
def test_pinned_outputs_under_the_forced_schedule(name, method, fmt, tmp_path):
    et, kineto = pair_paths(name)
    if not et.exists():
        pytest.skip(f"shared traces not available ({et})")
    out = tmp_path / f"out.{fmt}"
    link_pair(et, kineto, out, LinkOptions(method=method), schedule=Schedule.forced())
    assert hashlib.sha256(out.read_bytes()).hexdigest() == json.loads(DIGESTS.read_text())[key(name, method, fmt)]


def test_serial_is_the_default_and_auto_forks_only_with_a_spare_core():
    serial, auto, forced = Schedule.serial(), Schedule.auto(), Schedule.forced()
    assert serial == Schedule() and not (serial.kineto_child or serial.fields_child
                                         or serial.split_load or serial.one_shot)
    assert auto.kineto_child == auto.fields_child == auto.split_load == spare_core()
    assert auto.one_shot and not Schedule.auto(one_shot=False).one_shot
    assert forced.kineto_child and forced.fields_child and forced.split_load and forced.output_children
    assert auto.output_children == spare_core() and not serial.output_children
    assert forced.child_min_bytes == forced.split_min_bytes == forced.output_min_bytes == 0
    with pytest.raises(AttributeError):
        forced.kineto_child = False  # a value: frozen


def test_only_a_one_shot_schedule_keeps_the_collector_off():
    import gc

    assert gc.isenabled()
    with Schedule.serial().collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with Schedule(one_shot=True).collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("fmt", ["json", "et"])
def test_ops_moved_to_their_measured_thread_come_out_alike_under_both_schedules(fmt, tmp_path):
    """The forced schedule makes the ET's tree order while the Kineto child reads; the link then
    moves ops the measurement places elsewhere (DDP's gloo collectives, to their worker thread), so
    the plan makes the order again from the moved tree: the output is the serial one."""
    from conftest import FIXTURES

    et, kineto = FIXTURES / "ddp_gloo" / "host.0.json.gz", FIXTURES / "ddp_gloo" / "device.0.json.gz"
    serial, forced = tmp_path / f"serial.{fmt}", tmp_path / f"forced.{fmt}"
    moved = link_pair(et, kineto, serial, LinkOptions()).report.et_tree_disagrees["moved_thread"]
    link_pair(et, kineto, forced, LinkOptions(), schedule=Schedule.forced())
    assert moved > 0
    assert forced.read_bytes() == serial.read_bytes()


def _square_unless_seven(value: int) -> int:
    if value == 7:
        raise ValueError("seven")
    return value * value


def test_calls_shared_out_among_children_come_back_or_are_left_to_the_caller():
    """``shares.call_in_children``: every result comes back boxed, in item order; a call that raises
    leaves it and the rest of that child's share (items 7, 10, 13 of the share 1, 4, 7, ...) to the
    caller, while the other children's shares come back whole."""
    from linker.schedule.shares import call_in_children

    items = [(k,) for k in range(15)]
    assert call_in_children(_square_unless_seven, items[:7], 3) == [(k * k,) for k in range(7)]
    results = call_in_children(_square_unless_seven, items, 3)
    assert [k for k, r in enumerate(results) if r is None] == [7, 10, 13]
    assert all(r == (k * k,) for k, r in enumerate(results) if r is not None)


def test_rewrites_run_in_children_only_when_the_schedule_and_the_job_call_for_them():
    calls, sizes = [(k,) for k in range(4)], [1 << 30] * 4
    assert Schedule.forced().each_output(_square_unless_seven, calls, sizes, 2) == [(0,), (1,), (4,), (9,)]
    assert Schedule.serial().each_output(_square_unless_seven, calls, sizes, 2) == [None] * 4
    assert Schedule.forced().each_output(_square_unless_seven, calls, sizes, 1) == [None] * 4  # one at a time
    assert Schedule.forced().each_output(_square_unless_seven, calls[:1], sizes[:1], 2) == [None]  # one output
    large_only = Schedule.forced().without(output_min_bytes=64 << 20)
    assert large_only.each_output(_square_unless_seven, calls, [1 << 20] * 4, 2) == [None] * 4

"""Where the main thread waits for a CPU collective, and where it does not (docs/durations.md).

Fixture ``fixtures/ddp_gloo_buffers``: a 2-rank DDP-over-gloo capture of a small conv net with
BatchNorm (``scripts/capture_ddp.py --ranks 2 --model conv --intra-op-threads 2 --warmup 2
--active 2 --batch 16``, PyTorch 2.13.0+cpu, on 2 loaded cores). DDP broadcasts the BatchNorm
buffers from rank 0 before each forward; on this host some ``c10d::broadcast_`` and
``c10d::allreduce_`` calls returned only after their gloo worker had run the collective, and went
on for milliseconds after it ended; meanwhile other collectives ended while the main thread ran
compute ops. The expected numbers come from the Kineto files, not from the code under test.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import linker
from linker.pipeline import link_pair
from linker.sim.engine import ASTRA_SIM, LANES

JOB = Path(__file__).resolve().parent / "fixtures" / "ddp_gloo_buffers"
RANKS = (0, 1)


def _events(rank: int) -> list[dict]:
    trace = json.loads(gzip.decompress((JOB / f"device.{rank}.json.gz").read_bytes()))
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def linked(tmp_path_factory) -> dict[int, list[dict]]:
    """Each rank linked alone to ET+ JSON: rank -> its nodes."""
    out = tmp_path_factory.mktemp("buffers")
    nodes = {}
    for rank in RANKS:
        path = out / f"rank{rank}.json"
        link_pair(JOB / f"host.{rank}.json.gz", JOB / f"device.{rank}.json.gz", path)
        nodes[rank] = json.loads(path.read_text())["nodes"]
    return nodes


def _calls_that_went_on(rank: int) -> list[tuple[dict, dict]]:
    """(c10d call, gloo collective) pairs of the Kineto file where the collective began on a worker
    inside the call's record and ended more than 1 µs before the call did, with no other op of the
    main thread beginning in the call after the collective's end: the call's own time went on
    after the collective."""
    events = _events(rank)
    calls = [e for e in events if e["name"].startswith("c10d::")]
    main = {e["tid"] for e in calls}
    pairs = []
    for collective in (e for e in events if e["name"].startswith("gloo:")):
        end = collective["ts"] + collective["dur"]
        for call in calls:
            call_end = call["ts"] + call["dur"]
            if call["ts"] <= collective["ts"] < call_end and call_end - end > 1.0 and not any(
                    e["tid"] in main and end <= e["ts"] < call_end for e in events if e is not call):
                pairs.append((call, collective))
    return pairs


@pytest.mark.parametrize("rank", RANKS)
def test_a_call_that_waited_for_its_collective_runs_its_own_time_after_it(linked, rank):
    """Each such call's time after its collective is a node of its own (``continues`` the call),
    beginning where the collective ended and released by it (``join``); before, the replay ran
    that time before the wait and the wait not at all (the job replayed at 0.977)."""
    pairs = _calls_that_went_on(rank)
    if rank == 1:
        assert len(pairs) >= 2  # the fixture holds the shape (3 such calls on rank 1)
    nodes = linked[rank]
    by_ts = {(n["name"], n["ts"]): n for n in nodes if "ts" in n and "continues" not in n}
    for call, collective in pairs:
        call_node = by_ts[(call["name"], call["ts"])]
        collective_node = by_ts[(collective["name"], collective["ts"])]
        after = [n for n in nodes if n.get("continues") == call_node["id"]
                 and n["ts"] == pytest.approx(collective["ts"] + collective["dur"], abs=1e-3)]
        assert len(after) == 1, (call["name"], call["ts"])
        causes = dict(zip(after[0]["data_deps"], after[0]["data_dep_causes"]))
        assert causes.get(collective_node["id"]) == "join"
        assert after[0]["sim_dur"] == pytest.approx(call["ts"] + call["dur"] - after[0]["ts"], abs=1e-3)


@pytest.mark.parametrize("rank", RANKS)
def test_a_compute_op_running_when_a_collective_ended_did_not_wait_for_it(linked, rank):
    """The main thread waits for a gloo collective in the call that issued it or before the op that
    reads its result, never inside a compute op that happened to run when the worker finished
    (an AdamW ``aten::fill_`` that lasted 11 ms on a loaded host was 11.1 ms 'blocked' before, and
    its rest waited for the all-reduce): no ``aten::`` op has blocked time, and no join from a
    collective goes into one other than the op that reads its result."""
    nodes = linked[rank]
    by_id = {n["id"]: n for n in nodes}
    assert sum(n.get("blocked_dur") or 0 for n in nodes if n["name"].startswith("aten::")) == 0
    collectives = {n["id"] for n in nodes if n["name"].startswith("gloo:")}
    for node in nodes:
        for source, cause in zip(node.get("data_deps", []), node.get("data_dep_causes", [])):
            if cause == "join" and source in collectives and "continues" in node:
                assert not by_id[node["continues"]]["name"].startswith("aten::"), (source, node["id"])


@pytest.mark.parametrize("model", [ASTRA_SIM, LANES])
def test_the_buffers_job_replays_as_measured(tmp_path, model):
    """The job linked as ``et-link batch --format et`` links it, replayed: job and ranks within 1% of the
    measured spans (0.977 before the two rules above)."""
    out = tmp_path / "job"
    linker.link_job(str(JOB / "device.*.json.gz"), out, str(JOB / "host.*.json.gz"), fmt="et", workers=1)
    report = linker.simulate([out / f"rank.{rank}.et" for rank in RANKS], model=model).report
    assert 0.99 <= report.ratio <= 1.01, report.ratio
    for r in report.ranks:
        assert 0.99 <= r.ratio <= 1.01, (r.rank, r.ratio)

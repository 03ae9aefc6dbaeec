"""Every microsecond on the op that spent it (docs/durations.md: later pieces are nodes of their own,
host gaps a field the readers count as host time).

The expected figures come from the outputs read here with plain JSON and protobuf, not from the
plan: an op's measured busy time is its ``exclusive_dur − blocked_dur``; what the ET+ keeps on it is
its node's ``sim_dur − host_gap_dur`` plus the same of each node whose ``continues`` names it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, SHARED_TRACES
from linker.pipeline import link_pair

CPU_PAIRS = sorted(d.relative_to(FIXTURES).as_posix() for d in FIXTURES.glob("*/*") if (d / "et.json.gz").is_file())
SHARED_PAIRS = ["param_linear", "hta_simple_add", "torch_cpu/mlp_multistep", "torch_cpu/threads",
                "param_dlrm/rank0", "param_dlrm/rank5"]


def _pair(name: str) -> tuple[Path, Path]:
    if name.startswith("param_dlrm/"):
        rank = name.split("/")[1]
        pair = SHARED_TRACES / "param_dlrm" / f"{rank}.et.json.gz", SHARED_TRACES / "param_dlrm" / f"{rank}.kineto.json.gz"
    elif name in CPU_PAIRS:
        pair = FIXTURES / name / "et.json.gz", FIXTURES / name / "kineto.json.gz"
    else:
        pair = SHARED_TRACES / name / "et.json.gz", SHARED_TRACES / name / "kineto.json.gz"
    if not pair[0].exists():
        pytest.skip(f"needs ../shared/traces/{name.split('/')[0]} (see README: Real test traces)")
    return pair


def measured_and_kept(nodes: list[dict]) -> tuple[dict, dict]:
    """Per linked CPU op that is not a communication node: (exclusive − blocked, what the ET+ keeps)."""
    measured, kept = {}, {}
    for node in nodes:
        if "continues" in node or "cat" in node or "comm_type" in node or "ts" not in node:
            continue
        measured[node["id"]] = max(0.0, node["exclusive_dur"] - node["blocked_dur"])
        kept[node["id"]] = node["sim_dur"] - node["host_gap_dur"]
    for node in nodes:
        if node.get("continues") in kept:
            kept[node["continues"]] += node["sim_dur"] - node.get("host_gap_dur", 0)
    return measured, kept


@pytest.mark.parametrize("name", CPU_PAIRS + SHARED_PAIRS)
def test_each_op_holds_its_own_busy_time(linked_once, name):
    et, kineto = _pair(name)
    out, _, _ = linked_once(et, kineto)
    nodes = json.loads(out.read_text())["nodes"]
    measured, kept = measured_and_kept(nodes)
    assert measured
    off = {i: kept[i] - measured[i] for i in measured if abs(kept[i] - measured[i]) > 0.01}
    assert not off, f"{len(off)} ops keep another op's time, e.g. {list(off.items())[:3]}"
    share = sum(abs(kept[i] - measured[i]) for i in measured) / max(sum(measured.values()), 1e-9)
    assert share <= 0.005
    # and the pieces are what they say: inside their op's measured interval, on its thread; a
    # piece of no busy time carrying host time (a gap split where a worker's burst began) lies in
    # the gap after its op
    by_id = {n["id"]: n for n in nodes}
    for piece in (n for n in nodes if "continues" in n):
        op = by_id[piece["continues"]]
        assert piece["name"] == op["name"] and piece["id"] > max(i for i in by_id if "continues" not in by_id[i])
        if piece["dur"] == 0 and piece["sim_dur"] == piece.get("host_gap_dur", 0):
            assert op["ts"] + op["dur"] - 0.001 <= piece["ts"]
            continue
        assert op["ts"] - 0.001 <= piece["ts"] and piece["ts"] + piece["dur"] <= op["ts"] + op["dur"] + 0.001


def test_the_attribution_script_reads_both_formats(tmp_path):
    """``scripts/attribution.py`` on a pair's JSON and ``.et``: 0% in JSON; the ``.et`` within its
    whole-µs rounding (no op off by more than 1 µs, nothing beyond the format's 1 µs: the exit
    status, at the default 0.5%, is read from that share)."""
    et, kineto = _pair("cpu/mlp_steps")
    link_pair(et, kineto, tmp_path / "out.json")
    link_pair(et, kineto, tmp_path / "out.et")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "attribution.py"), "--json", "--max-share", "2",
                           str(tmp_path / "out.json"), str(tmp_path / "out.et")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows[0]["share_pct"] < 0.01 and rows[0]["ops_off"] == 0
    assert rows[1]["ops"] == rows[0]["ops"] and rows[1]["ops_off"] == 0
    assert rows[1]["share_beyond_resolution_pct"] < 0.01 and rows[1]["resolution_us"] == 1.0
    default = subprocess.run([sys.executable, str(ROOT / "scripts" / "attribution.py"), str(tmp_path / "out.et")],
                             capture_output=True, text=True)
    assert default.returncode == 0 and "beyond the format's 1 µs" in default.stdout, default.stdout


def test_the_ddp_jobs_critical_path_names_the_gemms(tmp_path):
    """The 4-rank DDP-over-gloo job: the backward's ``aten::mm`` measures most of the CPU time; its
    time after its ``aten::resolve_conj`` child stays the ``mm``'s, so the critical path's top CPU op
    is a GEMM, not a view."""
    out = tmp_path / "job"
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "batch", "--et", str(FIXTURES / "ddp_gloo" / "host.*.json.gz"),
                           "--kineto", str(FIXTURES / "ddp_gloo" / "device.*.json.gz"), "--output-dir", str(out), "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(subprocess.run([sys.executable, "-m", "linker.cli", "simulate", str(out), "--json", "--top", "40"],
                                       capture_output=True, text=True, timeout=300).stdout)
    cpu = [op for op in report["critical_path"] if op["kind"] == "cpu"]
    assert cpu[0]["name"] in ("aten::mm", "aten::addmm"), cpu[:3]
    views = {"aten::resolve_conj", "aten::as_strided", "aten::view", "aten::t", "aten::transpose", "aten::detach"}
    assert all(op["us"] < cpu[0]["us"] / 2 for op in cpu if op["name"] in views)
    # the measured exclusive time of the mm ops, read from the outputs, is what the path can hold of them
    mm_busy = 0.0
    for path in sorted(out.glob("rank*_plus.json")):
        measured, _ = measured_and_kept(json.loads(path.read_text())["nodes"])
        names = {n["id"]: n["name"] for n in json.loads(path.read_text())["nodes"]}
        mm_busy += sum(us for i, us in measured.items() if names[i] == "aten::mm")
    assert cpu[0]["us"] <= mm_busy + 1


@pytest.mark.parametrize("script", ["attribution.py", "order_check.py"])
def test_a_file_the_checks_cannot_read_is_one_line_and_exit_2(tmp_path, script):
    """A missing file and one that is no ET+ (this test's own source) give one line each on
    stderr naming the file, no traceback, and exit status 2; the readable file given with them is
    still checked."""
    good = tmp_path / "out.json"
    link_pair(*[FIXTURES / "cpu" / "mlp_steps" / name for name in ("et.json.gz", "kineto.json.gz")], good)
    missing = tmp_path / "missing.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), str(missing), __file__, str(good)],
                          capture_output=True, text=True)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 2 and str(missing) in lines[0] and __file__ in lines[1]
    assert str(good) in proc.stdout

"""The real Nsight Systems / nvprof files of ../shared/traces/nsys (skipped when absent).

Expected numbers come from SQL written here, independently of et-link's readers: which GPU ops
have a launch row, which PyTorch range is the innermost one around that launch on the launching
thread (NVIDIA's "innermost NVTX push-pop range that encompasses the launch" recipe), and the
ET+ must put 100% of those GPU ops under a node with that range's name and start time.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from conftest import shared_trace
from linker.model.errors import TraceInputError
from linker.pipeline import link_pair
from linker.read.timing import TimingSelection, read_timing_trace

PYTORCH = ["nsysai_h100_2gpu_1s", "nsysai_mfu_2gpu_after", "dlprof_lenet_nsys2022"]
NOT_PYTORCH = ["nsysai_mock", "pipit_saxpy_mpi_nsys2022"]


def _db(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


def expected_parents(path: Path) -> dict[tuple, tuple]:
    """(device, stream, start ns) of each GPU op whose launch row exists and lies inside a PyTorch
    range -> (name, start ns) of the innermost such range on the launching thread."""
    db = sqlite3.connect(":memory:")  # a copy, indexed for the lookups below (the input stays as is)
    source = _db(path)
    source.backup(db)
    source.close()
    db.execute('CREATE INDEX thread_start ON NVTX_EVENTS (globalTid, start DESC, "end")')  # the order asked below
    db.execute("CREATE INDEX runtime_correlation ON CUPTI_ACTIVITY_KIND_RUNTIME (correlationId)")
    has_op_id = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE '%, op_id = %'").fetchone()[0]
    pytorch = "n.text LIKE '%, op_id = %'" if has_op_id else "n.text NOT LIKE '{%'"
    found = {}
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        rows = db.execute(f"""
            SELECT g.deviceId, g.streamId, g.start,
                   (SELECT n.text || char(1) || n.start FROM NVTX_EVENTS n
                     WHERE n.eventType = 59 AND coalesce(n.domainId, 0) = 0 AND {pytorch}
                       AND n.globalTid = r.globalTid AND n.start <= r.start AND n."end" >= r."end"
                     ORDER BY n.start DESC, n."end" ASC LIMIT 1)
            FROM {table} g JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
              ON r.correlationId = g.correlationId
             AND (r.globalTid >> 24) % 16777216 = (g.globalPid >> 24) % 16777216""")
        for device, stream, start, inner in rows:
            if inner is not None:
                text, range_start = inner.split("\x01")
                name = text.split(", seq = ")[0].split(", op_id = ")[0]
                found[(device, stream, start)] = (name, int(range_start))
    db.close()
    return found


@pytest.mark.parametrize("name", PYTORCH)
def test_gpu_work_hangs_under_innermost_pytorch_range(name, tmp_path):
    path = shared_trace("nsys", f"{name}.sqlite")
    expected = expected_parents(path)
    assert expected, "the file has GPU work launched inside PyTorch ranges"
    placed = {}
    for pid in _pytorch_pids(path):  # one output per process: one rank each
        out = tmp_path / f"out{pid}.json"
        outcome = link_pair(None, TimingSelection(path, pid), out)
        doc = orjson.loads(out.read_bytes())
        nodes = {n["id"]: n for n in doc["nodes"]}
        for node in doc["nodes"]:
            if node.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                parent = nodes[node["ctrl_deps"]]
                key = (node["device"], node["stream"], round(node["ts"] * 1000))
                placed[key] = (parent["name"], round(parent.get("ts", -1) * 1000))
        assert outcome.report.gpu_events_in_trace == sum(row["count"] for row in outcome.report.gpu_accounting)
    hits = sum(1 for key, parent in expected.items() if placed.get(key) == parent)
    assert hits == len(expected), f"{len(expected) - hits} of {len(expected)} GPU ops not under their range"


def _pytorch_pids(path: Path) -> list[int]:
    db = _db(path)
    pids = [p for (p,) in db.execute("SELECT DISTINCT (globalTid >> 24) % 16777216 FROM NVTX_EVENTS WHERE "
                                      "eventType = 59 AND (text LIKE '%, op_id = %' OR text LIKE '%, seq = %')")]
    db.close()
    return sorted(pids)


def _gpu_with_launch(path: Path) -> int:
    db = _db(path)
    total = 0
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        total += db.execute(f"SELECT count(*) FROM {table} g WHERE EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                            "WHERE r.correlationId = g.correlationId AND (r.globalTid >> 24) % 16777216 = "
                            "(g.globalPid >> 24) % 16777216)").fetchone()[0]
    return total


def test_two_process_file_reads_per_process():
    path = shared_trace("nsys", "nsysai_h100_2gpu_1s.sqlite")
    both = read_timing_trace(path, all_processes=True)
    assert both.processes == [111, 112]
    first = read_timing_trace(path)
    assert first.processes == [111] and "read pid 111 only" in first.warnings[0]
    one = read_timing_trace(path, prefer_pid=112)
    assert one.processes == [112] and {e.pid for e in one.cpu_events} == {112}
    db = _db(path)
    ranges_112 = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE (globalTid >> 24) % 16777216 = 112 "
                            "AND eventType = 59 AND text LIKE '%, op_id = %'").fetchone()[0]
    assert len(one.cpu_events) == ranges_112
    with pytest.raises(TraceInputError, match="none is the ET's pid 5"):
        read_timing_trace(path, prefer_pid=5)
    launched = {e.args.correlation for e in both.runtime_events}
    assert sum(g.args.correlation in launched for g in both.gpu_events) == _gpu_with_launch(path)


def test_nvprof_file_reads_ranges_and_kernels():
    path = shared_trace("nsys", "profiling_lm_nvprof_d7f0424.sqlite")
    trace = read_timing_trace(path)
    db = _db(path)
    closed = db.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MARKER s JOIN CUPTI_ACTIVITY_KIND_MARKER e
        ON e.id = s.id AND e.flags = 4 JOIN StringTable t ON t._id_ = s.name
        WHERE s.flags = 2 AND t.value NOT LIKE '{%'""").fetchone()[0]
    kernels = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL").fetchone()[0]
    assert len(trace.cpu_events) == closed
    assert sum(e.cat == "kernel" for e in trace.gpu_events) == kernels
    assert trace.source == "nvprof" and "version 12" in trace.version
    seqs = [e.args.seq for e in trace.cpu_events if e.name == "embedding"]
    assert seqs and all(isinstance(s, int) for s in seqs)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linker.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


@pytest.mark.parametrize("name", PYTORCH + NOT_PYTORCH + ["profiling_lm_nvprof_d7f0424"])
def test_cli_links_or_refuses_each_file(name, tmp_path):
    path = shared_trace("nsys", f"{name}.sqlite")
    before = (path.stat().st_mtime_ns, path.read_bytes(), sorted(os.listdir(path.parent)))
    out = tmp_path / "out.et"
    run = _cli("--kineto-file", str(path), "-o", str(out), "-q")
    if name in NOT_PYTORCH:
        assert run.returncode == 2 and "Traceback" not in run.stderr
        assert run.stderr.count("\n") == 1 and "no PyTorch ranges" in run.stderr and str(path) in run.stderr
        assert not out.exists()
    else:
        assert run.returncode == 0, run.stderr
        check = _cli("validate", str(out))
        assert check.returncode == 0, check.stdout + check.stderr
    assert before == (path.stat().st_mtime_ns, path.read_bytes(), sorted(os.listdir(path.parent)))


def test_batch_two_processes_two_ranks(tmp_path):
    path = shared_trace("nsys", "nsysai_mfu_2gpu_after.sqlite")
    run = _cli("batch", "--kineto", str(path), "--output-dir", str(tmp_path), "--format", "et", "-q")
    assert run.returncode == 0, run.stderr
    summary = orjson.loads((tmp_path / "summary.json").read_bytes())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert [r["status"] for r in summary["ranks"]] == ["linked", "linked"]
    assert (tmp_path / "comm_groups.json").exists()
    assert "consistent" in run.stdout
    db = _db(path)
    pids = [p for (p,) in db.execute("SELECT DISTINCT (globalTid >> 24) % 16777216 FROM NVTX_EVENTS "
                                      "WHERE text LIKE '%, op_id = %' ORDER BY 1")]
    for rank, pid in enumerate(pids):
        ranges = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59 AND domainId = 0 AND "
                            "text LIKE '%, op_id = %' AND (globalTid >> 24) % 16777216 = ?", (pid,)).fetchone()[0]
        report = orjson.loads((tmp_path / f"rank{rank}.report.json").read_bytes())
        assert report["et_ops"] == ranges


def test_nvprof_gpu_work_hangs_under_innermost_range(tmp_path):
    """The same 100% check on the nvprof database: markers paired by id, the launch's thread as
    the marker's objectId (pid 4 bytes LE + tid 8 bytes LE), times relative to the earliest one."""
    import struct

    path = shared_trace("nsys", "profiling_lm_nvprof_d7f0424.sqlite")
    db = sqlite3.connect(":memory:")
    source = _db(path)
    source.backup(db)
    source.close()
    db.execute("CREATE TABLE ranges AS SELECT s.objectId AS obj, s.timestamp AS start, e.timestamp AS stop, "
               "t.value AS text FROM CUPTI_ACTIVITY_KIND_MARKER s JOIN CUPTI_ACTIVITY_KIND_MARKER e "
               "ON e.id = s.id AND e.flags = 4 JOIN StringTable t ON t._id_ = s.name "
               "WHERE s.flags = 2 AND t.value NOT LIKE '{%'")
    db.execute("CREATE INDEX by_thread ON ranges (obj, start)")
    base = db.execute("SELECT min(m) FROM (SELECT min(timestamp) AS m FROM CUPTI_ACTIVITY_KIND_MARKER UNION ALL "
                      "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME UNION ALL "
                      "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)").fetchone()[0]
    expected = {}
    launches = db.execute("SELECT k.deviceId, k.streamId, k.start, r.processId, r.threadId & 4294967295, r.start, "
                          "r.\"end\" FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                          "ON r.correlationId = k.correlationId").fetchall()
    for device, stream, start, pid, tid, call_start, call_end in launches:
        inner = db.execute("SELECT text, start FROM ranges WHERE obj = ? AND start <= ? AND stop >= ? "
                           "ORDER BY start DESC, stop ASC LIMIT 1",
                           (struct.pack("<IQ", pid, tid), call_start, call_end)).fetchone()
        if inner is not None:
            expected[(device, stream, start - base)] = (inner[0].split(", seq = ")[0], inner[1] - base)
    assert expected
    out = tmp_path / "out.json"
    link_pair(None, path, out)
    doc = orjson.loads(out.read_bytes())
    nodes = {n["id"]: n for n in doc["nodes"]}
    placed = {(n["device"], n["stream"], round(n["ts"] * 1000)):
              (nodes[n["ctrl_deps"]]["name"], round(nodes[n["ctrl_deps"]].get("ts", -1) * 1000))
              for n in doc["nodes"] if n.get("cat") == "kernel"}
    hits = sum(1 for key, parent in expected.items() if placed.get(key) == parent)
    assert hits == len(expected), f"{len(expected) - hits} of {len(expected)} kernels not under their range"

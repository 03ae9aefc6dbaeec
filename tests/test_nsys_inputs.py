"""Bad and awkward Nsight Systems / nvprof inputs: one line naming the file and the problem (exit
status 2), or a warning and a valid output; never a traceback, never a changed input.

Every file here is written by the test (small nsys-schema files from ``kineto_to_sqlite`` or by
hand), so the suite needs no shared traces.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from linker.model.exit_status import EXIT_INPUT, EXIT_OK

_spec = importlib.util.spec_from_file_location("kineto_to_sqlite", ROOT / "scripts" / "kineto_to_sqlite.py")
converter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(converter)

KINETO = FIXTURES / "gpu" / "gpu_v111" / "kineto.json.gz"
ET = FIXTURES / "gpu" / "gpu_v111" / "et.json.gz"


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linker.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _state(path: Path):
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(path.parent))


@pytest.fixture
def nsys_file(tmp_path) -> Path:
    path = tmp_path / "in" / "trace.sqlite"
    path.parent.mkdir()
    converter.write_nsys(KINETO, path)
    return path


def _refused(run, path: Path, words: str) -> None:
    assert run.returncode == EXIT_INPUT, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], run.stderr


@pytest.mark.parametrize("suffix", [".nsys-rep", ".qdrep"])
def test_binary_report_says_how_to_export(tmp_path, suffix):
    path = tmp_path / f"run{suffix}"
    path.write_bytes(b"\x00\x01NSYS binary report" + bytes(range(256)))
    _refused(_cli("--kineto-file", path, "-o", tmp_path / "o.json"), path, "nsys export --type sqlite")


def test_nvvp_that_is_not_sqlite(tmp_path):
    path = tmp_path / "run.nvvp"
    path.write_bytes(b"\x89NVVP" + bytes(100))
    _refused(_cli("--kineto-file", path, "-o", tmp_path / "o.json"), path, "not an nvprof SQLite database")


def test_truncated_sqlite(nsys_file, tmp_path):
    data = nsys_file.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) // 3])
    _refused(_cli("--kineto-file", cut, "-o", tmp_path / "o.json"), cut, "damaged or truncated")


def test_corrupt_sqlite(nsys_file, tmp_path):
    data = bytearray(nsys_file.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the schema page overwritten, the header kept
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(bytes(data))
    run = _cli("--kineto-file", bad, "-o", tmp_path / "o.json")
    assert run.returncode == EXIT_INPUT and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and str(bad) in run.stderr


def test_sqlite_without_the_tables(tmp_path):
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE things (a INTEGER)")
    conn.commit()
    conn.close()
    _refused(_cli("--kineto-file", path, "-o", tmp_path / "o.json"), path, "neither an Nsight Systems export")


def test_nsys_export_without_nvtx(tmp_path):
    path = tmp_path / "plain.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
                       "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER);")
    conn.close()
    _refused(_cli("--kineto-file", path, "-o", tmp_path / "o.json"), path, "no PyTorch ranges")


def test_read_only_file_and_directory_are_read_unchanged(nsys_file, tmp_path):
    before = _state(nsys_file)
    os.chmod(nsys_file, stat.S_IRUSR)
    os.chmod(nsys_file.parent, stat.S_IRUSR | stat.S_IXUSR)
    try:
        out = tmp_path / "o.et"
        run = _cli("--et-file", ET, "--kineto-file", nsys_file, "-o", out, "-q")
        assert run.returncode == EXIT_OK, run.stderr
        assert _cli("validate", out).returncode == EXIT_OK
        assert _state(nsys_file) == before
    finally:
        os.chmod(nsys_file.parent, stat.S_IRWXU)
        os.chmod(nsys_file, stat.S_IRUSR | stat.S_IWUSR)


def test_writable_file_leaves_no_journal_or_wal(nsys_file, tmp_path):
    before = _state(nsys_file)
    run = _cli("--kineto-file", nsys_file, "-o", tmp_path / "o.json", "-q")
    assert run.returncode == EXIT_OK, run.stderr
    assert _state(nsys_file) == before  # bytes, mtime and the directory listing (no -journal/-wal/-shm)


def test_locked_by_a_writer(nsys_file, tmp_path):
    writer = sqlite3.connect(nsys_file, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("DELETE FROM NVTX_EVENTS")  # a write in progress: the journal lies beside the file
    try:
        assert Path(f"{nsys_file}-journal").exists()
        _refused(_cli("--kineto-file", nsys_file, "-o", tmp_path / "o.json"), nsys_file, "locked")
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def _edited(path: Path, count_sql: str, change_sql: str) -> int:
    """Rows ``count_sql`` counts in the file at ``path`` (at least one), then ``change_sql`` run on it."""
    conn = sqlite3.connect(path)
    rows = conn.execute(count_sql).fetchone()[0]
    conn.execute(change_sql)
    conn.commit()
    conn.close()
    assert rows
    return rows


def test_ranges_never_closed_warn_and_link(nsys_file, tmp_path):
    open_ranges = _edited(nsys_file, "SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'ProfilerStep%'",
                          "UPDATE NVTX_EVENTS SET end = NULL WHERE text LIKE 'ProfilerStep%'")
    out = tmp_path / "o.json"
    run = _cli("--kineto-file", nsys_file, "-o", out)
    assert run.returncode == EXIT_OK, run.stderr
    assert f"{open_ranges} PyTorch NVTX ranges were never closed" in run.stderr
    assert _cli("validate", out).returncode == EXIT_OK


def test_kernels_whose_launch_row_is_missing(nsys_file, tmp_path):
    _edited(nsys_file, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId IN "
                       "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN "
                       "(SELECT id FROM StringIds WHERE value LIKE 'cudaLaunchKernel_v%'))",
            "DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN "
            "(SELECT id FROM StringIds WHERE value LIKE 'cudaLaunchKernel_v%')")
    out = tmp_path / "o.json"
    run = _cli("--et-file", ET, "--kineto-file", nsys_file, "-o", out)
    assert run.returncode == EXIT_OK, run.stderr
    assert "GPU ops have no launch row" in run.stderr
    assert _cli("validate", out).returncode == EXIT_OK


def test_help_names_the_sources():
    run = _cli("--help")
    assert "Nsight Systems" in run.stdout and "nvprof" in run.stdout


def test_seq_check_warns_when_the_order_alignment_disagrees(tmp_path):
    et, kineto = FIXTURES / "cpu" / "mlp_steps" / "et.json.gz", FIXTURES / "cpu" / "mlp_steps" / "kineto.json.gz"
    path = tmp_path / "noids.sqlite"
    converter.write_nsys(kineto, path, strip_op_id=True)
    good = _cli("--et-file", et, "--kineto-file", path, "-o", tmp_path / "good.json")
    assert good.returncode == EXIT_OK and "seq check:" in good.stderr and "BELOW" not in good.stderr
    _edited(path, "SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE '%, seq = %'",
            "UPDATE NVTX_EVENTS SET text = replace(text, ', seq = ', ', seq = 9') WHERE text LIKE '%, seq = %'")
    bad = _cli("--et-file", et, "--kineto-file", path, "-o", tmp_path / "bad.json")
    assert bad.returncode == EXIT_OK, bad.stderr
    assert "WARNING: seq check: the ET's seq_id equals the range's seq on 0 of" in bad.stderr


def _two_processes(path: Path) -> tuple[int, int]:
    """Copy every row of the file's process to a second process (pid + 1): two ranks in one file."""
    conn = sqlite3.connect(path)
    (gtid,) = conn.execute("SELECT globalTid FROM NVTX_EVENTS LIMIT 1").fetchone()
    pid = (gtid >> 24) & 0xFFFFFF
    shift = 1 << 24
    conn.execute(f"INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                 f"SELECT start, end, eventType, text, globalTid + {shift}, domainId FROM NVTX_EVENTS")
    conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT start, end, eventClass, globalTid + {shift}, "
                 f"correlationId, nameId, returnValue, callchainId FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    for table in ("KERNEL", "MEMCPY", "MEMSET"):
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info(CUPTI_ACTIVITY_KIND_{table})")]
        moved = ", ".join(f"{c} + {shift}" if c == "globalPid" else c for c in columns)
        conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_{table} SELECT {moved} FROM CUPTI_ACTIVITY_KIND_{table}")
    conn.commit()
    conn.close()
    return pid, pid + 1


def test_batch_makes_one_rank_per_process(nsys_file, tmp_path):
    first, second = _two_processes(nsys_file)
    out = tmp_path / "job"
    run = _cli("batch", "--kineto", nsys_file, "--output-dir", out, "--format", "et", "-q")
    assert run.returncode == EXIT_OK, run.stderr
    assert "collectives: consistent across 2 ranks" in run.stdout
    import orjson

    reports = [orjson.loads((out / f"rank{r}.report.json").read_bytes()) for r in (0, 1)]
    assert [r["method_reason"][1].split("process ")[1].split(";")[0] for r in reports] == [str(first), str(second)]
    assert reports[0]["et_ops"] == reports[1]["et_ops"] > 0
    assert (out / "comm_groups.json").exists()
    alone = _cli("--kineto-file", nsys_file, "-o", tmp_path / "one.json")
    assert alone.returncode == EXIT_OK and f"read pid {first} only" in alone.stderr


def test_multi_process_file_among_several_is_a_pairing_problem(nsys_file, tmp_path):
    _two_processes(nsys_file)
    converter.write_nsys(KINETO, nsys_file.parent / "rank1.sqlite")
    run = _cli("batch", "--kineto", f"{nsys_file.parent}/*.sqlite", "--output-dir", tmp_path / "job")
    assert run.returncode == EXIT_INPUT
    assert "holds 2 PyTorch processes" in run.stderr and "Traceback" not in run.stderr


def test_pid_ranks_maps_processes_to_ranks(nsys_file, tmp_path):
    import orjson

    first, second = _two_processes(nsys_file)
    out = tmp_path / "job"
    run = _cli("batch", "--kineto", nsys_file, "--output-dir", out, "--pid-ranks", f"{first}:1,{second}:0", "-q")
    assert run.returncode == EXIT_OK, run.stderr
    reports = {r: orjson.loads((out / f"rank{r}.report.json").read_bytes()) for r in (0, 1)}
    assert f"process {second}" in reports[0]["method_reason"][1]
    assert f"process {first}" in reports[1]["method_reason"][1]
    missing = _cli("batch", "--kineto", nsys_file, "--output-dir", tmp_path / "j2", "--pid-ranks", f"{first}:0")
    assert missing.returncode == EXIT_INPUT and "gives this process no rank" in missing.stderr
    bad = _cli("batch", "--kineto", nsys_file, "--output-dir", tmp_path / "j3", "--pid-ranks", "x:0")
    assert bad.returncode == EXIT_INPUT and bad.stderr.strip().splitlines() == [
        "et-link: error: --pid-ranks: 'x:0' is not PID:RANK (e.g. 4242:0)"]


def _add_ranges(path: Path, texts: list[str], domain: int = 0) -> None:
    """Closed ranges with ``texts`` on the first range's thread, inside its interval."""
    conn = sqlite3.connect(path)
    start, end, gtid = conn.execute("SELECT start, end, globalTid FROM NVTX_EVENTS ORDER BY rowid LIMIT 1").fetchone()
    conn.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                     "VALUES (?, ?, 59, ?, ?, ?)", [(start, end, t, gtid, domain) for t in texts])
    conn.commit()
    conn.close()


@pytest.mark.parametrize("strip", [False, True], ids=["op_id", "no_op_id"])
def test_ranges_that_are_not_ops_are_left_out_and_counted(tmp_path, strip):
    from linker.read.timing import read_timing_trace

    path = tmp_path / "trace.sqlite"
    converter.write_nsys(KINETO, path, strip_op_id=strip)
    with sqlite3.connect(path) as conn:
        ops = conn.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
    user = ["my_region", "train step 3"]
    pyprof = ["{'mod': 'torch.nn', 'op': 'linear'}"]
    _add_ranges(path, user + pyprof)
    _add_ranges(path, ["ncclGroupEnd"], domain=1)
    trace = read_timing_trace(path)
    names = {e.name for e in trace.cpu_events}
    if strip:  # no op_id: every default-domain range but PyProf markers is an op
        assert len(trace.cpu_events) == ops + len(user) and set(user) <= names
        assert f"{len(pyprof)} PyProf dict markers" in " ".join(trace.notes)
    else:  # op_id: the ranges without one are user ranges
        assert len(trace.cpu_events) == ops and not set(user) & names
        assert f"{len(user) + len(pyprof)} default-domain ranges that are not PyTorch ops" in " ".join(trace.notes)
    assert "1 ranges of other NVTX domains" in " ".join(trace.notes)

"""Nsight Systems JSON exports (``--type json`` in both string-table shapes, ``--type jsonlines``;
plain and gzip): the same ET+ as the SQLite export of the same capture, byte for byte, alone and
with an ET; ranks through ``batch``; the real JSON Lines excerpts refused in one line; Kineto never
taken for an nsys export nor the other way round; bad input named by file and line.

The JSON files are written at test time from SQLite files by ``nsys_json_export`` (from the
documented format, not from the reader): from the GPU fixture through ``kineto_to_sqlite``, and
from the shared captures (skipped without ../shared). Expected outputs are those of the SQLite
reader on the same rows (edited alike where the JSON is edited); expected line numbers are
counted here in the text written.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from conftest import FIXTURES, ROOT, SHARED_TRACES, shared_trace
from linker.model.errors import TraceInputError
from linker.model.exit_status import EXIT_INPUT
from linker.pipeline import link_pair
from linker.read.kineto import read_kineto_trace
from linker.read.nsys_json_form import FORM_JSON, FORM_JSON_LINES, nsys_json_form
from linker.read.timing import export_processes, read_timing_trace
from linker.read.timing_model import TimingTrace
from nsys_json_export import write_json, write_jsonlines

_spec = importlib.util.spec_from_file_location("kineto_to_sqlite", ROOT / "scripts" / "kineto_to_sqlite.py")
kineto_to_sqlite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kineto_to_sqlite)

GPU = FIXTURES / "gpu" / "gpu_v111"
FORMS = {  # name: (writer, its options, the form detected)
    "json": (write_json, {}, FORM_JSON),
    "json-string-lines": (write_json, {"strings": "lines"}, FORM_JSON),
    "json-int64-numbers": (write_json, {"int64": "number"}, FORM_JSON),
    "jsonlines": (write_jsonlines, {}, FORM_JSON_LINES),
}


def _export(sqlite_path: Path, out: Path, form: str, compress: bool = False) -> Path:
    writer, options, _ = FORMS[form]
    return writer(sqlite_path, out, compress=compress, **options)


def _linked(et, timing, out: Path) -> bytes:
    link_pair(et, timing, out)
    return out.read_bytes()


class Capture:
    """The GPU fixture as an nsys SQLite file, and its ET+ through it, alone and with its ET."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.sqlite = directory / "capture.sqlite"
        kineto_to_sqlite.write_nsys(GPU / "kineto.json.gz", self.sqlite)
        self.et = GPU / "et.json.gz"
        self.alone = _linked(None, self.sqlite, directory / "alone.json")
        self.with_et = _linked(self.et, self.sqlite, directory / "with_et.json")

    def edited_sqlite(self, name: str, *sql: str) -> Path:
        path = self.dir / name
        shutil.copyfile(self.sqlite, path)
        db = sqlite3.connect(path)
        for statement in sql:
            db.execute(statement)
        db.commit()
        db.close()
        return path


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Capture:
    return Capture(tmp_path_factory.mktemp("nsys_json_capture"))


# -- same ET+ as the SQLite export ------------------------------------------------------------------

@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("form", list(FORMS))
def test_export_links_as_the_sqlite_file(capture, form, compress, tmp_path):
    path = _export(capture.sqlite, tmp_path / "capture.export", form, compress)
    assert nsys_json_form(path) == FORMS[form][2]
    trace = read_timing_trace(path)
    assert isinstance(trace, TimingTrace) and trace.source == "nsys" and "JSON" in trace.describe()
    assert _linked(None, path, tmp_path / "alone.json") == capture.alone
    assert _linked(capture.et, path, tmp_path / "with_et.json") == capture.with_et


@pytest.mark.parametrize("form", ["json", "jsonlines"])
def test_order_alignment_without_op_ids(capture, form, tmp_path):
    stripped = tmp_path / "stripped.sqlite"
    kineto_to_sqlite.write_nsys(GPU / "kineto.json.gz", stripped, strip_op_id=True)
    expected = _linked(capture.et, stripped, tmp_path / "sqlite.json")
    path = _export(stripped, tmp_path / "stripped.export", form)
    assert _linked(capture.et, path, tmp_path / "json.json") == expected


# (capture, form, gzip): every form on the small PyTorch capture, one on each two-process one (time).
SHARED_CASES = [
    ("dlprof_lenet_nsys2022", "json", False), ("dlprof_lenet_nsys2022", "json-string-lines", True),
    ("dlprof_lenet_nsys2022", "json-int64-numbers", False), ("dlprof_lenet_nsys2022", "jsonlines", False),
    ("dlprof_lenet_nsys2022", "jsonlines", True),
    ("nsysai_h100_2gpu_1s", "jsonlines", False),
    ("nsysai_mfu_2gpu_after", "json", True),  # NCCL ranges' text through TextId, renumbered with the strings
]


@pytest.fixture(scope="module")
def shared_baselines(tmp_path_factory) -> dict:
    """capture name -> its ET+ through the SQLite file (made once, when first asked for)."""
    return {"dir": tmp_path_factory.mktemp("nsys_json_shared")}


@pytest.mark.parametrize("name,form,compress", SHARED_CASES)
def test_shared_capture_links_as_its_sqlite_file(name, form, compress, shared_baselines, tmp_path):
    sqlite_path = shared_trace("nsys", f"{name}.sqlite")
    if name not in shared_baselines:
        shared_baselines[name] = _linked(None, sqlite_path, shared_baselines["dir"] / f"{name}.json")
    path = _export(sqlite_path, tmp_path / f"{name}.export", form, compress)
    assert _linked(None, path, tmp_path / "out.json") == shared_baselines[name]
    if name == "nsysai_mfu_2gpu_after":  # the ranks batch would make: those of the SQLite file
        assert export_processes(path) == export_processes(sqlite_path) == [148, 149]


@pytest.mark.parametrize("form", ["json", "jsonlines"])
@pytest.mark.parametrize("name", ["nsysai_mock", "pipit_saxpy_mpi_nsys2022"])
def test_shared_capture_without_pytorch_ranges_is_refused_alike(name, form, tmp_path):
    sqlite_path = shared_trace("nsys", f"{name}.sqlite")
    with pytest.raises(TraceInputError) as from_sqlite:
        read_timing_trace(sqlite_path)
    path = _export(sqlite_path, tmp_path / "export", form)
    with pytest.raises(TraceInputError) as from_json:
        link_pair(None, path, tmp_path / "out.json")
    assert from_json.value.problem == from_sqlite.value.problem
    assert "no PyTorch ranges" in from_json.value.problem and not (tmp_path / "out.json").exists()


# -- several processes: batch ---------------------------------------------------------------------

def _two_processes(capture: Capture) -> tuple[Path, tuple[int, int]]:
    """The capture with each row copied to a second process (pid + 1)."""
    db = sqlite3.connect(capture.sqlite)
    (gtid,) = db.execute("SELECT globalTid FROM NVTX_EVENTS LIMIT 1").fetchone()
    db.close()
    pid, shift = (gtid >> 24) & 0xFFFFFF, 1 << 24
    copies = [f"INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) SELECT start, end, "
              f"eventType, text, globalTid + {shift}, domainId FROM NVTX_EVENTS",
              f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT start, end, eventClass, globalTid + {shift}, "
              "correlationId, nameId, returnValue, callchainId FROM CUPTI_ACTIVITY_KIND_RUNTIME"]
    for table, columns in (("KERNEL", "start, end, deviceId, contextId, streamId, correlationId, globalPid, "
                                      "demangledName, shortName"),
                           ("MEMCPY", "start, end, deviceId, contextId, streamId, correlationId, globalPid, bytes, "
                                      "copyKind, srcKind, dstKind"),
                           ("MEMSET", "start, end, deviceId, contextId, streamId, correlationId, globalPid, value, "
                                      "bytes, memKind")):
        moved = columns.replace("globalPid", f"globalPid + {shift}")
        copies.append(f"INSERT INTO CUPTI_ACTIVITY_KIND_{table} ({columns}) SELECT {moved} "
                      f"FROM CUPTI_ACTIVITY_KIND_{table}")
    return capture.edited_sqlite("two.sqlite", *copies), (pid, pid + 1)


def _batch_outputs(timing: Path, out: Path) -> dict[str, bytes]:
    from linker.batch.job import BatchConfig, run_batch

    run_batch(BatchConfig(et_glob=None, kineto_glob=str(timing), output_dir=out, workers=1),
              progress_stream=io.StringIO(), interactive=False)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name.startswith("rank") and
            not p.name.endswith("report.json")}


def test_batch_gives_each_process_a_rank_as_for_sqlite(capture, tmp_path):
    two, pids = _two_processes(capture)
    export = _export(two, tmp_path / "two.export", "json", compress=True)
    assert export_processes(export) == list(pids)
    expected = _batch_outputs(two, tmp_path / "from_sqlite")
    got = _batch_outputs(export, tmp_path / "from_json")
    assert len(expected) == 2 and got == expected


# -- telling the files apart -----------------------------------------------------------------------

REAL_EXCERPTS = sorted((SHARED_TRACES / "nsys_json").glob("*.jsonl"))


def test_real_json_lines_excerpts_are_detected_and_refused(tmp_path):
    if len(REAL_EXCERPTS) != 6:
        pytest.skip("needs ../shared/traces/nsys_json (see README: Real test traces)")
    for excerpt in REAL_EXCERPTS:
        renamed = tmp_path / "trace.json"  # told apart by content, not by name
        shutil.copyfile(excerpt, renamed)
        assert nsys_json_form(renamed) == FORM_JSON_LINES
        with pytest.raises(TraceInputError) as refused:
            link_pair(None, renamed, tmp_path / "out.json")
        assert refused.value.path == str(renamed) and "\n" not in str(refused.value)
        assert refused.value.problem.startswith("no PyTorch ranges in this Nsight Systems export")
        assert not (tmp_path / "out.json").exists()
    run = subprocess.run([sys.executable, "-m", "linker.cli", "--kineto-file", str(REAL_EXCERPTS[0]), "-o",
                          str(tmp_path / "cli.json")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == EXIT_INPUT and "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert f"{REAL_EXCERPTS[0]}: no PyTorch ranges in this Nsight Systems export (no NVTX ranges at all)" in line


def test_kineto_is_never_taken_for_an_nsys_export(capture, tmp_path):
    kineto_files = sorted(FIXTURES.glob("**/kineto.json.gz"))
    assert kineto_files
    for kineto in kineto_files:
        assert nsys_json_form(kineto) is None, kineto
    doc = orjson.loads(gzip.decompress((GPU / "kineto.json.gz").read_bytes()))
    shapes = {"compact.json": orjson.dumps(doc), "pretty.json": orjson.dumps(doc, option=orjson.OPT_INDENT_2),
              "events_first.json": orjson.dumps({"traceEvents": doc["traceEvents"], **doc}),
              "array.json": orjson.dumps(doc["traceEvents"])}
    for name, text in shapes.items():
        (tmp_path / name).write_bytes(text)
        assert nsys_json_form(tmp_path / name) is None, name
    trace = read_timing_trace(tmp_path / "compact.json")
    assert not isinstance(trace, TimingTrace) and trace.cpu_events


@pytest.mark.parametrize("form", ["json", "jsonlines"])
def test_an_nsys_export_is_never_read_as_kineto(capture, form, tmp_path):
    path = _export(capture.sqlite, tmp_path / "trace.json", form, compress=True)
    with pytest.raises(TraceInputError) as refused:
        read_kineto_trace(path)
    words = "JSON Lines (--type jsonlines)" if form == "jsonlines" else "JSON (--type json)"
    assert refused.value.problem == f"an Nsight Systems {words} export, not a Kineto trace"


# -- bad input ---------------------------------------------------------------------------------------

def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]  # written with a newline after every line


def _write(path: Path, lines: list[bytes], newline_at_end: bool = True) -> Path:
    path.write_bytes(b"\n".join(lines) + (b"\n" if newline_at_end else b""))
    return path


def _refused(path: Path, tmp_path: Path, *words: str) -> str:
    """The one-line problem of linking ``path``; nothing written."""
    out = tmp_path / "refused.json"
    with pytest.raises(TraceInputError) as refused:
        link_pair(None, path, out)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for word in words:
        assert word in message, message
    assert not out.exists() and not list(tmp_path.glob(".*refused*"))
    return refused.value.problem


def _warned(path: Path, tmp_path: Path, expected: bytes, *words: str) -> None:
    """``path`` links to ``expected``, with a warning holding ``words``."""
    trace = read_timing_trace(path)
    assert any(all(w in warning for w in words) for warning in trace.warnings), trace.warnings
    assert _linked(None, path, tmp_path / "warned.json") == expected


def test_truncated_last_line_of_a_json_lines_export_is_left_out(capture, tmp_path):
    lines = _lines(_export(capture.sqlite, tmp_path / "full.jsonl", "jsonlines"))
    row = b'{"name":"EXPORT_TIME","table":"META_DATA_EXPORT","value":"1.00 sec"}'
    path = _write(tmp_path / "cut.jsonl", [*lines, row[:30]], newline_at_end=False)
    _warned(path, tmp_path, capture.alone, f"line {len(lines) + 1} is cut short")


def test_export_cut_inside_its_string_table_is_refused(capture, tmp_path):
    lines = _lines(_export(capture.sqlite, tmp_path / "full.json", "json"))
    assert lines[-1].startswith(b'{"data":["')  # no thread names here: the strings end the file
    path = _write(tmp_path / "cut.json", [*lines[:-1], lines[-1][:len(lines[-1]) // 2]], newline_at_end=False)
    _refused(path, tmp_path, "no string table", f"its last line, {len(lines)}, is cut short")


@pytest.mark.parametrize("form", ["json", "jsonlines"])
def test_a_line_that_is_not_json(capture, form, tmp_path):
    lines = _lines(_export(capture.sqlite, tmp_path / "full", form))
    at = len(lines) // 2
    path = _write(tmp_path / "bad", [*lines[:at], lines[at][:-5] + b"<html>", *lines[at + 1:]])
    _refused(path, tmp_path, f"line {at + 1}: not JSON")


def test_the_cli_says_it_in_one_line(capture, tmp_path):
    lines = _lines(_export(capture.sqlite, tmp_path / "full", "jsonlines"))
    path = _write(tmp_path / "bad.jsonl", [*lines[:3], b"not json at all", *lines[3:]])
    run = subprocess.run([sys.executable, "-m", "linker.cli", "--kineto-file", str(path), "-o",
                          str(tmp_path / "out.json")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == EXIT_INPUT and "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert f"{path}: line 4: not JSON" in line
    assert not (tmp_path / "out.json").exists()


def test_strings_missing_for_an_id_warn_and_read_as_empty(capture, tmp_path):
    db = sqlite3.connect(capture.sqlite)
    (kernel_name,) = db.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()
    db.close()
    expected = _linked(None, capture.edited_sqlite("dropped.sqlite", f"DELETE FROM StringIds WHERE id = {kernel_name}"),
                       tmp_path / "expected.json")
    lines = _lines(_export(capture.sqlite, tmp_path / "full.json", "json-string-lines"))
    string_line = orjson.dumps({"type": "String", "id": str(kernel_name)})[:-1]  # its first keys, as written
    kept = [line for line in lines if not line.startswith(string_line + b",")]
    assert len(kept) == len(lines) - 1
    _warned(_write(tmp_path / "missing.json", kept), tmp_path, expected,
            "1 string ids used by its rows are not in its string table", f"id {kernel_name}")


def test_an_event_after_the_string_table(capture, tmp_path):
    lines = _lines(_export(capture.sqlite, tmp_path / "full.json", "json"))
    strings_at = next(k for k, line in enumerate(lines) if line.startswith(b'{"data":'))
    path = _write(tmp_path / "late.json", [*lines, lines[0]])
    _refused(path, tmp_path, f"line {len(lines) + 1}: an event (Type", f"(line {strings_at + 1})")
    joined = _write(tmp_path / "joined.json", lines + lines)  # two exports in one file
    _refused(joined, tmp_path, f"line {len(lines) + 1}: an event")


def test_64_bit_fields_as_numbers_read_alike_but_fractions_are_refused(capture, tmp_path):
    numbers = _export(capture.sqlite, tmp_path / "numbers.json", "json-int64-numbers")
    assert b'"startNs":"' not in numbers.read_bytes() and b'"startNs":' in numbers.read_bytes()
    assert _linked(None, numbers, tmp_path / "numbers_out.json") == capture.alone
    lines = _lines(_export(capture.sqlite, tmp_path / "full.json", "json"))
    at = next(k for k, line in enumerate(lines) if b'"TraceProcessEvent"' in line)
    line = orjson.loads(lines[at])
    line["TraceProcessEvent"]["startNs"] = 1234.5
    path = _write(tmp_path / "fraction.json", [*lines[:at], orjson.dumps(line), *lines[at + 1:]])
    _refused(path, tmp_path, f"line {at + 1}: a value of the wrong type", "startNs")


@pytest.mark.parametrize("form", ["json", "jsonlines"])
def test_an_export_without_cuda_trace_warns_and_links_its_cpu_ops(capture, form, tmp_path):
    cpu_only = capture.edited_sqlite(f"cpu_only_{form}.sqlite", *(
        f"DELETE FROM CUPTI_ACTIVITY_KIND_{t}" for t in ("RUNTIME", "KERNEL", "MEMCPY", "MEMSET")))
    expected = _linked(None, cpu_only, tmp_path / "expected.json")
    assert b'"kernel"' not in expected
    path = _export(cpu_only, tmp_path / "cpu_only", form)
    _warned(path, tmp_path, expected, "no CUDA API calls or GPU activity", "CPU ops only")


def test_mixed_files_are_refused_at_the_first_line_of_the_other_kind(capture, tmp_path):
    legacy = _lines(_export(capture.sqlite, tmp_path / "a.json", "json"))
    rows = _lines(_export(capture.sqlite, tmp_path / "b.jsonl", "jsonlines"))
    _refused(_write(tmp_path / "legacy_then_rows.json", legacy + rows), tmp_path,
             f"line {len(legacy) + 1}: a JSON Lines row")
    _refused(_write(tmp_path / "rows_then_legacy.jsonl", rows + legacy), tmp_path,
             f'line {len(rows) + 1}: no "table" key')
    doubled = rows + [line for line in rows if b'"table":"StringIds"' in line][:1]
    _refused(_write(tmp_path / "strings_twice.jsonl", doubled), tmp_path, f"line {len(doubled)}: string id",
             "is given twice")
    kineto = orjson.dumps(orjson.loads(gzip.decompress((GPU / "kineto.json.gz").read_bytes())))
    _refused(_write(tmp_path / "with_kineto.jsonl", [*rows[:5], kineto, *rows[5:]]), tmp_path,
             'line 6: no "table" key')


# CUPTI enum names as a protobuf JSON writer may give them instead of numbers (NSYS_JSON.md §2.1).
COPY_KIND_NAMES = {1: "CUDA_MEMCPY_KIND_HTOD", 2: "CUDA_MEMCPY_KIND_DTOH", 8: "CUDA_MEMCPY_KIND_DTOD",
                   10: "CUDA_MEMCPY_KIND_PTOP"}
MEMORY_KIND_NAMES = {1: "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", 2: "CUDA_MEMOPR_MEMORY_KIND_PINNED",
                     3: "CUDA_MEMOPR_MEMORY_KIND_DEVICE"}


def test_copy_kinds_given_by_name_read_as_their_numbers(capture, tmp_path):
    lines = _lines(_export(capture.sqlite, tmp_path / "full.json", "json"))
    named, renamed = [], 0
    for line in lines:
        event = orjson.loads(line)
        copy = event.get("CudaEvent", {}).get("memcpy")
        if copy:
            copy["copyKind"] = COPY_KIND_NAMES[copy["copyKind"]]
            for side in ("srcKind", "dstKind"):
                copy[side] = MEMORY_KIND_NAMES[copy[side]]
            renamed += 1
        named.append(orjson.dumps(event))
    assert renamed
    assert _linked(None, _write(tmp_path / "named.json", named), tmp_path / "named_out.json") == capture.alone

"""The Kineto child's CPU events reach the parent as columns, the events themselves left encoded
(on the child's shelf) until something reads them: linking by rf_id on real pairs never decodes
them and writes what the serial read writes; everything else decodes them on first read and sees
the serial read's events."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from conftest import fixture_pair
from test_read_paths import needs_fork, only_in_child, real_pairs, serial_and_child_reads
from linker import pipeline
from linker.schedule import fork as forked
from linker.schedule import kineto_child as kineto_ahead
from linker.link.durations import nest_cpu_events, rounded_exclusive
from linker.model.errors import TraceInputError
from linker.read.kineto import CpuColumns, KinetoTrace


def _decodes_counted(monkeypatch) -> list:
    """Record each decode of deferred CPU events (the trace's path), letting it happen."""
    decoded = []
    fill = kineto_ahead.DeferredEvents.fill

    def counted(self):
        decoded.append(self.count)
        return fill(self)

    monkeypatch.setattr(kineto_ahead.DeferredEvents, "fill", counted)
    return decoded


@needs_fork
@pytest.mark.parametrize("pair", real_pairs(), ids=lambda p: f"{p[0].parent.name}/{p[0].name}")
def test_columns_from_the_child_are_those_of_the_serial_events(pair, monkeypatch):
    et_path, kineto_path = pair
    decoded = _decodes_counted(monkeypatch)  # the serial read defers nothing
    (_, serial, _), (_, kineto, _) = serial_and_child_reads(monkeypatch, et_path, kineto_path)
    assert kineto.deferred_cpu is not None and "cpu_events" not in vars(kineto)
    assert kineto.cpu_count() == len(serial.cpu_events)
    assert kineto.cpu_columns() == CpuColumns.of(serial.cpu_events)
    assert kineto.has_record_function_ids() == serial.has_record_function_ids()
    assert decoded == []  # all of that from the columns
    key = kineto.cpu_events_key()
    assert kineto.cpu_events is key and kineto.cpu_events == serial.cpu_events  # decoded now, in place
    assert decoded == [len(serial.cpu_events)] and kineto.deferred_cpu is None
    assert kineto.cpu_columns() is kineto.cpu_columns_cache[1]  # still the columns of that list
    assert kineto == serial


@needs_fork
@pytest.mark.parametrize("case", [("cpu", "threads"), ("cpu", "dataloader_workers"), ("gpu", "gpu_v111"),
                                  ("gpu", "gpu_v101")], ids="/".join)
def test_linking_reads_the_events_only_where_it_needs_them(case, monkeypatch, tmp_path):
    """The CPU pairs (PyTorch 2.13, rf_ids) link from the columns alone; the GPU pairs attribute
    kernels through their launchers' events, which decodes them. Either way the ET+ and the report
    are the serial read's, byte for byte."""
    written, decoded, outcome = _linked_serially_and_ahead(monkeypatch, tmp_path, *fixture_pair(*case))
    if case[0] == "cpu":
        assert decoded == [] and outcome.report.method == "rf_id"
    else:
        assert len(decoded) == 1  # once, however many readers
    assert written["child"] == written["serial"]


def _linked_serially_and_ahead(monkeypatch, tmp_path, et_path, kineto_path):
    """Link the pair with its Kineto file read serially, then by the child: (the ET+ bytes and the
    report without its seconds, per run), the decodes of deferred events in the child's run, and
    that run's outcome."""
    written = {}
    for label, ahead in (("serial", False), ("child", True)):
        with monkeypatch.context() as m:
            if ahead:
                only_in_child(m)
            decoded = _decodes_counted(m)
            out, report = tmp_path / f"{label}.json", tmp_path / f"{label}.report.json"
            outcome = pipeline.link_pair(et_path, kineto_path, out, report_path=report, read_ahead=ahead)
            written[label] = out.read_bytes(), _without_seconds(report.read_text())
    return written, decoded, outcome


def _without_seconds(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if '"seconds"' not in line)


@needs_fork
def test_events_on_the_shelf_never_go_through_the_pipe(monkeypatch):
    """Only the columns and the shelf's offsets are sent; with no shelf (a platform without memory
    files) the encoded events go through the pipe instead, and give the same trace."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    serial = kineto_ahead.read_kineto_trace(kineto_path)
    received = []

    real_parts = forked.ForkedCall.parts

    def parts(child):
        for part in real_parts(child):
            received.append(len(part))
            yield part

    monkeypatch.setattr(forked.ForkedCall, "parts", parts)
    for shelf in (True, False):
        received.clear()
        child = forked.ForkedCall(lambda: kineto_ahead._read_and_check(kineto_path), shelf=shelf)
        trace, _ = kineto_ahead.finish(child)
        assert trace.cpu_events == serial.cpu_events
        sizes = sum(received)
        if shelf:
            on_shelf = sizes
        else:
            assert sizes > on_shelf + 20 * len(serial.cpu_events)  # the events' maps came by the pipe


@needs_fork
def test_a_shelf_without_the_chunks_leaves_the_read_to_the_parent(monkeypatch):
    kineto_path = fixture_pair("cpu", "threads")[1]
    monkeypatch.setattr(forked.ForkedCall, "shelf", lambda self: None)
    child = forked.ForkedCall(lambda: kineto_ahead._read_and_check(kineto_path), shelf=True)
    assert kineto_ahead.finish(child) is None


@needs_fork
@pytest.mark.parametrize("sizes", [[5], [3, 0, 1 << 20, 7]])
def test_shelved_bytes_reach_the_parent_in_place(sizes):
    blobs = [os.urandom(size) for size in sizes]

    def shelve_all():
        yield b"".join(forked.shelve(blob).to_bytes(8, "little") for blob in blobs)

    child = forked.ForkedCall(shelve_all, shelf=True)
    offsets = [int.from_bytes(p[k:k + 8], "little") for p in child.parts() for k in range(0, len(p), 8)]
    shelf = child.shelf()
    child.cancel()
    assert [bytes(shelf[at:at + len(blob)]) for at, blob in zip(offsets, blobs)] == blobs
    assert forked.shelve(b"x") is None  # in no child: the caller sends the bytes itself
    assert forked.ForkedCall(lambda: b"").shelf() is None


def test_a_trace_made_here_has_its_events(tmp_path):
    """No deferral outside the wire: the columns are read off the events, once per event list."""
    trace = kineto_ahead.read_kineto_trace(fixture_pair("cpu", "threads")[1])
    assert isinstance(trace, KinetoTrace) and trace.deferred_cpu is None
    columns = trace.cpu_columns()
    assert trace.cpu_columns() is columns and columns == CpuColumns.of(trace.cpu_events)
    trace.cpu_events = trace.cpu_events[1:]
    assert trace.cpu_columns().name == columns.name[1:] and trace.cpu_count() == len(columns.ts) - 1
    with pytest.raises(AttributeError):
        trace.no_such_field


def _not_sent(kineto) -> bool:
    """True when the child left the CPU events in the file (its chunks carried columns only)."""
    return None in kineto.deferred_cpu._chunks


@needs_fork
@pytest.mark.parametrize("case", [("cpu", "threads"), ("cpu", "dataloader_workers")], ids="/".join)
def test_a_cpu_trace_to_join_by_rf_id_keeps_its_events_in_the_file(case, monkeypatch):
    """When the link tries rf_ids first, a CPU trace with ids sends only its columns (and nesting);
    its events, if anything reads them, are read from the file again: the serial read's events."""
    et_path, kineto_path = fixture_pair(*case)
    (_, serial, serial_warnings), (_, kineto, warnings) = serial_and_child_reads(
        monkeypatch, et_path, kineto_path, rf_id_first=True)
    assert _not_sent(kineto)
    assert kineto.cpu_columns() == CpuColumns.of(serial.cpu_events) and warnings == serial_warnings
    nesting = kineto.cpu_nesting[1]
    assert nesting == nest_cpu_events(serial.cpu_events) and nesting.rounded == rounded_exclusive(nesting.exclusive)
    assert kineto.cpu_events == serial.cpu_events and kineto == serial  # read again, on demand


@needs_fork
@pytest.mark.parametrize("case,rf_id_first", [(("gpu", "gpu_v111"), True), (("cpu", "threads"), False)],
                         ids=["gpu-rf_id_first", "cpu-other-method-first"])
def test_events_are_sent_where_the_link_will_read_them(case, rf_id_first, monkeypatch):
    """GPU pairs attribute kernels through their launchers' events, and exact or approximate
    matching reads every event: the child sends them."""
    et_path, kineto_path = fixture_pair(*case)
    (_, serial, _), (_, kineto, _) = serial_and_child_reads(monkeypatch, et_path, kineto_path,
                                                             rf_id_first=rf_id_first)
    assert kineto.deferred_cpu is not None and not _not_sent(kineto)
    assert kineto.cpu_events == serial.cpu_events


@needs_fork
def test_a_trace_without_rf_ids_sends_its_events(monkeypatch, tmp_path):
    """Without record-function ids the link matches by order or structure, reading every event."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    doc = json.loads(gzip.decompress(kineto_path.read_bytes()))
    for event in doc["traceEvents"]:
        event.get("args", {}).pop("Record function id", None)
    stripped = tmp_path / "kineto.json"
    stripped.write_text(json.dumps(doc))
    only_in_child(monkeypatch)
    _, kineto, _ = pipeline.read_pair(et_path, stripped, rf_id_first=True)
    assert not kineto.has_record_function_ids() and not _not_sent(kineto)


@needs_fork
def test_events_left_in_a_file_that_changed_are_refused(monkeypatch, tmp_path):
    et_path, kineto_path = fixture_pair("cpu", "threads")
    copy = tmp_path / "kineto.json.gz"
    copy.write_bytes(kineto_path.read_bytes())
    only_in_child(monkeypatch)
    _, kineto, _ = pipeline.read_pair(et_path, copy, rf_id_first=True)
    assert _not_sent(kineto)
    doc = json.loads(gzip.decompress(copy.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cpu_op"][:10] + [
        e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"][:5]
    copy.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(TraceInputError, match="kineto.json.gz: changed while it was being read"):
        kineto.cpu_events


@needs_fork
def test_unlinked_events_in_the_report_come_from_the_columns(monkeypatch, tmp_path):
    """An event no op links to (the ET caught fewer steps than Kineto, say) is named in the
    report from the columns: the events left in the file are not read again for it."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    doc = json.loads(gzip.decompress(kineto_path.read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    extra = dict(ops[-1], name="aten::only_in_kineto", ts=max(e["ts"] + e["dur"] for e in ops) + 10.5, dur=2.0)
    extra["args"] = dict(ops[-1]["args"], **{"Record function id": 10 ** 9})
    doc["traceEvents"].append(extra)
    kineto = tmp_path / "kineto.json"
    kineto.write_text(json.dumps(doc))
    written, decoded, outcome = _linked_serially_and_ahead(monkeypatch, tmp_path, et_path, kineto)
    assert decoded == []
    unmatched = outcome.report.unmatched["kineto"]
    assert unmatched["count"] == 1 and unmatched["examples"] == [
        {"name": "aten::only_in_kineto", "tid": extra["tid"], "ts": extra["ts"]}]
    assert written["child"] == written["serial"]

"""The Kineto child's CPU events reach the parent as columns, the events themselves left encoded
(as they came through the pipe) until something reads them: linking by rf_id on real pairs never decodes
them and writes what the serial read writes; everything else decodes them on first read and sees
the serial read's events."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import fixture_pair
from test_read_paths import FORCED, SERIAL, needs_fork, read_both, real_pairs
from linker import pipeline
from linker.read.kineto import CpuColumns, read_kineto_trace


@needs_fork
@pytest.mark.parametrize("pair", real_pairs(), ids=lambda p: f"{p[0].parent.name}/{p[0].name}")
def test_columns_from_the_child_are_those_of_the_serial_events(pair):
    et_path, kineto_path = pair
    serial, forced = (inputs.kineto for inputs in read_both(et_path, kineto_path))
    assert serial.cpu_events_decoded()  # the serial read defers nothing
    assert not forced.cpu_events_decoded()
    assert forced.cpu_count() == len(serial.cpu_events)
    assert forced.cpu_columns() == CpuColumns.of(serial.cpu_events)
    assert forced.has_record_function_ids() == serial.has_record_function_ids()
    assert not forced.cpu_events_decoded()  # all of that from the columns
    assert forced.cpu_events == serial.cpu_events and forced.cpu_events_decoded()  # decoded now
    assert forced.cpu_events is forced.cpu_events  # once
    assert forced == serial


def _linked(tmp_path, et_path, kineto_path, schedule, label):
    """Link the pair under ``schedule``: (the ET+ bytes, the report without its seconds), outcome."""
    out, report = tmp_path / f"{label}.json", tmp_path / f"{label}.report.json"
    outcome = pipeline.link_pair(et_path, kineto_path, out, report_path=report, schedule=schedule)
    text = "\n".join(line for line in report.read_text().splitlines() if '"seconds"' not in line)
    return (out.read_bytes(), text), outcome


@needs_fork
@pytest.mark.parametrize("case", [("cpu", "threads"), ("cpu", "dataloader_workers"), ("gpu", "gpu_v111"),
                                  ("gpu", "gpu_v101")], ids="/".join)
def test_linking_reads_the_events_only_where_it_needs_them(case, tmp_path):
    """The CPU pairs (PyTorch 2.13, rf_ids) link from the columns alone; the GPU pairs attribute
    kernels through their launchers' events, which decodes them. Either way the ET+ and the report
    are the serial read's, byte for byte."""
    serial, _ = _linked(tmp_path, *fixture_pair(*case), SERIAL, "serial")
    forced, outcome = _linked(tmp_path, *fixture_pair(*case), FORCED, "forced")
    decoded = outcome.et_plus.result.kineto.cpu_events_decoded()
    if case[0] == "cpu":
        assert not decoded and outcome.report.method == "rf_id"
    else:
        assert decoded
    assert forced == serial


def test_a_trace_read_here_has_its_events():
    """Nothing is pending outside the wire: the columns are read off the events when they are set."""
    trace = read_kineto_trace(fixture_pair("cpu", "threads")[1])
    assert trace.cpu_events_decoded() and trace.cpu_columns() == CpuColumns.of(trace.cpu_events)
    columns = trace.cpu_columns()
    trace.cpu_events = trace.cpu_events[1:]
    assert trace.cpu_columns().name == columns.name[1:] and trace.cpu_count() == len(columns.ts) - 1
    with pytest.raises(AttributeError):
        trace.no_such_field


@needs_fork
def test_unlinked_events_in_the_report_come_from_the_columns(tmp_path):
    """An event no op links to (the ET caught fewer steps than Kineto, say) is named in the
    report from the columns: the pending events are not decoded for it."""
    et_path, kineto_path = fixture_pair("cpu", "threads")
    doc = json.loads(gzip.decompress(kineto_path.read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    extra = dict(ops[-1], name="aten::only_in_kineto", ts=max(e["ts"] + e["dur"] for e in ops) + 10.5, dur=2.0)
    extra["args"] = dict(ops[-1]["args"], **{"Record function id": 10 ** 9})
    doc["traceEvents"].append(extra)
    kineto = tmp_path / "kineto.json"
    kineto.write_text(json.dumps(doc))
    serial, _ = _linked(tmp_path, et_path, kineto, SERIAL, "serial")
    forced, outcome = _linked(tmp_path, et_path, kineto, FORCED, "forced")
    assert not outcome.et_plus.result.kineto.cpu_events_decoded()
    unmatched = outcome.report.unmatched["kineto"]
    assert unmatched["count"] == 1 and unmatched["examples"] == [
        {"name": "aten::only_in_kineto", "tid": extra["tid"], "ts": extra["ts"]}]
    assert forced == serial

"""The et-link command as users meet it: outputs, reports, and one-line errors for bad input."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import dlrm_pair, fixture_pair

ET, KINETO = fixture_pair("cpu", "mlp_steps")


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linker.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def test_link_writes_et_plus_and_report(tmp_path):
    out, report = tmp_path / "out.json", tmp_path / "report.json"
    proc = run("--et-file", ET, "--kineto-file", KINETO, "-o", out, "--report", report)
    assert proc.returncode == 0, proc.stderr
    assert "linked" in proc.stderr
    doc = json.loads(out.read_text())
    original = json.loads(gzip.decompress(ET.read_bytes()))
    assert doc["schema"] == original["schema"]
    ops = [n for n in doc["nodes"] if "continues" not in n]  # the ET's nodes; the rest: later pieces of ops
    assert [n["id"] for n in ops] == [n["id"] for n in original["nodes"]]
    by_id = {n["id"]: n for n in original["nodes"]}
    assert all(n["continues"] in by_id and n["id"] > max(by_id) for n in doc["nodes"] if "continues" in n)
    timed = [n for n in ops if "ts" in n]
    assert timed
    for n in timed:
        assert n["inputs"] == by_id[n["id"]]["inputs"]  # untouched parts carried through
        assert 0 <= n["exclusive_dur"] <= n["inclusive_dur"] == n["dur"]
    rep = json.loads(report.read_text())
    for key in ("method", "et_ops", "linked_ops", "kineto_cpu_events", "gpu_events",
                "gpu_events_linked", "unmatched", "warnings"):
        assert key in rep
    assert rep["method"] == "rf_id" and rep["linked_ops"] == rep["et_ops"]


def test_default_output_lands_beside_the_et_and_gzip_by_suffix(tmp_path):
    et = tmp_path / "trace.json.gz"
    shutil.copy(ET, et)
    proc = run("--et-file", et, "--kineto-file", KINETO, "--exact-match")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "trace_plus.json").exists()
    proc = run("--et-file", et, "--kineto-file", KINETO, "-o", tmp_path / "x.json.gz")
    assert proc.returncode == 0
    assert json.loads(gzip.decompress((tmp_path / "x.json.gz").read_bytes()))["nodes"]


def test_gpu_nodes_hang_under_their_launching_op(tmp_path):
    et, kineto = dlrm_pair(0)
    out = tmp_path / "dlrm.json"
    assert run("--et-file", et, "--kineto-file", kineto, "-o", out).returncode == 0
    nodes = json.loads(out.read_text())["nodes"]
    ids = [n["id"] for n in nodes]
    assert len(ids) == len(set(ids))
    known = set(ids)
    gpu = [n for n in nodes if n.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(gpu) == 261
    by_id = {n["id"]: n for n in nodes}
    for n in gpu:
        for key in ("cat", "name", "ph", "ts", "dur", "inclusive_dur", "exclusive_dur", "stream", "device",
                    "correlation"):
            assert key in n
        assert n["parent"] in known and "ts" in by_id[n["parent"]]
    assert all(n["parent"] in known for n in nodes)


def _errors(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("content,problem", [
    (b"", "empty"),
    (b"{not json", "not valid JSON"),
    (gzip.compress(b'{"nodes": [', mtime=0)[:20], "truncated"),
    (b'{"traceEvents": []}', "Kineto trace, not an Execution Trace"),
    (b'[1, 2, 3]', "not a valid Execution Trace"),
    (b'{"schema": "1.0.1", "nodes": [{"id": "x", "name": 3}]}', "not a valid Execution Trace"),
    (b'{"rocprofiler-sdk-tool": [{"metadata": {}}]}', "not an Execution Trace"),  # a key no slot can be
])
def test_bad_et_file_gives_one_line_error(tmp_path, content, problem):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    out = tmp_path / "out.json"
    proc = run("--et-file", bad, "--kineto-file", KINETO, "-o", out)
    assert proc.returncode == 2
    lines = _errors(proc)
    assert len(lines) == 1 and str(bad) in lines[0] and problem in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_keys_that_are_not_identifiers_are_kept_not_fatal(tmp_path):
    """An ET may carry any JSON string as a key, at the top and in a node: read, linked, written
    back under the same key with the same value."""
    doc = json.loads(gzip.decompress(ET.read_bytes()))
    doc["my-tool v2"] = {"a": 1}
    doc["nodes"][3]["odd key!"] = [1, 2]
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    proc = run("--et-file", odd, "--kineto-file", KINETO, "-o", out)
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    assert written["my-tool v2"] == {"a": 1}
    assert next(n for n in written["nodes"] if n["id"] == doc["nodes"][3]["id"])["odd key!"] == [1, 2]


def test_swapped_and_missing_files(tmp_path):
    proc = run("--et-file", KINETO, "--kineto-file", ET, "-o", tmp_path / "o.json")
    assert proc.returncode == 2 and "arguments swapped" in proc.stderr
    proc = run("--et-file", tmp_path / "nope.json", "--kineto-file", KINETO)
    assert proc.returncode == 2 and "no such file" in proc.stderr and len(_errors(proc)) == 1


def test_pair_from_two_runs_is_refused_without_output(tmp_path):
    other_et, _ = fixture_pair("cpu", "threads")
    out = tmp_path / "out.json"
    proc = run("--et-file", other_et, "--kineto-file", KINETO, "-o", out)
    assert proc.returncode == 3
    assert "different runs" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
    forced = run("--et-file", other_et, "--kineto-file", KINETO, "-o", out, "--force")
    assert forced.returncode == 0 and out.exists()


def test_input_is_never_overwritten(tmp_path):
    et = tmp_path / "et.json"
    et.write_bytes(gzip.decompress(ET.read_bytes()))
    before = et.read_bytes()
    proc = run("--et-file", et, "--kineto-file", KINETO, "-o", et)
    assert proc.returncode == 2 and "refusing to overwrite" in proc.stderr
    assert et.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["et.json"]  # no temp file left behind


def test_conflicting_method_flags(tmp_path):
    proc = run("--et-file", ET, "--kineto-file", KINETO, "--exact-match", "--match", "rf_id")
    assert proc.returncode == 2 and len(_errors(proc)) == 1


def test_one_shot_exit_keeps_the_status_the_messages_and_the_files(tmp_path):
    """``main()`` ends a linking process without freeing the ET+ (``process_exit``): what it printed,
    its exit status and its files must still be those of a normal exit."""
    from linker.model.exit_status import EXIT_BELOW_MIN_LINKED
    from linker.write.validate import validate_file

    other_et, _ = fixture_pair("cpu", "threads")
    out, report = tmp_path / "o.et", tmp_path / "r.json"
    proc = run("--et-file", other_et, "--kineto-file", KINETO, "-o", out, "--report", report, "--force",
               "--min-linked", "90")
    assert proc.returncode == EXIT_BELOW_MIN_LINKED, proc.stderr
    lines = _errors(proc)
    assert "linked" in lines[0] and "below --min-linked 90" in lines[-1]
    assert validate_file(out).ok
    assert json.loads(report.read_text())["et_ops"] > 0


def test_library_calls_collect_and_free_as_usual(tmp_path):
    """Only the CLI's ``main()`` makes a process one-shot: ``link_pair`` called as a library restores
    the cyclic collector and keeps nothing alive."""
    import gc

    from linker.schedule import process_exit
    from linker.pipeline import link_pair

    assert gc.isenabled() and not process_exit.kept_anything()
    outcome = link_pair(ET, KINETO, tmp_path / "o.json")
    assert outcome.report.linked_ops > 0
    assert gc.isenabled() and not process_exit.kept_anything()


def test_every_shared_file_links_or_is_refused_in_one_line():
    """Every file under ../shared/traces as the ET, and every one outside ``sweep/`` and
    ``kineto_only/`` as the timing trace too (the other file a real pair's): it links, or it is
    refused as a user's file (``TraceInputError``, exit 2) or as a pair of two runs
    (``MismatchedPairError``, exit 3); nothing else escapes (the CLI's "internal error"). The
    Kineto traces of those two folders are read whole as timing traces by the Kineto-only tests
    and ``scripts/fidelity_table.py``; here each would be read whole only to be refused as another
    run's. In process, one call per file and role."""
    import linker
    from conftest import SHARED_TRACES
    from linker.model.errors import MismatchedPairError, TraceInputError

    if not SHARED_TRACES.exists():
        pytest.skip("needs ../shared/traces (see README: Real test traces)")
    et, kineto = SHARED_TRACES / "hta_simple_add" / "et.json.gz", SHARED_TRACES / "hta_simple_add" / "kineto.json.gz"
    files = sorted(p for p in SHARED_TRACES.rglob("*") if p.is_file() and p.suffix not in (".md",))
    outcomes: dict[str, int] = {}
    for path in files:
        as_timing = path.parent.name not in ("sweep", "kineto_only")
        for pair in ((path, kineto), (et, path)) if as_timing else ((path, kineto),):
            try:
                linker.link_traces(*pair)
                outcome = "linked"
            except (TraceInputError, MismatchedPairError) as err:
                assert "\n" not in str(err), err
                outcome = type(err).__name__
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["linked"] >= 2 and outcomes["TraceInputError"] > len(files) // 2


def test_an_unquoted_batch_glob_is_named_in_one_line(tmp_path):
    """``et-link batch --et run/rank*.et.json.gz ...`` unquoted: the shell hands several files to
    --et; the answer is one line saying so, not the parser's usage error listing every path."""
    files = [tmp_path / f"rank{r}.et.json.gz" for r in range(3)]
    for f in files:
        f.write_bytes(ET.read_bytes())
    proc = run("batch", "--et", *files, "--kineto", str(tmp_path / "rank*.kineto.json.gz"),
               "--output-dir", tmp_path / "out")
    lines = _errors(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--et got several files" in lines[0] and "quote it" in lines[0] and "Usage" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_summary_names_the_method_that_ran_in_words(tmp_path):
    """Order alignment is not called "exact" in the summary (the report's ``method`` keeps the
    option's name): a Kineto trace without record-function ids is linked by order alignment."""
    doc = json.loads(gzip.decompress(KINETO.read_bytes()))
    for event in doc["traceEvents"]:
        if isinstance(event.get("args"), dict):
            event["args"].pop("Record function id", None)
    kineto = tmp_path / "k.json"
    kineto.write_text(json.dumps(doc))
    proc = run("--et-file", ET, "--kineto-file", kineto, "-o", tmp_path / "o.json", "--report", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("et-link: order alignment: linked") and "exact:" not in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["method"] == "exact"

"""What et-link prints for people: headline counts over every GPU event of the file, readable
times, the lanes hint, no internal names in plain output, warnings printed = the report's,
``-h``, choices in ``--help``, ``--trace-out``'s path, and test skip reasons a fresh clone reads.
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, ROOT, SHARED_TRACES, dlrm_pair, fixture_pair, shared_reason, shared_trace
from linker.cli import app
from linker.model.units import format_us
from linker.sim.graph import COMM, GPU
from linker.sim.hints import parallel_cpu_time
from linker.sim.load import load_graph
from sim_graphs import cpu, write_et


def run(*args):
    result = CliRunner().invoke(app, list(map(str, args)))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


# --- readable times -------------------------------------------------------------------------------


@pytest.mark.parametrize("us,text", [(13_336_316.0, "13.34 s"), (14_351.0, "14.35 ms"), (842_100.0, "842.1 ms"),
                                     (86.0, "86 µs"), (2.5, "2.5 µs"), (0.0, "0 µs"), (float("nan"), "n/a")])
def test_durations_read_in_their_unit(us, text):
    assert format_us(us) == text


def test_a_column_keeps_one_unit():
    assert [format_us(v, "ms") for v in (805.0, 14_351.0)] == ["0.81 ms", "14.35 ms"]


# --- the link summary ----------------------------------------------------------------------------


def raw_gpu_events(kineto: Path) -> int:
    doc = orjson.loads(gzip.decompress(kineto.read_bytes()))
    return sum(1 for e in doc["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))


def test_headline_counts_every_gpu_event_of_the_file(tmp_path):
    et, kineto = shared_trace("param_linear", "et.json.gz"), shared_trace("param_linear", "kineto.json.gz")
    out = tmp_path / "linear.et"
    result = run("--et-file", et, "--kineto-file", kineto, "-o", out, "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.stderr
    head = result.stderr.splitlines()[0]
    total = raw_gpu_events(kineto)  # 10,356: 8,716 kernels and 1,640 memsets
    graph = load_graph(out)
    attached = sum(1 for u, kind in enumerate(graph.kind) if kind in (GPU, COMM) and u not in graph.wait_nodes)
    outside = total - attached
    assert f"GPU events: {attached:,} of {total:,} attached ({100 * attached / total:.2f}%; " \
           f"{outside:,} outside the linked iteration)" in head, head
    assert "100.00%)" not in head.split("GPU events")[1]


def test_batch_counts_every_gpu_event_of_the_file_too(tmp_path):
    et, kineto = shared_trace("param_linear", "et.json.gz"), shared_trace("param_linear", "kineto.json.gz")
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.et.json.gz").write_bytes(Path(et).read_bytes())
    (job / "rank0.kineto.json.gz").write_bytes(Path(kineto).read_bytes())
    result = run("batch", "--et", job / "rank*.et.json.gz", "--kineto", job / "rank*.kineto.json.gz",
                 "--output-dir", tmp_path / "out", "--format", "et", "-q")
    assert result.exit_code == 0, result.stderr
    total = raw_gpu_events(kineto)
    graph = load_graph(tmp_path / "out" / "rank.0.et")
    attached = sum(1 for u, kind in enumerate(graph.kind) if kind in (GPU, COMM) and u not in graph.wait_nodes)
    assert f"GPU ops attached {attached}/{total} ({100 * attached / total:.2f}%)" in result.stdout, result.stdout
    row = next(line for line in result.stdout.splitlines() if line.split()[:2] == ["0", "linked"])
    assert float(row.split()[4]) == round(100 * attached / total, 2)


def test_unattached_gpu_warning_names_no_internal_key(tmp_path):
    et, kineto = fixture_pair("gpu", "shapes_cuda")
    result = run("--et-file", et, "--kineto-file", kineto, "-o", tmp_path / "o.et", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if "not attached to any op" in line)
    problems = orjson.loads((tmp_path / "r.json").read_bytes())["gpu_attribution"]["problems"]
    assert problems and not any(f"[{key}]" in line or key in line for key in problems), (line, problems)


def test_cpu_only_headline_says_so(tmp_path):
    et, kineto = fixture_pair("cpu", "mlp_steps")
    result = run("--et-file", et, "--kineto-file", kineto, "-o", tmp_path / "o.json")
    assert "no GPU events in the Kineto trace (CPU-only run)" in result.stderr.splitlines()[0]


def test_window_line_has_no_internal_words(tmp_path):
    et, kineto = shared_trace("param_linear", "et.json.gz"), shared_trace("param_linear", "kineto.json.gz")
    result = run("--et-file", et, "--kineto-file", kineto, "-o", tmp_path / "o.et", "--report", tmp_path / "r.json")
    window = [line for line in result.stderr.splitlines() if line.startswith("  window:")]
    assert window and "cut at" not in window[0] and "located by" not in window[0]
    assert "starts at 'aten::linear'" in window[0]
    assert "cut at" in orjson.loads((tmp_path / "r.json").read_bytes())["window"]["label"]  # JSON keeps it


def test_stderr_warnings_are_the_reports_and_name_no_enum(tmp_path):
    kineto = shared_trace("kineto_only", "amd_tracelens_mi300_resnet_ddp_rccl.json.gz")
    result = run("--kineto-file", kineto, "-o", tmp_path / "o.et", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.stderr
    printed = [line.split("WARNING: ", 1)[1] for line in result.stderr.splitlines() if "WARNING" in line]
    warnings = orjson.loads((tmp_path / "r.json").read_bytes())["warnings"]
    assert printed == warnings and any("communication kernels" in w for w in warnings)
    assert "COMP_NODE" not in result.stderr


# --- simulate's text -----------------------------------------------------------------------------


def test_simulate_text_in_ms_without_internal_names(tmp_path):
    et, kineto = dlrm_pair(0)
    out = tmp_path / "rank0.et"
    assert run("--et-file", et, "--kineto-file", kineto, "-o", out, "-q").exit_code == 0
    text = run("simulate", out).stdout
    assert re.search(r"step: measured \d+\.\d\d ms, simulated \d+\.\d\d ms", text), text
    assert " us" not in text and "entered via" not in text
    assert "its ops start after: the previous op on its thread" in text
    doc = orjson.loads(run("simulate", out, "--json").stdout)
    assert {link["link"] for link in doc["critical_path_links"]} >= {"thread_order", "parent"}  # JSON keeps names


def test_parallel_cpu_time_of_two_overlapping_threads(tmp_path):
    # thread 1 busy [100, 110], thread 2 busy [105, 115]: 5 µs with both busy.
    path = write_et(tmp_path / "g.et", [cpu(1, 10, start=100, tid=1), cpu(2, 10, start=105, tid=2)])
    assert parallel_cpu_time(load_graph(path)) == 5.0


def test_lanes_hint_for_parallel_threads_only_under_astra_sim(tmp_path):
    et, kineto = fixture_pair("cpu", "threads")
    out = tmp_path / "threads.et"
    assert run("--et-file", et, "--kineto-file", kineto, "-o", out, "-q").exit_code == 0
    hint = "--model lanes replays each thread on its own"
    slow = run("simulate", out, "--json")
    doc = orjson.loads(slow.stdout)
    assert doc["ratio"] > 1.5 and any(hint in note and "CPU ops waited" in note for note in doc["notes"])
    assert hint not in run("simulate", out, "--model", "lanes").stdout
    et, kineto = fixture_pair("cpu", "main_thread_only")
    single = tmp_path / "single.et"
    assert run("--et-file", et, "--kineto-file", kineto, "-o", single, "-q").exit_code == 0
    assert hint not in run("simulate", single).stdout


def test_lanes_hint_for_streams_that_ran_at_once(tmp_path):
    # A (10 µs, measured 100-110) launches kernel 2 (stream 7) and kernel 3 (stream 8), 30 µs each,
    # both measured 110-140: a 40 µs step. Under astra-sim's one GPU unit kernel 3 runs after
    # kernel 2 (40-70): 70 µs, 1.75, and on the critical path kernel 3 waited the 30 µs kernel 2
    # held the unit. Under lanes each stream runs its own: 40 µs, and no note.
    from sim_graphs import gpu
    path = write_et(tmp_path / "streams.et", [cpu(1, 10, start=100), gpu(2, 30, [1], stream=7, start=110),
                                              gpu(3, 30, [1], stream=8, start=110)])
    out = run("simulate", path, "--json")
    doc = orjson.loads(out.stdout)
    assert doc["ratio"] == 1.75
    notes = [note for note in doc["notes"] if "--model lanes replays each stream on its own" in note]
    assert len(notes) == 1 and "GPU ops waited 30 µs for the one GPU unit" in notes[0], doc["notes"]
    lanes = orjson.loads(run("simulate", path, "--model", "lanes", "--json").stdout)
    assert lanes["ratio"] == 1.0 and not any("--model lanes" in note for note in lanes["notes"])


def test_lanes_hint_for_collectives_a_cpu_backend_ran_at_once(tmp_path):
    # A (10 µs, measured 100-110) forks collective Y (worker 3) and, after B (110-112), collective
    # X (worker 2, measured 112-142). Y ran wholly beside X (measured 110-138; no busy part of its
    # own: it lies at its end, so its worker's pickup is 28 µs). Under astra-sim's one collective
    # in flight, Y takes the unit when A ends (10) and holds it through its pickup (to 38); X, ready
    # at 12, waits the 26 µs it held it and ends at 68: 1.62 for a 42 µs span, and a note. Under
    # lanes each worker runs its own: 42 µs, and no note.
    from linker.write.chakra_wire import make_attr
    from sim_graphs import cpu_coll
    y = cpu_coll(3, 0, [1], start=110, tid=3)
    y.attrs.append(make_attr("inclusive_dur_micros", 28))
    path = write_et(tmp_path / "workers.et", [cpu(1, 10, start=100), cpu(4, 2, [1], start=110),
                                              cpu_coll(2, 30, [4], start=112, tid=2), y])
    doc = orjson.loads(run("simulate", path, "--json").stdout)
    assert doc["ratio"] == pytest.approx(68 / 42, abs=1e-3)
    notes = [note for note in doc["notes"] if "--model lanes replays each worker on its own" in note]
    assert len(notes) == 1 and "collectives waited 26 µs for the one collective in flight" in notes[0], doc["notes"]
    lanes = orjson.loads(run("simulate", path, "--model", "lanes", "--json").stdout)
    assert lanes["ratio"] == 1.0 and not any("--model lanes" in note for note in lanes["notes"])


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["simulate"], ["batch"], ["validate"], ["dump"]])
def test_dash_h_is_help_and_choices_are_listed(command):
    result = run(*command, "-h")
    assert result.exit_code == 0 and result.stdout.startswith("Usage:"), result.output
    assert "<str>" not in result.stdout


def test_help_lists_the_choices():
    assert "--match [auto|rf_id|exact|approximate]" in run("--help").stdout
    simulate = run("simulate", "--help").stdout
    assert "--model [astra-sim|lanes]" in simulate and "--rank-start [measured|zero]" in simulate
    assert ".json.gz" in simulate.split("--trace-out", 1)[1].split("--top", 1)[0]


def test_trace_out_prints_its_path_and_writes_gzip(tmp_path):
    path = write_et(tmp_path / "g.et", [cpu(1, 10, start=100), cpu(2, 5, [1], start=110)])
    trace = tmp_path / "t.json.gz"
    result = run("simulate", path, "--trace-out", trace)
    assert result.exit_code == 0 and f"wrote trace {trace}" in result.stderr
    assert "traceEvents" in orjson.loads(gzip.decompress(trace.read_bytes()))
    quiet = run("simulate", path, "--trace-out", tmp_path / "u.json", "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""


# --- skip reasons --------------------------------------------------------------------------------


def test_skip_reason_names_the_trace_set_relative_to_the_checkout():
    assert shared_reason(SHARED_TRACES / "param_dlrm" / "rank0.et.json.gz") == \
        "needs ../shared/traces/param_dlrm (see README: Real test traces)"


def test_a_checkout_without_the_shared_traces_skips_with_relative_reasons(tmp_path):
    """A copy of the tests away from ../shared: the skip reasons name the traces relatively."""
    copy = tmp_path / "checkout"
    (copy / "tests").mkdir(parents=True)
    for source in (ROOT / "tests").iterdir():
        if source.suffix in (".py", ".json"):
            (copy / "tests" / source.name).write_bytes(source.read_bytes())
    (copy / "tests" / "fixtures").symlink_to(FIXTURES)
    files = ["tests/test_sim_real.py", "tests/test_validate.py", "tests/test_fixtures.py", "tests/test_chakra_io.py",
             "tests/test_link_real.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files,
                           "-k", "dlrm or real or shared or linear"], cwd=copy, capture_output=True, text=True,
                          timeout=600)
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips, proc.stdout[-2000:]
    for line in skips:
        assert "needs ../shared/traces/" in line and "(see README: Real test traces)" in line, line
        reason = line.split(": ", 1)[1]
        assert str(tmp_path) not in reason and "/work" not in reason, line


def _ops_under_untimed_top_level_ops(et_path: Path, kineto_path: Path) -> tuple[int, int, list[str], set[int]]:
    """From the two files alone: (ET ops without a Kineto event of their record-function id, those
    of them under a top-level op (parent a root) none of whose ops has one, those top-level ops'
    names in file order, their threads that hold no top-level op with an event)."""
    nodes = orjson.loads(gzip.decompress(et_path.read_bytes()))["nodes"]
    events = orjson.loads(gzip.decompress(kineto_path.read_bytes()))["traceEvents"]
    timed_ids = {e["args"]["Record function id"] for e in events
                 if e.get("ph") == "X" and "Record function id" in e.get("args", {})}
    attr = {n["id"]: {a["name"]: a["value"] for a in n["attrs"]} for n in nodes}
    roots = {n["id"] for n in nodes if n["name"].startswith("[pytorch|profiler|execution_trace|")}
    parent = {n["id"]: n["ctrl_deps"] for n in nodes}

    def top(i):
        while parent[i] not in roots:
            i = parent[i]
        return i

    ops = [n for n in nodes if n["id"] not in roots]
    untimed = [n for n in ops if attr[n["id"]]["rf_id"] not in timed_ids]
    timed_tops = {top(n["id"]) for n in ops if attr[n["id"]]["rf_id"] in timed_ids}
    dark_tops = [n["id"] for n in ops if parent[n["id"]] in roots and n["id"] not in timed_tops]
    under = sum(1 for n in untimed if top(n["id"]) in set(dark_tops))
    names = {n["id"]: n["name"] for n in nodes}
    threads = {attr[t]["tid"] for t in dark_tops} - {attr[t]["tid"] for t in timed_tops}
    return len(untimed), under, [names[t] for t in dark_tops], threads


@pytest.mark.parametrize("case", ["et_beyond_trace", "main_thread_only", "mlp_steps"])
def test_an_et_that_covers_more_than_its_timing_trace_is_named(tmp_path, case):
    """``et_beyond_trace``: the ET observer ran one step before and one after the profiler
    (``scripts/capture_traces.py``); ``main_thread_only``: the profiler recorded one of four
    threads. The link says how many of the unmatched ops lie under top-level ops with no event,
    names them and says which of the two it is; counts and names are computed here from the two
    files (record-function ids). ``mlp_steps`` (both over the same steps) gets no such line."""
    et, kineto = fixture_pair("cpu", case)
    result = run("--et-file", et, "--kineto-file", kineto, "-o", tmp_path / "out.json")
    assert result.exit_code == 0
    unmatched, under, names, threads = _ops_under_untimed_top_level_ops(et, kineto)
    lines = [line for line in result.output.splitlines() if "top-level ops with no event" in line]
    if case == "mlp_steps":
        assert unmatched == 0 and not lines
        return
    assert under == unmatched > 0 and len(lines) == 1
    shown = ", ".join(repr(name) for name in names[:3]) + (", ..." if len(names) > 3 else "")
    assert f"{under:,} of the {unmatched:,} unmatched ET ops lie under {len(names)} top-level ops" in lines[0]
    assert f"({shown})" in lines[0]
    if case == "et_beyond_trace":
        assert names == ["ProfilerStep#1", "ProfilerStep#5"] and not threads
        assert "an ET observer started before the profiler or stopped after it" in lines[0]
    else:
        assert len(threads) == 3 and f"on {len(threads)} ET thread(s) with no op in the timing trace" in lines[0]

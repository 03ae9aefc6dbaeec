"""Bad input, by category (issue 11): every case either fails cleanly (one stderr line naming the
file, a documented non-zero exit, no traceback, nothing left in the output directory, inputs
unchanged) or, for odd but usable input, exits 0 with a warning naming the problem and an output
that ``et-link validate`` accepts. The bad files are built here from our own real captures
(tests/fixtures) and, when present, the shared real traces.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT, fixture_pair, shared_trace
from linker import cli
from linker.batch import BatchConfig, PairingError, run_batch
from linker.write.validate import validate_file

NESTED_ET, NESTED_KINETO = fixture_pair("cpu", "dataloader")  # schema 1.1.1, ctrl_deps, rf_ids
FLAT_ET, FLAT_KINETO = fixture_pair("gpu", "gpu_v101")  # schema 1.0.1, parent, GPU ops


# --------------------------------------------------------------------------- helpers


def load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())


def save(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def invoke(*args) -> tuple[int, str]:
    """Run the et-link command in this process; (exit status, stderr)."""
    result = CliRunner().invoke(cli.app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}")
    return result.exit_code, result.stderr


def assert_clean_failure(code: int, stderr: str, status: int, names: Path, out_dir: Path, inputs: dict) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == status, stderr
    assert len(lines) == 1, stderr
    assert str(names) in lines[0], stderr
    assert "Traceback" not in stderr
    assert list(out_dir.iterdir()) == [], "output or temporary file left behind"
    for path, before in inputs.items():
        assert digest(path) == before, f"{path} was modified"


def node_parent_key(doc: dict) -> str:
    return "ctrl_deps" if "ctrl_deps" in doc["nodes"][0] else "parent"


def op_nodes(doc: dict) -> list[dict]:
    return [n for n in doc["nodes"] if not n["name"].startswith("[pytorch|profiler")]


def cpu_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]


@pytest.fixture
def dirs(tmp_path):
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    outputs.mkdir()
    return inputs, outputs


# --------------------------------------------------------------------------- refused inputs

DEEP = 100_000


def _deep_et_inputs(doc):
    doc["nodes"][3]["inputs"] = {"values": "DEEP"}


def _big_id(doc):
    op_nodes(doc)[4]["id"] = 2 ** 70


def _negative_id(doc):
    op_nodes(doc)[4]["id"] = -7


def _big_rf_id(doc):
    node = op_nodes(doc)[4]
    if "rf_id" in node:
        node["rf_id"] = 2 ** 70
    else:
        node["attrs"] = [dict(a, value=2 ** 70) if a["name"] == "rf_id" else a for a in node["attrs"]]


def _big_tid(doc):
    op_nodes(doc)[4]["tid"] = 2 ** 64


ET_REFUSALS = {
    "deep_json_in_inputs": (_deep_et_inputs, "nested too deeply"),
    "id_2**70": (_big_id, "out of range"),
    "negative_id": (_negative_id, "out of range"),
    "rf_id_2**70": (_big_rf_id, "64 bits"),
}


def _write_with_deep(doc: dict, path: Path) -> Path:
    text = json.dumps(doc).replace('"DEEP"', "[" * DEEP + "]" * DEEP)
    path.write_text(text)
    return path


@pytest.mark.parametrize("layout", ["nested", "flat"])
@pytest.mark.parametrize("case", sorted(ET_REFUSALS))
@pytest.mark.parametrize("suffix", [".json", ".et"])
def test_unusable_et_is_refused_before_output(dirs, layout, case, suffix):
    inputs, outputs = dirs
    et_src, kineto = (NESTED_ET, NESTED_KINETO) if layout == "nested" else (FLAT_ET, FLAT_KINETO)
    mutate, problem = ET_REFUSALS[case]
    doc = load(et_src)
    mutate(doc)
    et = _write_with_deep(doc, inputs / "et.json")
    before = {et: digest(et), kineto: digest(kineto)}
    code, stderr = invoke("--et-file", et, "--kineto-file", kineto, "-o", outputs / f"out{suffix}")
    assert_clean_failure(code, stderr, cli.EXIT_INPUT, et, outputs, before)
    assert problem in stderr


def test_flat_tid_beyond_64_bits_is_refused(dirs):
    inputs, outputs = dirs
    doc = load(FLAT_ET)
    _big_tid(doc)
    et = save(doc, inputs / "et.json")
    code, stderr = invoke("--et-file", et, "--kineto-file", FLAT_KINETO, "-o", outputs / "o.et")
    assert_clean_failure(code, stderr, cli.EXIT_INPUT, et, outputs, {})
    assert "tid" in stderr


@pytest.mark.parametrize("where", [1, 6, "appended"])
@pytest.mark.parametrize("suffix", [".json", ".et"])
def test_attrs_entry_without_a_name_is_refused(dirs, where, suffix):
    """Before the linked columns (1), after them (6: the positional read stops at tid) or after the
    usual entries: a one-line error naming the ET and the node, nothing written."""
    inputs, outputs = dirs
    doc = load(NESTED_ET)
    node = next(n for n in op_nodes(doc) if len(n.get("attrs", [])) > 6)
    if where == "appended":
        node["attrs"].append({"type": "int", "value": 3})
    else:
        del node["attrs"][where]["name"]
    et = save(doc, inputs / "et.json")
    before = {et: digest(et), NESTED_KINETO: digest(NESTED_KINETO)}
    code, stderr = invoke("--et-file", et, "--kineto-file", NESTED_KINETO, "-o", outputs / f"out{suffix}")
    assert_clean_failure(code, stderr, cli.EXIT_INPUT, et, outputs, before)
    assert f"node {node['id']}'s attrs" in stderr


def _invalid_utf8(path: Path, source: Path) -> Path:
    data = gzip.decompress(source.read_bytes())
    at = data.index(b'"name": "') + len(b'"name": "')
    path.write_bytes(data[:at] + b"\xff\xfe" + data[at:])
    return path


@pytest.mark.parametrize("side", ["et", "kineto"])
def test_invalid_utf8_names_the_file(dirs, side):
    inputs, outputs = dirs
    et, kineto = NESTED_ET, NESTED_KINETO
    if side == "et":
        et = bad = _invalid_utf8(inputs / "et.json", NESTED_ET)
    else:
        kineto = bad = _invalid_utf8(inputs / "kineto.json", NESTED_KINETO)
    code, stderr = invoke("--et-file", et, "--kineto-file", kineto, "-o", outputs / "o.json")
    assert_clean_failure(code, stderr, cli.EXIT_INPUT, bad, outputs, {bad: digest(bad)})
    assert "UTF-8" in stderr


@pytest.mark.parametrize("where", ["args", "top_level", "trace_events"])
def test_deeply_nested_kineto_is_refused(dirs, where):
    inputs, outputs = dirs
    doc = load(NESTED_KINETO)
    if where == "args":
        cpu_events(doc)[3]["args"]["deep"] = "DEEP"
    elif where == "top_level":
        doc["deep"] = "DEEP"
    else:
        doc["traceEvents"] = "DEEP"
    kineto = _write_with_deep(doc, inputs / "kineto.json")
    code, stderr = invoke("--et-file", NESTED_ET, "--kineto-file", kineto, "-o", outputs / "o.json")
    assert_clean_failure(code, stderr, cli.EXIT_INPUT, kineto, outputs, {kineto: digest(kineto)})


def test_kineto_without_any_usable_time_is_refused(dirs):
    inputs, outputs = dirs
    doc = load(NESTED_KINETO)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            e["ts"] = -1
    kineto = save(doc, inputs / "kineto.json")
    code, stderr = invoke("--et-file", NESTED_ET, "--kineto-file", kineto, "-o", outputs / "o.json")
    assert_clean_failure(code, stderr, cli.EXIT_INPUT, kineto, outputs, {})
    assert "ts/dur" in stderr


# --------------------------------------------------------------------------- repaired inputs


def _cycle(doc):
    key, ops = node_parent_key(doc), op_nodes(doc)
    a, b = ops[10], ops[11]
    a[key], b[key] = b["id"], a["id"]


def _self_parent(doc):
    node = op_nodes(doc)[10]
    node[node_parent_key(doc)] = node["id"]


def _missing_parent(doc):
    op_nodes(doc)[10][node_parent_key(doc)] = 987654321


def _huge_parent(doc):
    op_nodes(doc)[12][node_parent_key(doc)] = 2 ** 70


ET_REPAIRS = {"parent_cycle": _cycle, "self_parent": _self_parent, "missing_parent": _missing_parent,
              "parent_2**70": _huge_parent}


@pytest.mark.parametrize("layout", ["nested", "flat"])
@pytest.mark.parametrize("case", sorted(ET_REPAIRS))
@pytest.mark.parametrize("method", ["auto", "approximate"])
def test_unusable_parents_are_repaired_with_a_warning(dirs, layout, case, method):
    inputs, outputs = dirs
    et_src, kineto = (NESTED_ET, NESTED_KINETO) if layout == "nested" else (FLAT_ET, FLAT_KINETO)
    doc = load(et_src)
    ET_REPAIRS[case](doc)
    et = save(doc, inputs / "et.json")
    before = digest(et)
    results = {}
    for suffix in (".json", ".et"):
        out, report = outputs / f"o{suffix}", outputs / f"r{suffix}.report.json"
        code, stderr = invoke("--et-file", et, "--kineto-file", kineto, "-o", out, "--match", method,
                              "--report", report)
        assert code == 0, stderr
        assert "Traceback" not in stderr
        warnings = load(report)["warnings"]
        assert any(str(et) in w and "unusable parent" in w for w in warnings), warnings
        assert any("unusable parent" in line for line in stderr.splitlines()), stderr
        results[suffix] = validate_file(out)
        assert results[suffix].ok, [v.kind for v in results[suffix].violations]
    assert digest(et) == before


@pytest.mark.parametrize("key", ["ts", "dur"])
@pytest.mark.parametrize("value", [-5, None, 2 ** 70, 1e300])
def test_unusable_kineto_times_are_left_out_with_a_warning(dirs, key, value):
    inputs, outputs = dirs
    doc = load(NESTED_KINETO)
    victim = cpu_events(doc)[7]
    if value is None:
        del victim[key]
    else:
        victim[key] = value
    kineto = save(doc, inputs / "kineto.json")
    out, report = outputs / "o.json", outputs / "r.json"
    code, stderr = invoke("--et-file", NESTED_ET, "--kineto-file", kineto, "-o", out, "--report", report)
    assert code == 0, stderr
    warnings = load(report)["warnings"]
    assert any(str(kineto) in w and "1 Kineto CPU ops" in w for w in warnings), warnings
    linked = load(out)
    times = [(n.get("ts"), n.get("dur")) for n in linked["nodes"] if "ts" in n]
    assert times and all(0 <= ts < 2 ** 53 and 0 <= dur < 2 ** 53 for ts, dur in times)
    assert validate_file(out).ok


# --------------------------------------------------------------------------- output paths


def _broken_et(inputs: Path) -> Path:
    bad = inputs / "broken.json"
    bad.write_text("{not json")
    return bad


def test_output_paths_are_checked_before_reading(dirs):
    """The output checks come first: with a broken ET, the output problem is what is reported."""
    inputs, outputs = dirs
    broken = _broken_et(inputs)
    cases = [
        (["-o", outputs], outputs, "is a directory"),
        (["-o", outputs / "missing" / "o.json"], outputs / "missing" / "o.json", "does not exist"),
        (["-o", outputs / "o.json", "--report", NESTED_KINETO], NESTED_KINETO, "one of the input files"),
        (["-o", outputs / "o.json", "--report", outputs / "o.json"], outputs / "o.json", "two outputs"),
        (["-o", outputs / "o.json", "--report", outputs / "no" / "r.json"], outputs / "no" / "r.json",
         "does not exist"),
        (["-o", broken], broken, "one of the input files"),
        (["-o", "/dev/null"], "/dev/null", "not a regular file"),
    ]
    before = {broken: digest(broken), NESTED_KINETO: digest(NESTED_KINETO)}
    for extra, named, problem in cases:
        code, stderr = invoke("--et-file", broken, "--kineto-file", NESTED_KINETO, *extra)
        assert_clean_failure(code, stderr, cli.EXIT_INPUT, named, outputs, before)
        assert problem in stderr


def test_outputs_in_an_unwritable_directory(tmp_path):
    with read_only_directory(tmp_path / "ro", NESTED_ET) as ro:
        et = ro / NESTED_ET.name
        for extra, named in [([], ro / "et_plus.json"), (["-o", ro / "o.et"], ro / "o.et"),
                             (["-o", tmp_path / "o.json", "--report", ro / "r.json"], ro / "r.json")]:
            code, stderr = invoke("--et-file", et, "--kineto-file", NESTED_KINETO, *extra)
            assert code == cli.EXIT_INPUT and "not writable" in stderr and str(named) in stderr, stderr
            assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
            assert [p.name for p in ro.iterdir()] == [NESTED_ET.name]
            assert not (tmp_path / "o.json").exists()


@contextlib.contextmanager
def read_only_directory(path: Path, content: Path | None = None):
    """A directory (holding a copy of ``content``) this process cannot write to: chmod for users,
    a read-only bind mount for root (root ignores permission bits)."""
    path.mkdir()
    if content is not None:
        (path / content.name).write_bytes(content.read_bytes())
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode == 0
    if not mounted or subprocess.run(["mount", "-o", "remount,bind,ro", str(path)],
                                     capture_output=True).returncode != 0:
        if mounted:
            subprocess.run(["umount", str(path)], capture_output=True)
        pytest.skip("running as root and cannot make a read-only bind mount")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@contextlib.contextmanager
def full_disk(path: Path):
    """A directory on a (root-only) 64 KiB tmpfs that is already full."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and tmpfs to fill a disk")
    try:
        filler = path / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            f.write(b"\0" * (1 << 20))
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.parametrize("target", ["o.json", "o.json.gz", "o.et", "report"])
def test_full_disk_leaves_nothing(tmp_path, target):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with full_disk(tmp_path / "full") as full:
        if target == "report":
            args = ["-o", out_dir / "o.json", "--report", full / "r.json"]
        else:
            args = ["-o", full / target]
        code, stderr = invoke("--et-file", NESTED_ET, "--kineto-file", NESTED_KINETO, *args)
        assert code == cli.EXIT_INPUT, stderr
        assert "no space left" in stderr and "Traceback" not in stderr
        assert sorted(p.name for p in full.iterdir()) == ["filler"]
        assert list(out_dir.iterdir()) == []


def test_full_disk_under_an_output_room_leaves_nothing(tmp_path):
    """The forced schedule makes a room for the JSON output (``write.sink.OutputRoom``); on a full
    disk its thread stops at the first refused write, the real write says why, nothing is left."""
    from linker.model.errors import TraceInputError
    from linker.pipeline import link_pair
    from linker.schedule import Schedule

    with full_disk(tmp_path / "full") as full:
        with pytest.raises(TraceInputError, match="no space left"):
            link_pair(NESTED_ET, NESTED_KINETO, full / "o.json", schedule=Schedule.forced())
        assert sorted(p.name for p in full.iterdir()) == ["filler"]


@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".et"])
def test_write_error_mid_output_leaves_nothing(dirs, monkeypatch, suffix):
    """Without root: the same as a full disk, by making the output's writes fail."""
    import linker.write.sink as sink

    _, outputs = dirs
    real_fdopen = os.fdopen

    class FullFile(io.RawIOBase):
        def __init__(self, fd):
            self.fd = fd

        def writable(self):
            return True

        def write(self, data):
            raise OSError(28, "No space left on device")

        def close(self):
            os.close(self.fd)
            super().close()

    monkeypatch.setattr(sink.os, "fdopen", lambda fd, mode="r", *a, **k: FullFile(fd) if "w" in mode
                        else real_fdopen(fd, mode, *a, **k))
    code, stderr = invoke("--et-file", NESTED_ET, "--kineto-file", NESTED_KINETO, "-o", outputs / f"o{suffix}")
    assert code == cli.EXIT_INPUT and "no space left" in stderr, stderr
    assert list(outputs.iterdir()) == []


SIGTERM_DURING_WRITE = """
import os, signal, sys
import linker.write.sink as sink
real = sink.atomic_output
def killing(path, protected=(), room=None):
    manager = real(path, protected, room)
    class Wrapped:
        def __enter__(self):
            stream = manager.__enter__()
            stream.write(b"partial")
            os.kill(os.getpid(), signal.SIGTERM)
            return stream
        def __exit__(self, *exc):
            return manager.__exit__(*exc)
    return Wrapped()
for module in ("linker.write.etplus_json", "linker.write.chakra_wire", "linker.pipeline"):
    __import__(module)
    sys.modules[module].atomic_output = killing
from linker.cli import main
sys.argv = ["et-link"] + sys.argv[1:]
main()
"""


@pytest.mark.parametrize("suffix", [".json", ".et"])
def test_sigterm_during_write_leaves_nothing(dirs, suffix):
    _, outputs = dirs
    proc = subprocess.run([sys.executable, "-c", SIGTERM_DURING_WRITE, "--et-file", str(NESTED_ET),
                           "--kineto-file", str(NESTED_KINETO), "-o", str(outputs / f"o{suffix}")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == cli.EXIT_TERMINATED, proc.stderr
    assert "Traceback" not in proc.stderr and "terminated" in proc.stderr
    assert list(outputs.iterdir()) == []


# --------------------------------------------------------------------------- options


def test_options_that_cannot_be_honoured_are_errors(dirs):
    _, outputs = dirs
    pair = ["--et-file", NESTED_ET, "--kineto-file", NESTED_KINETO, "-o", outputs / "o.json"]
    for extra, problem in [(["--window", "-1"], "--window -1"), (["--max-depth", "0"], "--max-depth"),
                           (["--min-linked", "150"], "--min-linked"), (["--annotation", " "], "--annotation"),
                           (["--annotation", "NO SUCH OP"], "matches no Kineto"),
                           (["--window", "99"], "--window 99")]:
        code, stderr = invoke(*pair, "--exact-match", *extra)
        assert code == cli.EXIT_INPUT and problem in stderr and len(stderr.strip().splitlines()) == 1, stderr
        assert list(outputs.iterdir()) == []


def test_window_out_of_range_on_param_linear(dirs):
    _, outputs = dirs
    et, kineto = shared_trace("param_linear", "et.json.gz"), shared_trace("param_linear", "kineto.json.gz")
    code, stderr = invoke("--et-file", et, "--kineto-file", kineto, "-o", outputs / "o.json", "--window", "99")
    assert code == cli.EXIT_INPUT and "40 windows" in stderr and str(kineto) in stderr
    assert list(outputs.iterdir()) == []


def test_min_linked_has_its_own_exit_status(dirs):
    """Two different runs, forced: the links are written but a script can tell they are poor."""
    _, outputs = dirs
    other_et, _ = fixture_pair("cpu", "threads")
    out = outputs / "o.json"
    code, stderr = invoke("--et-file", other_et, "--kineto-file", NESTED_KINETO, "-o", out, "--force",
                          "--min-linked", "90")
    assert code == cli.EXIT_BELOW_MIN_LINKED, stderr
    assert "below --min-linked 90" in stderr and out.exists() and validate_file(out).ok
    code, _ = invoke("--et-file", NESTED_ET, "--kineto-file", NESTED_KINETO, "-o", out, "--min-linked", "90")
    assert code == 0


@pytest.mark.parametrize("method", ["auto", "exact", "approximate", "rf_id"])
def test_forced_pair_of_two_runs_links_without_crash(dirs, method):
    _, outputs = dirs
    pairs = [(FLAT_ET, NESTED_KINETO), (NESTED_ET, FLAT_KINETO)]
    dlrm = ROOT.parent / "shared" / "traces"
    if method == "exact" and (dlrm / "param_dlrm").is_dir():  # the pair that crashed order alignment
        pairs.append((dlrm / "param_dlrm" / "rank0.et.json.gz", dlrm / "param_linear" / "kineto.json.gz"))
    for k, (et, kineto) in enumerate(pairs):
        out = outputs / f"o{k}.et"
        code, stderr = invoke("--et-file", et, "--kineto-file", kineto, "-o", out, "--force", "--match", method)
        if method == "rf_id":  # ids of two runs never validate: refused rather than 0% linked
            assert code == cli.EXIT_INPUT and "--match rf_id" in stderr and not out.exists(), stderr
            continue
        assert code == 0, stderr
        assert "different runs" in stderr and validate_file(out).ok


# --------------------------------------------------------------------------- validate / dump


def test_validate_statuses(tmp_path):
    not_json = tmp_path / "trace.json"
    not_json.write_text("hello, not JSON")
    deep = tmp_path / "deep.json"
    deep.write_text('{"nodes": [{"id": 1, "name": "x", "inputs": ' + "[" * DEEP + "]" * DEEP + "}]}")
    cyclic = tmp_path / "cyclic.json"
    save({"schema": "1.1.1", "nodes": [{"id": 1, "name": "a", "ctrl_deps": 2},
                                       {"id": 2, "name": "b", "ctrl_deps": 1}]}, cyclic)
    for path, status, words in [(not_json, cli.EXIT_UNREADABLE, "not JSON"),
                                (deep, cli.EXIT_UNREADABLE, "nested too deeply")]:
        code, stderr = invoke("validate", path)
        assert code == status and words in stderr and str(path) in stderr and "Traceback" not in stderr
        assert "protobuf" not in stderr.lower()
    assert invoke("validate", cyclic)[0] == cli.EXIT_INVALID
    assert invoke("validate", cyclic, not_json)[0] == cli.EXIT_UNREADABLE
    code, stderr = invoke("dump", not_json)
    assert code == cli.EXIT_INPUT and "not JSON" in stderr and "truncated" not in stderr


def test_dump_of_a_json_named_as_a_chakra_trace_says_it_is_json(tmp_path):
    """A gzip ET given to ``dump`` under a ``.et.gz`` name: its first frame does not parse, and the
    one-line error says the file is JSON (its inflated head starts with ``{``)."""
    named_et = tmp_path / "trace.et.gz"
    named_et.write_bytes(Path(NESTED_ET).read_bytes())
    code, stderr = invoke("dump", named_et)
    assert code == cli.EXIT_INPUT and "this is JSON" in stderr and str(named_et) in stderr
    assert len(stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the command's surface


def test_help_version_and_missing_argument():
    result = CliRunner().invoke(cli.app, ["--help"])
    assert "<bool>" not in result.stdout and "Exit statuses" in result.stdout
    for code, _ in cli.EXIT_STATUS_TABLE:
        assert re.search(rf"^\s+{code}\s", result.stdout, re.M), code
    assert CliRunner().invoke(cli.app, ["--version"]).stdout.startswith("et-link ")
    code, stderr = invoke("--et-file", NESTED_ET)
    assert code == cli.EXIT_INPUT and len(stderr.strip().splitlines()) == 1 and "Options" not in stderr


def test_readme_exit_status_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Exit statuses", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `?(\d+)`? \| (.+?) \|$", section, re.M))
    assert sorted(int(code) for code in rows) == sorted(code for code, _ in cli.EXIT_STATUS_TABLE)


def test_cpu_only_summary_and_report_warnings_agree(dirs):
    inputs, outputs = dirs
    doc = load(NESTED_KINETO)
    del cpu_events(doc)[5]["dur"]
    kineto = save(doc, inputs / "kineto.json")
    report = outputs / "r.json"
    code, stderr = invoke("--et-file", NESTED_ET, "--kineto-file", kineto, "-o", outputs / "o.json",
                          "--report", report)
    assert code == 0
    assert "0/0" not in stderr and "CPU-only" in stderr
    printed = [line.split("WARNING: ", 1)[1] for line in stderr.splitlines() if "WARNING: " in line]
    assert printed == load(report)["warnings"] and printed


# --------------------------------------------------------------------------- batch


def _rank_set(directory: Path) -> Path:
    directory.mkdir()
    sources = [fixture_pair("cpu", "mlp_steps"), fixture_pair("cpu", "dataloader")]
    for rank, (et, kineto) in enumerate(sources):
        (directory / f"rank{rank}.et.json.gz").write_bytes(et.read_bytes())
        (directory / f"rank{rank}.kineto.json.gz").write_bytes(kineto.read_bytes())
    return directory


def test_batch_links_complete_ranks_when_asked(tmp_path):
    traces = _rank_set(tmp_path / "traces")
    (traces / "rank2.et.json.gz").write_bytes(NESTED_ET.read_bytes())  # no Kineto file for rank 2
    config = BatchConfig(str(traces / "rank*.et.json.gz"), str(traces / "rank*.kineto.json.gz"), tmp_path / "out",
                         workers=1)
    with pytest.raises(PairingError) as refused:
        run_batch(config, progress_stream=io.StringIO(), interactive=False)
    assert any("--skip-unpaired" in p for p in refused.value.problems)
    config.skip_unpaired = True
    summary = run_batch(config, progress_stream=io.StringIO(), interactive=False)
    assert [r.rank for r in summary.ranks if r.status == "linked"] == [0, 1]
    assert any("rank 2" in note for note in summary.notes)


def test_batch_counts_the_warnings_a_single_run_prints(tmp_path):
    traces = _rank_set(tmp_path / "traces")
    doc = load(NESTED_KINETO)
    cpu_events(doc)[3]["ts"] = -4
    (traces / "rank1.kineto.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    summary = run_batch(BatchConfig(str(traces / "rank*.et.json.gz"), str(traces / "rank*.kineto.json.gz"),
                                    tmp_path / "out", workers=1), progress_stream=io.StringIO(), interactive=False)
    single = tmp_path / "single"
    single.mkdir()
    _, stderr = invoke("--et-file", traces / "rank1.et.json.gz", "--kineto-file", traces / "rank1.kineto.json.gz",
                       "-o", single / "o.json")
    printed = [line for line in stderr.splitlines() if "WARNING" in line]
    rank1 = next(r for r in summary.ranks if r.rank == 1)
    assert printed and len(rank1.warnings) == len(printed)
    assert summary.totals.warnings >= len(printed)


def test_batch_refuses_a_read_only_output_directory(tmp_path):
    traces = _rank_set(tmp_path / "traces")
    with read_only_directory(tmp_path / "ro") as ro:
        code, stderr = invoke("batch", "--et", traces / "rank*.et.json.gz", "--kineto",
                              traces / "rank*.kineto.json.gz", "--output-dir", ro)
        assert code == cli.EXIT_INPUT and "not writable" in stderr and "Traceback" not in stderr


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_device_is_not_read_as_a_trace(dirs):
    _, outputs = dirs
    code, stderr = invoke("--et-file", "/dev/zero", "--kineto-file", NESTED_KINETO, "-o", outputs / "o.json")
    assert_clean_failure(code, stderr, cli.EXIT_INPUT, Path("/dev/zero"), outputs, {})
    assert invoke("validate", "/dev/zero")[0] == cli.EXIT_UNREADABLE


SLOW_BATCH = """
import sys, time
import linker.batch.local as local
real = local.run_rank_task
def slow(task):
    time.sleep(3)  # the interrupt lands while every worker is busy
    return real(task)
local.run_rank_task = slow
from linker.cli import main
sys.argv = ["et-link"] + sys.argv[1:]
main()
"""


@pytest.mark.parametrize("signum,status", [(2, cli.EXIT_INTERRUPTED), (15, cli.EXIT_TERMINATED)])
def test_batch_interrupted_stops_cleanly(tmp_path, signum, status):
    import signal
    import time

    traces = _rank_set(tmp_path / "traces")
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-c", SLOW_BATCH, "batch", "--et", str(traces / "rank*.et.json.gz"),
                                "--kineto", str(traces / "rank*.kineto.json.gz"), "--output-dir", str(out),
                                "--workers", "2", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not a background job's SIG_IGN
    try:
        deadline = time.monotonic() + 20
        while not out.is_dir() and time.monotonic() < deadline:  # the batch created it: workers start
            time.sleep(0.05)
        time.sleep(0.8)
        os.killpg(process.pid, signum)  # like Ctrl-C in a terminal: the whole process group
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == status, stderr
    assert "Traceback" not in stderr
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_options_without_effect_are_named_in_a_warning(dirs):
    _, outputs = dirs
    pair = ["--et-file", NESTED_ET, "--kineto-file", NESTED_KINETO, "-o", outputs / "o.json"]
    for extra, words in [(["--window", "0"], "--window 0 had no effect"),
                         (["--annotation", "## optimizer ##"], "--annotation '## optimizer ##' had no effect"),
                         (["--max-depth", "3"], "--max-depth 3 had no effect")]:
        code, stderr = invoke(*pair, *extra)  # auto: the rf_ids validate, so windows do not apply
        assert code == 0 and words in stderr, stderr
    code, stderr = invoke(*pair, "--window", "0", "--exact-match")
    assert code == 0 and "had no effect" not in stderr and "(user," in stderr

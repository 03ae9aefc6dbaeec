"""The ``et-link simulate`` command: inputs, options, outputs and user errors."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import orjson
import pytest
from typer.testing import CliRunner

from linker.cli import app
from sim_graphs import coll, cpu, write_et


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def simulate(*args) -> Outcome:
    """Run ``et-link simulate`` in this process (the command's own exit code and streams)."""
    result = CliRunner().invoke(app, ["simulate", *map(str, args)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def test_the_installed_command_runs_as_a_process(tmp_path):
    path = write_et(tmp_path / "g.et", [cpu(1, 10, start=5), cpu(2, 5, [1], start=15)])
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "simulate", str(path), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout)["simulated_us"] == 15
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "simulate", str(tmp_path / "absent.et")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def one_line_error(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture
def job_dir(tmp_path):
    """Three ranks; pg 1 = ranks 0 and 1; rank 2 has no collective."""
    directory = tmp_path / "job"
    directory.mkdir()
    write_et(directory / "rank0_plus.et", [cpu(1, 10, start=100), coll(2, 8, [1], pg="1", start=110)])
    write_et(directory / "rank1_plus.et", [cpu(1, 20, start=200), coll(2, 4, [1], pg="1", start=220)])
    write_et(directory / "rank2_plus.et", [cpu(1, 3, start=300)])
    (directory / "rank0.report.json").write_text("{}")  # batch side files are ignored
    return directory


def test_directory_with_comm_groups_beside_replays_the_job(job_dir):
    (job_dir / "comm_groups.json").write_text('{"1": [0, 1]}')
    proc = simulate(job_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2]
    assert report["simulated_us"] == 24 and report["finished"]  # 20 + min(8, 4)
    assert report["measured_us"] == 24 and report["slowest_rank"] == 1  # rank 1: 200..224
    assert any("comm_groups.json" in note for note in report["notes"])


def test_without_comm_groups_the_job_stalls_and_exits_9(job_dir):
    proc = simulate(job_dir)
    assert proc.returncode == 9
    assert "stall: ALL_REDUCE #0 on process group 1: reached by ranks [0, 1]" in proc.stdout
    assert "rank 2 never reaches it" in proc.stdout


def test_comm_groups_option(job_dir, tmp_path):
    groups = tmp_path / "groups.json"
    groups.write_text('{"1": [0, 1]}')
    assert simulate(job_dir, "--comm-groups", groups).returncode == 0
    groups.write_text('{"1": "all"}')
    assert "process group '1'" in one_line_error(simulate(job_dir, "--comm-groups", groups))
    assert "no such file" in one_line_error(simulate(job_dir, "--comm-groups", tmp_path / "none.json"))


def test_files_given_one_by_one_take_their_rank_from_the_name(job_dir):
    proc = simulate(job_dir / "rank1_plus.et", job_dir / "rank0_plus.et", "--json")
    report = orjson.loads(proc.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["finished"]


def test_scale_and_model_options(job_dir):
    base = orjson.loads(simulate(job_dir / "rank0_plus.et", "--json").stdout)
    assert base["simulated_us"] == 18 and base["model"] == "astra-sim"
    scaled = orjson.loads(simulate(job_dir / "rank0_plus.et", "--json", "--scale", "cpu=2,comm=0.5").stdout)
    assert scaled["simulated_us"] == 24 and scaled["scale"] == {"cpu": 2.0, "gpu": 1.0, "comm": 0.5}
    lanes = orjson.loads(simulate(job_dir / "rank0_plus.et", "--json", "--model", "lanes").stdout)
    assert lanes["model"] == "lanes" and lanes["simulated_us"] == 18


@pytest.mark.parametrize("args, problem", [
    (["--model", "ns3"], "unknown --model"),
    (["--scale", "cpu=fast"], "bad --scale factor"),
    (["--scale", "disk=2"], "bad --scale item"),
])
def test_bad_options_are_one_line_errors(job_dir, args, problem):
    assert problem in one_line_error(simulate(job_dir / "rank0_plus.et", *args))


def test_bad_files_are_one_line_errors_naming_the_file(tmp_path):
    empty = tmp_path / "empty.et"
    empty.write_bytes(b"")
    truncated = tmp_path / "cut.et"
    whole = write_et(tmp_path / "whole.et", [cpu(1, 10), cpu(2, 5, [1])]).read_bytes()
    truncated.write_bytes(whole[:-3])
    not_json = tmp_path / "broken_plus.json"
    not_json.write_text('{"nodes": [{"id": 1, ')
    duplicated = write_et(tmp_path / "dup.et", [cpu(1, 10), cpu(1, 5)])
    import gzip
    cut_gzip = tmp_path / "cut.et.gz"  # its first 20 bytes: the header and a few bytes of deflate
    cut_gzip.write_bytes(gzip.compress(whole)[:20])
    empty_gzip = tmp_path / "empty.et.gz"
    empty_gzip.write_bytes(gzip.compress(b""))
    for path, problem in ((empty, "empty"), (truncated, "truncated"), (not_json, "not an ET+ JSON"),
                          (duplicated, "appears twice"), (tmp_path / "absent.et", "no such file"),
                          (tmp_path / "nothing", "no .et"), (cut_gzip, "gzip data ends early"),
                          (empty_gzip, "empty")):
        (tmp_path / "nothing").mkdir(exist_ok=True)
        line = one_line_error(simulate(path))
        assert str(path) in line and problem in line


def test_same_rank_twice_is_refused(tmp_path):
    a = write_et(tmp_path / "rank0.et", [cpu(1, 1)])
    (tmp_path / "b").mkdir()
    b = write_et(tmp_path / "b" / "rank0.et", [cpu(1, 1)])
    assert "rank 0" in one_line_error(simulate(a, b))


def test_trace_out_never_overwrites_an_input_and_is_not_written_on_error(tmp_path):
    good = write_et(tmp_path / "rank0.et", [cpu(1, 10)])
    before = good.read_bytes()
    assert "input" in one_line_error(simulate(good, "--trace-out", good))
    assert good.read_bytes() == before
    out = tmp_path / "trace.json"
    one_line_error(simulate(tmp_path / "absent.et", "--trace-out", out))
    assert not out.exists()
    assert simulate(good, "--trace-out", out).returncode == 0
    assert orjson.loads(out.read_bytes())["traceEvents"]


def test_stuck_single_graph_exits_9_with_the_report(tmp_path):
    path = write_et(tmp_path / "g.et", [cpu(1, 1, [2]), cpu(2, 1, [1]), cpu(3, 4)])
    proc = simulate(path, "--json")
    assert proc.returncode == 9
    report = orjson.loads(proc.stdout)
    assert report["never_issued"] == 2 and report["simulated_us"] == 4


def test_simulate_refuses_an_et_without_times_in_one_line(tmp_path):
    """An ET (not linked) has no measured times to compare with: exit 2 and what to do, not a
    replay that says 'ratio n/a' and exits 0."""
    import gzip
    import subprocess
    import sys

    from conftest import fixture_pair

    et, _ = fixture_pair("cpu", "mlp_steps")
    plain = tmp_path / "et.json"
    plain.write_bytes(gzip.decompress(et.read_bytes()))
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "simulate", str(plain)], capture_output=True, text=True)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("et-link: error")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert str(plain) in lines[0] and "without times" in lines[0] and "link it first" in lines[0]


def test_no_arguments_name_every_subcommand_and_the_version_is_this_release():
    import subprocess
    import sys

    import linker
    from linker.cli import app

    proc = subprocess.run([sys.executable, "-m", "linker.cli"], capture_output=True, text=True)
    assert proc.returncode == 2
    for command in app.registered_commands:
        assert command.name in proc.stderr
    assert "astra-setup" in proc.stderr
    version = subprocess.run([sys.executable, "-m", "linker.cli", "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == f"et-link {linker.__version__}" and linker.__version__ != "0.2.0"
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(linker.__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert project["version"] == linker.__version__  # one version: the package's and the command's


def test_another_converters_et_that_cannot_finish_says_what_it_is(tmp_path):
    """The Chakra converter's ``.et`` (no start times, dependencies on absent ids): the replay
    cannot finish (exit 9), and the report says the file is not et-link's and how to check it."""
    import gzip
    import subprocess
    import sys

    from conftest import shared_trace

    source = shared_trace("chakra_protobuf", "chakra.0.et.gz")
    plain = tmp_path / "chakra.0.et"
    plain.write_bytes(gzip.decompress(source.read_bytes()))
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "simulate", str(plain)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert "not written by et-link" in proc.stdout and f"et-link validate {plain}" in proc.stdout

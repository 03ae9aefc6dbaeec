"""``et-link astra-run``: the setup of ``batch --format et`` / ``astra-setup`` run with a stub ASTRA-sim.

The stub is a shell script that checks the arguments the setup's ``run`` passes (every workload
file is there) and prints ASTRA-sim's lines (``Workload::report``'s "sys[i] finished, T cycles,
exposed communication E cycles.", the statistics pass's "[critical] warning!" lines, "Exiting")
with cycle counts the test chooses. The expected figures are computed here from those counts and
from the batch's own ``summary.json`` (or ``et-link simulate --json`` for a single pair). The real
binary is checked by ``scripts/astra_check.py`` (docs/astra-sim.md), never here.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from linker.cli import app
from linker.model.exit_status import EXIT_ASTRA_FAILED, EXIT_INPUT

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DDP = FIXTURES / "ddp_gloo"  # a real 4-rank gloo job (committed)
MLP = FIXTURES / "cpu" / "mlp_steps"
PREFIX = "[2025-01-01T00:00:00+0000]"
# cycles (ns) each NPU "finishes" at: rank 2 last
CYCLES = [161_000_123, 160_500_000, 161_739_400, 159_000_007]


def write_stub(path: Path, cycles: list[int], status: int = 0, finished: bool = True) -> Path:
    """An ASTRA-sim stand-in printing ``cycles`` as its NPUs' ends (``finished``), then exiting ``status``."""
    lines = [f'echo "{PREFIX} [system] [info] system setup done"']
    if finished:
        lines += [f'echo "{PREFIX} [workload] [info] sys[{npu}] finished, {c} cycles, exposed communication '
                  f'{c // 3} cycles."' for npu, c in enumerate(cycles)]
    lines += [f'echo "{PREFIX} [statistics] [critical] warning! a callable is removed before call"'] * len(cycles)
    lines += [f'echo "{PREFIX} [statistics] [critical] Only GPU and COMM types are supported for overlap extraction"']
    if status:
        lines += [f'echo "{PREFIX} [workload] [critical] Invalid node_type, node.id=7, node.type=1" >&2',
                  'echo "AstraSim: Statistics.cc:72: Assertion \\`false\' failed." >&2']
    else:
        lines += [f'echo "{PREFIX} [system] [warning] Exiting"']
    path.write_text(f"""#!/bin/sh
for a in "$@"; do case "$a" in --workload-configuration=*) w="${{a#*=}}";; esac; done
npu=0
while [ $npu -lt {len(cycles)} ]; do
  [ -f "$w.$npu.et" ] || {{ echo "no workload $w.$npu.et" >&2; exit 3; }}
  npu=$((npu + 1))
done
""" + "\n".join(lines) + f"\nexit {status}\n")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """One batch --format et output of the committed 4-rank job, shared by this module's tests."""
    from linker.batch import BatchConfig, run_batch

    out = tmp_path_factory.mktemp("astra_run") / "linked"
    run_batch(BatchConfig(str(DDP / "host.*.json.gz"), str(DDP / "device.*.json.gz"), out, fmt="et"),
              progress_stream=io.StringIO(), interactive=False)
    assert (out / "astra" / "run").is_file()
    return out


def invoke(*args, env=None):
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}")
    return result


def expected_from_summary(out: Path, cycles: list[int]) -> tuple[list[dict], float]:
    summary = json.loads((out / "summary.json").read_text())
    offsets = summary["simulator"]["rank_start"]["offsets_us"]
    rows = []
    for rank in summary["ranks"]:
        start, end = rank["measured_span"]
        astra = cycles[rank["rank"]] / 1000 - offsets[str(rank["rank"])]
        rows.append({"rank": rank["rank"], "measured": end - start, "astra": astra, "ratio": astra / (end - start)})
    span = max(r["measured_span"][1] for r in summary["ranks"]) - min(r["measured_span"][0] for r in summary["ranks"])
    return sorted(rows, key=lambda r: r["rank"]), span


def test_job_ratios_per_rank_and_job_from_summary_json(job, tmp_path):
    stub = write_stub(tmp_path / "astra", CYCLES)
    result = invoke("astra-run", job, "--bin", stub, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows, span = expected_from_summary(job, CYCLES)
    assert report["measured_from"] == "summary.json" and report["rank_start"] == "measured"
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    assert any(r["start_us"] > 0 for r in report["ranks"])  # the job's ranks start at their offsets
    for got, want, cycles in zip(report["ranks"], rows, CYCLES):
        assert got["finished_cycles"] == cycles and got["exposed_communication_cycles"] == cycles // 3
        assert got["measured_us"] == pytest.approx(want["measured"], abs=1e-9)
        assert got["astra_sim_us"] == pytest.approx(want["astra"], abs=1e-9)
        assert got["ratio"] == pytest.approx(want["ratio"], rel=1e-12)
    assert report["job"]["measured_us"] == pytest.approx(span, abs=1e-9)
    assert report["job"]["astra_sim_us"] == pytest.approx(161_739.4, abs=1e-9)  # the largest sys[i] finished
    assert report["job"]["ratio"] == pytest.approx(161_739.4 / span, rel=1e-12)
    log = job / "astra" / "astra-run.log"
    assert report["log"] == str(log) and log.read_text().count("sys[") == 4


def test_a_setup_of_some_ranks_names_each_npu_by_its_rank(tmp_path):
    """Ranks 1 and 3 of the 4-rank job: ASTRA-sim's NPUs 0 and 1 (npu_ranks.json); each row is the
    rank, set against that rank's measured span and start offset in summary.json, with its NPU's
    cycles."""
    from linker.batch import BatchConfig, run_batch

    out = tmp_path / "linked"
    run_batch(BatchConfig(str(DDP / "host.[13].json.gz"), str(DDP / "device.[13].json.gz"), out, fmt="et",
                          workers=1), progress_stream=io.StringIO(), interactive=False)
    assert json.loads((out / "astra" / "npu_ranks.json").read_text()) == [1, 3]
    cycles = CYCLES[:2]
    result = invoke("astra-run", out, "--bin", write_stub(tmp_path / "astra", cycles), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    summary = json.loads((out / "summary.json").read_text())
    offsets = summary["simulator"]["rank_start"]["offsets_us"]
    spans = {row["rank"]: row["measured_span"] for row in summary["ranks"]}
    assert [r["rank"] for r in report["ranks"]] == [1, 3] and report["measured_from"] == "summary.json"
    for got, rank, npu_cycles in zip(report["ranks"], (1, 3), cycles):
        assert got["finished_cycles"] == npu_cycles and got["start_us"] == offsets[str(rank)]
        assert got["measured_us"] == pytest.approx(spans[rank][1] - spans[rank][0], abs=1e-9)
        assert got["astra_sim_us"] == pytest.approx(npu_cycles / 1000 - offsets[str(rank)], abs=1e-9)


def test_job_text_condenses_astra_sims_lines(job, tmp_path, monkeypatch):
    stub = write_stub(tmp_path / "astra", CYCLES)
    result = invoke("astra-run", job / "astra", env={"ASTRA_SIM_BIN": str(stub)})  # the binary from the env
    assert result.exit_code == 0, result.output
    text = result.stdout
    rows, span = expected_from_summary(job, CYCLES)
    for want in rows:
        line = next(line for line in text.splitlines() if line.split()[:1] == [str(want["rank"])])
        assert f"{want['measured']:,.1f}" in line and f"{want['astra']:,.1f}" in line and f"{want['ratio']:.4f}" in line
    assert (f"job: measured job span (earliest start to latest end) {span:,.1f} us, ASTRA-sim 161,739.4 us"
            in text and f"ratio {161_739.4 / span:.4f}" in text)
    assert text.count("warning! a callable") == 1 and '4 x "[critical] warning! a callable' in text
    assert "exposed communication" not in text and "cycles are ns" in text
    assert len(text.splitlines()) < 14  # ASTRA-sim's lines are not repeated


def test_single_pair_one_row_against_simulates_measured_step(tmp_path):
    target = tmp_path / "mlp.et"
    assert invoke("--et-file", MLP / "et.json.gz", "--kineto-file", MLP / "kineto.json.gz", "-o", target, "-q").exit_code == 0
    assert invoke("astra-setup", target).exit_code == 0
    measured = json.loads(invoke("simulate", target, "--json", "-q").stdout)["ranks"][0]["measured_us"]
    stub = write_stub(tmp_path / "astra-sim", [2_000_500, 2_000_500])
    result = invoke("astra-run", tmp_path, "--bin", stub, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["single_rank"] and report["measured_from"] == "the workload files" and len(report["ranks"]) == 1
    row = report["ranks"][0]
    assert row["start_us"] == 0 and row["measured_us"] == pytest.approx(measured, abs=1e-6)
    assert row["ratio"] == pytest.approx(2000.5 / measured, rel=1e-12)
    assert report["job"]["ratio"] == pytest.approx(2000.5 / measured, rel=1e-12)


@pytest.mark.parametrize("pair,told", [(FIXTURES / "cpu" / "threads", True), (MLP, False)], ids=["threads", "mlp"])
def test_a_long_run_is_told_when_the_model_ran_threads_one_at_a_time(tmp_path, pair, told):
    """ASTRA-sim (the stub) ends each at twice the measured step. On the threads fixture, whose
    threads ran at once, ``et-link simulate`` of the same files waits on its critical path for the
    one CPU unit while another thread's op holds it, and astra-run says so; on mlp_steps (one
    thread) nothing of the kind is said."""
    target = tmp_path / "pair.et"
    assert invoke("--et-file", pair / "et.json.gz", "--kineto-file", pair / "kineto.json.gz", "-o", target,
                  "-q").exit_code == 0
    assert invoke("astra-setup", target).exit_code == 0
    measured = json.loads(invoke("simulate", target, "--json", "-q").stdout)["ranks"][0]["measured_us"]
    cycles = int(measured * 2 * 1000)
    result = invoke("astra-run", tmp_path, "--bin", write_stub(tmp_path / "astra-sim", [cycles, cycles]), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["job"]["ratio"] == pytest.approx(2.0, rel=1e-6)
    notes = [note for note in report["notes"] if "--model lanes" in note]
    if told:
        assert len(notes) == 1 and "CPU ops waited" in notes[0] and "et-link simulate of these files" in notes[0]
    else:
        assert notes == []


def _one_line_error(result, status: int, *words) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == status, result.output
    assert len(lines) == 1 and lines[0].startswith("et-link: error: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert str(word) in lines[0], lines[0]
    return lines[0]


def test_failures_are_one_line_with_a_status(job, tmp_path):
    missing = tmp_path / "nowhere" / "AstraSim"
    _one_line_error(invoke("astra-run", job, "--bin", missing), EXIT_INPUT, missing, "does not exist")
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    _one_line_error(invoke("astra-run", job, "--bin", plain), EXIT_INPUT, plain, "not an executable")
    _one_line_error(invoke("astra-run", job, "--bin", tmp_path), EXIT_INPUT, tmp_path, "not an executable")
    _one_line_error(invoke("astra-run", job, env={"ASTRA_SIM_BIN": None}), EXIT_INPUT, "--bin", "ASTRA_SIM_BIN")
    stub = write_stub(tmp_path / "astra", CYCLES)
    _one_line_error(invoke("astra-run", tmp_path, "--bin", stub), EXIT_INPUT, tmp_path, "no ASTRA-sim setup")
    crash = write_stub(tmp_path / "crash", CYCLES, status=134, finished=False)
    line = _one_line_error(invoke("astra-run", job, "--bin", crash), EXIT_ASTRA_FAILED, crash, "status 134",
                           "Assertion", "astra-run.log")
    assert "Invalid node_type" not in line  # the last words, not the whole log
    silent = write_stub(tmp_path / "silent", CYCLES, finished=False)
    _one_line_error(invoke("astra-run", job, "--bin", silent), EXIT_ASTRA_FAILED, silent, "sys[i] finished")
    too_few = write_stub(tmp_path / "few", CYCLES + [1])  # asks for a 5th workload the setup lacks
    _one_line_error(invoke("astra-run", job, "--bin", too_few), EXIT_ASTRA_FAILED, too_few, "status 3",
                    "workload.4.et")


def test_the_command_itself_and_its_listing(job, tmp_path):
    stub = write_stub(tmp_path / "crash", CYCLES, status=1, finished=False)
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "astra-run", str(job), "--bin", str(stub)],
                          capture_output=True, text=True)
    assert proc.returncode == EXIT_ASTRA_FAILED and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and str(stub) in proc.stderr
    listing = subprocess.run([sys.executable, "-m", "linker.cli"], capture_output=True, text=True)
    assert "astra-run" in listing.stderr


def test_astra_check_script_reads_through_the_same_code(job, tmp_path):
    from linker.batch import astra_run

    spec = importlib.util.spec_from_file_location("astra_check", ROOT / "scripts" / "astra_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    stub = write_stub(tmp_path / "astra", CYCLES)
    finished, others, output = script.run_astra(job / "astra" / "run", str(stub))
    assert finished == {npu: c / 1000 for npu, c in enumerate(CYCLES)}
    assert "statistics pass" in others
    assert astra_run.compare(job / "astra", output).astra_job_us == pytest.approx(161_739.4)


def test_output_parsing():
    from linker.batch.astra_run import noise_summary, parse_output

    text = (f"{PREFIX} [workload] [info] sys[1] finished, 50 cycles, exposed communication 7 cycles.\n"
            f"{PREFIX} [workload] [info] sys[0] iteration 1 finished, 40 cycles, exposed communication 0 cycles.\n"
            f"{PREFIX} [workload] [info] sys[0] iteration 2 finished, 90 cycles, exposed communication 2 cycles.\n"
            f"{PREFIX} [statistics] [critical] warning! a callable is removed before call\n"
            f"{PREFIX} [network] [warning] something else\n{PREFIX} [network] [warning] something else\n")
    assert parse_output(text) == ({1: 50, 0: 90}, {1: 7, 0: 2})
    assert noise_summary(text) == ['1 x "[critical] warning! a callable is removed before call" (statistics pass)',
                                   '2 x "something else"']

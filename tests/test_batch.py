"""``et-link batch``: pairing by rank, local and Dask execution, skipping complete ranks, summary."""

from __future__ import annotations

import gzip
import importlib.util
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from linker import batch
from linker.batch import local
from linker.batch import (
    BatchConfig,
    BatchSetupError,
    RankResult,
    find_outliers,
    format_ranks,
    kineto_rank,
    pair_rank_files,
    parse_bytes,
    pick_next_task,
    rank_from_name,
    read_distributed_info,
    run_batch,
    uncompressed_size,
)
from linker.cli import app
from linker.link.recipe import LinkOptions
from linker.pipeline import link_pair
from linker.sim.file_waits import add_file_waits
from linker.batch.progress import BatchProgress
from conftest import shared_reason

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cpu"
SHARED = Path(__file__).resolve().parents[2] / "shared"
DLRM = SHARED / "traces" / "param_dlrm"
FIXTURE_PAIRS = ("mlp_steps", "threads", "dataloader", "main_thread_only")


def fixture_dirs() -> list[Path]:
    dirs = [FIXTURES / name for name in FIXTURE_PAIRS]
    if not all((d / "et.json.gz").is_file() and (d / "kineto.json.gz").is_file() for d in dirs):
        pytest.skip("CPU fixtures tests/fixtures/cpu are not available")
    return dirs


def make_rank_set(directory: Path, count: int = 4) -> Path:
    """Copy ``count`` fixture pairs to ``directory`` as rank<N>.et.json.gz / rank<N>.kineto.json.gz."""
    directory.mkdir(parents=True, exist_ok=True)
    for rank, source in enumerate(fixture_dirs()[:count]):
        shutil.copyfile(source / "et.json.gz", directory / f"rank{rank}.et.json.gz")
        shutil.copyfile(source / "kineto.json.gz", directory / f"rank{rank}.kineto.json.gz")
    return directory


def config_for(traces: Path, out: Path, **kw) -> BatchConfig:
    return BatchConfig(et_glob=str(traces / "rank*.et.json.gz"), kineto_glob=str(traces / "rank*.kineto.json.gz"),
                       output_dir=out, workers=kw.pop("workers", 2), **kw)


def quiet_run(config: BatchConfig):
    return run_batch(config, progress_stream=io.StringIO(), interactive=False)


def write_kineto_with_info(source: Path, target: Path, info: dict, at_end: bool = False) -> None:
    """A real Kineto trace with a ``distributedInfo`` key first (as Kineto writes it) or last."""
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    doc.pop("distributedInfo", None)
    doc = (doc | {"distributedInfo": info}) if at_end else ({"schemaVersion": 1, "distributedInfo": info} | doc)
    target.write_bytes(gzip.compress(orjson.dumps(doc)))


# --- ranks from names and content ---------------------------------------------------------------


@pytest.mark.parametrize("name, rank", [
    ("rank3.et.json.gz", 3),
    ("RANK_12.kineto.json", 12),
    ("worker3_1700000000123.pt.trace.json.gz", 3),
    ("dlrm_eg_3.json", 3),
    ("kineto_3.json.gz", 3),
    ("trace-7.json", 7),
    ("host5.json", 5),
])
def test_rank_from_name(name, rank):
    found = rank_from_name(Path("/jobs/run") / name)
    assert (found.rank, found.problem) == (rank, None)


def test_rank_from_directory_name():
    assert rank_from_name(Path("/jobs/rank4/et.json.gz")).rank == 4


@pytest.mark.parametrize("name", ["host_12.1700000000.pt.trace.json", "rank3_rank4.json", "et.json.gz"])
def test_ambiguous_or_missing_rank_is_a_problem(name):
    found = rank_from_name(Path("/jobs/run") / name)
    assert found.rank is None and found.problem


def test_rank_pattern_overrides_names():
    pattern = re.compile(r"node(\d+)")
    assert rank_from_name(Path("/x/node12-rank3.json"), pattern).rank == 12
    named = re.compile(r"n(?P<rank>\d+)_")
    assert rank_from_name(Path("/x/n5_1.json"), named).rank == 5
    assert rank_from_name(Path("/x/other.json"), pattern).problem
    with pytest.raises(BatchSetupError):
        pair_rank_files([Path("/x/a1")], [Path("/x/b1")], r"\d+")


def test_distributed_info_read_from_header(tmp_path):
    source = fixture_dirs()[0] / "kineto.json.gz"
    write_kineto_with_info(source, tmp_path / "k.json.gz", {"backend": "gloo", "rank": 6, "world_size": 8})
    info = read_distributed_info(tmp_path / "k.json.gz")
    assert (info.rank, info.world_size) == (6, 8)
    plain = tmp_path / "k.json"
    plain.write_bytes(gzip.decompress((tmp_path / "k.json.gz").read_bytes()))
    assert read_distributed_info(plain).rank == 6
    assert read_distributed_info(source) is None  # no distributedInfo at all


def test_distributed_info_only_in_header_and_never_raises(tmp_path):
    write_kineto_with_info(fixture_dirs()[0] / "kineto.json.gz", tmp_path / "late.json.gz", {"rank": 2}, at_end=True)
    assert read_distributed_info(tmp_path / "late.json.gz") is None  # after traceEvents: not read
    (tmp_path / "junk.json.gz").write_bytes(b"\x1f\x8b\x08garbage")
    assert read_distributed_info(tmp_path / "junk.json.gz") is None
    assert read_distributed_info(tmp_path / "missing.json") is None


def test_kineto_rank_prefers_content_and_flags_contradicting_name(tmp_path):
    source = fixture_dirs()[0] / "kineto.json.gz"
    write_kineto_with_info(source, tmp_path / "host_1.2.pt.trace.json.gz", {"rank": 5, "world_size": 8})
    found = kineto_rank(tmp_path / "host_1.2.pt.trace.json.gz")
    assert (found.rank, found.source, found.world_size) == (5, "distributedInfo", 8)
    write_kineto_with_info(source, tmp_path / "rank3.kineto.json.gz", {"rank": 5})
    conflict = kineto_rank(tmp_path / "rank3.kineto.json.gz")
    assert conflict.rank is None and "rank 5" in conflict.problem and "rank 3" in conflict.problem


# --- pairing ------------------------------------------------------------------------------------


def test_pairing_lists_every_problem():
    ets = [Path(f"/j/rank{r}.et.json") for r in (0, 1, 2)] + [Path("/j/copy_rank1.et.json"), Path("/j/et.json")]
    kinetos = [Path(f"/j/rank{r}.kineto.json") for r in (0, 1, 3)]
    pairing = pair_rank_files(ets, kinetos)
    text = "\n".join(pairing.problems)
    assert [p.rank for p in pairing.pairs] == [0]
    assert "rank 1: 2 ET files" in text
    assert "rank 2: ET file /j/rank2.et.json has no Kineto file" in text
    assert "rank 3: Kineto file /j/rank3.kineto.json has no ET file" in text
    assert "/j/et.json" in text
    assert len(pairing.problems) == 4


def test_pairing_by_distributed_info_and_world_size(tmp_path):
    dirs = fixture_dirs()[:2]
    for rank, d in enumerate(dirs):
        shutil.copyfile(d / "et.json.gz", tmp_path / f"rank{rank}.et.json.gz")
        write_kineto_with_info(d / "kineto.json.gz", tmp_path / f"host_{rank + 10}.{rank + 20}.pt.trace.json.gz",
                               {"rank": rank, "world_size": 4})
    pairing = pair_rank_files(sorted(tmp_path.glob("rank*")), sorted(tmp_path.glob("host_*")))
    assert not pairing.problems
    assert [(p.rank, p.kineto.name, p.rank_source) for p in pairing.pairs] == [
        (0, "host_10.20.pt.trace.json.gz", "distributedInfo"), (1, "host_11.21.pt.trace.json.gz", "distributedInfo")]
    assert pairing.world_size == 4 and "ranks 2-3" in pairing.notes[0]


def test_cli_pairing_problems_stop_before_any_work(tmp_path):
    traces = make_rank_set(tmp_path / "t", 2)
    (traces / "rank1.kineto.json.gz").rename(traces / "rank7.kineto.json.gz")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["batch", "--et", str(traces / "rank*.et.json.gz"),
                                      "--kineto", str(traces / "rank*.kineto.json.gz"), "--output-dir", str(out)])
    assert result.exit_code == 2
    assert "rank 1: ET file" in result.output and "rank 7: Kineto file" in result.output
    assert not out.exists()


def test_no_matching_files_is_one_line_error(tmp_path):
    with pytest.raises(BatchSetupError, match="no file matches --et"):
        run_batch(config_for(tmp_path, tmp_path / "out"))


# --- running ------------------------------------------------------------------------------------


def test_batch_outputs_equal_single_pair_runs_and_rerun_skips(tmp_path):
    traces = make_rank_set(tmp_path / "t", 4)
    out = tmp_path / "out"
    summary = quiet_run(config_for(traces, out))
    assert [r.status for r in summary.ranks] == ["linked"] * 4
    for rank in range(4):
        single = link_pair(traces / f"rank{rank}.et.json.gz", traces / f"rank{rank}.kineto.json.gz",
                           tmp_path / f"single{rank}.json")
        assert (out / f"rank{rank}_plus.json").read_bytes() == single.output.read_bytes()
        row = summary.ranks[rank]
        assert (row.method, row.linked_pct, row.et_ops) == (single.report.method, single.report.linked_pct,
                                                             single.report.et_ops)
        assert row.peak_rss_bytes > 1 << 20 and row.wall_seconds > 0
        sidecar = orjson.loads((out / f"rank{rank}.report.json").read_bytes())
        assert sidecar["linked_ops"] == single.report.linked_ops
        assert sidecar["batch"]["output"]["bytes"] == (out / f"rank{rank}_plus.json").stat().st_size
    on_disk = orjson.loads((out / "summary.json").read_bytes())
    assert [r["rank"] for r in on_disk["ranks"]] == [0, 1, 2, 3]
    assert on_disk["totals"]["linked"] == 4 and on_disk["totals"]["et_ops"] == sum(r.et_ops for r in summary.ranks)

    mtimes = [(out / f"rank{r}_plus.json").stat().st_mtime_ns for r in range(4)]
    again = quiet_run(config_for(traces, out))
    assert [r.status for r in again.ranks] == ["skipped"] * 4
    assert [r.linked_pct for r in again.ranks] == [r.linked_pct for r in summary.ranks]
    assert [(out / f"rank{r}_plus.json").stat().st_mtime_ns for r in range(4)] == mtimes

    os.utime(traces / "rank2.kineto.json.gz", ns=(time.time_ns(), time.time_ns() + 10**9))
    changed = quiet_run(config_for(traces, out, verify_existing=True))
    assert [r.status for r in changed.ranks] == ["skipped", "skipped", "linked", "skipped"]
    other_options = quiet_run(config_for(traces, out, options=LinkOptions(method="exact")))
    assert {r.status for r in other_options.ranks} == {"linked"}
    redone = quiet_run(config_for(traces, out, options=LinkOptions(method="exact"), redo=True))
    assert {r.status for r in redone.ranks} == {"linked"}


def test_corrupt_rank_fails_alone_and_rerun_does_only_it(tmp_path):
    traces = make_rank_set(tmp_path / "t", 4)
    corrupt = traces / "rank1.kineto.json.gz"
    corrupt.write_bytes(corrupt.read_bytes()[:3000])
    out = tmp_path / "out"
    args = ["batch", "--et", str(traces / "rank*.et.json.gz"), "--kineto", str(traces / "rank*.kineto.json.gz"),
            "--output-dir", str(out), "--workers", "2"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == batch.EXIT_RANKS_FAILED, first.output
    assert "rank 1" in first.output and "rank1.kineto.json.gz" in first.output and "truncated" in first.output
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert [r["status"] for r in summary["ranks"]] == ["linked", "failed", "linked", "linked"]
    assert "rank1.kineto.json.gz" in summary["ranks"][1]["error"] and "truncated" in summary["ranks"][1]["error"]
    assert not (out / "rank1_plus.json").exists() and not (out / "rank1.report.json").exists()

    second = CliRunner().invoke(app, args)
    assert second.exit_code == batch.EXIT_RANKS_FAILED
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert [r["status"] for r in summary["ranks"]] == ["skipped", "failed", "skipped", "skipped"]
    assert summary["totals"]["linked"] == 0 and summary["totals"]["failed"] == 1


def test_gzip_output_and_table(tmp_path):
    traces = make_rank_set(tmp_path / "t", 2)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["batch", "--et", str(traces / "rank*.et.json.gz"), "--kineto",
                                      str(traces / "rank*.kineto.json.gz"), "--output-dir", str(out), "--gzip", "-q"])
    assert result.exit_code == 0, result.output
    single = link_pair(traces / "rank0.et.json.gz", traces / "rank0.kineto.json.gz", tmp_path / "s.json")
    assert gzip.decompress((out / "rank0_plus.json.gz").read_bytes()) == single.output.read_bytes()
    lines = result.output.splitlines()
    assert lines[0].split() == ["rank", "status", "method", "linked%", "gpu%", "warn", "wall", "s", "peak", "MB"]
    assert lines[2].split()[:2] == ["0", "linked"] and lines[3].split()[:2] == ["1", "linked"]
    assert any(line.startswith("total: 2 ranks (2 linked") for line in lines)


def test_format_et_uses_chakra_writer_or_says_it_is_missing(tmp_path):
    traces = make_rank_set(tmp_path / "t", 1)
    config = config_for(traces, tmp_path / "out", fmt="et")
    if importlib.util.find_spec("linker.write.chakra") is None:
        with pytest.raises(BatchSetupError, match="--format et"):
            quiet_run(config)
        return
    from linker.write.validate import validate_file

    summary = quiet_run(config)
    assert summary.ranks[0].status == "linked" and summary.ranks[0].output.endswith("rank.0.et")
    assert validate_file(summary.ranks[0].output).ok


def _make_task(rank: int, estimate: int) -> batch.RankTask:
    return batch.RankTask(rank, Path("e"), Path("k"), Path("o"), Path("r"), LinkOptions(), 0, estimate)


def test_memory_admission():
    tasks = [_make_task(0, 600), _make_task(1, 300), _make_task(2, 100)]
    assert pick_next_task(tasks, 0, 1000, 0) == 0
    assert pick_next_task(tasks, 600, 1000, 1) == 1  # 600 + 300 fits, the next large does not
    assert pick_next_task(tasks, 950, 1000, 1) is None
    assert pick_next_task(tasks, 5000, 1000, 0) == 0  # nothing running: the batch never stalls
    assert pick_next_task(tasks, 10**12, None, 3) == 0


class CountingProgress(BatchProgress):
    def __init__(self):
        super().__init__(0, 1, io.StringIO(), interactive=False)
        self.most_running = 0

    def started(self, rank):
        super().started(rank)
        self.most_running = max(self.most_running, self.counts.running)


def test_local_runner_respects_memory_budget_and_records_crashes(tmp_path, monkeypatch):
    traces = make_rank_set(tmp_path / "t", 3)
    plan = batch.plan_batch(config_for(traces, tmp_path / "out"))
    progress = CountingProgress()
    results = batch.run_local(plan.to_run, workers=3, memory_budget=1, progress=progress)
    assert progress.most_running == 1 and all(r.status == "linked" for r in results)

    if local._process_context().get_start_method() != "fork":
        pytest.skip("worker crash is simulated through fork")
    real = batch.run_rank_task

    def crash_rank_1(task):
        if task.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(task)

    monkeypatch.setattr(local, "run_rank_task", crash_rank_1)  # what the local worker calls
    progress = CountingProgress()
    results = {r.rank: r for r in batch.run_local(plan.to_run, workers=3, memory_budget=None, progress=progress)}
    assert progress.most_running == 3
    assert results[1].status == "failed" and "SIGKILL" in results[1].error
    assert results[0].status == results[2].status == "linked"



def test_subprocess_worker_gives_the_in_process_result(tmp_path):
    """The Dask task body (a fresh Python process per rank) links exactly as the local worker does."""
    from linker.batch import remote

    traces = make_rank_set(tmp_path / "t", 1)
    task = batch.plan_batch(config_for(traces, tmp_path / "sub")).to_run[0]
    in_process = batch.plan_batch(config_for(traces, tmp_path / "here")).to_run[0]
    assert (Path(remote.__file__).resolve().parents[2] / "linker" / "batch" / "remote.py").is_file()
    child, here = remote.run_rank_subprocess(task), batch.run_rank_task(in_process)
    assert child.status == here.status == "linked", child.error
    assert Path(child.output).read_bytes() == Path(here.output).read_bytes()
    assert (child.method, child.et_ops, child.linked_ops, child.warnings) == (
        here.method, here.et_ops, here.linked_ops, here.warnings)

# --- summary and progress -----------------------------------------------------------------------


def _result(rank: int, linked: float, gpu: float = 100.0, method: str = "rf_id", warnings: int = 0,
            wall: float = 1.0, peak: int = 200 << 20) -> RankResult:
    return RankResult(rank, "linked", "e", "k", method=method, linked_pct=linked, gpu_linked_pct=gpu,
                      warnings=["w"] * warnings, wall_seconds=wall, peak_rss_bytes=peak)


def test_outliers():
    steady = [_result(r, 99.0 + r / 10) for r in range(6)]
    assert find_outliers(steady) == []
    odd = steady + [_result(6, 61.0, gpu=40.0, method="exact", warnings=5, wall=9.0, peak=900 << 20)]
    found = {(o.rank, o.metric) for o in find_outliers(odd)}
    assert found == {(6, "linked_pct"), (6, "gpu_linked_pct"), (6, "method"), (6, "warnings"),
                     (6, "wall_seconds"), (6, "peak_rss_bytes")}
    failed = RankResult(7, "failed", "e", "k", error="boom")
    assert {(o.rank, o.metric) for o in find_outliers(odd + [failed])} == found
    assert find_outliers(odd[:2]) == []  # too few ranks to compare


def test_a_gpu_outlier_says_why_as_the_single_pair_summary_does():
    """The GPU-attached outlier carries the rank's reasons (on param_dlrm: in
    ``test_param_dlrm_batch_matches_single_pair_runs``, which links that job)."""
    steady = [_result(r, 100.0) for r in range(4)]
    odd = _result(4, 100.0, gpu=80.0)
    odd.gpu_not_attached = {"before": 64, "outside": 3}
    (outlier,) = find_outliers(steady + [odd])
    assert outlier.reason.endswith("(64 launched before the trace, 3 outside the linked iteration)")


def test_progress_bar_and_log_lines():
    bar_stream = io.StringIO()
    bar = BatchProgress(4, 400, bar_stream, interactive=True)
    bar.started(0)
    bar.started(1)
    bar.finished(0, True, 100, "rank 0: fine")
    bar.finished(1, False, 100, "rank 1 FAILED: broken")
    bar.close()
    text = bar_stream.getvalue()
    assert "2/4: 1 done, 1 failed, 0 running" in text and "ETA" in text
    assert "et-link batch: rank 1 FAILED: broken\n" in text and "rank 0: fine" not in text
    log_stream = io.StringIO()
    plain = BatchProgress(2, 200, log_stream, interactive=False)
    plain.started(0)
    plain.finished(0, True, 100, "rank 0: fine")
    assert log_stream.getvalue() == "et-link batch: rank 0: fine [1/2]\n"


def test_small_helpers(tmp_path):
    assert format_ranks([7, 0, 1, 2, 5, 8, 9]) == "0-2,5,7-9"
    assert parse_bytes("512M") == 512 << 20 and parse_bytes("1.5GiB") == 3 << 29 and parse_bytes("100") == 100
    with pytest.raises(ValueError):
        parse_bytes("lots")
    data = b'{"a": 1}' * 5000
    (tmp_path / "a.gz").write_bytes(gzip.compress(data))
    (tmp_path / "a.json").write_bytes(data)
    assert uncompressed_size(tmp_path / "a.gz") == len(data) == uncompressed_size(tmp_path / "a.json")
    truncated = gzip.compress(os.urandom(4000))[:-8] + b"\xff\xff\xff\x7f"
    (tmp_path / "t.gz").write_bytes(truncated)
    assert uncompressed_size(tmp_path / "t.gz") == int(len(truncated) * batch.TYPICAL_GZIP_RATIO)


# --- the real job (param_dlrm, 8 ranks) ---------------------------------------------------------


def test_param_dlrm_batch_matches_single_pair_runs(tmp_path, dlrm_batch):
    """The job linked by ``batch`` is its single pairs linked by ``et-link``: with ``--rank-start
    zero`` byte for byte; with the measured start, the same plus a delay node before the process
    root of each rank that began after the first. Three ranks are also linked alone (the first to
    start, the last, and one between); the other five are held to the zero-start batch."""
    summary, out = dlrm_batch()
    assert [r.rank for r in summary.ranks] == list(range(8))
    assert all(r.status == "linked" for r in summary.ranks)
    zero, zero_out = dlrm_batch("zero")
    assert all(r.status == "linked" for r in zero.ranks)
    zero_bytes = {rank: (zero_out / f"rank{rank}_plus.json").read_bytes() for rank in range(8)}
    for rank in (1, 3, 7):  # --rank-start zero: byte for byte the single pair's output, its measured waits written in
        single = link_pair(DLRM / f"rank{rank}.et.json.gz", DLRM / f"rank{rank}.kineto.json.gz", tmp_path / "s.json")
        assert add_file_waits(single, "measured") > 0
        assert single.output.read_bytes() == zero_bytes[rank]
    unshifted = {rank: orjson.loads(data) for rank, data in zero_bytes.items()}
    # each rank's start offset (docs/rank-start.md): its earliest measured start minus the job's
    firsts = {rank: min(n["ts"] for n in doc["nodes"] if "ts" in n) for rank, doc in unshifted.items()}
    offsets = {rank: round(first - min(firsts.values())) for rank, first in firsts.items()}
    assert offsets[1] == 0 and max(offsets.values()) == offsets[7] == 7519  # dlrm's ranks began up to 7.5 ms apart
    assert 0 < offsets[3] < offsets[7]
    for rank in range(8):
        doc = orjson.loads((out / f"rank{rank}_plus.json").read_bytes())
        if offsets[rank]:  # the delay node first, the process root depending on it; nothing else changed
            delay, root = doc["nodes"][0], next(n for n in doc["nodes"] if n["name"].endswith("|process]"))
            assert delay["name"] == "[et-link|rank_start]" and delay["sim_dur"] == offsets[rank]
            assert root["data_deps"] == [delay["id"]] and root["data_dep_causes"] == ["rank_start"]
            root["data_deps"], root["data_dep_causes"] = [], []
            del doc["nodes"][0]
        assert doc == unshifted[rank]
    assert len(orjson.loads((out / "summary.json").read_bytes())["ranks"]) == 8
    # the GPU-attached outliers (ranks 1 and 3) say why: the GPU events launched before the trace,
    # counted here from each rank's own report
    gpu = [o for o in summary.outliers if o.metric == "gpu_linked_pct"]
    assert gpu
    for o in gpu:
        rows = orjson.loads((out / f"rank{o.rank}.report.json").read_bytes())["gpu_accounting"]
        before = sum(row["count"] for row in rows if row["reason"].startswith("before_trace"))
        assert before and f"({before} launched before the trace)" in o.reason


def read_astra_setup(astra: Path) -> tuple[int, dict[str, list[int]], dict[int, str], list | None]:
    """What ASTRA-sim would read, parsed here from the files: npus_count (network.yml), the comm
    groups, {NPU: the rank file its workload file links to}, npu_ranks.json (None when absent)."""
    counts = re.findall(r"^npus_count:\s*\[\s*(\d+)\s*\]", (astra / "network.yml").read_text(), re.MULTILINE)
    assert len(counts) == 1
    workloads = {}
    for path in astra.iterdir():
        match = re.fullmatch(r"workload\.(\d+)\.et", path.name)
        if match:
            workloads[int(match.group(1))] = os.readlink(path) if path.is_symlink() else None
    ranks_file = astra / "npu_ranks.json"
    return (int(counts[0]), orjson.loads((astra / "comm_groups.json").read_bytes()), workloads,
            orjson.loads(ranks_file.read_bytes()) if ranks_file.exists() else None)


def test_a_subset_of_the_job_gets_an_astra_setup_of_the_ranks_linked(tmp_path):
    """Some of param_dlrm's 8 ranks (1, 3, 6): the ASTRA-sim setup has one NPU per rank linked,
    and every file agrees with that count: a workload file per NPU, numbered 0..n-1, NPU k for the
    k-th rank (npu_ranks.json), comm groups naming NPUs below npus_count; the job's own
    comm_groups.json beside the outputs keeps the job's global ranks. A later batch of ranks 0-1
    into the same folder leaves no NPU of the earlier setup behind."""
    if not DLRM.is_dir():
        pytest.skip(shared_reason(DLRM))
    out = tmp_path / "out"
    summary = quiet_run(BatchConfig(str(DLRM / "rank[136].et.json.gz"), str(DLRM / "rank[136].kineto.json.gz"), out,
                                    fmt="et", workers=1))
    assert [r.rank for r in summary.ranks] == [1, 3, 6] and all(r.ok for r in summary.ranks)
    npus, groups, workloads, npu_ranks = read_astra_setup(out / "astra")
    assert npus == 3 and sorted(workloads) == [0, 1, 2]
    assert npu_ranks == [1, 3, 6]
    assert [workloads[npu] for npu in range(3)] == ["../rank.1.et", "../rank.3.et", "../rank.6.et"]
    assert groups and all(0 <= npu < npus for members in groups.values() for npu in members)
    assert groups == {"1": [0, 1, 2]}  # the world group, among the ranks linked
    assert orjson.loads((out / "comm_groups.json").read_bytes()) == {"1": list(range(8))}  # the job's, unchanged
    notes = orjson.loads((out / "summary.json").read_bytes())["simulator"]["astra_sim"]["notes"]
    assert any(note.startswith("NPUs 0-2 are the 3 ranks linked (1,3,6)") and "npu_ranks.json" in note for note in notes)
    # ranks 0-1 into the same folder: 2 NPUs, numbered as the ranks, nothing left of the 3-NPU setup
    again = quiet_run(BatchConfig(str(DLRM / "rank[01].et.json.gz"), str(DLRM / "rank[01].kineto.json.gz"), out,
                                  fmt="et", workers=1))
    assert [r.rank for r in again.ranks] == [0, 1]
    npus, groups, workloads, npu_ranks = read_astra_setup(out / "astra")
    assert npus == 2 and workloads == {0: "../rank.0.et", 1: "../rank.1.et"} and npu_ranks is None
    assert groups == {"1": [0, 1]}


# --- Dask ---------------------------------------------------------------------------------------


def test_scheduler_without_dask_is_one_line_error(tmp_path, monkeypatch):
    traces = make_rank_set(tmp_path / "t", 1)
    monkeypatch.setitem(sys.modules, "distributed", None)  # makes "import distributed" fail
    result = CliRunner().invoke(app, ["batch", "--et", str(traces / "rank*.et.json.gz"), "--kineto",
                                      str(traces / "rank*.kineto.json.gz"), "--output-dir", str(tmp_path / "out"),
                                      "--scheduler", "tcp://127.0.0.1:8786"])
    assert result.exit_code == 2
    assert result.output.strip() == "et-link: error: --scheduler needs Dask: install it with  pip install 'et-link[dask]'"
    assert not (tmp_path / "out").exists()


def _stop(process: subprocess.Popen) -> None:
    """Stop a process this test started, with the children it spawned (its own session)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
    except ProcessLookupError:
        pass


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_dask_cluster_gives_the_same_outputs(tmp_path):
    if importlib.util.find_spec("distributed") is None:
        pytest.skip("dask[distributed] is not installed")
    traces = make_rank_set(tmp_path / "t", 2)
    address = f"tcp://127.0.0.1:{_free_loopback_port()}"
    common = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path)
    started = []
    try:
        # Scheduler, two workers and the batch start together: workers and client wait for the scheduler.
        started.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                         "--port", address.rsplit(":", 1)[1], "--dashboard-address", ":0"], **common))
        started.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address,
                                         "--nworkers", "2", "--nthreads", "1", "--host", "127.0.0.1",
                                         "--dashboard-address", ":0"], **common))
        out = tmp_path / "out"
        result = subprocess.run([sys.executable, "-m", "linker.cli", "batch", "--et", str(traces / "rank*.et.json.gz"),
                                 "--kineto", str(traces / "rank*.kineto.json.gz"), "--output-dir", str(out),
                                 "--scheduler", address, "-q"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["executor"] == f"Dask scheduler {address}"
        assert [r["status"] for r in summary["ranks"]] == ["linked", "linked"]
        for rank in range(2):
            single = link_pair(traces / f"rank{rank}.et.json.gz", traces / f"rank{rank}.kineto.json.gz",
                               tmp_path / "s.json")
            assert (out / f"rank{rank}_plus.json").read_bytes() == single.output.read_bytes()
            assert summary["ranks"][rank]["peak_rss_bytes"] > 1 << 20
    finally:
        for process in reversed(started):
            _stop(process)

"""A Kineto file's rank in ``et-link batch`` (``linker.batch.pairing``): the header's
``distributedInfo.rank`` first, the file name only when the header has none (or with
``--rank-pattern``). A keyword name (``rank3``) that contradicts the header is a problem naming
both ranks; a lone number in the name (``host_7``) is not a rank claim and the header wins.

The Kineto files are real captures (tests/fixtures/cpu) with a ``distributedInfo`` written into
their header, as Kineto writes it."""

from __future__ import annotations

import gzip
import io
import re
import shutil
from pathlib import Path

import orjson
import pytest

from conftest import FIXTURES
from linker.batch import BatchConfig, PairingError, run_batch
from linker.batch.pairing import kineto_rank, pair_rank_files

WORKLOADS = ("mlp_steps", "dataloader")  # two different captures: a wrong pairing cannot link


def _kineto_with_rank(source: Path, target: Path, rank: int | None, world_size: int | None = None) -> Path:
    """A copy of a real Kineto trace whose header carries ``distributedInfo`` (first, as Kineto
    writes it) with this rank; ``rank`` None: no distributedInfo at all."""
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    doc.pop("distributedInfo", None)
    if rank is not None:
        info = {"backend": "gloo", "rank": rank} | ({"world_size": world_size} if world_size else {})
        doc = {"schemaVersion": 1, "distributedInfo": info} | doc
    target.write_bytes(gzip.compress(orjson.dumps(doc)))
    return target


def _kineto(workload: str) -> Path:
    return FIXTURES / "cpu" / workload / "kineto.json.gz"


def _et(workload: str) -> Path:
    return FIXTURES / "cpu" / workload / "et.json.gz"


@pytest.mark.parametrize("name, named, header", [
    ("host_7.pt.trace.json.gz", 7, 2),
    ("node12.json.gz", 12, 0),
    ("gpu3.json.gz", 3, 1),
])
def test_header_rank_wins_over_a_contradicting_name(tmp_path, name, named, header):
    path = _kineto_with_rank(_kineto("mlp_steps"), tmp_path / name, header, world_size=8)
    found = kineto_rank(path)
    assert found.rank == header != named
    assert found.source == "distributedInfo" and found.problem is None and found.world_size == 8
    # the same name without a header: the name's rank, from the name
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    plain = _kineto_with_rank(_kineto("mlp_steps"), plain_dir / name, None)
    from_name = kineto_rank(plain)
    assert (from_name.rank, from_name.source) == (named, "file name")


def test_keyword_name_contradicting_the_header_is_noted_not_taken(tmp_path):
    path = _kineto_with_rank(_kineto("mlp_steps"), tmp_path / "rank3.kineto.json.gz", 5)
    found = kineto_rank(path)
    assert found.rank != 3  # never the name's rank
    assert found.problem is not None
    assert "distributedInfo says rank 5" in found.problem and "the name says rank 3" in found.problem
    # agreeing: the rank, from the header
    same = kineto_rank(_kineto_with_rank(_kineto("mlp_steps"), tmp_path / "rank5.kineto.json.gz", 5))
    assert (same.rank, same.source, same.problem) == (5, "distributedInfo", None)
    # --rank-pattern: every rank from the name, header or not
    pattern = kineto_rank(path, re.compile(r"rank(\d+)"))
    assert (pattern.rank, pattern.source) == (3, "--rank-pattern")


def test_pairing_follows_the_header_when_names_say_otherwise(tmp_path):
    """ETs rank0/rank1; the Kineto files' names carry the other rank's number (host_1 holds rank 0
    by its header, host_0 rank 1): pairs by header."""
    ets = []
    for rank, workload in enumerate(WORKLOADS):
        ets.append(tmp_path / f"rank{rank}.et.json.gz")
        shutil.copyfile(_et(workload), ets[-1])
    k0 = _kineto_with_rank(_kineto(WORKLOADS[0]), tmp_path / "host_1.pt.trace.json.gz", 0, world_size=2)
    k1 = _kineto_with_rank(_kineto(WORKLOADS[1]), tmp_path / "host_0.pt.trace.json.gz", 1, world_size=2)
    pairing = pair_rank_files(ets, [k0, k1])
    assert pairing.problems == []
    assert [(p.rank, p.et.name, p.kineto.name, p.rank_source) for p in pairing.pairs] == [
        (0, "rank0.et.json.gz", "host_1.pt.trace.json.gz", "distributedInfo"),
        (1, "rank1.et.json.gz", "host_0.pt.trace.json.gz", "distributedInfo"),
    ]
    assert pairing.world_size == 2


def test_pairing_lists_a_keyword_contradiction_as_a_problem(tmp_path):
    ets = [tmp_path / "rank0.et.json.gz", tmp_path / "rank1.et.json.gz"]
    for et, workload in zip(ets, WORKLOADS):
        shutil.copyfile(_et(workload), et)
    k0 = _kineto_with_rank(_kineto(WORKLOADS[0]), tmp_path / "rank0.kineto.json.gz", 0)
    k1 = _kineto_with_rank(_kineto(WORKLOADS[1]), tmp_path / "rank1.kineto.json.gz", 4)  # contradicts its name
    pairing = pair_rank_files(ets, [k0, k1])
    text = "\n".join(pairing.problems)
    assert "distributedInfo says rank 4 but the name says rank 1" in text
    assert str(k1) in text
    assert [p.rank for p in pairing.pairs] == [0]  # rank 1 is not guessed from the name


def test_batch_links_each_et_with_the_kineto_file_its_header_names(tmp_path):
    traces = tmp_path / "in"
    traces.mkdir()
    for rank, workload in enumerate(WORKLOADS):
        shutil.copyfile(_et(workload), traces / f"rank{rank}.et.json.gz")
    # names swapped against the headers
    _kineto_with_rank(_kineto(WORKLOADS[0]), traces / "host_1.pt.trace.json.gz", 0, world_size=2)
    _kineto_with_rank(_kineto(WORKLOADS[1]), traces / "host_0.pt.trace.json.gz", 1, world_size=2)
    summary = run_batch(BatchConfig(str(traces / "rank*.et.json.gz"), str(traces / "host_*.pt.trace.json.gz"),
                                    tmp_path / "out", workers=1),
                        progress_stream=io.StringIO(), interactive=False)
    assert [(r.rank, r.status, Path(r.et).name, Path(r.kineto).name) for r in summary.ranks] == [
        (0, "linked", "rank0.et.json.gz", "host_1.pt.trace.json.gz"),
        (1, "linked", "rank1.et.json.gz", "host_0.pt.trace.json.gz"),
    ]
    assert all(r.linked_ops == r.et_ops for r in summary.ranks)


def test_batch_refuses_a_keyword_name_contradicting_the_header(tmp_path):
    traces = tmp_path / "in"
    traces.mkdir()
    for rank, workload in enumerate(WORKLOADS):
        shutil.copyfile(_et(workload), traces / f"rank{rank}.et.json.gz")
    _kineto_with_rank(_kineto(WORKLOADS[0]), traces / "rank0.kineto.json.gz", 0)
    _kineto_with_rank(_kineto(WORKLOADS[1]), traces / "rank1.kineto.json.gz", 6)
    with pytest.raises(PairingError) as raised:
        run_batch(BatchConfig(str(traces / "rank*.et.json.gz"), str(traces / "rank*.kineto.json.gz"),
                              tmp_path / "out", workers=1), progress_stream=io.StringIO(), interactive=False)
    assert "distributedInfo says rank 6 but the name says rank 1" in "\n".join(raised.value.problems)

"""Output blocks reserved up front (``output_space.reserve_space``): the file still ends where the writing
did, gzip outputs are left alone, and the writers' size guesses are close to what they write."""

from __future__ import annotations

import contextlib
import gzip
import os
import time
from pathlib import Path

import pytest

from conftest import fixture_pair
from linker.write import chakra_wire as chakra_io
from linker.read import files as fileio
from linker.schedule import prefill as output_space
from linker.write import etplus_json as write_json
from linker.pipeline import link_pair

RESERVED = 64 << 20


def test_a_reservation_beyond_the_writing_is_given_back(tmp_path):
    if output_space._fallocate() is None:
        pytest.skip("no fallocate(2) here")
    path, data = tmp_path / "out.json", os.urandom(10_000)
    with fileio.atomic_output(path) as out:
        out.write(data)
        output_space.reserve_space(out, RESERVED)
        out.flush()
        if os.fstat(out.fileno()).st_size < RESERVED:
            pytest.skip("this file system refuses fallocate")
    assert path.read_bytes() == data
    assert path.stat().st_blocks * 512 < 1 << 20  # the 64 MB of blocks were freed, not just hidden


def test_gzip_outputs_are_not_reserved(tmp_path):
    path = tmp_path / "out.json.gz"
    with fileio.atomic_output(path) as out:
        out.write(b'{"nodes": []}')
        output_space.reserve_space(out, RESERVED)
    assert gzip.decompress(path.read_bytes()) == b'{"nodes": []}'
    assert path.stat().st_size < 1000


@pytest.mark.parametrize("suffix", [".json", ".et"])
@pytest.mark.parametrize("fixture", [("cpu", "mlp_steps"), ("gpu", "gpu_v101")])
def test_writers_reserve_about_what_they_write_and_write_the_same_bytes(tmp_path, monkeypatch, suffix, fixture):
    et, kineto = fixture_pair(*fixture)
    plain = tmp_path / f"plain{suffix}"
    monkeypatch.setattr(output_space, "_fallocate", lambda: None)  # reserve_space does nothing
    link_pair(et, kineto, plain)
    monkeypatch.undo()
    asked: list[int] = []
    module = write_json if suffix == ".json" else chakra_io

    def spy(stream, size):
        asked.append(size)
        output_space.reserve_space(stream, size)

    monkeypatch.setattr(module, "reserve_space", spy)
    reserved = tmp_path / f"reserved{suffix}"
    link_pair(et, kineto, reserved)
    assert reserved.read_bytes() == plain.read_bytes()
    size = plain.stat().st_size
    assert len(asked) == 1 and size / 2 <= asked[0] <= 2 * size + (1 << 16), (asked, size)


def _listing(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_output_writes_into_the_prefilled_file_and_cuts_it(tmp_path):
    path, data = tmp_path / "out.json", os.urandom(100_000)
    with output_space.prefilled(path, 3 * output_space._PREFILL_PIECE):
        hidden = [p for p in tmp_path.iterdir() if p.name.startswith(".out.json.")]
        assert len(hidden) == 1  # the temporary file is made (and being filled) before any write
        with fileio.atomic_output(path) as out:
            out.write(data)
        assert not hidden[0].exists()  # it became the output
    assert _listing(tmp_path) == ["out.json"] and path.read_bytes() == data


def test_a_prefill_never_written_to_is_removed(tmp_path):
    path = tmp_path / "out.json"
    with pytest.raises(KeyboardInterrupt):
        with output_space.prefilled(path, 2 * output_space._PREFILL_PIECE):
            raise KeyboardInterrupt
    with output_space.prefilled(path, 2 * output_space._PREFILL_PIECE):
        pass  # an output that was not written in the end (a refused pair)
    assert _listing(tmp_path) == []


def test_pipeline_prefills_a_json_output_only_with_a_spare_core(tmp_path, monkeypatch):
    from linker import pipeline

    et, kineto = fixture_pair("cpu", "mlp_steps")
    plain = tmp_path / "plain" / "o.json"
    plain.parent.mkdir()
    link_pair(et, kineto, plain)
    monkeypatch.setattr(pipeline, "PREFILL_MIN_BYTES", 0)
    sizes: list[int] = []
    real = output_space.prefill_later

    @contextlib.contextmanager
    def spy(path):
        with real(path) as start:
            yield lambda size: sizes.append(size) or start(size)

    monkeypatch.setattr(output_space, "prefill_later", spy)
    out = tmp_path / "prefilled" / "o.json"
    out.parent.mkdir()
    link_pair(et, kineto, out)
    # from the ET once it is read, then with the Kineto trace's GPU ops (none here)
    assert len(sizes) == 2 and sizes[0] == sizes[1] >= out.stat().st_size // 2  # the guess was used
    assert out.read_bytes() == plain.read_bytes() and _listing(out.parent) == ["o.json"]
    link_pair(et, kineto, out.with_suffix(".et"))
    assert sizes[2:] == [0, 0]  # only JSON is prefilled
    link_pair(et, kineto, out, read_ahead=False)  # batch workers: no core to spare
    with monkeypatch.context() as single:
        from linker.schedule import fork as forked

        single.setattr(forked.os, "sched_getaffinity", lambda pid: {0}, raising=False)
        link_pair(et, kineto, out)  # one core: the filling thread would only slow the link
    assert len(sizes) == 4

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "link", interrupted)
    with pytest.raises(KeyboardInterrupt):
        link_pair(et, kineto, tmp_path / "prefilled" / "new.json")
    assert len(sizes) == 6 and sizes[-1] > 0 and _listing(out.parent) == ["o.et", "o.json"]


def _grown_to(path: Path, size: int) -> bool:
    """True once the hidden temporary file of ``path`` holds ``size`` bytes (waits up to 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hidden = [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]
        if hidden and hidden[0].stat().st_size >= size:
            return True
        time.sleep(0.01)
    return False


def test_a_prefill_started_later_grows_on_demand(tmp_path):
    """``prefill_later``: nothing until started; a larger size later fills on where it ended (the
    file then holds the larger size), a smaller one changes nothing; the output is what was written."""
    path, piece = tmp_path / "out.json", output_space._PREFILL_PIECE
    with output_space.prefill_later(path) as start:
        assert _listing(tmp_path) == []
        start(piece)
        assert _grown_to(path, piece)
        start(3 * piece)
        start(2 * piece)
        assert _grown_to(path, 3 * piece)
        with fileio.atomic_output(path) as out:
            out.write(b"[1]")
    assert _listing(tmp_path) == ["out.json"] and path.read_bytes() == b"[1]"

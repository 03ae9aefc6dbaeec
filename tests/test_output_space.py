"""Output blocks reserved up front (``sink.reserve_space``) and output files prefilled while linking
(``sink.prefill_later``, when the schedule says so): the file still ends where the writing did, gzip
outputs are left alone, the writers' size guesses are close to what they write, and the bytes are
those written without either."""

from __future__ import annotations

import contextlib
import gzip
import os
import time
from pathlib import Path

import pytest

from conftest import fixture_pair
from linker import pipeline
from linker.model.output import Output
from linker.pipeline import link_pair
from linker.schedule import Schedule
from linker.write import chakra_wire as chakra_io
from linker.write import etplus_json as write_json
from linker.write import sink

RESERVED = 64 << 20


def test_a_reservation_beyond_the_writing_is_given_back(tmp_path):
    if sink._fallocate() is None:
        pytest.skip("no fallocate(2) here")
    path, data = tmp_path / "out.json", os.urandom(10_000)
    with sink.atomic_output(path) as out:
        out.write(data)
        sink.reserve_space(out, RESERVED)
        out.flush()
        if os.fstat(out.fileno()).st_size < RESERVED:
            pytest.skip("this file system refuses fallocate")
    assert path.read_bytes() == data
    assert path.stat().st_blocks * 512 < 1 << 20  # the 64 MB of blocks were freed, not just hidden


def test_gzip_outputs_are_not_reserved(tmp_path):
    path = tmp_path / "out.json.gz"
    with sink.atomic_output(path) as out:
        out.write(b'{"nodes": []}')
        sink.reserve_space(out, RESERVED)
    assert gzip.decompress(path.read_bytes()) == b'{"nodes": []}'
    assert path.stat().st_size < 1000


@pytest.mark.parametrize("suffix", [".json", ".et"])
@pytest.mark.parametrize("fixture", [("cpu", "mlp_steps"), ("gpu", "gpu_v101")])
def test_writers_reserve_about_what_they_write_and_write_the_same_bytes(tmp_path, monkeypatch, suffix, fixture):
    et, kineto = fixture_pair(*fixture)
    packed = tmp_path / f"packed{suffix}.gz"  # a gzip output is never reserved
    link_pair(et, kineto, packed)
    asked: list[int] = []
    module = write_json if suffix == ".json" else chakra_io

    def spy(stream, size):
        asked.append(size)
        sink.reserve_space(stream, size)

    monkeypatch.setattr(module, "reserve_space", spy)
    reserved = tmp_path / f"reserved{suffix}"
    link_pair(et, kineto, reserved)
    assert reserved.read_bytes() == gzip.decompress(packed.read_bytes())
    size = reserved.stat().st_size
    assert len(asked) == 1 and size / 2 <= asked[0] <= 2 * size + (1 << 16), (asked, size)


def _listing(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_output_writes_into_the_prefilled_file_and_cuts_it(tmp_path):
    path, data = tmp_path / "out.json", os.urandom(100_000)
    with sink.prefilled(path, 3 * sink._PREFILL_PIECE) as prefill:
        hidden = [p for p in tmp_path.iterdir() if p.name.startswith(".out.json.")]
        assert len(hidden) == 1  # the temporary file is made (and being filled) before any write
        with sink.atomic_output(path, prefill=prefill) as out:
            out.write(data)
        assert not hidden[0].exists()  # it became the output
    assert _listing(tmp_path) == ["out.json"] and path.read_bytes() == data


def test_a_prefill_never_written_to_is_removed(tmp_path):
    path = tmp_path / "out.json"
    with pytest.raises(KeyboardInterrupt):
        with sink.prefilled(path, 2 * sink._PREFILL_PIECE):
            raise KeyboardInterrupt
    with sink.prefilled(path, 2 * sink._PREFILL_PIECE):
        pass  # an output that was not written in the end (a refused pair)
    assert _listing(tmp_path) == []


def test_the_schedule_prefills_plain_json_outputs_only():
    et = type("Et", (), {"text_bytes": 1000, "nodes": [None] * 10})()
    forced, serial = Schedule.forced(), Schedule.serial()
    assert forced.prefill_size(Output.of("o.json"), et) == 1000 + 64 * 10
    assert forced.prefill_size(Output.of("o.json.gz"), et) == 0
    assert forced.prefill_size(Output.of("o.et"), et) == 0
    assert serial.prefill_size(Output.of("o.json"), et) == 0
    assert Schedule.auto().prefill_size(Output.of("o.json"), et) == 0  # under its threshold


def test_a_prefilled_output_holds_what_was_written_and_nothing_is_left_behind(tmp_path, monkeypatch):
    et, kineto = fixture_pair("cpu", "mlp_steps")
    plain = tmp_path / "plain" / "o.json"
    plain.parent.mkdir()
    link_pair(et, kineto, plain)
    sizes: list[int] = []
    real = sink.prefill_later

    @contextlib.contextmanager
    def spy(path):
        with real(path) as prefill:
            start = prefill.start
            prefill.start = lambda size: sizes.append(size) or start(size)
            yield prefill

    monkeypatch.setattr(pipeline, "prefill_later", spy)
    out = tmp_path / "prefilled" / "o.json"
    out.parent.mkdir()
    link_pair(et, kineto, out, schedule=Schedule.forced())
    # from the ET once it is read, then with the Kineto trace's GPU ops (none here)
    assert len(sizes) == 2 and sizes[0] == sizes[1] >= out.stat().st_size // 2  # the guess was used
    assert out.read_bytes() == plain.read_bytes() and _listing(out.parent) == ["o.json"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "link", interrupted)
    with pytest.raises(KeyboardInterrupt):
        link_pair(et, kineto, tmp_path / "prefilled" / "new.json", schedule=Schedule.forced())
    assert len(sizes) == 4 and sizes[-1] > 0 and _listing(out.parent) == ["o.json"]


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
    path, piece = tmp_path / "out.json", sink._PREFILL_PIECE
    with sink.prefill_later(path) as prefill:
        assert _listing(tmp_path) == []
        prefill.start(piece)
        assert _grown_to(path, piece)
        prefill.start(3 * piece)
        prefill.start(2 * piece)
        assert _grown_to(path, 3 * piece)
        assert prefill.take(tmp_path / "other.json") is None  # only the output it was made for
        with sink.atomic_output(path, prefill=prefill) as out:
            out.write(b"[1]")
        assert _listing(tmp_path) == ["out.json"]  # the prefilled file became the output
    assert _listing(tmp_path) == ["out.json"] and path.read_bytes() == b"[1]"


def test_a_prefill_not_given_to_the_writer_is_not_used_and_is_removed(tmp_path):
    """The prefilled file belongs to its ``Prefill``: a writer not given it makes its own, and the
    prefilled one is removed when the block ends."""
    path = tmp_path / "out.json"
    with sink.prefilled(path, sink._PREFILL_PIECE):
        with sink.atomic_output(path) as out:
            out.write(b"[2]")
        assert len(_listing(tmp_path)) == 2  # the output and the prefilled file, still held
    assert _listing(tmp_path) == ["out.json"] and path.read_bytes() == b"[2]"

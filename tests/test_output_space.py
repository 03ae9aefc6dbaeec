"""Output blocks reserved up front (``sink.reserve_space``): the file still ends where the writing
did, gzip outputs are left alone, the writers' size guesses are close to what they write, and the
bytes are those written without a reservation."""

from __future__ import annotations

import gzip
import os

import pytest

from conftest import fixture_pair
from linker.pipeline import link_pair
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

"""Output blocks reserved up front (``fileio.reserve_space``): the file still ends where the writing
did, gzip outputs are left alone, and the writers' size guesses are close to what they write."""

from __future__ import annotations

import gzip
import os

import pytest

from conftest import fixture_pair
from linker import chakra_io, fileio, write_json
from linker.pipeline import link_pair

RESERVED = 64 << 20


def test_a_reservation_beyond_the_writing_is_given_back(tmp_path):
    if fileio._fallocate() is None:
        pytest.skip("no fallocate(2) here")
    path, data = tmp_path / "out.json", os.urandom(10_000)
    with fileio.atomic_output(path) as out:
        out.write(data)
        fileio.reserve_space(out, RESERVED)
        out.flush()
        if os.fstat(out.fileno()).st_size < RESERVED:
            pytest.skip("this file system refuses fallocate")
    assert path.read_bytes() == data
    assert path.stat().st_blocks * 512 < 1 << 20  # the 64 MB of blocks were freed, not just hidden


def test_gzip_outputs_are_not_reserved(tmp_path):
    path = tmp_path / "out.json.gz"
    with fileio.atomic_output(path) as out:
        out.write(b'{"nodes": []}')
        fileio.reserve_space(out, RESERVED)
    assert gzip.decompress(path.read_bytes()) == b'{"nodes": []}'
    assert path.stat().st_size < 1000


@pytest.mark.parametrize("suffix", [".json", ".et"])
@pytest.mark.parametrize("fixture", [("cpu", "mlp_steps"), ("gpu", "gpu_v101")])
def test_writers_reserve_about_what_they_write_and_write_the_same_bytes(tmp_path, monkeypatch, suffix, fixture):
    et, kineto = fixture_pair(*fixture)
    plain = tmp_path / f"plain{suffix}"
    monkeypatch.setattr(fileio, "_fallocate", lambda: None)  # reserve_space does nothing
    link_pair(et, kineto, plain)
    monkeypatch.undo()
    asked: list[int] = []
    module = write_json if suffix == ".json" else chakra_io

    def spy(stream, size):
        asked.append(size)
        fileio.reserve_space(stream, size)

    monkeypatch.setattr(module, "reserve_space", spy)
    reserved = tmp_path / f"reserved{suffix}"
    link_pair(et, kineto, reserved)
    assert reserved.read_bytes() == plain.read_bytes()
    size = plain.stat().st_size
    assert len(asked) == 1 and size / 2 <= asked[0] <= 2 * size + (1 << 16), (asked, size)

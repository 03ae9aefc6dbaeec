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


# --------------------------------------------------------------------------- the output's room


@pytest.mark.parametrize("written", [10_000, 3 * sink.ROOM_PIECE + 5], ids=["less than the room", "more"])
def test_an_output_written_into_its_room_is_exactly_what_was_written(tmp_path, written):
    """The room's zeros are overwritten from the start and cut where the writing ended, however
    far the thread got; the hidden file becomes the output and nothing else is left."""
    path, data = tmp_path / "out.json", os.urandom(written)
    room = sink.OutputRoom(path, 2 * sink.ROOM_PIECE)
    with sink.atomic_output(path, room=room) as out:
        out.write(data)
    assert path.read_bytes() == data
    assert _listing(tmp_path) == ["out.json"]
    assert room.take() is None  # taken once
    room.discard()  # and nothing to remove after
    assert _listing(tmp_path) == ["out.json"]


def test_a_room_not_written_into_is_removed(tmp_path):
    """Discarded (the run failed before writing), or offered for another file or a gzip output
    (which are written as usual): the room's file goes."""
    room = sink.OutputRoom(tmp_path / "out.json", 1 << 20)
    assert len(_listing(tmp_path)) == 1  # the hidden file
    room.discard()
    assert _listing(tmp_path) == []
    for name in ("other.json", "out.json.gz"):
        room = sink.OutputRoom(tmp_path / "out.json", 1 << 20)
        with sink.atomic_output(tmp_path / name, room=room) as out:
            out.write(b"{}")
        assert _listing(tmp_path) == [name]
        (tmp_path / name).unlink()


def test_a_failed_write_into_the_room_leaves_nothing(tmp_path):
    path = tmp_path / "out.json"
    room = sink.OutputRoom(path, 1 << 20)
    with pytest.raises(RuntimeError):
        with sink.atomic_output(path, room=room) as out:
            out.write(b"{")
            raise RuntimeError("the writer failed")
    assert _listing(tmp_path) == []


def test_the_schedule_makes_a_room_only_for_a_large_plain_json_output(tmp_path):
    from linker import schedule as schedule_module
    from linker.model.output import Output
    from linker.schedule import Schedule

    auto, forced = Schedule.auto(), Schedule.forced()
    assert Schedule.serial().room_for(Output.of(tmp_path / "a.json"), 1 << 30) is None
    for name in ("a.json.gz", "a.et", "a.et.gz"):
        assert forced.room_for(Output.of(tmp_path / name), 1 << 30) is None
    assert forced.without(room_min_bytes=1 << 20).room_for(Output.of(tmp_path / "a.json"), 1000) is None
    room = forced.room_for(Output.of(tmp_path / "a.json"), 1000)
    assert room is not None and room.size == 1200  # the ET's text and a fifth
    room.discard()
    free = schedule_module._free_memory()
    assert forced.room_for(Output.of(tmp_path / "a.json"), free) is None  # more than half the free memory
    assert auto.output_room == auto.kineto_child  # with a spare core
    assert _listing(tmp_path) == []


def test_a_run_that_fails_after_the_room_was_made_leaves_nothing(tmp_path, monkeypatch):
    """The forced schedule makes the room once the pair is linked; a run that fails after that
    (here the ET+ build) removes the room's file with it."""
    from linker import pipeline
    from linker.schedule import Schedule

    made = []
    real_room_for = Schedule.room_for

    def room_for(schedule, output, size):
        made.append(real_room_for(schedule, output, size))
        return made[-1]

    def failing_build(result):
        raise RuntimeError("the build failed")

    monkeypatch.setattr(Schedule, "room_for", room_for)
    monkeypatch.setattr(pipeline, "build_et_plus", failing_build)
    et, kineto = fixture_pair("cpu", "mlp_steps")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(RuntimeError, match="the build failed"):
        link_pair(et, kineto, out_dir / "plus.json", schedule=Schedule.forced())
    assert len(made) == 1 and made[0] is not None
    assert _listing(out_dir) == []

"""A gzip input that inflates past what the machine can hold is refused in one line, quickly, with
memory far below its inflated size (``read.files.inflate_limit``; ``--max-inflated`` sets it)."""

from __future__ import annotations

import functools
import gzip
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from conftest import fixture_pair
from linker.model.errors import TraceInputError
from linker.read import files

ET, KINETO = fixture_pair("cpu", "mlp_steps")
INFLATED = 256 << 20  # what each bomb inflates to
LIMIT = 8 << 20


@functools.cache
def _bomb_bytes(members: int) -> bytes:
    """The bytes of ``bomb``: made once per member count in a test process (each is seconds of
    deflating)."""
    piece = b" " * (INFLATED // members // 16)
    out = bytearray()
    for _ in range(members):
        deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
        out += b"".join(deflate.compress(piece) for _ in range(16)) + deflate.flush()
    return bytes(out)


def bomb(path: Path, members: int = 1) -> Path:
    """``INFLATED`` bytes of a JSON-looking text in ``members`` gzip members (several members: the
    trailer gives the last one's size only, so no size is known before inflating)."""
    path.write_bytes(_bomb_bytes(members))
    assert path.stat().st_size < INFLATED // 500
    return path


def peak_of_read(path: Path, limit: int) -> tuple[str, int]:
    """Read ``path`` in a fresh process with the limit set: (its one-line error, its peak RSS
    beyond the interpreter's at start, bytes)."""
    code = f"""
import resource, sys
from linker.read.files import read_trace_bytes
from linker.model.errors import TraceInputError
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    read_trace_bytes(sys.argv[1])
    message = "read"
except TraceInputError as err:
    message = str(err)
print(message)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) * 1024)
"""
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          env={**os.environ, files.MAX_INFLATED_ENV: str(limit)}, timeout=60)
    message, grown = proc.stdout.strip().splitlines()
    return message, int(grown)


@pytest.mark.parametrize("members", [1, 3])
def test_a_bomb_is_refused_with_memory_far_below_its_size(tmp_path, members):
    message, grown = peak_of_read(bomb(tmp_path / "bomb.json.gz", members), LIMIT)
    assert "inflates past 8 MiB" in message and "--max-inflated" in message
    assert grown < 4 * LIMIT, grown  # the 256 MiB text is never held


def test_inflating_into_a_given_buffer_stops_at_the_limit_too(tmp_path, monkeypatch):
    """A trailer that gives a size within the limit (the last member's, 4 MiB) while the first
    member holds 256 MiB: the text goes into the buffer handed for that size, and stops at the
    limit."""
    path = bomb(tmp_path / "bomb.json.gz")
    path.write_bytes(path.read_bytes() + gzip.compress(bytes(range(256)) * (4 << 12)))
    assert files.plausible_gzip_size(path.stat().st_size, 4 << 20)
    monkeypatch.setenv(files.MAX_INFLATED_ENV, str(LIMIT))
    handed: list[int] = []

    def buffer(size):
        handed.append(size)
        return bytearray(size)

    with pytest.raises(TraceInputError, match="inflates past"):
        files.read_trace_bytes(path, buffer)
    assert handed == [4 << 20]


def test_a_file_within_the_limit_reads_as_before(monkeypatch):
    monkeypatch.setenv(files.MAX_INFLATED_ENV, str(len(gzip.decompress(ET.read_bytes()))))
    assert bytes(files.read_trace_bytes(ET)) == gzip.decompress(ET.read_bytes())
    monkeypatch.setenv(files.MAX_INFLATED_ENV, str(len(gzip.decompress(ET.read_bytes())) - 1))
    with pytest.raises(TraceInputError, match="inflates past"):
        files.read_trace_bytes(ET)


def test_the_default_limit_is_a_share_of_the_free_memory(monkeypatch):
    monkeypatch.delenv(files.MAX_INFLATED_ENV, raising=False)
    available = files.available_memory_bytes()
    if available is None:
        pytest.skip("no /proc/meminfo here")
    assert abs(files.inflate_limit() - available * files.INFLATED_SHARE_OF_AVAILABLE) < 64 << 20


@pytest.mark.parametrize("role", ["--et-file", "--kineto-file"])
def test_the_cli_refuses_a_bomb_in_one_line_and_writes_nothing(tmp_path, role):
    path = bomb(tmp_path / "bomb.json.gz")
    out = tmp_path / "out.json"
    pair = {"--et-file": ET, "--kineto-file": KINETO, role: path}
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "--et-file", str(pair["--et-file"]), "--kineto-file",
                           str(pair["--kineto-file"]), "-o", str(out), "--max-inflated", "8M"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("et-link: error")]
    assert len(errors) == 1 and str(path) in errors[0] and "inflates past 8 MiB" in errors[0], proc.stderr
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_a_bad_size_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "linker.cli", "--et-file", str(ET), "--kineto-file", str(KINETO),
                           "--max-inflated", "lots"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("et-link: error: --max-inflated"), proc.stderr


def _inflaters() -> list:
    inflaters = [zlib]
    try:
        from isal import isal_zlib
        inflaters.append(isal_zlib)
    except ImportError:
        pass
    return inflaters


@pytest.mark.parametrize("inflater", _inflaters(), ids=lambda m: m.__name__)
@pytest.mark.parametrize("into", [False, True], ids=["own buffer", "handed buffer"])
def test_several_members_stop_exactly_at_the_limit(tmp_path, monkeypatch, inflater, into):
    """Two gzip members: the trailer gives only the second one's size, within the limit, so the
    limit is met while inflating (every path: ISA-L's one call per member, zlib's pieces, a buffer
    handed for the trailer's size). The text's length is the edge: a limit one byte below it is
    refused, a limit equal to it reads the whole text."""
    text = gzip.decompress(ET.read_bytes())
    half = len(text) // 2
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(text[:half], mtime=0) + gzip.compress(text[half:], mtime=0))
    monkeypatch.setattr(files, "inflating", inflater)
    handed = (lambda size: bytearray(size)) if into else None
    monkeypatch.setenv(files.MAX_INFLATED_ENV, str(len(text)))
    assert bytes(files.read_trace_bytes(path, handed)) == text
    monkeypatch.setenv(files.MAX_INFLATED_ENV, str(len(text) - 1))
    with pytest.raises(TraceInputError, match="inflates past"):
        files.read_trace_bytes(path, handed)

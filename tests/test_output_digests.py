"""Pin the bytes et-link writes: sha256 of the ET+ JSON and the Chakra ``.et`` of medium pairs.

Speed work must not change outputs. This test links every fixture pair in ``tests/fixtures`` and
the 8 ranks of ``param_dlrm`` (when ../shared is present), with the automatic method and with
order alignment (``exact``), writes both output formats and compares their sha256 with
``tests/output_digests.json``.

A change that is *meant* to change the outputs regenerates the file with one command:

    PYTHONPATH=$PWD python tests/test_output_digests.py --update

and the diff of ``tests/output_digests.json`` shows which outputs changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from conftest import shared_reason

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = ROOT / "tests" / "output_digests.json"
FIXTURES = ROOT / "tests" / "fixtures"
DLRM = ROOT.parent / "shared" / "traces" / "param_dlrm"
METHODS = ("auto", "exact")
FORMATS = ("json", "et")


def pair_names() -> list[str]:
    """Names of the pairs pinned: fixture directories, then ``dlrm/rank<N>``."""
    fixtures = sorted(str(p.parent.relative_to(FIXTURES)) for p in FIXTURES.glob("*/*/et.json.gz"))
    return fixtures + [f"dlrm/rank{r}" for r in range(8)]


def pair_paths(name: str) -> tuple[Path, Path]:
    if name.startswith("dlrm/"):
        rank = name.split("/")[1]
        return DLRM / f"{rank}.et.json.gz", DLRM / f"{rank}.kineto.json.gz"
    return FIXTURES / name / "et.json.gz", FIXTURES / name / "kineto.json.gz"


def output_digest(name: str, method: str, fmt: str, workdir: Path, linked_once=None) -> str:
    """Link one pair with ``method`` into ``fmt`` and return the sha256 of the file written.
    ``linked_once`` (the test session's fixture): the default method's outputs are the ones other
    modules read, linked once; their bytes are what is pinned too."""
    from linker.link.recipe import LinkOptions
    from linker.pipeline import link_pair

    et, kineto = pair_paths(name)
    if method == "auto" and linked_once is not None:
        out, _, _ = linked_once(et, kineto, f".{fmt}")
    else:
        out = workdir / f"{name.replace('/', '_')}_{method}.{fmt}"
        link_pair(et, kineto, out, LinkOptions(method=method))
    return hashlib.sha256(out.read_bytes()).hexdigest()


def key(name: str, method: str, fmt: str) -> str:
    return f"{name} {method} {fmt}"


CASES = [(name, method, fmt) for name in pair_names() for method in METHODS for fmt in FORMATS]


@pytest.mark.parametrize("name,method,fmt", CASES, ids=[key(*c).replace(" ", "-") for c in CASES])
def test_output_bytes_unchanged(name, method, fmt, tmp_path, linked_once):
    et, kineto = pair_paths(name)
    if not et.exists():
        pytest.skip(shared_reason(et))
    pinned = json.loads(DIGESTS.read_text())
    assert key(name, method, fmt) in pinned, "no pinned digest: run this file with --update"
    assert output_digest(name, method, fmt, tmp_path, linked_once) == pinned[key(name, method, fmt)], (
        f"{key(name, method, fmt)}: output bytes changed (if intended: "
        "PYTHONPATH=$PWD python tests/test_output_digests.py --update)")


def update() -> None:
    """Re-link every pair and rewrite ``tests/output_digests.json``."""
    import tempfile

    digests = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, method, fmt in CASES:
            if pair_paths(name)[0].exists():
                digests[key(name, method, fmt)] = output_digest(name, method, fmt, Path(tmp))
    if len(digests) < len(CASES):
        raise SystemExit("some pairs are missing (../shared/traces absent?): digests not written")
    DIGESTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(digests)} digests to {DIGESTS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit(__doc__)
    update()

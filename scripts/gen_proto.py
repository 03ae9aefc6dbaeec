#!/usr/bin/env python3
"""Regenerate linker/model/et_def_pb2.py from schema/et_def.proto.

Compiler: Debian's ``protoc`` (``apt-get install -y protobuf-compiler``, 3.21.12 on bookworm) is the
one used for the committed module. protoc 3.21 writes code that does not pin a protobuf runtime
version, so the module imports with every runtime from 4.25 to 7.x (pyproject: protobuf>=4.25,<8).
Newer compilers (protoc >= 26, e.g. recent grpcio-tools) emit code that calls
``google.protobuf.runtime_version`` (absent before protobuf 5.26) and refuses any runtime older than
the compiler: do not use them for the committed module.

Usage:
    python scripts/gen_proto.py            # rewrite linker/model/et_def_pb2.py
    python scripts/gen_proto.py --check    # exit 1 if the committed module differs from protoc's
    python scripts/gen_proto.py --protoc /path/to/protoc
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = REPO_ROOT / "schema"
PROTO_NAME = "et_def.proto"
PACKAGE_DIR = "linker/model"
OUTPUT_PATH = REPO_ROOT / "linker" / "model" / "et_def_pb2.py"
EXPECTED_PROTOC_MAJOR_MINOR = "3.21"


def find_protoc(explicit: str | None) -> str:
    """Return the protoc executable to use: ``explicit`` if given, else the one on PATH."""
    protoc = explicit or shutil.which("protoc")
    if not protoc:
        sys.exit("protoc not found: apt-get update && apt-get install -y protobuf-compiler")
    return protoc


def protoc_version(protoc: str) -> str:
    """Return the version reported by ``protoc --version`` (e.g. '3.21.12')."""
    out = subprocess.run([protoc, "--version"], check=True, capture_output=True, text=True).stdout
    return out.strip().split()[-1]


def generate(protoc: str) -> str:
    """Compile the schema with ``protoc`` and return the generated Python text.

    The schema is staged as ``linker/model/et_def.proto`` so the generated classes belong to the module
    ``linker.model.et_def_pb2`` (their ``__module__``), which pickling (e.g. multiprocessing) needs.
    """
    with tempfile.TemporaryDirectory() as work_dir:
        staged = Path(work_dir) / "include" / PACKAGE_DIR / PROTO_NAME
        staged.parent.mkdir(parents=True)
        shutil.copyfile(SCHEMA_DIR / PROTO_NAME, staged)
        out_dir = Path(work_dir) / "out"
        out_dir.mkdir()
        subprocess.run(
            [protoc, f"--proto_path={Path(work_dir) / 'include'}", f"--python_out={out_dir}",
             f"{PACKAGE_DIR}/{PROTO_NAME}"],
            check=True,
        )
        return (out_dir / PACKAGE_DIR / "et_def_pb2.py").read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protoc", help="protoc executable (default: the one on PATH)")
    parser.add_argument("--check", action="store_true", help="only compare with the committed module")
    args = parser.parse_args(argv)

    protoc = find_protoc(args.protoc)
    version = protoc_version(protoc)
    if not version.startswith(EXPECTED_PROTOC_MAJOR_MINOR):
        print(
            f"warning: protoc {version}; the committed module was made with "
            f"{EXPECTED_PROTOC_MAJOR_MINOR}.x; newer gencode refuses protobuf runtimes older than itself",
            file=sys.stderr,
        )
    generated = generate(protoc)
    if args.check:
        current = OUTPUT_PATH.read_text() if OUTPUT_PATH.exists() else ""
        if current != generated:
            print(f"{OUTPUT_PATH} is out of date (protoc {version}); run scripts/gen_proto.py")
            return 1
        print(f"{OUTPUT_PATH} is up to date (protoc {version})")
        return 0
    OUTPUT_PATH.write_text(generated)
    print(f"wrote {OUTPUT_PATH} with protoc {version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

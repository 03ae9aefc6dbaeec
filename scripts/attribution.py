#!/usr/bin/env python3
"""How much CPU busy time an ET+ puts on an op other than the one that measured it, from the ET+
file alone (JSON or Chakra ``.et``, plain or gzip).

For every linked CPU op that is not a communication node, its *measured* busy time is its
exclusive time less its blocked time; the busy time the ET+ *keeps* on it is the simulated
duration of its node less the host time folded into it (host time between ops is nobody's op
time), plus the simulated durations of its later pieces (nodes whose ``continues`` names it),
less the host time folded into them.

    share = Σ |kept − measured| / Σ measured        (over those ops)

The share counts the format's rounding too: a ``.et`` holds whole µs (each value rounded along
its thread, so an op's nodes are within 1 µs of its time), which on ops of tens of µs is 0.5-0.8%
alone with no op off by more than 1 µs. So also printed: the share beyond the format's resolution
(each op's difference less 1 µs in a ``.et``, 0.001 µs in JSON, never below 0), and the ops whose
kept time differs from the measured by more than ``--tolerance`` µs (1 by default). Exit status 1
when the share beyond the resolution is above ``--max-share`` (percent), so a script can check a
file (2, after a one-line message, when a file cannot be read as an ET+); the JSON, exact to its 3
decimals, is where the share itself is read.

Usage: python scripts/attribution.py OUT.json|OUT.et [...] [--max-share 0.5] [--tolerance 1] [--json]

The fields read: ET+ JSON ``exclusive_dur``, ``blocked_dur``, ``host_gap_dur``, ``sim_dur``,
``continues``, ``comm_type`` and ``comm_size`` (communication nodes), ``ts`` (linked ops have one); ``.et`` attributes
``exclusive_dur_micros``, ``blocked_micros``, ``host_gap_micros``, ``continues``, ``is_cpu_op``
and ``duration_micros`` (docs/formats.md). No et-link code computes the figures; the ``.et``
frames are read with the schema's generated protobuf classes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from google.protobuf.message import DecodeError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _open(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def ops_from_json(data: bytes) -> tuple[dict, dict]:
    """(measured busy µs of each linked CPU op by id, kept busy µs by id) of an ET+ JSON."""
    nodes = json.loads(data)["nodes"]
    measured, kept = {}, {}
    for node in nodes:
        if "continues" in node:
            continue
        if node.get("cat") is not None or "ts" not in node:
            continue
        if node.get("comm_type") is not None or node.get("comm_size") is not None:  # a collective, send or receive
            continue
            continue
        if "exclusive_dur" not in node or "sim_dur" not in node:
            continue
        measured[node["id"]] = node["exclusive_dur"] - node.get("blocked_dur", 0)
        kept[node["id"]] = node["sim_dur"] - node.get("host_gap_dur", 0)
    for node in nodes:
        owner = node.get("continues")
        if owner in kept:
            kept[owner] += node.get("sim_dur", 0) - node.get("host_gap_dur", 0)
    return measured, kept


def ops_from_chakra(data: bytes) -> tuple[dict, dict]:
    """The same for a Chakra ``.et``: length-delimited frames, the first the metadata."""
    from linker.model import et_def_pb2 as pb

    def attr_value(attr):
        return getattr(attr, attr.WhichOneof("value")) if attr.WhichOneof("value") else None

    measured, kept, pieces = {}, {}, []
    position, first = 0, True
    while position < len(data):
        size, shift = 0, 0
        while True:
            byte = data[position]
            position += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        payload = data[position:position + size]
        position += size
        if first:
            first = False
            continue
        node = pb.Node.FromString(payload)
        attrs = {attr.name: attr_value(attr) for attr in node.attr}
        if "continues" in attrs:
            pieces.append((attrs["continues"], node.duration_micros - attrs.get("host_gap_micros", 0)))
            continue
        if node.type != pb.COMP_NODE or not attrs.get("is_cpu_op") or "exclusive_dur_micros" not in attrs:
            continue
        measured[node.id] = attrs["exclusive_dur_micros"] - attrs.get("blocked_micros", 0)
        kept[node.id] = node.duration_micros - attrs.get("host_gap_micros", 0)
    for owner, duration in pieces:
        if owner in kept:
            kept[owner] += duration
    return measured, kept


# The most an op's kept time can differ from its measured time by the format's rounding alone, µs:
# ET+ JSON writes 3 decimals; a ``.et`` whole µs, an op's nodes within 1 µs of its time together.
RESOLUTION_US = {"json": 0.001, "et": 1.0}


def attribution(path: Path, tolerance: float) -> dict:
    data = _open(path)
    form = "json" if data.lstrip()[:1] == b"{" else "et"
    measured, kept = (ops_from_json if form == "json" else ops_from_chakra)(data)
    total = sum(max(0.0, value) for value in measured.values())
    differences = {i: abs(kept[i] - max(0.0, measured[i])) for i in measured}
    moved = sum(differences.values())
    beyond = sum(max(0.0, d - RESOLUTION_US[form]) for d in differences.values())
    off = sorted(((d, i) for i, d in differences.items() if d > tolerance), reverse=True)
    return {"file": str(path), "ops": len(measured), "measured_us": round(total, 3),
            "share_pct": round(100 * moved / total, 4) if total else 0.0,
            "resolution_us": RESOLUTION_US[form],
            "share_beyond_resolution_pct": round(100 * beyond / total, 4) if total else 0.0,
            "ops_off": len(off), "worst": [{"id": i, "off_us": round(d, 3)} for d, i in off[:5]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--max-share", type=float, default=0.5, help="percent; above it: exit status 1")
    parser.add_argument("--tolerance", type=float, default=1.0, help="µs per op")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    failed, unreadable = False, False
    for path in args.files:
        try:
            row = attribution(path, args.tolerance)
        except (OSError, ValueError, KeyError, DecodeError) as err:  # not there, not an ET+: one line
            print(f"attribution.py: {path}: cannot read it as an ET+ ({type(err).__name__}: {err})", file=sys.stderr)
            unreadable = True
            continue
        failed = failed or row["share_beyond_resolution_pct"] > args.max_share
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['file']}: {row['ops']} ops, share on another op {row['share_pct']:.3f}% "
                  f"({row['share_beyond_resolution_pct']:.3f}% beyond the format's {row['resolution_us']:g} µs), "
                  f"{row['ops_off']} op(s) off by more than {args.tolerance:g} µs")
    return 2 if unreadable else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

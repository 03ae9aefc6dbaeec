"""The same ET links through Kineto, an nsys-schema and an nvprof-schema file of the same events.

``scripts/kineto_to_sqlite.py`` writes the SQLite files from a real Kineto capture (range text
from the real op names, seq and rf_id). The ET+ through each source must be the same: CPU
captures byte for byte; the GPU fixtures node for node, with GPU nodes keyed by correlation and
compared on times, stream, device and parent, except the GPU ops that Kineto reaches only through
an External id or an ``ac2g`` flow (no NVTX counterpart: computed here from the Kineto file) and
the collective args Kineto writes on NCCL kernels (``pg_name`` and what follows from it).
Both by rf_id join (op_id in the text) and by order alignment (op_id stripped).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import orjson
import pytest

from conftest import FIXTURES, ROOT, SHARED_TRACES
from linker.pipeline import link_pair

_spec = importlib.util.spec_from_file_location("kineto_to_sqlite", ROOT / "scripts" / "kineto_to_sqlite.py")
converter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(converter)

CPU_PAIRS = [FIXTURES / "cpu" / "mlp_steps", FIXTURES / "cpu" / "threads",
             SHARED_TRACES / "torch_cpu" / "mlp_1step", SHARED_TRACES / "torch_cpu" / "mlp_multistep",
             SHARED_TRACES / "torch_cpu" / "threads"]
GPU_PAIRS = [FIXTURES / "gpu" / "gpu_v111", FIXTURES / "gpu" / "shapes_cuda"]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
COMM_FIELDS = ("pg_name", "comm_type", "comm_size", "data_deps", "sim_dur", "blocked_dur", "host_gap_dur")


def _pair(directory: Path) -> tuple[Path, Path]:
    if not directory.exists():
        pytest.skip(f"shared traces not available ({directory})")
    return directory / "et.json.gz", directory / "kineto.json.gz"


def _link(et: Path, timing: Path, out: Path) -> tuple[bytes, object]:
    outcome = link_pair(et, timing, out)
    return out.read_bytes(), outcome.report


def _sources(kineto: Path, tmp: Path, strip: bool) -> list[Path]:
    nsys, nvprof = tmp / "trace.sqlite", tmp / "trace.nvvp"
    converter.write_nsys(kineto, nsys, strip_op_id=strip)
    converter.write_nvprof(kineto, nvprof, strip_op_id=strip)
    return [nsys, nvprof]


@pytest.mark.parametrize("strip", [False, True], ids=["rf_id", "order"])
@pytest.mark.parametrize("directory", CPU_PAIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cpu_capture_links_identically(directory, strip, tmp_path):
    et, kineto = _pair(directory)
    base = tmp_path / "base.json"
    if strip:  # the baseline is Kineto without record-function ids: order alignment on both sides
        kineto = _without_rf_ids(kineto, tmp_path / "kineto.json")
    expected, base_report = _link(et, kineto, base)
    for source in _sources(kineto, tmp_path, strip):
        got, report = _link(et, source, tmp_path / f"{source.suffix}.json")
        assert report.method == base_report.method == ("exact" if strip else "rf_id")
        assert got == expected, f"ET+ through {source.name} differs from the one through Kineto"
        if strip:
            assert any(r.startswith("seq check:") for r in report.method_reason)


def _without_rf_ids(kineto: Path, out: Path) -> Path:
    doc = json.loads(gzip.decompress(kineto.read_bytes()))
    for event in doc["traceEvents"]:
        (event.get("args") or {}).pop("Record function id", None)
    out.write_text(json.dumps(doc))
    return out


def _without_gpu_ops(kineto: Path, correlations: set, out: Path) -> Path:
    """A copy of ``kineto`` without the GPU ops of the given correlations (``kineto`` when none)."""
    if not correlations:
        return kineto
    raw = kineto.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (e.get("cat") in GPU_CATS and
                                                                 (e.get("args") or {}).get("correlation") in correlations)]
    out.write_text(json.dumps(doc))
    return out


def _unreachable_by_correlation(kineto: Path) -> set:
    """Correlations of GPU ops that no runtime event of the Kineto file carries, launched while
    tracing (those below the first launch's correlation ran before the trace: placed alike)."""
    raw = kineto.read_bytes()
    events = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]
    launches = {e["args"].get("correlation") for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    first = min(c for c in launches if isinstance(c, int))
    return {e["args"].get("correlation") for e in events
            if e.get("cat") in GPU_CATS and e["args"].get("correlation") not in launches
            and not (isinstance(e["args"].get("correlation"), int) and e["args"]["correlation"] < first)}


def _split(doc: dict) -> tuple[dict, dict]:
    """CPU nodes by id, GPU nodes by (correlation, start). A later piece of an op is known by (the op
    it continues, its start): its id lies above the GPU nodes', so it moves with their count (a
    source that reaches fewer GPU ops gives the same pieces other ids); dependencies on pieces are
    named the same way."""
    cpu, gpu = {}, {}
    piece_key = {n["id"]: ("piece", n["continues"], n["ts"]) for n in doc["nodes"] if "continues" in n}
    for node in doc["nodes"]:
        if node.get("cat") in GPU_CATS:
            gpu[node["correlation"], node["ts"]] = node
        else:
            fields = {k: v for k, v in node.items() if k not in COMM_FIELDS}
            if "data_deps" in fields:
                fields["data_deps"] = [piece_key.get(d, d) for d in fields["data_deps"]]
            fields.pop("id")
            cpu[piece_key.get(node["id"], node["id"])] = fields
    return cpu, gpu


@pytest.mark.parametrize("strip", [False, True], ids=["rf_id", "order"])
@pytest.mark.parametrize("directory", GPU_PAIRS, ids=lambda p: p.name)
def test_gpu_fixture_links_identically(directory, strip, tmp_path):
    et, kineto = _pair(directory)
    if strip:
        kineto = _without_rf_ids(kineto, tmp_path / "kineto.json")
    skipped = _unreachable_by_correlation(kineto)
    # The GPU ops no launch of the file reaches by correlation are not in an nsys export at all;
    # the CPU nodes depend on the GPU ops (a launching op is cut where its GPU op began), so the
    # baseline is the Kineto trace without them, which every source then holds alike.
    kineto = _without_gpu_ops(kineto, skipped, tmp_path / "kineto_reachable.json")
    expected, _ = _link(et, kineto, tmp_path / "base.json")
    base_cpu, base_gpu = _split(orjson.loads(expected))
    for source in _sources(kineto, tmp_path, strip):
        got, report = _link(et, source, tmp_path / f"{source.suffix}.json")
        cpu, gpu = _split(orjson.loads(got))
        assert cpu == base_cpu, f"CPU nodes through {source.name} differ"
        assert set(gpu) == set(base_gpu)
        for key, node in base_gpu.items():
            mine = gpu[key]
            for field in ("name", "cat", "ts", "dur", "stream", "device", "ctrl_deps"):
                assert mine.get(field) == node.get(field), (source.name, key, field)


def _rows_shuffled(source: Path, out: Path, seed: int) -> Path:
    """A copy of the nsys-schema file ``source`` whose range and API rows are stored in a random
    order (the reader reads rows in file order and sorts only threads that need it)."""
    import random
    import sqlite3

    out.write_bytes(source.read_bytes())
    conn = sqlite3.connect(out)
    for table in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        rows = conn.execute(f"SELECT * FROM {table}").fetchall()
        if not rows:
            continue
        random.Random(seed).shuffle(rows)
        conn.execute(f"DELETE FROM {table}")
        conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()
    conn.close()
    return out


@pytest.mark.parametrize("directory", [FIXTURES / "cpu" / "threads", FIXTURES / "gpu" / "gpu_v111"],
                         ids=lambda p: p.name)
def test_rows_in_any_order_link_identically(directory, tmp_path):
    et, kineto = _pair(directory)
    expected, _ = _link(et, kineto, tmp_path / "base.json")
    nsys = tmp_path / "trace.sqlite"
    converter.write_nsys(kineto, nsys)
    for seed in (1, 2):
        shuffled = _rows_shuffled(nsys, tmp_path / f"shuffled{seed}.sqlite", seed)
        import sqlite3

        with sqlite3.connect(shuffled) as conn:  # the ranges are indeed out of start order
            assert conn.execute("SELECT count(*) FROM NVTX_EVENTS a JOIN NVTX_EVENTS b ON b.rowid = a.rowid + 1 "
                                "AND b.globalTid = a.globalTid AND b.start < a.start").fetchone()[0] > 0
        got, report = _link(et, shuffled, tmp_path / f"shuffled{seed}.json")
        if directory.parent.name == "cpu":  # byte for byte as through Kineto (test above)
            assert got == expected
        assert got == _link(et, nsys, tmp_path / "in_order.json")[0]

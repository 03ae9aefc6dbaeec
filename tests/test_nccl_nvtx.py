"""NCCL message sizes from NCCL's NVTX payloads in an Nsight Systems capture (``linker.read.nccl_nvtx``).

No public capture holds the payloads (the shared ones hold NCCL's ranges and the payload
schemas, but their exports left the blobs out), so the captures here are written by
``scripts/kineto_to_sqlite.py --nccl-payloads`` from the GPU fixture ``gpu_v111`` (an all-to-all
and an all-reduce, with Kineto's collective args on their kernels), following NCCL's documented
payload layouts. Expected sizes are computed here from the raw Kineto JSON: "In msg nelems" ×
the bytes of its "dtype", as the Kineto reading of the same trace gives them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sqlite3

import pytest

from conftest import FIXTURES, ROOT, shared_trace
from linker.pipeline import link_pair
from linker.read.nccl_nvtx import Payloads
from linker.read.timing import TimingSelection, read_timing_trace

_spec = importlib.util.spec_from_file_location("kineto_to_sqlite", ROOT / "scripts" / "kineto_to_sqlite.py")
converter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(converter)

PAIR = FIXTURES / "gpu" / "gpu_v111"
KINETO = PAIR / "kineto.json.gz"
ELEMENT_BYTES = {"Float": 4}


def _expected() -> dict[int, tuple[str, int]]:
    """correlation -> (kernel name, bytes) of the fixture's NCCL kernels, from Kineto's args."""
    events = json.loads(gzip.decompress(KINETO.read_bytes()))["traceEvents"]
    return {e["args"]["correlation"]: (e["name"], e["args"]["In msg nelems"] * ELEMENT_BYTES[e["args"]["dtype"]])
            for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")}


EXPECTED = _expected()


@pytest.fixture
def capture(tmp_path):
    path = tmp_path / "nccl.sqlite"
    converter.write_nsys(KINETO, path, nccl_payloads=True)
    return path


def _nccl_kernels(path) -> dict:
    return {e.args.correlation: e for e in read_timing_trace(path).gpu_events if e.name.startswith("nccl")}


def _comm_nodes(output) -> dict:
    doc = json.loads(output.read_bytes())
    return {n["correlation"]: (n.get("comm_type"), n.get("comm_size")) for n in doc["nodes"]
            if n.get("cat") == "kernel" and n["name"].startswith("nccl")}


def test_payload_sizes_reach_the_nccl_kernels(capture):
    kernels = _nccl_kernels(capture)
    assert {c: (k.name, k.args.in_msg_nelems) for c, k in kernels.items()} == EXPECTED
    assert all(k.args.dtype == "Byte" for k in kernels.values())
    names = {k.args.collective_name for k in kernels.values()}
    assert names == {None, "AllReduce"}  # the all-to-all's group holds sends and receives
    assert "NCCL message sizes from NCCL's NVTX payloads: 2 of 2 NCCL kernels" in read_timing_trace(capture).notes


def test_without_an_et_the_capture_gives_the_sizes_kineto_gives(capture, tmp_path):
    outputs = {}
    for name, source in (("kineto", KINETO), ("nsys", capture)):
        outputs[name] = tmp_path / f"{name}.json"
        link_pair(None, source, outputs[name])
    ours, kineto = _comm_nodes(outputs["nsys"]), _comm_nodes(outputs["kineto"])
    assert ours == kineto
    assert {c: size for c, (_, size) in ours.items()} == {c: size for c, (_, size) in EXPECTED.items()}
    assert {kind for kind, _ in ours.values()} == {"ALL_TO_ALL", "ALL_REDUCE"}


def test_with_an_et_the_et_still_decides(capture, tmp_path):
    plain = tmp_path / "plain.sqlite"
    converter.write_nsys(KINETO, plain)
    with_payloads, without = tmp_path / "with.json", tmp_path / "without.json"
    link_pair(PAIR / "et.json.gz", capture, with_payloads)
    link_pair(PAIR / "et.json.gz", plain, without)
    assert with_payloads.read_bytes() == without.read_bytes()


def test_no_nccl_ranges_names_the_kernels_left_without_a_size(tmp_path):
    plain = tmp_path / "plain.sqlite"
    converter.write_nsys(KINETO, plain)
    trace = read_timing_trace(plain)
    assert all(k.args.in_msg_nelems is None for k in _nccl_kernels(plain).values())
    assert ("2 NCCL kernels and no NCCL NVTX ranges in the capture: their message size comes only from an ET "
            "(ncclKernel_AllReduce_RING_LL_Sum_float ×1, ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t ×1)") in trace.notes


def _edit(path, *statements) -> None:
    with sqlite3.connect(path) as db:
        for sql in statements:
            db.execute(sql)


def test_ranges_without_payloads_name_the_collectives_left_without_a_size(capture):
    _edit(capture, "UPDATE NVTX_EVENTS SET binaryData = NULL")
    trace = read_timing_trace(capture)
    assert all(k.args.in_msg_nelems is None for k in _nccl_kernels(capture).values())
    assert trace.notes[-2].startswith("NCCL message sizes from NCCL's NVTX payloads: 0 of 2 NCCL kernels (NCCL's "
                                      "ranges carry no payload in this export")
    assert trace.notes[-1] == ("NCCL kernels without a message size (it comes only from an ET): 1 under group of "
                               "ncclRecv ×2, ncclSend ×2 (no payload); 1 under ncclAllReduce (no payload)")


def test_reduce_scatter_is_the_per_rank_size_times_the_communicator_ranks(capture):
    """NCCL writes a reduce-scatter's output size; its input (what ET and Kineto count) is that
    times the communicator's ranks, read from the ncclCommInitRank range of the same communicator."""
    _edit(capture, "INSERT INTO StringIds (id, value) VALUES (999999, 'ncclReduceScatter')",
          "UPDATE NVTX_EVENTS SET textId = 999999 WHERE textId = (SELECT id FROM StringIds "
          "WHERE value = 'ncclAllReduce')")
    (corr, (_, size)), = [(c, v) for c, v in EXPECTED.items() if "AllReduce" in v[0]]
    kernel = _nccl_kernels(capture)[corr]
    assert (kernel.args.in_msg_nelems, kernel.args.collective_name) == (size * 2, "ReduceScatter")
    _edit(capture, "DELETE FROM NVTX_EVENTS WHERE textId = (SELECT id FROM StringIds WHERE value = 'ncclCommInitRank')")
    assert _nccl_kernels(capture)[corr].args.in_msg_nelems is None
    assert "1 under ncclReduceScatter (communicator size not in the capture)" in read_timing_trace(capture).notes[-1]


def test_payload_fields_are_read_where_every_schema_of_that_length_puts_them():
    db = sqlite3.connect(":memory:")
    db.executescript("""
        CREATE TABLE NVTX_PAYLOAD_SCHEMAS (schemaId INTEGER, payloadSize INTEGER);
        CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (schemaId INTEGER, name TEXT, "offset" INTEGER);
        INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (1, 16), (2, 24), (3, 24), (4, 8);
        INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (1, 'NCCL communicator ID', NULL),
            (1, 'Message size [bytes]', 8), (2, 'NCCL communicator ID', NULL), (2, 'Message size [bytes]', 8),
            (3, 'Bytes', 16), (4, 'Bytes', NULL);""")
    tables = {"NVTX_PAYLOAD_SCHEMAS": {"schemaId", "payloadSize"},
              "NVTX_PAYLOAD_SCHEMA_ENTRIES": {"schemaId", "name", "offset"}}
    payloads = Payloads(db, tables)
    sixteen = (7).to_bytes(8, "little") + (4096).to_bytes(8, "little")
    assert payloads.read(sixteen, "size") == 4096
    assert payloads.read(sixteen.hex(), "size") == 4096  # a hex text reads alike
    assert payloads.read((300).to_bytes(8, "little"), "size") == 300  # the older layout: size first
    assert payloads.read(bytes(24), "size") is None  # schemas 2 and 3 disagree on its place
    assert payloads.read(bytes(12), "size") is None  # no schema of that length
    assert payloads.read(None, "size") is None and payloads.read(b"", "size") is None


def _real_counts(path, pid: int) -> tuple[int, int, int]:
    """(NCCL kernels of the process, those whose launch lies in a ncclGroupEnd range of NCCL's
    domain on the launching thread, groups not made of exactly two sends and two receives),
    counted in SQL."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    nccl = ("FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            f"WHERE s.value LIKE 'nccl%' AND ((k.globalPid >> 24) & 16777215) = {pid}")
    correlations = [c for (c,) in db.execute(f"SELECT k.correlationId {nccl}")]
    launches = db.execute(f"""SELECT globalTid, start, "end" FROM CUPTI_ACTIVITY_KIND_RUNTIME
        WHERE correlationId IN ({', '.join(map(str, correlations))}) AND ((globalTid >> 24) & 16777215) = {pid}""")
    group_ends = db.execute("""SELECT n.globalTid, n.start, n."end" FROM NVTX_EVENTS n JOIN StringIds t
        ON t.id = n.textId WHERE n.domainId = 1 AND t.value = 'ncclGroupEnd'""").fetchall()
    total = len(correlations)
    in_group = sum(any(g == thread and s <= start and e >= end for g, s, e in group_ends)
                   for thread, start, end in launches)
    ranges = db.execute(f"""SELECT t.value FROM NVTX_EVENTS n JOIN StringIds t ON t.id = n.textId
        WHERE n.domainId = 1 AND ((n.globalTid >> 24) & 16777215) = {pid} ORDER BY n.globalTid, n.start""")
    odd, group = 0, None
    for (name,) in ranges:
        if name == "ncclGroupStart":
            group = []
        elif name == "ncclGroupEnd":
            odd += sorted(group or []) != ["ncclRecv", "ncclRecv", "ncclSend", "ncclSend"]
        elif group is not None and name in ("ncclSend", "ncclRecv"):
            group.append(name)
    db.close()
    return total, in_group, odd


def test_a_real_capture_without_payloads_says_which_collectives_have_no_size():
    path = shared_trace("nsys", "nsysai_mfu_2gpu_after.sqlite")
    total, in_group, odd = _real_counts(path, 148)
    assert odd == 0 and 0 < in_group < total
    notes = read_timing_trace(TimingSelection(path, 148)).notes
    assert notes[-3].startswith(f"NCCL message sizes from NCCL's NVTX payloads: 0 of {total} NCCL kernels (NCCL's "
                                "ranges carry no payload in this export")
    assert notes[-2] == ("NCCL kernels without a message size (it comes only from an ET): "
                         f"{in_group} under group of ncclRecv ×2, ncclSend ×2 (no payload)")
    assert notes[-1].startswith(f"{total - in_group} NCCL kernels launched outside every NCCL range")


def test_a_launch_belongs_to_the_range_it_began_in_whatever_the_rounding_of_its_end():
    """Epoch-ns times as µs floats: start + duration can exceed an equal range end by an ulp."""
    from linker.read.kineto import KinetoEvent
    from linker.read.nccl_nvtx import _Owner, _owner_of

    start_ns, dur_ns = 4458676634746160, 14399
    assert start_ns / 1000 + dur_ns / 1000 > (start_ns + dur_ns) / 1000  # the rounding this is about
    owner = _Owner((start_ns - 1) / 1000, (start_ns + dur_ns) / 1000, "ncclAllReduce", [])
    launch = KinetoEvent("X", "cuda_driver", "cuLaunchKernelEx", 7, 8, start_ns / 1000, dur_ns / 1000)
    assert _owner_of({(7, 8): [owner]}, launch) is owner
    assert _owner_of({(7, 9): [owner]}, launch) is None  # another thread

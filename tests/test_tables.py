"""The tables of a saved ET+ (``linker.load``), of a link (``linker.ops_table``'s blocked time) and of a
replay (``Simulation.nodes_table`` from one origin), against values computed here from the files
themselves (orjson), with pandas and as plain rows without it."""

from __future__ import annotations

import builtins
import gzip
import math
from collections import defaultdict

import orjson
import pytest

import linker
from conftest import dlrm_pair, fixture_pair
from linker.model.errors import TraceInputError

THREADS_PAIR = fixture_pair("cpu", "autograd_threads")  # four threads: joins, a wait in aten::mul_
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@pytest.fixture(scope="module")
def threads_outputs(tmp_path_factory):
    """The autograd_threads pair linked twice (a result is written once): ET+ JSON and ``.et``."""
    out = tmp_path_factory.mktemp("tables")
    json_path = linker.write_et_plus(linker.link_traces(*THREADS_PAIR), out / "threads.json").output
    et_path = linker.write_et_plus(linker.link_traces(*THREADS_PAIR), out / "threads.et").output
    return json_path, et_path


def json_nodes(path) -> list[dict]:
    data = path.read_bytes()
    return orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)["nodes"]


def expected_ops(nodes: list[dict]) -> dict[int, dict]:
    """Per op id, from the ET+ JSON alone: its measured, exclusive, blocked and busy time (a linked
    CPU op: max(0, exclusive - blocked), docs/durations.md; a GPU op: its duration; else 0), the host
    gaps of its node and of its later pieces, and how many pieces it has."""
    ops = {}
    for node in nodes:
        if "continues" in node:
            continue
        gpu = node.get("cat") in GPU_CATS
        if gpu:
            busy = node["dur"]
        elif "exclusive_dur" in node:
            busy = max(0.0, node["exclusive_dur"] - node.get("blocked_dur", 0))
        else:
            busy = node.get("sim_dur", 0) - node.get("host_gap_dur", 0)
        ops[node["id"]] = {"name": node["name"], "measured": node.get("inclusive_dur", node.get("dur", math.nan)),
                           "exclusive": node.get("exclusive_dur", math.nan), "blocked": node.get("blocked_dur", 0),
                           "busy": busy, "host_gap": node.get("host_gap_dur", 0), "pieces": 0}
    for node in nodes:
        if "continues" in node:
            op = ops[node["continues"]]
            op["host_gap"] += node.get("host_gap_dur", 0)
            op["pieces"] += 1
    return ops


def close(a: float, b: float, tolerance: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance


def test_saved_json_tables_hold_what_the_file_holds(threads_outputs):
    pytest.importorskip("pandas", reason="needs pandas")
    json_path, _ = threads_outputs
    nodes = json_nodes(json_path)
    saved = linker.load(json_path)
    table = saved.nodes_table()
    assert len(table) == len(nodes) and list(table["id"]) == [node["id"] for node in nodes]
    assert table["sim_us"].sum() == pytest.approx(sum(node.get("sim_dur", 0) for node in nodes), abs=1e-6)
    assert table["blocked_us"].sum() == pytest.approx(sum(node.get("blocked_dur", 0) for node in nodes), abs=1e-6)
    pieces = table[table["continues"].notna()]
    assert len(pieces) == sum("continues" in node for node in nodes) > 0
    assert pieces["exclusive_us"].isna().all()

    expected = expected_ops(nodes)
    ops = saved.ops_table()
    assert sorted(ops["id"]) == sorted(expected)
    for row in ops.itertuples():
        want = expected[row.id]
        assert row.pieces == want["pieces"]
        for column, key in (("measured_us", "measured"), ("exclusive_us", "exclusive"), ("blocked_us", "blocked"),
                            ("host_gap_us", "host_gap")):
            assert close(getattr(row, column), want[key], 1e-6), (row.id, column)
        # the op's node and its pieces hold its exclusive time less its blocked time (3 decimals each)
        assert close(row.busy_us, want["busy"], 1e-3 * (1 + row.pieces)), (row.id, row.busy_us, want)
    assert ops["sim_us"].sum() == pytest.approx(table["sim_us"].sum(), abs=1e-6)

    names = saved.op_names_table()
    by_name = defaultdict(lambda: [0, 0.0, 0.0])
    for op in expected.values():
        total = by_name[op["name"]]
        total[0] += 1
        total[1] += op["blocked"]
        total[2] += op["busy"]
    assert sorted(names["name"]) == sorted(by_name) and len(names) == len(by_name)  # one kind per name here
    for row in names.itertuples():
        count, blocked, busy = by_name[row.name]
        assert row.ops == count and close(row.blocked_us, blocked, 1e-6) and close(row.busy_us, busy, 0.05)
    assert list(names["busy_us"]) == sorted(names["busy_us"], reverse=True)
    assert names.groupby("kind")["busy_share"].sum().round(9).eq(1).all()


def test_where_time_goes_ranks_work_not_waiting(threads_outputs):
    """The main thread waits 18 ms in ``## main:join_threads ##`` for the workers: by exclusive time
    it would be first; by busy time it ranks below the ops that worked, its wait in blocked_us."""
    pytest.importorskip("pandas", reason="needs pandas")
    names = linker.load(threads_outputs[0]).op_names_table()
    join = names[names["name"] == "## main:join_threads ##"].iloc[0]
    assert names.sort_values("exclusive_us", ascending=False).iloc[0]["name"] == "## main:join_threads ##"
    assert join["blocked_us"] > 0.9 * join["exclusive_us"] > 10_000
    # its node and its part after the wait (the join edges' target), 3 decimals each
    assert join["busy_us"] == pytest.approx(join["exclusive_us"] - join["blocked_us"], abs=2e-3)
    assert names.index[names["name"] == "## main:join_threads ##"][0] > 3


def test_backward_of_a_real_rank_ranks_by_its_work(tmp_path):
    """param_dlrm rank 0: ``## backward ##`` spans 4.3 ms of exclusive time, 4.1 ms of it blocked."""
    pytest.importorskip("pandas", reason="needs pandas")
    pair = dlrm_pair(0)  # skips without ../shared/traces
    saved = linker.load(linker.write_et_plus(linker.link_traces(*pair), tmp_path / "dlrm0.json").output)
    names = saved.op_names_table()
    backward = names[names["name"] == "## backward ##"].iloc[0]
    raw = [node for node in json_nodes(saved.path) if node["name"] == "## backward ##" and "continues" not in node]
    assert backward["blocked_us"] == pytest.approx(sum(node["blocked_dur"] for node in raw), abs=1e-6)
    assert backward["blocked_us"] > 4000
    assert backward["busy_us"] < 0.1 * backward["exclusive_us"]
    assert names.index[names["name"] == "## backward ##"][0] > 5


def test_json_and_et_loads_of_one_link_agree(threads_outputs):
    """The ``.et`` holds whole µs: each time within 0.5 µs, a node's sim time (rounded as a running
    total) and an op's nodes together within 1 µs (docs/durations.md)."""
    pytest.importorskip("pandas", reason="needs pandas")
    json_path, et_path = threads_outputs
    from_json, from_et = linker.load(json_path), linker.load(et_path)
    assert (from_json.format, from_et.format) == ("json", "et")
    a = from_json.ops_table().set_index("id")
    b = from_et.ops_table().set_index("id").loc[a.index]
    assert (a["name"] == b["name"]).all() and (a["kind"] == b["kind"]).all() and (a["pieces"] == b["pieces"]).all()
    assert (a["tid"] == b["tid"]).all()
    for column, tolerance in (("ts_us", 0.5), ("measured_us", 0.5), ("exclusive_us", 0.5), ("blocked_us", 0.5),
                              ("sim_us", 1.0)):
        gap = (a[column] - b[column]).abs()
        assert ((gap <= tolerance + 1e-6) | (a[column].isna() & b[column].isna())).all(), column
    gap_tolerance = 0.5 * (1 + a["pieces"]) + 1e-6
    assert ((a["host_gap_us"] - b["host_gap_us"]).abs() <= gap_tolerance).all()
    assert ((a["busy_us"] - b["busy_us"]).abs() <= 1 + gap_tolerance).all()
    assert sorted(from_json.ids) == sorted(from_et.ids)


def test_rows_without_pandas_are_the_tables(threads_outputs, monkeypatch):
    pandas = pytest.importorskip("pandas", reason="needs pandas")
    saved = linker.load(threads_outputs[1])
    simulation = linker.simulate(threads_outputs[1])
    tables = {name: getattr(saved, name) for name in ("nodes_table", "ops_table", "op_names_table")}
    tables["replayed nodes"] = simulation.nodes_table
    frames = {name: table() for name, table in tables.items()}
    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("no pandas")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    for name, frame in frames.items():
        with pytest.raises(ImportError, match="as_rows=True"):
            tables[name]()
        rows = tables[name](as_rows=True)
        assert isinstance(rows, list) and list(rows[0]) == list(frame.columns)
        for row, record in zip(rows, frame.to_dict("records")):
            assert all(close(row[key], value, 0) if isinstance(row[key], float) else
                       (row[key] is None and value is pandas.NA) or row[key] == value for key, value in record.items())
    assert linker.load(threads_outputs[0]).op_names_table(as_rows=True)[0]["busy_us"] > 0


def test_load_refuses_what_is_not_an_et_plus(tmp_path):
    missing = tmp_path / "absent.json"
    with pytest.raises(TraceInputError, match="absent.json"):
        linker.load(missing)
    with pytest.raises(TraceInputError, match="link it first") as unlinked:  # an ET before linking
        linker.load(THREADS_PAIR[0])
    assert unlinked.value.path == str(THREADS_PAIR[0])
    with pytest.raises(TraceInputError, match="not an ET\\+ JSON document"):  # a Kineto trace
        linker.load(THREADS_PAIR[1])
    garbage = tmp_path / "garbage.et"
    garbage.write_bytes(b"\x05\x01\x02\x03\x04\x05\x99\x99\x99")
    with pytest.raises(TraceInputError, match="garbage.et"):
        linker.load(garbage)


def test_ops_table_of_a_link_has_the_blocked_time_the_et_plus_writes(tmp_path):
    pytest.importorskip("pandas", reason="needs pandas")
    result = linker.link_traces(*THREADS_PAIR)
    ops = linker.ops_table(result).set_index("id")
    written = linker.write_et_plus(result, tmp_path / "after.json").output  # still writable, unchanged
    fresh = linker.write_et_plus(linker.link_traces(*THREADS_PAIR), tmp_path / "fresh.json").output
    assert written.read_bytes() == fresh.read_bytes()
    for node in json_nodes(written):
        if "blocked_dur" in node and "continues" not in node:
            row = ops.loc[node["id"]]
            assert row["blocked_us"] == pytest.approx(node["blocked_dur"], abs=1e-3)
            assert row["busy_us"] == pytest.approx(max(0.0, node["exclusive_dur"] - node["blocked_dur"]), abs=2e-3)
    assert ops["blocked_us"].max() > 10_000  # the main thread's join
    assert linker.ops_table(result, as_rows=True)[0].keys() == set(ops.reset_index().columns)


def test_replayed_nodes_share_the_replays_origin(threads_outputs):
    """One rank: replay time 0 is its first measured start, so a node's measured start on the
    replay's clock is its ts less the file's earliest ts, and drift is simulated minus measured."""
    pytest.importorskip("pandas", reason="needs pandas")
    json_path, _ = threads_outputs
    first = min(node["ts"] for node in json_nodes(json_path) if "ts" in node)
    nodes = linker.simulate(json_path, model="lanes").nodes_table()
    timed = nodes[nodes["ts_us"].notna()]
    assert ((timed["measured_start_us"] - (timed["ts_us"] - first)).abs() < 1e-6).all()
    assert timed["measured_start_us"].min() == 0 and nodes["start_us"].min() == 0
    assert ((timed["drift_us"] - (timed["start_us"] - timed["measured_start_us"])).abs() < 1e-9).all()
    assert timed.sort_values("measured_start_us").iloc[0]["drift_us"] == 0  # the first op starts the replay

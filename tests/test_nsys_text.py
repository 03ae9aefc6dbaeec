"""``timing_model.split_ids`` against SQLite's own string functions.

The first version of the nsys reader cut seq and op_id out of PyTorch's range text in SQL; the
reader now does it in Python (``split_ids``). Here SQLite evaluates that SQL (instr, substr,
ltrim, CAST: an implementation independent of Python's) on the texts of the real captures in
``../shared/traces/nsys`` and on edge cases, and the two must agree on every text.
"""

from __future__ import annotations

import sqlite3

import pytest

from conftest import SHARED_TRACES
from linker.read.timing_model import cpu_events, parse_range_text, split_ids

# The SQL of the first reader: core (the text without ", seq = N, op_id = M"), op_id, seq.
ORACLE = """
SELECT CASE WHEN ps = 0 AND po = 0 THEN t ELSE substr(t, 1, (CASE WHEN ps > 0 AND (po = 0 OR ps < po)
         THEN ps ELSE po END) - 1) || coalesce(substr(substr(t, a), nullif(instr(substr(t, a), ', '), 0)), '') END,
       CASE WHEN po > 0 THEN CAST(substr(t, po + 10) AS INTEGER) END,
       CASE WHEN ps > 0 THEN CAST(ltrim(substr(t, ps + 5), ' =') AS INTEGER) END
FROM (SELECT t, ps, po, CASE WHEN po > 0 THEN po + 10 ELSE ps + 5 END AS a
      FROM (SELECT ? AS t, instr(?, ', seq') AS ps, instr(?, ', op_id = ') AS po))
"""

EDGE_CASES = [
    "aten::mm", "", "aten::mm, seq = 12, op_id = 345, sizes = [[2, 3], [3, 4]]",
    "aten::mm, op_id = 345", "aten::mm, seq = 12", "aten::mm, op_id = 345, sizes = [[1]], input_op_ids = [3, 4]",
    "MulBackward0, seq = 0, op_id = 7", "x, seq=5", "x, stashed seq=5", "x, seq = -3, op_id = 9",
    "x, op_id = 9, seq = 2, sizes = [[]]", "x, seq = , op_id = ", "x, op_id = abc", "x, op_id = 12abc, y",
    "x, seq =\t7", "x, op_id = +4", "x, seq = ²", "x, op_id = 1_000", "x, op_id = 5,", "a, b, c",
    "x, seq = 1 , op_id = 2 ,", "ünïcode::op, seq = 3, op_id = 4, sizes = [[5]]",
    "x, op_id = 9, seq = 2", "x, sequence, seq = 5, op_id = 1", "x, seq = 5, op_id = 1,y", "x, seq = 5,6, op_id = 1",
    "x, seq = 5, op_id = 1, seq = 3", "x, op_id = 1, op_id = 2", "x, op_id = 7", "x, seq = 07, op_id = 007, a",
]


def _real_texts() -> list[str]:
    texts = []
    for path in sorted((SHARED_TRACES / "nsys").glob("*.sqlite")):
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "NVTX_EVENTS" in tables:
            texts += [t for (t,) in conn.execute(
                "SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId")
                if t is not None]
        if "StringTable" in tables:
            texts += [t for (t,) in conn.execute("SELECT value FROM StringTable") if t is not None]
        conn.close()
    return texts


def _read_back(texts: list[str]) -> list[tuple]:
    """(name, op_id, seq) of each text as ``cpu_events`` reads it (its own way to the split)."""
    rows = [(text, 1, 1, float(k), 1.0) for k, text in enumerate(texts)]
    return [(e.name, e.args.rf_id, e.args.seq) for e in cpu_events(rows, in_order=True)]


def _agrees_with_sqlite(texts: list[str]) -> None:
    """``split_ids`` of each text is SQLite's evaluation of the first reader's SQL, and
    ``cpu_events`` reads the names, op_ids and seqs that split gives."""
    conn = sqlite3.connect(":memory:")
    expected = []
    for text in texts:
        core, op_id, seq = conn.execute(ORACLE, (text, text, text)).fetchone()
        assert split_ids(text) == (core, op_id, seq), text
        name, _, old_seq, _ = parse_range_text(core)
        expected.append((name, op_id, seq if seq is not None else old_seq))
    assert _read_back(texts) == expected


def test_split_ids_agrees_with_sqlite_on_edge_cases():
    _agrees_with_sqlite(EDGE_CASES)


def test_split_ids_agrees_with_sqlite_on_real_captures():
    texts = _real_texts()
    if not texts:
        pytest.skip("shared traces not available")
    with_ids = [t for t in texts if ", op_id = " in t or ", seq" in t]
    assert len(with_ids) > 10_000  # the captures with PyTorch ranges hold tens of thousands
    _agrees_with_sqlite(texts)

"""Write an Nsight Systems SQLite export as the two JSON exports nsys makes of the same capture
(tests only: no public ``--type json`` file exists, and the shared SQLite captures have no JSON
twin). Written from the documented facts (../shared/docs/NSYS_JSON.md), not from et-link's reader:

- ``write_json`` (``nsys export --type json``): one protobuf message per line. Events first, in
  start order (each table's rows keep their order): ``NVTX_EVENTS`` rows as ``{"Type":
  eventType, "NvtxEvent": {…}}`` (PascalCase), ``CUPTI_ACTIVITY_KIND_RUNTIME`` as Type 48
  ``TraceProcessEvent``, ``_KERNEL`` as Type 79 ``CudaEvent`` + ``kernel{}``, ``_MEMCPY`` /
  ``_MEMSET`` as Type 80 + ``memcpy{}`` / ``memset{}``, ``_SYNCHRONIZATION`` as Type 106 +
  ``sync{}``, ``PROCESSES`` as Type 27 ``CommEvent``; then the strings, either one line
  ``{"data": [...]}`` (index = id: ids renumbered densely, every reference with them) or one
  ``{"type":"String",…}`` line per string (``strings="lines"``); then the thread names.
  64-bit integers are JSON strings (``int64="number"``: numbers), 32-bit ones numbers; fields
  at their default (0, "", NULL) are left out.
- ``write_jsonlines`` (``--type jsonlines``): every row of every table as one object,
  ``"table"`` and the non-NULL columns, keys sorted, integers as numbers (BLOBs left out).
"""

from __future__ import annotations

import gzip
import heapq
import sqlite3
from pathlib import Path

import orjson

NVTX, RUNTIME, KERNEL = "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY, MEMSET, SYNC = "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    db.row_factory = sqlite3.Row
    db.text_factory = lambda raw: raw.decode("utf-8", "replace")  # a few metadata texts are not UTF-8
    return db


def _tables(db) -> list[str]:
    return [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")]


WRITTEN = {  # the columns each event kind writes (those a table lacks read as NULL)
    NVTX: ("start", "end", "eventType", "text", "textId", "globalTid", "domainId"),
    RUNTIME: ("start", "end", "correlationId", "eventClass", "nameId", "globalTid", "returnValue"),
    KERNEL: ("start", "end", "correlationId", "deviceId", "contextId", "streamId", "globalPid", "shortName",
             "demangledName", "mangledName", "gridX", "blockX", "registersPerThread"),
    MEMCPY: ("start", "end", "correlationId", "deviceId", "contextId", "streamId", "globalPid", "bytes", "copyKind",
             "srcKind", "dstKind"),
    MEMSET: ("start", "end", "correlationId", "deviceId", "contextId", "streamId", "globalPid", "bytes", "memKind",
             "value"),
    SYNC: ("start", "end", "correlationId", "deviceId", "contextId", "streamId", "globalPid", "eventId", "syncType"),
    "PROCESSES": ("globalPid", "name"),
    "StringIds": ("id", "value"),
    "ThreadNames": ("nameId", "priority", "globalTid"),
}


def _rows(db, table: str, tables: list[str]) -> list[dict]:
    """The rows of ``table`` in file order, as dicts of its ``WRITTEN`` columns."""
    if table not in tables:
        return []
    present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    columns = WRITTEN[table]
    select = ", ".join(f'"{c}"' if c in present else "NULL" for c in columns)
    db.row_factory = None
    rows = [dict(zip(columns, row)) for row in db.execute(f"SELECT {select} FROM {table} ORDER BY rowid")]
    db.row_factory = sqlite3.Row
    return rows


def _save(out: Path, lines: list[bytes], compress: bool) -> Path:
    text = b"\n".join(lines) + b"\n"
    out.write_bytes(gzip.compress(text, compresslevel=1) if compress else text)
    return out


def write_jsonlines(sqlite_path: Path, out: Path, compress: bool = False) -> Path:
    """``sqlite_path`` as ``nsys export --type jsonlines`` writes it."""
    db = _open(sqlite_path)
    db.row_factory = None
    lines = []
    dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS
    for table in _tables(db):
        cursor = db.execute(f"SELECT * FROM {table} ORDER BY rowid")
        columns = [column[0] for column in cursor.description]
        for row in cursor:
            record = {key: value for key, value in zip(columns, row) if value is not None and type(value) is not bytes}
            record["table"] = table
            lines.append(dumps(record, option=sort))
    db.close()
    return _save(out, lines, compress)


def write_json(sqlite_path: Path, out: Path, strings: str = "table", int64: str = "string",
               compress: bool = False) -> Path:
    """``sqlite_path`` as ``nsys export --type json`` writes it (``strings``: "table" for the
    one-line string table, "lines" for ``--separate-strings``)."""
    db = _open(sqlite_path)
    tables = _tables(db)
    string_rows = _rows(db, "StringIds", tables)
    if strings == "table":  # the array's index is the id: dense ids, references renumbered
        new_id = {row["id"]: k for k, row in enumerate(sorted(string_rows, key=lambda r: r["id"]))}
    else:
        new_id = {row["id"]: row["id"] for row in string_rows}

    def big(value):  # a 64-bit protobuf field
        return str(value) if int64 == "string" else value

    def sid(value):
        return big(new_id.get(value, value))

    def fields(**values) -> dict:  # proto3: defaults left out
        return {key: value for key, value in values.items() if value is not None and value != 0 and value != ""
                and value != "0"}

    def activity(row, **more) -> dict:
        return fields(startNs=big(row["start"]), endNs=big(row["end"]), correlationId=row.get("correlationId"),
                      deviceId=row.get("deviceId"), contextId=big(row.get("contextId") or 0),
                      streamId=big(row.get("streamId") or 0), globalPid=big(row.get("globalPid") or 0), **more)

    streams = []
    streams.append([(r["start"], {"Type": r["eventType"], "NvtxEvent": fields(
        Type=r["eventType"], Timestamp=big(r["start"]),
        EndTimestamp=big(r["end"]) if r["end"] is not None else None, Text=r.get("text"),
        TextId=sid(r["textId"]) if r.get("textId") is not None else None,
        GlobalTid=big(r.get("globalTid") or 0), DomainId=big(r.get("domainId") or 0), NsTime=True)})
        for r in _rows(db, NVTX, tables)])
    streams.append([(r["start"], {"Type": 48, "TraceProcessEvent": fields(
        startNs=big(r["start"]), endNs=big(r["end"]), correlationId=r["correlationId"],
        eventClass=r.get("eventClass"), name=sid(r["nameId"]), globalTid=big(r["globalTid"]),
        returnValue=big(r.get("returnValue") or 0))}) for r in _rows(db, RUNTIME, tables)])
    streams.append([(r["start"], {"Type": 79, "CudaEvent": activity(r, eventClass=3, kernel=fields(
        shortName=sid(r["shortName"]), demangledName=sid(r["demangledName"]),
        mangledName=sid(r["mangledName"]) if r.get("mangledName") is not None else None,
        gridX=r.get("gridX"), blockX=r.get("blockX"), registersPerThread=r.get("registersPerThread")))})
        for r in _rows(db, KERNEL, tables)])
    streams.append([(r["start"], {"Type": 80, "CudaEvent": activity(r, eventClass=1, memcpy=fields(
        sizebytes=big(r.get("bytes") or 0), copyKind=r.get("copyKind"), srcKind=r.get("srcKind"),
        dstKind=r.get("dstKind")))}) for r in _rows(db, MEMCPY, tables)])
    streams.append([(r["start"], {"Type": 80, "CudaEvent": activity(r, eventClass=2, memset=fields(
        sizebytes=big(r.get("bytes") or 0), memKind=r.get("memKind"), value=r.get("value")))})
        for r in _rows(db, MEMSET, tables)])
    streams.append([(r["start"], {"Type": 106, "CudaEvent": activity(r, eventClass=5, sync=fields(
        eventId=big(r.get("eventId") or 0), syncType=r.get("syncType")))}) for r in _rows(db, SYNC, tables)])
    streams.append([(0, {"Type": 27, "CommEvent": fields(GlobalPid=big(r.get("globalPid") or 0),
                                                         Command=r.get("name"))})
                    for r in _rows(db, "PROCESSES", tables)])
    events = heapq.merge(*streams, key=lambda item: item[0])
    lines = [orjson.dumps(event) for _, event in events]
    if strings == "table":
        table = [""] * len(new_id)
        for row in string_rows:
            table[new_id[row["id"]]] = row["value"]
        lines.append(orjson.dumps({"data": table}))
    else:
        lines += [orjson.dumps({"type": "String", "id": big(row["id"]), "value": row["value"]}) for row in string_rows]
    threads = _rows(db, "ThreadNames", tables)
    if strings == "table" and threads:
        lines.append(orjson.dumps({"data": [fields(nameIdx=sid(t["nameId"]), priority=big(t.get("priority") or 0),
                                                   globalTid=big(t["globalTid"])) for t in threads]}))
    else:
        lines += [orjson.dumps({"type": "ThreadName", **fields(globalTid=big(t["globalTid"]), nameId=sid(t["nameId"]),
                                                               priority=big(t.get("priority") or 0))})
                  for t in threads]
    db.close()
    return _save(out, lines, compress)

"""Read Nsight Systems' JSON exports into the tables the SQLite reader (``linker.read.nsys``) reads.

Two forms, plain or gzip, told apart by the content of their first line, never by the name
(``linker.read.nsys_json_form``); the facts: ../shared/docs/NSYS_JSON.md; the mapping: docs/nsys.md.

- ``nsys export --type json`` (``FORM_JSON``): one protobuf message per line. Events
  ``{"Type":N,"<Kind>Event":{…}}`` first (48 ``TraceProcessEvent``: a CUDA runtime / driver call;
  59 / 60 ``NvtxEvent``: push-pop / start-end range, PascalCase fields; 79 ``CudaEvent`` with
  ``kernel{…}``; 80 ``CudaEvent`` with ``memcpy{…}`` or ``memset{…}``; every other type is
  skipped), then the string table, as one line ``{"data":["[Unknown]",…]}`` (id = index) or one
  line per string ``{"type":"String","id":"3720","value":"…"}``, then streams and thread names
  (skipped). 64-bit integers are JSON strings, 32-bit ones numbers (either is read as either); a
  field at its default value is left out (read as 0; a range without ``EndTimestamp`` never
  closed); enum fields given by name (``CUDA_MEMCPY_KIND_HTOD``) are read by their last word.
- ``nsys export --type jsonlines`` (``FORM_JSON_LINES``): one object per line whose ``"table"``
  names the SQLite table the row would sit in and whose keys are its column names; a column that
  is NULL is left out. Rows of the tables read go into those tables (CUDA graphs traced as a
  whole included: ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``); others are skipped.

Each line becomes the row the SQLite export holds (in file order, so rowids keep it), in an
in-memory SQLite database of only the tables and columns the SQLite reader reads; that reader
then reads it as it reads a file (``read_nsys``), so both give the same trace and the same ET+.
A column counts as present when some row has it (a JSON Lines file leaves NULL columns out; the
SQLite reader chooses, e.g., the kernel's demangled name only when it has one).

Bad input is refused in one line naming the file and the line (``TraceInputError``): a line
that is not JSON, a value of the wrong type in a field read, an event after the string table
(``--type json``), a line of the other form or of no nsys form (two files joined), a string id
given twice, an export whose string table is missing while its ids are used. A last line cut
short (no newline after it) is left out with a warning, as are string ids no string names
(their names read as empty) and an export without any CUDA rows (CPU ops only).

Cost: lines are decoded by msgspec, ``CHUNK_BYTES`` of text at a time (``decode_lines``: typed
structs of only the fields read, in C), grouped by table or event type with a stable sort (C),
made into tuples by ``attrgetter`` and inserted a hundred-odd rows a statement; a chunk that
fails to decode is decoded again line by line to name the line. No per-line Python but for the
lines that follow the events (strings, thread names) and the memory operations.
Peak memory: the file's text (mapped when plain), one chunk's structs, the database's rows.
"""

from __future__ import annotations

import sqlite3
from itertools import chain, groupby
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import orjson

from linker.model.errors import TraceInputError
from linker.read.files import collector_paused, read_trace_bytes
from linker.read.nsys_json_form import FORM_JSON, FORM_JSON_LINES, FORM_WORDS
from linker.read.sqlite_source import (TABLE_GRAPH_TRACE, TABLE_KERNEL, TABLE_MEMCPY, TABLE_MEMSET, TABLE_NVTX,
                                      TABLE_RUNTIME, TABLE_STRINGS)
from linker.read.timing_model import MEMCPY_KINDS, MEMORY_KINDS

CHUNK_BYTES = 1 << 23  # text decoded per decode_lines call
MAX_SQL_VARIABLES = 999  # SQLite's smallest limit on a statement's parameters (builds before 3.32)

METADATA_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
GPU_ACTIVITY = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
# The tables and columns the SQLite reader reads (linker.read.nsys), in insertion order.
COLUMNS = {
    TABLE_NVTX: ("start", "end", "eventType", "text", "textId", "globalTid", "domainId"),
    TABLE_RUNTIME: ("start", "end", "eventClass", "globalTid", "correlationId", "nameId"),
    TABLE_KERNEL: (*GPU_ACTIVITY, "demangledName", "shortName"),
    TABLE_MEMCPY: (*GPU_ACTIVITY, "copyKind", "srcKind", "dstKind"),
    TABLE_MEMSET: (*GPU_ACTIVITY, "memKind"),
    TABLE_GRAPH_TRACE: (*GPU_ACTIVITY, "graphId"),
    TABLE_STRINGS: ("id", "value"),
    **{table: ("name", "value") for table in METADATA_TABLES},
}
# Columns whose absence changes what the SQLite reader reads (the rest read NULL as absent).
OPTIONAL_COLUMNS = {TABLE_NVTX: ("end", "text", "textId", "domainId"), TABLE_RUNTIME: ("eventClass", "nameId"),
                    TABLE_KERNEL: ("demangledName", "shortName"), TABLE_MEMCPY: ("srcKind", "dstKind"),
                    TABLE_MEMSET: ("memKind",), TABLE_GRAPH_TRACE: ("graphId",)}
CUDA_TABLES = (TABLE_RUNTIME, TABLE_KERNEL, TABLE_MEMCPY, TABLE_MEMSET, TABLE_GRAPH_TRACE)
# nsys's event types (ENUM_NSYS_EVENT_TYPE) of the --type json lines read.
TYPE_API_CALL, TYPE_PUSH_POP, TYPE_START_END, TYPE_KERNEL, TYPE_MEMORY_OP = 48, 59, 60, 79, 80
MEMSET_EVENT_CLASS = 2


# -- the lines, as typed structs (only the fields read; strict=False: "123" reads as 123) ---------

class TableRow(msgspec.Struct):
    """A ``--type jsonlines`` row: the table and the columns read (absent: NULL)."""

    table: str = ""
    start: int | None = None
    end: int | None = None
    eventType: int | None = None
    text: str | None = None
    textId: int | None = None
    globalTid: int | None = None
    domainId: int | None = None
    eventClass: int | None = None
    correlationId: int | None = None
    nameId: int | None = None
    deviceId: int | None = None
    streamId: int | None = None
    globalPid: int | None = None
    demangledName: int | None = None
    shortName: int | None = None
    copyKind: int | None = None
    srcKind: int | None = None
    dstKind: int | None = None
    graphId: int | None = None
    memKind: int | None = None
    id: Any = None
    value: Any = None
    name: Any = None


class ApiCall(msgspec.Struct):
    """``TraceProcessEvent`` (Type 48): a CUDA runtime (eventClass 0) or driver (1) call."""

    startNs: int = 0
    endNs: int = 0
    eventClass: int = 0
    globalTid: int = 0
    correlationId: int = 0
    name: int = 0


class NvtxRange(msgspec.Struct):
    """``NvtxEvent`` (Type 59 / 60), PascalCase. No ``EndTimestamp``: never closed."""

    Timestamp: int = 0
    EndTimestamp: int | None = None
    Text: str | None = None
    TextId: int | None = None
    GlobalTid: int = 0
    DomainId: int = 0


class KernelFields(msgspec.Struct):
    shortName: int | None = None
    demangledName: int | None = None


class MemcpyFields(msgspec.Struct):
    copyKind: int | str = 0
    srcKind: int | str = 0
    dstKind: int | str = 0


class MemsetFields(msgspec.Struct):
    memKind: int | str = 0


class GpuActivity(msgspec.Struct):
    """``CudaEvent`` (Type 79: ``kernel``; 80: ``memcpy`` or ``memset``)."""

    startNs: int = 0
    endNs: int = 0
    deviceId: int = 0
    streamId: int = 0
    correlationId: int = 0
    globalPid: int = 0
    eventClass: int = 0
    kernel: KernelFields = msgspec.field(default_factory=KernelFields)
    memcpy: MemcpyFields | None = None
    memset: MemsetFields | None = None


class ExportLine(msgspec.Struct):
    """A ``--type json`` line: an event (``Type`` and its message), the string table (``data``:
    strings; thread names are ``data`` of objects), a ``String`` / ``ThreadName`` / stream line
    (``type``), or a JSON Lines row (``table``: a file of the other form joined to this one)."""

    Type: int = -1  # NOT_AN_EVENT
    TraceProcessEvent: ApiCall | None = None
    NvtxEvent: NvtxRange | None = None
    CudaEvent: GpuActivity | None = None
    data: Any = None
    type: Any = None
    id: int | None = None
    value: Any = None
    table: Any = None


_DECODERS = {FORM_JSON: ExportLine, FORM_JSON_LINES: TableRow}
NO_TABLE = ('no "table" key: not a row of a JSON Lines export (--type jsonlines); a line of another file '
            "(a --type json export?) joined to this one")


# -- loading ---------------------------------------------------------------------------------

DDL = {
    TABLE_NVTX: 'start INTEGER, "end" INTEGER, eventType INTEGER, text TEXT, textId INTEGER, globalTid INTEGER, '
                "domainId INTEGER",
    TABLE_RUNTIME: 'start INTEGER, "end" INTEGER, eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, '
                   "nameId INTEGER",
    TABLE_KERNEL: 'start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, '
                  "globalPid INTEGER, demangledName INTEGER, shortName INTEGER",
    TABLE_MEMCPY: 'start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, '
                  "globalPid INTEGER, copyKind INTEGER, srcKind INTEGER, dstKind INTEGER",
    TABLE_MEMSET: 'start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, '
                  "globalPid INTEGER, memKind INTEGER",
    TABLE_GRAPH_TRACE: 'start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, '
                       "globalPid INTEGER, graphId INTEGER",
    TABLE_STRINGS: "id INTEGER PRIMARY KEY, value",
    **{table: "name, value" for table in METADATA_TABLES},
}
_ROW_FIELDS = {table: attrgetter(*columns) for table, columns in COLUMNS.items()}


class _Chunk:
    """A piece of whole lines of the text: ``text``, the number of its first line, whether it
    ends the file."""

    __slots__ = ("text", "first_line", "last")

    def __init__(self, text: bytes, first_line: int, last: bool):
        self.text, self.first_line, self.last = text, first_line, last

    def lines(self) -> list[tuple[int, bytes]]:
        """(line number, line) of its non-blank lines: what ``decode_lines`` decodes, in order."""
        return [(self.first_line + offset, line) for offset, line in enumerate(self.text.split(b"\n"))
                if line.strip()]


def _chunks(data):
    """The text in ``_Chunk``s of about ``CHUNK_BYTES``, each cut after a newline."""
    size, at, line = len(data), 0, 1
    while at < size:
        cut = data.find(b"\n", min(at + CHUNK_BYTES, size) - 1)
        cut = size if cut < 0 else cut + 1
        text = bytes(data[at:cut])
        yield _Chunk(text, line, cut >= size)
        line += text.count(b"\n")
        at = cut


class _Export:
    """What is being loaded: the file, its form, the database, the warnings and, for ``--type
    json``, the line where the events ended (the first string-table or thread-name line)."""

    def __init__(self, path: Path, form: str):
        self.path, self.form = path, form
        self.db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        for table, columns in DDL.items():
            self.db.execute(f"CREATE TABLE {table} ({columns})")
        self.db.execute("BEGIN")  # one transaction for every insert (savepoints around the strings')
        self.warnings: list[str] = []
        self.events_end: int | None = None
        self.string_table: int | None = None  # --type json: the line of its {"data": [...]} string table
        self.cut_line: int | None = None  # the last line, when cut short

    def problem(self, line: int | None, words: str) -> TraceInputError:
        return TraceInputError(self.path, f"line {line}: {words}" if line is not None else words)

    def insert(self, table: str, rows, sql_values: str | None = None) -> None:
        """Rows (tuples of ``COLUMNS[table]``, or of the ``?`` in ``sql_values``) into ``table``,
        as many rows a statement as ``MAX_SQL_VARIABLES`` allows (SQLite's per-statement cost is
        most of a row's: half the time of one row a statement)."""
        values = f"({sql_values or ', '.join('?' * len(COLUMNS[table]))})"
        width = values.count("?")
        flat = list(chain.from_iterable(rows))
        per = max(1, MAX_SQL_VARIABLES // width)
        whole = len(flat) - len(flat) % (per * width)
        if whole:
            step = per * width
            self.db.executemany(f"INSERT INTO {table} VALUES {', '.join([values] * per)}",
                                (flat[at:at + step] for at in range(0, whole, step)))
        if whole < len(flat):
            rest = (len(flat) - whole) // width
            self.db.execute(f"INSERT INTO {table} VALUES {', '.join([values] * rest)}", flat[whole:])

    def insert_strings(self, pairs: list, line_of_pair) -> None:
        """String rows (id, value); an id missing or given twice is refused, naming its line
        (``line_of_pair(k)``: the line of the k-th pair; looked up only then)."""
        self.db.execute("SAVEPOINT strings")
        try:
            if any(key is None for key, _ in pairs):
                raise sqlite3.IntegrityError("no id")
            self.insert(TABLE_STRINGS, pairs)
            self.db.execute("RELEASE strings")
        except sqlite3.IntegrityError:
            self.db.execute("ROLLBACK TO strings")  # the ids before these pairs
            seen = {row[0] for row in self.db.execute(f"SELECT id FROM {TABLE_STRINGS}")}
            for k, (key, _) in enumerate(pairs):
                if key is None or not isinstance(key, int):
                    raise self.problem(line_of_pair(k), f"a string without an integer id ({key!r})") from None
                if key in seen:
                    raise self.problem(line_of_pair(k), f"string id {key} is given twice (two exports joined "
                                       "into one file?)") from None
                seen.add(key)
            raise


def load_nsys_json(path: Path, form: str) -> tuple[sqlite3.Connection, dict[str, set[str]], list[str]]:
    """(an in-memory database holding the export's rows in the SQLite reader's tables, those
    tables with their present columns as ``sqlite_source.table_columns`` gives them, the
    warnings). Raises ``TraceInputError`` naming the file and the line on bad input."""
    data = read_trace_bytes(path)
    export = _Export(path, form)
    try:
        decoder = msgspec.json.Decoder(_DECODERS[form], strict=False)
        add = _add_table_rows if form == FORM_JSON_LINES else _add_export_lines
        for chunk in _chunks(data):
            try:
                items, numbers = decoder.decode_lines(chunk.text), None
            except (msgspec.DecodeError, msgspec.ValidationError):
                items, numbers = _decode_one_by_one(export, chunk)
            add(export, items, numbers, chunk)
            del items
        del data
        tables = _finish(export)
    except (OverflowError, sqlite3.Error) as err:  # an integer past 64 bits; nothing else is expected
        export.db.close()
        raise TraceInputError(path, f"cannot hold a value of this export ({err})") from None
    except BaseException:
        export.db.close()
        raise
    return export.db, tables, export.warnings


def _decode_one_by_one(export: _Export, chunk: _Chunk) -> tuple[list, list[int]]:
    """The chunk's items and their line numbers, decoded line by line (a chunk ``decode_lines``
    refused): a line that is not JSON is refused, but the file's last line cut short (no newline
    after it) is left out with a warning; a JSON Lines row of a table not read is skipped
    whatever its fields hold; any other line whose fields do not fit is refused, naming the
    field."""
    decode = msgspec.json.Decoder(_DECODERS[export.form], strict=False).decode
    items, numbers = [], []
    lines = chunk.lines()
    for position, (number, line) in enumerate(lines):
        try:
            items.append(decode(line))
            numbers.append(number)
            continue
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            problem = str(err)
        try:
            plain = orjson.loads(line)
        except orjson.JSONDecodeError:
            if chunk.last and position == len(lines) - 1 and not chunk.text.endswith(b"\n"):
                export.warnings.append(f"{export.path}: line {number} is cut short (the file ends inside it: "
                                       "an export or a copy not finished?); left out, the lines before it read")
                export.cut_line = number
                continue
            raise export.problem(number, f"not JSON ({problem})") from None
        if not isinstance(plain, dict):
            raise export.problem(number, "not a JSON object")
        if export.form == FORM_JSON_LINES:
            table = plain.get("table")
            if not isinstance(table, str) or not table:
                raise export.problem(number, NO_TABLE)
            if table not in COLUMNS:
                continue  # a table not read: its columns are none of et-link's business
        raise export.problem(number, f"a value of the wrong type ({problem})") from None
    return items, numbers


def _line_of(chunk: _Chunk, numbers: list[int] | None, index: int) -> int:
    return numbers[index] if numbers is not None else chunk.lines()[index][0]


def _add_table_rows(export: _Export, rows: list[TableRow], numbers, chunk: _Chunk) -> None:
    """JSON Lines rows into their tables (rows of other tables skipped), grouped by table with a
    stable sort (C; nsys writes a table's rows together, so it costs little); a line without
    ``"table"`` is refused."""
    tables = list(map(_TABLE, rows))
    if "" in tables:
        raise export.problem(_line_of(chunk, numbers, tables.index("")), NO_TABLE)
    for table, group in groupby(sorted(rows, key=_TABLE), _TABLE):
        if table == TABLE_STRINGS:
            positions = [k for k, name in enumerate(tables) if name == TABLE_STRINGS]
            export.insert_strings(list(map(_ROW_FIELDS[table], group)),
                                  lambda n: _line_of(chunk, numbers, positions[n]))
        elif table in COLUMNS:
            export.insert(table, map(_ROW_FIELDS[table], group))


_TABLE = attrgetter("table")


# A line's row, read through its message (a line without one raises AttributeError).
_API_LINE = attrgetter(*(f"TraceProcessEvent.{field}" for field in (
    "startNs", "endNs", "eventClass", "globalTid", "correlationId", "name")))
_RANGE_LINE = attrgetter(*(f"NvtxEvent.{field}" for field in (
    "Timestamp", "EndTimestamp", "Text", "TextId", "GlobalTid", "DomainId")))
_KERNEL_LINE = attrgetter(*(f"CudaEvent.{field}" for field in (
    "startNs", "endNs", "deviceId", "streamId", "correlationId", "globalPid", "kernel.demangledName",
    "kernel.shortName")))
_CUDA_EVENT = attrgetter("CudaEvent")
_ACTIVITY = attrgetter("startNs", "endNs", "deviceId", "streamId", "correlationId", "globalPid")
_TYPE = attrgetter("Type")
NOT_AN_EVENT = -1  # ExportLine.Type of a line that is no event
_MESSAGE_OF_TYPE = {TYPE_API_CALL: "TraceProcessEvent", TYPE_PUSH_POP: "NvtxEvent", TYPE_START_END: "NvtxEvent",
                    TYPE_KERNEL: "CudaEvent", TYPE_MEMORY_OP: "CudaEvent"}


def _add_export_lines(export: _Export, lines: list[ExportLine], numbers, chunk: _Chunk) -> None:
    """``--type json`` lines: events of the types read into their tables, the string table's
    strings into ``StringIds``; an event after the strings (or thread names) that end an export
    is refused. The events are grouped by type with a stable sort (C), each group inserted
    whole; the lines after the events (strings, threads) go through ``_add_closing_lines``."""
    types = list(map(_TYPE, lines))
    if export.events_end is not None:
        end = 0
    elif NOT_AN_EVENT in types:
        end = types.index(NOT_AN_EVENT)
        export.events_end = _line_of(chunk, numbers, end)
    else:
        end = len(types)
    closing = types[end:]
    if closing.count(NOT_AN_EVENT) != len(closing):
        index = end + next(k for k, kind in enumerate(closing) if kind != NOT_AN_EVENT)
        raise export.problem(_line_of(chunk, numbers, index), f"an event (Type {types[index]}) after the strings "
                             f"or thread names that end an export (line {export.events_end}): nsys writes every "
                             "event first; two exports joined into one file?")
    if closing:
        _add_closing_lines(export, lines, end, numbers, chunk)
    for kind, group in groupby(sorted(lines[:end], key=_TYPE), _TYPE):
        message = _MESSAGE_OF_TYPE.get(kind)
        if message is None:
            continue  # a kind of event not read
        try:
            if kind == TYPE_API_CALL:
                export.insert(TABLE_RUNTIME, map(_API_LINE, group))
            elif kind in (TYPE_PUSH_POP, TYPE_START_END):
                export.insert(TABLE_NVTX, map(_RANGE_LINE, group), f"?, ?, {kind}, ?, ?, ?, ?")
            elif kind == TYPE_KERNEL:
                export.insert(TABLE_KERNEL, map(_KERNEL_LINE, group))
            else:
                _insert_memory_ops(export, list(map(_CUDA_EVENT, group)))
        except AttributeError:  # an event line without its message: None has no fields
            index = next(k for k, line in enumerate(lines) if line.Type == kind and getattr(line, message) is None)
            raise export.problem(_line_of(chunk, numbers, index),
                                 f"an event of Type {kind} without its {message}") from None


def _add_closing_lines(export: _Export, lines: list[ExportLine], start: int, numbers, chunk: _Chunk) -> None:
    """The lines from ``start`` on, which follow the events: the string table (one ``data``
    line of strings, or ``String`` lines) into ``StringIds``; thread names and streams skipped;
    a second string table, a JSON Lines row or a line of no known shape refused."""
    strings, string_lines = [], []
    for index in range(start, len(lines)):
        line = lines[index]
        if line.table is not None:
            raise export.problem(_line_of(chunk, numbers, index), 'a JSON Lines row ("table") in a --type json '
                                 "export: two exports of different forms joined into one file?")
        if line.type == "String":
            strings.append((line.id, line.value))
            string_lines.append(index)
        elif isinstance(line.data, list):
            if line.data and isinstance(line.data[0], str):
                here = _line_of(chunk, numbers, index)
                if export.string_table is not None:
                    raise export.problem(here, f"a second string table (the first is on line {export.string_table}): "
                                         "two exports joined into one file?")
                export.string_table = here
                export.insert_strings(list(enumerate(line.data)), lambda k: here)
        elif line.type is None:
            raise export.problem(_line_of(chunk, numbers, index), "not a line of an nsys --type json export "
                                 '(no "Type", string table, "type" or thread names)')
    if strings:
        export.insert_strings(strings, lambda n: _line_of(chunk, numbers, string_lines[n]))


def _insert_memory_ops(export: _Export, events: list[GpuActivity]) -> None:
    """Type 80 events: a memset (``memset{}``, or eventClass 2 without either message) or a
    memcpy, with their kinds (numbers, or enum names read by their last word)."""
    copies, sets = [], []
    if None in events:
        raise AttributeError("CudaEvent")
    for event in events:
        if event.memset is not None or (event.memcpy is None and event.eventClass == MEMSET_EVENT_CLASS):
            kind = event.memset.memKind if event.memset is not None else 0
            sets.append((*_ACTIVITY(event), _enum_code(kind, MEMORY_KINDS)))
        else:
            copy = event.memcpy or MemcpyFields()
            copies.append((*_ACTIVITY(event), _enum_code(copy.copyKind, MEMCPY_KINDS),
                           _enum_code(copy.srcKind, MEMORY_KINDS), _enum_code(copy.dstKind, MEMORY_KINDS)))
    if copies:
        export.insert(TABLE_MEMCPY, copies)
    if sets:
        export.insert(TABLE_MEMSET, sets)


def _enum_code(value, names: dict[int, str]) -> int | None:
    """A CUPTI kind as its number: a number as is; a name (``CUDA_MEMCPY_KIND_HTOD``,
    ``…_MEMORY_KIND_DEVICE_STATIC``) by the kind its last words name; 0 (unknown) otherwise."""
    if value is None or type(value) is int:
        return value
    text = value.strip().upper()
    if text.lstrip("-").isdigit():
        return int(text)
    for code, word in sorted(names.items(), key=lambda item: -len(item[1])):
        word = word.upper().replace(" ", "_")
        if text == word or text.endswith("_" + word):
            return code
    return 0


def _finish(export: _Export) -> dict[str, set[str]]:
    """The tables with rows and their present columns; strings checked: a value that is not
    text refused, ids used but not in the string table refused when there is none (cut short
    before it), else warned about; an export without CUDA rows warned about."""
    db, path = export.db, export.path
    tables = {}
    for table, columns in COLUMNS.items():
        if db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is None:
            continue
        absent = {column for column in OPTIONAL_COLUMNS.get(table, ())
                  if db.execute(f'SELECT 1 FROM {table} WHERE "{column}" IS NOT NULL LIMIT 1').fetchone() is None}
        tables[table] = set(columns) - absent
    bad = db.execute(f"SELECT id FROM {TABLE_STRINGS} WHERE typeof(value) <> 'text' LIMIT 1").fetchone()
    if bad is not None:
        raise export.problem(None, f"string id {bad[0]} has no text (its value is not a JSON string)")
    used = [f"SELECT textId AS id FROM {TABLE_NVTX} WHERE text IS NULL AND textId IS NOT NULL",
            f"SELECT nameId FROM {TABLE_RUNTIME}", f"SELECT demangledName FROM {TABLE_KERNEL}",
            f"SELECT shortName FROM {TABLE_KERNEL}"]
    missing, example = db.execute(
        f"SELECT count(DISTINCT u.id), min(u.id) FROM ({' UNION ALL '.join(used)}) u WHERE u.id IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM {TABLE_STRINGS} s WHERE s.id = u.id)").fetchone()
    if missing:
        if TABLE_STRINGS not in tables:
            where = (f"its last line, {export.cut_line}, is cut short: the file ends inside it" if export.cut_line
                     else "nsys writes the strings after the events: was the export cut short?")
            raise export.problem(None, f"no string table, yet {missing} string ids are used (e.g. "
                                 f"{example}); {where}")
        export.warnings.append(f"{path}: {missing} string ids used by its rows are not in its string table "
                               f"(e.g. id {example}): those names read as empty")
    if not any(table in tables for table in CUDA_TABLES):
        export.warnings.append(f"{path}: no CUDA API calls or GPU activity in this export (profiled without "
                               "'-t cuda', or a run without a GPU): CPU ops only")
    return tables


# -- reading -----------------------------------------------------------------------------------

def read_nsys_json(path: Path, form: str, pid: int | None = None, prefer_pid: int | None = None):
    """The ``TimingTrace`` of an nsys JSON export (``form``: ``nsys_json_form``'s answer), read
    by the SQLite reader from the loaded tables (``pid``, ``prefer_pid``: as ``read_nsys``'s).
    Raises ``TraceInputError`` (one line) on bad input or when nothing can be linked."""
    from linker.read.nsys import read_nsys

    with collector_paused():
        db, tables, warnings = load_nsys_json(path, form)
        try:
            trace = read_nsys(db, path, tables, pid, prefer_pid)
        finally:
            db.close()
    trace.form = FORM_WORDS[form]
    trace.warnings[:0] = warnings
    return trace


def nsys_json_processes(path: Path, form: str) -> list[int]:
    """The pids with PyTorch ranges in an nsys JSON export, ascending (``batch``: a rank each)."""
    from linker.read.nsys import Processes, _ranges_sql

    with collector_paused():
        db, tables, _ = load_nsys_json(path, form)
        try:
            return Processes(db, _ranges_sql(tables)).pytorch()
        finally:
            db.close()

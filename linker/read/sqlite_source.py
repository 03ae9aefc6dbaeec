"""Open a profiler's SQLite export read-only, and tell which profiler wrote it.

``open_read_only`` opens the file through an SQLite URI with ``mode=ro`` and, when no journal or
write-ahead log lies beside it, ``immutable=1``: SQLite then takes no lock and creates no
``-journal``, ``-wal`` or ``-shm`` file, so the input's bytes, its mtime and its directory stay as
they were (a read-only file or directory is read the same way). A journal or WAL beside the file
means a writer is (or was) at work: the file is then opened ``mode=ro`` only, so SQLite honours
the writer's lock; a lock still held is refused in one line.

``table_columns`` lists the tables and their columns (readers ask by name, never by position:
exports add columns in micro versions and create tables lazily). ``source_kind`` tells nsys
(``StringIds``) from nvprof (``StringTable``). Every SQLite failure is a ``TraceInputError`` naming
the file. Cost: the open and one query of ``sqlite_master``; nothing is read per event here.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from linker.model.errors import TraceInputError

SQLITE_MAGIC = b"SQLite format 3\x00"
ALL_PROCESSES = -1  # a reader's ``pid`` value: read every PyTorch process of the file
NSYS, NVPROF = "nsys", "nvprof"
# Files a writer leaves beside a database while it is (or was, until the next open) at work.
SIDE_FILES = ("-journal", "-wal")
# The tables of an Nsight Systems export that et-link reads (both readers: ``nsys``, ``nsys_json``).
TABLE_NVTX = "NVTX_EVENTS"
TABLE_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
TABLE_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
TABLE_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
TABLE_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
TABLE_GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
TABLE_STRINGS = "StringIds"


def has_sqlite_header(path: str | os.PathLike) -> bool:
    """True when the file starts with the 16-byte SQLite header. Reads 16 bytes."""
    try:
        with open(path, "rb") as stream:
            return stream.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


LOCK_WAIT_S = 1.0


def _uri(path: Path, immutable: bool) -> str:
    query = "mode=ro&immutable=1" if immutable else "mode=ro"
    return f"file:{quote(str(path.absolute()))}?{query}"


def open_read_only(path: str | os.PathLike) -> sqlite3.Connection:
    """A read-only connection to the SQLite file at ``path`` (see the module docstring).

    Raises ``TraceInputError`` when the file is missing, unreadable, not SQLite, damaged or locked
    by a writer. The caller closes the connection."""
    path = Path(path)
    if not path.is_file():
        raise TraceInputError(path, "no such file" if not path.exists() else "not a regular file")
    if not os.access(path, os.R_OK):
        raise TraceInputError(path, "cannot read: permission denied")
    writer_files = [suffix for suffix in SIDE_FILES if Path(f"{path}{suffix}").exists()]
    try:
        # a writer's lock is waited for 1 s (sqlite3's default: 5 s), enough for a brief one; a
        # profiler or an export still writing the file holds it far longer
        conn = sqlite3.connect(_uri(path, immutable=not writer_files), uri=True, check_same_thread=False,
                               timeout=LOCK_WAIT_S)
        conn.execute("PRAGMA query_only = 1")
        conn.execute("PRAGMA temp_store = MEMORY")  # the sorts' scratch space: never a file beside the input
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as err:
        raise sqlite_problem(path, err) from None
    return conn


def sqlite_problem(path: str | os.PathLike, err: sqlite3.Error) -> TraceInputError:
    """The one-line ``TraceInputError`` for an SQLite failure on ``path``."""
    text = str(err)
    lowered = text.lower()
    if "locked" in lowered or "busy" in lowered:
        problem = ("locked by another program (an export or profiler still writing it?); "
                   "try again once it has finished")
    elif "not a database" in lowered:
        problem = "not an SQLite database (damaged, or not an export)"
    elif "malformed" in lowered or "corrupt" in lowered or "disk i/o" in lowered:
        problem = f"the SQLite file is damaged or truncated ({text})"
    elif "unable to open" in lowered:
        problem = f"cannot open the SQLite file read-only ({text})"
    else:
        problem = f"cannot read the SQLite file ({text})"
    return TraceInputError(path, problem)


def table_columns(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Table name -> its column names, for every table of the file. One query per table."""
    names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {name: {row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')} for name in names}


def source_kind(tables: dict[str, set[str]]) -> str | None:
    """``NSYS``, ``NVPROF`` or None, from the string table's name (PyProf tells them apart so)."""
    if TABLE_STRINGS in tables:
        return NSYS
    if "StringTable" in tables:
        return NVPROF
    return None

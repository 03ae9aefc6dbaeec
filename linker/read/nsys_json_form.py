"""Tell an Nsight Systems JSON export (``nsys export --type json`` / ``--type jsonlines``, plain or
gzip) by its first line, from a Kineto / Chrome trace or anything else (``nsys_json_form``).

A module of its own so that the Kineto reader can refuse an nsys export without importing the
nsys readers (``linker.read.nsys_json`` reads them). Cost: at most ``HEAD_BYTES`` of text read
(inflated when gzip) and one line decoded.
"""

from __future__ import annotations

import os
import stat
import zlib

import orjson

from linker.read.files import GZIP_MAGIC

FORM_JSON, FORM_JSON_LINES = "json", "jsonlines"
FORM_WORDS = {FORM_JSON: "JSON (--type json)", FORM_JSON_LINES: "JSON Lines (--type jsonlines)"}
HEAD_BYTES = 1 << 16  # detection reads at most this much text (inflated when gzip)


def _head(path) -> tuple[bytes, bool]:
    """(the first ``HEAD_BYTES`` of the file's text, inflated when gzip; whether that is all of
    it). Empty when the file cannot be read or inflated (the reader that follows names why), or is
    not a regular file (a pipe: what is read here would be lost to the reader)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe's bytes read here would be lost to the reader
            return b"", False
        with open(path, "rb") as stream:
            raw = stream.read(HEAD_BYTES)
            if raw[:2] != GZIP_MAGIC:
                return raw, len(raw) < HEAD_BYTES
            inflater = zlib.decompressobj(wbits=31)
            text = inflater.decompress(raw, HEAD_BYTES)
            while len(text) < HEAD_BYTES and not inflater.eof:
                more = inflater.unconsumed_tail or stream.read(HEAD_BYTES)
                if not more:
                    break
                text += inflater.decompress(more, HEAD_BYTES - len(text))
            return text, inflater.eof and not inflater.unconsumed_tail
    except (OSError, zlib.error):
        return b"", False


def nsys_json_form(path) -> str | None:
    """``FORM_JSON``, ``FORM_JSON_LINES`` or None (not an nsys JSON export: a Kineto / Chrome
    trace, whose first line is ``{`` or the whole ``{"traceEvents": …}`` document, or anything
    else), from the file's first non-blank line: a JSON object with ``"table"`` (JSON Lines), or
    with a numeric ``"Type"`` and a ``…Event`` key, or a string-table line (``--type json``).
    Reads at most ``HEAD_BYTES`` of text."""
    head, whole = _head(path)
    text = head.lstrip()
    end = text.find(b"\n")
    if end < 0 and not whole:
        return None  # no line ends in the head: not line-wise JSON of small lines
    try:
        first = orjson.loads(text[:end] if end >= 0 else text)
    except orjson.JSONDecodeError:
        return None
    return _form_of(first) if isinstance(first, dict) else None


def _form_of(first: dict) -> str | None:
    if "traceEvents" in first:
        return None
    if isinstance(first.get("table"), str):
        return FORM_JSON_LINES
    kind = first.get("Type")
    if isinstance(kind, int) and not isinstance(kind, bool) and any(key.endswith("Event") for key in first):
        return FORM_JSON
    if first.get("type") == "String" and "id" in first and "value" in first:
        return FORM_JSON
    data = first.get("data")
    if len(first) == 1 and isinstance(data, list) and data and isinstance(data[0], str):
        return FORM_JSON
    return None

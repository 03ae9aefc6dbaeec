"""The Kineto model as filled from an NVTX-based capture (Nsight Systems, nvprof).

A timing source other than Kineto is read into the same ``KinetoTrace`` / ``KinetoEvent`` model, so
linking, the writers and the simulator need nothing new:

- a PyTorch NVTX range is a ``cpu_op`` event: the name is the range text before its first
  ``, seq = `` / ``, op_id = `` / ``, sizes = `` field; ``op_id`` becomes the ``Record function
  id`` (PyTorch writes the same RecordFunction handle as the ET's ``rf_id``) and the External id
  (it orders same-start ranges as Kineto's External id does: both are drawn at op start);
  ``sizes = [[…]]`` becomes ``Input Dims``; ``seq`` rides along in ``RangeArgs.seq``;
- a CUDA runtime / driver call is a ``cuda_runtime`` / ``cuda_driver`` event with its
  ``correlation``;
- kernels, memcpys and memsets are ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events with pid =
  device and tid = stream, as Kineto writes them.

Times are µs floats: ``ns / 1000`` computed by SQLite (an IEEE division, so a Kineto time written
as ns by ``scripts/kineto_to_sqlite.py`` reads back as the very float Kineto's decoder makes).

``TimingTrace`` adds what the report says about the source: its kind and version, the processes
read and the ranges left out. The builders below turn cursor rows into events in one pass each
(SQL has joined and filtered; the builders group the rows by thread, check their order and sort
a thread only when its rows were not in order; they cut seq and op_id out of the range text,
``split_ids``, so that the rest, the same for every call of an op with the same shapes, is
parsed once per distinct text). Cost: one struct per row read (two for a range with op_id or
seq), a few ``str`` operations per range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from operator import attrgetter

import msgspec

from linker.read.kineto import KinetoArgs, KinetoEvent, KinetoTrace

NO_DIMS = KinetoArgs().input_dims
# Range text fields PyTorch appends to the op name (``getNvtxStr``); ``seq`` spellings PyTorch used (", seq = N" since 2020; "seq=N" / "stashed seq=N" before).
SEQ_SPELLINGS = (", seq", ", stashed seq")
OP_ID_MARKER = ", op_id = "
SIZES_MARKER = ", sizes = "
INPUT_OP_IDS_MARKER = ", input_op_ids = "
NS_PER_US = 1000.0
# Times stay as recorded while ns / 1000 keeps whole ns in a float (below 2**43 µs); beyond
# (nvprof's epoch ns) they are made relative to the earliest timestamp read.
MAX_PLAIN_US = float(1 << 43)


class RangeArgs(KinetoArgs, frozen=True, omit_defaults=True):
    """``KinetoArgs`` of a PyTorch NVTX range, plus its autograd sequence number (None: none)."""

    seq: int | None = None


@dataclass
class TimingTrace(KinetoTrace):
    """A ``KinetoTrace`` read from an Nsight Systems or nvprof SQLite file (or an nsys JSON export).

    ``source``: "nsys" or "nvprof"; ``version``: product and schema version as the file states
    them; ``processes``: pids read (rank order for ``batch``); ``notes``: what the report says
    about ranges and rows left out; ``warnings``: the same, for what the user should look at;
    ``time_base_ns``: subtracted from every timestamp (0: times as recorded); ``form``: the
    export's form, in words ("SQLite", or a JSON form of ``nsys_json_form.FORM_WORDS``)."""

    source: str = ""
    version: str = ""
    processes: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    time_base_ns: int = 0
    form: str = "SQLite"

    def describe(self) -> str:
        """One line for the report: source, version, processes."""
        kind = {"nsys": "Nsight Systems", "nvprof": "nvprof"}.get(self.source, self.source)
        pids = ", ".join(map(str, self.processes))
        base = f"; times relative to {self.time_base_ns} ns" if self.time_base_ns else ""
        return (f"timing source: {kind} {self.form} export ({self.version}), "
                f"process{'es' if len(self.processes) != 1 else ''} {pids}{base}")


def parse_range_text(text: str) -> tuple[str, int | None, int | None, bytes | None]:
    """(name, op_id, seq, sizes) of PyTorch's range text ``name[, seq = N][, op_id = M][, sizes =
    [[…]]][, input_op_ids = […]]``: the name ends at the first of those fields; ``seq`` is also
    read as ``seq=N`` / ``stashed seq=N`` (older spellings); ``sizes`` is the JSON list's bytes,
    None when absent or not valid JSON (a text cut short by the profiler). A few ``str.find``."""
    if ", " not in text:
        return text, None, None, None
    cut = len(text)
    op_id = seq = sizes = None
    at = text.find(OP_ID_MARKER)
    if at >= 0:
        cut = at
        op_id = _leading_int(text, at + len(OP_ID_MARKER))
    for marker in SEQ_SPELLINGS:
        at = text.find(marker)
        if at >= 0:
            cut = min(cut, at)
            seq = _leading_int(text, at + len(marker))
            break
    at = text.find(SIZES_MARKER)
    if at >= 0:
        cut = min(cut, at)
        end = text.find(INPUT_OP_IDS_MARKER, at)
        sizes = text[at + len(SIZES_MARKER):end if end >= 0 else len(text)].encode()
        try:
            _check_json(sizes)
        except msgspec.DecodeError:
            sizes = None
    at = text.find(INPUT_OP_IDS_MARKER)
    if at >= 0:
        cut = min(cut, at)
    return text[:cut], op_id, seq, sizes


_check_json = msgspec.json.Decoder().decode
_DIGITS = re.compile(r"\s*=?\s*(-?\d+)")


def _leading_int(text: str, at: int) -> int | None:
    match = _DIGITS.match(text, at)
    return int(match.group(1)) if match else None


_LAST = float("inf")  # op_id key of a range without op_id: after every id, as in ``cpu_sql``


def cpu_events(rows, in_order: bool = False) -> list[KinetoEvent]:
    """Rows (range text, pid, tid, ts, dur) -> ``cpu_op`` events in ``cpu_event_order``.

    The rows come sorted per thread by (ts, op_id, longer first, file order), threads in any
    order and interleaved (``Threads`` groups them). ``in_order=True``: rows in file order that
    are expected to be so (nsys writes ranges by start), checked as they come (a few comparisons
    per row); a thread whose rows are not is sorted here (``sort_nearly_sorted`` with
    ``cpu_order_key``: file order among equals). ``split_ids`` takes seq and op_id out of the
    text; the rest (the core) is the same for every call of an op with the same sizes, so each
    distinct one is parsed once (``parse_range_text``) and its name, sizes bytes and, for a range
    without op_id and seq, its args are shared by the events that have it. A thread's pid and tid
    objects are shared by its events. O(n), one struct (two with op_id or seq) per row."""
    Event, Args, no_dims, parse = KinetoEvent, RangeArgs, NO_DIMS, parse_range_text
    seen: dict[str, tuple] = {}
    threads = Threads()
    add = None
    cur_pid = cur_tid = None
    last_ts, last_op, last_dur = -_LAST, -_LAST, _LAST
    seq_marker, op_id_marker, split_op_id = SEQ_MARKER, OP_ID_MARKER, _split_op_id
    for text, pid, tid, ts, dur in rows:
        if op_id_marker in text:
            core, op_id, seq = split_op_id(text)
        elif seq_marker in text:
            core, op_id, seq = split_ids(text)
        else:
            core, op_id, seq = text, None, None
        if tid != cur_tid or pid != cur_pid:
            if add is not None:
                threads.last[(cur_pid, cur_tid)] = (last_ts, last_op, last_dur)
            add, cur_pid, cur_tid = threads.switch(pid, tid)
            last_ts, last_op, last_dur = threads.last.get((cur_pid, cur_tid), (-_LAST, -_LAST, _LAST))
        if in_order:
            op = op_id if op_id is not None else _LAST
            if ts < last_ts or (ts == last_ts and (op < last_op or (op == last_op and dur > last_dur))):
                threads.unsorted.add((cur_pid, cur_tid))
            last_ts, last_op, last_dur = ts, op, dur
        parsed = seen.get(core)
        if parsed is None:
            name, _, old_seq, sizes = parse(core)
            dims = msgspec.Raw(sizes) if sizes else no_dims
            parsed = seen[core] = (name, dims, old_seq, Args(input_dims=dims, seq=old_seq))
        if op_id is None and seq is None:
            args = parsed[3]
        else:
            args = Args(external_id=op_id, rf_id=op_id, input_dims=parsed[1],
                        seq=seq if seq is not None else parsed[2])
        add(Event("X", "cpu_op", parsed[0], cur_pid, cur_tid, ts, dur, None, args))
    return threads.events(cpu_order_key)


_TS = attrgetter("ts")


def sort_nearly_sorted(events: list, tie_key) -> None:
    """Sort ``events`` in place by ``ts``, then ``tie_key`` among equal ``ts``, file order last:
    a stable sort by ``ts`` (a C key: nearly sorted rows cost O(n)), then each run of equal
    ``ts`` sorted by ``tie_key`` (runs are short: nested ranges opened at one instant)."""
    events.sort(key=_TS)
    ts = list(map(_TS, events))
    ties = [k for k in range(len(ts) - 1) if ts[k] == ts[k + 1]]  # k starts where k + 1 starts
    k = 0
    while k < len(ties):
        first = last = ties[k]
        while k + 1 < len(ties) and ties[k + 1] == last + 1:
            k += 1
            last = ties[k]
        events[first:last + 2] = sorted(events[first:last + 2], key=tie_key)
        k += 1


def cpu_order_key(event: KinetoEvent) -> tuple:
    """The per-thread order of ``cpu_events`` (``ts``, op_id with none last, the longer first)."""
    op_id = event.args.rf_id
    return event.ts, op_id if op_id is not None else _LAST, -event.dur


def runtime_order_key(event: KinetoEvent) -> tuple:
    """The per-thread order of ``runtime_events`` (``ts``, the longer first)."""
    return event.ts, -event.dur


class Threads:
    """Events grouped by thread as rows arrive (threads in any order, interleaved or not), given
    back in ``cpu_event_order``'s thread order: pid and tid compared as text, each thread's events
    in arrival order. ``switch`` is called only when a row's thread differs from the previous
    row's; it gives the thread's append and the pid and tid objects its events share (one pair per
    thread, not per row). ``last`` keeps, per thread, what the order check of ``cpu_events`` last
    saw; ``unsorted`` the threads whose rows came out of order, sorted by ``events``' key. O(n)
    list joins, plus O(k log k) per unsorted thread of k events."""

    def __init__(self):
        self.groups: dict[tuple, tuple] = {}
        self.last: dict[tuple, tuple] = {}
        self.unsorted: set[tuple] = set()

    def switch(self, pid, tid):
        group = self.groups.get((pid, tid))
        if group is None:
            group = self.groups[(pid, tid)] = ([], pid, tid)
        return group[0].append, group[1], group[2]

    def events(self, tie_key) -> list:
        for thread in self.unsorted:
            sort_nearly_sorted(self.groups[thread][0], tie_key)
        groups = sorted(self.groups.values(), key=lambda g: (str(g[1]), str(g[2])))
        if len(groups) == 1:
            return groups[0][0]
        return [event for group in groups for event in group[0]]


SEQ_MARKER = SEQ_SPELLINGS[0]
_SQL_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def split_ids(text: str) -> tuple[str, int | None, int | None]:
    """(core, op_id, seq) of a range text: the text without its ``, seq = N, op_id = M`` part
    (PyTorch writes seq before op_id and nothing between them; the core keeps what follows the
    last of them from its ``, ``), op_id and seq as the leading integers after their markers (0
    when none: SQLite's ``CAST`` rule, which the first version of this reader used), None when
    the marker is absent. A few ``str.find`` and slices."""
    ps, po = text.find(SEQ_MARKER), text.find(OP_ID_MARKER)
    if ps < 0 and po < 0:
        return text, None, None
    return _split_ids_at(text, ps, po)


def _split_op_id(text: str) -> tuple[str, int | None, int | None]:
    """``split_ids`` of a text with an op_id marker. PyTorch's own shape, ``name[, seq = N], op_id
    = M[, …]`` with plain digits, is cut with ``str.partition`` (C); anything else goes the
    general way."""
    head, _, rest = text.partition(OP_ID_MARKER)
    digits, comma, tail = rest.partition(",")
    if digits.isdigit() and digits.isascii() and (not comma or tail[:1] == " ") and SEQ_MARKER not in tail:
        name, seq_found, seq = head.partition(", seq = ")
        core = name + "," + tail if comma else name
        if not seq_found:
            if SEQ_MARKER not in head:
                return core, int(digits), None
        elif SEQ_MARKER not in name and seq.isdigit() and seq.isascii():
            return core, int(digits), int(seq)
    return _split_ids_at(text, text.find(SEQ_MARKER), len(head))


def _split_ids_at(text: str, ps: int, po: int) -> tuple[str, int | None, int | None]:
    """``split_ids`` once the markers were found (``ps``, ``po``: their positions, -1 if absent;
    one at least). One function, no calls but ``str`` methods: it runs once per range."""
    first = ps if ps >= 0 and (po < 0 or ps < po) else po
    op_id = seq = None
    if po >= 0:
        after = po + _OP_ID_LEN
        end = text.find(",", after)
        digits = text[after:end] if end >= 0 else text[after:]
        op_id = int(digits) if digits.isdigit() and digits.isascii() else _sql_int(digits)
    else:
        after = ps + _SEQ_LEN
    if ps >= 0:
        end = text.find(",", ps + _SEQ_LEN)
        digits = (text[ps + _SEQ_LEN:end] if end >= 0 else text[ps + _SEQ_LEN:]).lstrip(" =")
        seq = int(digits) if digits.isdigit() and digits.isascii() else _sql_int(digits)
    comma = text.find(", ", after)
    return (text[:first] + text[comma:] if comma >= 0 else text[:first]), op_id, seq


_OP_ID_LEN, _SEQ_LEN = len(OP_ID_MARKER), len(SEQ_SPELLINGS[0])


def _sql_int(digits: str) -> int:
    """The leading integer of ``digits`` as SQLite's ``CAST(x AS INTEGER)`` reads it (0: none)."""
    if digits.isdigit() and digits.isascii():
        return int(digits)
    match = _SQL_INT.match(digits)
    return int(match.group(1)) if match else 0


# SQL: per process, the ranges by kind (see ``linker.read.nsys.Processes``).
HAS_OP_ID_SQL = f"instr(t, '{OP_ID_MARKER}') > 0"
HAS_SEQ_SQL = "(" + " OR ".join(f"instr(t, '{m}') > 0" for m in SEQ_SPELLINGS) + ")"


def runtime_events(rows, names: dict, in_order: bool = False) -> list[KinetoEvent]:
    """Rows (name key, driver?, pid, tid, ts, dur, correlation), sorted per thread by (ts, longer
    first, file order), threads in any order -> runtime events in ``cpu_event_order``; ``names``
    maps the key (a string id or a callback id) to the call's name. ``in_order``: as in
    ``cpu_events`` (``runtime_order_key``). O(n), one struct per row, plus the sort of a thread
    whose rows came out of order."""
    Event, Args = KinetoEvent, KinetoArgs
    threads = Threads()
    add = None
    cur_pid = cur_tid = None
    last_ts, last_dur = -_LAST, _LAST
    for key, driver, pid, tid, ts, dur, corr in rows:
        if tid != cur_tid or pid != cur_pid:
            if add is not None:
                threads.last[(cur_pid, cur_tid)] = (last_ts, last_dur)
            add, cur_pid, cur_tid = threads.switch(pid, tid)
            last_ts, last_dur = threads.last.get((cur_pid, cur_tid), (-_LAST, _LAST))
        if in_order:
            if ts < last_ts or (ts == last_ts and dur > last_dur):
                threads.unsorted.add((cur_pid, cur_tid))
            last_ts, last_dur = ts, dur
        add(Event("X", "cuda_driver" if driver else "cuda_runtime", names.get(key, ""), cur_pid, cur_tid, ts, dur,
                  None, Args(correlation=corr)))
    return threads.events(runtime_order_key)


def gpu_events(rows, names: dict | None = None) -> list[KinetoEvent]:
    """Rows (name, cat, device, stream, ts, dur, correlation) -> GPU events (pid = device,
    tid = stream), in row order; with ``names`` the first column is a key into it. O(n), one
    struct per row."""
    Event, Args = KinetoEvent, KinetoArgs
    events = []
    add = events.append
    lookup = names.get if names is not None else None
    for name, cat, device, stream, ts, dur, corr in rows:
        add(Event("X", cat, lookup(name, "") if lookup else name, device, stream, ts, dur, None,
                  Args(correlation=corr, stream_value=stream, device=device)))
    return events


# CUPTI enum names as Kineto writes them into memcpy / memset event names.
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP"}
MEMORY_KINDS = {1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
                7: "Managed Static"}


def _case_sql(column: str, names: dict[int, str]) -> str:
    whens = " ".join(f"WHEN {code} THEN '{name}'" for code, name in names.items())
    return f"CASE {column} {whens} ELSE 'Unknown' END"


def memcpy_name_sql(kind: str, src: str | None, dst: str | None) -> str:
    """SQL: Kineto's memcpy name, ``Memcpy HtoD (Pageable -> Device)``, from the CUPTI enums."""
    head = f"'Memcpy ' || {_case_sql(kind, MEMCPY_KINDS)}"
    if src is None or dst is None:
        return head
    return (f"{head} || ' (' || {_case_sql(src, MEMORY_KINDS)} || ' -> ' || "
            f"{_case_sql(dst, MEMORY_KINDS)} || ')'")


def memset_name_sql(kind: str | None) -> str:
    """SQL: Kineto's memset name, ``Memset (Device)``."""
    return "'Memset'" if kind is None else f"'Memset (' || {_case_sql(kind, MEMORY_KINDS)} || ')'"

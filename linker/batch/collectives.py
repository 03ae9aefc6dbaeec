"""A job's process groups and the cross-rank collective check of ``et-link batch``.

A simulator replays all ranks of a job together: every member of a process group must issue the
same collectives on it in the same order, and every send must meet its receive. This module
finds where a linked job breaks that.

Per rank, in the rank's worker (``rank_collectives``): the communication ops the rank's ET+
holds, per process group (job-wide ids, see ``plan.comm``: PyTorch's pg_name + 1), in GPU start
order, as ``plan.comm.CommResolver`` resolves them for the Chakra writer: collectives (type,
bytes, dtype when known) and point-to-point ops (send / recv, bytes, dtype, peer as a global
rank), plus the groups ``## process_group:init ##`` lists. Kernels the resolver cannot resolve
are only counted (the ``.et`` holds them as COMP_NODE). It is stored compactly in the rank's
report sidecar (``RankCollectives.to_record`` / ``from_record``), so skipped ranks keep it.

In the batch process (``check_job``):
- ``job_comm_groups``: the job's groups ``{id: global ranks}`` from the ranks' tables (a rank
  lists the groups it belongs to); the world group "1" is all ranks of the job
  (``distributedInfo.world_size``, else the ranks given) when no trace lists it (PyTorch 2.0);
  a group no trace describes gets the ranks that use it. Ranks disagreeing on a group's members
  is a divergence. Written as ``comm_groups.json`` (ASTRA-sim's ``--comm-group-configuration``).
- ``check_collectives``: per group, the members' collective sequences are compared position by
  position; the first position where they differ is the group's divergence, with what each rank
  has there. Point-to-point ops are compared per (group, sender, receiver): the k-th send must
  meet the k-th receive with the same bytes and dtype. A rank issuing on a group it is not a
  member of is a divergence too. Ranks without a record (failed) and members outside the batch
  are listed, not compared.
Cost: O(GPU ops) per rank; O(total comm ops + ranks x groups) in the batch process.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import orjson

from linker.model import chakra_kinds as kinds
from linker.plan.comm import WORLD_GROUP_ID, is_comm_kernel, read_process_groups
from linker.plan.cpu_comm import issue_numbers
from linker.plan.deps import dependency_plan
from linker.model.errors import TraceInputError
from linker.link.etplus import EtPlus
from linker.write.sink import atomic_output

COMM_GROUPS_FILE = "comm_groups.json"
SIDECAR_KEY = "collectives"
SEND, RECV = "SEND", "RECV"
CONSISTENT, MISMATCH, NOT_CHECKED = "consistent", "mismatch", "not checked"
TABLE_GROUPS, TABLE_LINES = 4, 20  # the printed table names at most this many groups / divergences / notes


# --- one rank ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommOp:
    """One communication op as the simulator sees it. ``kind``: a CollectiveCommType name
    (ALL_REDUCE…) or SEND / RECV; ``peer``: the other side's global rank (point-to-point only)."""

    kind: str
    size: int
    dtype: str | None = None
    peer: int | None = None

    def matches(self, other: CommOp) -> bool:
        """Same kind, bytes and peer; dtypes equal or unknown on either side."""
        return (self.kind, self.size, self.peer) == (other.kind, other.size, other.peer) and (
            self.dtype is None or other.dtype is None or self.dtype == other.dtype)

    def describe(self) -> str:
        text = f"{self.kind} {self.size} B" + (f" {self.dtype}" if self.dtype else "")
        if self.peer is not None:
            text += f" {'to' if self.kind == SEND else 'from'} rank {self.peer}"
        return text

    def to_record(self) -> list:
        return [self.kind, self.size, self.dtype] + ([self.peer] if self.peer is not None else [])

    @staticmethod
    def from_record(item: list, interned: dict | None = None) -> CommOp:
        """From ``to_record``'s list; equal ops share one object through ``interned`` (a job
        repeats few distinct ops many times: memory per op is then one list slot)."""
        key = tuple(item)
        op = interned.get(key) if interned is not None else None
        if op is None:
            op = CommOp(str(item[0]), int(item[1]), item[2], int(item[3]) if len(item) > 3 else None)
            if interned is not None:
                interned[key] = op
        return op


@dataclass
class RankCollectives:
    """A rank's communication ops per group id, in GPU start order: ``collectives`` and
    ``point_to_point`` (send / recv) apart; and the groups its trace lists."""

    groups: dict[str, list[int]] = field(default_factory=dict)
    collectives: dict[str, list[CommOp]] = field(default_factory=dict)
    point_to_point: dict[str, list[CommOp]] = field(default_factory=dict)
    unresolved: int = 0
    # Per group, the sequence number of each collective (parallel to ``collectives``; None where
    # the trace gives none): Kineto "Seq", record_param_comms' first input.
    seqs: dict[str, list[int | None]] = field(default_factory=dict)
    # Per group, issue numbers of CPU collectives the rank issued but its ET lost (``cpu_comm``).
    unrecorded: dict[str, list[int]] = field(default_factory=dict)

    def add(self, group: str, op: CommOp, seq: int | None = None) -> None:
        if op.kind in (SEND, RECV):
            self.point_to_point.setdefault(group, []).append(op)
            return
        self.collectives.setdefault(group, []).append(op)
        self.seqs.setdefault(group, []).append(seq)

    def groups_used(self) -> set[str]:
        return set(self.collectives) | set(self.point_to_point)

    def to_record(self) -> dict:
        """Compact JSON-able form for the report sidecar: ops as ``[kind, bytes, dtype(, peer)]``."""
        record = {"groups": self.groups, "unresolved": self.unresolved,
                  "collectives": {g: [op.to_record() for op in ops] for g, ops in self.collectives.items()},
                  "point_to_point": {g: [op.to_record() for op in ops] for g, ops in self.point_to_point.items()}}
        seqs = {g: values for g, values in self.seqs.items() if any(v is not None for v in values)}
        if seqs:
            record["seqs"] = seqs
        if self.unrecorded:
            record["unrecorded"] = self.unrecorded
        return record

    @staticmethod
    def from_record(record: dict, interned: dict | None = None) -> RankCollectives:
        """Inverse of ``to_record``; raises KeyError / TypeError / ValueError on a malformed record."""
        def ops(key: str) -> dict[str, list[CommOp]]:
            return {str(g): [CommOp.from_record(item, interned) for item in items] for g, items in record[key].items()}

        groups = {str(g): [int(r) for r in ranks] for g, ranks in record["groups"].items()}
        collectives = ops("collectives")
        seqs = {str(g): [None if v is None else int(v) for v in values] for g, values in (record.get("seqs") or {}).items()}
        seqs = {g: seqs.get(g, [None] * len(items)) for g, items in collectives.items()}
        unrecorded = {str(g): [int(v) for v in values] for g, values in (record.get("unrecorded") or {}).items()}
        return RankCollectives(groups, collectives, ops("point_to_point"), int(record.get("unresolved") or 0), seqs,
                               unrecorded)


def rank_collectives(et_plus: EtPlus) -> RankCollectives:
    """The communication ops of one linked rank, as the Chakra writer resolved them (the
    dependency plan's ``comm`` and ``cpu_comm``, computed once per ET+): communication kernels in
    GPU start order, then CPU collectives in issue (ET id) order. Cost: O(GPU ops log GPU ops)."""
    plan = dependency_plan(et_plus)
    kernels = [k for k, node in enumerate(et_plus.gpu_nodes) if is_comm_kernel(node)]
    kernels.sort(key=lambda k: (et_plus.gpu_nodes[k].ts, et_plus.gpu_nodes[k].correlation or 0))
    result = RankCollectives(groups=read_process_groups(et_plus).job_groups())
    # CPU collectives (gloo, MPI, UCC) in issue order: ET ids are given when the op is issued,
    # while the backend's worker threads may start them in another order.
    cpu = sorted(plan.cpu_comm, key=et_plus.et.ids.__getitem__)
    for attrs in [plan.comm[k] for k in kernels] + [plan.cpu_comm[i] for i in cpu]:
        seq = attrs.seq
        if attrs.node_type == kinds.COMM_COLL_NODE:
            op = CommOp(kinds.collective_name(attrs.comm_type), attrs.comm_size, attrs.dtype)
        elif attrs.node_type == kinds.COMM_SEND_NODE:
            op = CommOp(SEND, attrs.comm_size, attrs.dtype, attrs.comm_dst)
        elif attrs.node_type == kinds.COMM_RECV_NODE:
            op = CommOp(RECV, attrs.comm_size, attrs.dtype, attrs.comm_src)
        else:
            result.unresolved += 1
            continue
        result.add(attrs.pg_name or WORLD_GROUP_ID, op, seq)
    numbered = [i for i in cpu if plan.cpu_comm[i].seq is not None]
    if numbered:  # issue numbers of calls whose collective the ET lost (it ended after the trace stopped)
        _, lost = issue_numbers(et_plus, numbered)
        if lost:
            result.unrecorded[plan.cpu_comm[numbered[0]].pg_name or WORLD_GROUP_ID] = lost
    return result


def load_rank_collectives(report_path: str | Path | None, interned: dict | None = None) -> RankCollectives | None:
    """The record a rank's worker left in its report sidecar, or None (no sidecar, no record)."""
    if not report_path:
        return None
    try:
        return RankCollectives.from_record(orjson.loads(Path(report_path).read_bytes())[SIDECAR_KEY], interned)
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None


# --- the job ----------------------------------------------------------------------------------


@dataclass
class RankOps:
    """What some ranks have at a divergence."""

    ranks: list[int]
    has: str


@dataclass
class Divergence:
    """The first place a group's ranks disagree. ``kind``: "collective", "point-to-point" or
    "membership"; ``position``: 0-based index in the group's collective sequence (or in the
    sender -> receiver channel for point-to-point); ``ranks_at_fault``: the ranks that differ from
    most members (all compared ranks when there is no majority)."""

    group: str
    kind: str
    position: int | None
    ranks_at_fault: list[int]
    has: list[RankOps]
    message: str


@dataclass
class GroupCheck:
    group: str
    ranks: list[int]  # members (global ranks)
    ranks_compared: list[int]  # members with a record in this batch
    collectives: int  # collectives per member (the longest sequence)
    point_to_point: int  # send + recv ops of all members
    status: str
    matched_by: str = "position"  # how the members' collectives were paired: "sequence number" or "position"


@dataclass
class CollectiveCheck:
    """``summary.json``'s ``collectives``: ``status`` consistent / mismatch / not checked."""

    status: str
    groups: list[GroupCheck]
    divergences: list[Divergence]
    ranks_without_record: list[int]
    unresolved_kernels: int
    notes: list[str]
    comm_groups_file: str | None = None

    @property
    def mismatch(self) -> bool:
        return self.status == MISMATCH


def _group_order(group: str) -> tuple:
    return (0, int(group), "") if group.isdigit() else (1, 0, group)


def job_comm_groups(records: dict[int, RankCollectives], job_ranks: list[int], world_size: int | None,
                    divergences: list[Divergence], notes: list[str]) -> dict[str, list[int]]:
    """The job's groups ``{id: sorted global ranks}``; disagreements become divergences. O(ranks x groups)."""
    table: dict[str, list[int]] = {}
    claimed_by: dict[str, int] = {}
    disputed: set[str] = set()
    for rank in sorted(records):
        for group, ranks in records[rank].groups.items():
            ranks = sorted(ranks)
            if group not in table:
                table[group], claimed_by[group] = ranks, rank
            elif table[group] != ranks and group not in disputed:
                disputed.add(group)
                has = [RankOps([claimed_by[group]], f"members {_ranks_text(table[group])}"),
                       RankOps([rank], f"members {_ranks_text(ranks)}")]
                divergences.append(Divergence(group, "membership", None, [rank], has,
                                              f"group {group}: ranks {claimed_by[group]} and {rank} list different members"))
    if WORLD_GROUP_ID not in table:
        table[WORLD_GROUP_ID] = list(range(world_size)) if world_size else sorted(set(job_ranks))
    users: dict[str, list[int]] = defaultdict(list)
    for rank in sorted(records):
        for group in sorted(records[rank].groups_used()):
            users[group].append(rank)
    for group in sorted(set(users) - set(table), key=_group_order):
        table[group] = users[group]
        notes.append(f"group {group}: no trace lists its members; taken as the ranks using it "
                     f"({_ranks_text(users[group])})")
    return {group: table[group] for group in sorted(table, key=_group_order)}


def format_ranks(ranks: Iterable[int]) -> str:
    """``0-3,5,7-9``."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        spans.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(spans)


def _ranks_text(ranks: Iterable[int]) -> str:
    return format_ranks(ranks) or "none"


def _first_difference(sequences: dict[int, list[CommOp]]) -> int | None:
    """First position where the sequences differ (or one ends), else None. O(total length)."""
    ranks = list(sequences)
    reference = sequences[ranks[0]]
    longest = max(len(s) for s in sequences.values())
    for position in range(longest):
        first = reference[position] if position < len(reference) else None
        for rank in ranks[1:]:
            sequence = sequences[rank]
            other = sequence[position] if position < len(sequence) else None
            if first is None or other is None:
                if first is not other:
                    return position
            elif first is not other and not first.matches(other):
                return position
    return None


def _at(sequence: list[CommOp], position: int, label: str) -> str:
    if position < len(sequence):
        return sequence[position].describe()
    return f"nothing: its {label} end after {len(sequence)}"


def _ranks_by_text(texts: Iterable[tuple[int, str]]) -> list[RankOps]:
    """``(rank, what it has)`` pairs grouped by what they have, in the order each first appears."""
    by_text: dict[str, list[int]] = defaultdict(list)
    for rank, text in texts:
        by_text[text].append(rank)
    return [RankOps(ranks, text) for text, ranks in by_text.items()]


def _who_has(sequences: dict[int, list[CommOp]], position: int, label: str) -> tuple[list[RankOps], list[int]]:
    """Ranks grouped by what they have at ``position``, largest group first; the ranks outside the
    largest group (every compared rank when no group is larger than all others)."""
    has = sorted(_ranks_by_text((rank, _at(sequence, position, label)) for rank, sequence in sequences.items()),
                 key=lambda r: (-len(r.ranks), r.ranks))
    if len(has) > 1 and len(has[0].ranks) > len(has[1].ranks):
        return has, sorted(r for entry in has[1:] for r in entry.ranks)
    return has, sorted(sequences)  # no majority: every compared rank is a suspect


def _summary(has: list[RankOps]) -> str:
    return "; ".join(f"rank{'s' if len(h.ranks) > 1 else ''} {_ranks_text(h.ranks)}: {h.has}" for h in has)


def _check_group_collectives(group: str, sequences: dict[int, list[CommOp]]) -> Divergence | None:
    position = _first_difference(sequences) if len(sequences) > 1 else None
    if position is None:
        return None
    has, at_fault = _who_has(sequences, position, "collectives")
    return Divergence(group, "collective", position, at_fault, has,
                      f"group {group}, collective #{position}: {_summary(has)}")


def _check_channel(group: str, sender: int, receiver: int, sends: list[CommOp], recvs: list[CommOp]) -> Divergence | None:
    """The k-th send of ``sender`` to ``receiver`` must meet the k-th receive of ``receiver``."""
    for position in range(max(len(sends), len(recvs))):
        send = sends[position] if position < len(sends) else None
        recv = recvs[position] if position < len(recvs) else None
        if send is not None and recv is not None and send.size == recv.size and (
                send.dtype is None or recv.dtype is None or send.dtype == recv.dtype):
            continue
        has = [RankOps([sender], send.describe() if send else f"nothing: its sends to rank {receiver} end after {len(sends)}"),
               RankOps([receiver], recv.describe() if recv else f"nothing: its receives from rank {sender} end after {len(recvs)}")]
        at_fault = [sender] if send is None else [receiver] if recv is None else [sender, receiver]
        return Divergence(group, "point-to-point", position, at_fault, has,
                          f"group {group}, send #{position} from rank {sender} to rank {receiver}: "
                          f"rank {sender} has {has[0].has}; rank {receiver} has {has[1].has}")
    return None


def _check_group_point_to_point(group: str, records: dict[int, RankCollectives], notes: list[str]) -> Divergence | None:
    sends: dict[tuple[int, int], list[CommOp]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[CommOp]] = defaultdict(list)
    for rank, record in records.items():
        for op in record.point_to_point.get(group, ()):
            if op.kind == SEND:
                sends[(rank, op.peer)].append(op)
            elif op.kind == RECV:
                recvs[(op.peer, rank)].append(op)
    unmatched = 0
    for sender, receiver in sorted(set(sends) | set(recvs)):
        if sender not in records or receiver not in records:
            unmatched += 1
            continue
        divergence = _check_channel(group, sender, receiver, sends.get((sender, receiver), []),
                                    recvs.get((sender, receiver), []))
        if divergence is not None:
            return divergence
    if unmatched:
        notes.append(f"group {group}: {unmatched} send/recv channel(s) with a side outside this batch, not compared")
    return None


def check_collectives(records: dict[int, RankCollectives], table: dict[str, list[int]],
                      divergences: list[Divergence], notes: list[str]) -> list[GroupCheck]:
    """Compare every group's members; append the first divergence per group and kind. O(total ops)."""
    groups = []
    for group, members in table.items():
        compared = [r for r in members if r in records]
        member_set = set(members)
        sequences = {r: records[r].collectives.get(group, []) for r in compared}
        counted = max((len(s) for s in sequences.values()), default=0)
        sequences, matched_by, seq_divergence = _by_sequence_number(group, records, compared, sequences, notes)
        found = [d for d in (seq_divergence or _check_group_collectives(group, sequences),
                             _check_group_point_to_point(group, records, notes)) if d is not None]
        outsiders = sorted(r for r, record in records.items()
                           if r not in member_set and (record.collectives.get(group) or record.point_to_point.get(group)))
        if outsiders:
            found.append(Divergence(group, "membership", None, outsiders,
                                    [RankOps(outsiders, "ops on a group it is not a member of")],
                                    f"group {group}: rank(s) {_ranks_text(outsiders)} issue ops on it but are "
                                    f"not members ({_ranks_text(members)})"))
        missing = sorted(member_set - set(compared))
        if missing:
            notes.append(f"group {group}: member rank(s) {_ranks_text(missing)} have no record here, not compared")
        divergences += found
        point_to_point = sum(len(records[r].point_to_point.get(group, ())) for r in compared)
        status = MISMATCH if found or any(d.group == group for d in divergences) else CONSISTENT
        groups.append(GroupCheck(group, members, compared, counted, point_to_point, status, matched_by))
    return groups


def _by_sequence_number(group: str, records: dict[int, RankCollectives], compared: list[int],
                        sequences: dict[int, list[CommOp]], notes: list[str] | None = None
                        ) -> tuple[dict[int, list[CommOp]], str, Divergence | None]:
    """Pair the members' collectives by sequence number when every one of them carries one
    (distinct per rank); else by position (returns the sequences as given, "position", None).

    Numbers are visited in increasing order; the first one some member lacks (and whose ET did not
    merely lose it: ``RankCollectives.unrecorded``), or whose ops differ between members, is the
    divergence, returned with each rank's ops in number order. Without one, every number was
    compared here: returns empty sequences. O(ops log ops + numbers x ranks)."""
    numbers: dict[int, list[int]] = {}
    for rank in compared:
        seqs = records[rank].seqs.get(group) or []
        ops = sequences[rank]
        if not ops or len(seqs) != len(ops) or any(s is None for s in seqs) or len(set(seqs)) != len(seqs):
            return sequences, "position", None
        numbers[rank] = seqs
    if len(numbers) < 2:
        return sequences, "position", None
    holders_of: dict[int, dict[int, CommOp]] = defaultdict(dict)  # number -> {rank: its op}, ranks in compared order
    for rank, seqs in numbers.items():
        for seq, op in zip(seqs, sequences[rank]):
            holders_of[seq][rank] = op
    ranks = sorted(numbers)
    lost_by_rank = {rank: set(records[rank].unrecorded.get(group, ())) for rank in ranks}
    lost = 0
    for position, seq in enumerate(sorted(holders_of)):
        holders = holders_of[seq]
        lacking = [rank for rank in ranks if rank not in holders]
        if lacking and all(seq in lost_by_rank[rank] for rank in lacking):
            lost += 1  # issued there too; its ET lost it (still running when the trace stopped)
            lacking = []
        first = next(iter(holders.values()))
        if lacking:
            has = _ranks_by_text((rank, op.describe()) for rank, op in sorted(holders.items()))
            has.append(RankOps(lacking, f"nothing with sequence number {seq}"))
            at_fault = lacking
        elif any(op is not first and not op.matches(first) for op in holders.values()):
            has, at_fault = _who_has({rank: [op] for rank, op in sorted(holders.items())}, 0, "collectives")
        else:
            continue
        in_number_order = {rank: [op for _, op in sorted(zip(seqs, sequences[rank]), key=lambda pair: pair[0])]
                           for rank, seqs in numbers.items()}
        return in_number_order, "sequence number", Divergence(
            group, "collective", position, at_fault, has,
            f"group {group}, collective #{position} (sequence number {seq}): {_summary(has)}")
    if lost and notes is not None:
        notes.append(f"group {group}: {lost} CPU collective(s) issued on every rank are missing from some ranks' "
                     f"ETs (still running when the trace stopped); compared where present")
    return {rank: [] for rank in numbers}, "sequence number", None  # compared number by number above


def write_comm_groups(table: dict[str, list[int]], path: Path) -> None:
    """ASTRA-sim's ``--comm-group-configuration``: ``{"<id>": [global ranks]}``, ids >= 1."""
    lines = [orjson.dumps(group) + b": " + orjson.dumps(ranks) for group, ranks in table.items()]
    with atomic_output(path) as out:
        out.write(b"{\n  " + b",\n  ".join(lines) + b"\n}\n")


def check_job(report_paths: dict[int, str | None], job_ranks: list[int], world_size: int | None,
              comm_groups_path: Path | None = None) -> CollectiveCheck:
    """Load each rank's record, build the job's groups (written to ``comm_groups_path`` when
    given), compare. ``report_paths``: rank -> report sidecar of the ranks that linked.
    Cost: one sidecar read per rank + O(total comm ops)."""
    interned: dict[tuple, CommOp] = {}
    records = {rank: rec for rank, path in sorted(report_paths.items())
               if (rec := load_rank_collectives(path, interned)) is not None}
    without = sorted(set(job_ranks) - set(records))
    divergences: list[Divergence] = []
    notes: list[str] = []
    table = job_comm_groups(records, job_ranks, world_size, divergences, notes)
    written = None
    if comm_groups_path is not None:
        try:
            write_comm_groups(table, comm_groups_path)
            written = str(comm_groups_path)
        except (OSError, TraceInputError) as err:
            notes.append(f"{comm_groups_path} not written: {err}")
    groups = check_collectives(records, table, divergences, notes) if records else []
    if len(records) < 2:
        status = NOT_CHECKED
        notes.append("fewer than two ranks have a collective record: nothing to compare")
    else:
        status = MISMATCH if divergences else CONSISTENT
    return CollectiveCheck(status, groups, sorted(divergences, key=lambda d: (_group_order(d.group), d.kind)),
                           without, sum(r.unresolved for r in records.values()), notes, written)


def format_check(check: CollectiveCheck) -> list[str]:
    """The lines the batch table prints about the check."""
    compared = sorted({r for g in check.groups for r in g.ranks_compared})
    if check.status == NOT_CHECKED:
        lines = [f"collectives: not checked ({'; '.join(check.notes) or 'no record'})"]
    elif check.status == CONSISTENT:
        per_group = [f"group {g.group}: {g.collectives} collectives"
                     + (f" + {g.point_to_point} send/recv" if g.point_to_point else "")
                     + f" on ranks {_ranks_text(g.ranks_compared)}"
                     + (", matched by sequence number" if g.matched_by == "sequence number" else "")
                     for g in check.groups[:TABLE_GROUPS]]
        if len(check.groups) > TABLE_GROUPS:
            per_group.append(f"{len(check.groups) - TABLE_GROUPS} more groups")
        lines = [f"collectives: consistent across {len(compared)} ranks ({', '.join(per_group)})"]
    else:
        lines = [f"collectives: MISMATCH in {len({d.group for d in check.divergences})} group(s) "
                 "(the simulator would hang or abort on this job):"]
        lines += [f"  {d.message} -> rank(s) {_ranks_text(d.ranks_at_fault)}" for d in check.divergences[:TABLE_LINES]]
        if len(check.divergences) > TABLE_LINES:
            lines.append(f"  ... {len(check.divergences) - TABLE_LINES} more divergences in summary.json")
    if check.ranks_without_record:
        lines.append(f"  not compared (failed or no record): ranks {_ranks_text(check.ranks_without_record)}")
    if check.unresolved_kernels:
        lines.append(f"  {check.unresolved_kernels} communication kernel(s) unresolved (written as COMP_NODE), not compared")
    if check.comm_groups_file:
        lines.append(f"comm groups: {check.comm_groups_file}")
    if check.status != NOT_CHECKED:
        lines += [f"  note: {note}" for note in check.notes[:TABLE_LINES]]
        if len(check.notes) > TABLE_LINES:
            lines.append(f"  ... {len(check.notes) - TABLE_LINES} more notes in summary.json")
    return lines

"""The cross-rank check's pairing of collectives by sequence number, against a plain reference.

``reference_pairing`` below restates the rule the slowest way that is obviously right: for each
sequence number in increasing order, scan every rank's whole list for it. Random jobs with
dropped, lost, resized and dtype-less collectives must give the same divergence (or none) and the
same notes from ``_by_sequence_number``.
"""

from __future__ import annotations

import random

from linker.batch.collectives import CommOp, RankCollectives, _by_sequence_number

GROUP = "1"
KINDS = ["ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER"]


def random_job(rng: random.Random) -> tuple[dict[int, RankCollectives], list[int]]:
    """2-6 ranks issuing numbered collectives; each rank may drop some (sometimes noting them as
    lost by its ET), resize one, or leave a dtype unknown; issue order shuffled per rank."""
    ranks = rng.randint(2, 6)
    numbers = rng.sample(range(1000), rng.randint(1, 30))
    program = {seq: CommOp(rng.choice(KINDS), rng.choice([64, 4096]), rng.choice(["float", "half"])) for seq in numbers}
    records = {}
    for rank in range(ranks):
        record = RankCollectives()
        issued = []
        for seq in numbers:
            op = program[seq]
            roll = rng.random()
            if roll < 0.03:
                if rng.random() < 0.7:
                    record.unrecorded.setdefault(GROUP, []).append(seq)
                continue
            if roll < 0.05:
                op = CommOp(op.kind, op.size * 2, op.dtype)
            elif roll < 0.10:
                op = CommOp(op.kind, op.size, None)
            elif roll < 0.12:
                op = CommOp(op.kind, op.size, "bfloat16")
            issued.append((seq, op))
        rng.shuffle(issued)
        for seq, op in issued:
            record.add(GROUP, op, seq)
        records[rank] = record
    compared = list(records)
    rng.shuffle(compared)  # the first holder of a number is the first in this order
    return records, compared


def reference_pairing(records: dict[int, RankCollectives], compared: list[int]):
    """``(position, sequence number, ranks at fault, [(ranks, what they have)])`` of the first
    divergence, or None; and the count of numbers some ETs lost."""
    every = sorted({seq for rank in compared for seq in records[rank].seqs[GROUP]})
    lost = 0
    for position, seq in enumerate(every):
        holders = []  # (rank, op) in compared order
        for rank in compared:
            for number, op in zip(records[rank].seqs[GROUP], records[rank].collectives[GROUP]):
                if number == seq:
                    holders.append((rank, op))
        holding = [rank for rank, _ in holders]
        lacking = sorted(rank for rank in compared if rank not in holding)
        if lacking and all(seq in records[rank].unrecorded.get(GROUP, []) for rank in lacking):
            lost += 1
            lacking = []
        texts = {}  # what each rank has, ranks ascending
        for rank, op in sorted(holders, key=lambda pair: pair[0]):
            texts[rank] = op.describe()
        if lacking:
            groups = []
            for text in dict.fromkeys(texts.values()):
                groups.append(([rank for rank in texts if texts[rank] == text], text))
            groups.append((lacking, f"nothing with sequence number {seq}"))
            return (position, seq, lacking, groups), lost
        first = holders[0][1]
        differs = False
        for _, op in holders[1:]:
            same_dtype = op.dtype is None or first.dtype is None or op.dtype == first.dtype
            if (op.kind, op.size, op.peer) != (first.kind, first.size, first.peer) or not same_dtype:
                differs = True
        if differs:
            groups = [([rank for rank in texts if texts[rank] == text], text) for text in set(texts.values())]
            groups.sort(key=lambda group: (-len(group[0]), group[0]))
            if len(groups[0][0]) > len(groups[1][0]):
                at_fault = sorted(rank for ranks, _ in groups[1:] for rank in ranks)
            else:
                at_fault = sorted(holding)
            return (position, seq, at_fault, groups), lost
    return None, lost


def test_pairing_by_number_agrees_with_the_plain_reference_on_random_jobs():
    rng = random.Random(45)
    outcomes = {"consistent": 0, "lacking": 0, "differs": 0, "lost": 0}
    for _ in range(400):
        records, compared = random_job(rng)
        sequences = {rank: records[rank].collectives.get(GROUP, []) for rank in compared}
        if not all(sequences.values()):
            continue  # a rank with no collective at all is paired by position (not this test)
        notes: list[str] = []
        paired, matched_by, divergence = _by_sequence_number(GROUP, records, compared, sequences, notes)
        expected, lost = reference_pairing(records, compared)
        assert matched_by == "sequence number"
        if expected is None:
            assert divergence is None
            assert paired == {rank: [] for rank in compared}
            outcomes["consistent"] += 1
        else:
            position, seq, at_fault, groups = expected
            assert (divergence.position, divergence.ranks_at_fault) == (position, at_fault)
            assert [(h.ranks, h.has) for h in divergence.has] == groups
            assert f"collective #{position} (sequence number {seq}): " in divergence.message
            outcomes["lacking" if groups[-1][1].startswith("nothing") else "differs"] += 1
            for rank in compared:  # each rank's ops in number order
                by_number = dict(zip(records[rank].seqs[GROUP], records[rank].collectives[GROUP]))
                assert paired[rank] == [by_number[seq] for seq in sorted(by_number)]
        if expected is None and lost:
            assert notes == [f"group {GROUP}: {lost} CPU collective(s) issued on every rank are missing from some "
                             f"ranks' ETs (still running when the trace stopped); compared where present"]
            outcomes["lost"] += 1
        else:
            assert notes == []
    assert min(outcomes.values()) >= 5, outcomes  # every branch was exercised


def test_a_rank_without_numbers_falls_back_to_position():
    records = {0: RankCollectives(), 1: RankCollectives()}
    op = CommOp("ALL_REDUCE", 64, "float")
    records[0].add(GROUP, op, 3)
    records[1].add(GROUP, op, None)
    sequences = {rank: records[rank].collectives[GROUP] for rank in records}
    assert _by_sequence_number(GROUP, records, [0, 1], sequences) == (sequences, "position", None)

"""Chakra's node types and collective kinds as plain ints and names.

These are the values of ``NodeType`` and ``CollectiveCommType`` in ``schema/et_def.proto`` (the
generated ``et_def_pb2`` holds the same; ``tests/test_chakra_kinds.py`` checks every one). The plan,
the JSON output and the job's collective check name communication with these, so a JSON run does
not load protobuf (about 18 ms, an eighth of a small pair's run); the ``.et`` writer and readers use
``et_def_pb2`` itself. docs/formats.md describes the attributes.
"""

from __future__ import annotations

# NodeType
COMP_NODE = 4
COMM_SEND_NODE = 5
COMM_RECV_NODE = 6
COMM_COLL_NODE = 7

# CollectiveCommType: its names, each at its value
COLLECTIVE_NAMES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST",
                    "ALL_TO_ALL", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
(ALL_REDUCE, REDUCE, ALL_GATHER, GATHER, SCATTER, BROADCAST, ALL_TO_ALL, REDUCE_SCATTER,
 REDUCE_SCATTER_BLOCK, BARRIER) = range(len(COLLECTIVE_NAMES))


def collective_name(comm_type: int) -> str:
    """The ``CollectiveCommType`` name of a value (``ValueError`` for a value it lacks, as
    protobuf's ``CollectiveCommType.Name``)."""
    if isinstance(comm_type, int) and 0 <= comm_type < len(COLLECTIVE_NAMES):
        return COLLECTIVE_NAMES[comm_type]
    raise ValueError(f"no CollectiveCommType has the value {comm_type!r}")

"""Check the ET and compute its tree order in a forked child while the parent takes the Kineto
child's parts (the two halves of reading a pair are independent until matching).

When the Kineto child (``kineto_ahead``) has made everything by the time the ET is read, the parent
still has to decode the child's parts, while the ET's own work waits behind it: the input check
(``sanity.check_execution_trace``) and the plan's tree order (``chakra_deps.tree_order``), about
0.2 s on a 360k-node ET. ``start(et)`` forks a child that does both on its copy-on-write view of the
ET and sends back the tree order's columns, and the parents' positions (``parent_index``, which
the tree order makes on the way and linking uses), as machine arrays; ``finish(child, et)`` puts
them on the ET, whose map of ids (``index_of_id``) the parent then need not build. Only a clean
check counts: a check that repairs parents (the repair must change the parent's columns) or
refuses the ET makes the child fail, and so does anything else going wrong; ``finish`` then says
so and the caller runs the check itself, so its warnings or its refusal come exactly as without a
child, in the same place.

Cost: the fork (the ET's page tables), the check and the tree order in the child (slower than in
the parent: its first touch of each shared page copies it), then in the parent five C conversions
of n-element columns; after the fork, the parent's first write to each page it shared takes a
fault.
"""

from __future__ import annotations

from array import array

import msgspec

from .et_reader import ExecutionTrace
from .forked import ForkedCall, can_fork, spare_core
from .sanity import check_execution_trace

# Below this many nodes the check and the tree order take the parent a few milliseconds: less
# than a fork of its pages.
FORK_MIN_NODES = 50_000


class _Wire(msgspec.Struct, array_like=True):
    """``TreeOrder``'s columns as int64 machine arrays, and its count of dropped parents; the ET's
    ``parent_index`` (which the tree order computes on the way and linking uses) likewise."""

    by_id: bytes
    preorder: bytes
    parent: bytes
    chains: bytes
    dropped: int
    parent_index: bytes


_DECODE = msgspec.msgpack.Decoder(_Wire).decode


class _RepairNeeded(Exception):
    """The child's check repaired parents: the parent must repair its own columns."""


def start(et: ExecutionTrace) -> ForkedCall | None:
    """A child checking ``et`` and computing its tree order, or None (a small ET, no fork, a single
    core: the caller does the work itself)."""
    if len(et.nodes) < FORK_MIN_NODES or not can_fork() or not spare_core():
        return None
    try:
        return ForkedCall(lambda: _check_and_order(et))
    except OSError:
        return None


def _check_and_order(et: ExecutionTrace) -> bytes:
    """The child's work: the check (raising on a refusal or a repair), then the tree order."""
    from .chakra_deps import tree_order  # with the protobuf runtime: imported where it is used

    if check_execution_trace(et):
        raise _RepairNeeded
    order = tree_order(et)
    by_id, preorder, parent_index = (array("q", column).tobytes()
                                     for column in (order.by_id, order.preorder, et.parent_index()))
    wire = _Wire(by_id, preorder, order.parent.tobytes(), order.chains.tobytes(), order.dropped, parent_index)
    return msgspec.msgpack.encode(wire)


def finish(child: ForkedCall | None, et: ExecutionTrace) -> bool:
    """True when ``child`` found the ET clean (no warning, no refusal) and its tree order and parent
    positions are now ``et``'s (``tree_order``, ``parent_index()``); False otherwise (no child, a
    repair, a refusal, a failure): the caller checks the ET itself. Blocks until the child has
    exited."""
    payload = child.result() if child is not None else None
    if payload is None:
        return False
    try:
        wire = _DECODE(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    from .chakra_deps import TreeOrder

    columns = []
    for data in (wire.by_id, wire.preorder, wire.parent, wire.chains, wire.parent_index):
        column = array("q")
        column.frombytes(data)
        columns.append(column)
    if any(len(column) != len(et.nodes) for column in columns):
        return False
    by_id, preorder, parent, chains, parent_index = columns
    et.tree_order = TreeOrder(by_id.tolist(), preorder.tolist(), parent, wire.dropped, chains)
    et.adopt_parent_index(parent_index.tolist())
    return True

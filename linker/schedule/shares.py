"""Calls shared out among forked children: ``fn(*item)`` for each item, a few children at once.

``call_in_children(fn, items, children)`` forks up to ``children`` processes (``fork.ForkedCall``).
Child i makes the calls of items i, i + children, i + 2·children, ... one after the other, and
sends each result back as soon as it has it (pickled, with the item's index); the parent takes
them in item order, one from each child in turn, which is the order they are made in (a child
waiting for the parent to take a large result makes its next one meanwhile). It returns, per
item, the result in a 1-tuple, or None where none came back: the child failed at that call (an
exception, a signal) or before it. The caller makes those calls
itself, as the serial schedule does, so an error surfaces from the parent, in the parent's order,
as it would without children. Items reach the children through the fork (never pickled); results
must pickle. Only for a single-threaded parent (``fork.can_fork``: the caller checks). Cost: a
fork per child (the parent's page tables), the calls, one pipe copy per result.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator

from linker.schedule.fork import ForkedCall


def call_in_children(fn: Callable[..., Any], items: list[tuple], children: int) -> list[tuple | None]:
    """``fn(*item)`` for the items, shared out among ``children`` forked children (module
    docstring): each item's result as ``(result,)``, or None where the caller must call it. A child
    that cannot be made leaves its share to the caller. Items are dealt out in their order, so
    items sorted largest first give each child a like share."""
    calls: list[ForkedCall] = []
    try:
        for first in range(min(children, len(items))):
            calls.append(ForkedCall(_share(fn, items, range(first, len(items), children))))
    except OSError:  # no more processes: the shares not started are the caller's
        pass
    results: list[tuple | None] = [None] * len(items)
    running = [call.parts() for call in calls]
    try:
        while running:  # a round: the next result of each child still sending
            for parts in list(running):
                part = next(parts, None)
                if part is None:  # that child is done, or failed: the rest of its share stays None
                    running.remove(parts)
                    continue
                index, value = pickle.loads(part)
                results[index] = (value,)
    finally:
        for call in calls:  # those not read to their end (an interrupt) are not left running
            call.cancel()
    return results


def _share(fn: Callable[..., Any], items: list[tuple], indices: range) -> Callable[[], Iterator[bytes]]:
    """The body of one child: the calls of ``indices``, each result sent as it is made."""
    def run() -> Iterator[bytes]:
        for index in indices:
            yield pickle.dumps((index, fn(*items[index])), protocol=pickle.HIGHEST_PROTOCOL)
    return run

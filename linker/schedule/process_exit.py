"""Ending a one-shot ``et-link`` process without tearing down what it built.

A link or a replay of a large trace builds millions of small objects (about 1 GB on a 360k-node
pair). Giving them back costs real time: re-enabling the cyclic collector makes its next pass walk
every object allocated while it was paused (about 0.27 s there), and freeing them by reference
counting another 0.2 s; the process is about to exit and the kernel takes the memory back at once.

``main()`` of the CLI calls ``enable()``: from then on ``fileio.collector_paused`` leaves the collector
off, and a command hands its results to ``keep_until_exit`` instead of dropping them. ``main`` ends the
process with ``exit_now`` (standard streams and logging flushed, then ``os._exit``) once the command
has returned and every output file is complete. A command that runs many pairs in one process
(``batch``, whose workers are forked from it) calls ``disable()`` first. Library callers never call
``enable()``, so for them nothing changes. Cost: O(1).
"""

from __future__ import annotations

import logging
import os
import sys

_one_shot = False
_kept: list = []


def enable() -> None:
    """This process ends when the current command does."""
    global _one_shot
    _one_shot = True


def disable() -> None:
    """This command runs many jobs in this process (or its forks): free and collect as usual."""
    global _one_shot
    _one_shot = False
    _kept.clear()


def one_shot() -> bool:
    return _one_shot


def keep_until_exit(*objects) -> None:
    """Keep ``objects`` alive until the process exits (nothing is kept unless ``enable()`` was called)."""
    if _one_shot:
        _kept.extend(objects)


def kept_anything() -> bool:
    return bool(_kept)


def exit_now(status: int) -> None:
    """Flush what the command printed or logged, then end the process without freeing anything."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader anyway
            pass
    logging.shutdown()
    os._exit(status)

"""Ending a one-shot ``et-link`` process without tearing down what it built.

A link or a replay of a large trace builds millions of small objects (about 1 GB on a 360k-node
pair). Giving them back costs real time: re-enabling the cyclic collector makes its next pass walk
every object allocated while it was paused (about 0.27 s there), and freeing them by reference
counting another 0.2 s; the process is about to exit and the kernel takes the memory back at once.

Whether a run is one-shot is the schedule's decision (``Schedule.one_shot``: the CLI's
``Schedule.auto()``): such a run leaves the collector off (``Schedule.collector_paused``) and hands
its results to ``keep_until_exit`` (through ``Schedule.keep_until_exit``) instead of dropping them.
``main`` of the CLI ends the process with ``exit_now`` (standard streams and logging flushed, then
``os._exit``) once the command has returned, every output file is complete and something was kept.
Library callers and batch workers run under ``Schedule.serial()``: nothing is kept, nothing
changes for them. Cost: O(1).
"""

from __future__ import annotations

import logging
import os
import sys

_kept: list = []


def keep_until_exit(*objects) -> None:
    """Keep ``objects`` alive until the process exits (``exit_now``)."""
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

"""The schedule: how one command's work is laid out over processes and threads.

Every speed decision of et-link is made here, and only here: whether a large Kineto trace is read
by a forked child while the parent reads the ET (``kineto_child``), whether a ``.et`` output's
ET-only fields are encoded by a child while the parent links (``fields_child``), whether a large
plain JSON output's file is filled from a thread meanwhile (``write.sink.OutputRoom``), whether
``simulate`` reads a large plain ``.et`` in two halves (``sim.load``), whether ``batch`` works on
a large job's outputs (their rank-start rewrites, their graphs read back for the ASTRA-sim setup)
in forked children (``each_output``), the size thresholds of each, the check for a spare core,
and whether the process ends with the command (``one_shot``: the collector is left off, what was
built is kept and the process exits without freeing it: ``process_exit``).

A ``Schedule`` is a frozen value chosen once, by whoever knows the machine, and passed down:
``Schedule.serial()`` (no child, no thread, no one-shot exit) is the default of the library
(``pipeline.link_pair``, ``pipeline.read_pair``, ``sim.load``) and of batch workers (which already
fill the cores); ``Schedule.auto()`` is the CLI's (children only with a spare core; one-shot
exit); ``Schedule.forced()`` runs every child whatever the sizes and cores (tests).

The outputs and the errors are the same under every schedule. The rule that makes them so, stated
once: a child that fails for any reason (a bad file, a signal, a payload that does not come whole)
leaves its work to the parent, which does it as the serial schedule does; an error is therefore
raised by the parent, in the order the serial schedule meets it (the ET first). Cost: O(1) per
decision (a ``stat`` of the input at most).

The wing's modules, which only this one decides to use: ``fork`` (run a function in a forked child,
take back its bytes), ``kineto_child`` (read, check and nest a Kineto trace in a child),
``fields_child`` (encode a ``.et``'s ET-only fields in a child), ``shares`` (calls shared out among
forked children), ``process_exit`` (end a one-shot process without freeing). Each was measured to
pay more than 3% of a large run (docs/performance.md); those that did not were removed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from linker.read.files import collector_paused
from linker.schedule import process_exit
from linker.read.timing import is_sqlite_file
from linker.schedule.fork import can_fork


def spare_core() -> bool:
    """True when this process may run on two cores or more (a child working beside it then runs
    in parallel; on one core it would only take the parent's time)."""
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) > 1


def _free_memory() -> int:
    """Bytes of memory free now (``sysconf``; a large number where it cannot tell)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 1 << 62


def _at_least(path, size: int) -> bool:
    """True when the file at ``path`` has ``size`` bytes or more (False when it cannot be read)."""
    try:
        return Path(path).stat().st_size >= size
    except OSError:
        return False


@dataclass(frozen=True)
class Schedule:
    """How a command's work is laid out; see the module docstring. Outputs are the same for all."""

    kineto_child: bool = False  # read, check and nest a large Kineto trace in a forked child
    fields_child: bool = False  # encode a large ET's own fields of a ``.et`` output in a forked child
    split_load: bool = False  # read a large plain ``.et`` back in two processes (``sim.load``)
    one_shot: bool = False  # the process ends with the command: no collection, no freeing
    child_min_bytes: int = 2 << 20  # smaller inputs are read (and encoded) quickly where they are
    split_min_bytes: int = 16 << 20  # smaller ``.et`` files are read about as fast by one process
    fields_batch_nodes: int = 2048  # nodes the fields child encodes between two reports of its progress
    wait_for_fields: bool = False  # the ``.et`` writer waits for the fields child to be done (tests)
    output_room: bool = False  # a large plain JSON output's file filled from a thread while linking
    room_min_bytes: int = 64 << 20  # smaller outputs get their pages quickly enough as they are written
    output_children: bool = False  # ``batch``: work on each of a job's outputs done by forked children
    output_min_bytes: int = 64 << 20  # smaller jobs' outputs are worked on quickly enough one after the other

    @classmethod
    def serial(cls) -> Schedule:
        """Everything in this process, one thing after the other: the library's default."""
        return cls()

    @classmethod
    def auto(cls, one_shot: bool = True) -> Schedule:
        """The CLI's: children where a second core can run them; the
        process ends with the command when ``one_shot``."""
        spare = spare_core()
        return cls(kineto_child=spare, fields_child=spare, split_load=spare, output_room=spare,
                   output_children=spare, one_shot=one_shot)

    @classmethod
    def forced(cls) -> Schedule:
        """Every child and thread, whatever the sizes and the cores (tests: the paths a large
        trace takes, on the fixtures)."""
        return cls(kineto_child=True, fields_child=True, split_load=True, output_room=True, output_children=True,
                   child_min_bytes=0, split_min_bytes=0, room_min_bytes=0, output_min_bytes=0)

    def without(self, **fields: bool) -> Schedule:
        """This schedule with some decisions turned off (or thresholds changed)."""
        return replace(self, **fields)

    # -- the decisions ----------------------------------------------------------------------------

    def kineto_reader(self, kineto_path):
        """A forked child reading and checking the Kineto trace at ``kineto_path``
        (``kineto_child.start``), or None: the parent reads it (``kineto_child.finish`` then
        gives None, as it does for a child that failed)."""
        if not (self.kineto_child and _at_least(kineto_path, self.child_min_bytes) and can_fork()):
            return None
        if is_sqlite_file(kineto_path):  # an Nsight Systems / nvprof file: SQL does its reading
            return None
        from linker.schedule import kineto_child

        return kineto_child.start(kineto_path)

    def fields_encoder(self, et_path, output):
        """For a ``.et`` output (an ``Output``): a forked child encoding the ET's own fields of
        its ops (``fields_child.FieldsAhead``), reporting every ``fields_batch_nodes`` nodes, or
        None: the writer encodes them all. With ``wait_for_fields`` the writer takes the child's
        fields once it is done or has ended: its share is then all it could do, whatever the timing."""
        if not (self.fields_child and output.format == "et" and can_fork()):
            return None
        from linker.schedule import fields_child

        return fields_child.start(et_path, self.child_min_bytes, self.fields_batch_nodes, self.wait_for_fields)

    def room_for(self, output, et_text_bytes: int):
        """For a plain ET+ JSON output (an ``Output``) of an ET of ``et_text_bytes`` bytes of text:
        an ``OutputRoom`` (``write.sink``) filling the output's file from a thread while the ET+
        is linked and planned, or None. Its size is a guess: the ET's text and a fifth (the ET+
        fields; the large CPU pair's ET+ is 1.14 times its ET). The JSON writer waits for no
        child then: the room is made on the core the Kineto child has left. None too when the
        room would take more than half the free memory (its zeros would then be written out to
        the disk, not just held in the page cache)."""
        size = et_text_bytes * 6 // 5
        if not (self.output_room and output.format == "json" and not output.compressed
                and size >= self.room_min_bytes and size <= _free_memory() // 2):
            return None
        from linker.write.sink import OutputRoom

        try:
            return OutputRoom(output.path, size)
        except OSError:  # no temporary file there: the write will say why
            return None

    def each_output(self, work, calls: list[tuple], sizes: list[int], processes: int) -> list[tuple | None]:
        """``work(*call)`` for each of a job's outputs (``sizes``: their bytes): ``batch``'s
        rank-start rewrites and its graphs read back for the ASTRA-sim setup, in up to
        ``processes`` forked children at once (``shares.call_in_children``) when this schedule
        has them, two outputs or more are worked on, they hold ``output_min_bytes`` together and
        this process can fork. Per call its result as ``(result,)``, or None where the caller
        makes the call itself: every call when no child runs, and those a child did not finish (it
        failed: the caller then meets the same error, in its own order). ``processes``: the ranks
        the batch runs at once, within its memory."""
        if not (self.output_children and processes > 1 and len(calls) > 1 and sum(sizes) >= self.output_min_bytes
                and can_fork()):
            return [None] * len(calls)
        from linker.schedule.shares import call_in_children

        return call_in_children(work, calls, processes)

    def splits_load(self, path) -> bool:
        """Whether the plain ``.et`` at ``path`` is read (``sim.load``: by ``simulate``, by the wait
        step after a link, by a batch's setup) in two processes."""
        return self.split_load and _at_least(path, self.split_min_bytes) and can_fork()

    def collector_paused(self):
        """The cyclic collector paused while the block runs (``files.collector_paused``); a
        one-shot process leaves it off (it exits without collecting)."""
        return collector_paused(leave_off=self.one_shot)

    def keep_until_exit(self, *objects) -> None:
        """A one-shot process keeps ``objects`` until it exits (``process_exit``); others drop them."""
        if self.one_shot:
            process_exit.keep_until_exit(*objects)


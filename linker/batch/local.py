"""Run the tasks on this machine: one fresh (forked) process per rank, no more at once than the
workers and than fit in the memory budget (``estimate_peak_bytes``). Step 3 of ``et-link batch``.
Cost: O(tasks^2) at worst for the memory fit scan; the work is the ranks' links.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import signal
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_ready

from linker.batch.progress import BatchProgress
from linker.batch.link_rank import run_rank_task
from linker.batch.tasks import RankResult, RankTask, failed_result, report_done

log = logging.getLogger("et_link")


@dataclass
class _Running:
    task: RankTask
    process: multiprocessing.process.BaseProcess
    connection: object  # the parent's end of the result pipe


def _exit_on_sigterm(signum, frame) -> None:
    sys.exit(128 + signum)  # unwinds, so a half-written output's temporary file is removed


def _local_child(task: RankTask, connection) -> None:
    """Body of a local worker process: ignore Ctrl-C (the parent stops us with SIGTERM), link,
    send the result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_AT_START)  # blocked by the parent around start()
    connection.send(run_rank_task(task))
    connection.close()


# Held back in a starting worker until it has its own handlers (``_local_child``).
_HELD_AT_START = {signal.SIGINT, signal.SIGTERM}


def _start_with_sigint_blocked(process) -> None:
    """Start a worker with Ctrl-C and SIGTERM blocked, so that neither can reach the child before it
    has its own handlers: a Ctrl-C during the fork, or the parent's SIGTERM to a worker it stops on
    an interrupt, would otherwise run the parent's handlers inherited through the fork (that race
    printed a child's traceback). A signal meanwhile is delivered to this process when the mask
    is restored, and to the child once its handlers are set."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_AT_START)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _process_context() -> multiprocessing.context.BaseContext:
    """``fork`` (no interpreter start, the parent's imports reused) when this process has a single
    thread; ``forkserver`` (preloaded with the linker) when threads exist, where fork is unsafe."""
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["linker.pipeline", "linker.batch"])
    return context


def exit_description(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        hint = " (killed: out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"worker process died with signal {name}{hint}"
    return f"worker process exited with status {exitcode} without a result"


def pick_next_task(pending: list[RankTask], memory_in_use: int, budget: int | None, running: int) -> int | None:
    """Index in ``pending`` (largest first) of the first task whose estimate fits the memory left;
    with nothing running the first task always starts (alone) so the batch cannot stall. O(pending)."""
    if not pending:
        return None
    if budget is None or running == 0:
        return 0
    for i, task in enumerate(pending):
        if memory_in_use + task.estimated_peak_bytes <= budget:
            return i
    return None


def run_local(tasks: list[RankTask], workers: int, memory_budget: int | None,
              progress: BatchProgress | None = None) -> list[RankResult]:
    """Run each task in a fresh local process, at most ``workers`` at once and (when
    ``memory_budget`` is given) only while the sum of running tasks' ``estimated_peak_bytes`` fits.

    Largest tasks first. A crashed worker (e.g. killed by the OOM killer) is that rank's failure.
    On KeyboardInterrupt the running workers are terminated and the interrupt re-raised.
    Cost: O(tasks^2) in the worst case for the memory fit scan (fine up to 10^4 ranks).
    """
    context = _process_context()
    pending = sorted(tasks, key=lambda t: (-t.estimated_peak_bytes, t.rank))
    running: dict[int, _Running] = {}
    results: list[RankResult] = []
    try:
        while pending or running:
            while len(running) < workers:
                in_use = sum(r.task.estimated_peak_bytes for r in running.values())
                index = pick_next_task(pending, in_use, memory_budget, len(running))
                if index is None:
                    break
                task = pending.pop(index)
                if memory_budget is not None and task.estimated_peak_bytes > memory_budget:
                    message = (f"rank {task.rank}: estimated peak memory {task.estimated_peak_bytes / 2**30:.1f} GiB "
                               f"exceeds the memory budget {memory_budget / 2**30:.1f} GiB; running it alone")
                    if progress:
                        progress.note(message)
                    else:
                        log.warning("%s", message)
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_local_child, args=(task, sender), name=f"et-link-rank{task.rank}")
                _start_with_sigint_blocked(process)
                sender.close()
                running[task.rank] = _Running(task, process, receiver)
                if progress:
                    progress.started(task.rank)
            ready = set(wait_for_ready([r.connection for r in running.values()]
                                       + [r.process.sentinel for r in running.values()], timeout=0.2))
            for rank, entry in list(running.items()):
                if entry.connection in ready or entry.process.sentinel in ready:
                    result = _collect(entry)
                    del running[rank]
                    results.append(result)
                    report_done(progress, entry.task, result)
            if progress:
                progress.tick()
    except BaseException:
        for entry in running.values():
            entry.process.terminate()
        for entry in running.values():
            entry.process.join(5)
            if entry.process.is_alive():
                entry.process.kill()
                entry.process.join()
        raise
    return results


def _collect(entry: _Running) -> RankResult:
    result = None
    try:
        if entry.connection.poll():
            result = entry.connection.recv()
    except (EOFError, OSError, pickle.UnpicklingError):
        result = None
    entry.process.join()
    entry.connection.close()
    if isinstance(result, RankResult):
        return result
    return failed_result(entry.task, exit_description(entry.process.exitcode))

"""Run one function in a forked child process while this one goes on, and take back its result.

The child inherits everything (no arguments are sent); its return value comes back pickled
through a pipe, so it should be columns (arrays, lists of numbers or repeated strings), not a
million small objects. An exception in the child is raised again in the parent (a
``TraceInputError`` keeps its one-line message). Where ``os.fork`` is missing the function simply
runs in this process when the result is asked for. Cost: the fork (page tables, copy-on-write) plus
pickling the result once each way.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
from typing import Any, Callable

_OK, _ERROR = 0, 1


def can_fork() -> bool:
    """True where a child can be forked (Linux, macOS; not Windows)."""
    return hasattr(os, "fork")


class ForkedCall:
    """``fn()`` started in a forked child at construction; ``result()`` waits for it and returns
    its value (or raises its exception). Use as a context manager, or call ``close()``: a child
    still running then (an error or Ctrl-C in the parent) is killed and reaped, never left behind."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn = fn
        self._pid = 0
        self._read_fd = -1
        if not can_fork():
            return
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_fd)
            _run_child(fn, write_fd)
        os.close(write_fd)
        self._pid, self._read_fd = pid, read_fd

    def result(self) -> Any:
        if not self._pid:
            return self._fn()
        with os.fdopen(self._read_fd, "rb") as pipe:
            self._read_fd = -1
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = 0
        if not data:
            raise RuntimeError(f"internal error: a forked worker died (status {status})")
        kind, value = pickle.loads(data)
        if kind == _ERROR:
            raise value
        return value

    def close(self) -> None:
        if self._read_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._read_fd)
            self._read_fd = -1
        if self._pid:
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            self._pid = 0

    def __enter__(self) -> "ForkedCall":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run_child(fn: Callable[[], Any], write_fd: int) -> None:
    status = 1
    try:
        try:
            payload = pickle.dumps((_OK, fn()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as err:  # sent back to be raised in the parent
            try:
                payload = pickle.dumps((_ERROR, err), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                payload = pickle.dumps((_ERROR, RuntimeError(f"internal error in a forked worker: {err!r}")))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(payload)
        status = 0
    finally:
        os._exit(status)

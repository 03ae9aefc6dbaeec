"""Progress of one long command on stderr (``StageProgress``): linking a pair, a simulation.

A bar of the stages done (reading, linking, writing…) with the time elapsed, drawn with rich
(which typer brings) once ``DELAY_SECONDS`` have passed, on a terminal only; nothing otherwise. It
is redrawn from the main thread: at each stage, and by a ``SIGALRM`` interval timer, never by a
thread (a second thread would keep the pipeline from forking its helpers, ``schedule.fork``;
interval timers are not inherited by forked children). rich is imported only when the bar is
first drawn, so a short command and the CLI's startup never pay for it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Sequence, TextIO


DELAY_SECONDS = 2.0  # a command done sooner never shows a bar
TICK_SECONDS = 0.25


def is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class StageProgress:
    """A context manager drawing ``what``'s stages on ``stream`` (stderr) once it has run for
    ``DELAY_SECONDS``; ``stage(name, detail)`` is the callback the work calls as each stage starts.

    ``enabled`` (default: the stream is a terminal) False draws nothing. The bar is transient:
    erased when the block ends, so the command's summary follows a clean line. O(1) per call and
    per tick (one redraw of one line)."""

    def __init__(self, what: str, stages: Sequence[str], stream: TextIO | None = None,
                 enabled: bool | None = None, delay: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self.what = what
        self.stages = list(stages)
        self.done = 0
        self.current = self.stages[0] if self.stages else ""
        self.detail = ""
        self.delay = DELAY_SECONDS if delay is None else delay
        self.started_at = time.monotonic()
        self._bar = None
        self._task = None
        self._busy = False
        self._previous_handler = None
        self._timer = False

    def __enter__(self) -> "StageProgress":
        self.started_at = time.monotonic()
        if self.enabled and threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
            self._previous_handler = signal.signal(signal.SIGALRM, self._tick)
            signal.setitimer(signal.ITIMER_REAL, max(self.delay, 0.01), TICK_SECONDS)
            self._timer = True
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stage(self, name: str, detail: str = "") -> None:
        """Stage ``name`` starts (the stages before it are done); ``detail`` says more ("rank 3 of 8")."""
        if name in self.stages:
            self.done = self.stages.index(name)
        self.current, self.detail = name, detail
        self._busy = True
        try:
            self._draw()
        finally:
            self._busy = False

    def _tick(self, signum, frame) -> None:
        if self._busy:  # the main code is drawing: skip this tick
            return
        self._busy = True
        try:
            self._draw()
        except Exception:  # a redraw must never break the work it reports on
            pass
        finally:
            self._busy = False

    def _draw(self) -> None:
        if not self.enabled or time.monotonic() - self.started_at < self.delay:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(file=self.stream), auto_refresh=False,
                                 transient=True, redirect_stdout=False, redirect_stderr=False)
            self._task = self._bar.add_task(self.what, total=len(self.stages))
            self._bar.start()
        label = f"{self.what}: {self.current}" + (f" ({self.detail})" if self.detail else "")
        self._bar.update(self._task, completed=self.done, description=label)
        self._bar.refresh()

    @property
    def shown(self) -> bool:
        """Whether the bar has been drawn."""
        return self._bar is not None

    def close(self) -> None:
        """Stop the timer and erase the bar."""
        if self._timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous_handler or signal.SIG_DFL)
            self._timer = False
        if self._bar is not None:
            self._busy = True
            self._bar.stop()
            self._bar = None

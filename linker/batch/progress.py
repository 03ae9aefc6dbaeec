"""Progress of a batch on stderr: a bar on a terminal (ranks done, failed, running, elapsed, ETA),
plain log lines otherwise, nothing with ``quiet``.

The bar is drawn with rich (which typer brings), imported when it is first drawn, and redrawn by
the caller's loop (``tick``), never by a thread: the batch forks its workers. ETA is weighted by
input bytes (a rank's link time grows with its input size), so one big rank does not look like
one small one. Every method is O(1) except ``finished`` in log mode, which formats one line.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

REDRAW_SECONDS = 0.1


def format_duration(seconds: float | None) -> str:
    """``m:ss`` (or ``h:mm:ss``); ``?`` when unknown."""
    if seconds is None:
        return "?"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class ProgressCounts:
    """Ranks by state and the input bytes of the finished ones (the ETA's unit of work)."""

    total: int
    total_bytes: int
    done: int = 0
    failed: int = 0
    running: int = 0
    finished_bytes: int = 0
    started_at: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def eta(self) -> float | None:
        """Seconds left, extrapolating the byte rate so far; None before the first rank ends."""
        if self.finished_bytes <= 0:
            return None
        remaining = max(self.total_bytes - self.finished_bytes, 0)
        return self.elapsed() * remaining / self.finished_bytes


class BatchProgress:
    """Reports ranks starting and finishing.

    ``interactive`` (default: the stream is a terminal) draws a bar; otherwise one line per
    finished or failed rank. ``running_label`` names the in-flight state ("running" locally,
    "submitted" on Dask, where the client does not see when a task starts).
    """

    def __init__(self, total: int, total_bytes: int, stream: TextIO | None = None,
                 interactive: bool | None = None, running_label: str = "running", quiet: bool = False):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty()) if interactive is None else interactive
        self.counts = ProgressCounts(total=total, total_bytes=max(total_bytes, 1))
        self.running_label = running_label
        self.quiet = quiet
        self._last_draw = 0.0
        self._drawn = False
        self._bar = None  # the rich Progress, once drawn
        self._task = None

    def started(self, rank: int) -> None:
        self.counts.running += 1
        self.tick(force=True)

    def finished(self, rank: int, ok: bool, input_bytes: int, line: str) -> None:
        """A rank ended (``ok`` False = failed); ``line`` describes it (printed in log mode,
        and above the bar for failures in bar mode)."""
        c = self.counts
        c.running = max(c.running - 1, 0)
        c.done += 1 if ok else 0
        c.failed += 0 if ok else 1
        c.finished_bytes += input_bytes
        if self.interactive:
            if not ok:
                self.note(line)
            self.tick(force=True)
        else:
            self.note(f"{line} [{c.done + c.failed}/{c.total}]")

    def note(self, line: str) -> None:
        """Print a line (above the bar in bar mode)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(f"et-link batch: {line}", markup=False, highlight=False, soft_wrap=True)
            self._bar.refresh()
            return
        self.stream.write(f"et-link batch: {line}\n")
        self.stream.flush()

    def tick(self, force: bool = False) -> None:
        """Redraw the bar (bar mode only; at most every REDRAW_SECONDS unless forced)."""
        if not self.interactive or self.quiet:
            return
        now = time.monotonic()
        if force or now - self._last_draw >= REDRAW_SECONDS:
            self._draw()
            self._last_draw = now

    def bar_text(self) -> str:
        """The bar's words: "2/4: 1 done, 1 failed, 0 running, 0:03 elapsed, ETA 0:05"."""
        c = self.counts
        finished = c.done + c.failed
        return (f"{finished}/{c.total}: {c.done} done, {c.failed} failed, "
                f"{c.running} {self.running_label}, {format_duration(c.elapsed())} elapsed, "
                f"ETA {format_duration(c.eta() if finished < c.total else 0.0)}")

    def _draw(self) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            console = Console(file=self.stream, force_terminal=True, highlight=False)
            self._bar = Progress(TextColumn("et-link batch"), BarColumn(), TextColumn("{task.description}"),
                                 console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False)
            self._task = self._bar.add_task("", total=max(self.counts.total, 1))
            self._bar.start()
        c = self.counts
        self._bar.update(self._task, completed=c.done + c.failed, description=self.bar_text())
        self._bar.refresh()
        self._drawn = True

    def close(self) -> None:
        """Draw the bar a last time and leave it on its line (bar mode)."""
        if self.interactive and not self.quiet and self.counts.total:
            self._draw()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._drawn = False

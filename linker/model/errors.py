"""Errors that are the user's to fix: they print as one line naming the file, never as a traceback."""

from __future__ import annotations


class TraceInputError(Exception):
    """A trace file cannot be used: missing, empty, truncated, not JSON, or not the expected kind.

    ``str(err)`` is the one-line message the CLI prints: ``<path>: <problem>``.
    """

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # pickled by its fields (a forked worker sends it back: ``forked``)
        return type(self), (self.path, self.problem)


class MismatchedPairError(Exception):
    """The ET and the Kineto trace do not come from the same run (pids or op names disagree)."""


class OptionError(ValueError):
    """A command-line option that cannot be honoured for these files (``--window 99`` when there
    are 40 windows, ``--annotation`` matching no event, ...). ``str(err)`` names the option."""

"""Errors that are the user's to fix: they print as one line naming the file or the option, never
as a traceback. Every one derives from ``EtLinkError``; any other exception is a bug in et-link
(the CLI prints its traceback and asks for a report)."""

from __future__ import annotations


class EtLinkError(Exception):
    """Base of every error that is the user's to fix (a file, an option, an output folder).

    ``str(err)`` is the one-line message the CLI prints after ``et-link: error:``.
    """


class TraceInputError(EtLinkError):
    """A trace file cannot be used: missing, empty, truncated, not JSON, or not the expected kind.

    ``str(err)`` is the one-line message the CLI prints: ``<path>: <problem>``.
    """

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # pickled by its fields (a forked worker sends it back: ``forked``)
        return type(self), (self.path, self.problem)


class MismatchedPairError(EtLinkError):
    """The ET and the Kineto trace do not come from the same run (pids or op names disagree)."""


class OptionError(EtLinkError, ValueError):
    """An option value that is wrong (``--scale cpu=x``, ``--astra-npus 1``, an unknown
    ``--model``) or that cannot be honoured for these files (``--window 99`` when there are 40
    windows, ``--annotation`` matching no event, ...). ``str(err)`` names the option, or the
    caller that knows it prefixes it (``--max-inflated: not a size: 'lots'``). Also a
    ``ValueError``, as a library caller passing a bad argument expects."""

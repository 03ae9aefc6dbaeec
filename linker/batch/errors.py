"""The batch's setup errors: raised before any rank is linked, printed as one line (exit 2)."""

from linker.model.errors import EtLinkError


class BatchSetupError(EtLinkError):
    """The batch cannot start (bad option, no files, missing optional dependency). One line."""


class PairingError(BatchSetupError):
    """ET and Kineto files could not be paired unambiguously; ``problems`` lists every issue."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(f"{len(problems)} pairing problem(s); nothing was linked")

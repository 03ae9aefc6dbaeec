"""The model wing: what every other wing shares, with no dependency on any of them.

| module | what |
|---|---|
| ``errors`` | ``TraceInputError`` (a user's file or option is at fault: one line naming the file), ``MismatchedPairError`` (two different runs), ``OptionError`` |
| ``exit_status`` | the ``et-link`` exit statuses and ``EXIT_STATUS_TABLE`` (``--help``, README) |
| ``columns`` | small operations over plain columns (lists of a million entries), with their loops in C |

The typed traces themselves live beside their readers (``linker.read.et``, ``linker.read.kineto``).
"""

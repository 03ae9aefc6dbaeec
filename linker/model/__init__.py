"""The model wing: what every other wing shares, with no dependency on any of them.

| module | what |
|---|---|
| ``errors`` | ``EtLinkError``, the base of every user error (one line, never a traceback): ``TraceInputError`` (a user's file is at fault: one line naming the file), ``MismatchedPairError`` (two different runs), ``OptionError`` (a bad option value) |
| ``exit_status`` | the ``et-link`` exit statuses and ``EXIT_STATUS_TABLE`` (``--help``, README) |
| ``columns`` | small operations over plain columns (lists of a million entries), with their loops in C |
| ``output`` | ``Output``: an ET+ output's path, format and compression, decided once |
| ``units`` | times and counts in words people read |
| ``rounding`` | ``round_3``: Python's ``round(x, 3)`` over a numpy column, value for value (the ET+ JSON's ns rounding) |
| ``waits`` | the ``--waits`` choice (measured / explained) and whether an output needs the wait step, light to import |
| ``machine`` | what the machine has: the memory still available |
| ``progress`` | ``StageProgress``: the stages of one long command on stderr |
| ``chakra_kinds`` | Chakra's node types and collective kinds as plain ints (a JSON run loads no protobuf) |
| ``et_def_pb2`` | generated from ``schema/et_def.proto``: the ``.et`` messages |

The typed traces themselves live beside their readers (``linker.read.et``, ``linker.read.kineto``).
"""

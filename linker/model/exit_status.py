"""The ``et-link`` exit statuses, one place for every command that returns one (``cli``, ``batch``,
``batch.collectives``, ``sim.cli_run``); ``EXIT_STATUS_TABLE`` is what ``--help`` and the README list."""

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_INPUT = 2
EXIT_MISMATCH = 3
EXIT_INVALID = 4
EXIT_RANKS_FAILED = 5
EXIT_BELOW_MIN_LINKED = 6
EXIT_UNREADABLE = 7
EXIT_COLLECTIVE_MISMATCH = 8
EXIT_SIM_STUCK = 9
EXIT_ASTRA_FAILED = 10
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away
EXIT_TERMINATED = 143

EXIT_STATUS_TABLE = (
    (EXIT_OK, "success (validate: no violations)"),
    (EXIT_INTERNAL, "internal error: a bug in et-link; its traceback is printed, please report it"),
    (EXIT_INPUT, "bad input file, bad option or unusable output path; nothing was written"),
    (EXIT_MISMATCH, "the ET and the Kineto trace come from different runs (--force links anyway)"),
    (EXIT_INVALID, "validate: a file violates the graph invariants"),
    (EXIT_RANKS_FAILED, "batch: some ranks failed (the others were linked; see summary.json)"),
    (EXIT_BELOW_MIN_LINKED, "linked share below --min-linked (the ET+ and report are written)"),
    (EXIT_UNREADABLE, "validate: a file could not be read as ET/ET+ JSON or Chakra"),
    (EXIT_COLLECTIVE_MISMATCH, "batch: the ranks' collectives disagree (see summary.json; --allow-mismatch exits 0)"),
    (EXIT_SIM_STUCK, "simulate: the replay could not run every node (stuck graph or stalled collective; the report says where)"),
    (EXIT_ASTRA_FAILED, "astra-run: ASTRA-sim failed or printed no 'sys[i] finished' line (its last words shown; whole output in astra-run.log)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); no partial output is left"),
    (EXIT_BROKEN_PIPE, "the reader of stdout went away (et-link ... | head): stopped quietly"),
    (EXIT_TERMINATED, "terminated (SIGTERM); no partial output is left"),
)

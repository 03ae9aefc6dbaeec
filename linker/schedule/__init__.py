"""The schedule wing: the speed machinery, apart from the stages it speeds up.

Everything here changes when and where work runs, never its result: each child's output is what
the serial path gives, and when a child fails the parent does the work itself (same result, same
errors). Figures and the design are in ``docs/performance.md``.

| module | what |
|---|---|
| ``fork`` | ``ForkedCall``: run a function in a forked child and take back its bytes (in parts, or on a memory-file shelf); signals and cancellation handled |
| ``kineto_child`` | read and check a large Kineto trace in a child while the parent reads the ET; CPU events handed over as columns, decoded only if read |
| ``fields_child`` | encode the ET's own share of each ``.et`` node in a child while the parent links |
| ``prefill`` | room for a large output before its bytes come: block reservation, zero prefill of the temporary file |
| ``process_exit`` | a one-shot ``et-link`` process ends with ``os._exit`` instead of freeing what it built |
"""

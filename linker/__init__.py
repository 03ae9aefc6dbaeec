"""et-link: link a PyTorch Execution Trace with its Kineto trace into an enhanced ET (ET+).

Wings, in import order (the rule: a module imports only from its own wing and the ones before it):
``model`` < ``read`` < ``link`` < ``plan`` < ``write`` < ``schedule`` < ``pipeline`` < ``sim`` <
``batch`` < ``cli``. Each wing's ``__init__`` holds the map of its modules. The project's own
documentation is in ``docs/`` (formats.md, linking.md, durations.md, performance.md).

Reading order for a newcomer, one pair from files to output:

1. ``read/et.py``, ``read/kineto.py``: files -> ``ExecutionTrace`` / ``KinetoTrace`` (typed,
   columnar, the bulky parts left undecoded); ``read/sanity.py`` refuses or repairs odd input;
   ``read/files.py`` reads plain or gzip bytes and writes outputs atomically.
2. ``link/recipe.py``: ``link(et, kineto, LinkOptions) -> LinkResult``, the recipe of everything
   below: the same-run check, then the method.
3. ``link/rfid.py`` (record-function ids), ``link/windows.py`` (which Kineto iteration the ET
   covers), ``link/exact.py`` + ``link/align.py`` (order alignment per thread), ``link/approx.py`` +
   ``link/tree_match/`` (call-tree structure): ET op -> Kineto event.
4. ``link/intervals.py``, ``link/durations.py``, ``link/gpu.py``: nesting, exclusive times, GPU ops
   under their launching op; ``link/report.py``: the ``LinkReport``; ``link/etplus.py``: the ET+.
   Without an ET, ``link/kineto_only.py`` builds the host graph from the Kineto trace.
5. ``plan/busy.py``, ``plan/deps.py``, ``plan/comm.py``: busy time, dependencies with their causes,
   communication attributes, computed once for both writers.
6. ``write/etplus_json.py`` or ``write/chakra.py`` (over ``chakra_encode`` and ``chakra_wire``):
   ET+ JSON or Chakra protobuf; ``write/validate.py``: ``et-link validate``.
7. ``pipeline.py``: one pair from files to files; ``cli.py``: the ``et-link`` command.
8. ``schedule/``: the speed machinery (forked read-ahead children, output prefill, a one-shot
   process exit), kept apart so the stages above read as plain passes.
9. ``sim/``: ``et-link simulate``; ``batch/``: ``et-link batch`` and the cross-rank check.
"""

__version__ = "0.2.0"
